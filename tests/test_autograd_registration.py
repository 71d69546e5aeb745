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
                 "cumprod", "logcumsumexp", "cummax", "cummin", "scan_backward",
                 "block_sparse_attention", "block_sparse_attention_backward",
                 "fractional_max_pool", "fractional_max_pool_backward"):
        assert name in OPS


@pytest.mark.parametrize("name", OPS)
def test_autograd_kernel_is_cpp(name):
    dump = torch._C._dispatch_dump(f"baracuda::{name}")
    line = re.search(r"^Autograd\[alias\]: registered at (\S+)", dump, re.MULTILINE)
    assert line is not None, f"baracuda::{name} has no Autograd kernel:\n{dump}"
    assert line.group(1).split(":")[0].endswith(".cpp"), dump
