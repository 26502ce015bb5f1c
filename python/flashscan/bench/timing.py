"""How a call is timed: GPU time from CUDA events (or triton's do_bench), wall time per call from
Python, call + synchronize, host time; and the rotation over input sets that defeats the L2."""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any, Callable

from .config import Config


class Timer:
    """GPU time: median of per-call CUDA-event timings, L2 flushed before each call
    (triton.testing.do_bench(return_mode="median") when importable, else the same with torch
    events). Wall time: perf_counter around back-to-back calls closed by one synchronize."""

    def __init__(self, torch: Any, device: Any, cfg: Config) -> None:
        self.torch, self.device, self.cfg = torch, device, cfg
        self._do_bench: Callable[..., Any] | None = None
        self._flush: Any = None
        self.description = (
            "CUDA events (torch), median of per-call timings, 256 MB L2 flush before each call"
        )
        try:
            import inspect

            from triton.testing import do_bench

            if "return_mode" in inspect.signature(do_bench).parameters:
                import triton

                self._do_bench = do_bench
                self.description = (
                    f"triton.testing.do_bench (triton {getattr(triton, '__version__', '?')}, "
                    f"warmup {cfg.warmup_ms} ms, rep {cfg.rep_ms} ms, return_mode='median', "
                    f"L2 flushed before each call)"
                )
        except Exception:
            self._do_bench = None

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def gpu(self, fn: Callable[[], Any]) -> float:
        """Median GPU seconds per call of fn."""
        if self._do_bench is not None:
            ms = self._do_bench(
                fn, warmup=self.cfg.warmup_ms, rep=self.cfg.rep_ms, return_mode="median"
            )
            return float(ms) * 1e-3
        return self._events(fn)

    def _events(self, fn: Callable[[], Any]) -> float:
        torch = self.torch
        if self._flush is None:
            self._flush = torch.empty(256 * 2**20, dtype=torch.int8, device=self.device)
        flush = self._flush
        fn()
        self.sync()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            flush.zero_()
            fn()
        end.record()
        self.sync()
        est_ms = max(start.elapsed_time(end) / 5, 1e-3)
        n_warm = max(1, int(self.cfg.warmup_ms / est_ms))
        n_rep = max(5, min(20000, int(self.cfg.rep_ms / est_ms)))
        for _ in range(n_warm):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        self.sync()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e-3

    def _calls_for(self, fn: Callable[[], Any], cap: int, parts: int) -> int:
        """How many calls fit the wall budget (split in `parts` samples), from one timed call."""
        t0 = time.perf_counter()
        fn()
        self.sync()
        one = max(time.perf_counter() - t0, 1e-7)
        return max(10, min(cap, int(self.cfg.wall_budget_s / parts / one)))

    def wall(self, fn: Callable[[], Any]) -> float:
        """Median over samples of (wall of n back-to-back calls + one synchronize) / n."""
        for _ in range(20):
            fn()
        self.sync()
        n = self._calls_for(fn, self.cfg.wall_calls, self.cfg.wall_repeats)
        samples = []
        for _ in range(self.cfg.wall_repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            self.sync()
            samples.append((time.perf_counter() - t0) / n)
        return statistics.median(samples)

    def call_sync(self, fn: Callable[[], Any]) -> float:
        """Median wall of one call followed by a synchronize (what a frame-by-frame caller
        waits for its result)."""
        fn()
        self.sync()
        n = self._calls_for(fn, self.cfg.sync_calls, 1)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            self.sync()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    def host(self, fn: Callable[[], Any]) -> float:
        """Median wall seconds of a host (CPU) function."""
        t0 = time.perf_counter()
        fn()
        one = max(time.perf_counter() - t0, 1e-7)
        n = max(1, min(20, int(self.cfg.wall_budget_s / one)))
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)


def rotate(fns: list[Callable[[], Any]]) -> Callable[[], Any]:
    """One callable that calls fns[0], fns[1], ... in turn (different input sets)."""
    if len(fns) == 1:
        return fns[0]
    it = itertools.cycle(fns)
    return lambda: next(it)()


def best_wall_us(
    fn: Callable[[], Any],
    sync: Callable[[], Any],
    calls: int,
    warmup: int,
    repeat: int = 3,
) -> float:
    """Microseconds per call of `calls` back-to-back calls closed by one `sync`, best of
    `repeat` runs after `warmup` calls: what a caller's loop pays per call (host and GPU
    overlapped), the figure the training-step and overhead scripts report."""
    for _ in range(warmup):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def kernel_us(
    torch: Any,
    fn: Callable[[], Any],
    reps: int = 5,
    warm: int = 1,
    keep: Callable[[str], bool] | None = None,
) -> float:
    """Microseconds of GPU activity per call: the device time of every CUDA event (kernels,
    memsets, copies; with `keep`, only those whose name it keeps) torch.profiler records over
    `reps` calls, divided by `reps`, after `warm` calls. What the call costs the GPU whatever
    the host does around it: the figure to compare when wall-clock medians move with the host
    (an autograd step's launches)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    total = sum(
        e.device_time_total
        for e in prof.key_averages()
        if e.device_type == cuda and (keep is None or keep(e.key))
    )
    return total / reps
