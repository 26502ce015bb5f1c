"""Small attention shapes (the real-time agent's b32 s60 h8 d64, decode-like and odd tails): GPU
time per call from CUDA-graph replays of 20 calls (host launch cost excluded), median of 30."""

import json
import statistics

import torch

import flashscan

SHAPES = [  # b, sq, sk, h, d, causal
    (32, 60, 60, 8, 64, False),
    (32, 60, 60, 8, 64, True),
    (1, 60, 60, 8, 64, True),
    (8, 1, 1000, 16, 128, False),
    (4, 300, 300, 16, 128, True),
    (2, 1000, 1000, 32, 64, True),
    (2, 1000, 1000, 16, 128, False),
]


def main() -> None:
    rows = []
    for b, sq, sk, h, d, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (
            torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2)
        )
        out = torch.empty_like(q)
        for _ in range(3):
            flashscan.flash_attn_func(q, k, v, causal=causal, out=out)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                flashscan.flash_attn_func(q, k, v, causal=causal, out=out)
        ts = []
        for _ in range(30):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            graph.replay()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3 / 20)
        rows.append(
            {
                "shape": f"b{b} sq{sq} sk{sk} h{h} d{d}" + (" causal" if causal else ""),
                "us": round(statistics.median(ts), 2),
            }
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
