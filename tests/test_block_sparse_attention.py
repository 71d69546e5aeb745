"""Block-sparse attention forward and the block-mask builders.

References are float64 SDPA (math backend) with the equivalent dense mask,
computed from the very inputs the op sees (half inputs rounded first); rows
with no visible key are checked to be exactly (0, -inf). On CUDA the cases
are chosen so that both executors run: block sizes that are multiples of 64
with D in {64, 128} take the tensor-core kernel (wgmma on Hopper, mma.sync
before) for float16/bfloat16, every other case the generic one (each test
asserts which).
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.optests import opcheck

import baracuda_torch as bt
from baracuda_torch import masks

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
HEAD_DIMS = [16, 64, 80, 128, 256]


def tol(dtype):
    return {torch.float16: dict(atol=4e-3, rtol=4e-3), torch.bfloat16: dict(atol=2.5e-2, rtol=2.5e-2),
            torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}[dtype]


def lse_tol(dtype):
    return dict(atol=1e-10, rtol=1e-10) if dtype == torch.float64 else dict(atol=2e-4, rtol=2e-4)


def reference(q, k, v, block_mask, block_size, is_causal=False, scale=None):
    """(out, lse) in float64 on CPU; empty rows as (0, -inf)."""
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    dense = masks.to_dense(block_mask.cpu(), q.shape[2], k.shape[2], block_size, is_causal=is_causal)
    dense = dense.expand(q.shape[0], q.shape[1], -1, -1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~dense, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale)
    empty = ~dense.any(-1)
    return out.masked_fill(empty[..., None], 0.0), lse


def inputs(B, H, Hkv, Lq, Lk, D, Dv, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).to(device)  # noqa: E731
    return mk(B, H, Lq, D), mk(B, Hkv, Lk, D), mk(B, Hkv, Lk, Dv)


def random_mask(B, H, Lq, Lk, block_size, device, density=0.6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return masks.random(Lq, Lk, block_size, density=density, batch=B, heads=H, generator=g).to(device)


def expected_path(q, v, device, block_size):
    if device.type == "cpu":
        return "cpu"
    bq, bk = (block_size, block_size) if isinstance(block_size, int) else block_size
    hopper = torch.cuda.get_device_capability(device)[0] == 9
    wgmma = hopper and os.environ.get("BARACUDA_DISABLE_WGMMA", "0") in ("", "0")
    dims = (64, 128, 256) if wgmma else (64, 128)  # 256: the Hopper forward only
    tc = (q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] == v.shape[-1]
          and q.shape[-1] in dims and bq % 64 == 0 and bk % 64 == 0)
    if not tc:
        return "cuda_generic"
    return "cuda_wgmma" if wgmma else "cuda_tensor_core"


def check(q, k, v, m, block_size, is_causal=False, scale=None):
    out, lse = bt.block_sparse_attention(q, k, v, m, block_size=block_size, is_causal=is_causal,
                                         scale=scale, return_lse=True)
    path = bt.block_sparse_attention_path(q, k, v, m, block_size=block_size, is_causal=is_causal)
    assert path == expected_path(q, v, q.device, block_size)
    ref_out, ref_lse = reference(q, k, v, m, block_size, is_causal, scale)
    assert out.dtype == q.dtype and out.shape == ref_out.shape
    assert lse.dtype == (torch.float64 if q.dtype == torch.float64 else torch.float32)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out.double().cpu(), ref_out, **tol(q.dtype))
    torch.testing.assert_close(lse.double().cpu(), ref_lse, **lse_tol(q.dtype))
    return out, lse


# ---------------------------------------------------------------- correctness


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_dtypes_and_head_dims(device, dtype, D):
    # Lengths not multiples of the block, Lq != Lk, causal on every other D.
    q, k, v = inputs(1, 2, 2, 150, 231, D, D, dtype, device)
    m = random_mask(1, 2, 150, 231, 64, device)
    check(q, k, v, m, 64, is_causal=D in (64, 128, 256))


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [64, 128, (128, 64), (64, 128), (16, 32), 48, 1, (7, 300)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("is_causal", [False, True])
def test_block_sizes(device, block_size, dtype, is_causal):
    q, k, v = inputs(2, 2, 1, 200, 270, 64, 64, dtype, device, seed=1)
    m = random_mask(2, 2, 200, 270, block_size, device, seed=2)
    check(q, k, v, m, block_size, is_causal=is_causal)


@pytest.mark.parametrize("block_size", [64, 128, (128, 64)])
@pytest.mark.parametrize("D", [64, 128])
def test_mma_sync_kernel_when_wgmma_is_disabled(device, monkeypatch, block_size, D):
    # On Hopper the wgmma kernel is the default; the mma.sync one (every other
    # tensor-core GPU) must stay right there too.
    if device.type != "cuda":
        pytest.skip("a CUDA executor choice")
    monkeypatch.setenv("BARACUDA_DISABLE_WGMMA", "1")
    q, k, v = inputs(2, 4, 2, 300, 517, D, D, torch.bfloat16, device, seed=7)
    m = random_mask(2, 4, 300, 517, block_size, device, seed=8)
    check(q, k, v, m, block_size)
    check(q, k, v, m, block_size, is_causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_d128_long_tail(device, dtype):
    # Several key tiles per block and a query tail in the last CTA.
    q, k, v = inputs(1, 2, 2, 300, 517, 128, 128, dtype, device, seed=3)
    m = random_mask(1, 1, 300, 517, 128, device, density=0.7, seed=4)
    check(q, k, v, m, 128, is_causal=False)
    check(q, k, v, m, 128, is_causal=True)


@pytest.mark.parametrize("block_size", [128, 64])
def test_more_query_tiles_than_resident_ctas(device, block_size):
    # The wgmma kernel's grid is persistent: each CTA takes many query tiles,
    # some with no key tile at all, and the work counter must start over on
    # every call (a second call gives the same bits).
    if device.type != "cuda":
        pytest.skip("a property of the CUDA grid")
    q, k, v = inputs(3, 16, 4, 1100, 900, 128, 128, torch.bfloat16, device, seed=11)
    g = torch.Generator().manual_seed(12)
    nbq, nbk = masks.num_blocks(1100, 900, block_size)
    m = torch.rand(3, 16, nbq, nbk, generator=g) < 0.4
    m[:, :, ::5] = False  # whole query blocks with nothing to visit
    m = m.to(device)
    for is_causal in (False, True):
        out, lse = check(q, k, v, m, block_size, is_causal=is_causal)
        again, lse_again = bt.block_sparse_attention(q, k, v, m, block_size=block_size,
                                                     is_causal=is_causal, return_lse=True)
        assert torch.equal(out, again) and torch.equal(lse, lse_again)


def test_different_value_dim(device):
    q, k, v = inputs(1, 2, 2, 40, 70, 32, 48, torch.float32, device)
    check(q, k, v, random_mask(1, 2, 40, 70, 16, device), 16)


@pytest.mark.parametrize("Hkv", [1, 2, 4])
def test_grouped_query_attention(device, Hkv):
    for dtype in (torch.float16, torch.float32):
        q, k, v = inputs(2, 4, Hkv, 130, 130, 64, 64, dtype, device, seed=Hkv)
        check(q, k, v, random_mask(2, 4, 130, 130, 64, device, seed=Hkv), 64, is_causal=True)


def test_scale(device):
    q, k, v = inputs(1, 2, 2, 70, 90, 64, 64, torch.float16, device)
    m = random_mask(1, 2, 70, 90, 64, device)
    for scale in (0.3, -0.05, 0.0):
        check(q, k, v, m, 64, scale=scale)


def test_scores_past_the_float_range_are_nan(device):
    """Scaled scores beyond float32's range have no finite weights: out and
    lse are NaN, never the empty state (0, -inf) they could pass for."""
    for dtype, D in ((torch.bfloat16, 64), (torch.float32, 64)):
        q, k, v = inputs(1, 2, 2, 64, 128, D, D, dtype, device)
        q, k = q.abs() + 1e18, k.abs() + 1e18  # q . k about 6e37: finite in float32
        m = torch.ones(1, 1, 1, 2, dtype=torch.bool, device=device)
        out, lse = bt.block_sparse_attention(q, k, v, m, block_size=64, scale=100.0,
                                             return_lse=True)
        assert out.isnan().all() and lse.isnan().all(), (dtype, bt.block_sparse_attention_path(
            q, k, v, m, block_size=64))


def test_empty_rows_are_empty_states(device):
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        q, k, v = inputs(1, 2, 2, 192, 200, 64, 64, dtype, device)
        m = torch.ones(1, 2, 3, 4, dtype=torch.bool, device=device)
        m[0, 0, 1] = False           # a whole query block of head 0 sees nothing
        m[0, 1, :, :] = False
        m[0, 1, 2, 3] = True         # head 1: only the last (tail) key block, last query block
        out, lse = check(q, k, v, m, 64)
        assert torch.equal(out[0, 0, 64:128].cpu(), torch.zeros(64, 64, dtype=dtype))
        assert torch.isneginf(lse[0, 0, 64:128]).all() and torch.isneginf(lse[0, 1, :128]).all()
        assert (out[0, 1, :128] == 0).all()
        # Causal: a row whose only visible blocks lie after it is empty too.
        mc = torch.zeros(1, 1, 3, 4, dtype=torch.bool, device=device)
        mc[..., 0, 1] = True
        out, lse = check(q, k, v, mc, 64, is_causal=True)
        assert torch.isneginf(lse[:, :, :64]).all() and (out[:, :, :64] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_off_blocks_are_never_read(device, dtype):
    """NaN keys and values in blocks that no query block keeps cannot reach
    the output: those blocks are skipped, not masked."""
    q, k, v = inputs(1, 2, 2, 256, 320, 64, 64, dtype, device)
    m = random_mask(1, 1, 256, 320, 64, device, density=0.5, seed=3)
    m[..., 1] = False
    m[..., 3] = False
    m[..., 0, 0] = True
    poisoned_k, poisoned_v = k.clone(), v.clone()
    for kb in (1, 3):
        poisoned_k[:, :, kb * 64:(kb + 1) * 64] = float("nan")
        poisoned_v[:, :, kb * 64:(kb + 1) * 64] = float("nan")
    out, lse = check(q, poisoned_k.nan_to_num(0.0), poisoned_v.nan_to_num(0.0), m, 64)
    out2, lse2 = bt.block_sparse_attention(q, poisoned_k, poisoned_v, m, return_lse=True)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def test_empty_tensors(device):
    q, k, v = inputs(1, 2, 2, 0, 10, 64, 64, torch.float32, device)
    out, lse = bt.block_sparse_attention(q, k, v, torch.ones(1, 1, 0, 1, dtype=torch.bool, device=device),
                                         return_lse=True)
    assert out.shape == (1, 2, 0, 64) and lse.shape == (1, 2, 0)
    q, k, v = inputs(1, 2, 2, 10, 0, 64, 64, torch.float16, device)
    out, lse = bt.block_sparse_attention(q, k, v, torch.ones(1, 1, 1, 0, dtype=torch.bool, device=device),
                                         return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    q, k, v = inputs(0, 2, 2, 10, 10, 64, 64, torch.float32, device)
    assert bt.block_sparse_attention(q, k, v, torch.ones(1, 1, 1, 1, dtype=torch.bool,
                                                         device=device)).shape == (0, 2, 10, 64)


def test_mask_layouts_agree(device):
    """Broadcast, flattened, uint8 (any nonzero byte) and strided masks are
    the same mask."""
    q, k, v = inputs(2, 3, 3, 130, 190, 64, 64, torch.float16, device)
    full = random_mask(2, 3, 130, 190, 64, device)
    base = bt.block_sparse_attention(q, k, v, full)
    flat = bt.block_sparse_attention(q, k, v, full.flatten(2))
    as_u8 = bt.block_sparse_attention(q, k, v, full.to(torch.uint8) * 7)
    strided = bt.block_sparse_attention(q, k, v, full.transpose(2, 3).contiguous().transpose(2, 3))
    for other in (flat, as_u8, strided):
        assert torch.equal(base, other)
    for shape in [(1, 1), (2, 1), (1, 3)]:
        m = random_mask(*shape, 130, 190, 64, device, seed=sum(shape))
        out = check(q, k, v, m, 64)[0]
        assert torch.equal(out, bt.block_sparse_attention(q, k, v, m.expand(2, 3, -1, -1)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_strided_inputs(device, dtype):
    B, H, L, D = 2, 4, 150, 64
    g = torch.Generator().manual_seed(5)
    # [B, L, H, D] storage viewed as [B, H, L, D] (the usual projection output).
    q = torch.randn(B, L, H, D, generator=g).to(dtype).to(device).transpose(1, 2)
    # Every other element of the head dim.
    k = torch.randn(B, 2, L, 2 * D, generator=g).to(dtype).to(device)[..., ::2]
    # A storage offset of one element: rows not 16-byte aligned.
    v = torch.randn(B * 2 * L * D + 1, generator=g).to(dtype).to(device)[1:].view(B, 2, L, D)
    m = random_mask(B, H, L, L, 64, device)
    check(q, k, v, m, 64, is_causal=True)
    # Expanded (stride-0) key heads.
    k1 = torch.randn(B, 1, L, D, generator=g).to(dtype).to(device).expand(B, 2, L, D)
    check(q, k1, v, m, 64)
    # A query broadcast over the batch, and one key repeated along the sequence.
    q1 = q[:1].expand(B, -1, -1, -1)
    k2 = torch.randn(B, 2, 1, D, generator=g).to(dtype).to(device).expand(B, 2, L, D)
    check(q1, k2, v, m, 64, is_causal=True)


# ---------------------------------------------------------------- mask builders


def test_builders_match_their_dense_definition():
    Lq, Lk, bs = 300, 260, (64, 32)
    i = torch.arange(Lq)[:, None]
    j = torch.arange(Lk)[None, :]
    assert torch.equal(masks.causal(Lq, Lk, bs), masks.from_dense(j <= i, bs).tiles)
    win = (i - j >= 0) & (i - j < 100)
    sink = (j < 32) & (j <= i)
    assert torch.equal(masks.sliding_window(Lq, Lk, 100, bs, sink_blocks=1),
                       masks.from_dense(win | sink, bs).tiles)
    assert torch.equal(masks.sliding_window(Lq, Lk, 100, bs, causal=False),
                       masks.from_dense((i - j).abs() < 100, bs).tiles)
    qb, kb = torch.arange(5)[:, None], torch.arange(9)[None, :]
    assert torch.equal(masks.dilated(Lq, Lk, bs, dilation=3)[0, 0], (qb - kb) % 3 == 0)
    bb = masks.bigbird(Lq, Lk, bs, global_blocks=1, window_blocks=1, random_blocks=2, batch=2,
                       heads=3, generator=torch.Generator().manual_seed(0))
    assert bb.shape == (2, 3, 5, 9)
    assert bb[..., 0, :].all() and bb[..., :, 0].all() and bb[..., 3, 2:5].all()
    assert (bb.sum(-1) >= 2).all()
    r = masks.random(Lq, Lk, bs, density=0.25, batch=4, heads=4, generator=torch.Generator().manual_seed(0))
    assert r.shape == (4, 4, 5, 9) and 0.1 < r.float().mean() < 0.4
    assert masks.num_blocks(Lq, Lk, bs) == (5, 9)


def test_from_flex_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    def window(b, h, q, kv):
        return (q >= kv) & (q - kv < 200)

    bm = create_block_mask(window, 2, 1, 300, 400, device="cpu", BLOCK_SIZE=(128, 64))
    i = torch.arange(300)[:, None]
    j = torch.arange(400)[None, :]
    assert torch.equal(masks.from_flex(bm).tiles,
                       masks.from_dense(window(0, 0, i, j), (128, 64)).tiles.expand(2, 1, -1, -1))


@pytest.mark.parametrize("builder", ["causal", "sliding_window", "bigbird", "dilated", "random",
                                     "from_dense", "from_flex"])
def test_every_builder_runs_against_reference(device, builder):
    L, bs = 320, 64
    g = torch.Generator().manual_seed(7)
    make = {
        "causal": lambda: masks.causal(L, L, bs),
        "sliding_window": lambda: masks.sliding_window(L, L, 100, bs, sink_blocks=1),
        "bigbird": lambda: masks.bigbird(L, L, bs, batch=1, heads=2, random_blocks=1, generator=g),
        "dilated": lambda: masks.dilated(L, L, bs, dilation=2, causal=True),
        "random": lambda: masks.random(L, L, bs, density=0.3, heads=2, generator=g),
        "from_dense": lambda: masks.from_dense(torch.rand(2, L, L, generator=g) < 0.002, bs).tiles,
        "from_flex": lambda: _flex_causal(L, bs),
    }
    m = make[builder]().to(device)
    causal = builder in ("causal", "sliding_window", "dilated", "from_flex")
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v = inputs(1, 2, 1, L, L, 64, 64, dtype, device, seed=8)
        check(q, k, v, m, bs, is_causal=causal)


def _flex_causal(L, bs):
    from torch.nn.attention.flex_attention import create_block_mask

    return masks.from_flex(create_block_mask(lambda b, h, q, kv: q >= kv, None, None, L, L,
                                             device="cpu", BLOCK_SIZE=bs)).tiles


def test_attention_flops():
    q, k, v = inputs(1, 2, 2, 256, 256, 64, 32, torch.float32, "cpu")
    full = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    assert bt.attention_flops(q, k, v, full, 64) == 2 * 2 * 256 * 256 * 96
    assert bt.attention_flops(q, k, v, full, 64, is_causal=True) == 2 * 2 * (256 * 257 // 2) * 96


# ---------------------------------------------------------------- torch integration


def test_opcheck(device):
    q, k, v = inputs(1, 2, 1, 70, 50, 16, 16, torch.float32, device)
    m = random_mask(1, 2, 70, 50, 32, device)
    opcheck(torch.ops.baracuda.block_sparse_attention.default, (q, k, v, m, 32, 32, None, True))
    opcheck(torch.ops.baracuda.block_sparse_attention.default, (q, k, v, m.flatten(2), 32, 32, 0.5, False))


def test_compile_fullgraph_dynamic_no_recompile(device):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def f(q, k, v, m):
        out, lse = bt.block_sparse_attention(q, k, v, m, block_size=32, is_causal=True, return_lse=True)
        return out * 2, lse

    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    for L in (70, 130):
        q, k, v = inputs(1, 2, 2, L, L, 16, 16, torch.float32, device, seed=L)
        m = masks.causal(L, L, 32, device=device)
        got, want = compiled(q, k, v, m), f(q, k, v, m)
        torch.testing.assert_close(got, want)
    assert counter.frame_count == 1


def test_cuda_graph_replays_agree(device):
    # The wgmma kernel hands out work through a counter the op zeroes on every
    # call; a captured graph must zero it on every replay too.
    if device.type != "cuda":
        pytest.skip("CUDA graphs")
    q, k, v = inputs(2, 8, 2, 700, 700, 128, 128, torch.bfloat16, device, seed=21)
    m = random_mask(2, 8, 700, 700, 128, device, density=0.5, seed=22)
    want = bt.block_sparse_attention(q, k, v, m, block_size=128)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        bt.block_sparse_attention(q, k, v, m, block_size=128)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = bt.block_sparse_attention(q, k, v, m, block_size=128)
    for _ in range(3):
        got.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measured on CUDA")
def test_memory_does_not_grow_with_lq_times_lk():
    L, D = 32768, 64
    q, k, v = (torch.randn(1, 2, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    m = masks.sliding_window(L, L, 1024, 128, sink_blocks=1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out, lse = bt.block_sparse_attention(q, k, v, m, block_size=128, is_causal=True, return_lse=True)
    torch.cuda.synchronize()
    grown = torch.cuda.max_memory_allocated() - before
    # The outputs themselves, and nothing of size L x L (which would be GiB).
    assert grown <= out.numel() * out.element_size() + lse.numel() * 4 + (2 << 20)
    # Rows below 256 see no key beyond 255 (causal): check them against the reference.
    ref_out, ref_lse = reference(q[:, :, :256], k[:, :, :256], v[:, :, :256], m[:, :, :2, :2], 128, True)
    torch.testing.assert_close(out[:, :, :256].double().cpu(), ref_out, **tol(torch.bfloat16))
    torch.testing.assert_close(lse[:, :, :256].double().cpu(), ref_lse, **lse_tol(torch.bfloat16))


# ---------------------------------------------------------------- errors


def test_errors(device):
    q, k, v = inputs(1, 4, 2, 100, 120, 16, 16, torch.float32, device)
    m = random_mask(1, 4, 100, 120, 32, device)
    f = bt.block_sparse_attention
    with pytest.raises(RuntimeError, match=r"block_sparse_attention: q has 4 heads, not a multiple of the 3"):
        f(q, *inputs(1, 3, 3, 100, 120, 16, 16, torch.float32, device)[1:], m, block_size=32)
    with pytest.raises(RuntimeError, match=r"block_mask.shape=\[1, 4, 4, 3\] must be \[1 or 1, 4 or 1, 4, 4\]"):
        f(q, k, v, m[..., :3], block_size=32)
    with pytest.raises(RuntimeError, match=r"block_mask.dtype=Float must be bool or uint8"):
        f(q, k, v, m.float(), block_size=32)
    with pytest.raises(RuntimeError, match=r"k.dtype=Double must equal q.dtype=Float"):
        f(q, k.double(), v, m, block_size=32)
    with pytest.raises(RuntimeError, match=r"k.shape\[-1\]=8 must equal q.shape\[-1\]=16"):
        f(q, k[..., :8], v, m, block_size=32)
    with pytest.raises(RuntimeError, match=r"v.shape\[2\]=60 must equal k.shape\[2\]=120"):
        f(q, k, v[:, :, :60], m, block_size=32)
    with pytest.raises(RuntimeError, match=r"head_dim=300 must be in \[1, 256\]"):
        f(*inputs(1, 4, 2, 100, 120, 300, 16, torch.float32, device), m, block_size=32)
    with pytest.raises(RuntimeError, match=r"q.dim\(\)=3 must be 4"):
        f(q[0], k, v, m, block_size=32)
    with pytest.raises(RuntimeError, match=r"q.dtype=Int is not supported"):
        f(q.int(), k.int(), v.int(), m, block_size=32)
    with pytest.raises(RuntimeError, match=r"is flattened but its last axis is not num_q_blocks"):
        f(q, k, v, m.flatten(2)[..., 1:], block_size=32)
    with pytest.raises(RuntimeError, match=r"scale=inf must be finite"):
        f(q, k, v, m, block_size=32, scale=math.inf)
    with pytest.raises(ValueError, match=r"block_size=\(0, 32\) must be a positive int"):
        f(q, k, v, m, block_size=(0, 32))
    with pytest.raises(RuntimeError, match=r"block_size=\(-1, 32\) must be positive"):
        torch.ops.baracuda.block_sparse_attention(q, k, v, m, -1, 32, None, False)


def test_every_tile_mask_is_reused_safely(device):
    """block_mask=None reuses one every-tile mask per (device, tile counts):
    made under inference_mode it still serves a training call, and a first
    call inside a CUDA graph capture does not keep the graph's mask."""
    q, k, v = inputs(1, 2, 2, 24, 40, 16, 16, torch.float32, device, seed=91)
    with torch.inference_mode():
        bt.block_sparse_attention(q, k, v, block_size=8)
    qq = q.clone().requires_grad_()
    out = bt.block_sparse_attention(qq, k, v, block_size=8)
    out.sum().backward()
    want = bt.block_sparse_attention(q, k, v, torch.ones(1, 1, 3, 5, dtype=torch.bool,
                                                         device=device), block_size=8)
    torch.testing.assert_close(out.detach(), want)
    if device.type != "cuda":
        return
    q2, k2, v2 = inputs(1, 2, 2, 24, 72, 16, 16, torch.float32, device, seed=92)  # a new key
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = bt.block_sparse_attention(q2, k2, v2, block_size=8)
    graph.replay()
    torch.cuda.synchronize()
    eager = bt.block_sparse_attention(q2, k2, v2, block_size=8)
    torch.testing.assert_close(captured, eager)
    torch.testing.assert_close(eager, bt.block_sparse_attention(
        q2, k2, v2, torch.ones(1, 1, 3, 9, dtype=torch.bool, device=device), block_size=8))
