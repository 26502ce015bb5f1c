"""The GPU's ceilings, measured at the start of a run: device copy bandwidth, bf16 matmul rate
and (with Triton) the exp2 rate of the special-function units."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from typing import Any, Callable

from .config import Config
from .fmt import first_line
from .results import Ceilings
from .timing import Timer

_EXP2_SRC = """
import triton
import triton.language as tl


@triton.jit
def exp2_kernel(x_ptr, y_ptr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    # four independent chains of exp2 per element keep the special-function units busy
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(x_ptr + offs)
    b = a + 0.25
    c = a + 0.5
    d = a + 0.75
    for _ in range(ITERS):
        a = tl.exp2(a * -0.5)
        b = tl.exp2(b * -0.5)
        c = tl.exp2(c * -0.5)
        d = tl.exp2(d * -0.5)
    tl.store(y_ptr + offs, a + b + c + d)
"""


def _exp2_rate(torch: Any, device: Any, timer: Timer, iters: int) -> tuple[float | None, str]:
    """exp2 per second of the whole GPU, from a Triton kernel (written to a temporary file:
    Triton reads a kernel's source from its module)."""
    try:
        import triton  # noqa: F401
    except Exception as exc:
        return None, f"triton not importable ({type(exc).__name__})"
    tmp = tempfile.mkdtemp(prefix="flashscan-bench-")
    try:
        path = os.path.join(tmp, "flashscan_bench_exp2.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(_EXP2_SRC)
        spec = importlib.util.spec_from_file_location("flashscan_bench_exp2", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        kernel = mod.exp2_kernel
        block = 1024
        n = 1 << 22
        x = torch.rand(n, device=device, dtype=torch.float32)
        y = torch.empty_like(x)
        grid = (n // block,)

        def launch() -> None:
            kernel[grid](x, y, ITERS=iters, BLOCK=block, num_warps=4)

        launch()
        timer.sync()
        if not bool(torch.isfinite(y).all()):
            return None, "exp2 micro-benchmark produced non-finite values"
        t = timer.gpu(launch)
        return 4.0 * n * iters / t, f"Triton kernel, {n} x {iters} x 4 dependent-chain exp2"
    except Exception as exc:
        return None, f"exp2 micro-benchmark failed ({type(exc).__name__}: {first_line(exc)})"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure_ceilings(
    torch: Any, device: Any, timer: Timer, cfg: Config, log: Callable[[str], None]
) -> Ceilings:
    ceil = Ceilings()
    try:
        n = cfg.copy_bytes // 4
        src = torch.empty(n, dtype=torch.float32, device=device).uniform_(-1.0, 1.0)
        dst = torch.empty_like(src)
        t = timer.gpu(_copy_call(dst, src))
        ceil.copy_bw = 2.0 * n * 4 / t
        ceil.notes["copy_bw"] = f"D2D copy of {n * 4 / 2**20:.0f} MiB, bytes read + written"
        del src, dst
        log(f"ceiling: device copy {ceil.copy_bw / 1e12:.2f} TB/s")
    except Exception as exc:
        ceil.notes["copy_bw"] = f"failed: {type(exc).__name__}: {first_line(exc)}"
        log(f"ceiling: device copy failed ({first_line(exc)})")
    best = 0.0
    for m in cfg.matmul_sizes:
        try:
            a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
            b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
            c = torch.empty(m, m, device=device, dtype=torch.bfloat16)
            t = timer.gpu(_mm_call(torch, a, b, c))
            rate = 2.0 * m**3 / t
            log(f"ceiling: bf16 matmul {m}^3 {rate / 1e12:.0f} TFLOP/s")
            best = max(best, rate)
            del a, b, c
        except Exception as exc:
            log(f"ceiling: bf16 matmul {m}^3 failed ({first_line(exc)})")
    if best:
        ceil.matmul_rate = best
        sizes = ", ".join(f"{m}^3" for m in cfg.matmul_sizes)
        ceil.notes["matmul_rate"] = f"torch.mm bf16, best of {sizes}"
    ceil.exp_rate, ceil.notes["exp_rate"] = _exp2_rate(torch, device, timer, cfg.exp_iters)
    if ceil.exp_rate:
        log(f"ceiling: exp2 {ceil.exp_rate / 1e12:.2f} T/s")
    else:
        log(f"ceiling: exp2 rate not measured ({ceil.notes['exp_rate']})")
    torch.cuda.empty_cache()
    return ceil


def _mm_call(torch: Any, a: Any, b: Any, c: Any) -> Callable[[], Any]:
    return lambda: torch.mm(a, b, out=c)


def _copy_call(dst: Any, src: Any) -> Callable[[], Any]:
    return lambda: dst.copy_(src)
