"""The markdown report: run metadata, the measured ceilings, how to read the tables, one table per
suite (attention also as a wide peer-by-peer table), the cold-start table, absent peers."""

from __future__ import annotations

import os
from typing import Any

from .config import ANCHOR_LABEL
from .fmt import cell, fmt_rate, fmt_t, fmt_x, rate
from .results import Ceilings, Row


def _speedups(fs_row: Row | None, row: Row) -> tuple[float | None, float | None]:
    """flashscan's speedup over `row` (row time / flashscan time): (by the row's main time,
    by wall time per call). GPU rows compare GPU times; host rows (NumPy) compare their host
    time with flashscan's wall time per call (its GPU time when no wall time was taken);
    rows with a wall time only (anchors given per call from Python) compare wall times."""
    if fs_row is None or fs_row is row or fs_row.status != "ok":
        return None, None
    if row.status not in ("ok", "anchor"):  # a FAILED peer's time means nothing
        return None, None
    mine: float | None = None
    theirs: float | None = None
    if row.gpu_s is not None:
        mine, theirs = fs_row.gpu_s, row.gpu_s
    elif row.cpu_s is not None:
        mine, theirs = fs_row.wall_s or fs_row.gpu_s, row.cpu_s
    elif row.wall_s is not None:
        mine, theirs = fs_row.wall_s, row.wall_s
    by_main = theirs / mine if (theirs and mine) else None
    by_wall = None
    if row.gpu_s is not None and row.wall_s is not None and fs_row.wall_s:
        by_wall = row.wall_s / fs_row.wall_s
    return by_main, by_wall


def shape_groups(rows: list[Row], suite: str) -> list[tuple[str, list[Row]]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        if r.suite == suite:
            out.setdefault(r.shape, []).append(r)
    return list(out.items())


def _fs_of(group: list[Row]) -> Row | None:
    return next((r for r in group if r.kind == "flashscan"), None)


def _status_cell(row: Row) -> str:
    if row.status == "ok":
        return "ok"
    if row.status == "anchor":
        return "**not measured in this run**"
    return f"**{row.status}**" if row.status in ("FAILED", "error") else row.status


def _attention_wide(rows: list[Row]) -> str:
    groups = shape_groups(rows, "attention")
    if not groups:
        return ""
    peers: list[str] = []
    for _, g in groups:
        for r in g:
            if r.kind != "flashscan" and r.impl not in peers:
                peers.append(r.impl)
    head = [
        "headdim",
        "causal",
        "seqlen",
        "batch × heads",
        "floor",
        "flashscan",
        "TFLOP/s",
        "× floor",
    ] + peers
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, g in groups:
        p = g[0].params
        fs = _fs_of(g)
        cells = [
            str(p["headdim"]),
            "yes" if p["causal"] else "no",
            str(p["seqlen"]),
            f"{p['batch']} × {p['nheads']}",
            fmt_t(g[0].floor_s),
        ]
        if fs is None or fs.gpu_s is None:
            cells += [fs.status if fs else "—", "—", "—"]
        else:
            tf, _ = rate(fs, fs.gpu_s)
            mark = "" if fs.status == "ok" else f" **{fs.status}**"
            cells += [
                fmt_t(fs.gpu_s) + mark,
                fmt_rate(tf),
                f"{fs.gpu_s / fs.floor_s:.2f}" if fs.floor_s else "—",
            ]
        by_impl = {r.impl: r for r in g}
        for name in peers:
            r = by_impl.get(name)
            if r is None:
                cells.append("—")
            elif r.gpu_s is None and r.cpu_s is None:
                cells.append(r.status)
            else:
                t = r.main_s
                tf, _ = rate(r, t)
                sp, _ = _speedups(fs, r)
                txt = f"{fmt_rate(tf)}" + (f" ({fmt_x(sp)})" if sp else "")
                if r.cpu_s is not None:
                    txt = f"{fmt_t(r.cpu_s)} CPU" + (f" ({fmt_x(sp)})" if sp else "")
                if r.status != "ok":
                    txt += f" **{r.status}**"
                cells.append(txt)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _long_table(rows: list[Row], suite: str) -> str:
    groups = shape_groups(rows, suite)
    if not groups:
        return ""
    head = [
        "shape",
        "impl",
        "status",
        "GPU time",
        "rate",
        "floor (bound)",
        "× floor",
        "wall / call",
        "call + sync",
        "graph GPU",
        "graph wall",
        "flashscan speedup",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, g in groups:
        fs = _fs_of(g)
        for i, r in enumerate(g):
            t = r.main_s
            v, unit = rate(r, r.gpu_s)
            floor = f"{fmt_t(r.floor_s)} ({r.floor_bound})" if r.floor_s else "—"
            xfloor = f"{r.gpu_s / r.floor_s:.2f}" if (r.gpu_s and r.floor_s) else "—"
            gpu = fmt_t(r.gpu_s) if r.cpu_s is None else f"{fmt_t(r.cpu_s)} (CPU)"
            sp_main, sp_wall = _speedups(fs, r)
            sp = []
            if sp_main is not None:
                sp.append(f"{fmt_x(sp_main)}" + (" GPU" if r.gpu_s is not None else " wall"))
            if sp_wall is not None:
                sp.append(f"{fmt_x(sp_wall)} wall")
            status = _status_cell(r)
            if r.note:
                note = r.note if len(r.note) <= 100 else r.note[:97] + "..."
                status += f" ({cell(note)})"
            lines.append(
                "| "
                + " | ".join(
                    [
                        shape if i == 0 else "",
                        r.impl,
                        status,
                        gpu if t is not None else "—",
                        f"{fmt_rate(v)} {unit}" if v else "—",
                        floor,
                        xfloor,
                        fmt_t(r.wall_s),
                        fmt_t(r.sync_s),
                        fmt_t(r.graph_s),
                        fmt_t(r.graph_wall_s),
                        " / ".join(sp) if sp else "—",
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def _cold_table(cold: list[dict[str, Any]]) -> str:
    head = [
        "op",
        "phase",
        "process wall",
        "import torch",
        "import",
        "first call",
        "import → first result",
        "second call",
        "cache files",
        "correct",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cold:
        if "error" in c:
            lines.append(
                f"| {c['op']} | {c['phase']} | {fmt_t(c.get('process_s'))} | "
                f"**error**: {cell(c['error'])} |" + " |" * (len(head) - 4)
            )
            continue
        files = c.get("cache_files")
        cache = "—" if files is None else f"{files} ({c.get('cache_bytes', 0) / 1e6:.1f} MB)"
        lines.append(
            "| "
            + " | ".join(
                [
                    c["op"],
                    c["phase"],
                    fmt_t(c.get("process_s")),
                    fmt_t(c.get("import_torch_s")),
                    fmt_t(c.get("import_s")),
                    fmt_t(c.get("first_call_s")),
                    fmt_t(c.get("import_to_first_result_s")),
                    fmt_t(c.get("second_call_s")),
                    cache,
                    "yes" if c.get("check", {}).get("ok") else "**no**",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def render_markdown(
    meta: dict[str, Any],
    ceil: Ceilings,
    rows: list[Row],
    cold: list[dict[str, Any]] | None,
    peers: dict[str, tuple[Any, str]],
    plots: list[str],
) -> str:
    cfg_quick = meta.get("quick")
    out: list[str] = []
    out.append(
        f"# flashscan benchmark: {meta.get('device', '?')}, {meta.get('date', '?')}"
        + (" (quick)" if cfg_quick else "")
    )
    out.append("")
    for key, label in (
        ("device", "device"),
        ("compute_capability", "compute capability"),
        ("driver", "driver"),
        ("torch", "torch"),
        ("torch_cuda", "torch CUDA"),
        ("cudnn", "cuDNN"),
        ("triton", "triton"),
        ("python", "python"),
        ("flashscan", "flashscan"),
        ("flashscan_commit", "flashscan commit"),
        ("flashscan_backend", "flashscan backend"),
        ("nvrtc", "NVRTC"),
        ("mamba_ssm_source", "mamba_ssm"),
        ("date_utc", "date (UTC)"),
        ("command", "command"),
        ("timer", "GPU timer"),
    ):
        if meta.get(key) is not None:
            val = meta[key]
            out.append(f"- {label}: " + (f"`{val}`" if key == "command" else str(val)))
    out.append("")
    out.append("## Ceilings measured at the start of this run")
    out.append("")
    out.append("| ceiling | measured | how |")
    out.append("|---|---|---|")
    out.append(
        f"| device copy bandwidth | "
        f"{'—' if not ceil.copy_bw else f'{ceil.copy_bw / 1e12:.2f} TB/s'} | "
        f"{ceil.notes.get('copy_bw', '')} |"
    )
    out.append(
        f"| bf16 matmul | "
        f"{'—' if not ceil.matmul_rate else f'{ceil.matmul_rate / 1e12:.0f} TFLOP/s'} | "
        f"{ceil.notes.get('matmul_rate', '')} |"
    )
    out.append(
        f"| exp2 (special-function units) | "
        f"{'—' if not ceil.exp_rate else f'{ceil.exp_rate / 1e12:.2f} T/s'} | "
        f"{ceil.notes.get('exp_rate', '')} |"
    )
    out.append("")
    out.append("## How to read the tables")
    out.append("")
    out.append(
        "- Times are per call. **GPU time**: median of per-call CUDA-event timings with the L2 "
        "cache flushed before each call; inputs rotate among several random sets when one set "
        "would fit in L2. **wall / call**: `time.perf_counter()` around many back-to-back calls "
        "from Python closed by one `torch.cuda.synchronize()`, divided by the number of calls "
        "(what a caller pays per call, CPU overhead included). **call + sync**: median wall "
        "time of one call followed by a synchronize (a frame-by-frame caller waiting for its "
        "result). **graph GPU / graph wall**: the same call captured in a CUDA graph (flashscan "
        "attention with `out=` given; other calls allocate from the graph's pool), per replay; "
        "a graph's output is poisoned with NaN, replayed and compared with an eager call (an "
        "in-place call, the state update: with the float64 reference from the restored state)."
    )
    out.append(
        "- **floor** = max(FLOPs / bf16 matmul rate, bytes / copy bandwidth, exponentials / "
        "exp2 rate), with the ceilings above; the bound named is the largest term. **× floor** "
        "= GPU time / floor (1.00 would be at the ceiling)."
    )
    out.append(
        "- Attention: FLOPs = 4·b·h·sq·sk·d, halved when causal; bytes = q, k, v read once + "
        "out written once. Selective scan: bytes = u, delta, z read + out written (u's dtype), "
        "B and C (batch, dstate, seqlen) read, A (dim, dstate) and D (dim) fp32 read; "
        "exponentials = b·dim·seqlen·dstate. State update: bytes = fp32 state read + written, "
        "x, dt, z read + out written, B, C read, A, D, dt_bias read; exponentials = "
        "b·dim·dstate. Rates (TFLOP/s, GB/s) = those counts / GPU time."
    )
    out.append(
        "- **flashscan speedup** = peer time / flashscan time (above 1: flashscan is faster). "
        "Host rows (numpy-ref) and anchors given as time per call from Python are compared "
        "with flashscan's wall time per call."
    )
    out.append(
        "- Every row was checked before timing against a float64 torch reference (query rows "
        "spread over the sequence; scan channels sampled at large shapes) with a loose "
        "tolerance (relative RMS error <= 2e-2 bf16, 1e-2 fp16, 5e-3 fp32); **FAILED** marks "
        "a row whose output is off: its time means nothing."
    )
    out.append(
        f"- Rows labelled **{ANCHOR_LABEL}** are mamba_ssm figures measured on the project's "
        "H100 on 2026-11-22 and recorded in issue 4; they were **not measured in this run** "
        "and are shown so that the tables compare with mamba_ssm where it is not installed."
    )
    out.append(
        "- Slow peers only where they are not absurd: SDPA's math backend where "
        "b·h·sq·sk <= 2^28, the plain torch scan (torch-loop, one kernel per time step) at "
        "seqlen <= 256, the NumPy reference (numpy-ref, on the CPU) at tiny shapes. A peer "
        "that is not installed has no row (listed at the end)."
    )
    out.append("")
    for err in meta.get("errors") or []:
        out.append(f"**{err}**")
        out.append("")
    sections = (
        ("attention", "Attention forward (bf16, batch·seqlen = 16384, nheads·headdim = 2048)"),
        ("latency", "Real-time latency: attention at seqlen 60, 8 heads, headdim 64"),
        ("scan", "Selective scan (delta_softplus, D, z, B/C varying)"),
        ("state_update", "State update (one decode step, dt_bias, dt_softplus, D, z)"),
    )
    for suite, title in sections:
        if not any(r.suite == suite for r in rows):
            continue
        out.append(f"## {title}")
        out.append("")
        if suite == "attention":
            out.append("Peer cells: the peer's TFLOP/s (flashscan speedup).")
            out.append("")
            out.append(_attention_wide(rows))
            out.append("")
            out.append("<details><summary>all attention rows</summary>")
            out.append("")
            out.append(_long_table(rows, suite))
            out.append("")
            out.append("</details>")
        else:
            out.append(_long_table(rows, suite))
        out.append("")
    if cold is not None:
        out.append("## Cold start: fresh process to first correct result")
        out.append("")
        out.append(
            "Attention: batch 32, seqlen 60, 8 heads, headdim 64, bf16, causal. Scan: batch 32, "
            "dim 512, seqlen 60, dstate 16, bf16. flashscan runs twice with FLASHSCAN_CACHE_DIR "
            "set to one new directory: empty (NVRTC compiles) and then filled by the first run "
            "(kernels loaded from disk). **import → first result** is import of the package + "
            "the first call + synchronize (torch already imported and its CUDA context made). "
            "Installing or building the peers' wheels is not measured here."
        )
        out.append("")
        out.append(_cold_table(cold))
        out.append("")
    absent = [f"{name} ({why})" for name, (fn, why) in peers.items() if fn is None]
    if absent:
        out.append("## Peers not present in this environment (skipped)")
        out.append("")
        out.extend(f"- {a}" for a in absent)
        out.append("")
    if plots:
        out.append("## Plots")
        out.append("")
        out.extend(f"![{os.path.splitext(p)[0]}]({p})" for p in plots)
        out.append("")
    if meta.get("interrupted"):
        out.append("**The run was interrupted: the tables above are partial.**")
        out.append("")
    return "\n".join(out)
