"""The benchmark's correctness guards can fail: a NaN output, an output off by more than the
tolerance, a wrong shape or a missing output gives FAILED; a correct output passes. CPU only
(small torch-CPU arrays); the timed runs themselves need the GPU."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from flashscan.bench.config import make_config  # noqa: E402
from flashscan.bench.guards import (  # noqa: E402
    AttnGuard,
    ScanGuard,
    StateGuard,
    check_outputs,
    compare,
)
from flashscan.bench.meta import neutral_path, neutral_text  # noqa: E402
from flashscan.bench.references import (  # noqa: E402
    attention_grads_reference,
    attention_rows_reference,
    torch_selective_scan,
    torch_state_update,
)
from flashscan.bench.results import Ceilings  # noqa: E402
from flashscan.bench.runner import Impl, Runner  # noqa: E402
from flashscan.bench.training import guard_cell, render, scan_grads_reference  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_compare_passes_a_correct_output_and_fails_nan_offset_and_shape() -> None:
    ref = torch.randn(4, 8, dtype=torch.float64)
    ok, _ = compare(torch, ref.to(torch.bfloat16), ref, 2e-2)
    assert ok
    nan = ref.clone()
    nan[1, 3] = float("nan")
    ok, m = compare(torch, nan, ref, 2e-2)
    assert not ok and not m["finite"]
    ok, m = compare(torch, ref * 1.1, ref, 2e-2)  # 10% off: 5x the tolerance
    assert not ok and m["rel_rms_err"] > 2e-2
    ok, m = compare(torch, ref[:, :1], ref, 2e-2)  # would broadcast
    assert not ok and "shape" in m
    ok, _ = compare(torch, ref, torch.full_like(ref, float("inf")), 2e-2)
    assert not ok


def test_check_outputs_fails_when_any_output_is_off_or_missing() -> None:
    a, b = torch.randn(3, 5, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    ok, err, why = check_outputs(torch, [("out", a.float(), a), ("dq", b.float(), b)], 2e-2)
    assert ok and err < 1e-6 and why == ""
    bad = b.clone()
    bad[0] = float("nan")
    ok, err, why = check_outputs(torch, [("out", a, a), ("dq", bad, b)], 2e-2)
    assert not ok and math.isinf(err) and why.startswith("dq:")
    ok, _, why = check_outputs(torch, [("out", a + 0.5 * a.abs().max(), a)], 2e-2)
    assert not ok and "out:" in why
    ok, _, why = check_outputs(torch, [("dk", None, a)], 2e-2)
    assert not ok and "no output" in why
    assert not check_outputs(torch, [], 2e-2)[0]


def test_attention_guard() -> None:
    b, s, h, d = 2, 37, 3, 16
    st = {x: torch.randn(b, s, h, d) for x in "qkv"}
    guard = AttnGuard(torch, st, True, "fp32", max_rows=9)
    full = attention_rows_reference(
        torch, st["q"], st["k"], st["v"], True, list(range(b)), torch.arange(s)
    )
    assert guard.check(full.float(), st, False)[0]
    wrong = full.clone()
    wrong[:, -1] += 1.0  # only the last query row, which the guard always checks
    assert not guard.check(wrong, st, False)[0]
    nan = full.clone()
    nan[0, 5, 1, 2] = float("nan")  # a row the guard does not compare: finite_all catches it
    ok, m = guard.check(nan, st, False)
    assert not ok and not m["finite_all"]


def _scan_set(b: int = 2, dim: int = 6, L: int = 11, n: int = 4) -> dict[str, Any]:
    return {
        "u": torch.randn(b, dim, L),
        "delta": torch.randn(b, dim, L) * 0.5 - 1.0,
        "A": -(torch.rand(dim, n) + 0.5),
        "B": torch.randn(b, n, L),
        "C": torch.randn(b, n, L),
        "D": torch.randn(dim),
        "z": torch.randn(b, dim, L),
    }


def test_scan_guard() -> None:
    st = _scan_set()
    guard = ScanGuard(torch, st, "fp32")
    out, _ = torch_selective_scan(torch, **st, delta_softplus=True)
    assert guard.check(out, st, False)[0]
    assert not guard.check(out * 1.05, st, False)[0]
    out[1, 2, 3] = float("inf")
    assert not guard.check(out, st, False)[0]


def test_state_guard_checks_output_and_state() -> None:
    b, dim, n = 3, 5, 4
    st = {
        "state": torch.randn(b, dim, n),
        "x": torch.randn(b, dim),
        "dt": torch.randn(b, dim) * 0.5 - 1.0,
        "A": -(torch.rand(dim, n) + 0.5),
        "B": torch.randn(b, n),
        "C": torch.randn(b, n),
        "D": torch.randn(dim),
        "z": torch.randn(b, dim),
        "dt_bias": torch.randn(dim) * 0.5,
    }
    guard = StateGuard(torch, st, "fp32")

    def run(st2: dict[str, Any], state_off: float = 0.0) -> Any:
        out, _ = torch_state_update(torch, **st2, dt_softplus=True, inplace=True)
        st2["state"].add_(state_off)
        return out

    c = guard.prepare(st)
    assert guard.check(run(c), c, False)[0]
    c = guard.prepare(st)
    assert not guard.check(run(c, state_off=1.0), c, False)[0]  # right out, wrong state
    guard.restore(st)
    assert torch.equal(st["state"], guard.state0)


class _FakeTimer:
    """Host-only stand-in for Timer (no GPU here): every time is 1 ms."""

    description = "fake"

    def gpu(self, fn: Any) -> float:
        fn()
        return 1e-3

    wall = call_sync = host = gpu

    def sync(self) -> None:
        pass


def test_runner_marks_a_nan_or_wrong_implementation_failed() -> None:
    cfg = make_config(True)
    logs: list[str] = []
    rn = Runner(
        torch,
        None,
        torch.device("cpu"),
        cfg,
        _FakeTimer(),  # type: ignore[arg-type]
        Ceilings(copy_bw=1e12),
        True,
        "",
        {},
        logs.append,
    )
    st = _scan_set()
    guard = ScanGuard(torch, st, "fp32")

    def good(s: dict[str, Any]) -> Any:
        return lambda: torch_selective_scan(torch, **s, delta_softplus=True)[0]

    def nan(s: dict[str, Any]) -> Any:
        return lambda: torch.full_like(s["u"], float("nan"))

    def off(s: dict[str, Any]) -> Any:
        return lambda: torch_selective_scan(torch, **s, delta_softplus=True)[0] * 1.5

    def raises(s: dict[str, Any]) -> Any:
        def call() -> Any:
            raise RuntimeError("kernel launch failed")

        return call

    rows = {}
    for name, make in (("good", good), ("nan", nan), ("off", off), ("raises", raises)):
        impl = Impl(name, "peer", make=make)
        rows[name] = rn.run_impl("scan", "tiny", {}, impl, [st], guard, (0, 1e6, 0), ("gpu",))
    assert rows["good"].status == "ok" and rows["good"].gpu_s == 1e-3
    assert rows["nan"].status == "FAILED" and "not finite" in rows["nan"].note
    assert rows["off"].status == "FAILED" and "off" in rows["off"].note
    assert rows["raises"].status == "error"
    rn.unguarded("scan", "huge", {}, MemoryError("reference too big"))
    assert rn.rows[-1].status == "FAILED" and rn.rows[-1].gpu_s is None
    assert any("FAILED" in line for line in logs)


def test_attention_grads_reference_matches_autograd() -> None:
    b, sq, sk, h, d = 2, 19, 23, 3, 8
    q = torch.randn(b, sq, h, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, sk, h, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, sk, h, d, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(b, sq, h, d, dtype=torch.float64)
    mask = torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq)
    o = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask
    ).transpose(1, 2)
    want = (o, *torch.autograd.grad(o, (q, k, v), dout))
    got = attention_grads_reference(torch, q.detach(), k, v, dout, True, [1], [0, 2], block=4)
    for w, g in zip(want, got):
        assert torch.allclose(w.detach()[[1]][:, :, [0, 2]], g, atol=1e-12)


def test_scan_grads_reference_chunks_match_one_pass() -> None:
    st = _scan_set(b=3, dim=4, L=9, n=2)
    args = [st[k] for k in ("u", "delta", "A", "B", "C", "D", "z")] + [torch.randn(4) * 0.3]
    dout = torch.randn(3, 4, 9)
    out1, g1 = scan_grads_reference(torch, args, dout)
    out2, g2 = scan_grads_reference(torch, args, dout, max_elems=1)  # one batch per chunk
    assert torch.allclose(out1, out2)
    for a, b in zip(g1, g2):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-10)
    # and they are gradients: a finite-difference check on delta_bias
    eps = 1e-6
    bias = args[7].double()
    bumped = bias.clone()
    bumped[1] += eps

    def loss(bb: Any) -> float:
        a2 = [t.double() for t in args[:7]]
        y, _ = torch_selective_scan(
            torch, *a2, delta_bias=bb, delta_softplus=True, acc=torch.float64
        )
        return float((y * dout.double()).sum())

    fd = (loss(bumped) - loss(bias)) / eps
    assert abs(fd - float(g1[7][1])) < 1e-4 * max(1.0, abs(fd))


def test_training_report_never_shows_an_unchecked_row_as_ok() -> None:
    assert guard_cell({"status": "ok", "guard_rel_rms": 1e-3}) == "ok (1.0e-03)"
    assert guard_cell({"status": "FAILED", "guard_rel_rms": math.inf}).startswith("**FAILED**")
    assert "ok" not in guard_cell({"status": "FAILED"})
    meta = dict.fromkeys(("date", "device", "driver", "torch", "flashscan", "commit", "nvrtc"), "x")
    meta["command"] = "python benches/backward.py"
    rows = [
        {"suite": "attention", "impl": "flashscan", "hd": 64, "causal": False, "seqlen": 16384}
        | {"status": "FAILED", "guard_rel_rms": math.inf, "note": "dq: output not finite"},
        {"suite": "scan", "impl": "flashscan", "batch": 8, "dim": 2048, "seqlen": 8192}
        | {"status": "FAILED", "note": "RuntimeError: out of memory"}
        | {"speedup_vs_anchor": None, "mamba_bwd_anchor_ms": 9.5, "bw_floor_ms": 0.1},
    ]
    md = render(meta, rows)
    assert "ok (nan)" not in md and "(nan)" not in md
    assert md.count("**FAILED**") >= 2 and "## Guard failures" in md


def test_training_report_shows_the_sm90_backward_row_beside_ours() -> None:
    from flashscan.bench.training import SM90_IMPL

    meta = dict.fromkeys(("date", "device", "driver", "torch", "flashscan", "commit", "nvrtc"), "x")
    meta["command"] = "python benches/backward.py --sm90-bwd"
    shape = {"suite": "attention", "hd": 128, "causal": True, "seqlen": 4096}
    timed = {"status": "ok", "guard_rel_rms": 1e-3, "step_ms": 1.0, "fwd_tflops": 600.0}
    rows = [
        shape | timed | {"impl": "flashscan", "step_tflops": 266.0, "bwd_tflops": 222.0},
        shape
        | {"impl": SM90_IMPL, "status": "FAILED", "guard_rel_rms": 0.5}
        | {"step_ms": 0.5, "step_tflops": 555.0, "bwd_tflops": 512.0, "note": "dq off"},
    ]
    md = render(meta, rows)
    assert "wgmma bwd fwd+bwd" in md
    line = next(x for x in md.splitlines() if x.startswith("| 128 | 1 | 4096 |"))
    assert "266" in line and "555 **FAILED**" in line and line.endswith("**FAILED** (5.0e-01) |")
    # without the option the table keeps its columns
    assert "wgmma" not in render(meta, rows[:1])


def test_paths_are_made_neutral() -> None:
    root = "/work/checkout"
    assert neutral_path("/work/checkout/benches/x.py", root) == "benches/x.py"
    assert neutral_path("/opt/v/.venv/lib/python3.12/site-packages/nvidia/lib/a.so", root) == (
        "<site-packages>/nvidia/lib/a.so"
    )
    assert neutral_path("/home/someone/out", root) == "<local>/out"
    text = neutral_text("python /work/checkout/benches/b.py --out /tmp/r https://x.org/a", root)
    assert text == "python benches/b.py --out <local>/r https://x.org/a"


def test_committed_results_carry_no_machine_local_paths() -> None:
    bad = ("/tmp/", "/root/", "/home/", "/work/", "/opt/", "/Users/", "/site-packages/")
    for f in (REPO / "benches" / "results").rglob("*"):
        if f.is_file() and f.suffix != ".png":
            text = f.read_text(encoding="utf-8", errors="replace")
            found = [b for b in bad if b in text]
            assert not found, f"{f.relative_to(REPO)}: {found}"


def _varlen_bench() -> Any:
    """benches/varlen.py as a module (its timed runs need the GPU; its guards do not)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_varlen", REPO / "benches" / "varlen.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h,hk", [(4, 4), (4, 2)])
def test_varlen_bench_dense_rows_are_guarded(causal: bool, h: int, hk: int) -> None:
    """The varlen bench's dense rows: float32 SDPA on the padded batch matches our reference
    (GQA heads grouped as flash-attn does), a correct bf16 output passes, a NaN or an offset
    one fails, and a row whose guard did not run is never ok."""
    import numpy as np

    from flashscan import reference

    vb = _varlen_bench()
    b, s, d = 3, 9, 16
    q = torch.randn(b, s, h, d).to(torch.bfloat16)
    k = torch.randn(b, s, hk, d).to(torch.bfloat16)
    v = torch.randn(b, s, hk, d).to(torch.bfloat16)
    q[1, 6:] = k[1, 6:] = v[1, 6:] = 0  # a padded sequence
    want = torch.from_numpy(
        reference.flash_attn_func(
            *(t.double().numpy() for t in (q, k, v)),
            causal=causal,
            accum_dtype=np.dtype(np.float64),
        )
    )
    sdpa = vb.sdpa_float32(q, k, v, causal)
    assert vb.rel_rms(sdpa, want) < 1e-5
    got = want.to(torch.bfloat16)
    err = vb.dense_error(got, q, k, v, causal, (0, b - 1))
    assert err <= vb.TOL
    assert vb.row_status({"status": "ok", "rel_rms": err}) == "ok"
    bad = got.clone()
    bad[b - 1, 2, 1, 3] = float("nan")
    assert (
        vb.row_status({"status": "ok", "rel_rms": vb.dense_error(bad, q, k, v, causal, (0, b - 1))})
        == "FAILED"
    )
    off = got * 1.1
    assert (
        vb.row_status({"status": "ok", "rel_rms": vb.dense_error(off, q, k, v, causal, (0, b - 1))})
        == "FAILED"
    )
    if h != hk:  # kv heads served to the wrong q heads: caught
        swapped = vb.dense_error(got, q, k.flip(2), v.flip(2), causal, (0, b - 1))
        assert not swapped <= vb.TOL
    assert vb.row_status({"status": "ok"}) == "FAILED"  # never "ok (nan)"
    assert vb.row_status({"status": "ok", "rel_rms": math.nan}) == "FAILED"
    assert vb.row_status({"status": "FAILED", "rel_rms": 0.0}) == "FAILED"


def test_peer_commit_is_the_snapshots_not_the_enclosing_repository(tmp_path: Path) -> None:
    """A peer snapshot carried inside our work tree (.peers/mamba) must not report our commit:
    its COMMIT file wins, and a folder that is not its own repository's top is 'unknown'."""
    import subprocess

    from flashscan.bench.mamba_src import source_commit

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    inner = tmp_path / "peers" / "mamba"
    inner.mkdir(parents=True)
    assert source_commit(str(inner)) == "unknown"
    (inner / "COMMIT").write_text("e9594ce\n", encoding="utf-8")
    assert source_commit(str(inner)) == "e9594ce"
