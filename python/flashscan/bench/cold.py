"""Cold start: fresh processes from import to first correct result, flashscan with an empty and
then a warm kernel cache (FLASHSCAN_CACHE_DIR), the peers once each."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from .guards import GUARD_RMS, compare
from .peers import first_output
from .references import attention_rows_reference, torch_selective_scan

_COLD_CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
import torch
t_torch = time.perf_counter()
op = sys.argv[1]
dev = torch.device("cuda")
g = torch.Generator(device=dev)
g.manual_seed(0)
def rn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=dev, dtype=dtype, generator=g)
if op in ("attention", "sdpa", "flash-attn"):
    inputs = {"q": rn(32, 60, 8, 64), "k": rn(32, 60, 8, 64), "v": rn(32, 60, 8, 64)}
else:
    b, d, L, n = 32, 512, 60, 16
    inputs = {
        "u": rn(b, d, L), "delta": rn(b, d, L) * 0.5 - 1.0,
        "A": -(torch.rand(d, n, device=dev, generator=g) + 0.5),
        "B": rn(b, n, L), "C": rn(b, n, L),
        "D": torch.randn(d, device=dev, generator=g), "z": rn(b, d, L),
    }
a = inputs
torch.cuda.synchronize()
t_inputs = time.perf_counter()
if op == "attention":
    import flashscan
    call = lambda: flashscan.flash_attn_func(a["q"], a["k"], a["v"], causal=True)
elif op == "scan":
    import flashscan
    call = lambda: flashscan.selective_scan_fn(
        a["u"], a["delta"], a["A"], a["B"], a["C"], a["D"], a["z"], delta_softplus=True)
elif op == "sdpa":
    import torch.nn.functional as F
    qt, kt, vt = (a[x].transpose(1, 2) for x in "qkv")
    call = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)
elif op == "flash-attn":
    from flash_attn import flash_attn_func
    call = lambda: flash_attn_func(a["q"], a["k"], a["v"], causal=True)
elif op == "mamba_ssm":
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    call = lambda: selective_scan_fn(
        a["u"], a["delta"], a["A"], a["B"], a["C"], a["D"], a["z"], delta_softplus=True)
else:
    raise SystemExit("unknown op " + op)
t_import = time.perf_counter()
out = call()
torch.cuda.synchronize()
t_first = time.perf_counter()
out2 = call()
torch.cuda.synchronize()
t_second = time.perf_counter()
from flashscan.bench.cold import cold_check
check = cold_check(op, inputs, out)
print("FLASHSCAN_COLD_START " + json.dumps({
    "import_torch_s": t_torch - t_start,
    "inputs_s": t_inputs - t_torch,
    "import_s": t_import - t_inputs,
    "first_call_s": t_first - t_import,
    "import_to_first_result_s": t_first - t_inputs,
    "second_call_s": t_second - t_first,
    "check": check,
}), flush=True)
"""


def cold_check(op: str, inputs: dict[str, Any], out: Any) -> dict[str, Any]:
    """Used by the cold-start child after its timings: the result against float64."""
    import torch

    out = first_output(out)
    if op in ("attention", "sdpa", "flash-attn"):
        q = inputs["q"]
        rows = torch.arange(q.shape[1], device=q.device)
        bidx = list(range(q.shape[0]))
        ref = attention_rows_reference(torch, q, inputs["k"], inputs["v"], True, bidx, rows)
        ok, m = compare(torch, out, ref, GUARD_RMS["bf16"])
    else:
        ref, _ = torch_selective_scan(torch, **inputs, delta_softplus=True, acc=torch.float64)
        ok, m = compare(torch, out, ref, GUARD_RMS["bf16"])
    m["ok"] = ok
    return m


def _dir_stats(path: str) -> tuple[int, int]:
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for nm in names:
            files += 1
            with contextlib.suppress(OSError):
                size += os.path.getsize(os.path.join(root, nm))
    return files, size


def run_cold_start(
    fs: Any, peers: dict[str, tuple[Any, str]], log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """flashscan: a fresh process with FLASHSCAN_CACHE_DIR empty (cold), then the same dir
    again (warm). Peers: one fresh process each (they have no run-time compile cache)."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(fs.__file__)))
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pkg_parent, base_env.get("PYTHONPATH", "")) if p
    )
    base_env["FLASHSCAN_FALLBACK"] = "error"
    base_env["PYTHONUNBUFFERED"] = "1"
    plan: list[tuple[str, str, str | None]] = []
    dirs: list[str] = []
    for op in ("attention", "scan"):
        d = tempfile.mkdtemp(prefix=f"flashscan-cold-{op}-")
        dirs.append(d)
        plan += [(op, "cold (empty cache)", d), (op, "warm (disk cache)", d)]
    plan.append(("sdpa", "fresh process", None))
    if peers.get("flash-attn", (None, ""))[0] is not None:
        plan.append(("flash-attn", "fresh process", None))
    if peers.get("mamba_ssm", (None, ""))[0] is not None:
        plan.append(("mamba_ssm", "fresh process", None))
    results: list[dict[str, Any]] = []
    try:
        for op, phase, cache in plan:
            env = dict(base_env)
            if cache is not None:
                env["FLASHSCAN_CACHE_DIR"] = cache
            res: dict[str, Any] = {"op": op, "phase": phase}
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", _COLD_CHILD, op],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                res["process_s"] = time.perf_counter() - t0
                line = next(
                    (
                        ln
                        for ln in proc.stdout.splitlines()
                        if ln.startswith("FLASHSCAN_COLD_START ")
                    ),
                    None,
                )
                if proc.returncode != 0 or line is None:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                    res["error"] = f"exit {proc.returncode}: " + " | ".join(tail)[-300:]
                else:
                    res.update(json.loads(line.split(" ", 1)[1]))
            except subprocess.TimeoutExpired:
                res["error"] = "timed out after 600 s"
            if cache is not None:
                res["cache_files"], res["cache_bytes"] = _dir_stats(cache)
            results.append(res)
            if "error" in res:
                log(f"cold-start   {op:<12} {phase:<20} error: {res['error']}")
            else:
                log(
                    f"cold-start   {op:<12} {phase:<20} import -> first result "
                    f"{res['import_to_first_result_s'] * 1e3:.0f} ms "
                    f"(first call {res['first_call_s'] * 1e3:.0f} ms, "
                    f"correct: {res['check'].get('ok')})"
                )
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    return results
