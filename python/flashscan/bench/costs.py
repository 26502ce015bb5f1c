"""Work counts (FLOPs, bytes, exponentials) of each operation and the floors they give with the
ceilings measured at the start of a run."""

from __future__ import annotations

from .config import ScanShape, StateShape
from .results import Ceilings, Row

ESIZE = {"bf16": 2, "fp16": 2, "fp32": 4}  # bytes per element


def floors(ceil: Ceilings, flops: float, nbytes: float, exps: float) -> dict[str, float]:
    out: dict[str, float] = {}
    if flops and ceil.matmul_rate:
        out["matmul"] = flops / ceil.matmul_rate
    if nbytes and ceil.copy_bw:
        out["memory"] = nbytes / ceil.copy_bw
    if exps and ceil.exp_rate:
        out["exp"] = exps / ceil.exp_rate
    return out


def set_floors(row: Row, ceil: Ceilings) -> None:
    """Fill row.floors from its work counts, and row.floor_s / floor_bound from the largest."""
    row.floors = floors(ceil, row.flops, row.bytes, row.exps)
    if row.floors:
        row.floor_bound = max(row.floors, key=lambda k: row.floors[k])
        row.floor_s = row.floors[row.floor_bound]


def attention_cost(
    b: int, sq: int, sk: int, h: int, hk: int, d: int, dtype: str, causal: bool
) -> tuple[float, float]:
    """(FLOPs, bytes) of an attention forward: FLOPs = 4*b*h*sq*sk*d (QK^T and PV), halved
    when causal; bytes = q, k, v read once + out written once."""
    flops = 4.0 * b * h * sq * sk * d
    if causal:
        flops /= 2
    nbytes = float(ESIZE[dtype]) * (2 * b * sq * h * d + 2 * b * sk * hk * d)
    return flops, nbytes


def scan_cost(s: ScanShape, has_z: bool = True, has_d: bool = True) -> tuple[float, float]:
    """(bytes, exponentials) of a selective scan with varying B, C (batch, dstate, seqlen) in
    u's dtype: u, delta (and z) read + out written, B and C read, A (fp32) and D (fp32) read;
    one exp(dt * A) per (batch, channel, step, state)."""
    e = ESIZE[s.dtype]
    per_seq = s.batch * s.dim * s.seqlen
    nbytes = per_seq * e * (3 + (1 if has_z else 0))
    nbytes += 2 * s.batch * s.dstate * s.seqlen * e
    nbytes += s.dim * s.dstate * 4 + (s.dim * 4 if has_d else 0)
    return float(nbytes), float(per_seq * s.dstate)


def state_update_cost(s: StateShape) -> tuple[float, float]:
    """(bytes, exponentials) of one decode step: the fp32 state read and written, x, dt, z read
    and out written, B and C read, A, D and dt_bias (fp32) read; one exp per state element."""
    e = ESIZE[s.dtype]
    nbytes = 2 * s.batch * s.dim * s.dstate * 4
    nbytes += 4 * s.batch * s.dim * e + 2 * s.batch * s.dstate * e
    nbytes += s.dim * s.dstate * 4 + 2 * s.dim * 4
    return float(nbytes), float(s.batch * s.dim * s.dstate)
