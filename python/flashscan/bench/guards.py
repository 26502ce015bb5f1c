"""Correctness guards: every timed row's output is compared with a float64 torch reference
before it is timed, and a row whose output is off, not finite or of the wrong shape is FAILED.

A guard computes its reference once per shape (on a subset where the whole problem would be too
big: query rows, scan channels), then `check(out, input_set, host)` returns (ok, metrics).
"""

from __future__ import annotations

import math
from typing import Any

from .references import attention_rows_reference, torch_selective_scan, torch_state_update

# Loose guard tolerances on the relative RMS error against the float64 reference: wide enough
# for any correct kernel of that precision, far below what a wrong one produces.
GUARD_RMS = {"bf16": 2e-2, "fp16": 1e-2, "fp32": 5e-3}


def compare(torch: Any, got: Any, ref: Any, tol_rms: float) -> tuple[bool, dict[str, Any]]:
    """Loose guard: same shape, every element finite, relative RMS error <= tol_rms and max
    error <= 5 * tol_rms * max|ref|. A NaN or inf anywhere in `got` (or `ref`) fails."""
    if tuple(got.shape) != tuple(ref.shape):
        return False, {
            "finite": False,
            "shape": f"got {tuple(got.shape)}, reference {tuple(ref.shape)}",
            "rel_rms_err": math.inf,
            "max_abs_err": math.inf,
            "ref_max_abs": 0.0,
            "tol_rel_rms": tol_rms,
            "elements": int(ref.numel()),
        }
    got = got.double()
    ref = ref.double()
    finite = bool(torch.isfinite(got).all()) and bool(torch.isfinite(ref).all())
    diff = (got - ref).abs()
    ref_norm = float(ref.norm())
    rel_rms = float((got - ref).norm()) / max(ref_norm, 1e-30) if finite else math.inf
    max_err = float(diff.max()) if finite and diff.numel() else (0.0 if finite else math.inf)
    ref_max = float(ref.abs().max()) if ref.numel() else 0.0
    ok = finite and rel_rms <= tol_rms and max_err <= 5 * tol_rms * ref_max + 1e-6
    return ok, {
        "finite": finite,
        "rel_rms_err": rel_rms,
        "max_abs_err": max_err,
        "ref_max_abs": ref_max,
        "tol_rel_rms": tol_rms,
        "elements": int(ref.numel()),
    }


def failure_note(m: dict[str, Any]) -> str:
    """Why a guard failed, in one line for the table."""
    if "shape" in m:
        return f"output shape off: {m['shape']}"
    if not m.get("finite", True) or not m.get("finite_all", True):
        return "output not finite (NaN or inf)"
    return (
        f"output off: relative RMS error {m.get('rel_rms_err', 0):.3g} "
        f"(tolerance {m.get('tol_rel_rms', 0):.3g}), max error "
        f"{m.get('max_abs_err', 0):.3g} of max |ref| {m.get('ref_max_abs', 0):.3g}"
    )


def check_outputs(
    torch: Any, pairs: list[tuple[str, Any, Any]], tol_rms: float
) -> tuple[bool, float, str]:
    """Guard several outputs of one timed call (an output and its gradients): each
    (name, got, ref) through `compare`. Returns (all passed, worst relative RMS error, why not:
    the failing names with their notes). A NaN/inf output or a missing one (None) fails."""
    worst, bad = 0.0, []
    for name, got, ref in pairs:
        if got is None:
            worst = math.inf
            bad.append(f"{name}: no output")
            continue
        ok, m = compare(torch, got, ref, tol_rms)
        err = m["rel_rms_err"]
        worst = max(worst, err if math.isfinite(err) else math.inf)
        if not ok:
            bad.append(f"{name}: {failure_note(m)}")
    if not pairs:
        return False, math.inf, "nothing was checked"
    return not bad, worst, "; ".join(bad)


def declined(exc: BaseException) -> bool:
    """An exception that means "this backend does not do this shape" (n/a), not a failure."""
    text = str(exc)
    return any(m in text for m in ("No available kernel", "No viable backend")) or type(
        exc
    ).__name__ in ("UnsupportedError", "NotImplementedError")


def as_torch(torch: Any, x: Any, device: Any) -> Any:
    if isinstance(x, (tuple, list)):
        x = x[0]
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    return x.to(device)


class _SubsetGuard:
    """A guard whose float64 reference covers batches `bidx` and, along dimension 1, the
    indices `sub` (query rows, scan channels); the whole output must still be finite."""

    torch: Any
    device: Any
    bidx: list[int]
    sub: Any
    ref: Any
    tol: float

    def prepare(self, st: dict[str, Any]) -> dict[str, Any]:
        return st

    def restore(self, st: dict[str, Any]) -> None:
        """Nothing to restore: the operation does not change its inputs."""

    def check(self, out: Any, st: dict[str, Any], host: bool) -> tuple[bool, dict[str, Any]]:
        o = as_torch(self.torch, out, self.device)
        finite_all = bool(self.torch.isfinite(o).all())
        ok, m = compare(self.torch, o[self.bidx][:, self.sub.to(o.device)], self.ref, self.tol)
        m["finite_all"] = finite_all
        return ok and finite_all, m


class AttnGuard(_SubsetGuard):
    """Query rows spread over the sequence (first and last included), batches first and last."""

    def __init__(
        self, torch: Any, st: dict[str, Any], causal: bool, dtype: str, max_rows: int = 64
    ) -> None:
        q = st["q"]
        b, sq = q.shape[0], q.shape[1]
        self.torch, self.device = torch, q.device
        self.bidx = [0] if b == 1 else [0, b - 1]
        nrows = min(sq, max_rows)
        self.rows = torch.linspace(0, sq - 1, nrows, device=q.device).round().long().unique()
        self.ref = attention_rows_reference(
            torch, q, st["k"], st["v"], causal, self.bidx, self.rows
        )
        self.tol = GUARD_RMS[dtype]
        self.sub = self.rows


class ScanGuard(_SubsetGuard):
    """All of a small problem; else first and last batch and `guard_channels` random channels."""

    def __init__(self, torch: Any, st: dict[str, Any], dtype: str, max_channels: int = 256) -> None:
        u = st["u"]
        b, dim, seqlen = u.shape
        n = st["A"].shape[1]
        self.torch, self.device = torch, u.device
        small = b * dim * seqlen * n <= 2**24
        self.bidx = list(range(b)) if small else sorted({0, b - 1})
        if small or dim <= max_channels:
            self.cidx = torch.arange(dim, device=u.device)
        else:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(1234)
            self.cidx = torch.randperm(dim, generator=gen)[:max_channels].sort().values
            self.cidx = self.cidx.to(u.device)
        sub = self._subset(st)
        self.ref, _ = torch_selective_scan(torch, **sub, delta_softplus=True, acc=torch.float64)
        self.tol = GUARD_RMS[dtype]
        self.sub = self.cidx

    def _subset(self, st: dict[str, Any]) -> dict[str, Any]:
        bi, ci = self.bidx, self.cidx

        def bc(m: Any) -> Any:
            if m.dim() == 2:
                return m[ci]
            if m.dim() == 3:
                return m[bi]
            return m[bi][:, ci // (st["u"].shape[1] // m.shape[1])]

        return {
            "u": st["u"][bi][:, ci],
            "delta": st["delta"][bi][:, ci],
            "A": st["A"][ci],
            "B": bc(st["B"]),
            "C": bc(st["C"]),
            "D": None if st.get("D") is None else st["D"][ci],
            "z": None if st.get("z") is None else st["z"][bi][:, ci],
        }


class StateGuard:
    """out and the new state against float64; the state is restored before each guarded call."""

    def __init__(self, torch: Any, st: dict[str, Any], dtype: str) -> None:
        self.torch, self.device = torch, st["state"].device
        self.state0 = st["state"].clone()
        args = {k: v for k, v in st.items() if k != "state"}
        self.ref_out, self.ref_state = torch_state_update(
            torch, self.state0, **args, dt_softplus=True, acc=torch.float64
        )
        self.tol = GUARD_RMS[dtype]

    def prepare(self, st: dict[str, Any]) -> dict[str, Any]:
        c = dict(st)
        c["state"] = self.state0.clone()
        return c

    def restore(self, st: dict[str, Any]) -> None:
        """Put the guarded starting state back into `st` in place (a captured graph keeps
        reading the same tensor)."""
        st["state"].copy_(self.state0)

    def check(self, out: Any, st: dict[str, Any], host: bool) -> tuple[bool, dict[str, Any]]:
        o = as_torch(self.torch, out, self.device)
        ok, m = compare(self.torch, o, self.ref_out, self.tol)
        if not host:  # the host reference updates its own NumPy copy of the state
            ok_s, ms = compare(self.torch, st["state"], self.ref_state, GUARD_RMS["fp32"])
            m["state"] = ms
            ok = ok and ok_s
        return ok, m
