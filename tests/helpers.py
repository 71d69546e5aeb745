"""Test helpers shared by several test files."""

import torch

# Same-size integer dtypes used to compare raw bits.
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of `t` as integers (NaN payloads compare exactly)."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.element_size() == 16:
        return torch.view_as_real(t).view(torch.int64)
    return t.view(_INT_OF_SIZE[t.element_size()])


def random_bits(shape, dtype, generator, device="cpu") -> torch.Tensor:
    """A tensor of `shape` filled with random bit patterns of `dtype`
    (bool gets 0/1; floats get any pattern, NaNs and infs included)."""
    numel = 1
    for s in shape:
        numel *= s
    if dtype == torch.bool:
        flat = torch.randint(0, 2, (numel,), generator=generator).bool()
    else:
        esize = torch.empty((), dtype=dtype).element_size()
        raw = torch.randint(0, 256, (numel * esize,), dtype=torch.uint8, generator=generator)
        flat = raw.view(dtype)
    return flat.reshape(shape).to(device)


def poisoned_like(t: torch.Tensor, generator) -> torch.Tensor:
    """A copy of `t`'s layout (same strides) filled with random bits, so any
    element a kernel forgets to write (or writes by mistake) shows up."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(random_bits(t.shape, t.dtype, generator, t.device))
    return out


def poison_allocator(device, numel):
    """On CUDA the caching allocator hands the next allocation the block just
    freed: fill one with NaN first so an unwritten output element shows."""
    if device.type == "cuda":
        junk = torch.full((numel * 2,), float("nan"), dtype=torch.float64, device=device)
        del junk
