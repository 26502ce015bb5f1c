"""The FP8 attention forward on the CPU: its variants (the FP8 builds of
cuda/flash_fwd_sm90_tma.cu, and for long sequences the Vt pre-pass cuda/flash_fp8_vt.cu with the
builds that read its Vt) are listed for sm_90a only, compile
with NVRTC without spilling, and really run on the 8-bit warpgroup tensor cores (QGMMA e4m3
m64n128k32 for S = Q K^T and O += P Vt, no 16-bit HGMMA), loading Q, K and V by TMA, the default
builds transposing V in shared memory (LDSM.16.MT88.4, byte permutes, STSM, the async-proxy
fence)
and rounding P to e4m3 in registers (F2FP.SATFINITE.E4M3)."""

from __future__ import annotations

from typing import Any

import pytest

from flashscan._resources import (
    CUOBJDUMP_MISSING,
    compile_variants,
    find_cuobjdump,
    find_nvdisasm_dir,
    resource_usage,
)
from flashscan._resources import sass as _sass

_native = pytest.importorskip("flashscan._native")

pytestmark = pytest.mark.skipif(
    _native.backend_status()["nvrtc_version"] is None,
    reason="NVRTC not installed (pip install nvidia-cuda-nvrtc)",
)

TMA_FAMILY = "flash_fwd_sm90_tma"
VT_FAMILY = "flash_fp8_vt"


def _fp8_variants(arch: str) -> list[dict]:
    return [
        v
        for v in _native.kernel_variants(arch)
        if v["family"] == VT_FAMILY or (v["family"] == TMA_FAMILY and v["defines"]["FS_DTYPE"] == 3)
    ]


@pytest.fixture(scope="module")
def cubins() -> dict[str, bytes]:
    return compile_variants([v["name"] for v in _fp8_variants("sm_90a")], "sm_90a")


def test_fp8_variants_are_sm90a_ping_pong_on_the_128_tile() -> None:
    listed = _fp8_variants("sm_90a")
    fwd = [v for v in listed if v["family"] == TMA_FAMILY]
    # one CTA a tile (masked or not), the static stride (unmasked), the tile queue (either)
    transposed = [v for v in fwd if "FS_FP8_TRANSPOSE" not in v["defines"]]
    forms = sorted(
        (v["defines"]["FS_HAS_MASK"], v["defines"].get("FS_SM90_PERSIST", 0)) for v in transposed
    )
    assert forms == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2)]
    # the pre-pass's readers (long sequences): the same forms
    prepass = [v["defines"] for v in fwd if v["defines"].get("FS_FP8_TRANSPOSE") == 0]
    assert sorted((d["FS_HAS_MASK"], d.get("FS_SM90_PERSIST", 0)) for d in prepass) == forms
    for v in fwd:
        d = v["defines"]
        assert d["FS_HEAD_DIM"] == 128 and d["FS_SM90_PIPE"] == 1 and d["FS_SM90_PINGPONG"] == 1
        assert "FS_VARLEN" not in d and "FS_HAS_SOFTCAP" not in d
    assert sum(v["family"] == VT_FAMILY for v in listed) == 1
    assert all(v["main"] for v in listed), "every FP8 variant must stay spill-free"
    for arch in ("sm_80", "sm_89", "sm_100"):
        assert _fp8_variants(arch) == [], arch


def test_fp8_variants_compile_without_spills(cubins: dict[str, bytes]) -> None:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    assert len(cubins) == 11
    for name, cubin in cubins.items():
        assert cubin[:4] == b"\x7fELF", name
        for func, _regs, stack, local, _smem in resource_usage(cubin, tool):
            assert stack == 0 and local == 0, f"{name} {func}: stack {stack} B, local {local} B"


@pytest.fixture(scope="module")
def sass_of() -> Any:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    nvdisasm = find_nvdisasm_dir(tool)
    if nvdisasm is None:
        pytest.skip("cuobjdump -sass needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    return lambda cubin: _sass(cubin, tool, nvdisasm)


@pytest.mark.parametrize("prepass", [False, True])
@pytest.mark.parametrize("mask", [0, 1])
def test_fp8_forward_runs_on_e4m3_wgmma_with_tma_loads(
    cubins: dict[str, bytes], sass_of: Any, mask: int, prepass: bool
) -> None:
    name = next(
        n
        for n in cubins
        if n.startswith(TMA_FAMILY)
        and f"FS_HAS_MASK={mask}," in n
        and "PERSIST" not in n
        and ("FS_FP8_TRANSPOSE=0" in n) == prepass
    )
    lines = sass_of(cubins[name]).splitlines()
    qgmma = [ln for ln in lines if "QGMMA.64x128x32.F32.E4M3.E4M3" in ln]
    # S: 4 k-steps of 32 bytes (the first tile peeled out of the loop, so twice); P V likewise
    assert len(qgmma) == 16, len(qgmma)
    assert not any("HGMMA" in ln or " HMMA" in ln for ln in lines)
    # Q, K and V (or Vt): one 128-byte-wide box each
    assert sum("UTMALDG.4D" in ln for ln in lines) == 3
    assert any("F2FP.SATFINITE.E4M3.F32" in ln for ln in lines)
    assert any("USETMAXREG.DEALLOC" in ln for ln in lines)
    # the in-kernel transpose: one transposing ldmatrix and two byte permutes a 16-byte column
    # pair (tests/test_fp8_transpose_model.py checks their layout), fenced for wgmma
    ldsm = [ln for ln in lines if "LDSM.16.MT88.4" in ln]
    perms = [ln for ln in lines if "PRMT" in ln and ("0x6420" in ln or "0x7531" in ln)]
    if prepass:
        assert not ldsm and not perms
    else:
        assert len(ldsm) == 1 and len(perms) == 4, (ldsm, perms)
        assert sum("STSM.16.M88.4" in ln for ln in lines) == 1
        assert any("FENCE.VIEW.ASYNC.S" in ln for ln in lines)


def test_fp8_tile_queue_takes_tiles_from_one_global_counter(
    cubins: dict[str, bytes], sass_of: Any
) -> None:
    """The persistent FP8 forms run the one-tile kernel's loads and GEMMs inside a tile loop; the
    queue's adds its counter's two atomic adds and two exchanges (as the 16-bit queue)."""
    one = next(
        n
        for n in cubins
        if "FS_HAS_MASK=1," in n and "PERSIST" not in n and "FS_FP8_TRANSPOSE" not in n
    )
    queue = one.replace("]", ",FS_SM90_PERSIST=2]")
    a, b = (sass_of(cubins[n]).splitlines() for n in (one, queue))
    for op in ("UTMALDG.4D", "QGMMA.64x128x32", "USETMAXREG", "LDSM.16.MT88.4"):
        assert sum(op in ln for ln in a) == sum(op in ln for ln in b), op
    atomics = [ln for ln in b if "ATOMG" in ln]
    assert sum("ATOMG.E.ADD" in ln for ln in atomics) == 2, atomics
    assert sum("ATOMG.E.EXCH" in ln for ln in atomics) == 2, atomics
