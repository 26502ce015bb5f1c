"""The SSD kernels' wgmma products (sm_90a) on the CPU: NVRTC builds of `cuda/ssd_fwd2.cu` and
`cuda/ssd_bwd.cu` put the chunk-state product (`ssd2_chunk_state`, `ssd2_varlen_states`,
`ssd_bwd_chunk_dstate16`) and the chunk scan's C.H^T and W x (`ssd2_chunk_scan`) on HGMMA with
the operand forms the kernels' descriptors ask for, keep no mma.sync HMMA beside them, and are
not serialised by ptxas: one `WARPGROUP.DEPBAR` per committed group (when ptxas cannot prove the
accumulator / register-A operands untouched between a commit and its wait, it waits after every
HGMMA instead: seen while trying a deferred wait in the scan, 2026-11-29). The sm_80 builds keep
mma.sync. Two builds per architecture (bf16 chunk 256, fp16 chunk 64) keep CI time down."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from flashscan._resources import (
    CUOBJDUMP_MISSING,
    compile_variants,
    find_cuobjdump,
    find_nvdisasm_dir,
)
from flashscan._resources import sass as _sass

_native = pytest.importorskip("flashscan._native")

pytestmark = pytest.mark.skipif(
    _native.backend_status()["nvrtc_version"] is None,
    reason="NVRTC not installed (pip install nvidia-cuda-nvrtc)",
)

SAMPLES = [(1, 256), (0, 64)]  # (FS_DTYPE, FS_CHUNK)


def _variant(family_entry: str, dtype: int, chunk: int, arch: str) -> str:
    want = f"{family_entry}[FS_DTYPE={dtype},FS_CHUNK={chunk},"
    names = [v["name"] for v in _native.kernel_variants(arch) if v["name"].startswith(want)]
    assert len(names) == 1, f"{want}*: {names}"
    return names[0]


def _functions(sass: str) -> dict[str, list[str]]:
    """SASS lines by function name."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif cur is not None:
            out[cur].append(line)
    return out


def _mix(lines: list[str]) -> tuple[Counter, int, int]:
    """(HGMMA by (shape, 'ss' / 'rs', transpose flags), HMMA count, WARPGROUP.DEPBAR count)."""
    mix: Counter = Counter()
    hmma = depbar = 0
    for line in lines:
        m = re.search(r"HGMMA\.(\d+x\d+x\d+)\.F32\S*\s+(\S+),\s*(\S+)", line)
        if m:
            flags = "".join(f for f in (".tnspA", ".tnspB") if f in line)
            mix[(m.group(1), "ss" if m.group(3).startswith("gdesc") else "rs", flags)] += 1
        hmma += bool(re.search(r"\bHMMA\.", line))
        depbar += "WARPGROUP.DEPBAR" in line
    return mix, hmma, depbar


@pytest.fixture(scope="module")
def functions_of():  # noqa: ANN201
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    nvdisasm = find_nvdisasm_dir(tool)
    if nvdisasm is None:
        pytest.skip("cuobjdump -sass needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    cache: dict[tuple[str, str], dict[str, list[str]]] = {}

    def get(name: str, arch: str) -> dict[str, list[str]]:
        if (name, arch) not in cache:
            cubin = compile_variants([name], arch)[name]
            cache[(name, arch)] = _functions(_sass(cubin, tool, nvdisasm))
        return cache[(name, arch)]

    return get


STATE = {("64x128x16", "rs", ".tnspB"): 4}  # x^T w (registers) x B / C (MN-major), 64 positions
STATE_PASS = {("64x128x16", "rs", ".tnspB"): 2}  # the same, 32 positions a step (five CTAs an SM)
SCAN = {
    ("64x64x16", "ss", ""): 4,  # C.H^T: C and H K-major, 64 states a step
    ("64x64x16", "rs", ".tnspB"): 4,  # W x: W from registers, x MN-major, a 64-position block
}


@pytest.mark.parametrize(("dtype", "chunk"), SAMPLES)
def test_forward_products_run_on_hgmma_unserialised(functions_of, dtype: int, chunk: int) -> None:  # noqa: ANN001
    fns = functions_of(_variant("ssd_fwd2.ssd2_chunk_scan", dtype, chunk, "sm_90a"), "sm_90a")
    for func, want, groups in (
        ("ssd2_chunk_state", STATE, 1),
        ("ssd2_varlen_states", STATE, 1),
        # (96 registers for five CTAs an SM leave one A quad: ptxas waits after each HGMMA)
        ("ssd2_chunk_state_pass", STATE_PASS, 2),
        ("ssd2_chunk_scan", SCAN, 2),
    ):
        mix, hmma, depbar = _mix(fns[func])
        assert dict(mix) == want, f"{func}: {dict(mix)}"
        assert hmma == 0, f"{func}: {hmma} mma.sync HMMA beside the wgmma products"
        assert depbar == groups, (
            f"{func}: {depbar} WARPGROUP.DEPBAR for {groups} groups (serialised?)"
        )


@pytest.mark.parametrize(("dtype", "chunk"), SAMPLES)
def test_fused_state_passing_loads_by_tma(functions_of, dtype: int, chunk: int) -> None:  # noqa: ANN001
    """ssd2_chunk_state_pass: x and B by TMA (three boxes a step, issued twice: the prologue and
    the loop), the chunk records by bulk copies, no per-thread cp.async, no GPU-scope fence."""
    fns = functions_of(_variant("ssd_fwd2.ssd2_chunk_scan", dtype, chunk, "sm_90a"), "sm_90a")
    text = "\n".join(fns["ssd2_chunk_state_pass"])
    assert text.count("UTMALDG") >= 3 and "UBLKCP" in text, "no TMA / bulk loads"
    assert "LDGSTS" not in text, "per-thread cp.async beside the TMA loads"
    assert "MEMBAR.ALL.GPU" not in text


@pytest.mark.parametrize(("dtype", "chunk"), SAMPLES)
def test_backward_lc_runs_on_hgmma_and_its_hilo_form_on_mma_sync(
    functions_of, dtype: int, chunk: int
) -> None:  # noqa: ANN001
    fns = functions_of(_variant("ssd_bwd.ssd_bwd_chunk_out", dtype, chunk, "sm_90a"), "sm_90a")
    mix, hmma, depbar = _mix(fns["ssd_bwd_chunk_dstate16"])
    assert dict(mix) == STATE and hmma == 0 and depbar == 1, (dict(mix), hmma, depbar)
    mix, hmma, _ = _mix(fns["ssd_bwd_chunk_dstate16_hilo"])
    assert not mix and hmma > 0, "the hi / lo L_c stays on mma.sync"


@pytest.mark.parametrize(("dtype", "chunk"), SAMPLES)
def test_backward_fused_state_passing_loads_by_tma_and_runs_on_hgmma(
    functions_of, dtype: int, chunk: int
) -> None:  # noqa: ANN001
    """ssd_bwd_dstate_pass: L_c's product on HGMMA as ssd2_chunk_state_pass's (two m64n128k16 a
    32-position step, A = the scaled dout from registers), no mma.sync; dout and C by TMA
    (three boxes a step, issued twice: the prologue and the loop) and H_c (two boxes, issued
    twice), the chunk records by bulk copies, no per-thread cp.async."""
    fns = functions_of(_variant("ssd_bwd.ssd_bwd_chunk_out", dtype, chunk, "sm_90a"), "sm_90a")
    lines = fns["ssd_bwd_dstate_pass"]
    mix, hmma, depbar = _mix(lines)
    assert dict(mix) == STATE_PASS and hmma == 0 and depbar == 2, (dict(mix), hmma, depbar)
    text = "\n".join(lines)
    assert text.count("UTMALDG") >= 3 + 2 and "UBLKCP" in text, "no TMA / bulk loads"
    assert "LDGSTS" not in text, "per-thread cp.async beside the TMA loads"


@pytest.mark.parametrize("arch", ["sm_80", "sm_100", "sm_120"])
def test_other_archs_keep_mma_sync(functions_of, arch: str) -> None:  # noqa: ANN001
    """wgmma is sm_90a's alone: every other arch builds the mma.sync forms. (Until 2026-11-29 the
    wgmma path was taken for FS_ARCH >= 90, so sm_100 / sm_120 builds of ssd_fwd2 and ssd_bwd failed
    in ptxas.)"""
    fns = functions_of(_variant("ssd_fwd2.ssd2_chunk_scan", 1, 256, arch), arch)
    for func in ("ssd2_chunk_state", "ssd2_chunk_scan"):
        mix, hmma, _ = _mix(fns[func])
        assert not mix and hmma > 0, f"{func} on {arch}: {dict(mix)}, {hmma} HMMA"
    if arch == "sm_120":
        fns = functions_of(_variant("ssd_bwd.ssd_bwd_chunk_out", 1, 256, arch), arch)
        mix, hmma, _ = _mix(fns["ssd_bwd_chunk_dstate16"])
        assert not mix and hmma > 0, f"L_c on {arch}: {dict(mix)}, {hmma} HMMA"


@pytest.mark.parametrize("entry", ["ssd2_chunk_scan_ws", "ssd2_chunk_scan_ws_pipe"])
@pytest.mark.parametrize("dtype", [0, 1])
def test_warp_specialised_scan_loads_by_tma_and_multiplies_on_hgmma(
    functions_of, dtype: int, entry: str
) -> None:  # noqa: ANN001
    """`ssd2_chunk_scan_ws` (sm_90a, chunk 256): its consumers run the scan's two products on HGMMA
    (C.H^T shared-memory x shared-memory, W x from registers; each row tile's code unrolled, 4
    C.H^T steps' worth for each of the four and 1 + 2 + 3 + 4 W x blocks), with 18 waits for 56
    HGMMA. The default form: per row tile I one after C.H^T, one after each of its I + 1 blocks,
    one closing it. The pipelined form (`_pipe`): one in the C.H^T loop (wgmma_wait<1>), one
    before block 0 (C.H^T done: acc rescaled), one after each of blocks 1..I (the block before
    it done), one closing it: the same count.
    ptxas serialising them would put a wait after every HGMMA. Its producers load x / C / H /
    C B^T by TMA (UTMALDG.4D) and the prep records by a bulk copy (UBLKCP); no consumer issues a
    cp.async (LDGSTS) and nothing runs on mma.sync."""
    fns = functions_of(_variant(f"ssd_fwd2.{entry}", dtype, 256, "sm_90a"), "sm_90a")
    lines = fns[entry]
    mix, hmma, depbar = _mix(lines)
    want = {("64x64x16", "ss", ""): 4 * 4, ("64x64x16", "rs", ".tnspB"): 4 * (1 + 2 + 3 + 4)}
    assert dict(mix) == want and hmma == 0 and depbar == (3 + 4 + 5 + 6), (
        dict(mix),
        hmma,
        depbar,
    )
    text = "\n".join(lines)
    assert len(re.findall(r"\bUTMALDG\.4D\b", text)) >= 4, "x, C, H and C B^T by TMA"
    assert "UBLKCP" in text, "the prep records by a bulk copy"
    assert "LDGSTS" not in text, "a cp.async in the warp-specialised kernel"
