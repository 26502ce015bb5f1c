#!/usr/bin/env python3
"""Selective-scan forward tile sweep: kernel time of each `nsplit,tile,threads,min_blocks[,cpt]`
plan at the given shapes, every plan's output checked against the default plan's. GPU only.

    python tools/scan_tile_sweep.py --shapes rt32,rt1,2k --configs 1,8,128,2 2,16,128,4,2 [--out F]
    python tools/scan_tile_sweep.py --bwd --shapes 2k --configs 8,16,256,2 4,8,128,4

The scan reads its tile override (FLASHSCAN_SCAN_TILES, with --bwd the backward's
FLASHSCAN_SCAN_BWD_TILES; the forward's takes a fifth number, `cpt`, the channels a lane group
owns: FS_CPT) once per process, so the parent runs one child process per (shape,
plan): the default plan first (it saves its output), then each plan. A child times the forward
(bf16, D, z, delta_bias, softplus, varying B / C, dstate 16; --bwd: the backward kernels of
`flashscan.torch.selective_scan_fn` under `torch.autograd.grad`) by torch.profiler's kernel time
per call (mean over --reps calls) and, forward only, by CUDA-graph replay, and prints one JSON
line: plan, us, graph us, the max |out - default| over max |default| (--bwd: the largest such
ratio over du, ddelta, dA, dB, dC; a plan whose difference exceeds 1e-2 of the scale, or whose
result is not finite, is marked "FAIL"). A plan that does not fit the dstate (the scan raises
ValueError) prints "unfit".

A plan may carry environment settings after an `@` (`;` between them), for the kernel's other
measurement switches: `4,16,128,4@FLASHSCAN_SCAN_TAIL=2`, or `@FLASHSCAN_SCAN_TAIL=2` for the
default tiles with the switch; it is checked against the plain default plan like any other.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping

SHAPES = {
    # batch, dim, seqlen (dstate 16): issue 13's real-time and large shapes
    "rt32": (32, 512, 60),
    "rt16": (16, 512, 60),
    "rt8": (8, 512, 60),
    "rt1": (1, 512, 60),
    "2k": (8, 2048, 2048),
    "8k": (8, 2048, 8192),
    "16k": (2, 5120, 16384),
}


def child(shape: str, ref: str, save: bool, reps: int, bwd: bool) -> None:
    import numpy as np
    import torch

    import flashscan
    from flashscan.bench.timing import kernel_us

    b, d, L = SHAPES[shape]
    n = 16
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16

    def rnd(*s: int) -> torch.Tensor:
        return torch.randn(*s, device="cuda", generator=g)

    u = rnd(b, d, L).to(dt)
    delta = (rnd(b, d, L) * 0.5 - 1.0).to(dt)
    A = -torch.rand(d, n, device="cuda", generator=g) * 2 - 0.1
    B = rnd(b, 1, n, L).to(dt)
    C = rnd(b, 1, n, L).to(dt)
    D = rnd(d)
    z = rnd(b, d, L).to(dt)
    bias = rnd(d) * 0.1

    def call() -> torch.Tensor:
        return flashscan.selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=True)

    if bwd:
        import flashscan.torch as fst

        leaves = [t.detach().requires_grad_() for t in (u, delta, A, B, C)]
        dout = rnd(b, d, L).to(dt)

        def call() -> tuple[torch.Tensor, ...]:  # noqa: F811 (the timed call of --bwd)
            y = fst.selective_scan_fn(*leaves, D, z, bias, delta_softplus=True)
            return torch.autograd.grad(y, leaves, dout)

    try:
        res = call()
    except ValueError as e:
        print(json.dumps({"shape": shape, "status": "unfit", "error": str(e)}))
        return
    torch.cuda.synchronize()
    outs = [t.float().cpu().numpy() for t in (res if bwd else (res,))]
    row: dict[str, object] = {"shape": shape}
    if save:
        np.savez(ref, *outs)
        row["max_rel_diff"] = 0.0
    else:
        refs = np.load(ref)
        row["max_rel_diff"] = max(
            float(np.abs(o - r).max() / max(np.abs(r).max(), 1e-30))
            for o, r in zip(outs, [refs[k] for k in refs.files])
        )
    finite = all(bool(np.isfinite(o).all()) for o in outs)
    ok = finite and row["max_rel_diff"] <= 1e-2  # type: ignore[operator]
    row["status"] = "ok" if ok else "FAIL"
    name = "selective_scan_bwd" if bwd else "selective_scan"
    kern = kernel_us(torch, call, reps, warm=5, keep=lambda key: name in key)
    row["kernel_us"] = round(kern, 2)
    if bwd:
        print(json.dumps(row))
        return
    # Graph replay: 20 calls per graph, 10 replays (tools/profile_overhead.py's timer)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from profile_overhead import graph_us

    row["graph_us"] = round(graph_us(call, n=10), 2)
    print(json.dumps(row))


def plan_env(cfg: str, var: str, base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment for a plan: `base` without `var`, then the plan's tiles in `var`
    (none for "default" or a plan that starts with `@`) and its `@VAR=value;...` settings."""
    env = dict(base)
    env.pop(var, None)
    tiles, _, sets = cfg.partition("@")
    if cfg != "default" and tiles:
        env[var] = tiles
    for kv in filter(None, sets.split(";")):
        k, sep, v = kv.partition("=")
        if not k or not sep:
            raise ValueError(f"plan {cfg!r}: want VAR=value after '@', got {kv!r}")
        env[k] = v
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="rt32,rt1")
    ap.add_argument("--configs", nargs="*", default=[])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="")
    ap.add_argument("--child", default="")
    ap.add_argument("--ref", default="")
    ap.add_argument("--save", action="store_true")
    ap.add_argument(
        "--bwd", action="store_true", help="time the backward (FLASHSCAN_SCAN_BWD_TILES)"
    )
    a = ap.parse_args()
    if a.child:
        child(a.child, a.ref, a.save, a.reps, a.bwd)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes.split(","):
            ref = os.path.join(tmp, f"{shape}.npz")
            for cfg in ["default", *a.configs]:
                var = "FLASHSCAN_SCAN_BWD_TILES" if a.bwd else "FLASHSCAN_SCAN_TILES"
                env = plan_env(cfg, var, os.environ)
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    shape,
                    "--ref",
                    ref,
                    "--reps",
                    str(a.reps),
                ]
                if a.bwd:
                    cmd.append("--bwd")
                if cfg == "default":
                    cmd.append("--save")
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
                row = (
                    json.loads(lines[-1])
                    if lines
                    else {"shape": shape, "status": "error", "stderr": r.stderr[-400:]}
                )
                row["config"] = cfg
                rows.append(row)
                print(json.dumps(row), flush=True)
                if cfg == "default" and row.get("status") != "ok":
                    break  # no reference to check the plans against
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
