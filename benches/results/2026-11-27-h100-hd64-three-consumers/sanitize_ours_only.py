"""The TMA forward alone (no SDPA reference, whose cuDNN kernels synccheck aborts and racecheck
flags) on the sanitizers' small shapes: hd128 causal sq != sk (128 rows, ping-pong), hd64
causal odd 777 with GQA, hd64 window sq != sk, hd64 256 (192 rows, three consumers).

    compute-sanitizer --tool synccheck python sanitize_ours_only.py
"""

from __future__ import annotations

import torch

import flashscan

CASES = [
    (2, 200, 517, 4, 4, 128, True),
    (1, 777, 777, 4, 2, 64, True),
    (2, 300, 650, 2, 2, 64, False),
    (2, 256, 256, 4, 4, 64, False),
]

for b, sq, sk, h, hk, d, causal in CASES:
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    o = flashscan.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    print("ok", b, sq, sk, h, hk, d, causal, float(o.float().abs().max()), flush=True)
