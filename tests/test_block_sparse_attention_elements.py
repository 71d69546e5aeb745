"""Block-sparse attention's element conditions: bottom-right causal, windows
and document ids, ANDed with the block mask. Outputs, lse and gradients are
compared with float64 attention by plain torch ops over the dense element
mask built here from the same conditions; bad arguments raise before any
work.
"""

import pytest
import torch
from torch.testing._internal.optests import opcheck

import baracuda_torch as bt
from baracuda_torch import masks
from test_block_sparse_attention import inputs, lse_tol, random_mask, tol
from test_block_sparse_attention_backward import (assert_grads_close, dense_mask,
                                                  reference_attention, reference_grads)


def element_mask(B, H, Lq, Lk, is_causal=False, causal_align="top_left", window=None,
                 document_ids=None):
    """[B, H, Lq, Lk] bool: the element conditions alone."""
    pos = torch.arange(Lq)[:, None] + (Lk - Lq if causal_align == "bottom_right" else 0)
    j = torch.arange(Lk)[None, :]
    keep = torch.ones(Lq, Lk, dtype=torch.bool)
    if is_causal:
        keep &= j <= pos
    if window is not None:
        left, right = window
        if left is not None:
            keep &= j >= pos - left
        if right is not None:
            keep &= j <= pos + right
    keep = keep.expand(B, H, Lq, Lk)
    if document_ids is not None:
        qd, kd = (t.cpu().long() for t in document_ids)
        same = qd[:, :, None] == kd[:, None, :]  # [B or 1, Lq, Lk]
        keep = keep & same[:, None]
    return keep.expand(B, H, Lq, Lk)


def run(q, k, v, m, block_size, grad_out, grad_lse, **conditions):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = bt.block_sparse_attention(q, k, v, m, block_size=block_size, return_lse=True,
                                         **conditions)
    grads = torch.autograd.grad([out, lse], (q, k, v), [grad_out, grad_lse])
    return out, lse, grads


def compare(q, k, v, block_mask, block_size, dense, **conditions):
    """Outputs, lse and gradients (through both) against float64 attention
    over the dense element mask."""
    B, H, Lq, _ = q.shape
    g = torch.Generator().manual_seed(7)
    grad_out = torch.randn(B, H, Lq, v.shape[-1], generator=g).to(q.dtype).to(q.device)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    grad_lse = torch.randn(B, H, Lq, generator=g).to(lse_dtype).to(q.device)
    out, lse, got = run(q, k, v, block_mask, block_size, grad_out, grad_lse, **conditions)
    want_out, want_lse = reference_attention(*(t.double().cpu() for t in (q, k, v)), dense)
    torch.testing.assert_close(out.double().cpu(), want_out, **tol(q.dtype))
    torch.testing.assert_close(lse.double().cpu(), want_lse, **lse_tol(q.dtype))
    assert_grads_close(got, reference_grads(q, k, v, dense, grad_out, grad_lse), q.dtype)
    return out


def assert_runs_identical(q, k, v, m, block_size, **conditions):
    """Outputs and gradients (through out and lse) bit-identical on two runs."""
    g = torch.Generator().manual_seed(97)
    grad_out = torch.randn(q.shape, generator=g).to(q.dtype).to(q.device)
    grad_lse = torch.randn(q.shape[:3], generator=g).to(q.device)
    first, second = (run(q, k, v, m, block_size, grad_out, grad_lse, **conditions)
                     for _ in range(2))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    for got, want in zip(first[2], second[2]):
        assert torch.equal(got, want)


def check(q, k, v, m, block_size, **conditions):
    """A tile mask (None: every tile) with element conditions; returns the
    dense element mask."""
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    blocks = (torch.ones(1, 1, -(-Lq // block_size[0]), -(-Lk // block_size[1]), dtype=torch.bool)
              if m is None else m)
    dense = dense_mask(blocks, q, k, block_size, False) & element_mask(B, H, Lq, Lk, **conditions)
    compare(q, k, v, m, block_size, dense, **conditions)
    return dense


def frame_counter():
    """A torch.compile backend that counts the graphs it is handed."""
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    return backend, frames


def documents(B, L, n, seed, device):
    """Sorted ids of n packed documents of random lengths per batch row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.empty(B, L, dtype=torch.int64)
    for b in range(B):
        cuts = torch.randperm(L - 1, generator=g)[:n - 1].sort().values + 1
        ids[b] = torch.bucketize(torch.arange(L), cuts, right=True)
    return ids.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_document_ids(device, dtype, is_causal):
    q, k, v = inputs(2, 4, 2, 190, 190, 64, 64, dtype, device, seed=1)
    ids = documents(2, 190, 5, seed=2, device=device)
    dense = check(q, k, v, None, (64, 64), is_causal=is_causal, document_ids=(ids, ids))
    assert not dense.all()
    # int32 ids, a broadcast batch for the keys' and a block mask on top.
    m = random_mask(2, 4, 190, 190, 64, device, density=0.7, seed=3)
    check(q, k, v, m, (64, 64), is_causal=is_causal,
          document_ids=(ids.int(), ids[:1].expand(2, -1).contiguous()[:1]))


@pytest.mark.parametrize("causal_align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [(16, 0), (None, 5), (7, 30), (0, 0)])
def test_windows(device, causal_align, window):
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = inputs(1, 2, 1, 70, 150, 32, 48, dtype, device, seed=4)
        check(q, k, v, None, (16, 32), causal_align=causal_align, window=window)
        check(q, k, v, None, (64, 64), is_causal=True, causal_align=causal_align, window=window)


@pytest.mark.parametrize("Lq, Lk", [(37, 300), (128, 128), (200, 90)])
def test_bottom_right_causal(device, Lq, Lk):
    # A chunk of new queries after a KV cache (Lq < Lk); with Lq > Lk the
    # first rows see nothing.
    for dtype in (torch.float64, torch.float16):
        q, k, v = inputs(2, 2, 2, Lq, Lk, 64, 64, dtype, device, seed=5)
        m = random_mask(2, 2, Lq, Lk, 64, device, density=0.8, seed=6)
        dense = check(q, k, v, m, (64, 64), is_causal=True, causal_align="bottom_right")
        if Lq > Lk:
            out = bt.block_sparse_attention(q, k, v, m, block_size=64, is_causal=True,
                                            causal_align="bottom_right")
            empty = ~dense.any(-1)
            assert empty.any() and (out[empty.to(out.device)] == 0).all()


def test_everything_together_with_gqa_and_uneven_lengths(device):
    q, k, v = inputs(2, 6, 2, 211, 333, 80, 40, torch.float32, device, seed=8)
    qd = documents(2, 211, 3, seed=9, device=device)
    kd = documents(2, 333, 3, seed=9, device=device)
    m = random_mask(2, 6, 211, 333, (32, 48), device, density=0.8, seed=10)
    check(q, k, v, m, (32, 48), is_causal=True, causal_align="bottom_right", window=(100, None),
          document_ids=(qd, kd))


def test_rows_without_keys_get_zero_gradients(device):
    q, k, v = inputs(1, 2, 2, 64, 64, 16, 16, torch.float64, device, seed=11)
    q_ids = torch.zeros(1, 64, dtype=torch.int64, device=device)
    kv_ids = torch.ones(1, 64, dtype=torch.int64, device=device)
    q_ids[0, 40:] = 1  # rows 0..39 find no key of their document
    qq = q.detach().requires_grad_()
    out, lse = bt.block_sparse_attention(qq, k, v, None, block_size=16, return_lse=True,
                                         document_ids=(q_ids, kv_ids))
    assert (out[:, :, :40] == 0).all() and (lse[:, :, :40] == float("-inf")).all()
    (dq,) = torch.autograd.grad(out.sum() + lse[:, :, 40:].sum(), qq)
    assert (dq[:, :, :40] == 0).all() and torch.isfinite(dq).all()


def test_executor_choice(device):
    # Position conditions (windows, bottom-right causal, kv_lens) run on the
    # tensor cores; document ids on the Hopper kernels only (the mma.sync
    # kernel leaves them to the generic one). Bottom-right causal with
    # Lq == Lk is top-left causal.
    q, k, v = inputs(1, 2, 2, 128, 192, 64, 64, torch.bfloat16, device, seed=12)
    ids = torch.zeros(1, 128, dtype=torch.int64, device=device)
    kv_ids = torch.zeros(1, 192, dtype=torch.int64, device=device)
    plain = bt.block_sparse_attention_path(q, k, v, None, block_size=64)
    assert plain in (("cpu",) if device.type == "cpu" else ("cuda_wgmma", "cuda_tensor_core"))
    lens = torch.tensor([100], device=device)
    for conditions in (dict(window=(32, 0)), dict(causal_align="bottom_right", is_causal=True),
                       dict(kv_lens=lens)):
        assert bt.block_sparse_attention_path(q, k, v, None, block_size=64, **conditions) == \
            plain, conditions
    with_ids = "cpu" if device.type == "cpu" else \
        "cuda_wgmma" if plain == "cuda_wgmma" else "cuda_generic"
    assert bt.block_sparse_attention_path(q, k, v, None, block_size=64,
                                          document_ids=(ids, kv_ids)) == with_ids
    square = q, q, q
    assert bt.block_sparse_attention_path(*square, None, block_size=64, is_causal=True,
                                          causal_align="bottom_right") == \
        bt.block_sparse_attention_path(*square, None, block_size=64, is_causal=True)
    assert bt.block_sparse_attention_path(q, k, v, None, block_size=64,
                                          causal_align="bottom_right") == \
        bt.block_sparse_attention_path(q, k, v, None, block_size=64)


def test_bad_arguments_raise(device):
    q, k, v = inputs(1, 2, 2, 40, 50, 16, 16, torch.float32, device, seed=13)
    ids = torch.zeros(1, 40, dtype=torch.int64, device=device)
    kids = torch.zeros(1, 50, dtype=torch.int64, device=device)
    f = bt.block_sparse_attention
    with pytest.raises(RuntimeError, match=r'causal_align="middle" must be "top_left" or '
                                           r'"bottom_right"'):
        f(q, k, v, None, block_size=16, causal_align="middle")
    with pytest.raises(RuntimeError, match="window_left=-1 must be non-negative"):
        f(q, k, v, None, block_size=16, window=(-1, 0))
    with pytest.raises(RuntimeError, match="window_right=-3 must be non-negative"):
        f(q, k, v, None, block_size=16, window=(None, -3))
    with pytest.raises(ValueError, match="window=5 must be a pair"):
        f(q, k, v, None, block_size=16, window=5)
    with pytest.raises(RuntimeError, match=r"q_document_ids.shape=\[1, 39\] must be \[1 or 1, 40\]"):
        f(q, k, v, None, block_size=16, document_ids=(ids[:, 1:], kids))
    with pytest.raises(RuntimeError, match=r"kv_document_ids.dtype=Float must be int32 or int64"):
        f(q, k, v, None, block_size=16, document_ids=(ids, kids.float()))
    with pytest.raises(RuntimeError, match="kv_document_ids is on meta but q is on"):
        f(q, k, v, None, block_size=16, document_ids=(ids, kids.to("meta")))
    with pytest.raises(ValueError, match="document_ids must be a pair"):
        f(q, k, v, None, block_size=16, document_ids=ids)


def test_opcheck(device):
    q, k, v = inputs(1, 2, 1, 40, 56, 16, 16, torch.float64, device, seed=14)
    for t in (q, k, v):
        t.requires_grad_()
    ids = documents(1, 56, 3, seed=15, device=device)
    mask = torch.ones(1, 1, 3, 4, dtype=torch.bool, device=device)
    opcheck(torch.ops.baracuda.block_sparse_attention.default,
            (q, k, v, mask, 16, 16, None, True, "bottom_right", 20, 3, ids[:, :40].contiguous(),
             ids))


def test_gradcheck(device):
    q, k, v = inputs(1, 2, 1, 20, 28, 8, 8, torch.float64, device, seed=16)
    ids = documents(1, 28, 3, seed=17, device=device)
    fn = lambda q, k, v: bt.block_sparse_attention(  # noqa: E731
        q, k, v, None, block_size=8, is_causal=True, causal_align="bottom_right", window=(9, 2),
        document_ids=(ids[:, 8:].contiguous(), ids), return_lse=True)
    assert torch.autograd.gradcheck(fn, tuple(t.requires_grad_() for t in (q, k, v)))


def test_compiled_training_step_does_not_recompile(device):
    torch._dynamo.reset()
    backend, frames = frame_counter()

    def step(q, k, v, ids, left):
        out = bt.block_sparse_attention(q, k, v, None, block_size=16, is_causal=True,
                                        window=(left, 0), document_ids=(ids, ids))
        return out.square().sum()

    compiled = torch.compile(step, backend=backend, fullgraph=True, dynamic=True)
    for L, left, seed in ((48, 8, 20), (80, 16, 21), (64, 3, 22)):
        q, k, v = (t.requires_grad_() for t in inputs(1, 2, 2, L, L, 16, 16, torch.float32,
                                                      device, seed=seed))
        ids = documents(1, L, 3, seed=seed, device=device)
        loss = compiled(q, k, v, ids, left)
        grads = torch.autograd.grad(loss, (q, k, v))
        want = torch.autograd.grad(step(q, k, v, ids, left), (q, k, v))
        for g, w in zip(grads, want):
            torch.testing.assert_close(g, w)
    assert len(frames) == 1


# ---------------------------------------------------------------- exact masks


def check_exact(q, k, v, exact, **conditions):
    """Attention with an exact mask against the dense element mask it means."""
    B, H, Lq, _ = q.shape
    dense = masks.to_dense(exact, Lq, k.shape[2]).expand(B, H, -1, -1).cpu()
    dense = dense & element_mask(B, H, Lq, k.shape[2], **conditions)
    return compare(q, k, v, exact, None, dense, **conditions)


def test_from_dense_is_exact(device):
    g = torch.Generator().manual_seed(30)
    Lq, Lk = 150, 230
    dense = torch.rand(2, 3, Lq, Lk, generator=g) < 0.3
    dense[:, :, :, :64] |= True   # full tiles
    dense[:, :, 64:128, 64:] = False  # off tiles
    dense[0, 0, 5] = False  # a row with no key
    exact = masks.from_dense(dense.to(device), (32, 48))
    assert torch.equal(masks.to_dense(exact, Lq, Lk).cpu(), dense)
    partial = exact.partial_index >= 0
    assert partial.any() and (exact.tiles & ~partial).any() and (~exact.tiles).any()
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        q, k, v = inputs(2, 3, 3, Lq, Lk, 40, 24, dtype, device, seed=31)
        out = check_exact(q, k, v, exact)
        assert (out[0, 0, 5] == 0).all()
    # GQA, a broadcast mask, with causal and a window on top.
    q, k, v = inputs(2, 6, 2, Lq, Lk, 64, 64, torch.float32, device, seed=32)
    exact = masks.from_dense(dense[:1, :1].to(device), 64)
    check_exact(q, k, v, exact, is_causal=True, causal_align="bottom_right", window=(80, None))


def _flex_mask_mods(L, device):
    g = torch.Generator().manual_seed(33)
    docs = torch.bucketize(torch.arange(L), torch.tensor([40, 90, 170]), right=True).to(device)
    table = (torch.rand(L, L, generator=g) < 0.4).to(device)

    def documents_causal(b, h, q, kv):
        return (docs[q] == docs[kv]) & (q >= kv)

    def window_and_prefix(b, h, q, kv):
        return ((q - kv).abs() <= 20) | (kv < 33)

    def from_table(b, h, q, kv):
        return table[q, kv] | (h == 1)

    coarse = torch.rand(L // 16 + 1, L // 8 + 1, generator=g).to(device) < 0.5

    def chained_index(b, h, q, kv):
        # Scalar semantics (an index of an index), as Flex's vmap calls it.
        return coarse[q // 16][kv // 8] & (q >= kv)

    return [documents_causal, window_and_prefix, from_table, chained_index]


@pytest.mark.parametrize("which", [0, 1, 2, 3])
def test_from_flex_is_exact(device, which):
    from torch.nn.attention.flex_attention import create_block_mask

    L = 200
    mask_mod = _flex_mask_mods(L, device)[which]
    bm = create_block_mask(mask_mod, 1, 2, L, L, device=device.type, BLOCK_SIZE=(64, 32))
    exact = masks.from_flex(bm)
    i = torch.arange(L, device=device)
    dense = torch.vmap(torch.vmap(mask_mod, in_dims=(None, None, None, 0)),
                       in_dims=(None, None, 0, None))
    want = torch.stack([dense(torch.tensor(0), torch.tensor(h), i, i) for h in (0, 1)])[None]
    assert torch.equal(masks.to_dense(exact, L, L), want.expand(1, 2, L, L))
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = inputs(1, 2, 1, L, L, 64, 64, dtype, device, seed=34)
        check_exact(q, k, v, exact)


@pytest.mark.slow  # compiles flex_attention on CUDA (about 50 s on a GPU machine)
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_from_flex_equals_flex_attention(device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    L = 256
    mask_mod = _flex_mask_mods(L, device)[0]
    bm = create_block_mask(mask_mod, None, None, L, L, device=device.type, BLOCK_SIZE=128)
    q, k, v = inputs(2, 4, 4, L, L, 64, 64, torch.float32, device, seed=35)
    ours = bt.block_sparse_attention(q, k, v, masks.from_flex(bm))
    flex = flex_attention if device.type == "cpu" else torch.compile(flex_attention)
    with torch.no_grad():
        theirs = flex(q, k, v, block_mask=bm)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=2e-5)


def test_exact_mask_for_other_shapes_raises(device):
    exact = masks.from_dense(torch.rand(100, 120) < 0.5, 32)
    q, k, v = inputs(1, 1, 1, 100, 120, 16, 16, torch.float32, device, seed=36)
    exact = exact._replace(tiles=exact.tiles.to(device), partial_index=exact.partial_index.to(device),
                           partial_bits=exact.partial_bits.to(device))
    bt.block_sparse_attention(q, k, v, exact)
    with pytest.raises(ValueError, match=r"block_size=64 differs from the exact mask's \(32, 32\)"):
        bt.block_sparse_attention(q, k, v, exact, block_size=64)
    with pytest.raises(ValueError, match="built for q_len=100, k_len=120; got q_len=99"):
        bt.block_sparse_attention(q[:, :, 1:], k, v, exact)
    with pytest.raises(RuntimeError, match=r"partial_bits.shape=\[\d+, 16, 1\] must be "
                                           r"\[slots, 32, 1\]"):
        torch.ops.baracuda.block_sparse_attention(q, k, v, exact.tiles, 32, 32, None, False,
                                                  "top_left", None, None, None, None,
                                                  exact.partial_index, exact.partial_bits[:, :16])
    with pytest.raises(RuntimeError, match="needs both partial_index and partial_bits"):
        torch.ops.baracuda.block_sparse_attention(q, k, v, exact.tiles, 32, 32, None, False,
                                                  "top_left", None, None, None, None,
                                                  exact.partial_index, None)


def test_exact_mask_compiles_without_recompile(device):
    torch._dynamo.reset()
    backend, frames = frame_counter()

    step = torch.compile(lambda q, k, v, m: bt.block_sparse_attention(q, k, v, m).sum(),
                         backend=backend, fullgraph=True, dynamic=True)
    g = torch.Generator().manual_seed(37)
    for L in (96, 160):
        exact = masks.from_dense((torch.rand(L, L, generator=g) < 0.5).to(device), 32)
        q, k, v = (t.requires_grad_() for t in inputs(1, 2, 2, L, L, 16, 16, torch.float32,
                                                      device, seed=L))
        grads = torch.autograd.grad(step(q, k, v, exact), (q, k, v))
        want = torch.autograd.grad(bt.block_sparse_attention(q, k, v, exact).sum(), (q, k, v))
        for a, b in zip(grads, want):
            torch.testing.assert_close(a, b)
    assert len(frames) == 1


# ---------------------------------------------------------------- kv_lens (decode over a cache)


@pytest.mark.parametrize("Lq", [1, 4, 16])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_kv_lens_against_the_sliced_cache(device, Lq, dtype):
    """Each row attends the filled part of a preallocated cache, bottom-right
    causal (the new queries sit at its end); NaN junk past each length is
    never read. Per row, the reference is attention over the sliced cache."""
    B, H, Hkv, S, D = 5, 4, 2, 200, 64
    lens = torch.tensor([0, 1, 77, 128, S])
    q, k, v = inputs(B, H, Hkv, Lq, S, D, D, dtype, device, seed=40)
    for b, n in enumerate(lens.tolist()):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    for causal in (False, True):
        out, lse = bt.block_sparse_attention(q, k, v, block_size=64, is_causal=causal,
                                             causal_align="bottom_right",
                                             kv_lens=lens.to(device), return_lse=True)
        for b, n in enumerate(lens.tolist()):
            dense = element_mask(1, H, Lq, n, is_causal=causal, causal_align="bottom_right")
            want_out, want_lse = reference_attention(q[b:b + 1].double().cpu(),
                                                     k[b:b + 1, :, :n].double().cpu(),
                                                     v[b:b + 1, :, :n].double().cpu(), dense)
            torch.testing.assert_close(out[b:b + 1].double().cpu(), want_out, **tol(dtype))
            torch.testing.assert_close(lse[b:b + 1].double().cpu(), want_lse, **lse_tol(dtype))
        assert (out[0] == 0).all() and (lse[0] == float("-inf")).all()  # kv_lens 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_lens_read_in_place_at_any_width_and_stride(device, dtype):
    """The lengths are read where they are, int32 or int64, contiguous or a
    strided view: every form gives the bits of contiguous int64 lengths,
    forward and backward."""
    B, H, Hkv, Lq, S, D = 4, 4, 2, 4, 150, 64
    q, k, v = inputs(B, H, Hkv, Lq, S, D, D, dtype, device, seed=41)
    lens = [0, 5, 100, S]
    spread = torch.tensor([n for n in lens for _ in range(3)], device=device)

    def run(n):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = bt.block_sparse_attention(*leaves, block_size=64, is_causal=True,
                                        causal_align="bottom_right", kv_lens=n)
        return (out, *torch.autograd.grad(out.sum(), leaves))

    want = run(torch.tensor(lens, device=device))
    for n in (torch.tensor(lens, dtype=torch.int32, device=device), spread[::3],
              spread.to(torch.int32)[1::3]):
        for got, w in zip(run(n), want):
            assert torch.equal(got, w)


def test_kv_lens_gradients(device):
    B, H, S = 3, 2, 90
    lens = torch.tensor([90, 33, 0], device=device)
    q, k, v = inputs(B, H, 1, 7, S, 16, 24, torch.float64, device, seed=41)
    dense = torch.zeros(B, H, 7, S, dtype=torch.bool)
    for b, n in enumerate(lens.tolist()):
        dense[b, :, :, :n] = element_mask(1, H, 7, n, is_causal=True, causal_align="bottom_right")
    compare(q, k, v, None, (16, 16), dense, is_causal=True, causal_align="bottom_right",
            kv_lens=lens)
    fn = lambda q, k, v: bt.block_sparse_attention(  # noqa: E731
        q, k, v, block_size=16, is_causal=True, causal_align="bottom_right", kv_lens=lens,
        return_lse=True)
    # Keys past a row's length get exactly zero gradients.
    kk = k.detach().requires_grad_()
    out, _ = fn(q, kk, v)
    (dk,) = torch.autograd.grad(out.sum(), kk)
    assert (dk[1, :, 33:] == 0).all() and (dk[2] == 0).all()
    small = [t[:, :, :, :8].contiguous().requires_grad_() for t in (q, k, v)]
    small[1] = small[1][:, :, :40].detach().requires_grad_()
    small[2] = small[2][:, :, :40].detach().requires_grad_()
    lens_small = torch.tensor([40, 13, 0], device=device)
    # out only: the lse of the empty row is -inf, where finite differences are NaN.
    assert torch.autograd.gradcheck(
        lambda q, k, v: bt.block_sparse_attention(q, k, v, block_size=16, kv_lens=lens_small,
                                                  causal_align="bottom_right", is_causal=True),
        small)


def test_kv_lens_errors_and_opcheck(device):
    q, k, v = inputs(2, 2, 2, 3, 50, 16, 16, torch.float32, device, seed=42)
    f = bt.block_sparse_attention
    with pytest.raises(RuntimeError, match=r"kv_lens.shape=\[3\] must be \[2\]"):
        f(q, k, v, kv_lens=torch.tensor([1, 2, 3], device=device))
    with pytest.raises(RuntimeError, match="kv_lens must be a strided int32 or int64 tensor"):
        f(q, k, v, kv_lens=torch.tensor([1.0, 2.0], device=device))
    if device.type == "cpu":
        with pytest.raises(RuntimeError, match=r"kv_lens\[1\]=51 must be in \[0, 50\]"):
            f(q, k, v, kv_lens=torch.tensor([1, 51]))
    mask = torch.ones(1, 1, 1, 4, dtype=torch.bool, device=device)
    lens = torch.tensor([50, 17], dtype=torch.int32, device=device)
    opcheck(torch.ops.baracuda.block_sparse_attention.default,
            (q.double().requires_grad_(), k.double().requires_grad_(), v.double().requires_grad_(),
             mask, 16, 16, None, True, "bottom_right", None, None, None, None, None, None, lens))


def test_kv_lens_compiled_decode_does_not_recompile(device):
    torch._dynamo.reset()
    backend, frames = frame_counter()

    def step(q, k, v, lens):
        return bt.block_sparse_attention(q, k, v, block_size=16, is_causal=True,
                                         causal_align="bottom_right", kv_lens=lens)

    compiled = torch.compile(step, backend=backend, fullgraph=True, dynamic=True)
    q, k, v = inputs(2, 2, 1, 1, 64, 16, 16, torch.float32, device, seed=43)
    for n in (5, 17, 64):
        lens = torch.tensor([n, max(n - 3, 0)], device=device)
        torch.testing.assert_close(compiled(q, k, v, lens), step(q, k, v, lens))
    assert len(frames) == 1


@pytest.mark.parametrize("Lq, D", [(1, 128), (5, 64), (16, 128)])
@pytest.mark.parametrize("executor", ["default", "mma_sync"])
def test_decode_over_a_long_cache(device, Lq, D, executor, monkeypatch):
    """Few queries per head over a long cache: on CUDA the tensor-core
    kernels pack a key head's query heads into one tile and split the keys
    across CTAs, merging the partial states. Each row is compared with
    attention over its sliced cache; NaN junk past the lengths is never
    read; a key-block mask shared by the heads and a window ride along."""
    if executor == "mma_sync":
        if device.type == "cpu":
            pytest.skip("an executor choice of CUDA")
        monkeypatch.setenv("BARACUDA_DISABLE_WGMMA", "1")
    B, H, Hkv, S = 3, 8, 2, 2500
    lens = torch.tensor([2500, 1, 1333])
    q, k, v = inputs(B, H, Hkv, Lq, S, D, D, torch.bfloat16, device, seed=45)
    for b, n in enumerate(lens.tolist()):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    g = torch.Generator().manual_seed(46)
    blocks = torch.rand(B, 1, 1, -(-S // 128), generator=g) < 0.7
    blocks[:, :, :, 0] = True
    for causal, window, m in ((True, None, None), (False, None, None), (True, (700, 0), None),
                              (True, None, blocks)):
        out, lse = bt.block_sparse_attention(
            q, k, v, None if m is None else m.to(device), block_size=128, is_causal=causal,
            causal_align="bottom_right", window=window, kv_lens=lens.to(device),
            return_lse=True)
        for b, n in enumerate(lens.tolist()):
            dense = element_mask(1, H, Lq, n, is_causal=causal, causal_align="bottom_right",
                                 window=window)
            if m is not None:
                dense = dense & m[b:b + 1].repeat_interleave(128, -1)[..., :n]
            want_out, want_lse = reference_attention(q[b:b + 1].double().cpu(),
                                                     k[b:b + 1, :, :n].double().cpu(),
                                                     v[b:b + 1, :, :n].double().cpu(), dense)
            torch.testing.assert_close(out[b:b + 1].double().cpu(), want_out,
                                       **tol(torch.bfloat16))
            torch.testing.assert_close(lse[b:b + 1].double().cpu(), want_lse,
                                       **lse_tol(torch.bfloat16))
        again = bt.block_sparse_attention(
            q, k, v, None if m is None else m.to(device), block_size=128, is_causal=causal,
            causal_align="bottom_right", window=window, kv_lens=lens.to(device))
        assert torch.equal(again, out)  # the split and its merge are deterministic


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kv_lens_decode_loop_in_a_cuda_graph():
    """Append with write_slice_at_ and attend with kv_lens, captured once and
    replayed at growing lengths."""
    B, H, S, D = 2, 4, 96, 64
    device = torch.device("cuda")
    k_cache = torch.zeros(B, H, S, D, device=device)
    v_cache = torch.zeros(B, H, S, D, device=device)
    lens = torch.zeros(B, dtype=torch.int64, device=device)
    q = torch.randn(B, H, 1, D, device=device)
    k_new, v_new = torch.randn(B, H, 1, D, device=device), torch.randn(B, H, 1, D, device=device)
    out = torch.empty(B, H, 1, D, device=device)

    def decode_step():
        bt.write_slice_at_(k_cache, k_new, 2, lens)
        bt.write_slice_at_(v_cache, v_new, 2, lens)
        lens.add_(1)
        out.copy_(bt.block_sparse_attention(q, k_cache, v_cache, block_size=64, is_causal=True,
                                            causal_align="bottom_right", kv_lens=lens))

    decode_step()  # warm-up (and the first position)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            decode_step()
    torch.cuda.synchronize()
    g = torch.Generator(device="cpu").manual_seed(44)
    for _ in range(20):
        k_new.copy_(torch.randn(B, H, 1, D, generator=g))
        v_new.copy_(torch.randn(B, H, 1, D, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        n = int(lens[0])
        want = torch.nn.functional.scaled_dot_product_attention(q, k_cache[:, :, :n],
                                                                v_cache[:, :, :n])
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_document_tiles(device):
    """Tiles whose rows and keys share no document are dropped (exactly so
    for packed documents); none that holds a visible pair ever is."""
    g = torch.Generator().manual_seed(50)
    packed = documents(3, 300, 7, seed=51, device=device)
    shuffled = torch.randint(0, 4, (1, 300), generator=g).to(device)
    for ids, exact_for_packed in ((packed, True), (shuffled, False)):
        tiles = masks.document_tiles(ids, ids, (64, 48))
        same = (ids[:, :, None] == ids[:, None, :]).cpu()
        any_pair = masks.from_dense(same[:, None], (64, 48)).tiles
        assert tiles.shape == any_pair.shape
        assert not (any_pair & ~tiles.cpu()).any()
        if exact_for_packed:
            assert torch.equal(tiles.cpu(), any_pair)
    q, k, v = inputs(3, 2, 2, 300, 300, 32, 32, torch.float32, device, seed=52)
    m = random_mask(1, 2, 300, 300, (64, 48), device, density=0.8, seed=53)
    check(q, k, v, m, (64, 48), is_causal=True, document_ids=(packed, packed))


def test_exact_masks_that_need_no_bits_run_as_tiles(device):
    """A causal Flex mask is its tiles made causal, and a block-aligned mask
    has no partial tiles: both run as tile masks (the tensor-core path where
    the shape allows), with the same results."""
    from torch.nn.attention.flex_attention import create_block_mask

    L = 320
    causal = masks.from_flex(create_block_mask(lambda b, h, q, kv: q >= kv, None, None, L, L,
                                               device=device.type, BLOCK_SIZE=64))
    aligned = masks.from_dense(masks.to_dense(masks.causal(L, L, 64), L, L, 64).to(device), 64)
    assert causal.causal and causal.partial_bits.shape[0] > 0
    assert aligned.partial_bits.shape[0] == 0 and not aligned.causal
    q, k, v = inputs(1, 2, 2, L, L, 64, 64, torch.bfloat16, device, seed=60)
    tiles = bt.block_sparse_attention_path(q, k, v, causal.tiles, block_size=64, is_causal=True)
    for exact in (causal, aligned):
        assert bt.block_sparse_attention_path(q, k, v, exact) == tiles
        check_exact(q, k, v, exact)
    # With bottom-right causal on top and Lq != Lk the conversion would be
    # wrong: the bits stay.
    qs = q[:, :, :100]
    short = masks.from_flex(create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 100, L,
                                              device=device.type, BLOCK_SIZE=64))
    assert short.causal
    check_exact(qs, k, v, short, is_causal=True, causal_align="bottom_right")


@pytest.mark.parametrize("D", [64, 128])
def test_wgmma_backward_position_conditions(device, D):
    """The Hopper backward's handling of position conditions: windows,
    bottom-right causal and kv_lens against float64 attention; NaN junk past
    the lengths changes no bit of any result; bit-identical on a second run."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the wgmma backward runs on Hopper GPUs")
    B, H, Lq, Lk = 2, 4, 200, 333
    q, k, v = inputs(B, H, 2, Lq, Lk, D, D, torch.bfloat16, device, seed=93)
    for conditions in (dict(window=(100, 20)), dict(is_causal=True, causal_align="bottom_right"),
                       dict(is_causal=True, window=(64, 0), causal_align="bottom_right")):
        check(q, k, v, None, (64, 64), **conditions)
    lens = torch.tensor([Lk, 150], device=device)
    dense = torch.zeros(B, H, Lq, Lk, dtype=torch.bool)
    for b, n in enumerate(lens.tolist()):
        dense[b, :, :, :n] = element_mask(1, H, Lq, n, is_causal=True, causal_align="bottom_right")
    conditions = dict(is_causal=True, causal_align="bottom_right", kv_lens=lens)
    compare(q, k, v, None, (64, 128), dense, **conditions)
    g = torch.Generator().manual_seed(94)
    grad_out = torch.randn(B, H, Lq, D, generator=g).to(q.dtype).to(device)
    grad_lse = torch.randn(B, H, Lq, generator=g).to(device)
    clean = run(q, k, v, None, (64, 128), grad_out, grad_lse, **conditions)
    k_junk, v_junk = k.clone(), v.clone()
    k_junk[1, :, 150:] = float("nan")
    v_junk[1, :, 150:] = float("nan")
    for _ in range(2):
        junk = run(q, k_junk, v_junk, None, (64, 128), grad_out, grad_lse, **conditions)
        assert torch.equal(junk[0], clean[0]) and torch.equal(junk[1], clean[1])
        for got, want in zip(junk[2], clean[2]):
            assert torch.equal(got, want)
    assert (clean[2][1][1, :, 150:] == 0).all() and (clean[2][2][1, :, 150:] == 0).all()


# Uneven tiles run the same kernels with other constants: the slow tier.
UNEVEN_TILES_SLOW = [64, 128, pytest.param((128, 64), marks=pytest.mark.slow),
                     pytest.param((64, 128), marks=pytest.mark.slow)]


@pytest.mark.parametrize("block_size", UNEVEN_TILES_SLOW)
@pytest.mark.parametrize("executor", ["default", "mma_sync"])
def test_tensor_core_exact_masks(device, monkeypatch, block_size, executor):
    """The tensor-core kernels' reading of exact-mask bits (forward, and the
    Hopper backward where it runs): a random element mask with full, off and
    partial tiles, alone and under bottom-right causal with a window, and a
    causal window with sink keys whose edges fall inside tiles, against
    float64 attention; outputs and gradients bit-identical on a second run."""
    if device.type != "cuda":
        pytest.skip("the tensor-core kernels run on CUDA")
    if executor == "mma_sync":
        monkeypatch.setenv("BARACUDA_DISABLE_WGMMA", "1")
    B, H, Lq, Lk = 2, 4, 300, 517
    g = torch.Generator().manual_seed(95)
    random = torch.rand(B, 1, Lq, Lk, generator=g) < 0.4
    random[:, :, :, :128] = True  # full tiles
    random[:, :, 128:256, 256:] = False  # off tiles
    random[1, 0, 7] = False  # a row with no key
    i = torch.arange(Lq)[:, None] + (Lk - Lq)
    j = torch.arange(Lk)[None, :]
    window_sink = ((j <= i) & ((i - j < 150) | (j < 37)))[None, None]
    for D in (64, 128):
        q, k, v = inputs(B, H, 2, Lq, Lk, D, D, torch.bfloat16, device, seed=96 + D)
        for dense, conditions in ((random, {}), (window_sink, {}),
                                  (random, dict(is_causal=True, causal_align="bottom_right",
                                                window=(200, None)))):
            exact = masks.from_dense(dense.to(device), block_size)
            assert (exact.partial_index >= 0).any()
            path = bt.block_sparse_attention_path(q, k, v, exact, **conditions)
            assert path != "cuda_generic", path
            check_exact(q, k, v, exact, **conditions)
            assert_runs_identical(q, k, v, exact, None, **conditions)


def check_on_wgmma(q, k, v, m, block_size, **conditions):
    """A tile mask (block_size a pair) or an exact mask (its own sizes) on
    the Hopper kernels: against float64 attention, and the same bits twice."""
    exact = isinstance(m, masks.ExactMask)
    size = None if exact else block_size
    assert bt.block_sparse_attention_path(q, k, v, m, block_size=size,
                                          **conditions) == "cuda_wgmma"
    if exact:
        check_exact(q, k, v, m, **conditions)
    else:
        check(q, k, v, m, block_size, **conditions)
    assert_runs_identical(q, k, v, m, size, **conditions)


# One block size in the quick tier: each takes about 45 s on an H200.
@pytest.mark.parametrize("block_size", [128] + [pytest.param(b, marks=pytest.mark.slow)
                                               for b in (64, (128, 64), (64, 128))])
def test_hopper_document_ids(device, monkeypatch, block_size):
    """The Hopper kernels' test of document ids (forward and backward):
    packed documents, causal and not, with a tile mask, an exact mask and a
    bottom-right window on top; ids that are not sorted (documents that
    interleave, so the tiles between them are kept and tested); a row that
    sees no key of its document. Against float64 attention, bit-identical on
    a second run; the mma.sync executor keeps document ids on the generic
    kernel."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the wgmma kernels run on Hopper GPUs")
    B, H, Lq, Lk = 2, 4, 300, 517
    packed_q = documents(B, Lq, 6, seed=98, device=device)
    packed_k = documents(B, Lk, 6, seed=98, device=device)
    pair = (block_size, block_size) if isinstance(block_size, int) else block_size
    g = torch.Generator().manual_seed(99)
    mixed_q = torch.randint(0, 3, (B, Lq), generator=g).to(device)
    mixed_k = torch.randint(0, 3, (1, Lk), generator=g).to(device)
    mixed_q[1, 5] = 7  # an id no key has: the row sees nothing
    dense = torch.rand(1, 1, Lq, Lk, generator=g) < 0.5
    dense[..., :128] = True
    exact = masks.from_dense(dense.to(device), block_size)
    tiles = random_mask(B, H, Lq, Lk, block_size, device, density=0.7, seed=100)
    for D in (64, 128):
        q, k, v = inputs(B, H, 2, Lq, Lk, D, D, torch.bfloat16, device, seed=101 + D)
        for ids, m, conditions in (
                ((packed_q, packed_k), None, dict(is_causal=True, causal_align="bottom_right")),
                ((packed_q, packed_k), tiles, {}),
                ((mixed_q, mixed_k), None, {}),
                ((mixed_q, mixed_k), exact, dict(window=(200, 10), causal_align="bottom_right"))):
            check_on_wgmma(q, k, v, m, pair, **conditions, document_ids=ids)
    monkeypatch.setenv("BARACUDA_DISABLE_WGMMA", "1")
    assert bt.block_sparse_attention_path(q, k, v, None, block_size=block_size,
                                          document_ids=(packed_q, packed_k)) == "cuda_generic"


# One block size in the quick tier: each takes about 25 s on an H200.
@pytest.mark.parametrize("block_size", [128] + [pytest.param(b, marks=pytest.mark.slow)
                                               for b in (64, (128, 64), (64, 128))])
def test_hopper_head_dim_256(device, monkeypatch, block_size):
    """The Hopper forward with 256-wide heads: a random tile
    mask, causal, GQA and uneven lengths; bottom-right causal with a window;
    an exact mask; a decode over a cache with kv_lens and NaN past the
    lengths (keys split across CTAs). Outputs, lse and gradients (the
    backward runs the generic kernel) against float64 attention,
    bit-identical on a second run; the mma.sync executor leaves 256-wide
    heads to the generic kernel."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the wgmma kernels run on Hopper GPUs")
    pair = (block_size, block_size) if isinstance(block_size, int) else block_size
    B, H, Lq, Lk, D = 2, 4, 300, 517, 256
    q, k, v = inputs(B, H, 2, Lq, Lk, D, D, torch.bfloat16, device, seed=103)
    tiles = random_mask(B, H, Lq, Lk, block_size, device, density=0.6, seed=104)
    g = torch.Generator().manual_seed(105)
    dense = torch.rand(1, 1, Lq, Lk, generator=g) < 0.5
    dense[..., :128] = True
    exact = masks.from_dense(dense.to(device), block_size)
    for m, conditions in ((tiles, {}), (tiles, dict(is_causal=True)),
                          (None, dict(is_causal=True, causal_align="bottom_right",
                                      window=(150, 0))),
                          (exact, {})):
        check_on_wgmma(q, k, v, m, pair, **conditions)
    # Decode: 4 queries per head over a long cache, junk past the lengths.
    S = 2500
    qd, kc, vc = inputs(B, H, 2, 4, S, D, D, torch.bfloat16, device, seed=106)
    lens = torch.tensor([S, 1333], device=device)
    kc[1, :, 1333:] = float("nan")
    vc[1, :, 1333:] = float("nan")
    out, lse = bt.block_sparse_attention(qd, kc, vc, None, block_size=pair, is_causal=True,
                                         causal_align="bottom_right", kv_lens=lens,
                                         return_lse=True)
    for b, n in enumerate(lens.tolist()):
        dense = element_mask(1, H, 4, n, is_causal=True, causal_align="bottom_right")
        want_out, want_lse = reference_attention(qd[b:b + 1].double().cpu(),
                                                 kc[b:b + 1, :, :n].double().cpu(),
                                                 vc[b:b + 1, :, :n].double().cpu(), dense)
        torch.testing.assert_close(out[b:b + 1].double().cpu(), want_out, **tol(torch.bfloat16))
        torch.testing.assert_close(lse[b:b + 1].double().cpu(), want_lse,
                                   **lse_tol(torch.bfloat16))
    monkeypatch.setenv("BARACUDA_DISABLE_WGMMA", "1")
    assert bt.block_sparse_attention_path(q, k, v, tiles, block_size=pair) == "cuda_generic"
