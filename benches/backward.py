#!/usr/bin/env python3
"""Training-path benchmark (issue 6): attention forward+backward and the selective-scan
backward, flashscan against torch SDPA's FlashAttention-2 and cuDNN backends in the same run
(mamba_ssm is not installable on the lent H100: its rows are the issue's anchors).

    python benches/backward.py [--quick] [--out DIR]

Every flashscan row is guarded before timing: its gradients against the same step done by
torch (SDPA math in float32 for attention; a float32 torch scan for the scan, at a short
prefix) must agree to a relative RMS error of 2e-2. Times are triton.testing.do_bench medians
(L2 flushed between calls); TFLOP/s use flash-attn's convention: forward 4·b·h·sq·sk·d
(halved for causal), backward 2.5x the forward, so forward+backward = 3.5x.
Writes results.md and results.json to --out (default benches/results/<date>-<gpu>-backward/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# mamba_ssm selective-scan backward, measured on this kind of H100 on 2026-11-22 (issue 6)
SCAN_ANCHORS_MS = {(8, 2048, 2048): 2.41, (8, 2048, 8192): 9.50, (32, 512, 60): 0.231}
# torch SDPA forward+backward TFLOP/s ranges from the issue (seqlen 8k-16k)
ATTN_ANCHORS = {64: "FA2 291-296, cuDNN 444-459", 128: "FA2 311-320, cuDNN 536-556"}


def _import_flashscan() -> Any:
    try:
        import flashscan.torch  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "python"))
        import flashscan.torch  # noqa: F401
    import flashscan

    return flashscan


def rel_rms(a: Any, b: Any) -> float:
    a, b = a.double(), b.double()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30))


def bench_ms(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


# ---------------------------------------------------------------------------------------------
# Attention forward + backward
# ---------------------------------------------------------------------------------------------


def attention_rows(torch: Any, fs: Any, quick: bool, log: Callable[[str], None]) -> list[dict]:
    rows: list[dict] = []
    seqlens = [2048, 8192] if quick else [2048, 4096, 8192, 16384]
    for hd in (64, 128):
        for causal in (False, True):
            for sq in seqlens:
                rows += attention_shape(torch, hd, causal, sq, log)
                torch.cuda.empty_cache()
    return rows


def attention_shape(
    torch: Any, hd: int, causal: bool, sq: int, log: Callable[[str], None]
) -> list[dict]:
    """flashscan, SDPA FA2 and SDPA cuDNN at one shape: forward and forward+backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flashscan.torch as fst

    F = torch.nn.functional
    h = 2048 // hd
    b = max(1, 16384 // sq)
    q, k, v = (torch.randn(b, sq, h, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    fwd_flops = 4 * b * h * sq * sq * hd / (2 if causal else 1)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    lt = [t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v)]
    dout_t = dout.transpose(1, 2)

    def ours_fwd() -> Any:
        return fst.flash_attn_func(*leaves, causal=causal)

    def ours_step() -> Any:
        return torch.autograd.grad(ours_fwd(), leaves, dout)

    def sdpa(backend: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
        def fwd() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*lt, is_causal=causal)

        def step() -> Any:
            return torch.autograd.grad(fwd(), lt, dout_t)

        return fwd, step

    # guard (seqlen <= 4096): our gradients against SDPA math in float32
    err = float("nan")
    if sq <= 4096:
        l32 = [t.transpose(1, 2).float().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            o32 = F.scaled_dot_product_attention(*l32, is_causal=causal)
        g32 = torch.autograd.grad(o32, l32, dout_t.float())
        err = max(rel_rms(a, r.transpose(1, 2)) for a, r in zip(ours_step(), g32))
        del l32, o32, g32
    impls = {
        "flashscan": (ours_fwd, ours_step),
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }
    rows = []
    for name, (fwd, step) in impls.items():
        row: dict[str, Any] = {
            "suite": "attention",
            "impl": name,
            "hd": hd,
            "causal": causal,
            "batch": b,
            "seqlen": sq,
            "nheads": h,
            "status": "ok",
        }
        try:
            with torch.no_grad():
                t_f = bench_ms(fwd)
            t_s = bench_ms(step)
            row.update(
                fwd_ms=t_f,
                step_ms=t_s,
                bwd_ms=t_s - t_f,
                fwd_tflops=fwd_flops / t_f / 1e9,
                step_tflops=3.5 * fwd_flops / t_s / 1e9,
                bwd_tflops=2.5 * fwd_flops / max(t_s - t_f, 1e-9) / 1e9,
            )
            if name == "flashscan":
                row["guard_rel_rms"] = err
                row["status"] = "FAILED" if err > 2e-2 else "ok"
        except Exception as exc:  # a backend declining a shape
            row.update(status="n/a", note=f"{type(exc).__name__}: {exc}"[:160])
        rows.append(row)
        log(json.dumps(row))
    return rows


# ---------------------------------------------------------------------------------------------
# Selective scan backward
# ---------------------------------------------------------------------------------------------


def torch_scan_f32(u, delta, A, B, C, D, z, delta_bias):  # noqa: ANN001, ANN201
    F = sys.modules["torch"].nn.functional
    dt = F.softplus(delta.float() + delta_bias[:, None])
    x = u.new_zeros(u.shape[0], u.shape[1], A.shape[1], dtype=sys.modules["torch"].float32)
    ys = []
    for t in range(u.shape[2]):
        x = (
            sys.modules["torch"].exp(dt[:, :, t, None] * A) * x
            + (dt[:, :, t] * u[:, :, t].float())[..., None] * B[:, None, :, t].float()
        )
        ys.append((x * C[:, None, :, t].float()).sum(-1))
    y = sys.modules["torch"].stack(ys, -1) + D[:, None] * u.float()
    return y * F.silu(z.float())


def scan_rows(torch: Any, fs: Any, quick: bool, log: Callable[[str], None]) -> list[dict]:
    shapes = [(32, 512, 60), (8, 2048, 2048)] + ([] if quick else [(8, 2048, 8192)])
    rows = []
    for b, d, L in shapes:
        rows.append(scan_shape(torch, fs, b, d, L, 16))
        log(json.dumps(rows[-1]))
        torch.cuda.empty_cache()
    return rows


def scan_shape(torch: Any, fs: Any, b: int, d: int, L: int, n: int) -> dict[str, Any]:
    """The Mamba-1 block's scan at one shape: forward, backward, one training step."""
    import flashscan.torch as fst

    ops = torch.ops.flashscan
    bf = torch.bfloat16
    u = torch.randn(b, d, L, device="cuda", dtype=bf)
    delta = (torch.rand(b, d, L, device="cuda") * 2 - 3).to(bf)
    A = -torch.exp(torch.rand(d, n, device="cuda"))
    B = torch.randn(b, n, L, device="cuda", dtype=bf)
    C = torch.randn(b, n, L, device="cuda", dtype=bf)
    D = torch.randn(d, device="cuda")
    z = torch.randn(b, d, L, device="cuda", dtype=bf)
    db = torch.rand(d, device="cuda") - 0.5
    args = [u, delta, A, B, C, D, z, db]
    leaves = [t.clone().requires_grad_() for t in args]
    dout = torch.randn_like(u)

    # guard at a prefix of at most 256 steps: gradients vs a float32 torch scan
    P = min(L, 256)
    pre = [t[..., :P].contiguous() if t.dim() == 3 else t for t in args]
    lp = [t.clone().requires_grad_() for t in pre]
    gp = torch.autograd.grad(fst.selective_scan_fn(*lp, delta_softplus=True), lp, dout[..., :P])
    l32 = [t.detach().clone().float().requires_grad_() for t in pre]
    g32 = torch.autograd.grad(torch_scan_f32(*l32), l32, dout[..., :P].float())
    err = max(rel_rms(a, r) for a, r in zip(gp, g32))

    _out, _last, saved = ops.selective_scan_fwd(*args, None, True, True)
    none_saved = saved.new_empty((0,))

    def step() -> Any:
        y = fst.selective_scan_fn(*leaves, delta_softplus=True)
        return torch.autograd.grad(y, leaves, dout)

    row: dict[str, Any] = {
        "suite": "scan",
        "impl": "flashscan",
        "batch": b,
        "dim": d,
        "seqlen": L,
        "dstate": n,
    }
    row["fwd_ms"] = bench_ms(lambda: fs.selective_scan_fn(*args, delta_softplus=True))
    row["fwd_saving_ms"] = bench_ms(lambda: ops.selective_scan_fwd(*args, None, True, True))
    row["bwd_ms"] = bench_ms(lambda: ops.selective_scan_bwd(dout, None, *args, None, saved, True))
    row["bwd_recompute_ms"] = bench_ms(
        lambda: ops.selective_scan_bwd(dout, None, *args, None, none_saved, True)
    )
    row["step_ms"] = bench_ms(step)
    anchor = SCAN_ANCHORS_MS.get((b, d, L))
    row["mamba_bwd_anchor_ms"] = anchor
    row["speedup_vs_anchor"] = None if anchor is None else anchor / row["bwd_ms"]
    row["guard_rel_rms"] = err
    row["status"] = "ok" if err <= 2e-2 else "FAILED"
    # bytes the backward moves at least: reads u, delta, z, dout and writes du, ddelta, dz
    # (2 bytes each); reads B, C (2 bytes) and writes dB, dC (4 bytes)
    row["min_bytes"] = (b * d * L * 2) * 7 + b * n * L * (2 * 2 + 2 * 4)
    row["bw_floor_ms"] = row["min_bytes"] / 3.0e12 * 1e3
    return row


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _f(v: Any, fmt: str, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


def render(meta: dict, rows: list[dict]) -> str:
    out = [f"# Backward benchmarks — {meta['date']}", ""]
    out += [f"- device: {meta['device']}; driver {meta['driver']}; torch {meta['torch']}"]
    out += [f"- flashscan {meta['flashscan']} (commit {meta['commit']}); NVRTC {meta['nvrtc']}"]
    out += [f"- command: `{meta['command']}`", ""]
    out += ["## Attention forward + backward (bf16, batch·seqlen 16k, nheads·hd 2048)", ""]
    out += ["TFLOP/s in flash-attn's convention; `vs FA2` = SDPA-FA2 step time / ours.", ""]
    out += [
        "| hd | causal | seqlen | flashscan fwd+bwd | SDPA FA2 fwd+bwd | cuDNN fwd+bwd "
        "| vs FA2 | flashscan fwd | flashscan bwd | FA2 bwd | guard |"
    ]
    out += ["|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    att = [r for r in rows if r["suite"] == "attention"]
    for key in sorted({(r["hd"], r["causal"], r["seqlen"]) for r in att}):
        g = {r["impl"]: r for r in att if (r["hd"], r["causal"], r["seqlen"]) == key}

        def cell(name: str, k: str, g: dict = g) -> str:
            r = g.get(name)
            return "n/a" if r is None or k not in r else f"{r[k]:.0f}"

        fs_r, fa_r = g.get("flashscan", {}), g.get("sdpa-flash", {})
        ratio = "n/a"
        if "step_ms" in fs_r and "step_ms" in fa_r:
            ratio = f"{fa_r['step_ms'] / fs_r['step_ms']:.2f}x"
        guard = f"{fs_r.get('status')} ({fs_r.get('guard_rel_rms', float('nan')):.1e})"
        out.append(
            f"| {key[0]} | {int(key[1])} | {key[2]} | {cell('flashscan', 'step_tflops')} | "
            f"{cell('sdpa-flash', 'step_tflops')} | {cell('sdpa-cudnn', 'step_tflops')} | "
            f"{ratio} | {cell('flashscan', 'fwd_tflops')} | {cell('flashscan', 'bwd_tflops')} | "
            f"{cell('sdpa-flash', 'bwd_tflops')} | {guard} |"
        )
    out += ["", "Issue anchors (fwd+bwd TFLOP/s at seqlen 8k-16k):"]
    out += [f"hd64 {ATTN_ANCHORS[64]}; hd128 {ATTN_ANCHORS[128]}.", ""]
    out += ["## Selective scan (bf16, dstate 16, varying B/C, D, z, delta_bias, softplus)", ""]
    out += [
        "| batch | dim | seqlen | bwd (saved states) | bwd (recompute) | mamba_ssm bwd (anchor) "
        "| speedup | fwd | fwd saving | fwd+bwd step | bytes floor | guard |"
    ]
    out += ["|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["suite"] != "scan":
            continue
        us = lambda v: None if v is None else v * 1e3  # noqa: E731
        out.append(
            f"| {r['batch']} | {r['dim']} | {r['seqlen']} | {_f(us(r['bwd_ms']), '.1f', ' us')} | "
            f"{_f(us(r['bwd_recompute_ms']), '.1f', ' us')} | "
            f"{_f(us(r['mamba_bwd_anchor_ms']), '.0f', ' us')} | "
            f"{_f(r['speedup_vs_anchor'], '.2f', 'x')} | {_f(us(r['fwd_ms']), '.1f', ' us')} | "
            f"{_f(us(r['fwd_saving_ms']), '.1f', ' us')} | {_f(us(r['step_ms']), '.1f', ' us')} | "
            f"{_f(us(r['bw_floor_ms']), '.1f', ' us')} | {r['status']} "
            f"({r['guard_rel_rms']:.1e}) |"
        )
    out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--suite", default="attention,scan")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark")
        return 0
    fs = _import_flashscan()
    if not fs.available():
        print(f"flashscan's CUDA backend is unavailable: {fs.info()['reason']}")
        return 0
    torch.manual_seed(0)
    log = lambda s: print(s, flush=True)  # noqa: E731
    rows: list[dict] = []
    suites = args.suite.split(",")
    if "attention" in suites:
        rows += attention_rows(torch, fs, args.quick, log)
    if "scan" in suites:
        rows += scan_rows(torch, fs, args.quick, log)
    info = fs.info()
    try:
        commit = (
            subprocess.run(
                ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or None
        )
    except OSError:
        commit = None
    meta = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "driver": info.get("driver_version"),
        "nvrtc": info.get("nvrtc_version"),
        "torch": torch.__version__,
        "flashscan": fs.__version__,
        "commit": os.environ.get("FLASHSCAN_COMMIT") or commit,
        "command": " ".join(["python", *sys.argv]),
        "python": platform.python_version(),
    }
    gpu = (
        torch.cuda.get_device_name().split()[1].lower()
        if " " in torch.cuda.get_device_name()
        else "gpu"
    )
    out_dir = args.out or os.path.join(
        REPO,
        "benches",
        "results",
        f"{meta['date']}-{gpu}-backward" + ("-quick" if args.quick else ""),
    )
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(
            {"meta": meta, "rows": rows},
            f,
            indent=1,
            default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x),
        )
    md = render(meta, rows)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
