"""`python -m flashscan bench`: parse the options, run the ceilings and the suites, write
results.md, results.json and the plots."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any, Callable

from . import mamba_src
from .ceilings import measure_ceilings
from .cold import run_cold_start
from .config import ANCHOR_LABEL, ANCHORS, SUITES, make_config
from .fmt import first_line
from .meta import collect_meta, slug
from .peers import detect_peers
from .plots import write_plots
from .report import render_markdown
from .results import Ceilings, jsonable
from .runner import Runner
from .suites import SUITE_RUNS
from .timing import Timer


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="flashscan bench",
        description="Time flashscan against every peer present (torch SDPA backends, flash-attn, "
        "mamba_ssm, plain torch, the NumPy reference) in one run on this GPU; write a markdown "
        "table, a JSON of raw numbers and PNG plots.",
    )
    p.add_argument("--quick", action="store_true", help="a subset that runs in about a minute")
    p.add_argument(
        "--suite",
        default="all",
        help="comma-separated suites: attention, latency, scan, state_update; 'all' (default) "
        "or 'none' (with --cold-start: only that)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default: benches/results/<YYYY-MM-DD>-<gpu>[-quick]/)",
    )
    p.add_argument(
        "--cold-start",
        action="store_true",
        help="also time fresh processes from import to first correct result, with an empty "
        "and then a warm FLASHSCAN_CACHE_DIR",
    )
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    p.add_argument(
        "--mamba-src",
        default=os.environ.get("FLASHSCAN_BENCH_MAMBA_SRC"),
        metavar="DIR",
        help="a mamba (state-spaces/mamba) source checkout: build its CUDA selective scan here "
        "(nvcc + ninja) and time it and its Triton state update as measured peers "
        "(default: $FLASHSCAN_BENCH_MAMBA_SRC; without it, an installed mamba_ssm if any)",
    )
    p.add_argument(
        "--mamba-build",
        default=None,
        metavar="DIR",
        help="build directory for --mamba-src (default: DIR/.flashscan-build; reused when present)",
    )
    p.add_argument("--seed", type=int, default=0, help="torch random seed (default 0)")
    args = p.parse_args(argv)
    names = [s.strip() for s in args.suite.split(",") if s.strip()]
    if names == ["all"]:
        args.suites = list(SUITES)
    elif names == ["none"]:
        args.suites = []
    else:
        bad = [n for n in names if n not in SUITES]
        if bad or not names:
            p.error(
                f"--suite: unknown {', '.join(bad) or 'empty'} (choose from "
                f"{', '.join(SUITES)}, all, none)"
            )
        args.suites = [s for s in SUITES if s in names]
    return args


def _log_to_stderr(start: float) -> Callable[[str], None]:
    def log(msg: str) -> None:
        line = f"[{time.perf_counter() - start:7.1f}s] {msg}"
        try:
            print(line, file=sys.stderr, flush=True)
        except UnicodeEncodeError:
            print(line.encode("ascii", "replace").decode("ascii"), file=sys.stderr, flush=True)

    return log


def _print_out(text: str) -> None:
    try:
        print(text, flush=True)
    except UnicodeEncodeError:
        print(text.encode("ascii", "replace").decode("ascii"), flush=True)


def main(argv: list[str] | None = None, *, results_root: str | None = None) -> int:
    """Run the harness; returns the process exit status (0; 1 when a flashscan row FAILED its
    correctness guard or raised; 130 when interrupted). `results_root` is where the default
    output directory goes (default: ./benches/results)."""
    args = _parse(argv)
    try:
        import torch
    except Exception as exc:
        _print_out(
            f"flashscan bench: torch is not importable ({type(exc).__name__}: {first_line(exc)}); "
            "the harness times CUDA kernels on torch tensors, so there is nothing to do here."
        )
        return 0
    if not torch.cuda.is_available():
        _print_out(
            "flashscan bench: no CUDA GPU is visible (torch.cuda.is_available() is False); "
            "nothing to benchmark on this machine."
        )
        return 0
    import flashscan

    saved = os.environ.get("FLASHSCAN_FALLBACK")
    os.environ["FLASHSCAN_FALLBACK"] = "error"  # never time the host fallback by accident
    try:
        return _run(args, torch, flashscan, results_root)
    finally:
        if saved is None:
            os.environ.pop("FLASHSCAN_FALLBACK", None)
        else:
            os.environ["FLASHSCAN_FALLBACK"] = saved


def _run(args: argparse.Namespace, torch: Any, fs: Any, results_root: str | None) -> int:
    start = time.perf_counter()
    log = _log_to_stderr(start)
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(args.seed)
    cfg = make_config(args.quick)
    timer = Timer(torch, device, cfg)
    meta = collect_meta(torch, fs, device, timer, args.quick)
    meta["seed"] = args.seed
    meta["suites"] = args.suites
    root = results_root or os.path.join(os.getcwd(), "benches", "results")
    out_dir = args.out or os.path.join(
        root, f"{meta['date']}-{slug(meta['device'])}" + ("-quick" if args.quick else "")
    )
    fs_ok = False
    fs_reason = ""
    try:
        fs_ok = bool(fs.available())
        if not fs_ok:
            fs_reason = str(fs.info().get("reason") or "flashscan.available() is False")
    except Exception as exc:
        fs_reason = f"flashscan.available() raised {type(exc).__name__}: {first_line(exc)}"
    log(
        f"device {meta['device']} (sm {meta['compute_capability']}), torch {torch.__version__}, "
        f"flashscan {meta['flashscan']} from {meta['flashscan_file']}"
    )
    if not fs_ok:
        log(
            f"WARNING: flashscan's CUDA backend is unavailable ({fs_reason}); its rows are "
            "skipped, the peers are still timed"
        )
    if args.mamba_src:
        built = mamba_src.load(args.mamba_src, args.mamba_build, log)
        meta["mamba_ssm_source"] = (
            f"source commit {built['src_commit']}, built in this run ({built['build_s']} s)"
            if not built["error"]
            else f"source commit {built['src_commit']}: build failed ({built['error']})"
        )
    peers = detect_peers()
    for name, (fn, why) in peers.items():
        log(f"peer {name}: " + ("found" if fn is not None else f"absent ({why})"))
    log(f"timer: {timer.description}")

    interrupted = False
    ceil = Ceilings()
    runner: Runner | None = None
    cold: list[dict[str, Any]] | None = None
    try:
        ceil = measure_ceilings(torch, device, timer, cfg, log)
        runner = Runner(torch, fs, device, cfg, timer, ceil, fs_ok, fs_reason, peers, log)
        for suite in args.suites:
            try:
                SUITE_RUNS[suite](runner)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # a bug here must not lose the other suites' rows
                msg = f"suite {suite} aborted: {type(exc).__name__}: {first_line(exc)}"
                log(msg)
                meta.setdefault("errors", []).append(msg)
        if args.cold_start:
            cold = run_cold_start(fs, peers, log)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: writing what was measured so far")
    rows = runner.rows if runner is not None else []
    meta["interrupted"] = interrupted
    meta["elapsed_s"] = round(time.perf_counter() - start, 1)

    os.makedirs(out_dir, exist_ok=True)
    plots: list[str] = []
    if not args.no_plots:
        try:
            plots, why = write_plots(rows, out_dir, meta, ceil)
            if why:
                log(why)
        except Exception as exc:
            log(f"plots failed: {type(exc).__name__}: {first_line(exc)}")
    report = render_markdown(meta, ceil, rows, cold, peers, plots)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    doc = {
        "meta": meta,
        "ceilings": dataclasses.asdict(ceil),
        "config": dataclasses.asdict(cfg),
        "peers": {
            k: {"present": fn is not None, "why_absent": why} for k, (fn, why) in peers.items()
        },
        "rows": [dataclasses.asdict(r) for r in rows],
        "cold_start": cold,
        "anchors": [
            {
                "suite": s,
                "shape": list(k),
                "seconds": t,
                "column": c,
                "what": w,
                "source": ANCHOR_LABEL,
            }
            for s, k, t, c, w in ANCHORS
        ],
    }
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(jsonable(doc), f, indent=1)
        f.write("\n")
    _print_out(report)
    log(f"wrote {out_dir}/results.md, results.json" + (", " + ", ".join(plots) if plots else ""))
    bad = [r for r in rows if r.kind == "flashscan" and r.status in ("FAILED", "error")]
    if bad:
        log(
            f"{len(bad)} flashscan row(s) FAILED or raised: "
            + "; ".join(f"{r.suite} {r.shape}: {r.status}" for r in bad[:5])
        )
    if interrupted:
        return 130
    return 1 if bad else 0
