"""Attention-state merge: merge_state, merge_state_, merge_states (+ backward).

References are computed in float64 from the same inputs; empty states are
checked bit for bit, with NaN garbage behind them to prove they are skipped.
"""

import math

import pytest
import torch
from torch.testing._internal.optests import opcheck

import baracuda_torch as bt
from helpers import bits

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
HEAD_DIMS = [1, 7, 64, 96, 128, 256, 512]
NEG_INF = float("-inf")


def lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def tol(dtype):
    return {torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
            torch.float32: dict(atol=2e-6, rtol=2e-6), torch.float64: dict(atol=1e-12, rtol=1e-12)}[dtype]


def reference(v, s, base):
    """Merge of states stacked on axis -3 (v) / -2 (s), in float64."""
    ln_b = math.log(2.0) if base == "2" else 1.0
    s64 = s.double() * ln_b
    m = s64.amax(dim=-2, keepdim=True)
    empty = torch.isneginf(m)
    m = torch.where(empty, torch.zeros_like(m), m)
    w = torch.exp(s64 - m)
    total = w.sum(-2, keepdim=True)
    v64 = torch.where(w.unsqueeze(-1) > 0, v.double(), torch.zeros((), dtype=torch.float64))
    out_v = (w.unsqueeze(-1) * v64).sum(-3) / torch.where(empty, 1.0, total).unsqueeze(-1).squeeze(-3)
    out_s = torch.where(empty, NEG_INF, m + torch.log(total)).squeeze(-2) / ln_b
    return out_v, out_s


def random_state(shape, dtype, device, g, spread=4.0):
    v = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).to(device)
    s = (torch.randn(shape[:-1], generator=g, dtype=torch.float64) * spread).to(
        lse_dtype(dtype)).to(device)
    return v, s


def check_close(out, ref, dtype):
    v, s = out
    rv, rs = ref
    assert not torch.isnan(v).any() and not torch.isnan(s).any()
    torch.testing.assert_close(v.double().cpu(), rv.cpu(), **tol(dtype))
    torch.testing.assert_close(s.double().cpu(), rs.cpu(), atol=1e-5 if dtype != torch.float64 else 1e-12,
                               rtol=1e-6 if dtype != torch.float64 else 1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("base", ["2", "e"])
def test_merge_state_every_dtype_and_head_dim(device, dtype, base, rng):
    for d in HEAD_DIMS:
        va, sa = random_state((5, 3, d), dtype, device, rng)
        vb, sb = random_state((5, 3, d), dtype, device, rng)
        out = bt.merge_state(va, sa, vb, sb, lse_base=base)
        check_close(out, reference(torch.stack([va, vb], -3), torch.stack([sa, sb], -2), base), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_merge_state_strided_and_batched(device, dtype, rng):
    # Leading batch axes, a transposed v, a non-unit inner stride, strided s.
    va, sa = random_state((2, 4, 6, 64), dtype, device, rng)
    vb_base, sb_base = random_state((2, 6, 4, 128), dtype, device, rng)
    vb = vb_base.transpose(1, 2)[..., ::2]
    sb = sb_base.transpose(1, 2)
    sa = sa.transpose(1, 2).contiguous().transpose(1, 2)
    out = bt.merge_state(va, sa, vb, sb)
    check_close(out, reference(torch.stack([va, vb], -3), torch.stack([sa, sb], -2), "2"), dtype)
    v = va.clone()
    s = sa.clone()
    bt.merge_state_(v, s, vb, sb)
    assert torch.equal(v, out[0]) and torch.equal(s, out[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_state_is_neutral_bit_for_bit(device, dtype, rng):
    v, s = random_state((6, 4, 96), dtype, device, rng)
    v[0, 0, :5] = -0.0  # signed zeros must survive too
    empty_v = torch.full_like(v, float("nan"))  # garbage behind an empty state is skipped
    empty_s = torch.full_like(s, NEG_INF)
    for args in ((v, s, empty_v, empty_s), (empty_v, empty_s, v, s)):
        mv, ms = bt.merge_state(*args)
        assert torch.equal(bits(mv), bits(v)) and torch.equal(bits(ms), bits(s))
    mv, ms = bt.merge_states(torch.stack([empty_v, v, empty_v], -3), torch.stack([empty_s, s, empty_s], -2))
    assert torch.equal(bits(mv), bits(v)) and torch.equal(bits(ms), bits(s))
    zero_v = torch.zeros_like(v)
    mv, ms = bt.merge_state(zero_v, empty_s, zero_v, empty_s)
    assert torch.equal(mv, zero_v) and torch.isneginf(ms).all()
    # Some cells empty on one side, some on both, some on none.
    vb, sb = random_state((6, 4, 96), dtype, device, rng)
    sa2, sb2 = s.clone(), sb.clone()
    sa2[0] = NEG_INF
    sb2[1] = NEG_INF
    sa2[2], sb2[2] = NEG_INF, NEG_INF
    mv, ms = bt.merge_state(v, sa2, vb, sb2)
    assert torch.equal(mv[0], vb[0]) and torch.equal(ms[0], sb2[0])
    assert torch.equal(mv[1], v[1]) and torch.equal(ms[1], sa2[1])
    assert not mv[2].any() and torch.isneginf(ms[2]).all()
    check_close((mv[3:], ms[3:]), reference(torch.stack([v, vb], -3)[3:], torch.stack([sa2, sb2], -2)[3:], "2"), dtype)


def test_extreme_lse_values(device, rng):
    va, _ = random_state((4, 2, 8), torch.float32, device, rng)
    vb, _ = random_state((4, 2, 8), torch.float32, device, rng)
    sa = torch.tensor([[-1e30, -1e30], [0.0, -1e30], [1e4, -1e4], [-1e30, 50.0]], device=device)
    sb = torch.tensor([[-1e30, 0.0], [-1e30, -1e30], [-1e4, 1e4], [-1e30 + 1e24, 49.0]], device=device)
    out = bt.merge_state(va, sa, vb, sb)
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[1]).all()
    check_close(out, reference(torch.stack([va, vb], -3), torch.stack([sa, sb], -2), "2"), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [0, 1, 2, 5, 8])
def test_merge_states_matches_reference(device, dtype, n, rng):
    v, s = random_state((3, n, 4, 64), dtype, device, rng)
    if n >= 2:
        s[0, 1] = NEG_INF  # some empty states among the stack
        s[1] = NEG_INF     # a cell whose states are all empty
    for base in ("2", "e"):
        mv, ms = bt.merge_states(v, s, lse_base=base)
        assert mv.shape == (3, 4, 64) and ms.shape == (3, 4)
        if n == 0:
            assert not mv.any() and torch.isneginf(ms).all()
            continue
        check_close((mv, ms), reference(v, s, base), dtype)


def test_merge_states_strided_and_odd_head_dim(device, rng):
    base_v, base_s = random_state((8, 2, 5, 14), torch.float32, device, rng)
    v = base_v.permute(1, 0, 2, 3)[..., ::2]   # [2, 8, 5, 7], n = 8 along a strided axis
    s = base_s.permute(1, 0, 2)
    check_close(bt.merge_states(v, s), reference(v, s, "2"), torch.float32)


def test_merge_states_of_two_equals_merge_state(device, rng):
    va, sa = random_state((7, 3, 32), torch.float32, device, rng)
    vb, sb = random_state((7, 3, 32), torch.float32, device, rng)
    pair = bt.merge_state(va, sa, vb, sb)
    stacked = bt.merge_states(torch.stack([va, vb], 1), torch.stack([sa, sb], 1))
    torch.testing.assert_close(pair, stacked, atol=1e-6, rtol=1e-6)


def test_in_place_matches_out_of_place_and_returns_inputs(device, rng):
    va, sa = random_state((9, 2, 128), torch.bfloat16, device, rng)
    vb, sb = random_state((9, 2, 128), torch.bfloat16, device, rng)
    expected = bt.merge_state(va, sa, vb, sb)
    v, s = va.clone(), sa.clone()
    rv, rs = bt.merge_state_(v, s, vb, sb)
    assert rv is v and rs is s
    assert torch.equal(v, expected[0]) and torch.equal(s, expected[1])


def padded_copy(t, pad):
    """`t`'s values behind strides that no contiguous tensor has: the last
    axis padded by `pad` elements of NaN, then sliced back."""
    wide = torch.full((*t.shape[:-1], t.shape[-1] + pad), float("nan"), dtype=t.dtype, device=t.device)
    wide[..., :t.shape[-1]] = t
    return wide[..., :t.shape[-1]]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_and_strided_layouts_give_identical_bits(device, dtype, rng):
    # On CUDA contiguous states take the dense kernels and padded ones the
    # general kernels; both must give the same bits, in place too (where the
    # dense kernel is used only when a cell's lanes share a warp).
    for d in (8, 64, 96, 128, 256, 512):
        for n in (1, 2, 3, 8, 9, 13):
            v, s = random_state((5, n, 3, d), dtype, device, rng)
            s[0, 0] = NEG_INF
            if n >= 2:
                s[1] = NEG_INF
            dense = bt.merge_states(v, s)
            strided = bt.merge_states(padded_copy(v, 8), padded_copy(s.unsqueeze(-1), 1).squeeze(-1))
            assert torch.equal(bits(dense[0]), bits(strided[0])), (d, n)
            assert torch.equal(bits(dense[1]), bits(strided[1])), (d, n)
        va, sa = random_state((6, 3, d), dtype, device, rng)
        vb, sb = random_state((6, 3, d), dtype, device, rng)
        sa[0, 0], sb[1, 1] = NEG_INF, NEG_INF
        dense = bt.merge_state(va, sa, vb, sb)
        strided = bt.merge_state(padded_copy(va, 8), sa, padded_copy(vb, 8), sb)
        v, s = va.clone(), sa.clone()
        bt.merge_state_(v, s, vb, sb)
        for got in (strided, (v, s)):
            assert torch.equal(bits(dense[0]), bits(got[0])), d
            assert torch.equal(bits(dense[1]), bits(got[1])), d


def test_merge_states_with_batch_axes(device, rng):
    # [batch, seq, n, heads, dim]: the stack axis sits between cell axes.
    v, s = random_state((2, 3, 5, 4, 64), torch.bfloat16, device, rng)
    check_close(bt.merge_states(v, s), reference(v, s, "2"), torch.bfloat16)


# ---------------------------------------------------------------- NaN and +inf LSEs
# A NaN or +inf LSE leaves its cell undefined: both outputs NaN, every
# gradient to its states NaN. Other cells are untouched by it, and the
# empty state stays neutral.

NAN, INF = float("nan"), float("inf")
# (s_a, s_b) per cell; None: a random finite LSE.
UNDEFINED_PAIRS = [(NAN, None), (None, NAN), (NAN, NEG_INF), (NEG_INF, NAN), (NAN, NAN),
                   (INF, None), (None, INF), (INF, INF), (INF, NEG_INF), (NEG_INF, INF),
                   (INF, NAN)]
DEFINED_PAIRS = [(None, None), (None, NEG_INF), (NEG_INF, None), (NEG_INF, NEG_INF)]


def pair_cells(dtype, device, rng, d, layout):
    """States whose cells (axis 0) take UNDEFINED_PAIRS then DEFINED_PAIRS;
    v behind NaN-padded strides for layout "strided"."""
    pairs = UNDEFINED_PAIRS + DEFINED_PAIRS
    va, sa = random_state((len(pairs), 3, d), dtype, device, rng)
    vb, sb = random_state((len(pairs), 3, d), dtype, device, rng)
    for c, (a, b) in enumerate(pairs):
        if a is not None:
            sa[c] = a
        if b is not None:
            sb[c] = b
    if layout == "strided":
        va, vb = padded_copy(va, 8), padded_copy(vb, 8)
    return va, sa, vb, sb


def check_undefined_then_defined(v, s, reference_v, reference_s):
    u = len(UNDEFINED_PAIRS)
    assert torch.isnan(v[:u]).all() and torch.isnan(s[:u]).all()
    assert torch.equal(bits(v[u:]), bits(reference_v)) and torch.equal(bits(s[u:]), bits(reference_s))


@pytest.mark.parametrize("layout", ["dense", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_or_inf_lse_gives_nan_in_both_outputs_of_merge_state(device, dtype, layout, rng):
    for d in (1, 64, 128):
        va, sa, vb, sb = pair_cells(dtype, device, rng, d, layout)
        u = len(UNDEFINED_PAIRS)
        for base in ("2", "e"):
            # The defined cells as they merge without the undefined ones.
            ref_v, ref_s = bt.merge_state(va[u:], sa[u:], vb[u:], sb[u:], lse_base=base)
            v, s = bt.merge_state(va, sa, vb, sb, lse_base=base)
            check_undefined_then_defined(v, s, ref_v, ref_s)
            v, s = va.clone(), sa.clone()
            bt.merge_state_(v, s, vb, sb, lse_base=base)
            check_undefined_then_defined(v, s, ref_v, ref_s)
            v, s = bt.merge_states(torch.stack([va, vb], 1), torch.stack([sa, sb], 1), lse_base=base)
            ref_v, ref_s = bt.merge_states(torch.stack([va[u:], vb[u:]], 1),
                                           torch.stack([sa[u:], sb[u:]], 1), lse_base=base)
            check_undefined_then_defined(v, s, ref_v, ref_s)


@pytest.mark.parametrize("layout", ["dense", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 3, 12, 40])
def test_nan_or_inf_lse_in_a_stack_gives_nan_in_both_outputs(device, dtype, n, layout, rng):
    # Cell c of axis 0 holds special[c] in state n // 2; the rest of the
    # stack is random, with empty states in cell 0 and the last one.
    special = [NAN, INF, NAN, INF]
    for d in (8, 128):
        v, s = random_state((len(special) + 1, n, 2, d), dtype, device, rng)
        s[0, : n // 2] = NEG_INF
        s[-1, n // 2 + 1:] = NEG_INF
        for c, value in enumerate(special):
            s[c, n // 2] = value
        if layout == "strided":
            v = padded_copy(v, 8)
        mv, ms = bt.merge_states(v, s)
        ref_v, ref_s = bt.merge_states(v[-1:], s[-1:])
        assert torch.isnan(mv[:-1]).all() and torch.isnan(ms[:-1]).all(), (n, d)
        assert torch.equal(bits(mv[-1:]), bits(ref_v)) and torch.equal(bits(ms[-1:]), bits(ref_s))


def test_nan_in_v_of_a_non_empty_state_stays_in_v(device, rng):
    va, sa = random_state((2, 3, 16), torch.float32, device, rng)
    vb, sb = random_state((2, 3, 16), torch.float32, device, rng)
    va[0, 0, 5] = NAN
    v, s = bt.merge_state(va, sa, vb, sb)
    assert torch.isnan(v[0, 0, 5]) and torch.isfinite(s).all()
    assert torch.isfinite(v[0, 0, :5]).all() and torch.isfinite(v[1]).all()


@pytest.mark.parametrize("layout", ["dense", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_or_inf_lse_gives_nan_gradients_to_its_cell(device, dtype, layout, rng):
    va, sa, vb, sb = pair_cells(dtype, device, rng, 64, layout)
    u = len(UNDEFINED_PAIRS)
    grad_v = torch.randn(va.shape, generator=rng, dtype=torch.float64).to(dtype).to(device)
    grad_s = torch.randn(sa.shape, generator=rng, dtype=torch.float64).to(sa.dtype).to(device)

    def grads(va, sa, vb, sb, g_v, g_s):
        inputs = [t.detach().requires_grad_() for t in (va, sa, vb, sb)]
        v, s = bt.merge_state(*inputs)
        return torch.autograd.grad((v * g_v).sum() + (s * g_s).sum(), inputs)

    got = grads(va, sa, vb, sb, grad_v, grad_s)
    expected = grads(va[u:], sa[u:], vb[u:], sb[u:], grad_v[u:], grad_s[u:])
    for g, e in zip(got, expected):
        assert torch.isnan(g[:u]).all()
        assert torch.equal(bits(g[u:]), bits(e))
    # Stacked: the same cells, through merge_states' backward.
    stack = lambda a, b: torch.stack([a, b], 1)  # noqa: E731

    def stack_grads(v, s, g_v, g_s):
        inputs = [t.detach().requires_grad_() for t in (v, s)]
        mv, ms = bt.merge_states(*inputs)
        return torch.autograd.grad((mv * g_v).sum() + (ms * g_s).sum(), inputs)

    got = stack_grads(stack(va, vb), stack(sa, sb), grad_v, grad_s)
    expected = stack_grads(stack(va[u:], vb[u:]), stack(sa[u:], sb[u:]), grad_v[u:], grad_s[u:])
    for g, e in zip(got, expected):
        assert torch.isnan(g[:u]).all()
        assert torch.equal(bits(g[u:]), bits(e))


# ---------------------------------------------------------------- autograd


@pytest.mark.parametrize("base", ["2", "e"])
def test_gradcheck(device, base, rng):
    va, sa = random_state((3, 2, 5), torch.float64, device, rng, spread=1.0)
    vb, sb = random_state((3, 2, 5), torch.float64, device, rng, spread=1.0)
    inputs = [t.requires_grad_() for t in (va, sa, vb, sb)]
    assert torch.autograd.gradcheck(lambda a, b, c, d: bt.merge_state(a, b, c, d, lse_base=base), inputs)
    v, s = random_state((2, 4, 3, 6), torch.float64, device, rng, spread=1.0)
    assert torch.autograd.gradcheck(lambda a, b: bt.merge_states(a, b, lse_base=base),
                                    (v.requires_grad_(), s.requires_grad_()))
    # Only one output used: the other's gradient arrives as None.
    assert torch.autograd.gradcheck(lambda a, b, c, d: bt.merge_state(a, b, c, d)[1], inputs)
    assert torch.autograd.gradcheck(lambda a, b, c, d: bt.merge_state(a, b, c, d)[0], inputs)


def test_double_backward_raises(device, rng):
    # The backward ops have no derivative; a gradient of the gradient is
    # refused when it is asked for, never returned as zeros.
    va, sa = random_state((3, 2, 5), torch.float64, device, rng, spread=1.0)
    vb, sb = random_state((3, 2, 5), torch.float64, device, rng, spread=1.0)
    inputs = [t.requires_grad_() for t in (va, sa, vb, sb)]
    v, _ = bt.merge_state(*inputs)
    grads = torch.autograd.grad(v.sum(), inputs, create_graph=True)
    with pytest.raises(RuntimeError, match="merge_state_backward: double backward"):
        grads[0].sum().backward()
    vs, ss = random_state((2, 4, 3, 6), torch.float64, device, rng, spread=1.0)
    vs.requires_grad_()
    out, lse = bt.merge_states(vs, ss)
    (g,) = torch.autograd.grad(out.sum() + lse.sum(), vs, create_graph=True)
    with pytest.raises(RuntimeError, match="merge_states_backward: double backward"):
        g.sum().backward()


def test_backward_at_empty_states_is_finite_and_zero_toward_empty(device, rng):
    va, sa = random_state((4, 2, 8), torch.float32, device, rng)
    vb, sb = random_state((4, 2, 8), torch.float32, device, rng)
    sb[0] = NEG_INF
    sa[1], sb[1] = NEG_INF, NEG_INF
    inputs = [t.requires_grad_() for t in (va, sa, vb, sb)]
    v, s = bt.merge_state(*inputs)
    (v.sum() + s.masked_fill(torch.isinf(s), 0).sum()).backward()
    for t in inputs:
        assert torch.isfinite(t.grad).all()
    assert not vb.grad[0].any() and not sb.grad[0].any()
    assert not va.grad[1].any() and not sa.grad[1].any() and not vb.grad[1].any()
    torch.testing.assert_close(va.grad[0], torch.ones_like(va.grad[0]))  # all weight on a
    vs, ss = random_state((2, 3, 2, 8), torch.float32, device, rng)
    ss[:, 1] = NEG_INF
    vs.requires_grad_()
    ss.requires_grad_()
    out_v, _ = bt.merge_states(vs, ss)
    out_v.sum().backward()
    assert torch.isfinite(vs.grad).all() and torch.isfinite(ss.grad).all()
    assert not vs.grad[:, 1].any() and not ss.grad[:, 1].any()


def test_deterministic_mode_runs_backward(device, rng):
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        va, sa = random_state((4, 2, 64), torch.float32, device, rng)
        vb, sb = random_state((4, 2, 64), torch.float32, device, rng)
        inputs = [t.requires_grad_() for t in (va, sa, vb, sb)]
        grads = []
        for _ in range(2):
            v, s = bt.merge_state(*inputs)
            grads.append(torch.autograd.grad((v * v).sum() + s.sum(), inputs))
        assert all(torch.equal(a, b) for a, b in zip(*grads))
    finally:
        torch.use_deterministic_algorithms(prev)


# ---------------------------------------------------------------- opcheck / compile


def test_opcheck(device, rng):
    va, sa = random_state((3, 2, 16), torch.float32, device, rng)
    vb, sb = random_state((3, 2, 16), torch.float32, device, rng)
    opcheck(torch.ops.baracuda.merge_state.default,
            (va.requires_grad_(), sa.requires_grad_(), vb, sb, "e"))
    opcheck(torch.ops.baracuda.merge_state_.default,
            (va.detach().clone(), sa.detach().clone(), vb, sb, "2"))
    v, s = random_state((3, 4, 2, 16), torch.float32, device, rng)
    opcheck(torch.ops.baracuda.merge_states.default, (v.requires_grad_(), s.requires_grad_(), "2"))
    g = torch.randn(3, 2, 16, device=device)
    opcheck(torch.ops.baracuda.merge_state_backward.default,
            (g, torch.randn(3, 2, device=device), va.detach(), sa.detach(), vb, sb, "2"))
    opcheck(torch.ops.baracuda.merge_state_backward.default,
            (g, None, va.detach(), sa.detach(), vb, sb, "e"))
    opcheck(torch.ops.baracuda.merge_states_backward.default,
            (g, torch.randn(3, 2, device=device), v.detach(), s.detach(), "2"))


def test_compile_fullgraph_dynamic_no_recompile(device, rng):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def f(va, sa, vb, sb, stack_v, stack_s):
        v, s = bt.merge_state(va, sa, vb, sb, lse_base="e")
        v2, s2 = bt.merge_states(stack_v, stack_s)
        return (v * 2).sum() + s.sum() + v2.sum() + s2.sum()

    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    for seq in (5, 9):
        va, sa = random_state((seq, 2, 16), torch.float32, device, rng)
        vb, sb = random_state((seq, 2, 16), torch.float32, device, rng)
        sv, ss = random_state((seq, 3, 2, 16), torch.float32, device, rng)
        args = [t.requires_grad_() for t in (va, sa, vb, sb, sv, ss)]
        out = compiled(*args)
        torch.testing.assert_close(out, f(*args))
        out.backward()
        assert all(torch.isfinite(t.grad).all() for t in args)
    assert counter.frame_count == 1


# ---------------------------------------------------------------- errors


def test_errors(device, rng):
    va, sa = random_state((3, 2, 8), torch.float32, device, rng)
    vb, sb = random_state((3, 2, 8), torch.float32, device, rng)
    ms = bt.merge_state
    with pytest.raises(RuntimeError, match=r"baracuda::merge_state: lse_base='10' must be '2'"):
        ms(va, sa, vb, sb, lse_base="10")
    with pytest.raises(RuntimeError, match=r"v_b.shape=\[3, 2, 4\] must equal \[3, 2, 8\]"):
        ms(va, sa, vb[..., :4], sb)
    with pytest.raises(RuntimeError, match=r"s_b.shape=\[3\] must be v_b.shape\[:-1\]=\[3, 2\]"):
        ms(va, sa, vb, sb[:, 0])
    with pytest.raises(RuntimeError, match=r"s_a.dtype=Half must be Float for Float states"):
        ms(va, sa.half(), vb, sb)
    with pytest.raises(RuntimeError, match=r"v_b.dtype=Double must equal Float"):
        ms(va, sa, vb.double(), sb)
    with pytest.raises(RuntimeError, match=r"v_a.dtype=Int is not supported"):
        ms(va.int(), sa, vb.int(), sb)
    with pytest.raises(RuntimeError, match=r"v_a.dim\(\)=1 must be in \[2, 8\]"):
        ms(va[0, 0], sa[0, 0], vb[0, 0], sb[0, 0])
    with pytest.raises(RuntimeError, match=r"baracuda::merge_states: v.dim\(\)=2 must be in \[3, 8\]"):
        bt.merge_states(va[0], sa[0])
    v, s = va.clone(), sa.clone()
    with pytest.raises(RuntimeError, match=r"merge_state_: v shares memory with v_other"):
        bt.merge_state_(v[:2], s[:2], v[1:], s[1:])
    assert torch.equal(v, va) and torch.equal(s, sa)
    with pytest.raises(RuntimeError, match=r"merge_state_: v has internal overlap"):
        bt.merge_state_(va[:1].expand(3, 2, 8), sa, vb, sb)


def test_in_place_merge_refuses_grad_before_writing_and_bumps_versions(device, rng):
    va, sa = random_state((3, 2, 8), torch.float32, device, rng)
    vb, sb = random_state((3, 2, 8), torch.float32, device, rng)
    for needs_grad in ("v", "s", "v_other", "s_other"):
        args = {"v": va.clone(), "s": sa.clone(), "v_other": vb, "s_other": sb}
        args[needs_grad] = args[needs_grad].clone().requires_grad_() * 1
        v, s = args["v"].detach().clone(), args["s"].detach().clone()
        with pytest.raises(RuntimeError, match=rf"baracuda::merge_state_: the in-place merge is not "
                                               rf"differentiable, but {needs_grad} requires grad"):
            bt.merge_state_(args["v"], args["s"], args["v_other"], args["s_other"])
        assert torch.equal(args["v"].detach(), v) and torch.equal(args["s"].detach(), s)
    v, s = va.clone(), sa.clone()
    versions = v._version, s._version
    with torch.no_grad():
        bt.merge_state_(v, s, vb.requires_grad_(), sb)
    assert v._version > versions[0] and s._version > versions[1]
    assert torch.equal(v, bt.merge_state(va, sa, vb.detach(), sb)[0])


def test_states_on_another_device_raise(device, rng):
    # A meta tensor among them sends the call to the ops' Meta kernels, which
    # must refuse as the real kernels do.
    va, sa = random_state((3, 2, 8), torch.float32, device, rng)
    device = va.device  # with its index, as the messages name it: cuda:0
    meta = torch.device("meta")
    v, s = va.clone(), sa.clone()
    with pytest.raises(RuntimeError, match=rf"baracuda::merge_state_: v_other and s_other must be "
                                           rf"on {device}, got meta and meta"):
        bt.merge_state_(v, s, va.to(meta), sa.to(meta))
    assert torch.equal(v, va) and torch.equal(s, sa)
    with pytest.raises(RuntimeError, match=rf"baracuda::merge_state: v_b and s_b must be on "
                                           rf"{device}, got {device} and meta"):
        bt.merge_state(va, sa, va, sa.to(meta))
    with pytest.raises(RuntimeError, match=rf"baracuda::merge_states: v and s must be on "
                                           rf"{device}, got {device} and meta"):
        bt.merge_states(va.unsqueeze(0), sa.unsqueeze(0).to(meta))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device type")
def test_device_mismatch():
    va = torch.randn(3, 2, 8, device="cuda")
    sa = torch.randn(3, 2, device="cuda")
    with pytest.raises(RuntimeError, match=r"v_b and s_b must be on cuda:0, got cpu and cpu"):
        bt.merge_state(va, sa, va.cpu(), sa.cpu())
