"""The implementations that compete at a shape: flashscan, the peers detected here (torch SDPA
per backend, flash-attn 2/3, mamba_ssm), the plain torch references and the NumPy reference.
Each is an `Impl`: a factory of zero-argument calls over one input set."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .config import SCAN_KEYS, STATE_KEYS, ScanShape, StateShape
from .fmt import first_line
from .references import torch_selective_scan, torch_state_update
from .runner import Impl, Runner


def detect_peers() -> dict[str, tuple[Any, str]]:
    """Optional peers: name -> (callable or None, why not)."""
    found: dict[str, tuple[Any, str]] = {}

    def attempt(name: str, module: str, attr: str) -> None:
        try:
            found[name] = (getattr(importlib.import_module(module), attr), "")
        except Exception as exc:  # ImportError, but also a broken build (OSError, ...)
            found[name] = (None, f"{type(exc).__name__}: {first_line(exc)}")

    attempt("flash-attn", "flash_attn", "flash_attn_func")
    attempt("flash-attn-3", "flash_attn_interface", "flash_attn_func")
    attempt("mamba_ssm", "mamba_ssm.ops.selective_scan_interface", "selective_scan_fn")
    attempt(
        "mamba_ssm-triton",
        "mamba_ssm.ops.triton.selective_state_update",
        "selective_state_update",
    )
    return found


def sdpa_ctx(sdpa_kernel: Any, backend: Any) -> Callable[[], Any]:
    return lambda: sdpa_kernel(backend)


def fa_make(fa: Any, causal: bool) -> Callable[[dict[str, Any]], Callable[[], Any]]:
    def make(st: dict[str, Any]) -> Callable[[], Any]:
        q, k, v = st["q"], st["k"], st["v"]
        return lambda: fa(q, k, v, causal=causal)

    return make


def _numpy_impl(make: Callable[[dict[str, Any]], Callable[[], Any]], inplace: bool = False) -> Impl:
    return Impl(
        "numpy-ref",
        "peer",
        make=make,
        host=True,
        inplace=inplace,
        note="flashscan.reference on the CPU, float32",
    )


def first_output(o: Any) -> Any:
    return o[0] if isinstance(o, (tuple, list)) else o


def attention_impls(
    rn: Runner, b: int, s: int, h: int, d: int, dtype: str, causal: bool
) -> list[Impl]:
    torch, fs, cfg = rn.torch, rn.fs, rn.cfg
    impls: list[Impl] = []

    def fs_make(st: dict[str, Any]) -> Callable[[], Any]:
        q, k, v = st["q"], st["k"], st["v"]
        return lambda: fs.flash_attn_func(q, k, v, causal=causal)

    def fs_graph_make(st: dict[str, Any]) -> Callable[[], Any]:
        q, k, v = st["q"], st["k"], st["v"]
        o = torch.empty_like(q)
        return lambda: fs.flash_attn_func(q, k, v, causal=causal, out=o)

    impls.append(rn.fs_impl(fs_make, fs_graph_make))

    sdpa_reason = ""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as exc:
        SDPBackend = sdpa_kernel = None
        sdpa_reason = f"torch.nn.attention.sdpa_kernel not importable ({exc})"
    F = torch.nn.functional

    def sdpa_make(st: dict[str, Any]) -> Callable[[], Any]:
        # SDPA's layout is (batch, nheads, seqlen, headdim): views, made outside the call
        qt, kt, vt = (st[x].transpose(1, 2) for x in "qkv")
        return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    def sdpa_post(o: Any) -> Any:
        return o.transpose(1, 2)

    for name, backend_name in (
        ("sdpa-flash", "FLASH_ATTENTION"),
        ("sdpa-cudnn", "CUDNN_ATTENTION"),
        ("sdpa-efficient", "EFFICIENT_ATTENTION"),
        ("sdpa-math", "MATH"),
    ):
        backend = getattr(SDPBackend, backend_name, None) if SDPBackend is not None else None
        if backend is None:
            why = sdpa_reason if SDPBackend is None else f"SDPBackend.{backend_name} missing"
            impls.append(Impl(name, "peer", skip="n/a", note=why))
            continue
        if backend_name == "MATH" and b * h * s * s > cfg.attn_math_max_scores:
            impls.append(
                Impl(
                    name,
                    "peer",
                    skip="skipped",
                    note=f"score matrix too large for math (b*h*sq*sk = {b * h * s * s:.3g})",
                )
            )
            continue
        impls.append(
            Impl(
                name,
                "peer",
                make=sdpa_make,
                ctx=sdpa_ctx(sdpa_kernel, backend),
                post=sdpa_post,
            )
        )

    for name in ("flash-attn", "flash-attn-3"):
        fa = rn.peer(name)
        if fa is None:
            continue
        if dtype == "fp32":
            impls.append(Impl(name, "peer", skip="n/a", note="fp16/bf16 only"))
            continue
        impls.append(Impl(name, "peer", make=fa_make(fa, causal), post=first_output))

    if b * h * s * s * d <= cfg.numpy_max_attn:
        ref = rn.fs.reference

        def np_make(st: dict[str, Any]) -> Callable[[], Any]:
            q, k, v = (st[x].float().cpu().numpy() for x in "qkv")
            return lambda: ref.flash_attn_func(q, k, v, causal=causal)

        impls.append(_numpy_impl(np_make))
    return impls


def scan_impls(rn: Runner, s: ScanShape) -> list[Impl]:
    torch, fs, cfg = rn.torch, rn.fs, rn.cfg
    impls: list[Impl] = []

    def fs_make(st: dict[str, Any]) -> Callable[[], Any]:
        u, delta, A, B, C, D, z = (st[k] for k in SCAN_KEYS)
        scan = fs.selective_scan_fn
        return lambda: scan(u, delta, A, B, C, D, z, delta_softplus=True)

    impls.append(rn.fs_impl(fs_make))
    mamba = rn.peer("mamba_ssm")
    if mamba is not None:

        def mamba_make(st: dict[str, Any]) -> Callable[[], Any]:
            u, delta, A, B, C, D, z = (st[k] for k in SCAN_KEYS)
            return lambda: mamba(u, delta, A, B, C, D, z, delta_softplus=True)

        impls.append(Impl("mamba_ssm", "peer", make=mamba_make, post=first_output))
    if s.seqlen <= cfg.torch_loop_max_seqlen:

        def loop_make(st: dict[str, Any]) -> Callable[[], Any]:
            u, delta, A, B, C, D, z = (st[k] for k in SCAN_KEYS)
            return lambda: torch_selective_scan(
                torch, u, delta, A, B, C, D, z, delta_softplus=True
            )[0]

        impls.append(
            Impl(
                "torch-loop",
                "peer",
                make=loop_make,
                note="plain torch, float32, one addcmul per step",
            )
        )
    if s.batch * s.dim * s.seqlen * s.dstate <= cfg.numpy_max_scan:
        ref = fs.reference

        def np_make(st: dict[str, Any]) -> Callable[[], Any]:
            u, delta, A, B, C, D, z = (st[k].float().cpu().numpy() for k in SCAN_KEYS)
            return lambda: ref.selective_scan_fn(u, delta, A, B, C, D, z, delta_softplus=True)

        impls.append(_numpy_impl(np_make))
    return impls


def state_impls(rn: Runner, s: StateShape) -> list[Impl]:
    torch, fs, cfg = rn.torch, rn.fs, rn.cfg
    impls: list[Impl] = []

    def fs_make(st: dict[str, Any]) -> Callable[[], Any]:
        state, x, dt, A, B, C, D, z, dt_bias = (st[k] for k in STATE_KEYS)
        update = fs.selective_state_update
        return lambda: update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus=True)

    impls.append(rn.fs_impl(fs_make, inplace=True))
    mamba = rn.peer("mamba_ssm-triton")
    if mamba is not None:

        def mamba_make(st: dict[str, Any]) -> Callable[[], Any]:
            state, x, dt, A, B, C, D, z, dt_bias = (st[k] for k in STATE_KEYS)
            return lambda: mamba(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)

        impls.append(Impl("mamba_ssm-triton", "peer", make=mamba_make, inplace=True))

    def torch_make(st: dict[str, Any]) -> Callable[[], Any]:
        state, x, dt, A, B, C, D, z, dt_bias = (st[k] for k in STATE_KEYS)
        return lambda: torch_state_update(
            torch, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus=True, inplace=True
        )[0].to(x.dtype)

    impls.append(
        Impl(
            "torch",
            "peer",
            make=torch_make,
            inplace=True,
            note="plain torch, float32, state updated in place",
        )
    )
    if s.batch * s.dim * s.dstate <= cfg.numpy_max_state:
        ref = fs.reference

        def np_make(st: dict[str, Any]) -> Callable[[], Any]:
            state, x, dt, A, B, C, D, z, dt_bias = (st[k].float().cpu().numpy() for k in STATE_KEYS)
            return lambda: ref.selective_state_update(
                state, x, dt, A, B, C, D, z, dt_bias, dt_softplus=True
            )

        impls.append(_numpy_impl(np_make, inplace=True))
    return impls
