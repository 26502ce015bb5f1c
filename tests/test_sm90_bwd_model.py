"""The NumPy model of the wgmma backward's index math (tools/sm90_bwd_model.py) on the CPU:
tiles stored through swz_offset, operands read through the kernel's descriptors, register A and
accumulators through the fragment layouts, masks, dQ blocks in fragment order and the convert
pass that reads them (frag_index), every CTA and iteration of
seven small odd problems (GQA and MQA, causal, windows, seqlen_q != seqlen_k both ways, tails,
hd64 and hd128), against float64.
Shared memory starts as NaN, so a read of anything the kernel did not write fails the test. The
model reads the verified forward's operands correctly too (its descriptor semantics)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parent.parent / "tools" / "sm90_bwd_model.py"
_spec = importlib.util.spec_from_file_location("sm90_bwd_model", PATH)
assert _spec is not None and _spec.loader is not None
model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model)


def test_model_reads_the_verified_forward_operands() -> None:
    model.check_forward_descriptors()


@pytest.mark.parametrize("case", model.CASES, ids=[str(c) for c in model.CASES])
def test_kernel_index_math_gives_the_gradients(case: tuple) -> None:
    got, ref = model.backward_model(*case)
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert np.isfinite(g).all(), f"{name}: an element read from unwritten shared memory"
        # fp16 operands (P, dS rounded as the kernel does): ~1e-3 of the largest gradient
        err = float(np.abs(g - r).max() / np.abs(r).max())
        assert err < 5e-3, f"{name}: {err:.1e}"


def test_model_catches_a_wrong_descriptor() -> None:
    """MN-major reads (dQ, and dV / dK at hd64) with LBO and SBO swapped break the gradients:
    the model can fail."""
    good = model.fetch_mnmajor

    def swapped(sm, start, lbo, sbo, mn):  # noqa: ANN001, ANN202
        return (
            good(sm, start, sbo, lbo, mn)
            if lbo == 128 * 128 and mn == 64
            else good(sm, start, lbo, sbo, mn)
        )

    model.fetch_mnmajor = swapped
    try:
        with np.errstate(all="ignore"):
            try:
                got, ref = model.backward_model(150, 200, 2, 1, 64, (-1, -1))
            except IndexError:
                return  # read past shared memory: caught
        assert not np.allclose(got[0], ref[0], atol=1e-2 * float(np.abs(ref[0]).max()))
    finally:
        model.fetch_mnmajor = good
