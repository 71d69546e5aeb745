"""write_slice family: write_slice_, write_slice, write_slice_at_, write_slice_path.

References are torch slice assignments done on the raw bits (so every dtype,
NaN payloads included, is compared exactly); outputs are poisoned with random
bits first so an unwritten or stray element cannot go unnoticed.
"""

import random

import pytest
import torch
from torch.testing._internal.optests import opcheck

import baracuda_torch as bt
from helpers import bits, poisoned_like, random_bits

ALL_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex32, torch.complex64, torch.complex128,
] + [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                 "float8_e5m2fnuz") if hasattr(torch, n)]


def reference(dest, source, ranges):
    """Expected bits of dest after dest[ranges] = source."""
    out = bits(dest).clone()
    out[tuple(slice(s, e) for s, e in ranges)] = bits(source)
    return out


def random_window(shape, pyrng, allow_empty=True):
    ranges = []
    for n in shape:
        a, b = pyrng.randint(0, n), pyrng.randint(0, n)
        s, e = min(a, b), max(a, b)
        if e == s and not allow_empty:
            e = min(n, s + 1)
            s = e - 1
        ranges.append((s, e))
    return ranges


def check_write(dest, source, ranges, generator):
    dest = poisoned_like(dest, generator) if dest.numel() else dest
    expected = reference(dest, source, ranges)
    returned = bt.write_slice_(dest, source, ranges)
    assert returned is dest
    assert torch.equal(bits(dest).cpu(), expected.cpu())


# ---------------------------------------------------------------- correctness


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_random_windows(device, dtype, rng):
    pyrng = random.Random(7)
    for rank in range(1, 9):
        shape = [pyrng.randint(1, 5 if rank > 4 else 9) for _ in range(rank)]
        dest = random_bits(shape, dtype, rng, device)
        ranges = random_window(shape, pyrng)
        source = random_bits([e - s for s, e in ranges], dtype, rng, device)
        check_write(dest, source, ranges, rng)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8,
                                   torch.complex128], ids=str)
def test_strided_and_transposed(device, dtype, rng):
    pyrng = random.Random(11)
    for trial in range(12):
        base = random_bits([13, 10, 18], dtype, rng, device)
        views = [
            base,
            base.transpose(0, 2),
            base[1:12:2, :, 3:17],
            base.permute(1, 2, 0)[:, ::3],
        ]
        dest = views[trial % len(views)]
        ranges = random_window(dest.shape, pyrng)
        shape = [e - s for s, e in ranges]
        sources = [
            random_bits(shape, dtype, rng, device),
            random_bits(shape[::-1], dtype, rng, device).permute(*reversed(range(3))),
            random_bits([s * 2 for s in shape], dtype, rng, device)[::2, ::2, ::2],
            random_bits([1] + shape[1:], dtype, rng, device).expand(shape),
        ]
        check_write(dest, sources[trial % len(sources)], ranges, rng)


def test_empty_windows_write_nothing(device, rng):
    dest = random_bits([4, 5, 6], torch.float32, rng, device)
    before = dest.clone()
    for ranges in ([(2, 2), (0, 5), (0, 6)], [(0, 4), (5, 5), (1, 3)], [(4, 4), (5, 5), (6, 6)]):
        source = torch.empty([e - s for s, e in ranges], device=device)
        assert bt.write_slice_path(dest, source, ranges) == "empty"
        bt.write_slice_(dest, source, ranges)
    assert torch.equal(bits(dest), bits(before))
    empty = torch.empty(0, 3, device=device)
    bt.write_slice_(empty, torch.empty(0, 2, device=device), [(0, 0), (1, 3)])


def test_rank0_is_a_plain_copy(device, rng):
    dest = torch.tensor(1.5, device=device)
    bt.write_slice_(dest, torch.tensor(-2.25, device=device), [])
    assert dest.item() == -2.25
    with pytest.raises(RuntimeError, match=r"expected one \(start, end\) pair per axis"):
        bt.write_slice_(dest, torch.tensor(0.0, device=device), [(0, 1)])


def test_conjugate_and_negative_views_are_resolved(device, rng):
    z = torch.randn(3, 4, dtype=torch.complex64, generator=rng).to(device)
    dest = torch.zeros(5, 4, dtype=torch.complex64, device=device)
    bt.write_slice_(dest, z.conj(), [(1, 4), (0, 4)])
    assert torch.equal(dest[1:4], z.conj().resolve_conj())
    neg = torch._neg_view(z)
    bt.write_slice_(dest, neg, [(2, 5), (0, 4)])
    assert torch.equal(dest[2:5], -z)
    # Writing into a conjugate view stores the conjugate underneath.
    base = torch.zeros(5, 4, dtype=torch.complex64, device=device)
    bt.write_slice_(base.conj(), z, [(0, 3), (0, 4)])
    assert torch.equal(base[0:3], z.conj().resolve_conj())


def test_large_row_major_cache_append(device, rng):
    cache = random_bits([3, 4, 64, 16], torch.bfloat16, rng, device)
    for pos in (0, 17, 63):
        kv = random_bits([3, 4, 1, 16], torch.bfloat16, rng, device)
        check_write(cache, kv, [(0, 3), (0, 4), (pos, pos + 1), (0, 16)], rng)


# ---------------------------------------------------------------- path selection


def test_path_selection(device):
    f32 = dict(dtype=torch.float32, device=device)
    dest = torch.empty(64, 32, **f32)
    assert bt.write_slice_path(dest, torch.empty(64, 32, **f32), [(0, 64), (0, 32)]) == "whole_dest"
    assert bt.write_slice_path(dest, torch.empty(10, 32, **f32), [(5, 15), (0, 32)]) == "contiguous_chunk"
    # A window of whole rows inside a row of a 3-d tensor is still one run.
    d3 = torch.empty(4, 8, 32, **f32)
    assert bt.write_slice_path(d3, torch.empty(1, 3, 32, **f32), [(2, 3), (1, 4), (0, 32)]) == "contiguous_chunk"
    # Aligned column window: 16-byte units.
    assert bt.write_slice_path(dest, torch.empty(64, 16, **f32), [(0, 64), (8, 24)]) == "strided:16"
    # Misaligned start: falls back to 4-byte (float) units.
    assert bt.write_slice_path(dest, torch.empty(64, 5, **f32), [(0, 64), (3, 8)]) == "strided:4"
    # Whole dest but a transposed source: a kernel, not a copy.
    assert bt.write_slice_path(dest, torch.empty(32, 64, **f32).t(), [(0, 64), (0, 32)]).startswith("strided")
    u8 = torch.empty(4, 8, dtype=torch.uint8, device=device)
    assert bt.write_slice_path(u8, torch.empty(4, 2, dtype=torch.uint8, device=device),
                               [(0, 4), (3, 7)], packed_int4=True) == "nibble"
    assert bt.write_slice_path(u8, torch.empty(4, 2, dtype=torch.uint8, device=device),
                               [(0, 4), (4, 8)], packed_int4=True) == "strided:2"
    assert bt.write_slice_path(u8, torch.empty(4, 8, dtype=torch.uint8, device=device),
                               [(0, 4), (0, 16)], packed_int4=True) == "whole_dest"


# ---------------------------------------------------------------- packed int4


def unpack(t):
    lo, hi = t & 0xF, t >> 4
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def pack(n):
    return (n[..., 0::2] | (n[..., 1::2] << 4)).to(torch.uint8)


@pytest.mark.parametrize("parity", ["even", "odd"])
def test_packed_int4_matches_unpacked_reference(device, rng, parity):
    pyrng = random.Random(3 if parity == "even" else 4)
    for trial in range(20):
        rank = pyrng.randint(1, 4)
        shape = [pyrng.randint(1, 5) for _ in range(rank - 1)] + [pyrng.randint(1, 9)]
        dest = random_bits(shape, torch.uint8, rng, device)
        if trial % 3 == 1:  # strided packed tensors
            dest = random_bits(shape[:-1] + [shape[-1] * 2], torch.uint8, rng, device)[..., ::2]
        nibbles = 2 * shape[-1]
        ranges = random_window(shape[:-1], pyrng)
        length = 2 * pyrng.randint(0, shape[-1] if parity == "even" else shape[-1] - 1)
        if parity == "even":
            start = 2 * pyrng.randint(0, (nibbles - length) // 2)
        else:  # odd start, so both window edges fall inside bytes
            start = 1 + 2 * pyrng.randint(0, (nibbles - length - 1) // 2)
        ranges.append((start, start + length))
        source = random_bits([e - s for s, e in ranges[:-1]] + [length // 2], torch.uint8, rng,
                             device)
        expected_nibbles = unpack(dest.cpu())
        expected_nibbles[tuple(slice(s, e) for s, e in ranges)] = unpack(source.cpu())
        bt.write_slice_(dest, source, ranges, packed_int4=True)
        assert torch.equal(dest.cpu(), pack(expected_nibbles)), (shape, ranges)


def test_packed_int4_errors(device):
    u8 = torch.zeros(2, 4, dtype=torch.uint8, device=device)
    with pytest.raises(RuntimeError, match=r"spans 3 packed int4 values; an odd count"):
        bt.write_slice_(u8, torch.zeros(2, 2, dtype=torch.uint8, device=device),
                        [(0, 2), (1, 4)], packed_int4=True)
    with pytest.raises(RuntimeError, match=r"source.shape\[1\]=1 bytes holds 2 packed int4"):
        bt.write_slice_(u8, torch.zeros(2, 1, dtype=torch.uint8, device=device),
                        [(0, 2), (1, 5)], packed_int4=True)
    with pytest.raises(RuntimeError, match=r"needs uint8 tensors.*got dtype Short"):
        bt.write_slice_(u8.short(), torch.zeros(2, 1, dtype=torch.int16, device=device),
                        [(0, 2), (0, 2)], packed_int4=True)
    with pytest.raises(RuntimeError, match=r"ranges\[1\]=\(4, 10\) must satisfy 0 <= start <= end <= 8"):
        bt.write_slice_(u8, torch.zeros(2, 3, dtype=torch.uint8, device=device),
                        [(0, 2), (4, 10)], packed_int4=True)
    assert not u8.any()


# ---------------------------------------------------------------- errors


def assert_raises_untouched(dest, fn, pattern):
    before = bits(dest).clone()
    with pytest.raises((RuntimeError, ValueError), match=pattern):
        fn()
    assert torch.equal(bits(dest), before)


def test_errors_name_op_and_value(device, rng):
    dest = random_bits([4, 8], torch.float32, rng, device)
    src = random_bits([2, 3], torch.float32, rng, device)
    ws = bt.write_slice_
    assert_raises_untouched(dest, lambda: ws(dest, src, [(0, 2)]),
                            r"baracuda::write_slice_: got 1 ranges for a 2-d dest; expected one \(start, end\) pair per axis")
    three = random_bits([2, 3, 4, 5], torch.float32, rng, device)
    assert_raises_untouched(three, lambda: ws(three, three[:, :, :, :0], [(0, 2), (0, 3), (0, 4)]),
                            r"baracuda::write_slice_: got 3 ranges for a 4-d dest")
    for op in (torch.ops.baracuda.write_slice_, torch.ops.baracuda.write_slice,
               torch.ops.baracuda.write_slice_path):
        name = op._qualified_op_name.split("::")[1]
        assert_raises_untouched(dest, lambda: op(dest, src, [0, 2, 0], False),
                                rf"baracuda::{name}: ranges=\[0, 2, 0\] has an odd length")
        assert_raises_untouched(dest, lambda: op(dest, src, [0, 2, 0, 3, 0, 1], False),
                                rf"baracuda::{name}: got 3 ranges for a 2-d dest")
    assert_raises_untouched(dest, lambda: ws(dest, src[0], [(0, 2), (0, 3)]),
                            r"baracuda::write_slice_: source.dim\(\)=1 must equal dest.dim\(\)=2")
    assert_raises_untouched(dest, lambda: ws(dest, src, [(3, 5), (0, 3)]),
                            r"baracuda::write_slice_: ranges\[0\]=\(3, 5\) must satisfy 0 <= start <= end <= 4")
    assert_raises_untouched(dest, lambda: ws(dest, src, [(0, 2), (5, 3)]),
                            r"ranges\[1\]=\(5, 3\) must satisfy 0 <= start <= end <= 8")
    assert_raises_untouched(dest, lambda: ws(dest, src, [(-1, 1), (0, 3)]),
                            r"ranges\[0\]=\(-1, 1\)")
    assert_raises_untouched(dest, lambda: ws(dest, src, [(0, 2), (0, 4)]),
                            r"source.shape\[1\]=3 must equal end - start = 4 for ranges\[1\]=\(0, 4\)")
    assert_raises_untouched(dest, lambda: ws(dest, src.double(), [(0, 2), (0, 3)]),
                            r"source.dtype=Double must equal dest.dtype=Float")
    assert_raises_untouched(dest, lambda: ws(dest, src, [(0, 2), 3]),
                            r"ranges\[1\]=3 must be a \(start, end\) pair")
    # Source memory inside the window being written.
    assert_raises_untouched(dest, lambda: ws(dest, dest[1:3, 0:3], [(0, 2), (1, 4)]),
                            r"source memory overlaps the written part of dest")
    # Expanded (self-overlapping) dest.
    expanded = torch.zeros(1, 8, device=device).expand(4, 8)
    with pytest.raises(RuntimeError, match=r"dest has internal overlap"):
        ws(expanded, src, [(0, 2), (0, 3)])
    nine = torch.zeros([1] * 9, device=device)
    with pytest.raises(RuntimeError, match=r"dest.dim\(\)=9 exceeds the supported maximum of 8"):
        ws(nine, nine, [(0, 1)] * 9)


def test_disjoint_parts_of_one_tensor_may_be_copied(device, rng):
    buf = random_bits([6, 8], torch.float32, rng, device)
    expected = bits(buf).clone()
    expected[4:6, 0:3] = expected[0:2, 0:3].clone()
    bt.write_slice_(buf, buf[0:2, 0:3], [(4, 6), (0, 3)])
    assert torch.equal(bits(buf), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device type")
def test_device_mismatch_errors():
    dest = torch.zeros(4, 4, device="cuda")
    with pytest.raises(RuntimeError, match=r"source.device=cpu must equal dest.device=cuda:0"):
        bt.write_slice_(dest, torch.ones(2, 2), [(0, 2), (0, 2)])
    with pytest.raises(RuntimeError, match=r"offsets.device=cpu must equal dest.device=cuda:0"):
        bt.write_slice_at_(dest, torch.ones(1, 4, device="cuda"), 0, torch.tensor(0))
    assert not dest.any()


# ---------------------------------------------------------------- out of place + autograd


def test_write_slice_out_of_place(device, rng):
    dest = random_bits([5, 7], torch.float32, rng, device)
    before = bits(dest).clone()
    src = random_bits([2, 4], torch.float32, rng, device)
    out = bt.write_slice(dest, src, [(1, 3), (2, 6)])
    assert torch.equal(bits(dest), before)  # dest untouched
    assert torch.equal(bits(out), reference(dest, src, [(1, 3), (2, 6)]))
    # Dense layouts are kept (as clone keeps them), others become contiguous.
    t = random_bits([7, 5], torch.float32, rng, device).t()
    assert bt.write_slice(t, src, [(1, 3), (2, 6)]).stride() == t.stride()
    # An expanded dest is only read, so it is allowed.
    ex = torch.ones(1, 7, device=device).expand(5, 7)
    assert bt.write_slice(ex, src, [(1, 3), (2, 6)]).sum().item() == 35 - 8 + src.sum().item()


def test_gradcheck_and_gradgradcheck(device, rng):
    dest = torch.randn(5, 6, 3, dtype=torch.float64, device=device, requires_grad=True)
    src = torch.randn(2, 4, 3, dtype=torch.float64, device=device, requires_grad=True)
    fn = lambda d, s: bt.write_slice(d, s, [(1, 3), (1, 5), (0, 3)])  # noqa: E731
    assert torch.autograd.gradcheck(fn, (dest, src))
    assert torch.autograd.gradgradcheck(fn, (dest, src))


# ---------------------------------------------------------------- in-place autograd
# write_slice_ and write_slice_at_ differentiate as dest[window].copy_(source):
# compared with torch on the same graph, dest's earlier history and source's.


def in_place_cases(device):
    """(name, dest shape, source shape, write(dest, source), torch_write(dest, source))."""
    dev = dict(device=device)
    per_row = torch.tensor([3, 0, 5], **dev)

    def at_per_row_ref(d, s):
        for b, o in enumerate(per_row.tolist()):
            d[b, :, o:o + 2].copy_(s[b])

    return [
        ("write_slice_", [5, 6, 4], [2, 3, 4],
         lambda d, s: bt.write_slice_(d, s, [(1, 3), (2, 5), (0, 4)]),
         lambda d, s: d[1:3, 2:5, 0:4].copy_(s)),
        ("write_slice_at_ scalar", [5, 6, 4], [5, 2, 4],
         lambda d, s: bt.write_slice_at_(d, s, 1, torch.tensor(3, **dev)),
         lambda d, s: d[:, 3:5].copy_(s)),
        ("write_slice_at_ per row", [3, 4, 7], [3, 4, 2],
         lambda d, s: bt.write_slice_at_(d, s, 2, per_row), at_per_row_ref),
    ]


def grads_through_write(write, dest_shape, source_shape, device, seed, view):
    """Gradients of x and w for dest = (x * 3)[view], source = w * 2, after
    write(dest, source) and a random weighting of the whole base."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(device)  # noqa: E731
    base_shape = [dest_shape[0] + 1] + dest_shape[1:] if view else dest_shape
    x = rand(*base_shape).requires_grad_()
    w = rand(*source_shape).requires_grad_()
    weights = rand(*base_shape)
    base = x * 3
    dest = base[1:] if view else base
    write(dest, w * 2)
    (base * weights).sum().backward()
    return base.detach(), x.grad, w.grad


@pytest.mark.parametrize("view", [False, True], ids=["whole", "view"])
def test_in_place_writes_differentiate_like_copy_(device, view):
    for seed, (name, dest_shape, source_shape, write, torch_write) in enumerate(in_place_cases(device)):
        out, gx, gw = grads_through_write(write, dest_shape, source_shape, device, seed, view)
        ref, rx, rw = grads_through_write(torch_write, dest_shape, source_shape, device, seed, view)
        assert torch.equal(out, ref), name
        assert gw is not None, name
        assert torch.equal(gx, rx), name
        assert torch.equal(gw, rw), name


def test_in_place_writes_gradcheck_and_gradgradcheck(device):
    for name, dest_shape, source_shape, write, _ in in_place_cases(device):
        def f(x, w):
            y = x * x  # a history for dest, and a second derivative to check
            write(y, w * w)
            return y
        x = torch.randn(dest_shape, dtype=torch.float64, device=device, requires_grad=True)
        w = torch.randn(source_shape, dtype=torch.float64, device=device, requires_grad=True)
        assert torch.autograd.gradcheck(f, (x, w)), name
        assert torch.autograd.gradgradcheck(f, (x, w)), name


def test_in_place_write_into_a_plain_tensor_gives_it_history(device):
    for name, dest_shape, source_shape, write, torch_write in in_place_cases(device):
        w = torch.randn(source_shape, device=device, requires_grad=True)
        dest = torch.zeros(dest_shape, device=device)
        write(dest, w)
        assert dest.requires_grad and dest.grad_fn is not None, name
        weights = torch.randn(dest_shape, device=device)
        (dest * weights).sum().backward()
        w_ref = w.detach().clone().requires_grad_()
        ref = torch.zeros(dest_shape, device=device)
        torch_write(ref, w_ref)
        (ref * weights).sum().backward()
        assert torch.equal(w.grad, w_ref.grad), name


def test_in_place_write_on_a_leaf_that_requires_grad_raises_untouched(device):
    for name, dest_shape, source_shape, write, _ in in_place_cases(device):
        leaf = torch.randn(dest_shape, device=device, requires_grad=True)
        src = torch.randn(source_shape, device=device)
        before = leaf.detach().clone()
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used "
                                               "in an in-place operation"):
            write(leaf, src)
        with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
            write(leaf[:], src)
        assert torch.equal(leaf.detach(), before) and leaf.grad_fn is None, name
        with torch.no_grad():  # as torch allows under no_grad
            write(leaf, src)
        assert not torch.equal(leaf.detach(), before), name


def test_in_place_write_bumps_version_so_saved_tensors_are_checked(device):
    for name, dest_shape, source_shape, write, _ in in_place_cases(device):
        dest = torch.zeros(dest_shape, device=device)
        version = dest._version
        write(dest, torch.ones(source_shape, device=device))
        assert dest._version > version, name
        x = torch.randn(dest_shape, device=device, requires_grad=True)
        y = x * 1
        z = y * y  # saves y
        write(y, torch.ones(source_shape, device=device))
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()


def test_in_place_packed_int4_under_autograd_writes_or_refuses(device, rng):
    # uint8 cannot require grad, so a packed write never joins a graph: it
    # writes as without autograd, and a float dest is refused untouched.
    dest = random_bits([3, 6], torch.uint8, rng, device)
    src = random_bits([3, 2], torch.uint8, rng, device)
    expected = unpack(dest.cpu())
    expected[:, 3:7] = unpack(src.cpu())
    bt.write_slice_(dest, src, [(0, 3), (3, 7)], packed_int4=True)
    assert torch.equal(dest.cpu(), pack(expected)) and not dest.requires_grad
    y = torch.randn(3, 6, device=device, requires_grad=True) * 1
    before, grad_fn = y.detach().clone(), y.grad_fn
    with pytest.raises(RuntimeError, match="packed_int4=True needs uint8 tensors"):
        bt.write_slice_(y, torch.ones(3, 1, device=device), [(0, 3), (4, 6)], packed_int4=True)
    assert torch.equal(y.detach(), before) and y.grad_fn is grad_fn


def test_compiled_in_place_writes_differentiate(device):
    torch._dynamo.reset()

    def f(x, w, offsets, pos):
        y = x * 2
        bt.write_slice_(y, w, [(pos, pos + 2), (0, y.shape[1])])
        bt.write_slice_at_(y, w * 3, 0, offsets)
        return (y * y).sum()

    def torch_f(x, w, offset, pos):
        y = x * 2
        y[pos:pos + 2].copy_(w)
        y[offset:offset + 2].copy_(w * 3)
        return (y * y).sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=True)
    for n in (6, 8):
        x = torch.randn(n, 5, device=device, requires_grad=True)
        w = torch.randn(2, 5, device=device, requires_grad=True)
        compiled(x, w, torch.tensor(n - 2, device=device), 1).backward()
        gx, gw = x.grad, w.grad
        x.grad = w.grad = None
        torch_f(x, w, n - 2, 1).backward()
        torch.testing.assert_close(gx, x.grad)
        torch.testing.assert_close(gw, w.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA behaviour")
def test_write_slice_at_skipped_row_keeps_its_gradient_cuda():
    x = torch.randn(3, 2, 8, device="cuda", dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 2, device="cuda", dtype=torch.float64, requires_grad=True)
    y = x * 1
    bt.write_slice_at_(y, w, 2, torch.tensor([1, 7, -1], device="cuda"))  # rows 1, 2 skipped
    weights = torch.randn(3, 2, 8, device="cuda", dtype=torch.float64)
    (y * weights).sum().backward()
    expected_x = weights.clone()
    expected_x[0, :, 1:3] = 0
    expected_w = torch.zeros_like(w)
    expected_w[0] = weights[0, :, 1:3]
    assert torch.equal(x.grad, expected_x)
    assert torch.equal(w.grad, expected_w)


# ---------------------------------------------------------------- opcheck


def test_opcheck_all_ops(device, rng):
    dest = torch.randn(6, 5, 4, device=device)
    src = torch.randn(2, 5, 3, device=device)
    ranges = [1, 3, 0, 5, 1, 4]
    opcheck(torch.ops.baracuda.write_slice_.default, (dest.clone(), src, ranges, False))
    opcheck(torch.ops.baracuda.write_slice.default,
            (dest.requires_grad_(), src.requires_grad_(), ranges, False))
    cache = torch.randn(3, 4, 10, 8, device=device)
    kv = torch.randn(3, 4, 2, 8, device=device)
    opcheck(torch.ops.baracuda.write_slice_at_.default,
            (cache, kv, 2, torch.tensor([0, 5, 8], device=device), False))
    opcheck(torch.ops.baracuda.write_slice_at_.default,
            (cache, kv, 2, torch.tensor(3, device=device), False))
    packed = torch.randint(0, 256, (3, 6), dtype=torch.uint8, device=device)
    opcheck(torch.ops.baracuda.write_slice_.default,
            (packed, torch.randint(0, 256, (3, 2), dtype=torch.uint8, device=device),
             [0, 3, 3, 7], True))


# ---------------------------------------------------------------- write_slice_at_


def test_write_slice_at_scalar_and_per_row(device, rng):
    cache = random_bits([3, 4, 16, 8], torch.bfloat16, rng, device)
    kv = random_bits([3, 4, 2, 8], torch.bfloat16, rng, device)
    expected = bits(cache).clone()
    expected[:, :, 5:7] = bits(kv)
    bt.write_slice_at_(cache, kv, 2, torch.tensor(5, device=device))
    assert torch.equal(bits(cache), expected)
    offsets = torch.tensor([0, 9, 14], device=device)
    for b, o in enumerate(offsets.tolist()):
        expected[b, :, o:o + 2] = bits(kv[b])
    bt.write_slice_at_(cache, kv, -2, offsets)
    assert torch.equal(bits(cache), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.complex128], ids=str)
def test_write_slice_at_strided_any_dim(device, rng, dtype):
    base = random_bits([5, 9, 12], dtype, rng, device)
    dest = base.transpose(1, 2)[:, :, 1:8]  # [5, 12, 7], strided
    for dim in range(3):
        shape = list(dest.shape)
        shape[dim] = 2
        src = random_bits(shape, dtype, rng, device)
        off = dest.shape[dim] - 2
        expected = bits(dest).clone()
        expected.narrow(dim, off, 2).copy_(bits(src))
        bt.write_slice_at_(dest, src, dim, torch.tensor(off, device=device))
        assert torch.equal(bits(dest), expected)


def test_write_slice_at_packed_int4_odd_offsets(device, rng):
    dest = random_bits([2, 3, 5], torch.uint8, rng, device)
    src = random_bits([2, 3, 2], torch.uint8, rng, device)
    offsets = torch.tensor([1, 6], device=device)  # nibble offsets, one odd
    expected = unpack(dest.cpu())
    for b, o in enumerate(offsets.tolist()):
        expected[b, :, o:o + 4] = unpack(src[b].cpu())
    bt.write_slice_at_(dest, src, 2, offsets, packed_int4=True)
    assert torch.equal(dest.cpu(), pack(expected))
    # Along an outer axis packed tensors are plain bytes.
    d2 = random_bits([6, 4], torch.uint8, rng, device)
    s2 = random_bits([2, 4], torch.uint8, rng, device)
    exp2 = d2.clone()
    exp2[3:5] = s2
    bt.write_slice_at_(d2, s2, 0, torch.tensor(3, device=device), packed_int4=True)
    assert torch.equal(d2, exp2)


def test_write_slice_at_errors(device):
    cache = torch.zeros(2, 3, 8, 4, device=device)
    kv = torch.ones(2, 3, 1, 4, device=device)
    at = bt.write_slice_at_
    dev = dict(device=device)
    assert_raises_untouched(cache, lambda: at(cache, kv, 2, torch.tensor(1, dtype=torch.int32, **dev)),
                            r"baracuda::write_slice_at_: offsets must be int64, got Int")
    assert_raises_untouched(cache, lambda: at(cache, kv, 2, torch.tensor([1, 2, 3], **dev)),
                            r"offsets.shape=\[3\] must be \[dest.shape\[0\]\] = \[2\]")
    assert_raises_untouched(cache, lambda: at(cache, kv, 2, torch.zeros(2, 1, dtype=torch.long, **dev)),
                            r"offsets must have shape \[\] or \[dest.shape\[0\]\]")
    assert_raises_untouched(cache, lambda: at(cache, torch.ones(2, 3, 1, 4, **dev), 0,
                                              torch.tensor([0, 1], **dev)),
                            r"per-row offsets .* need dim > 0")
    assert_raises_untouched(cache, lambda: at(cache, kv, 4, torch.tensor(0, **dev)),
                            r"dim=4 is out of range for a 4-d dest")
    assert_raises_untouched(cache, lambda: at(cache, torch.ones(2, 3, 1, 5, **dev), 2,
                                              torch.tensor(0, **dev)),
                            r"source.shape\[3\]=5 must equal dest.shape\[3\]=4")
    assert_raises_untouched(cache, lambda: at(cache, torch.ones(2, 3, 9, 4, **dev), 2,
                                              torch.tensor(0, **dev)),
                            r"source length 9 along dim=2 exceeds dest's 8")


def test_tensors_on_another_device_than_dest_raise(device, rng):
    # A meta tensor among them sends the call to the ops' Meta kernels, which
    # must refuse as the real kernels do rather than write nothing.
    cache = random_bits([2, 3, 8, 4], torch.float32, rng, device)
    kv = torch.ones(2, 3, 1, 4, device=device)
    meta = torch.device("meta")
    assert_raises_untouched(cache, lambda: bt.write_slice_at_(cache, kv, 2, torch.tensor(1, device=meta)),
                            rf"baracuda::write_slice_at_: offsets.device=meta must equal dest.device={device}")
    assert_raises_untouched(cache, lambda: bt.write_slice_at_(cache, kv.to(meta), 2,
                                                              torch.tensor(1, device=device)),
                            rf"baracuda::write_slice_at_: source.device=meta must equal dest.device={device}")
    window = [(0, 2), (0, 3), (0, 1), (0, 4)]
    assert_raises_untouched(cache, lambda: bt.write_slice_(cache, kv.to(meta), window),
                            rf"baracuda::write_slice_: source.device=meta must equal dest.device={device}")
    with pytest.raises(RuntimeError, match=rf"baracuda::write_slice: source.device=meta must equal "
                                           rf"dest.device={device}"):
        bt.write_slice(cache, kv.to(meta), window)
    # On the meta device itself the ops check shapes and write nothing, as before.
    bt.write_slice_at_(cache.to(meta), kv.to(meta), 2, torch.tensor(1, device=meta))


def test_write_slice_at_out_of_range_cpu_raises_and_writes_nothing():
    cache = torch.zeros(2, 3, 8, 4)
    kv = torch.ones(2, 3, 2, 4)
    for offsets, bad in ((torch.tensor([0, 7]), r"offsets\[1\]=7 puts the source \(length 2 along dim=2\) outside dest.shape\[2\]=8; valid offsets are 0..6"),
                         (torch.tensor(-1), r"offsets\[0\]=-1")):
        assert_raises_untouched(cache, lambda: bt.write_slice_at_(cache, kv, 2, offsets), bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA behaviour")
def test_write_slice_at_out_of_range_cuda_skips_that_row():
    cache = torch.zeros(3, 2, 8, 4, device="cuda")
    kv = torch.ones(3, 2, 2, 4, device="cuda")
    bt.write_slice_at_(cache, kv, 2, torch.tensor([0, 7, -1], device="cuda"))
    assert cache[0, :, 0:2].eq(1).all() and cache[0].sum() == 16
    assert not cache[1:].any()
    bt.write_slice_at_(cache, kv, 2, torch.tensor(9, device="cuda"))
    assert cache.sum() == 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_write_slice_at_in_cuda_graph_appends_at_new_offsets():
    g = torch.Generator().manual_seed(0)
    cache = torch.zeros(4, 2, 32, 16, dtype=torch.bfloat16, device="cuda")
    # Zeros until capture: the warm-up call before capture really writes.
    kv = torch.zeros(4, 2, 1, 16, dtype=torch.bfloat16, device="cuda")
    pos = torch.zeros(4, dtype=torch.long, device="cuda")
    step = lambda: bt.write_slice_at_(cache, kv, 2, pos)  # noqa: E731
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    expected = torch.zeros_like(cache)
    lengths = torch.tensor([0, 3, 7, 30])
    for t in range(2):
        kv.copy_(torch.randn(4, 2, 1, 16, generator=g).to(kv))
        pos.copy_(lengths + t)
        graph.replay()
        for b in range(4):
            expected[b, :, lengths[b] + t] = kv[b, :, 0]
    torch.cuda.synchronize()
    assert torch.equal(cache, expected)


@pytest.mark.skipif(not torch.cuda.is_available() or
                    torch.cuda.get_device_properties(0).total_memory < 16 * 2**30,
                    reason="needs a GPU with 16 GiB")
def test_more_than_2_31_units_uses_64_bit_indices():
    # A byte-unit strided window with 2^31 + some elements, so the kernel's
    # 64-bit index path runs (31-bit indices would wrap).
    rows, cols = 2**21 + 3, 1025
    dest = torch.zeros(rows, cols + 1, dtype=torch.uint8, device="cuda")
    src = torch.randint(0, 256, (rows, cols), dtype=torch.uint8, device="cuda")
    assert bt.write_slice_path(dest, src, [(0, rows), (1, cols + 1)]) == "strided:1"
    bt.write_slice_(dest, src, [(0, rows), (1, cols + 1)])
    assert torch.equal(dest[:, 1:], src) and not dest[:, 0].any()


# ---------------------------------------------------------------- torch.compile


def test_compiled_decode_loop_does_not_recompile(device):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")

    def step(cache, kv, pos):
        b, h, _, d = cache.shape
        bt.write_slice_(cache, kv, [(0, b), (0, h), (pos, pos + 1), (0, d)])
        return cache[:, :, : pos + 1].float().sum()

    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    cache = torch.zeros(2, 3, 16, 8, device=device)
    ref = torch.zeros_like(cache)
    for pos in (3, 4, 9):
        kv = torch.randn(2, 3, 1, 8, device=device)
        ref[:, :, pos:pos + 1] = kv
        total = compiled(cache, kv, pos)
        assert torch.equal(cache, ref)
        torch.testing.assert_close(total, ref[:, :, : pos + 1].sum())
    assert counter.frame_count == 1


def test_compiled_write_slice_at_and_autograd(device):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def f(cache, kv, offsets, x, y, lo):
        bt.write_slice_at_(cache, kv, 2, offsets)
        z = bt.write_slice(x, y * 2, [(lo, lo + y.shape[0]), (0, x.shape[1])])
        return z.sum()

    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    for n in (5, 7):
        cache = torch.zeros(2, 2, 12, 4, device=device)
        kv = torch.randn(2, 2, 1, 4, device=device)
        offsets = torch.tensor([1, n], device=device)
        x = torch.randn(n + 2, 3, device=device, requires_grad=True)
        y = torch.randn(2, 3, device=device, requires_grad=True)
        compiled(cache, kv, offsets, x, y, 1).backward()
        assert torch.equal(cache[1, :, n], kv[1, :, 0])
        expected_x_grad = torch.ones_like(x)
        expected_x_grad[1:3] = 0
        assert torch.equal(x.grad, expected_x_grad)
        assert torch.equal(y.grad, torch.full_like(y, 2.0))
    assert counter.frame_count == 1
