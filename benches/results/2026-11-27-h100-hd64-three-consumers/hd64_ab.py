"""hd64 forward TFLOP/s, batch x seqlen 16k, 32 heads: flashscan (its block_m from
FLASHSCAN_SM90_BLOCK_M, read once per process; unset = the default of the wheel under test),
with --peers SDPA FlashAttention-2 and cuDNN in the same process. Median of 40 event-timed
calls after 8 warm-ups; each row guarded against float32 SDPA on batch 0, head 0.

    FLASHSCAN_SM90_BLOCK_M=128 python hd64_ab.py --peers
    FLASHSCAN_SM90_BLOCK_M=192 python hd64_ab.py

(The logs' "block_m=128" tag is this script's label for an unset variable: in call 8 that is
the new default, 192 rows at head dim 64.)
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any, Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashscan


def time_ms(fn: Callable[[], Any], reps: int = 40, warmup: int = 8) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts)


def main() -> None:
    peers = "--peers" in sys.argv
    tag = os.environ.get("FLASHSCAN_SM90_BLOCK_M", "128")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for dtype in (torch.bfloat16, torch.float16):
        for s in (2048, 4096, 8192, 16384):
            if dtype == torch.float16 and s != 4096:
                continue
            b, h, d = 16384 // s, 32, 64
            for causal in (False, True):
                torch.manual_seed(s + causal)
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
                out = torch.empty_like(q)

                def ours(q: Any = q, k: Any = k, v: Any = v, c: bool = causal, o: Any = out) -> Any:
                    return flashscan.flash_attn_func(q, k, v, causal=c, out=o)

                ours()
                torch.cuda.synchronize()
                qr, kr, vr = (x[:1, :, :1].transpose(1, 2).float() for x in (q, k, v))
                ref = sdpa(qr, kr, vr, is_causal=causal).transpose(1, 2)
                err = (out[:1, :, :1].float() - ref).abs().max().item()
                flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                row = f"{str(dtype)[6:]:8s} b{b} s{s} h{h} d{d} causal={int(causal)}  "
                row += f"block_m={tag} ours {flops / time_ms(ours) / 1e9:6.1f} (err {err:.1e})"
                if peers:
                    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    for name, be in (
                        ("fa2", SDPBackend.FLASH_ATTENTION),
                        ("cudnn", SDPBackend.CUDNN_ATTENTION),
                    ):
                        with sdpa_kernel([be]):

                            def peer(q: Any = qt, k: Any = kt, v: Any = vt, c: Any = causal) -> Any:
                                return sdpa(q, k, v, is_causal=c)

                            row += f"  {name} {flops / time_ms(peer) / 1e9:6.1f}"
                print(row, flush=True)


if __name__ == "__main__":
    main()
