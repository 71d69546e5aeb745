"""write_slice benchmark cases. Peer: torch slice assignment, ``dest[window].copy_(src)``.

Bulk cases rotate among several dest/source sets (common.n_sets) so the timed
calls stream from memory instead of L2. Decode appends are small, so their
per-call time is mostly launch and host overhead: that is what they measure.
"""

import itertools

import torch

import baracuda_torch as bt
from common import Case, dtype_name, n_sets, rotate


def _random(shape, dtype, device):
    """Random contents: copies do not look at values, but timing on constant
    data can flatter a kernel (and hides unwritten output), so never use it."""
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    return torch.randint(0, 256, shape, device=device).to(dtype)


def _window(ranges):
    return tuple(slice(a, b) for a, b in ranges)


def _bulk(device, name, dest_shape, ranges, dtype):
    """A window write into a large dest, ours vs torch, over rotating sets."""
    src_shape = [b - a for a, b in ranges]
    elem = torch.empty((), dtype=dtype).element_size()
    bytes_moved = 2 * elem * torch.Size(src_shape).numel()
    sets = []
    for _ in range(n_sets(bytes_moved)):
        dest = _random(dest_shape, dtype, device)
        src = _random(src_shape, dtype, device)
        sets.append((dest, src))
    win = _window(ranges)
    path = bt.write_slice_path(*sets[0], ranges)
    return Case(
        name=f"{name} [{path}]",
        dtype=dtype_name(dtype),
        bytes_moved=bytes_moved,
        ours=rotate([lambda d=d, s=s: bt.write_slice_(d, s, ranges) for d, s in sets]),
        peer=rotate([lambda d=d, s=s: d[win].copy_(s) for d, s in sets]),
        peer_name="torch slice copy_",
    )


def _int4_torch(dest, src, start):
    """Packed-int4 window write in plain torch, for an odd ``start`` and even
    length: every dest byte takes the high nibble of one source byte and the
    low nibble of the next, and the two edge bytes keep their outer nibble."""
    a, m = start // 2, src.shape[-1]
    d = dest[..., a:a + m + 1]
    lo, hi = src & 0x0F, src >> 4
    d[..., 0] = (d[..., 0] & 0x0F) | (lo[..., 0] << 4)
    d[..., 1:m] = hi[..., :-1] | (lo[..., 1:] << 4)
    d[..., m] = (d[..., m] & 0xF0) | hi[..., -1]


def _int4(device, rows, cols):
    """uint8 dest of ``cols`` bytes (2 * cols nibbles) per row; the window
    starts and ends on odd nibbles, so both edge bytes are shared."""
    start = cols // 4 + 1
    length = cols                      # nibbles: half of each row
    ranges = [(0, rows), (start, start + length)]
    src_bytes, win_bytes = rows * length // 2, rows * (length // 2 + 1)
    sets = []
    for _ in range(n_sets(src_bytes + win_bytes)):
        dest = _random((rows, cols), torch.uint8, device)
        src = _random((rows, length // 2), torch.uint8, device)
        sets.append((dest, src))
    path = bt.write_slice_path(*sets[0], ranges, packed_int4=True)
    return Case(
        name=f"packed int4, odd edges [{path}]",
        dtype="int4 (uint8)",
        bytes_moved=src_bytes + win_bytes,
        ours=rotate([lambda d=d, s=s: bt.write_slice_(d, s, ranges, packed_int4=True)
                     for d, s in sets]),
        peer=rotate([lambda d=d, s=s: _int4_torch(d, s, start) for d, s in sets]),
        peer_name="torch bit ops",
    )


GRAPH_NOTE = ("torch slice assignment bakes its position into the captured graph: "
              "moving the append needs a recapture (or a host sync); write_slice_at_ "
              "reads the position from a device tensor at each replay.")


def _decode(device, B, H, T, D, graphs):
    """KV-cache append of one token per sequence: ``kv [B, H, 1, D]`` into
    ``cache [B, H, T, D]`` at a position that moves from call to call."""
    dtype = torch.bfloat16
    cache = _random((B, H, T, D), dtype, device)
    kv = _random((B, H, 1, D), dtype, device)
    bytes_moved = 2 * kv.numel() * kv.element_size()
    full = [(0, B), (0, H)]
    common = dict(dtype=dtype_name(dtype), bytes_moved=bytes_moved, reps=200)

    def host_positions():
        # A fresh cycle per callable, so ours and the peer walk the same positions.
        return itertools.cycle(range(0, T, max(1, T // 64)))

    def ours_host(pos=host_positions()):
        p = next(pos)
        bt.write_slice_(cache, kv, full + [(p, p + 1), (0, D)])

    def peer_host(pos=host_positions()):
        p = next(pos)
        cache[:, :, p:p + 1].copy_(kv)

    # Device-side positions: a handful of ready offset tensors, so switching
    # position costs no extra kernel (in a model the previous step writes it).
    scalar_offs = [torch.tensor(p, dtype=torch.int64, device=device)
                   for p in range(0, T, max(1, T // 16))]
    gen = torch.Generator().manual_seed(0)
    row_offs = [torch.randint(0, T, (B,), generator=gen).to(device) for _ in range(16)]
    rows = torch.arange(B, device=device)
    kv_rows = kv[:, :, 0]              # [B, H, D], the layout index_put_ wants

    at_scalar = rotate([lambda o=o: bt.write_slice_at_(cache, kv, 2, o) for o in scalar_offs])
    at_rows = rotate([lambda o=o: bt.write_slice_at_(cache, kv, 2, o) for o in row_offs])

    def index_put(o):
        cache[rows, :, o] = kv_rows

    peer_rows = rotate([lambda o=o: index_put(o) for o in row_offs])

    cases = [
        Case("decode append, host position", ours=ours_host, peer=peer_host,
             peer_name="torch slice copy_", **common),
        Case("decode append, write_slice_at_ scalar offset", ours=at_scalar,
             peer=peer_host, peer_name="torch slice copy_ (host pos)", **common),
        Case("decode append, write_slice_at_ per-row offsets", ours=at_rows,
             peer=peer_rows, peer_name="torch index_put_", **common),
    ]
    if graphs:
        cases += [
            Case("decode append, write_slice_at_ scalar, CUDA graph", ours=at_scalar,
                 peer=peer_host, peer_name="torch slice copy_ (fixed pos)",
                 graph=True, note=GRAPH_NOTE, **common),
            Case("decode append, write_slice_at_ per-row, CUDA graph", ours=at_rows,
                 peer=peer_rows, peer_name="torch index_put_", graph=True, **common),
        ]
    return cases


def cases(device, quick=False):
    s, t = (64, 16) if quick else (1, 1)   # --quick: bulk dims / 64, decode dims / 16
    C = 8192 // s
    strided = [(0, C), (C // 8, 5 * C // 8)]   # columns 1024:5120, all rows
    return [
        _bulk(device, "contiguous chunk", [65536 // s, 1024],
              [(1000 // s, 33768 // s), (0, 1024)], torch.bfloat16),
        *[_bulk(device, "strided window", [C, C], strided, dtype)
          for dtype in (torch.float32, torch.uint8, torch.float64)],
        _int4(device, C, C),
        *_decode(device, 64 // t, 8, 4096 // t, 128, graphs=device.type == "cuda"),
    ]
