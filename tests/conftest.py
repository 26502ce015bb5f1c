"""Shared test set-up: the `gpu` marker, and the correctness rule of DESIGN.md.

GPU tests (`@pytest.mark.gpu`) run only where flashscan's CUDA backend is available AND torch
sees a GPU; elsewhere they are skipped with the reason. Run the CPU suite alone with
`pytest -m "not gpu"`, the GPU suite with `pytest -m gpu`.

The correctness rule (fixture `rule`): compare against a float64 reference; a result passes
when max|got - ref| <= 2 * max|baseline - ref| + slack, where `baseline` is the same
computation done plainly in the same precision (e.g. torch math attention in bfloat16).
Non-finite reference values (the -inf lse of a query that sees no key) must be matched exactly;
a NaN anywhere in `got` fails (outputs are poisoned with NaN before the call, so a NaN means an
element was never written).
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import flashscan

_GPU_STATE: tuple[bool, str] | None = None


def gpu_state() -> tuple[bool, str]:
    """(usable, reason): flashscan.available() and torch.cuda.is_available()."""
    global _GPU_STATE
    if _GPU_STATE is None:
        if not flashscan.available():
            _GPU_STATE = (
                False,
                f"flashscan CUDA backend unavailable: {flashscan.info()['reason']}",
            )
        else:
            try:
                import torch
            except ImportError:
                _GPU_STATE = (False, "torch is not installed")
            else:
                if torch.cuda.is_available():
                    _GPU_STATE = (True, "")
                else:
                    _GPU_STATE = (False, "torch.cuda.is_available() is False")
    return _GPU_STATE


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "gpu: needs a CUDA GPU, flashscan's CUDA backend and torch (skipped otherwise)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [it for it in items if "gpu" in it.keywords]
    if not gpu_items:
        return
    ok, why = gpu_state()
    if ok:
        return
    skip = pytest.mark.skip(reason=why)
    for it in gpu_items:
        it.add_marker(skip)


# ---------------------------------------------------------------------------------------------
# The correctness rule
# ---------------------------------------------------------------------------------------------


def to_f64(x: Any) -> np.ndarray:
    """Any torch / cupy / jax / numpy array as a float64 NumPy array (bfloat16 included)."""
    mod = type(x).__module__.split(".", 1)[0]
    if mod == "torch":
        return x.detach().to("cpu", dtype=_torch().float64).numpy()
    if mod == "cupy":
        import cupy

        return cupy.asnumpy(x.astype(cupy.float64))
    a = np.asarray(x)
    return a.astype(np.float64)


def _torch() -> Any:
    import torch

    return torch


def max_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| over the elements where ref is finite (0.0 when there are none)."""
    fin = np.isfinite(ref)
    if not fin.any():
        return 0.0
    return float(np.abs(got[fin] - ref[fin]).max())


@dataclass
class RuleResult:
    err: float
    base_err: float
    limit: float

    def __str__(self) -> str:
        return f"max error {self.err:.3e}, baseline {self.base_err:.3e}, limit {self.limit:.3e}"


def check_rule(
    got: Any,
    ref: Any,
    baseline: Any,
    *,
    atol: float = 1e-5,
    rtol: float = 0.0,
    name: str = "out",
) -> RuleResult:
    """Assert max|got - ref| <= 2 * max|baseline - ref| + atol + rtol * max|ref| (float64).

    `got` must hold no NaN (poisoned outputs left unwritten); where `ref` is +-inf, `got` must
    equal it exactly."""
    g, r, b = to_f64(got), to_f64(ref), to_f64(baseline)
    assert g.shape == r.shape, f"{name}: shape {g.shape} != reference shape {r.shape}"
    nan = np.isnan(g)
    assert not nan.any(), (
        f"{name}: {int(nan.sum())} of {g.size} elements are NaN (unwritten or invalid), first at "
        f"{np.argwhere(nan)[0].tolist()}"
    )
    inf = ~np.isfinite(r)
    if inf.any():
        assert np.array_equal(g[inf], r[inf]), f"{name}: non-finite reference values not matched"
    err, base = max_err(g, r), max_err(b, r)
    scale = float(np.abs(r[~inf]).max()) if (~inf).any() else 0.0
    limit = 2.0 * base + atol + rtol * scale
    res = RuleResult(err, base, limit)
    if not err <= limit:
        idx = np.unravel_index(int(np.argmax(np.where(inf, 0, np.abs(g - r)))), g.shape)
        raise AssertionError(
            f"{name}: {res} (worst at {tuple(int(i) for i in idx)}: got {g[idx]!r}, "
            f"reference {r[idx]!r})"
        )
    return res


def assert_rel(got: Any, ref: Any, rtol: float, *, atol: float = 0.0, name: str = "out") -> float:
    """Assert max|got - ref| <= rtol * max|ref| + atol (the float32 rule); returns the error."""
    g, r = to_f64(got), to_f64(ref)
    assert g.shape == r.shape, f"{name}: shape {g.shape} != {r.shape}"
    assert not np.isnan(g).any(), f"{name}: NaN in the result (unwritten elements?)"
    inf = ~np.isfinite(r)
    if inf.any():
        assert np.array_equal(g[inf], r[inf]), f"{name}: non-finite reference values not matched"
    err = max_err(g, r)
    scale = float(np.abs(r[~inf]).max()) if (~inf).any() else 0.0
    assert err <= rtol * scale + atol, (
        f"{name}: max error {err:.3e} > {rtol:.1e} * {scale:.3e} + {atol:.1e}"
    )
    return err


def assert_same_up_to_order(got: Any, want: Any, *, tol: float = 1e-3, name: str = "out") -> None:
    """Two results of one computation whose float32 sums ran in different orders (atomics, a
    different plan) and were then rounded to their tensor's dtype: equal within `tol` (absolute
    and relative), widened to one unit in the last place of a 16-bit dtype, since an order
    difference far below `tol` can still flip the final rounding (bf16: 2^-7 relative)."""
    import torch

    assert got.dtype == want.dtype and got.shape == want.shape, name
    rtol = max(tol, float(torch.finfo(got.dtype).eps)) if got.is_floating_point() else tol
    torch.testing.assert_close(
        got.float(), want.float(), atol=tol, rtol=rtol, msg=lambda m: f"{name}: {m}"
    )


class Rule:
    """What the `rule` fixture hands out (plain functions, so tests need no imports)."""

    check = staticmethod(check_rule)
    rel = staticmethod(assert_rel)
    to_f64 = staticmethod(to_f64)
    max_err = staticmethod(max_err)
    same_up_to_order = staticmethod(assert_same_up_to_order)


@pytest.fixture
def rule() -> type[Rule]:
    return Rule


# ---------------------------------------------------------------------------------------------
# NaN poisoning (torch on CUDA)
# ---------------------------------------------------------------------------------------------


def poison_allocator(*nbytes: int, device: Any = "cuda") -> None:
    """Fill blocks of the given sizes with NaN and free them, so that torch's caching allocator
    hands those NaN-filled blocks to the next allocations of those sizes: outputs flashscan
    allocates itself start as NaN, and an unwritten element shows. (Best effort: the allocator
    may pick other blocks; with `out=` the poisoning is exact.)"""
    torch = _torch()
    blocks = [
        torch.full(((n + 3) // 4,), float("nan"), dtype=torch.float32, device=device)
        for n in nbytes
    ]
    del blocks


@pytest.fixture
def poison() -> Any:
    return poison_allocator


@pytest.fixture(autouse=True)
def seed_all() -> int:
    """One seed per test: FLASHSCAN_TEST_SEED=<seed>, else fresh entropy (fresh inputs each run).
    Printed, so pytest shows it with a failure, and a failing draw replays with
    FLASHSCAN_TEST_SEED=<seed>: it seeds torch's generators (CPU and every CUDA device, lazily)
    when torch is loaded, as the GPU tests draw their inputs with torch.randn, Python's `random`
    (the GPU helpers seed their own torch.Generator from random.getrandbits) and `rng`."""
    env = os.environ.get("FLASHSCAN_TEST_SEED")
    seed = int(env) if env else int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"FLASHSCAN_TEST_SEED={seed}")
    random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    return seed


@pytest.fixture
def rng(seed_all: int) -> np.random.Generator:
    """NumPy's generator on the test's seed (`seed_all`)."""
    return np.random.default_rng(seed_all)
