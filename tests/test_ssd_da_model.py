"""The SSD backward's intra-chunk da: the straddle-sum form of the reference
(`reference_ssd.straddle_sums`) and its 64 x 64 block form (`tools/ssd_da_model.py`, the plan for
a kernel that forms da without the row-minus-column cancellation). CPU only."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from flashscan.reference_ssd import straddle_sums

PATH = Path(__file__).resolve().parent.parent / "tools" / "ssd_da_model.py"
_spec = importlib.util.spec_from_file_location("ssd_da_model", PATH)
assert _spec is not None and _spec.loader is not None
model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model)
block_straddle, random_r = model.block_straddle, model.random_r

SIZES = [1, 2, 37, 63, 64, 65, 100, 128, 129, 200, 256]


def _tf32(a: np.ndarray) -> np.ndarray:
    """a rounded to tf32 (10 mantissa bits, nearest) as float32: a tensor-core operand."""
    b = a.astype(np.float32).view(np.uint32)
    return ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.parametrize("q", SIZES)
@pytest.mark.parametrize("resets", [0, 4])
def test_straddle_equals_reverse_cumsum_of_row_minus_column(q: int, resets: int) -> None:
    r = random_r(q, 3, seed=10 * q + resets, resets=resets)
    dcum = r.sum(axis=1) - r.sum(axis=0)  # row sum - column sum at each position
    want = np.flip(np.cumsum(np.flip(dcum, 0), axis=0), 0)
    got = straddle_sums(r[None])[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * np.abs(r).sum())


@pytest.mark.parametrize("q", SIZES)
@pytest.mark.parametrize("resets", [0, 4])
def test_block_form_equals_reference(q: int, resets: int) -> None:
    r = random_r(q, 3, seed=q + resets, resets=resets)
    want = straddle_sums(r[None])[0]
    got = block_straddle(r)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(r).sum())
    # a block size that does not divide the chunk: the same sums
    got48 = block_straddle(r, block=48)
    np.testing.assert_allclose(got48, want, rtol=0, atol=1e-12 * np.abs(r).sum())


@pytest.mark.parametrize("q", [64, 256])
def test_block_form_in_float32_is_accurate_per_position(q: int) -> None:
    """tf32-rounded terms summed in float32: each position's error within a few tf32 ulp of the
    sum of |r| over the pairs that straddle it (not of the chunk's whole row / column sums)."""
    r = random_r(q, 4, seed=7)
    want = straddle_sums(r[None])[0]
    scale = straddle_sums(np.abs(r)[None])[0]
    got = block_straddle(_tf32(r), dtype=np.float32)
    m = scale > 0
    err = np.abs(got.astype(np.float64) - want)[m] / scale[m]
    assert err.max() < 2.0**-11 * 0.5, err.max()


@pytest.mark.parametrize("chunk", [64, 128, 256])
@pytest.mark.parametrize("resets", [0, 3])
def test_kernel_records_and_assembly_equal_reference(chunk: int, resets: int) -> None:
    """The split as built in cuda/ssd_bwd.cu: ssd_bwd_dcb's per-block records (column and row
    sums, or the diagonal block's in-block sums), ssd_bwd_dt's assembly; full and tail chunks
    (a tail's blocks at or past its length have no record: reading one would give NaN)."""
    for length in sorted({1, 37, 64, 65, chunk - 1, chunk}):
        if length > chunk:
            continue
        r = random_r(chunk, 1, seed=chunk + length + resets, resets=resets)[..., 0]
        r[length:, :] = 0.0
        r[:, length:] = 0.0
        want = straddle_sums(r[None, :, :, None])[0, :, 0]
        rec = model.kernel_records(r, length)
        got = model.kernel_assemble(rec, chunk, length)
        assert np.isfinite(got).all(), (chunk, length)
        np.testing.assert_allclose(
            got[:length], want[:length], rtol=0, atol=1e-12 * max(np.abs(r).sum(), 1.0)
        )
