#!/usr/bin/env python3
"""Varlen prefill (issue 12): flashscan.flash_attn_varlen_func over ragged packed sequences
summing to 16k tokens against our dense flash_attn_func, in one run on this GPU (bf16, hd128,
16 q heads / 16 kv heads and 32 / 8).

    python benches/varlen.py [--out DIR] [--quick]

Rows, causal and not, forward and forward + backward:
- "varlen ragged": 9 sequences of 256..4096 tokens (fixed seed) summing to 16384;
- "dense padded": the same sequences padded to the longest (batch 9 x 4096): what one pays
  without varlen (TFLOP/s counts the real tokens' work only);
- "dense equal" and "varlen equal": 4 x 4096 = 16384 tokens, the same work for both paths:
  the target is varlen TFLOP/s within 5% of dense TFLOP/s (`ratio` column).
TFLOP/s = 4 * visible (query, key) pairs * heads * headdim (x 2.5 for forward + backward, as
flash-attn counts), visible pairs counted exactly per sequence (causal: bottom-right aligned).
Every row is checked before it is timed (relative RMS <= 2e-2, every element finite) on its
first and last sequences: a varlen row against our dense call of that sequence alone, a
dense row against torch SDPA in float32 on the same padded batch row (the padding is part
of what the dense call computes). A failing or unchecked row prints FAILED. Times: medians of
triton.testing.do_bench.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys

import torch
import torch.nn.functional as F

import flashscan
import flashscan.torch as fst

HD = 128
TOTAL = 16384
TOL = 2e-2


def ragged_lengths(total: int = TOTAL, n: int = 9, seed: int = 12) -> list[int]:
    """n lengths in 256..4096, multiples of 1, summing to `total` (fixed seed)."""
    r = random.Random(seed)
    while True:
        cuts = sorted(r.sample(range(1, total), n - 1))
        lens = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
        if all(256 <= x <= 4096 for x in lens):
            return lens


def do_bench(fn) -> float:
    from triton.testing import do_bench as tb

    return tb(fn, warmup=10, rep=50, return_mode="median") * 1e-3


def rel_rms(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))


def sdpa_float32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """torch SDPA in float32 on (batch, seqlen, heads, headdim) inputs of equal seqlen (causal
    top-left = bottom-right then); GQA: kv head j // (h / hk) serves q head j, as flash-attn."""
    h, hk = q.shape[2], k.shape[2]
    qt, kt, vt = (t.float().transpose(1, 2) for t in (q, k, v))
    if h != hk:
        kt, vt = kt.repeat_interleave(h // hk, 1), vt.repeat_interleave(h // hk, 1)
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def dense_error(
    got: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    batch_rows: tuple[int, ...],
) -> float:
    """The dense call's worst relative RMS error over `batch_rows` of its (batch, seqlen,
    heads, headdim) output against `sdpa_float32` on the same inputs (inf if not finite)."""
    return max(
        rel_rms(got[i], sdpa_float32(q[i : i + 1], k[i : i + 1], v[i : i + 1], causal)[0])
        for i in batch_rows
    )


def pairs(lens: list[int], causal: bool) -> int:
    """Visible (query, key) pairs of self-attention over sequences of these lengths."""
    return sum(n * (n + 1) // 2 if causal else n * n for n in lens)


def cu(lens: list[int]) -> torch.Tensor:
    c = [0]
    for n in lens:
        c.append(c[-1] + n)
    return torch.tensor(c, dtype=torch.int32, device="cuda")


def rows_for(lens_name: str, lens: list[int], h: int, hk: int, causal: bool, bwd: bool) -> list:
    dt = torch.bfloat16
    total, mx, b = sum(lens), max(lens), len(lens)
    q = torch.randn(total, h, HD, device="cuda", dtype=dt)
    k = torch.randn(total, hk, HD, device="cuda", dtype=dt)
    v = torch.randn(total, hk, HD, device="cuda", dtype=dt)
    cq = cu(lens)
    flops = 4.0 * pairs(lens, causal) * h * HD * (2.5 if bwd else 1.0)
    tag = f"{lens_name} h{h}/{hk} {'causal' if causal else 'full'} {'fwd+bwd' if bwd else 'fwd'}"

    def varlen_fn():
        if not bwd:
            return flashscan.flash_attn_varlen_func(q, k, v, cq, cq, mx, mx, causal=causal)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = fst.flash_attn_varlen_func(*leaves, cq, cq, mx, mx, causal=causal)
        out.backward(dout)
        return out

    # dense: equal lengths as a (b, L) batch; ragged ones padded to the longest
    pad = torch.zeros(b, mx, h, HD, device="cuda", dtype=dt)
    kpad = torch.zeros(b, mx, hk, HD, device="cuda", dtype=dt)
    vpad = torch.zeros_like(kpad)
    offs = cq.tolist()
    for i, n in enumerate(lens):
        pad[i, :n] = q[offs[i] : offs[i] + n]
        kpad[i, :n] = k[offs[i] : offs[i] + n]
        vpad[i, :n] = v[offs[i] : offs[i] + n]
    dout = torch.randn_like(q)
    dout_pad = torch.randn_like(pad)

    def dense_fn():
        if not bwd:
            return flashscan.flash_attn_func(pad, kpad, vpad, causal=causal)
        leaves = [t.detach().requires_grad_() for t in (pad, kpad, vpad)]
        out = fst.flash_attn_func(*leaves, causal=causal)
        out.backward(dout_pad)
        return out

    rows = []
    for impl, fn in (("varlen", varlen_fn), ("dense", dense_fn)):
        row = {
            "case": tag,
            "impl": impl + (" padded" if impl == "dense" and len(set(lens)) > 1 else ""),
            "status": "ok",
        }
        try:
            got = fn().detach()
            if impl == "dense":
                row["rel_rms"] = dense_error(got, pad, kpad, vpad, causal, (0, b - 1))
            else:
                for i in (0, b - 1):
                    n = lens[i]
                    ref = flashscan.flash_attn_func(
                        q[None, offs[i] : offs[i] + n],
                        k[None, offs[i] : offs[i] + n],
                        v[None, offs[i] : offs[i] + n],
                        causal=causal,
                    )[0]
                    err = rel_rms(got[offs[i] : offs[i] + n], ref)
                    row["rel_rms"] = max(row.get("rel_rms", 0.0), err)
            if not row["rel_rms"] <= TOL:  # NaN fails too
                row["status"] = "FAILED"
            row["us"] = do_bench(fn) * 1e6
            row["tflops"] = flops / (row["us"] * 1e-6) / 1e12
        except Exception as exc:
            row["status"] = "FAILED"
            row["note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        row["status"] = row_status(row)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    if all("tflops" in r for r in rows):
        rows[0]["ratio"] = rows[0]["tflops"] / rows[1]["tflops"]
    return rows


def row_status(row: dict) -> str:
    """FAILED unless the row's guard ran and passed: no row is "ok" without a finite error
    within the tolerance."""
    err = row.get("rel_rms", math.nan)
    return "ok" if row["status"] == "ok" and err <= TOL else "FAILED"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="h16/16 only, no backward")
    args = ap.parse_args()
    ragged = ragged_lengths()
    heads = [(16, 16)] if args.quick else [(16, 16), (32, 8)]
    rows = []
    for h, hk in heads:
        for causal in (False, True):
            for bwd in (False,) if args.quick else (False, True):
                rows += rows_for("equal 4x4096", [4096] * 4, h, hk, causal, bwd)
                rows += rows_for(f"ragged {len(ragged)} seqs", ragged, h, hk, causal, bwd)
    dev = torch.cuda.get_device_name()
    commit = os.environ.get("FLASHSCAN_COMMIT", "unknown")
    lines = [
        f"# varlen prefill: {dev}, flashscan {flashscan.__version__} ({commit}), bf16 hd{HD}",
        f"ragged lengths: {ragged} (sum {sum(ragged)})",
        "",
        "| case | impl | us | TFLOP/s | varlen/dense | rel RMS | status |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['impl']} | {r.get('us', float('nan')):.1f} | "
            f"{r.get('tflops', float('nan')):.1f} | {r.get('ratio', float('nan')):.3f} | "
            f"{r.get('rel_rms', float('nan')):.2e} | {r['status']} {r.get('note', '')} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "varlen.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "varlen.json"), "w") as f:
            json.dump(
                {"device": dev, "commit": commit, "ragged": ragged, "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
