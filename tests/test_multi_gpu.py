"""Every family on a second GPU (needs two CUDA devices; skipped otherwise).

A call on tensors of cuda:1, made while cuda:0 is the current device, must
run on cuda:1: its launches, workspaces, cached launch queries and a
stream's standing slots all belong to the tensors' device. Each case runs
once on cuda:0 and once on cuda:1 from the same inputs, forward and
backward; the kernels are deterministic, so the results must be
bit-identical, and the current device must still be cuda:0 after each call.
Calls that mix the two devices must fail with an error, not run.
"""

import pytest
import torch

import baracuda_torch as bt
from baracuda_torch import masks
from helpers import bits

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2,
                                reason="needs two CUDA devices")

SCAN_OPS = ["cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"]
# One shape per CUDA scan path (test_scan.py's PATH_CASES), and rows long
# enough for the staged long rows, whose bfloat16 logcumsumexp tiles come
# in through tensor maps.
SCAN_CASES = [((500, 9), -1, "row_groups"), ((3, 1700), -1, "rows"),
              ((2, 1 << 20), -1, "long_rows"), ((2, (1 << 20) + 1), -1, "long_rows"),
              ((300, 8200), 0, "column_strips"), ((1100, 1024), 0, "strip_tiles"),
              ((1100, 7), 0, "column_tiles"), ((3, 40), 0, "columns")]


def randn(shape, generator, dtype=torch.float32):
    return torch.randn(shape, generator=generator).to(dtype)


def on_device(case, device):
    """case(device, generator) -> tensors, with cuda:0 current throughout;
    the results on the host."""
    g = torch.Generator().manual_seed(7)
    with torch.cuda.device(0):
        out = case(device, g)
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(device)
    return [t.detach().cpu() for t in out]


def assert_same_on_both_devices(case):
    first = on_device(case, torch.device("cuda:0"))
    second = on_device(case, torch.device("cuda:1"))
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(bits(a), bits(b))


def forward_and_grads(fn, inputs, generator):
    """fn(*inputs)'s outputs and the gradients of inputs for a random
    output gradient drawn on the host."""
    out = fn(*inputs)
    outs = list(out) if isinstance(out, tuple) else [out]
    diff = [o for o in outs if o.is_floating_point() and o.requires_grad]
    dys = [randn(o.shape, generator, o.dtype).to(o.device) for o in diff]
    grads = torch.autograd.grad(diff, inputs, dys)
    return outs + list(grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,dim,path", SCAN_CASES, ids=str)
def test_scans_on_second_device(shape, dim, path, dtype):
    assert bt.scan_path(torch.empty(shape, device="meta"), dim) == path

    def case(device, g):
        x = randn(shape, g, dtype)
        out = []
        for name in SCAN_OPS:
            xi = (1 + x / 1024 if name == "cumprod" else x).to(device).requires_grad_()
            out += forward_and_grads(lambda t: getattr(bt, name)(t, dim, reverse=True), [xi], g)
        return out

    assert_same_on_both_devices(case)


def test_integer_scans_on_second_device():
    def case(device, g):
        x = torch.randint(-3, 4, (70, 300), generator=g).to(device)
        out = [bt.cumsum(x, -1), bt.cumprod(x, 0, dtype=torch.int8, reverse=True),
               bt.cumsum(x > 0, 1, dtype=torch.int32)]
        for name in ("cummax", "cummin"):
            out += list(getattr(bt, name)(x.to(torch.int16), 0))
        return out

    assert_same_on_both_devices(case)


def test_write_slice_on_second_device():
    def case(device, g):
        cache = randn((4, 8, 64, 128), g, torch.bfloat16).to(device)
        kv = randn((4, 8, 1, 128), g, torch.bfloat16).to(device)
        bt.write_slice_(cache, kv, [(0, 4), (0, 8), (17, 18), (0, 128)])
        lengths = torch.tensor([3, 0, 63, 20]).to(device)
        at = randn((4, 8, 64, 128), g, torch.bfloat16).to(device)
        bt.write_slice_at_(at, kv.transpose(0, 1).contiguous().transpose(0, 1), 2, lengths)
        x = randn((6, 40), g).to(device).requires_grad_()
        src = randn((2, 40), g).to(device).requires_grad_()
        grads = forward_and_grads(lambda a, b: bt.write_slice(a, b, [(1, 3), (0, 40)]), [x, src], g)
        return [cache, at] + grads

    assert_same_on_both_devices(case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_on_second_device(dtype):
    def case(device, g):
        def state(*lead):
            v = randn((*lead, 32, 128), g, dtype).to(device).requires_grad_()
            s = randn((*lead, 32), g).mul(4).to(device).requires_grad_()
            return v, s
        (v_a, s_a), (v_b, s_b) = state(77), state(77)
        out = forward_and_grads(lambda *t: bt.merge_state(*t, lse_base="e"), [v_a, s_a, v_b, s_b], g)
        v_stack, s_stack = state(5, 3)
        out += forward_and_grads(lambda v, s: bt.merge_states(v, s), [v_stack, s_stack], g)
        v, s = v_a.detach().clone(), s_a.detach().clone()
        bt.merge_state_(v, s, v_b.detach(), s_b.detach())
        return out + [v, s]

    assert_same_on_both_devices(case)


@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 128), (torch.float32, 72)])
def test_block_sparse_attention_on_second_device(dtype, head_dim):
    def case(device, g):
        q, k, v = (randn((2, 4, 300, head_dim), g, dtype).to(device) for _ in range(3))
        m = masks.sliding_window(300, 300, window=128, block_size=64, sink_blocks=1).to(device)
        out, lse = bt.block_sparse_attention(q, k, v, m, block_size=64, is_causal=True,
                                             return_lse=True)
        return [out, lse]

    assert_same_on_both_devices(case)


def test_fractional_max_pool_on_second_device():
    def case(device, g):
        x2 = randn((2, 3, 33, 40), g).to(device).requires_grad_()
        s2 = torch.rand((2, 3, 2), generator=g).to(device)
        out = forward_and_grads(
            lambda t: bt.fractional_max_pool2d(t, 3, (14, 17), return_indices=True,
                                               _random_samples=s2), [x2], g)
        x3 = randn((2, 3, 9, 10, 11), g, torch.bfloat16).to(device).requires_grad_()
        s3 = torch.rand((2, 3, 3), generator=g).to(device)
        out += forward_and_grads(
            lambda t: bt.fractional_max_pool3d(t, 2, (5, 6, 7), return_indices=True,
                                               _random_samples=s3, placement="even"), [x3], g)
        return out

    assert_same_on_both_devices(case)


def test_mixed_devices_rejected():
    """Arguments on two devices: an error naming the op, and nothing written."""
    zero, one = torch.device("cuda:0"), torch.device("cuda:1")
    cache = torch.zeros(2, 8, 16, device=zero)
    with pytest.raises(RuntimeError, match="write_slice"):
        bt.write_slice_(cache, torch.ones(2, 8, 1, device=one), [(0, 2), (0, 8), (3, 4)])
    assert not cache.any()
    v, s = torch.zeros(4, 2, 8, device=zero), torch.zeros(4, 2, device=zero)
    with pytest.raises(RuntimeError, match="merge_state"):
        bt.merge_state_(v, s, torch.ones(4, 2, 8, device=one), torch.ones(4, 2, device=one))
    assert not v.any() and not s.any()
    with pytest.raises(RuntimeError, match="merge_state"):
        bt.merge_state(v, s, torch.ones(4, 2, 8, device=one), torch.ones(4, 2, device=one))
    q = torch.randn(1, 2, 64, 64, device=zero)
    m = masks.causal(64, 64, block_size=64).to(zero)
    with pytest.raises(RuntimeError, match="block_sparse_attention"):
        bt.block_sparse_attention(q, q.to(one), q, m, block_size=64)
    g = torch.ones(3, 5, device=zero)
    with pytest.raises(RuntimeError, match="scan_backward"):
        torch.ops.baracuda.scan_backward(g, g.to(one), g, None, 1, "cumprod", False)
    x = torch.randn(1, 2, 9, 9, device=zero)
    with pytest.raises(RuntimeError, match="fractional_max_pool"):
        bt.fractional_max_pool2d(x, 2, (4, 4), _random_samples=torch.rand(1, 2, 2, device=one))
