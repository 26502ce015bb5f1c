"""The Runner: one implementation at one shape — guard its output, then time it (GPU, wall,
call + sync, CUDA-graph replay) — and the rows it emits."""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from .config import ANCHOR_LABEL, ANCHORS, Config
from .costs import set_floors
from .fmt import first_line, row_summary
from .guards import GUARD_RMS, as_torch, compare, declined, failure_note
from .results import Ceilings, Row
from .timing import Timer, rotate

L2_DEFAULT_BYTES = 50 * 2**20


@dataclass
class Impl:
    """A way to compute a suite's operation. make(input_set) -> zero-argument call returning
    the output; graph_make likewise, for CUDA-graph capture (e.g. with out= given)."""

    name: str
    kind: str  # "flashscan" or "peer"
    make: Callable[[dict[str, Any]], Callable[[], Any]] | None = None
    graph_make: Callable[[dict[str, Any]], Callable[[], Any]] | None = None
    ctx: Callable[[], Any] = contextlib.nullcontext
    post: Callable[[Any], Any] | None = None  # output -> the guard's layout
    host: bool = False  # runs on the CPU (NumPy reference): host wall time only
    inplace: bool = False  # mutates its input set (state update): graph checked vs the guard
    skip: str = ""  # status when not run: "skipped", "n/a", "unavailable"
    note: str = ""


class Runner:
    """Runs implementations at shapes (the suites say which) and collects their rows."""

    def __init__(
        self,
        torch: Any,
        fs: Any,
        device: Any,
        cfg: Config,
        timer: Timer,
        ceil: Ceilings,
        fs_ok: bool,
        fs_reason: str,
        peers: dict[str, tuple[Any, str]],
        log: Callable[[str], None],
    ) -> None:
        self.torch, self.fs, self.device, self.cfg = torch, fs, device, cfg
        self.timer, self.ceil, self.log = timer, ceil, log
        self.fs_ok, self.fs_reason, self.peers = fs_ok, fs_reason, peers
        self.rows: list[Row] = []
        self.l2 = L2_DEFAULT_BYTES
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            self.l2 = int(getattr(props, "L2_cache_size", 0) or L2_DEFAULT_BYTES)
        self.dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

    # -- helpers ---------------------------------------------------------------------------

    def nsets(self, set_bytes: float) -> int:
        """Input sets to rotate so that together they exceed the L2 cache (3x)."""
        if set_bytes >= 2 * self.l2:
            return 1
        return max(2, min(self.cfg.max_sets, math.ceil(3 * self.l2 / max(set_bytes, 1.0))))

    def randn(self, *shape: int, dtype: str = "fp32") -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=self.dtypes[dtype])

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def fs_impl(self, make: Any, graph_make: Any = None, inplace: bool = False) -> Impl:
        if not self.fs_ok:
            return Impl("flashscan", "flashscan", skip="unavailable", note=self.fs_reason)
        return Impl("flashscan", "flashscan", make=make, graph_make=graph_make, inplace=inplace)

    def peer(self, name: str) -> Any:
        return self.peers.get(name, (None, ""))[0]

    def _emit(self, row: Row) -> None:
        self.rows.append(row)
        self.log(f"{row.suite:<12} {row.shape:<34} {row.impl:<16} {row_summary(row)}")

    # -- one implementation at one shape ----------------------------------------------------

    def run_impl(
        self,
        suite: str,
        shape: str,
        params: dict[str, Any],
        impl: Impl,
        sets: list[dict[str, Any]],
        guard: Any,
        cost: tuple[float, float, float],
        modes: tuple[str, ...],
    ) -> Row:
        flops, nbytes, exps = cost
        row = Row(suite, shape, dict(params), impl.name, impl.kind, flops=flops, bytes=nbytes)
        row.exps = exps
        row.note = impl.note
        set_floors(row, self.ceil)
        if impl.skip or impl.make is None:
            row.status = impl.skip or "skipped"
            row.note = impl.note
            self._emit(row)
            return row
        torch = self.torch
        try:
            with warnings.catch_warnings(), impl.ctx():
                if impl.kind != "flashscan":  # e.g. SDPA explaining why a backend declines
                    warnings.simplefilter("ignore", UserWarning)
                # correctness guard: one call on the first set, against the float64 reference
                cset = guard.prepare(sets[0])
                fn = impl.make(cset)
                t0 = time.perf_counter()
                out = fn()
                if not impl.host:
                    self.sync()
                row.first_call_s = time.perf_counter() - t0
                ok, row.check = guard.check(impl.post(out) if impl.post else out, cset, impl.host)
                del out
                if not ok:
                    row.status = "FAILED"
                    row.note = failure_note(row.check)
                if impl.host:  # host memory is not the GPU's L2: one set is enough
                    row.cpu_s = self.timer.host(impl.make(sets[0]))
                else:
                    fns = [impl.make(st) for st in sets]
                    call = rotate(fns)
                    if "gpu" in modes:
                        row.gpu_s = self.timer.gpu(call)
                    if "wall" in modes:
                        row.wall_s = self.timer.wall(call)
                        row.sync_s = self.timer.call_sync(call)
                    if "graph" in modes:
                        self._graph(row, impl, sets, guard)
                    del fns, call
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            msg = first_line(exc)
            row.status = "n/a" if declined(exc) else "error"
            row.note = f"{type(exc).__name__}: {msg}"
            if "out of memory" in str(exc).lower():
                with contextlib.suppress(Exception):
                    torch.cuda.empty_cache()
        self._emit(row)
        return row

    def _graph(self, row: Row, impl: Impl, sets: list[dict[str, Any]], guard: Any) -> None:
        """Capture one call per graph (with out= where the impl has it), replay in rotation.
        The first graph's output is poisoned with NaN, replayed and checked: against an eager
        call, or (an in-place call, whose eager twin would see another state) against the
        guard's reference from the restored starting state."""
        if self.device.type != "cuda":
            return
        torch = self.torch
        make = impl.graph_make or impl.make
        assert make is not None
        graphs: list[Any] = []
        try:
            outs = []
            for st in sets[: max(1, self.cfg.graph_sets)]:
                g, o = self._capture(make(st))
                graphs.append(g)
                outs.append(o)
            if impl.inplace:
                guard.restore(sets[0])
            got = as_torch(torch, impl.post(outs[0]) if impl.post else outs[0], self.device)
            if got.is_floating_point():
                got.fill_(float("nan"))
            graphs[0].replay()
            self.sync()
            got = got.clone()
            if impl.inplace:
                ok, m = guard.check(got, sets[0], False)
                row.check["graph_vs_reference"] = m
                if not ok:
                    row.status = "FAILED"
                    row.note = (row.note + "; " if row.note else "") + "graph replay off"
            else:
                ref = impl.make(sets[0])()  # type: ignore[misc]
                ref = as_torch(torch, impl.post(ref) if impl.post else ref, self.device)
                tol = GUARD_RMS.get(str(row.params.get("dtype")), 2e-2)
                ok, m = compare(torch, got, ref, tol)
                row.check["graph_vs_eager"] = m
                if not ok:
                    row.status = "FAILED"
                    row.note = (row.note + "; " if row.note else "") + "graph replay != eager"
            replays = [g.replay for g in graphs]
            row.graph_s = self.timer.gpu(rotate(replays))
            row.graph_wall_s = self.timer.wall(rotate(replays))
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            row.note = (row.note + "; " if row.note else "") + (
                f"graph capture failed: {type(exc).__name__}: {first_line(exc, 100)}"
            )
            with contextlib.suppress(Exception):
                self.sync()
        finally:
            del graphs

    def _capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        torch = self.torch
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        self.sync()
        return g, out

    def anchor_rows(
        self,
        suite: str,
        key: tuple[Any, ...],
        shape: str,
        params: dict[str, Any],
        cost: tuple[float, float, float],
    ) -> None:
        # an anchor stands in for a peer that is not here: none when the peer was measured
        if self.peer("mamba_ssm" if suite == "scan" else "mamba_ssm-triton") is not None:
            return
        for a_suite, a_key, seconds, column, what in ANCHORS:
            if a_suite != suite or a_key != key:
                continue
            row = Row(suite, shape, dict(params), f"mamba_ssm {ANCHOR_LABEL}", "anchor")
            row.flops, row.bytes, row.exps = cost
            set_floors(row, self.ceil)
            row.status = "anchor"
            row.note = what
            if column == "gpu":
                row.gpu_s = seconds
            else:
                row.wall_s = seconds
            self._emit(row)

    def unguarded(self, suite: str, shape: str, params: dict[str, Any], exc: Exception) -> None:
        """A shape whose inputs or guard reference could not be made: nothing there is timed,
        and it says so with a FAILED flashscan row instead of vanishing from the tables."""
        row = Row(suite, shape, dict(params), "flashscan", "flashscan", status="FAILED")
        row.note = f"inputs or guard reference failed: {type(exc).__name__}: {first_line(exc)}"
        self._emit(row)
        self.finish_shape()

    def finish_shape(self) -> None:
        self.sync()
        with contextlib.suppress(Exception):
            if self.device.type == "cuda":
                self.torch.cuda.empty_cache()

    # -- attention --------------------------------------------------------------------------
