"""The Hopper wgmma forwards (cuda/flash_fwd_sm90.cu, cp.async; cuda/flash_fwd_sm90_tma.cu,
TMA + producer warpgroup) on the CPU: their variants are listed for sm_90a only, compile with
NVRTC, spill nothing, and really run on the warpgroup tensor cores (HGMMA in the SASS, P V
through the transposed-B form, no mma.sync HMMA left over); the TMA kernel loads through the
tensor memory accelerator (UTMALDG) and moves registers between warpgroups (USETMAXREG)."""

from __future__ import annotations

import itertools
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

FAMILY = "flash_fwd_sm90"
MAIN = f"{FAMILY}.flash_fwd_sm90_kernel[FS_HEAD_DIM=128,FS_DTYPE=1,FS_HAS_MASK=0,FS_ARCH=90]"
TMA_FAMILY = "flash_fwd_sm90_tma"
TMA_MAIN = (
    f"{TMA_FAMILY}.flash_fwd_sm90_tma_kernel"
    "[FS_HEAD_DIM=128,FS_DTYPE=1,FS_HAS_MASK=0,FS_ARCH=90,FS_KV_STAGES=2]"
)


def _sm90_variants(arch: str, family: str = FAMILY) -> list[dict]:
    return [v for v in _native.kernel_variants(arch) if v["family"] == family]


def _compile_all(family: str) -> dict[str, bytes]:
    return compile_variants([v["name"] for v in _sm90_variants("sm_90a", family)], "sm_90a")


@pytest.fixture(scope="module")
def cubins() -> dict[str, bytes]:
    return _compile_all(FAMILY)


@pytest.fixture(scope="module")
def sass_of() -> Any:
    """cubin -> its SASS text (skips where cuobjdump or nvdisasm is missing)."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    nvdisasm = find_nvdisasm_dir(tool)
    if nvdisasm is None:
        pytest.skip("cuobjdump -sass needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    return lambda cubin: _sass(cubin, tool, nvdisasm)


@pytest.fixture(scope="module")
def tma_cubins() -> dict[str, bytes]:
    return _compile_all(TMA_FAMILY)


def test_variants_cover_hd64_hd128_dtypes_masks_schedules_on_sm90a_only() -> None:
    listed = _sm90_variants("sm_90a")
    keys = ("FS_HEAD_DIM", "FS_DTYPE", "FS_HAS_MASK", "FS_SM90_PIPE")
    got = {tuple(v["defines"].get(d, 0) for d in keys) for v in listed}
    # the verified schedule and the experimental pipelined one (FS_SM90_PIPE=1)
    assert got == set(itertools.product((64, 128), (0, 1), (0, 1), (0, 1)))
    assert all(v["main"] for v in listed), "every wgmma variant must stay spill-free"
    assert _sm90_variants("sm_80") == [], "wgmma needs sm_90a: no variant for sm_80"


def test_variants_compile_without_spills(cubins: dict[str, bytes]) -> None:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    assert len(cubins) == 16
    for name, cubin in cubins.items():
        assert cubin[:4] == b"\x7fELF", name
        for func, _regs, stack, local, _smem in resource_usage(cubin, tool):
            assert stack == 0 and local == 0, f"{name} {func}: stack {stack} B, local {local} B"


def test_main_variant_runs_on_hgmma(cubins: dict[str, bytes], sass_of: Any) -> None:
    sass = sass_of(cubins[MAIN])
    hgmma = [line for line in sass.splitlines() if "HGMMA.64x128x16.F32.BF16" in line]
    # S = Q K^T: 8 k-steps over head dim 128; O += P V: 8 k-steps over 128 keys, B transposed
    assert sum(".tnspB" not in line for line in hgmma) == 8, sass[-2000:]
    assert sum(".tnspB" in line for line in hgmma) == 8, sass[-2000:]
    assert " HMMA" not in sass, "an mma.sync tensor-core op left in the wgmma kernel"


def test_tma_variants_cover_the_same_problems_on_sm90a_only() -> None:
    # (the FP8 builds, FS_DTYPE=3: tests/test_fp8_compile.py)
    listed = [v for v in _sm90_variants("sm_90a", TMA_FAMILY) if v["defines"]["FS_DTYPE"] != 3]
    keys = ("FS_HEAD_DIM", "FS_DTYPE", "FS_HAS_MASK", "FS_SM90_PIPE", "FS_SM90_PINGPONG")
    keys += ("FS_BLOCK_M", "FS_SM90_PERSIST", "FS_HAS_SOFTCAP", "FS_VARLEN")
    got = {tuple(v["defines"].get(d, 0) for d in keys) for v in listed}
    # head dim 256: 64-key K / V tiles (FS_BLOCK_N=64), every schedule, one CTA a tile only
    hd256 = {v["name"] for v in listed if v["defines"]["FS_HEAD_DIM"] == 256}
    assert len(hd256) == 12 + 4 + 8  # (+ softcap in ping-pong, + packed-sequence builds)
    for v in listed:
        assert v["defines"].get("FS_BLOCK_N", 128) == (64 if v["name"] in hd256 else 128)
    # schedules: plain, pipelined, ping-pong (which builds on the pipelined order), 128 query
    # rows a CTA (no FS_BLOCK_M define); at head dim 64 also 192 rows, three consumer
    # warpgroups, the plain schedule only
    schedules = {(0, 0), (1, 0), (1, 1)}
    want = {
        (hd, dt, m, *sch, 0, 0)
        for hd, dt, m in itertools.product((64, 128, 256), (0, 1), (0, 1))
        for sch in schedules
    }
    want |= {(64, dt, m, 0, 0, 192, 0) for dt, m in itertools.product((0, 1), (0, 1))}
    # the persistent forms: a static stride (FS_SM90_PERSIST=1) for unmasked problems only,
    # every schedule but the pipelined one at head dim 64 on 128 rows (it spilled); the tile
    # queue (2) masked or not, every schedule but the pipelined and ping-pong ones there (they
    # spilled)
    want |= {
        (hd, dt, m, *sch, bm, persist)
        for hd, dt, m in itertools.product((64, 128), (0, 1), (0, 1))
        for sch in schedules
        for bm in (0, 192)
        for persist in (1, 2)
        if (bm == 0 or (hd == 64 and sch == (0, 0)))
        and not (persist == 1 and m == 1)
        and not (hd == 64 and bm == 0 and sch in ((1, 0), (1, 1)) if persist == 2 else False)
        and (persist, hd, sch, bm) != (1, 64, (1, 0), 0)
    }
    # softcap: each form of the default schedules (head dim 64's three consumers, else ping-pong)
    default = {t for t in want if t[5] == 192 or ((t[3], t[4]) == (1, 1) and t[0] != 64)}
    want = {(*t, 0) for t in want} | {(*t, 1) for t in default}
    # packed sequences (flash_attn_varlen_func): the one-tile form of the defaults, softcap or not
    want = {(*t, 0) for t in want} | {(*t, 1) for t in want if t[:7] in default and t[6] == 0}
    assert got == want
    # ring depth: three K/V stages at head dim 64, two at 128 and 256 (227 KB of shared memory)
    assert all(
        v["defines"]["FS_KV_STAGES"] == (3 if v["defines"]["FS_HEAD_DIM"] == 64 else 2)
        for v in listed
    )
    assert all(v["main"] for v in listed), "every TMA variant must stay spill-free"
    assert _sm90_variants("sm_80", TMA_FAMILY) == []


def test_tma_variants_compile_without_spills(tma_cubins: dict[str, bytes]) -> None:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    # (+ softcap in the defaults, + their varlen builds, + the five FP8 builds and the five that
    # read the pre-pass's Vt)
    assert len(tma_cubins) == 72 + 24 + 24 + 5 + 5
    for name, cubin in tma_cubins.items():
        assert cubin[:4] == b"\x7fELF", name
        for func, _regs, stack, local, _smem in resource_usage(cubin, tool):
            assert stack == 0 and local == 0, f"{name} {func}: stack {stack} B, local {local} B"


def test_tma_main_variant_loads_by_tma_and_runs_on_hgmma(
    tma_cubins: dict[str, bytes], sass_of: Any
) -> None:
    sass = sass_of(tma_cubins[TMA_MAIN])
    lines = sass.splitlines()
    hgmma = [line for line in lines if "HGMMA.64x128x16.F32.BF16" in line]
    assert sum(".tnspB" not in line for line in hgmma) == 8, sass[-2000:]
    assert sum(".tnspB" in line for line in hgmma) == 8, sass[-2000:]
    assert " HMMA" not in sass, "an mma.sync tensor-core op left in the wgmma kernel"
    # Q, K and V each as two 64-column boxes of a rank-4 map; no cp.async (LDGSTS) left
    assert sum("UTMALDG.4D" in line for line in lines) == 6, sass[-2000:]
    assert "LDGSTS" not in sass
    # producer down, consumers up: both halves of the register reallocation are there
    assert any("USETMAXREG.DEALLOC" in line for line in lines)
    assert any("USETMAXREG.TRY_ALLOC" in line for line in lines)


def test_tma_hd256_runs_64_key_tiles_and_two_pv_halves(
    tma_cubins: dict[str, bytes], sass_of: Any
) -> None:
    """Head dim 256 (FS_BLOCK_N=64): Q as four 128-row boxes, K and V four 64-row boxes each;
    S = Q K^T 16 k-steps of m64n64k16 from shared memory, O += P V 4 k-steps of two m64n128k16
    (each half of O) with P from registers."""
    name = (
        f"{TMA_FAMILY}.flash_fwd_sm90_tma_kernel"
        "[FS_HEAD_DIM=256,FS_DTYPE=1,FS_HAS_MASK=1,FS_ARCH=90,FS_KV_STAGES=2,"
        "FS_SM90_PIPE=1,FS_SM90_PINGPONG=1,FS_BLOCK_N=64]"
    )
    sass = sass_of(tma_cubins[name])
    lines = sass.splitlines()
    assert sum("UTMALDG.4D" in line for line in lines) == 4 + 4 + 4, sass[-2000:]
    s_gemm = [ln for ln in lines if "HGMMA.64x64x16.F32.BF16" in ln]
    pv_gemm = [ln for ln in lines if "HGMMA.64x128x16.F32.BF16" in ln]
    # the pipelined schedule peels the first S and the last P V out of the loop
    assert len(s_gemm) == 2 * 16 and len(pv_gemm) == 2 * 8, (len(s_gemm), len(pv_gemm))
    assert not any(".tnspB" in ln for ln in s_gemm)
    assert all(".tnspB" in ln for ln in pv_gemm)
    assert " HMMA" not in sass and "LDGSTS" not in sass


def test_tma_hd64_default_runs_three_consumers_on_192_rows(
    tma_cubins: dict[str, bytes], sass_of: Any
) -> None:
    """The head-dim-64 default (FS_BLOCK_M=192, plain schedule): Q as three 64-row boxes plus K
    and V one box each per tile, S and P V on HGMMA (m64n128k16 from shared memory, m64n64k16
    with P from registers), the register hand-over, and no turn-taking barriers (its spills:
    `test_tma_variants_compile_without_spills`)."""
    name = (
        f"{TMA_FAMILY}.flash_fwd_sm90_tma_kernel"
        "[FS_HEAD_DIM=64,FS_DTYPE=1,FS_HAS_MASK=1,FS_ARCH=90,FS_KV_STAGES=3,FS_BLOCK_M=192]"
    )
    sass = sass_of(tma_cubins[name])
    lines = sass.splitlines()
    assert sum("UTMALDG.4D" in line for line in lines) == 3 + 2, sass[-2000:]
    s_gemm = [ln for ln in lines if "HGMMA.64x128x16.F32.BF16" in ln]
    pv_gemm = [ln for ln in lines if "HGMMA.64x64x16.F32.BF16" in ln]
    assert len(s_gemm) == 4 and len(pv_gemm) == 8, (len(s_gemm), len(pv_gemm))
    assert all(".tnspB" in ln for ln in pv_gemm)
    assert " HMMA" not in sass and "LDGSTS" not in sass
    assert any("USETMAXREG.DEALLOC" in line for line in lines)
    assert any("USETMAXREG.TRY_ALLOC" in line for line in lines)
    turns = [ln for ln in lines if "BAR." in ln and "0x100" in ln]
    assert turns == [], turns


def test_tma_persistent_variant_walks_tiles_on_the_same_gemms(
    tma_cubins: dict[str, bytes], sass_of: Any
) -> None:
    """The persistent form of the main variant: the same loads and GEMMs as the one-tile kernel
    (Q, K and V by TMA, S and P V on HGMMA, the register hand-over), inside a loop over tiles."""
    one = sass_of(tma_cubins[TMA_MAIN]).splitlines()
    lines = sass_of(tma_cubins[TMA_MAIN.replace("]", ",FS_SM90_PERSIST=1]")]).splitlines()
    for op in ("UTMALDG.4D", "HGMMA.64x128x16.F32.BF16", "USETMAXREG"):
        assert sum(op in ln for ln in lines) == sum(op in ln for ln in one), op
    assert "LDGSTS" not in "\n".join(lines)
    assert not any("ATOMG" in ln for ln in lines), "the static stride takes no counter"


def test_tma_tile_queue_takes_tiles_from_one_global_counter(
    tma_cubins: dict[str, bytes], sass_of: Any
) -> None:
    """The tile queue's form of the main variant and of the masked head-dim-64 default: the
    same loads and GEMMs as the one-tile kernel, plus two global atomic adds (the producer taking
    the next tile; counting its CTA done) and two exchanges (the last CTA zeroing the counters for
    the stream's next launch), and the slot hand-over to the consumer warps (a warp shuffle)."""
    hd64 = (
        f"{TMA_FAMILY}.flash_fwd_sm90_tma_kernel"
        "[FS_HEAD_DIM=64,FS_DTYPE=1,FS_HAS_MASK=1,FS_ARCH=90,FS_KV_STAGES=3,FS_BLOCK_M=192]"
    )
    for one_name in (TMA_MAIN, hd64):
        one = sass_of(tma_cubins[one_name]).splitlines()
        lines = sass_of(tma_cubins[one_name.replace("]", ",FS_SM90_PERSIST=2]")]).splitlines()
        for op in ("UTMALDG.4D", "HGMMA.64x", "USETMAXREG"):
            assert sum(op in ln for ln in lines) == sum(op in ln for ln in one), (one_name, op)
        atomics = [ln for ln in lines if "ATOMG" in ln]
        adds = [ln for ln in atomics if "ATOMG.E.ADD" in ln]
        exchanges = [ln for ln in atomics if "ATOMG.E.EXCH" in ln]
        assert len(adds) == 2 and len(exchanges) == 2 and len(atomics) == 4, atomics
        assert any("SHFL.IDX" in ln for ln in lines)


def test_tma_ping_pong_takes_turns_on_named_barriers(
    tma_cubins: dict[str, bytes], sass_of: Any
) -> None:
    name = TMA_MAIN.replace("]", ",FS_SM90_PIPE=1,FS_SM90_PINGPONG=1]")
    sass = sass_of(tma_cubins[name])
    # 256-thread turns: a wait before each issue slot (first S, loop, last P V), an arrival after
    turns = [ln for ln in sass.splitlines() if "BAR." in ln and "0x100" in ln]
    assert sum("BAR.SYNC" in ln for ln in turns) == 3, turns
    assert sum("BAR.ARV" in ln for ln in turns) >= 4, turns


def test_tma_hd64_pipelined_softmax_runs_while_p_v_is_in_flight(
    tma_cubins: dict[str, bytes], sass_of: Any
) -> None:
    """The point of the pipelined order: between the wait that completes S (wait_group 1) and the
    one that completes P V (wait_group 0), the exponentials of the softmax. ptxas hoists the
    second wait unless the kernel ends the basic block first (done at head dim 64)."""
    name = (
        f"{TMA_FAMILY}.flash_fwd_sm90_tma_kernel"
        "[FS_HEAD_DIM=64,FS_DTYPE=1,FS_HAS_MASK=0,FS_ARCH=90,FS_KV_STAGES=3,FS_SM90_PIPE=1]"
    )
    lines = sass_of(tma_cubins[name]).splitlines()
    first = next(i for i, ln in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ln)
    last = next(i for i in range(first, len(lines)) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in lines[i])
    exps = sum("MUFU.EX2" in ln for ln in lines[first:last])
    assert exps >= 64, f"only {exps} exponentials between the two waits"
