"""`flashscan._resources` and `python -m flashscan resources` on the CPU: the cuobjdump
resource-usage parser on a captured sample, the tool lookup, and the command on one small
family (skipped where NVRTC or cuobjdump is missing)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from flashscan import _backend, _resources
from flashscan.__main__ import main
from flashscan._resources import Usage, VariantUsage

# `cuobjdump --dump-resource-usage` (CUDA 13.5) of a selective_scan_bwd CUBIN for sm_80: three
# kernels in one CUBIN, one with a stack frame.
SAMPLE = """
Resource usage:
 Common:
  GLOBAL:103 CONSTANT[4]:224
 Function selective_scan_bwd_zero:
  REG:18 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:1064 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function selective_scan_bwd_states:
  REG:47 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:1064 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function selective_scan_bwd:
  REG:128 STACK:32 SHARED:1024 LOCAL:8 CONSTANT[0]:1064 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_parser_reads_every_function() -> None:
    rows = _resources.parse_resource_usage(SAMPLE)
    assert rows == [
        Usage("selective_scan_bwd_zero", 18, 0, 0, 0),
        Usage("selective_scan_bwd_states", 47, 0, 0, 0),
        Usage("selective_scan_bwd", 128, 32, 8, 1024),
    ]
    assert [r.spills for r in rows] == [False, False, True]
    assert _resources.parse_resource_usage("") == []
    # a usage line with no function before it (the "Common" block's kind) is not a kernel
    assert _resources.parse_resource_usage(" REG:1 STACK:0 SHARED:0 LOCAL:0\n") == []


def test_table_and_json_shapes() -> None:
    rows = tuple(_resources.parse_resource_usage(SAMPLE))
    res = [
        VariantUsage(
            "selective_scan_bwd.x[A=1]", "selective_scan_bwd", "selective_scan_bwd", False, rows
        ),
        VariantUsage(
            "state_update.y[B=2]",
            "state_update",
            "selective_state_update",
            True,
            (Usage("selective_state_update", 52, 0, 0, 0),),
        ),
    ]
    table = _resources.format_table("sm_80", res).splitlines()
    assert table[0].split()[:5] == ["regs", "stack", "local", "smem", "flags"]
    assert len(table) == 1 + 4 + 1
    assert table[3].split() == [
        "128",
        "32",
        "8",
        "1024",
        "SPILL",
        "selective_scan_bwd",
        res[0].name,
    ]
    assert table[4].split() == ["52", "0", "0", "0", "main", "selective_state_update", res[1].name]
    assert table[-1].startswith("sm_80: 2 variant(s), 4 kernel function(s), at most 128 registers")
    assert "1 function(s) with stack/local bytes (0 in main variants)" in table[-1]
    d = json.loads(json.dumps(res[0].as_dict()))
    assert d["functions"][2] == {
        "function": "selective_scan_bwd",
        "registers": 128,
        "stack": 32,
        "local": 8,
        "shared": 1024,
    }


def test_normalize_arch() -> None:
    assert _resources.normalize_arch("sm_90a") == "sm_90a"
    assert _resources.normalize_arch("90a") == "sm_90a"
    assert _resources.normalize_arch("80") == "sm_80"
    for bad in ("hopper", "sm_", "sm_90b", ""):
        with pytest.raises(ValueError, match="expected a name like sm_80"):
            _resources.normalize_arch(bad)


def test_cuobjdump_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert _resources.find_cuobjdump() is None
    with pytest.raises(FileNotFoundError, match="pip install nvidia-cuda-cuobjdump"):
        _resources.resource_usage(b"\x7fELF")
    tool = tmp_path / "nvidia" / "cuda_cuobjdump" / "bin" / "cuobjdump"  # the CUDA 12 wheel
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert _resources.find_cuobjdump() == str(tool)
    on_path = tmp_path / "bin" / "cuobjdump"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(on_path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert _resources.find_cuobjdump() == str(on_path)  # PATH first


def _nvrtc_present() -> bool:
    return (
        _backend.native is not None
        and _backend.native.backend_status()["nvrtc_version"] is not None
    )


needs_native = pytest.mark.skipif(_backend.native is None, reason="the native module is not built")


@needs_native
def test_cli_names_the_wheel_when_cuobjdump_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_resources, "find_cuobjdump", lambda: None)
    if not _nvrtc_present():
        pytest.skip("NVRTC not installed (pip install nvidia-cuda-nvrtc)")
    assert main(["resources", "--family", "state_update"]) == 1
    err = capsys.readouterr().err
    assert "pip install nvidia-cuda-cuobjdump" in err


@needs_native
def test_cli_rejects_unknown_family_and_arch(capsys: pytest.CaptureFixture[str]) -> None:
    if not _nvrtc_present() or _resources.find_cuobjdump() is None:
        pytest.skip("NVRTC or cuobjdump not installed")
    assert main(["resources", "--family", "nope"]) == 2
    err = capsys.readouterr().err
    assert "family nope: unknown" in err and "state_update" in err
    assert main(["resources", "--arch", "hopper"]) == 2
    assert "expected a name like sm_80" in capsys.readouterr().err


@needs_native
def test_cli_on_one_small_family(capsys: pytest.CaptureFixture[str]) -> None:
    """The state-update family's main variants for sm_80 (10 small compiles), as JSON and as
    the table, agree with each other and with the variant list."""
    if not _nvrtc_present():
        pytest.skip("NVRTC not installed (pip install nvidia-cuda-nvrtc)")
    if _resources.find_cuobjdump() is None:
        pytest.skip(_resources.CUOBJDUMP_MISSING)
    args = ["resources", "--arch", "80", "--family", "state_update", "--main", "--workers", "2"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["arch"] == "sm_80"
    variants = _backend.native.kernel_variants("sm_80")
    want = [v["name"] for v in variants if v["family"] == "state_update" and v["main"]]
    assert [v["name"] for v in report["variants"]] == want and want
    for v in report["variants"]:
        assert v["family"] == "state_update" and v["main"]
        funcs = {f["function"]: f for f in v["functions"]}
        f = funcs["selective_state_update"]
        assert 0 < f["registers"] <= 255
        assert f["stack"] == 0 and f["local"] == 0  # a main variant never spills
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["regs", "stack", "local", "smem"]
    rows = [line for line in lines if "selective_state_update" in line and "[" in line]
    assert len(rows) == len(want)
    assert all(row.split()[4] == "main" for row in rows)
    assert lines[-2].startswith(f"sm_80: {len(want)} variant(s)")
    assert os.path.basename(report["cuobjdump"]).startswith("cuobjdump")


@needs_native
def test_cli_only_compiles_the_variants_named(capsys: pytest.CaptureFixture[str]) -> None:
    """--only SUBSTR keeps the variants whose name contains it: one bf16 state-update variant for
    sm_80 is one compile, and a substring matching nothing is a clear error."""
    if not _nvrtc_present():
        pytest.skip("NVRTC not installed (pip install nvidia-cuda-nvrtc)")
    if _resources.find_cuobjdump() is None:
        pytest.skip(_resources.CUOBJDUMP_MISSING)
    variants = _backend.native.kernel_variants("sm_80")
    name = next(v["name"] for v in variants if v["family"] == "state_update" and v["main"])
    assert main(["resources", "--arch", "sm_80", "--only", name, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    want = [v["name"] for v in variants if name in v["name"]]
    assert [v["name"] for v in report["variants"]] == want and name in want
    assert main(["resources", "--arch", "sm_80", "--only", "no-such-kernel["]) == 1
    assert "no kernel variant matches" in capsys.readouterr().err
