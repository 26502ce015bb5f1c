"""The records a run produces: the measured ceilings of the GPU and one Row per measurement."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Ceilings:
    copy_bw: float | None = None  # bytes / s (read + written)
    matmul_rate: float | None = None  # FLOP / s, bf16
    exp_rate: float | None = None  # exp2 / s
    notes: dict[str, str] = field(default_factory=dict)


@dataclass
class Row:
    """One measurement: an implementation at a shape. Times in seconds, per call."""

    suite: str
    shape: str
    params: dict[str, Any]
    impl: str
    kind: str  # "flashscan", "peer" or "anchor"
    status: str = "ok"  # ok, FAILED, error, n/a, skipped, unavailable, anchor
    note: str = ""
    gpu_s: float | None = None  # GPU time (CUDA events, L2 flushed), median
    wall_s: float | None = None  # wall per call from Python, back-to-back, one final sync
    sync_s: float | None = None  # wall of one call + synchronize, median
    graph_s: float | None = None  # GPU time of one CUDA-graph replay, median
    graph_wall_s: float | None = None  # wall per replay from Python, back-to-back
    cpu_s: float | None = None  # host wall time (NumPy reference)
    first_call_s: float | None = None  # first call in this process (compile / load included)
    flops: float = 0.0
    bytes: float = 0.0
    exps: float = 0.0
    floor_s: float | None = None
    floor_bound: str = ""
    floors: dict[str, float] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)

    @property
    def main_s(self) -> float | None:
        """The time this row is compared by: GPU time, else host time, else wall time."""
        for t in (self.gpu_s, self.cpu_s, self.wall_s):
            if t is not None:
                return t
        return None


def jsonable(x: Any) -> Any:
    """x as strict JSON: non-finite floats as strings, tuples as lists, the rest as str."""
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)
