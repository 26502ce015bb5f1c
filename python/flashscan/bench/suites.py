"""The suites: which shapes each runs, the random input sets, and the guard of each shape.
`SUITE_RUNS[name](runner)` runs one suite; its rows land in `runner.rows`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .config import ScanShape, StateShape
from .costs import attention_cost, scan_cost, state_update_cost
from .guards import AttnGuard, ScanGuard, StateGuard
from .peers import attention_impls, scan_impls, state_impls
from .runner import Runner


def attention_shape(
    rn: Runner,
    suite: str,
    b: int,
    s: int,
    h: int,
    d: int,
    dtype: str,
    causal: bool,
    modes: tuple[str, ...],
) -> None:
    flops, nbytes = attention_cost(b, s, s, h, h, d, dtype, causal)
    shape = f"b{b} s{s} h{h} d{d} {dtype}" + (" causal" if causal else "")
    params = {
        "batch": b,
        "seqlen": s,
        "nheads": h,
        "headdim": d,
        "dtype": dtype,
        "causal": causal,
    }
    try:
        sets = [
            {x: rn.randn(b, s, h, d, dtype=dtype) for x in "qkv"} for _ in range(rn.nsets(nbytes))
        ]
        guard = AttnGuard(rn.torch, sets[0], causal, dtype, rn.cfg.guard_rows)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        rn.unguarded(suite, shape, params, exc)
        return
    for impl in attention_impls(rn, b, s, h, d, dtype, causal):
        rn.run_impl(suite, shape, params, impl, sets, guard, (flops, nbytes, 0.0), modes)
    del sets, guard
    rn.finish_shape()


def run_attention(rn: Runner) -> None:
    cfg = rn.cfg
    for d in cfg.attn_head_dims:
        h = max(1, cfg.attn_width // d)
        for causal in (False, True):
            for s in cfg.attn_seqlens:
                b = max(1, cfg.attn_tokens // s)
                attention_shape(rn, "attention", b, s, h, d, cfg.attn_dtype, causal, ("gpu",))


def run_latency(rn: Runner) -> None:
    cfg = rn.cfg
    for dtype in cfg.latency_dtypes:
        for b in cfg.latency_batches:
            for causal in (False, True):
                attention_shape(
                    rn,
                    "latency",
                    b,
                    cfg.latency_seqlen,
                    cfg.latency_heads,
                    cfg.latency_headdim,
                    dtype,
                    causal,
                    ("gpu", "wall", "graph"),
                )


# -- selective scan ---------------------------------------------------------------------


def scan_set(rn: Runner, s: ScanShape) -> dict[str, Any]:
    torch, dev = rn.torch, rn.device
    return {
        "u": rn.randn(s.batch, s.dim, s.seqlen, dtype=s.dtype),
        "delta": (rn.randn(s.batch, s.dim, s.seqlen) * 0.5 - 1.0).to(rn.dtypes[s.dtype]),
        "A": -(torch.rand(s.dim, s.dstate, device=dev) + 0.5),
        "B": rn.randn(s.batch, s.dstate, s.seqlen, dtype=s.dtype),
        "C": rn.randn(s.batch, s.dstate, s.seqlen, dtype=s.dtype),
        "D": rn.randn(s.dim),
        "z": rn.randn(s.batch, s.dim, s.seqlen, dtype=s.dtype),
    }


def run_scan(rn: Runner) -> None:
    for s in rn.cfg.scan_shapes:
        nbytes, exps = scan_cost(s)
        shape = f"b{s.batch} d{s.dim} L{s.seqlen} n{s.dstate} {s.dtype}"
        params = dataclasses.asdict(s)
        params.update(delta_softplus=True, D=True, z=True, varying_BC=True, delta_bias=False)
        latency_like = s.seqlen <= rn.cfg.torch_loop_max_seqlen
        modes = ("gpu", "wall", "graph") if latency_like else ("gpu",)
        try:
            sets = [scan_set(rn, s) for _ in range(rn.nsets(nbytes))]
            guard = ScanGuard(rn.torch, sets[0], s.dtype, rn.cfg.guard_channels)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            rn.unguarded("scan", shape, params, exc)
            continue
        for impl in scan_impls(rn, s):
            rn.run_impl("scan", shape, params, impl, sets, guard, (0.0, nbytes, exps), modes)
        key = (s.batch, s.dim, s.seqlen, s.dstate, s.dtype)
        rn.anchor_rows("scan", key, shape, params, (0.0, nbytes, exps))
        del sets, guard
        rn.finish_shape()


# -- state update -----------------------------------------------------------------------


def state_set(rn: Runner, s: StateShape) -> dict[str, Any]:
    torch, dev = rn.torch, rn.device
    return {
        "state": rn.randn(s.batch, s.dim, s.dstate),
        "x": rn.randn(s.batch, s.dim, dtype=s.dtype),
        "dt": (rn.randn(s.batch, s.dim) * 0.5 - 1.0).to(rn.dtypes[s.dtype]),
        "A": -(torch.rand(s.dim, s.dstate, device=dev) + 0.5),
        "B": rn.randn(s.batch, s.dstate, dtype=s.dtype),
        "C": rn.randn(s.batch, s.dstate, dtype=s.dtype),
        "D": rn.randn(s.dim),
        "z": rn.randn(s.batch, s.dim, dtype=s.dtype),
        "dt_bias": rn.randn(s.dim) * 0.5,
    }


def run_state_update(rn: Runner) -> None:
    for s in rn.cfg.state_shapes:
        nbytes, exps = state_update_cost(s)
        shape = f"b{s.batch} d{s.dim} n{s.dstate} {s.dtype}"
        params = dataclasses.asdict(s)
        params.update(dt_softplus=True, D=True, z=True, dt_bias=True)
        try:
            sets = [state_set(rn, s) for _ in range(rn.nsets(nbytes))]
            guard = StateGuard(rn.torch, sets[0], s.dtype)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            rn.unguarded("state_update", shape, params, exc)
            continue
        for impl in state_impls(rn, s):
            rn.run_impl(
                "state_update",
                shape,
                params,
                impl,
                sets,
                guard,
                (0.0, nbytes, exps),
                ("gpu", "wall", "graph"),
            )
        key = (s.batch, s.dim, s.dstate, s.dtype)
        rn.anchor_rows("state_update", key, shape, params, (0.0, nbytes, exps))
        del sets, guard
        rn.finish_shape()


SUITE_RUNS: dict[str, Callable[[Runner], None]] = {
    "attention": run_attention,
    "latency": run_latency,
    "scan": run_scan,
    "state_update": run_state_update,
}
