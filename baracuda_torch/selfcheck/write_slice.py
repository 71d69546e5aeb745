"""Main-job rows of the write_slice family: bit-exact against torch slice
assignment, timed against it."""

import torch

import baracuda_torch as bt

from . import Check


def _window_case(device, dtype, shape, ranges):
    g = torch.Generator(device=device).manual_seed(0)
    dest = torch.randn(shape, generator=g, device=device).to(dtype)
    source = torch.randn([e - s for s, e in ranges], generator=g, device=device).to(dtype)
    slices = tuple(slice(s, e) for s, e in ranges)

    def ours():
        return bt.write_slice_(dest, source, ranges)

    def reference():
        ref = dest.clone()
        ref[slices] = source
        return ref

    def peer():
        dest[slices].copy_(source)

    path = bt.write_slice_path(dest, source, ranges)
    return Check(f"write_slice_ ({path})", dtype, "x".join(map(str, shape)), ours, reference,
                 peer)


def _append_case(device, dtype, batch, heads, length, dim):
    g = torch.Generator(device=device).manual_seed(1)
    cache = torch.randn(batch, heads, length, dim, generator=g, device=device).to(dtype)
    kv = torch.randn(batch, heads, 1, dim, generator=g, device=device).to(dtype)
    offsets = torch.randint(0, length, (batch,), generator=g, device=device)

    def ours():
        return bt.write_slice_at_(cache, kv, 2, offsets)

    def reference():
        ref = cache.clone()
        for b, o in enumerate(offsets.tolist()):
            ref[b, :, o] = kv[b, :, 0]
        return ref

    def peer():
        cache[torch.arange(batch, device=device), :, offsets] = kv[:, :, 0]

    return Check("write_slice_at_ (per-row)", dtype, f"{batch}x{heads}x{length}x{dim}", ours,
                 reference, peer)


def checks(device):
    big = device.type == "cuda"
    rows = 8192 if big else 512
    cols = 8192 if big else 512
    return [
        _window_case(device, torch.bfloat16, (rows, 1024), [(rows // 8, rows // 2), (0, 1024)]),
        _window_case(device, torch.float32, (rows, cols), [(0, rows), (cols // 8, cols * 5 // 8)]),
        _window_case(device, torch.float64, (7, 33, 65), [(1, 6), (3, 30), (5, 64)]),
        _window_case(device, torch.int8, (64, 64, 64), [(0, 64), (0, 64), (13, 51)]),
        _append_case(device, torch.bfloat16, 64 if big else 8, 8, 4096 if big else 256, 128),
    ]
