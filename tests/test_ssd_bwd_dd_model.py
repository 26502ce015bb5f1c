"""store_dd's warp sum in cuda/ssd_bwd.cu (the dD partial of a 64-row block), emulated on the CPU:
the reduce-scatter over the 8 lanes of one column quad (halve_sum<8>, <4>, <2>: at xor 2N a lane
keeps the N values of its half and adds its partner's same half) must leave lane l with the warp's
sums of columns 8 j + 2 (l % 4) + {0, 1}, j = 4 b4 + 2 b3 + b2 (b_k: bit k of l), which is where
the kernel stores them. Thread l's 16 inputs are dd[j][i] for column acc_col(j, i) = 8 j + 2 (l % 4)
+ i of the m16n8 accumulator layout (its rows l / 4 and l / 4 + 8)."""

from __future__ import annotations

import numpy as np
import pytest


def halve_sum(v: np.ndarray, n: int) -> np.ndarray:
    """One step over all 32 lanes at once: v (32, 16) -> v with v[:, :n] the kept sums."""
    lanes = np.arange(32)
    upper = (lanes & (2 * n)) != 0
    keep = np.where(upper[:, None], v[:, n : 2 * n], v[:, :n])
    send = np.where(upper[:, None], v[:, :n], v[:, n : 2 * n])
    out = v.copy()
    out[:, :n] = keep + send[lanes ^ (2 * n)]  # __shfl_xor_sync(send, 2 n)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_reduce_scatter_leaves_each_lane_its_column_sums(seed: int) -> None:
    rng = np.random.default_rng(seed)
    dd = rng.standard_normal((32, 8, 2))  # lane, j, i
    # the warp's sum of each of the 64 columns (each column held by the 8 lanes l with l % 4 == t)
    want = np.zeros(64)
    for lane in range(32):
        for j in range(8):
            for i in range(2):
                want[8 * j + 2 * (lane & 3) + i] += dd[lane, j, i]
    v = dd.reshape(32, 16)  # v[2 j + i] = dd[j][i]
    for n in (8, 4, 2):
        v = halve_sum(v, n)
    got = np.full(64, np.nan)
    for lane in range(32):
        j = 4 * ((lane >> 4) & 1) + 2 * ((lane >> 3) & 1) + ((lane >> 2) & 1)
        col = 8 * j + 2 * (lane & 3)
        assert np.isnan(got[col : col + 2]).all(), "two lanes store the same column"
        got[col : col + 2] = v[lane, :2]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
