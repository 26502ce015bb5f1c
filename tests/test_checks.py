"""`_checks.attention_options`, the one check of the attention options (causal, return_lse,
window_size, softmax_scale, softcap) behind every attention entry: its values, and every
entry (the API's dense, varlen and kvcache calls, the torch adapter's dense and varlen ops,
the jax adapter) raising exactly what it raises. CPU only."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import flashscan
from flashscan import _checks

DEFAULTS = {
    "causal": False,
    "window_size": (-1, -1),
    "softmax_scale": None,
    "softcap": 0.0,
    "return_lse": False,
}

BAD = [
    {"causal": "yes"},
    {"causal": 2},
    {"return_lse": "no"},
    {"window_size": (-2, 0)},
    {"window_size": "ab"},
    {"window_size": (1.5, 0)},
    {"window_size": (1, 2, 3)},
    {"softcap": -1.0},
    {"softcap": float("nan")},
    {"softcap": "x"},
    {"softmax_scale": "x"},
    {"softmax_scale": float("inf")},
    {"softmax_scale": True},
    {"causal": "yes", "softcap": -1.0},  # the first bad option in the check order is named
]


def _options(headdim: int = 8, **over: Any) -> tuple[Any, ...]:
    return _checks.attention_options(headdim, **{**DEFAULTS, **over})


def test_values() -> None:
    assert _options() == (1.0 / math.sqrt(8), -1, -1, 0.0, False, False)
    assert _options(64, causal=True) == (0.125, -1, 0, 0.0, True, False)
    scale, wl, wr, cap, causal, lse = _options(
        causal=np.bool_(True),
        window_size=[3, 5],
        softmax_scale=np.float32(0.5),
        softcap=2,
        return_lse=1,
    )
    assert (scale, wl, wr, cap, causal, lse) == (0.5, 3, 0, 2.0, True, True)
    assert type(scale) is float and type(cap) is float and type(causal) is bool
    assert _options(window_size=(4, 7)) == (1.0 / math.sqrt(8), 4, 7, 0.0, False, False)
    # the unbounded window however it is spelled (the dense API always took these)
    for w in ((-1, -1), np.array([-1, -1]), (np.int64(-1), -1), (-1.0, -1)):
        assert _options(window_size=w)[1:3] == (-1, -1)


def _entries() -> list[tuple[str, Callable[..., Any]]]:
    rng = np.random.default_rng(0)
    q4 = rng.standard_normal((1, 3, 2, 8)).astype(np.float32)
    q3 = q4[0]
    cu = np.array([0, 3], np.int32)
    cache = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
    q1 = q4[:, :1]
    entries: list[tuple[str, Callable[..., Any]]] = [
        ("api dense", lambda **o: flashscan.flash_attn_func(q4, q4, q4, **o)),
        ("api varlen", lambda **o: flashscan.flash_attn_varlen_func(q3, q3, q3, cu, cu, 3, 3, **o)),
        ("api kvcache", lambda **o: flashscan.flash_attn_with_kvcache(q1, cache, cache, **o)),
    ]
    try:
        import torch

        import flashscan.torch as fst
    except ImportError:
        pass
    else:
        t4, t3, tcu = torch.from_numpy(q4), torch.from_numpy(q3), torch.from_numpy(cu)
        entries += [
            ("torch dense", lambda **o: fst.flash_attn_func(t4, t4, t4, **o)),
            (
                "torch varlen",
                lambda **o: fst.flash_attn_varlen_func(t3, t3, t3, tcu, tcu, 3, 3, **o),
            ),
        ]
    try:
        import jax.numpy as jnp

        import flashscan.jax as fsj
    except ImportError:
        pass
    else:
        j4 = jnp.asarray(q4)
        entries.append(("jax dense", lambda **o: fsj.flash_attn_func(j4, j4, j4, **o)))
    return entries


ENTRIES = _entries()


@pytest.mark.parametrize("bad", BAD, ids=lambda b: ",".join(f"{k}={v!r}" for k, v in b.items()))
@pytest.mark.parametrize("entry", ENTRIES, ids=[n for n, _ in ENTRIES])
def test_every_entry_raises_what_the_check_raises(
    entry: tuple[str, Callable[..., Any]], bad: dict
) -> None:
    with pytest.raises(Exception) as want:
        _options(**bad)
    assert isinstance(want.value, (TypeError, ValueError))
    with pytest.raises(type(want.value)) as got:
        entry[1](**bad)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("entry", ENTRIES, ids=[n for n, _ in ENTRIES])
def test_every_entry_takes_plain_and_numpy_options(entry: tuple[str, Callable[..., Any]]) -> None:
    plain = entry[1](causal=True, window_size=(2, 0), softmax_scale=0.5, softcap=3.0)
    spelled = entry[1](
        causal=np.bool_(True), window_size=[2, 9], softmax_scale=np.float32(0.5), softcap=3
    )
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(spelled))
    out, lse = entry[1](return_lse=np.bool_(True))
    assert np.asarray(lse).dtype == np.float32
