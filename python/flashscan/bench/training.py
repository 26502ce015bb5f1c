"""Training-path benchmark (issue 6): attention forward+backward and the selective-scan
backward, flashscan against torch SDPA's FlashAttention-2 and cuDNN backends in the same run
(and mamba_ssm's selective_scan_fn when built from a checkout with --mamba-src; otherwise its
rows are the issue's anchors).

    python benches/backward.py [--quick] [--out DIR] [--suite attention,scan] [--sm90-bwd]
                               [--head-dims 64,128]

--sm90-bwd adds a `flashscan-sm90bwd` attention row: the same call with FLASHSCAN_SM90_BWD=1 (the
wgmma backward, cuda/flash_bwd_sm90.cu, the default on sm_90), the plain `flashscan` row then runs
with it set to 0 (the mma.sync backward), so both backwards are timed beside FA2 and cuDNN in one
run.

Every timed row is guarded before it is timed, at every seqlen, against float64: attention
(flashscan and each SDPA backend) on its output and dq, dk, dv for the first and last batch and
head (exact: heads are independent; query rows go a block at a time, so the reference fits at
seqlen 16k); the scan on every output it times (forward, forward saving states, backward with
saved states and recomputing them, the autograd step) against a float64 torch scan run batch by
batch. A row passes when each tensor's relative RMS error is <= 2e-2 and its max error
<= 0.1 x max|ref|; a NaN/inf, an error off, or a guard that could not run prints FAILED.
Times are GPU medians from the harness's Timer (triton.testing.do_bench, L2 flushed between
calls); TFLOP/s use flash-attn's convention: forward 4·b·h·sq·sk·d (halved for causal),
backward 2.5x the forward, so forward+backward = 3.5x. Writes results.md and results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sys
from collections.abc import Iterator
from typing import Any, Callable

from . import mamba_src
from .config import make_config
from .fmt import first_line
from .guards import GUARD_RMS, check_outputs, declined
from .meta import command_line, git_commit, repo_root
from .peers import detect_peers, first_output
from .references import attention_grads_reference, torch_selective_scan
from .results import jsonable
from .timing import Timer

# mamba_ssm selective-scan backward, measured on this kind of H100 on 2026-11-22 (issue 6)
SCAN_ANCHORS_MS = {(8, 2048, 2048): 2.41, (8, 2048, 8192): 9.50, (32, 512, 60): 0.231}
# torch SDPA forward+backward TFLOP/s ranges from the issue (seqlen 8k-16k)
ATTN_ANCHORS = {64: "FA2 291-296, cuDNN 444-459", 128: "FA2 311-320, cuDNN 536-556"}
TOL = GUARD_RMS["bf16"]
SCAN_GRADS = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias")
SM90_BWD_ENV = "FLASHSCAN_SM90_BWD"  # read by the native launcher on every backward call
SM90_IMPL = "flashscan-sm90bwd"


def realtime_scan_args(torch: Any, batch: int, device: str = "cuda") -> list[Any]:
    """The inputs of the real-time Mamba-1 scan (issue 13's game shape: d512, L60, dstate 16,
    bf16 u / delta / B / C / z, float32 A / D / delta_bias; delta around softplus^-1 of the
    usual step sizes): [u, delta, A, B, C, D, z, delta_bias], for `selective_scan_fn(*args,
    delta_softplus=True)`. The host-cost tools and the training-step bench share them."""
    d, L, n, bf = 512, 60, 16, torch.bfloat16
    return [
        torch.randn(batch, d, L, device=device, dtype=bf),
        (torch.rand(batch, d, L, device=device) - 2).to(bf),
        -torch.rand(d, n, device=device),
        torch.randn(batch, n, L, device=device, dtype=bf),
        torch.randn(batch, n, L, device=device, dtype=bf),
        torch.randn(d, device=device),
        torch.randn(batch, d, L, device=device, dtype=bf),
        torch.rand(d, device=device),
    ]


def floor_function(torch: Any) -> Any:
    """torch's own cost of an eager op's training step: an autograd.Function over the same
    inputs that saves them, allocates out like the first input and in the backward one gradient
    per saved input (no checks, no descriptors, no native call). What the host-cost tools time
    beside flashscan's steps."""

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *ts: Any) -> Any:  # type: ignore[override]
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(*ts)
            return ts[0].new_empty_strided(ts[0].shape, ts[0].stride())

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:  # type: ignore[override]
            return tuple(t.new_empty_strided(t.shape, t.stride()) for t in ctx.saved_tensors)

    return Floor


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """`name` set to `value` (None: left as it is) for the duration, then restored."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _ms(timer: Timer, fn: Callable[[], Any]) -> float:
    return timer.gpu(fn) * 1e3


def _ends(n: int) -> list[int]:
    """First and last index (one when n == 1): the subset a guard checks."""
    return [0] if n == 1 else [0, n - 1]


# ---------------------------------------------------------------------------------------------
# Attention forward + backward
# ---------------------------------------------------------------------------------------------


def attention_rows(
    torch: Any,
    timer: Timer,
    quick: bool,
    log: Callable[[str], None],
    sm90_bwd: bool = False,
    head_dims: tuple[int, ...] = (64, 128),
) -> list:
    rows: list[dict] = []
    seqlens = [2048, 8192] if quick else [2048, 4096, 8192, 16384]
    for hd in head_dims:
        for causal in (False, True):
            for sq in seqlens:
                rows += attention_shape(torch, timer, hd, causal, sq, log, sm90_bwd)
                torch.cuda.empty_cache()
    return rows


def attention_shape(
    torch: Any,
    timer: Timer,
    hd: int,
    causal: bool,
    sq: int,
    log: Callable[[str], None],
    sm90_bwd: bool = False,
) -> list[dict]:
    """flashscan, SDPA FA2 and SDPA cuDNN at one shape: forward and forward+backward, each
    guarded on its output and gradients against float64 (`sm90_bwd`: flashscan twice, with the
    wgmma backward off and on)."""
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

    def ours_step_with(switch: str | None) -> Callable[[], Any]:
        def step() -> Any:
            with _env(SM90_BWD_ENV, switch):
                return torch.autograd.grad(ours_fwd(), leaves, dout)

        return step

    def sdpa(backend: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
        def fwd() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*lt, is_causal=causal)

        def step() -> Any:
            return torch.autograd.grad(fwd(), lt, dout_t)

        return fwd, step

    bidx, hidx = _ends(b), _ends(h)
    ref: tuple[Any, ...] | None = None
    ref_error = ""
    try:
        ref = attention_grads_reference(torch, q, k, v, dout, causal, bidx, hidx)
    except Exception as exc:  # the rows below then FAIL: nothing is timed unchecked
        ref_error = f"float64 reference failed: {type(exc).__name__}: {first_line(exc)}"
        torch.cuda.empty_cache()
    impls = {"flashscan": (ours_fwd, ours_step_with("0" if sm90_bwd else None), False)}
    if sm90_bwd:
        impls[SM90_IMPL] = (ours_fwd, ours_step_with("1"), False)
    impls |= {
        "sdpa-flash": (*sdpa(SDPBackend.FLASH_ATTENTION), True),
        "sdpa-cudnn": (*sdpa(SDPBackend.CUDNN_ATTENTION), True),
    }
    rows = []
    for name, (fwd, step, bhsd) in impls.items():
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
            if ref is None:
                raise RuntimeError(ref_error)
            with torch.no_grad():
                out = first_output(fwd())
            grads = step()
            if bhsd:  # SDPA's layout (batch, nheads, seqlen, headdim)
                out, grads = out.transpose(1, 2), [g.transpose(1, 2) for g in grads]

            def pick(t: Any) -> Any:
                return t[bidx][:, :, hidx]

            got = [pick(out)] + [pick(g) for g in grads]
            ok, err, why = check_outputs(torch, list(zip(("out", "dq", "dk", "dv"), got, ref)), TOL)
            del out, grads, got
            row["guard_rel_rms"] = err
            if not ok:
                row.update(status="FAILED", note=why[:300])
            with torch.no_grad():
                t_f = _ms(timer, fwd)
            t_s = _ms(timer, step)
            row.update(
                fwd_ms=t_f,
                step_ms=t_s,
                bwd_ms=t_s - t_f,
                fwd_tflops=fwd_flops / t_f / 1e9,
                step_tflops=3.5 * fwd_flops / t_s / 1e9,
                bwd_tflops=2.5 * fwd_flops / max(t_s - t_f, 1e-9) / 1e9,
            )
        except Exception as exc:
            status = "n/a" if name != "flashscan" and declined(exc) else "FAILED"
            row.update(status=status, note=f"{type(exc).__name__}: {first_line(exc)}"[:160])
        rows.append(row)
        log(json.dumps(row))
    return rows


# ---------------------------------------------------------------------------------------------
# Selective scan backward
# ---------------------------------------------------------------------------------------------


def scan_grads_reference(
    torch: Any, args: list[Any], dout: Any, max_elems: int = 2**26
) -> tuple[Any, list[Any]]:
    """float64 out and gradients (SCAN_GRADS order) of the Mamba-1 scan with delta_softplus,
    for args (u, delta, A, B, C, D, z, delta_bias): autograd through the torch reference, a
    batch chunk at a time (about `max_elems` scan states each) so that long sequences fit;
    the gradients shared by all batches (dA, dD, ddelta_bias) are summed over the chunks."""
    batch = args[0].shape[0]
    per_batch = args[0].shape[1] * args[0].shape[2] * args[2].shape[1]
    chunk = max(1, min(batch, max_elems // per_batch))
    outs: list[Any] = []
    per: list[list[Any]] = [[] for _ in args]
    shared: list[Any] = [None] * len(args)
    for b0 in range(0, batch, chunk):
        sl = slice(b0, b0 + chunk)
        leaves = [
            (t.detach()[sl] if t.dim() == 3 else t.detach()).double().requires_grad_() for t in args
        ]
        with torch.enable_grad():
            y, _ = torch_selective_scan(
                torch, *leaves[:7], delta_bias=leaves[7], delta_softplus=True, acc=torch.float64
            )
            grads = torch.autograd.grad(y, leaves, dout[sl].double())
        outs.append(y.detach())
        for i, (t, g) in enumerate(zip(args, grads)):
            if t.dim() == 3:
                per[i].append(g)
            else:
                shared[i] = g if shared[i] is None else shared[i] + g
        del y, grads, leaves
    ref = [torch.cat(per[i]) if t.dim() == 3 else shared[i] for i, t in enumerate(args)]
    return torch.cat(outs), ref


def scan_rows(
    torch: Any, fs: Any, timer: Timer, quick: bool, log: Callable[[str], None], mamba: Any = None
) -> list:
    shapes = [(32, 512, 60), (1, 512, 60), (8, 2048, 2048)] + ([] if quick else [(8, 2048, 8192)])
    rows = []
    for b, d, L in shapes:
        for row in scan_shape(torch, fs, timer, b, d, L, 16, mamba):
            rows.append(row)
            log(json.dumps(row))
        torch.cuda.empty_cache()
    return rows


def scan_shape(
    torch: Any, fs: Any, timer: Timer, b: int, d: int, L: int, n: int, mamba: Any = None
) -> list[dict]:
    """The Mamba-1 block's scan at one shape: forward, backward, one training step, for
    flashscan and (when given) mamba_ssm's `selective_scan_fn`; every timed call's output is
    checked against float64 first."""
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
    shape = {"suite": "scan", "batch": b, "dim": d, "seqlen": L, "dstate": n}
    row: dict[str, Any] = {**shape, "impl": "flashscan", "status": "ok"}
    ref: tuple[Any, Any] | None = None
    try:
        ref = scan_grads_reference(torch, args, dout)
        saved = ops.selective_scan_fwd(*args, None, True, True)[2]
        none_saved = saved.new_empty((0,))

        def step() -> Any:
            y = fst.selective_scan_fn(*leaves, delta_softplus=True)
            return torch.autograd.grad(y, leaves, dout)

        timed = {
            "fwd_ms": lambda: fs.selective_scan_fn(*args, delta_softplus=True),
            "fwd_saving_ms": lambda: ops.selective_scan_fwd(*args, None, True, True),
            "bwd_ms": lambda: ops.selective_scan_bwd(dout, None, *args, None, saved, True),
            "bwd_recompute_ms": lambda: ops.selective_scan_bwd(
                dout, None, *args, None, none_saved, True
            ),
            "step_ms": step,
        }
        _guard_and_time(torch, timer, row, timed, ref, ("fwd_ms", "fwd_saving_ms"))
    except Exception as exc:
        row.update(status="FAILED", note=f"{type(exc).__name__}: {first_line(exc)}"[:160])
    rows = [row]
    if mamba is not None:
        peer: dict[str, Any] = {**shape, "impl": "mamba_ssm", "status": "ok"}
        try:
            if ref is None:
                raise RuntimeError("no float64 reference to check against")

            def mamba_step() -> Any:
                y = mamba(*leaves, delta_softplus=True)
                return torch.autograd.grad(y, leaves, dout)

            timed = {
                "fwd_ms": lambda: mamba(*args, delta_softplus=True),
                "step_ms": mamba_step,
            }
            _guard_and_time(torch, timer, peer, timed, ref, ("fwd_ms",))
        except Exception as exc:
            peer.update(status="FAILED", note=f"{type(exc).__name__}: {first_line(exc)}"[:160])
        rows.append(peer)
    anchor = SCAN_ANCHORS_MS.get((b, d, L))
    row["mamba_bwd_anchor_ms"] = anchor
    bwd = row.get("bwd_ms")
    row["speedup_vs_anchor"] = None if anchor is None or not bwd else anchor / bwd
    # bytes the backward moves at least: reads u, delta, z, dout and writes du, ddelta, dz
    # (2 bytes each); reads B, C (2 bytes) and writes dB, dC (4 bytes)
    row["min_bytes"] = (b * d * L * 2) * 7 + b * n * L * (2 * 2 + 2 * 4)
    row["bw_floor_ms"] = row["min_bytes"] / 3.0e12 * 1e3
    return rows


def _guard_and_time(
    torch: Any,
    timer: Timer,
    row: dict,
    timed: dict[str, Callable[[], Any]],
    ref: tuple[Any, Any],
    forwards: tuple[str, ...],
) -> None:
    """Check every timed call against the float64 reference (outputs of the `forwards`,
    the gradients of the others), then time each: a failed check marks the row FAILED."""
    ref_out, ref_grads = ref
    pairs = []
    for label, fn in timed.items():
        got = fn()
        if label in forwards:
            pairs.append((f"{label[:-3]} out", first_output(got), ref_out))
        else:
            pairs += [(f"{label[:-3]} {g}", x, r) for g, x, r in zip(SCAN_GRADS, got, ref_grads)]
    ok, err, why = check_outputs(torch, pairs, TOL)
    del pairs
    row["guard_rel_rms"] = err
    if not ok:
        row.update(status="FAILED", note=why[:300])
    for key, fn in timed.items():
        row[key] = _ms(timer, fn)


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _f(v: Any, fmt: str, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


def guard_cell(r: dict) -> str:
    """`ok (1.2e-03)` or `**FAILED** (...)`: a row without a guard value is never ok."""
    err = r.get("guard_rel_rms")
    status = r.get("status", "FAILED")
    text = "not checked" if err is None else f"{err:.1e}"
    return f"{status} ({text})" if status == "ok" else f"**{status}** ({text})"


def render(meta: dict, rows: list[dict]) -> str:
    out = [f"# Backward benchmarks — {meta['date']}", ""]
    out += [f"- device: {meta['device']}; driver {meta['driver']}; torch {meta['torch']}"]
    out += [f"- flashscan {meta['flashscan']} (commit {meta['commit']}); NVRTC {meta['nvrtc']}"]
    out += [f"- command: `{meta['command']}`"]
    if meta.get("mamba_ssm"):
        out += [f"- mamba_ssm: {meta['mamba_ssm']}"]
    out += [""]
    out += ["## Attention forward + backward (bf16, batch·seqlen 16k, nheads·hd 2048)", ""]
    out += ["TFLOP/s in flash-attn's convention; `vs FA2` = SDPA-FA2 step time / ours.", ""]
    out += [
        "Every row is guarded on out, dq, dk, dv against float64 (first/last batch and head); "
        "a peer whose guard failed carries **FAILED** in its cell.",
        "",
    ]
    att = [r for r in rows if r["suite"] == "attention"]
    sm90 = any(r["impl"] == SM90_IMPL for r in att)
    out += [
        "| hd | causal | seqlen | flashscan fwd+bwd | SDPA FA2 fwd+bwd | cuDNN fwd+bwd "
        "| vs FA2 | flashscan fwd | flashscan bwd | FA2 bwd | guard |"
        + (" wgmma bwd fwd+bwd | wgmma bwd | wgmma guard |" if sm90 else "")
    ]
    out += [
        "|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        + ("---:|---:|---|" if sm90 else "")
    ]
    for key in sorted({(r["hd"], r["causal"], r["seqlen"]) for r in att}):
        g = {r["impl"]: r for r in att if (r["hd"], r["causal"], r["seqlen"]) == key}

        def cell(name: str, k: str, g: dict = g) -> str:
            r = g.get(name)
            if r is None or k not in r:
                return "n/a" if r is None or r.get("status") == "n/a" else f"**{r['status']}**"
            mark = "" if r.get("status") == "ok" else f" **{r['status']}**"
            return f"{r[k]:.0f}{mark}"

        fs_r, fa_r = g.get("flashscan", {}), g.get("sdpa-flash", {})
        ratio = "n/a"
        if "step_ms" in fs_r and "step_ms" in fa_r:
            ratio = f"{fa_r['step_ms'] / fs_r['step_ms']:.2f}x"
        out.append(
            f"| {key[0]} | {int(key[1])} | {key[2]} | {cell('flashscan', 'step_tflops')} | "
            f"{cell('sdpa-flash', 'step_tflops')} | {cell('sdpa-cudnn', 'step_tflops')} | "
            f"{ratio} | {cell('flashscan', 'fwd_tflops')} | {cell('flashscan', 'bwd_tflops')} | "
            f"{cell('sdpa-flash', 'bwd_tflops')} | {guard_cell(fs_r)} |"
            + (
                f" {cell(SM90_IMPL, 'step_tflops')} | {cell(SM90_IMPL, 'bwd_tflops')} | "
                f"{guard_cell(g.get(SM90_IMPL, {}))} |"
                if sm90
                else ""
            )
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
        if r["suite"] != "scan" or r["impl"] != "flashscan":
            continue

        def us(key: str, r: dict = r) -> Any:
            v = r.get(key)
            return None if v is None else v * 1e3

        out.append(
            f"| {r['batch']} | {r['dim']} | {r['seqlen']} | {_f(us('bwd_ms'), '.1f', ' us')} | "
            f"{_f(us('bwd_recompute_ms'), '.1f', ' us')} | "
            f"{_f(us('mamba_bwd_anchor_ms'), '.0f', ' us')} | "
            f"{_f(r['speedup_vs_anchor'], '.2f', 'x')} | {_f(us('fwd_ms'), '.1f', ' us')} | "
            f"{_f(us('fwd_saving_ms'), '.1f', ' us')} | {_f(us('step_ms'), '.1f', ' us')} | "
            f"{_f(us('bw_floor_ms'), '.1f', ' us')} | {guard_cell(r)} |"
        )
    out += _mamba_table(rows)
    failed = [r for r in rows if r.get("status") == "FAILED"]
    if failed:
        out += ["", "## Guard failures", ""]
        out += [f"- {r['suite']} {r['impl']} {_shape(r)}: {r.get('note', '')}" for r in failed]
    out.append("")
    return "\n".join(out)


def _mamba_table(rows: list[dict]) -> list[str]:
    """flashscan vs mamba_ssm measured in this run: forward, and one training step (forward +
    backward through each library's autograd function, from Python)."""
    peers = {_shape(r): r for r in rows if r["suite"] == "scan" and r["impl"] == "mamba_ssm"}
    if not peers:
        return []
    out = ["", "### vs mamba_ssm, measured in this run (its own selective_scan_fn)", ""]
    out += ["| batch | dim | seqlen | flashscan fwd | mamba_ssm fwd | speedup | flashscan step "]
    out[-1] += "| mamba_ssm step | speedup | mamba_ssm guard |"
    out += ["|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        m = peers.get(_shape(r))
        if r["suite"] != "scan" or r["impl"] != "flashscan" or m is None:
            continue
        cells = [f"{r['batch']}", f"{r['dim']}", f"{r['seqlen']}"]
        for key in ("fwd_ms", "step_ms"):
            ours, theirs = r.get(key), m.get(key)
            ratio = theirs / ours if ours and theirs else None
            for t in (ours, theirs):
                cells.append(_f(t and t * 1e3, ".1f", " us"))
            cells.append(_f(ratio, ".2f", "x"))
        out.append("| " + " | ".join([*cells, guard_cell(m)]) + " |")
    return out


def _shape(r: dict) -> str:
    if r["suite"] == "attention":
        return f"hd{r['hd']} causal={int(r['causal'])} seqlen {r['seqlen']}"
    return f"b{r['batch']} d{r['dim']} L{r['seqlen']}"


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, *, results_root: str | None = None) -> int:
    """Run the training benchmark; 0, or 1 when a flashscan row FAILED its guard."""
    ap = argparse.ArgumentParser(
        prog="benches/backward.py", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--suite", default="attention,scan")
    ap.add_argument(
        "--mamba-src",
        default=os.environ.get("FLASHSCAN_BENCH_MAMBA_SRC"),
        help="a mamba source checkout: build its CUDA scan and time its selective_scan_fn "
        "(forward and training step) beside ours",
    )
    ap.add_argument("--mamba-build", default=None, help="build directory for --mamba-src")
    ap.add_argument(
        "--sm90-bwd",
        action="store_true",
        help=f"time flashscan with {SM90_BWD_ENV}=0 and =1 (mma.sync vs wgmma backward on sm_90)",
    )
    ap.add_argument(
        "--head-dims",
        default="64,128",
        help="attention head dims, comma-separated (batch x seqlen 16k, nheads x hd 2048)",
    )
    args = ap.parse_args(argv)
    head_dims = tuple(int(x) for x in args.head_dims.split(","))
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark")
        return 0
    import flashscan as fs
    import flashscan.torch  # noqa: F401  (registers torch.ops.flashscan)

    if not fs.available():
        print(f"flashscan's CUDA backend is unavailable: {fs.info()['reason']}")
        return 0
    torch.manual_seed(0)
    timer = Timer(torch, torch.device("cuda", torch.cuda.current_device()), make_config(False))

    def log(s: str) -> None:
        print(s, flush=True)

    log(f"timer: {timer.description}")
    mamba, mamba_note = None, None
    if args.mamba_src:
        built = mamba_src.load(args.mamba_src, args.mamba_build, log)
        mamba_note = f"source commit {built['src_commit']}" + (
            f", built in this run ({built['build_s']} s)"
            if not built["error"]
            else f": build failed ({built['error']})"
        )
        mamba = detect_peers()["mamba_ssm"][0]
    rows: list[dict] = []
    suites = args.suite.split(",")
    if "attention" in suites:
        rows += attention_rows(torch, timer, args.quick, log, args.sm90_bwd, head_dims)
    if "scan" in suites:
        rows += scan_rows(torch, fs, timer, args.quick, log, mamba)
    info = fs.info()
    meta = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "driver": info.get("driver_version"),
        "nvrtc": info.get("nvrtc_version"),
        "torch": torch.__version__,
        "flashscan": fs.__version__,
        "commit": git_commit(fs),
        "command": command_line(repo_root(fs)),
        "python": platform.python_version(),
        "timer": timer.description,
        "mamba_ssm": mamba_note,
    }
    name = torch.cuda.get_device_name()
    gpu = name.split()[1].lower() if " " in name else "gpu"
    root = results_root or os.path.join(os.getcwd(), "benches", "results")
    out_dir = args.out or os.path.join(
        root, f"{meta['date']}-{gpu}-backward" + ("-quick" if args.quick else "")
    )
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(jsonable({"meta": meta, "rows": rows}), f, indent=1)
    md = render(meta, rows)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(md)
    print(md)
    bad = [r for r in rows if r["impl"].startswith("flashscan") and r.get("status") != "ok"]
    if bad:
        print(f"{len(bad)} flashscan row(s) FAILED: " + "; ".join(_shape(r) for r in bad[:5]))
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
