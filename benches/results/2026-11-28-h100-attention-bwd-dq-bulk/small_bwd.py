"""The attention backward alone (native entry, CUDA events, median of 50) at small and odd
shapes (call 5). Torch tensors go through __dlpack__ here, so the s60 rows are host-bound."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

import flashscan

SHAPES = [
    (32, 60, 8, 64, True),
    (1, 60, 8, 64, True),
    (8, 512, 16, 64, False),
    (4, 1024, 16, 128, True),
    (2, 300, 16, 128, False),
    (16, 2048, 8, 64, True),
]


def ev(fn: Callable[[], object], reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main() -> None:
    for b, s, h, d, causal in SHAPES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out, lse = flashscan.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        dout = torch.randn_like(out)
        g = [torch.empty_like(t) for t in (q, k, v)]
        st = torch.cuda.current_stream().cuda_stream
        right = 0 if causal else -1

        bwd = functools.partial(
            flashscan._native.flash_attn_bwd,
            dout,
            q,
            k,
            v,
            out,
            lse,
            *g,
            d**-0.5,
            -1,
            right,
            0.0,
            False,
            st,
        )

        print(f"b{b} s{s} h{h} d{d} causal={int(causal)}: bwd {ev(bwd):.1f} us", flush=True)


if __name__ == "__main__":
    main()
