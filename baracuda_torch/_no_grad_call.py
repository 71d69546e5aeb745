"""Calling an op below the autograd layer when no gradient can flow.

An op whose autograd formula is registered from Python pays for a trip
through that Python code on every call, even when nothing requires grad
(inference, decode loops): on a small input that trip costs more than the
kernel. When grad mode is off or no input requires grad, the call goes
straight to the backend kernel instead, which is exactly what the autograd
layer would end up doing. Under torch.compile the plain call is kept, so
tracing sees the op as usual.
"""

import torch


def call(op, differentiable, *args):
    """``op(*args)``, skipping the autograd layer when none of the tensors
    in ``differentiable`` can receive a gradient."""
    if torch.compiler.is_compiling():
        return op(*args)
    if torch.is_grad_enabled() and any(t.requires_grad for t in differentiable):
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)
