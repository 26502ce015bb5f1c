"""One attention forward shape, called a few times, for ncu (--launch-skip picks one launch)."""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser()
ap.add_argument("--hd", type=int, default=64)
ap.add_argument("--seqlen", type=int, default=512)
ap.add_argument("--causal", type=int, default=1)
ap.add_argument("--peer", default="")
ap.add_argument("--calls", type=int, default=5)
a = ap.parse_args()
b = 16384 // a.seqlen
h = 2048 // a.hd
q, k, v = (torch.randn(b, a.seqlen, h, a.hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
if a.peer:
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}[a.peer]
    with sdpa_kernel(be):
        for _ in range(a.calls):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(a.causal))
else:
    import flashscan

    for _ in range(a.calls):
        flashscan.flash_attn_func(q, k, v, causal=bool(a.causal))
torch.cuda.synchronize()
