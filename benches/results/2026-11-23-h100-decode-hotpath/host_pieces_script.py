"""Host cost per piece of a b1 4k decode step (300 queued calls, no sync inside the timed loop,
best of 3)."""

import time

import torch

import flashscan
from flashscan import _native, kvcache

HD = 128
BF = "bfloat16"
dt = torch.bfloat16
q = torch.randn(1, 1, 32, HD, device="cuda", dtype=dt)
kc = torch.randn(1, 4097, 8, HD, device="cuda", dtype=dt)
vc = torch.randn_like(kc)
kn = torch.randn(1, 1, 8, HD, device="cuda", dtype=dt)
vn = torch.randn_like(kn)
lens = torch.full((1,), 4096, dtype=torch.int32, device="cuda")
out = torch.empty_like(q)
stream = torch.cuda.current_stream().cuda_stream
args = [kn, vn, kc, vc, lens, q, out]


def host_us(fn, n: int = 300) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    d = time.perf_counter() - t
    torch.cuda.synchronize()
    return d / n * 1e6


def desc(t: torch.Tensor, name: str) -> tuple:
    return (t.data_ptr(), t.shape, t.stride(), name, 2, 0)


def decode(splits: int) -> None:
    _native.flash_attn_kvcache(
        desc(q, BF), desc(kc, BF), desc(vc, BF), desc(out, BF), None, desc(lens, "int32"),
        None, None, None, 0.08, -1, -1, 0.0, splits, stream, 1,
    )  # fmt: skip


items = {
    "api step (append)": lambda: flashscan.flash_attn_with_kvcache(
        q, kc, vc, k=kn, v=vn, cache_seqlens=lens, out=out
    ),
    "api step (no append)": lambda: flashscan.flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens, out=out
    ),
    "signature only": lambda: kvcache._signature(
        q, kc, vc, kn, vn, None, None, lens, None, None, None, out
    ),
    "descriptors x7": lambda: [desc(t, BF) for t in args],
    "native append": lambda: _native.kvcache_append(
        desc(kn, BF),
        desc(vn, BF),
        desc(kc, BF),
        desc(vc, BF),
        desc(lens, "int32"),
        None,
        None,
        None,
        None,
        None,
        True,
        None,
        None,
        stream,
    ),  # fmt: skip
    "native decode (auto splits)": lambda: decode(0),
    "native decode (1 split)": lambda: decode(1),
    "flash_attn_func b1 s1 (hot)": lambda: flashscan.flash_attn_func(
        q, kc[:, :4096], vc[:, :4096], out=out
    ),
    "torch.empty_like": lambda: torch.empty_like(q),
    "current stream": lambda: torch._C._cuda_getCurrentRawStream(0),
}
for name, fn in items.items():
    print(f"{name:32s} {min(host_us(fn) for _ in range(3)):7.2f} us")
