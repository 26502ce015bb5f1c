#!/usr/bin/env python3
"""Training step per call at the real-time shapes (issue 13): selective scan b{1,32} d512 L60
n16 and causal attention b{1,32} s60 h8 d64, bf16, forward + backward through flashscan.torch:

- eager: `torch.autograd.grad(op(...), leaves, dout)` per call (host-bound: autograd engine,
  allocations, two native entries);
- make_graphed_callables: torch's per-callable graphs (forward and backward graphs, autograd
  glue left in Python);
- whole step in one CUDA graph: forward + backward captured once, replayed (what a real-time
  loop with fixed shapes can do; the per-call cost is then the GPU's).

Each row is guarded before it is timed: the graphed gradients equal eager's on the same
inputs within 2% of each gradient's scale (float32 atomics reorder sums), every value
finite; a failing row prints FAILED. Times: wall per call, best of 3 runs of N calls after
a warm-up, CUDA synchronised.

    python benches/training_step.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

import torch

import flashscan
import flashscan.torch as fst
from flashscan.bench.timing import best_wall_us
from flashscan.bench.training import realtime_scan_args


def wall_us(fn: Callable[[], Any]) -> float:
    return best_wall_us(fn, torch.cuda.synchronize, calls=300, warmup=30)


def scan_case(b: int) -> tuple[Callable[..., Any], list[Any], Any]:
    args = realtime_scan_args(torch, b)

    def op(u: Any, dl: Any, A: Any, B: Any, C: Any, D: Any, z: Any, db: Any) -> Any:
        return fst.selective_scan_fn(u, dl, A, B, C, D, z, db, delta_softplus=True)

    leaves = [t.clone().requires_grad_() for t in args]
    return op, leaves, torch.randn_like(args[0])


def attn_case(b: int) -> tuple[Callable[..., Any], list[Any], Any]:
    q = torch.randn(b, 60, 8, 64, device="cuda", dtype=torch.bfloat16)
    leaves = [t.clone().requires_grad_() for t in (q, torch.randn_like(q), torch.randn_like(q))]

    def op(q: Any, k: Any, v: Any) -> Any:
        return fst.flash_attn_func(q, k, v, causal=True)

    return op, leaves, torch.randn_like(q)


def guard(got: Any, want: Any) -> float:
    """Worst |graphed - eager| / scale over the gradients (inf when one is not finite)."""
    worst = 0.0
    for a, b in zip(got, want):
        if not bool(torch.isfinite(a).all()):
            return float("inf")
        scale = max(b.abs().max().item(), 1e-6)
        worst = max(worst, (a.float() - b.float()).abs().max().item() / scale)
    return worst


def run(name: str, op: Callable[..., Any], leaves: list[Any], dout: Any) -> dict[str, Any]:
    def eager() -> Any:
        return torch.autograd.grad(op(*leaves), leaves, dout)

    want = [g.clone() for g in eager()]
    graphed = torch.cuda.make_graphed_callables(op, tuple(leaves))

    def per_callable() -> Any:
        return torch.autograd.grad(graphed(*leaves), leaves, dout)

    got_pc = [g.clone() for g in per_callable()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = eager()
    graph.replay()
    torch.cuda.synchronize()
    err = max(guard(static, want), guard(got_pc, want))
    ok = err <= 2e-2
    row = {"case": name, "guard_rel": err, "status": "ok" if ok else "FAILED"}
    if ok:
        row.update(
            eager_us=wall_us(eager),
            graphed_callables_us=wall_us(per_callable),
            whole_graph_us=wall_us(graph.replay),
        )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write results.json and results.md here")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not flashscan.available():
        sys.exit(f"needs a GPU flashscan can use: {flashscan.info()['reason']}")
    torch.manual_seed(0)
    rows = []
    for b in (32, 1):
        rows.append(run(f"scan b{b} d512 L60 n16", *scan_case(b)))
        rows.append(run(f"attention b{b} s60 h8 d64 causal", *attn_case(b)))
    dev = torch.cuda.get_device_name()
    commit = os.environ.get("FLASHSCAN_COMMIT", "unknown")
    lines = [
        f"device: {dev}; torch {torch.__version__}; flashscan commit {commit}; bf16; fwd + bwd",
        "",
        "| case | eager step | make_graphed_callables | whole step in a CUDA graph | guard |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['case']} | - | - | - | FAILED ({r['guard_rel']:.1e}) |")
            continue
        lines.append(
            f"| {r['case']} | {r['eager_us']:.1f} us | {r['graphed_callables_us']:.1f} us | "
            f"{r['whole_graph_us']:.1f} us | ok ({r['guard_rel']:.1e}) |"
        )
    print("\n".join(lines), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"device": dev, "commit": commit, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
