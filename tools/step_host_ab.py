"""A/B of the eager scan training step's host cost, in one process: the installed
`flashscan.torch` with its native replay plans (C), the same without them (B: every call
through descriptors, `flashscan.scan.REPLAYS_PER_PLAN = 0`), and the `_scan_bwd_lean` of
another version of python/flashscan/torch.py without replays (A, e.g. `git show
REV:python/flashscan/torch.py > old.py`). The GPU host's timings drift by tens of percent
between processes and over seconds, so the variants run in alternating bursts and each row
is the median over bursts. Also timed in the same bursts:
torch's own floor (a no-op autograd.Function over the same inputs) and the step with the
autograd engine on the calling thread (`torch.autograd.set_multithreading_enabled(False)`).
The step: forward + `torch.autograd.grad`, b1 and b32, d512 L60 n16, bf16, D / z /
delta_bias, softplus. Both wall time per call and process CPU time per call (all threads:
the engine's device thread included) are printed.

With `--mamba-src DIR` (a state-spaces/mamba checkout; its CUDA scan is built with torch's
cpp_extension, `flashscan.bench.mamba_src`), mamba_ssm's own eager `selective_scan_fn` step on
the same inputs runs in the same bursts.

    python tools/step_host_ab.py --old-torch old.py [--bursts 40] [--calls 100]
        [--mamba-src DIR [--mamba-build DIR]]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import time
from typing import Any, Callable

import torch

import flashscan
import flashscan.scan
import flashscan.torch as fst
from flashscan.bench.training import floor_function, realtime_scan_args


def load_old_backward(path: str) -> Callable[..., Any]:
    """`_scan_bwd_lean` from another torch.py, bound to the installed module's globals (the
    native entry it calls accepts both the old and the new gradient dtypes)."""
    # plans gained a trailing element (the replay plans): the old unpacking takes the rest
    src = open(path).read().replace("stream, f32 = plan", "stream, f32, *_ = plan")
    tree = ast.parse(src)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_scan_bwd_lean")
    ns = dict(fst.__dict__)
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), ns)  # noqa: S102
    return ns["_scan_bwd_lean"]


FLOOR = floor_function(torch)


def on_caller(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with torch.autograd.set_multithreading_enabled(False):
            return fn()

    return run


def agree(x: Any, y: Any, tol: float) -> bool:
    """max |x - y| within `tol` of y's scale (bf16 gradients of two implementations)."""
    x, y = x.float(), y.float()
    return bool((x - y).abs().max() <= tol * y.abs().max() + 1e-6) and x.shape == y.shape


def set_replays(on: bool) -> None:
    """Replay plans on (the default bound) or off (none kept; those kept dropped)."""
    flashscan.scan.REPLAYS_PER_PLAN = 8 if on else 0
    if not on:
        for plan in flashscan.scan._SCAN_PLANS.values():
            plan[-1].clear()


def burst(fn: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(wall us, process CPU us) per call over `calls` back-to-back calls, synchronised."""
    torch.cuda.synchronize()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - w0) / calls * 1e6, (time.process_time() - c0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--old-torch", required=True, help="a torch.py whose _scan_bwd_lean is A")
    ap.add_argument("--bursts", type=int, default=40)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--mamba-src", help="a state-spaces/mamba checkout: its step as a peer row")
    ap.add_argument("--mamba-build", help="its build directory (default: inside the checkout)")
    args = ap.parse_args()
    old, new = load_old_backward(args.old_torch), fst._scan_bwd_lean
    mamba_fn = None
    if args.mamba_src:
        from flashscan.bench import mamba_src

        info = mamba_src.load(args.mamba_src, args.mamba_build, print)
        print(f"mamba_ssm: {info}")
        if not info["error"]:
            from mamba_ssm.ops.selective_scan_interface import selective_scan_fn as mamba_fn
    rows: dict[str, Callable[[], Any]] = {}
    for b in (1, 32):
        ins = realtime_scan_args(torch, b)
        leaves = [t.clone().requires_grad_() for t in ins]
        dout = torch.randn_like(ins[0])

        def step(lv: Any = leaves, g: Any = dout) -> Any:
            return torch.autograd.grad(fst.selective_scan_fn(*lv, delta_softplus=True), lv, g)

        def with_bwd(
            f: Callable[..., Any], replays: bool, s: Callable[[], Any] = step
        ) -> Callable[[], Any]:
            def run() -> Any:
                if fst._scan_bwd_lean is not f or flashscan.scan.REPLAYS_PER_PLAN != 8 * replays:
                    fst._scan_bwd_lean = f
                    set_replays(replays)
                return s()

            return run

        def fwd(lv: Any = ins) -> Any:
            return flashscan.selective_scan_fn(*lv, delta_softplus=True)

        def floor(lv: Any = leaves, g: Any = dout) -> Any:
            return torch.autograd.grad(FLOOR.apply(*lv), lv, g)

        ga = with_bwd(old, False)()
        for _ in range(3):  # the third call of a signature runs through its replay plans
            gc = with_bwd(new, True)()
        gb = with_bwd(new, False)()
        for x, y, z in zip(ga, gb, gc):  # the variants agree (float32 atomics: summation order)
            assert agree(x, y, 1e-2) and agree(z, y, 1e-2), (x, y, z)
        rows[f"b{b} step, A (old backward)"] = with_bwd(old, False)
        rows[f"b{b} step, B (dB / dC cast)"] = with_bwd(new, False)
        rows[f"b{b} step, C (B + replay plans)"] = with_bwd(new, True)
        rows[f"b{b} step, A, engine on caller"] = on_caller(with_bwd(old, False))
        rows[f"b{b} step, C, engine on caller"] = on_caller(with_bwd(new, True))
        rows[f"b{b} fwd (no grad), B"] = with_bwd(new, False, fwd)
        rows[f"b{b} fwd (no grad), C"] = with_bwd(new, True, fwd)
        rows[f"b{b} torch floor step"] = floor
        rows[f"b{b} torch floor, engine on caller"] = on_caller(floor)
        if mamba_fn is not None:

            def mamba_step(lv: Any = leaves, g: Any = dout, f: Any = mamba_fn) -> Any:
                y = f(*lv[:5], D=lv[5], z=lv[6], delta_bias=lv[7], delta_softplus=True)
                return torch.autograd.grad(y, lv, g)

            for x, y in zip(mamba_step(), gb):  # the peer computes the same gradients
                assert agree(x, y, 5e-2), (x, y)
            rows[f"b{b} mamba_ssm step"] = mamba_step
            rows[f"b{b} mamba_ssm step, engine on caller"] = on_caller(mamba_step)
    for fn in rows.values():  # warm-up (plans, kernels, allocator)
        burst(fn, 50)
    wall: dict[str, list[float]] = {k: [] for k in rows}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.bursts):
        for k, fn in rows.items():
            w, c = burst(fn, args.calls)
            wall[k].append(w)
            cpu[k].append(c)
    fst._scan_bwd_lean = new
    set_replays(True)
    print(
        f"{torch.cuda.get_device_name()}; {args.bursts} alternating bursts of {args.calls} calls; "
        "us per call, median over bursts (25th-75th percentile)"
    )
    print("| row | wall | process CPU |")
    print("|---|---:|---:|")
    for k in rows:
        cells = []
        for v in (wall[k], cpu[k]):
            q = statistics.quantiles(v, n=4)
            cells.append(f"{statistics.median(v):.1f} ({q[0]:.0f}-{q[2]:.0f})")
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
