"""`_frameworks`' output helpers of the attention ops' general paths (`out_and_lse`,
`finished`), with a handler that hands `_native` arrays (not descriptors) and wraps what it
allocated after the call, as the jax handler does. CPU only."""

from __future__ import annotations

from typing import Any

import numpy as np

from flashscan._frameworks import NumpyHandler, finished, new_output, out_and_lse


class Boxed:
    def __init__(self, a: np.ndarray) -> None:
        self.a = a


class Wrapping(NumpyHandler):
    """Allocates NumPy arrays, hands `_native` the arrays, wraps them in `finish`."""

    needs_finish = True

    def finish(self, x: Any) -> Any:
        return Boxed(x)


class Fast(NumpyHandler):
    fast = True


def test_new_outputs_like_q() -> None:
    q = np.ones((2, 3, 4, 8), np.float16)
    h = Wrapping()
    dq = h.describe(q, "q")
    out, oa, lse, la = out_and_lse(h, q, dq, None, None, None, (2, 4, 3))
    assert oa is out and la is lse  # not fast: the arrays themselves
    assert (out.shape, out.dtype) == (q.shape, q.dtype)
    assert (lse.shape, lse.dtype) == ((2, 4, 3), np.float32)
    fo, fl = finished(h, out, lse)
    assert isinstance(fo, Boxed) and fo.a is out and isinstance(fl, Boxed) and fl.a is lse
    out, oa, lse, la = out_and_lse(h, q, dq, None, None, None, None)
    assert lse is None and la is None
    fo, fl = finished(h, out, None)
    assert fo.a is out and fl is None


def test_given_out_and_descriptors() -> None:
    q = np.ones((3, 4, 8), np.float32)
    h = Fast()
    dq = h.describe(q, "q")
    given = np.empty_like(q)
    do = h.describe(given, "out")
    out, oa, lse, la = out_and_lse(h, q, dq, given, h, do, (4, 3))
    assert out is given and oa == do
    assert la == h.describe(lse, "lse") and lse.dtype == np.float32
    fo, fl = finished(h, out, lse)
    assert fo is out and fl is lse  # nothing to finish
    a, arg = new_output(h, (5, 2), "float32", q, dq)
    assert a.shape == (5, 2) and arg == h.describe(a, "x")
