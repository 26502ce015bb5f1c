"""The Python side of the native servers (src/serve/), without a GPU: each core
function hands its call to its server's `serve` first (arguments in the native order, learn
False), returns what it serves, takes the call itself when it serves nothing (None), and never
calls it while torch.compile traces."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import flashscan
import flashscan.conv as conv
import flashscan.scan as scan
import flashscan.ssd as ssd

torch = pytest.importorskip("torch")


class FakeServe:
    def __init__(self, result: Any) -> None:
        self.result = result
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> Any:
        self.calls.append(args)
        return self.result


def _scan_args() -> list[Any]:
    b, d, L, n = 1, 4, 6, 2
    return [
        torch.randn(b, d, L),
        torch.rand(b, d, L),
        -torch.rand(d, n),
        torch.randn(b, n, L),
        torch.randn(b, n, L),
    ]


@pytest.fixture
def servers(monkeypatch: Any) -> Any:
    """The four `_SERVE` slots and the compile test, restored afterwards."""
    for mod, name in ((scan, "_SERVE"), (scan, "_SSU_SERVE"), (conv, "_UPDATE_SERVE")):
        monkeypatch.setattr(mod, name, None)
    monkeypatch.setattr(ssd, "_SERVE", None)
    for mod in (scan, conv, ssd):
        monkeypatch.setattr(mod, "_is_compiling", lambda: False)
    return monkeypatch


def test_scan_takes_what_its_server_serves(servers: Any) -> None:
    a = _scan_args()
    fake = FakeServe("served")
    servers.setattr(scan, "_SERVE", fake)
    D = torch.randn(4)
    assert flashscan.selective_scan_fn(*a, D=D, delta_softplus=True) == "served"
    assert fake.calls == [(*a, D, None, None, None, True, False, False)]


def test_scan_serves_itself_when_the_server_declines(servers: Any) -> None:
    a = _scan_args()
    fake = FakeServe(None)
    servers.setattr(scan, "_SERVE", fake)
    out, last = flashscan.selective_scan_fn(*a, return_last_state=True)
    assert len(fake.calls) == 1
    want, want_last = flashscan.reference.selective_scan_fn(
        *[t.numpy() for t in a], return_last_state=True
    )
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(last.numpy(), want_last, rtol=1e-5, atol=1e-6)


def test_no_server_is_called_while_compiling(servers: Any) -> None:
    fake = FakeServe("served")
    for mod, name in ((scan, "_SERVE"), (scan, "_SSU_SERVE"), (conv, "_UPDATE_SERVE")):
        servers.setattr(mod, name, fake)
    servers.setattr(ssd, "_SERVE", fake)
    for mod in (scan, conv, ssd):
        servers.setattr(mod, "_is_compiling", lambda: True)
    a = _scan_args()
    assert isinstance(flashscan.selective_scan_fn(*a), torch.Tensor)
    state = torch.randn(2, 4, 3)
    x = torch.randn(2, 4)
    A = -torch.rand(4, 3)
    B = torch.randn(2, 3)
    assert isinstance(flashscan.selective_state_update(state, x, x, A, B, B), torch.Tensor)
    cs, w = torch.randn(2, 4, 3), torch.randn(4, 4)
    assert isinstance(flashscan.causal_conv1d_update(x, cs, w), torch.Tensor)
    t = [torch.randn(1, 8, 2, 4), torch.rand(1, 8, 2), -torch.rand(2)]
    bc = [torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4)]
    assert isinstance(flashscan.mamba_chunk_scan_combined(*t, *bc, 4), torch.Tensor)
    assert fake.calls == []


def test_state_update_conv_update_and_ssd_take_what_their_servers_serve(servers: Any) -> None:
    fake = FakeServe("served")
    servers.setattr(scan, "_SSU_SERVE", fake)
    servers.setattr(conv, "_UPDATE_SERVE", fake)
    servers.setattr(ssd, "_SERVE", fake)
    state, x, A, B = torch.randn(2, 4, 3), torch.randn(2, 4), -torch.rand(4, 3), torch.randn(2, 3)
    assert flashscan.selective_state_update(state, x, x, A, B, B, dt_softplus=True) == "served"
    assert fake.calls[-1] == (state, x, x, A, B, B, None, None, None, True, False)
    cs, w = torch.randn(2, 4, 3), torch.randn(4, 4)
    assert flashscan.causal_conv1d_update(x, cs, w, activation="silu") == "served"
    assert fake.calls[-1] == (x, cs, w, None, None, "silu", False)
    t = [torch.randn(1, 8, 2, 4), torch.rand(1, 8, 2), -torch.rand(2)]
    bc = [torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4)]
    assert flashscan.mamba_chunk_scan_combined(*t, *bc, 64, dt_softplus=True) == "served"
    args = fake.calls[-1]
    assert args[:6] == (*t, *bc, 64) and args[12] is True and args[-1] is False
    assert len(fake.calls) == 3
