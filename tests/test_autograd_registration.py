"""Every differentiable op has its autograd in C++, at the Autograd key.

One mechanism for every family: a C++ kernel at the Autograd key is the only
one that carries the in-place ops, and it keeps Python off the path of a call
(grad or no grad). A Python formula (torch.library.register_autograd) would
show here as a registration from torch's library.py.
"""

import re

import pytest
import torch

import baracuda_torch  # noqa: F401  (registers torch.ops.baracuda)


def _tensor_ops():
    """The library's ops that return or write tensors (not the path probes)."""
    names = []
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("baracuda::"):
            continue
        name = full[len("baracuda::"):]
        schema = getattr(torch.ops.baracuda, name).default._schema
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        returns_tensors = any("Tensor" in str(r.type) for r in schema.returns)
        if writes or returns_tensors:
            names.append(name)
    return sorted(names)


OPS = _tensor_ops()


def test_every_family_is_listed():
    for name in ("write_slice_", "write_slice", "write_slice_at_", "merge_state", "merge_state_",
                 "merge_states", "merge_state_backward", "merge_states_backward", "cumsum",
                 "cumprod", "logcumsumexp", "cummax", "cummin", "scan_backward", "linear_scan", "linear_scan_backward",
                 "block_sparse_attention", "block_sparse_attention_backward",
                 "fractional_max_pool", "fractional_max_pool_backward"):
        assert name in OPS


@pytest.mark.parametrize("name", OPS)
def test_autograd_kernel_is_cpp(name):
    dump = torch._C._dispatch_dump(f"baracuda::{name}")
    line = re.search(r"^Autograd\[alias\]: registered at (\S+)", dump, re.MULTILINE)
    assert line is not None, f"baracuda::{name} has no Autograd kernel:\n{dump}"
    assert line.group(1).split(":")[0].endswith(".cpp"), dump


def _forward_ad_calls(device):
    """One call of each op family, fed a dual tensor by ``dual(t)``."""
    import baracuda_torch as bt

    f32 = dict(device=device, dtype=torch.float32)
    q, k, v = (torch.randn(1, 2, 64, 64, **f32) for _ in range(3))
    mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    va, vb = torch.randn(4, 2, 8, **f32), torch.randn(4, 2, 8, **f32)
    sa, sb = torch.randn(4, 2, **f32), torch.randn(4, 2, **f32)
    x = torch.randn(3, 9, **f32)
    pool = torch.randn(1, 2, 8, 8, **f32)
    dest, src = torch.zeros(4, 8, **f32), torch.randn(4, 2, **f32)
    offsets = torch.tensor(3, device=device)
    return {
        "block_sparse_attention": lambda dual: bt.block_sparse_attention(dual(q), k, v, mask),
        "merge_state": lambda dual: bt.merge_state(va, dual(sa), vb, sb),
        "merge_state_": lambda dual: bt.merge_state_(va.clone(), sa.clone(), dual(vb), sb),
        "merge_states": lambda dual: bt.merge_states(dual(va[None]), sa[None]),
        "cumsum": lambda dual: bt.cumsum(dual(x), 1),
        "cumprod": lambda dual: bt.cumprod(dual(x), 1, dtype=torch.float64),
        "logcumsumexp": lambda dual: bt.logcumsumexp(dual(x), 1),
        "cummax": lambda dual: bt.cummax(dual(x), 1),
        "linear_scan": lambda dual: bt.linear_scan(x, x, 1, h0=dual(x[:, 0])),
        "fractional_max_pool2d": lambda dual: bt.fractional_max_pool2d(dual(pool), 2, 4),
        "write_slice_": lambda dual: bt.write_slice_(dest.clone(), dual(src), [(0, 4), (1, 3)]),
        "write_slice": lambda dual: bt.write_slice(dual(dest), src, [(0, 4), (1, 3)]),
        "write_slice_at_": lambda dual: bt.write_slice_at_(dest.clone(), dual(src), 1, offsets),
    }


@pytest.mark.parametrize("call", sorted(_forward_ad_calls("cpu")))
def test_forward_mode_ad_is_refused(device, call):
    """No op has a forward-mode formula: a dual input is refused, naming the
    op, rather than its tangent dropped (an output that looks constant)."""
    import torch.autograd.forward_ad as fwAD

    fn = _forward_ad_calls(device)[call]
    fn(lambda t: t)  # the call itself is valid
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match=r"baracuda::\w+: forward-mode AD"):
            fn(lambda t: fwAD.make_dual(t, torch.randn_like(t)))
