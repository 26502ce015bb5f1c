"""What a run measures: the suites, their shapes and timing budgets, and the mamba_ssm anchors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUITES = ("attention", "latency", "scan", "state_update")
ANCHOR_LABEL = "anchor (issue 4, 2026-11-22)"
# input-set keys in the order the selective-scan / state-update APIs take them
SCAN_KEYS = ("u", "delta", "A", "B", "C", "D", "z")
STATE_KEYS = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias")

# mamba_ssm measured on the project's H100 on 2026-11-22 (issue 4); not measured in a run.
# (suite, shape key, seconds, which column it belongs to, what was measured)
ANCHORS: tuple[tuple[str, tuple[Any, ...], float, str, str], ...] = (
    ("scan", (32, 512, 60, 16, "bf16"), 86e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (32, 512, 60, 16, "fp32"), 86e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (1, 512, 60, 16, "bf16"), 20e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (1, 512, 60, 16, "fp32"), 20e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (8, 2048, 2048, 16, "bf16"), 594e-6, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (8, 2048, 8192, 16, "bf16"), 2.80e-3, "gpu", "mamba_ssm CUDA kernel, fwd"),
    ("scan", (2, 5120, 16384, 16, "bf16"), 3.70e-3, "gpu", "mamba_ssm CUDA kernel, fwd"),
    (
        "state_update",
        (32, 512, 16, "bf16"),
        110e-6,
        "wall",
        "mamba_ssm Triton selective_state_update, per call from Python",
    ),
    (
        "state_update",
        (64, 5120, 16, "bf16"),
        123e-6,
        "wall",
        "mamba_ssm Triton selective_state_update, per call from Python",
    ),
)


@dataclass(frozen=True)
class ScanShape:
    batch: int
    dim: int
    seqlen: int
    dstate: int
    dtype: str


@dataclass(frozen=True)
class StateShape:
    batch: int
    dim: int
    dstate: int
    dtype: str


@dataclass
class Config:
    """Shapes and timing budgets of a run (`make_config`)."""

    quick: bool
    attn_head_dims: tuple[int, ...]
    attn_seqlens: tuple[int, ...]
    attn_tokens: int = 16384  # batch * seqlen
    attn_width: int = 2048  # nheads * headdim
    attn_dtype: str = "bf16"
    attn_math_max_scores: int = 2**28  # b*h*sq*sk above which SDPA's MATH backend is skipped
    latency_batches: tuple[int, ...] = (1, 32)
    latency_seqlen: int = 60
    latency_heads: int = 8
    latency_headdim: int = 64
    latency_dtypes: tuple[str, ...] = ("bf16",)
    scan_shapes: tuple[ScanShape, ...] = ()
    state_shapes: tuple[StateShape, ...] = ()
    # timing
    warmup_ms: int = 25
    rep_ms: int = 100
    wall_calls: int = 1000  # calls per back-to-back wall sample (fewer for slow calls)
    wall_repeats: int = 7
    sync_calls: int = 500  # samples of one call + synchronize
    wall_budget_s: float = 1.0  # rough cap on the wall-clock spent per wall measurement
    graph_sets: int = 4  # graphs captured per row (one call each, rotated)
    max_sets: int = 64  # input sets rotated at most
    # ceilings
    copy_bytes: int = 2**30
    matmul_sizes: tuple[int, ...] = (8192, 16384)
    exp_iters: int = 256
    # correctness guard and the slow peers
    guard_rows: int = 64  # query rows checked per (batch, head)
    guard_channels: int = 256  # scan channels checked
    torch_loop_max_seqlen: int = 256  # the plain torch sequential scan only up to this seqlen
    numpy_max_attn: int = 2**26  # b*h*sq*sk*d for the NumPy reference
    numpy_max_scan: int = 2**24  # b*dim*seqlen*dstate
    numpy_max_state: int = 2**20  # b*dim*dstate


def make_config(quick: bool) -> Config:
    game = (32, 512, 60, 16)
    if quick:
        return Config(
            quick=True,
            attn_head_dims=(64, 128),
            attn_seqlens=(512, 2048, 16384),
            latency_dtypes=("bf16",),
            scan_shapes=(
                ScanShape(*game, "bf16"),
                ScanShape(*game, "fp32"),
                ScanShape(1, 512, 60, 16, "bf16"),
                ScanShape(8, 2048, 2048, 16, "bf16"),
                ScanShape(2, 5120, 16384, 16, "bf16"),
            ),
            state_shapes=(StateShape(32, 512, 16, "bf16"), StateShape(64, 5120, 16, "bf16")),
            warmup_ms=10,
            rep_ms=40,
            wall_calls=200,
            wall_repeats=5,
            sync_calls=200,
            wall_budget_s=0.3,
            graph_sets=2,
            copy_bytes=2**29,
            matmul_sizes=(8192,),
            exp_iters=128,
        )
    return Config(
        quick=False,
        attn_head_dims=(64, 128, 256),
        attn_seqlens=(512, 1024, 2048, 4096, 8192, 16384),
        latency_dtypes=("bf16", "fp32"),
        scan_shapes=(
            ScanShape(*game, "bf16"),
            ScanShape(*game, "fp32"),
            ScanShape(1, 512, 60, 16, "bf16"),
            ScanShape(1, 512, 60, 16, "fp32"),
            ScanShape(8, 2048, 2048, 16, "bf16"),
            ScanShape(8, 2048, 8192, 16, "bf16"),
            ScanShape(2, 5120, 16384, 16, "bf16"),
        ),
        state_shapes=(
            StateShape(32, 512, 16, "bf16"),
            StateShape(32, 512, 16, "fp32"),
            StateShape(64, 5120, 16, "bf16"),
        ),
    )
