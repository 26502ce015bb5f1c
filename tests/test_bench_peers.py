"""mamba_ssm as a measured peer (`--mamba-src`): a checkout that cannot be built is reported
absent with its reason, never raised; the training report compares with the measured peer and
shows its guard; measured peers replace the anchors. CPU only: the build itself needs nvcc."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from flashscan.bench import mamba_src  # noqa: E402
from flashscan.bench.training import render  # noqa: E402


def test_a_checkout_without_mamba_ssm_is_an_error_not_an_exception(tmp_path: Path) -> None:
    (tmp_path / "COMMIT").write_text("abc1234\n")
    logged: list[str] = []
    info = mamba_src.load(str(tmp_path), None, logged.append)
    assert info["src_commit"] == "abc1234"
    assert "no mamba_ssm/ package directory" in info["error"]
    assert logged and "not built" in logged[0]
    assert "selective_scan_cuda" not in sys.modules or info["error"]


def _meta() -> dict:
    meta = dict.fromkeys(("date", "device", "driver", "torch", "flashscan", "commit", "nvrtc"), "x")
    meta["command"] = "python benches/backward.py --mamba-src <local>/mamba"
    meta["mamba_ssm"] = "source commit abc1234, built in this run (50.0 s)"
    return meta


def _scan_row(impl: str, fwd: float, step: float, **kw: object) -> dict:
    row = {"suite": "scan", "impl": impl, "batch": 32, "dim": 512, "seqlen": 60, "dstate": 16}
    row |= {"status": "ok", "guard_rel_rms": 1e-3, "fwd_ms": fwd, "step_ms": step}
    row |= {"speedup_vs_anchor": None, "mamba_bwd_anchor_ms": None, "bw_floor_ms": 0.01}
    return row | kw


def test_training_report_compares_with_the_measured_mamba_ssm() -> None:
    rows = [_scan_row("flashscan", 0.020, 0.100), _scan_row("mamba_ssm", 0.080, 0.300)]
    md = render(_meta(), rows)
    assert "mamba_ssm: source commit abc1234" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| 32 | 512 | 60 | 20.0 us"))
    assert "| 80.0 us | 4.00x |" in line and "| 300.0 us | 3.00x |" in line
    assert line.endswith("ok (1.0e-03) |")


def test_a_failed_mamba_ssm_row_shows_failed_not_a_speedup() -> None:
    bad = _scan_row("mamba_ssm", 0.080, 0.300, status="FAILED", guard_rel_rms=math.inf)
    bad["note"] = "fwd out: output not finite"
    md = render(_meta(), [_scan_row("flashscan", 0.020, 0.100), bad])
    line = next(ln for ln in md.splitlines() if ln.startswith("| 32 | 512 | 60 | 20.0 us"))
    assert line.endswith("**FAILED** |") or "**FAILED**" in line
    assert "## Guard failures" in md and "mamba_ssm" in md.split("## Guard failures")[1]
