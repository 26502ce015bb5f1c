"""The Hopper wgmma backward (cuda/flash_bwd_sm90.cu, the default on sm_90a) on the CPU:
its variants are listed for sm_90a only and as main (spill-free), compile with NVRTC, spill
nothing, and run all five products on the warpgroup tensor cores: S^T and dP^T K-major from
shared memory, dV and dK with the register A operand and B transposed (hd256: A = P^T / dS^T
from shared memory), dQ with both operands transposed (A = dS read from the dS^T tile), no
mma.sync HMMA, dQ through shared memory and the bulk reduce-add (hd256: vector REDs from
registers)."""

from __future__ import annotations

import itertools
import re
from collections import Counter

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

FAMILY = "flash_bwd_sm90"


def _name(hd: int, dtype: int, mask: int, tma: int, cap: int = 0, varlen: int = 0) -> str:
    return (
        f"{FAMILY}.flash_bwd_sm90_kernel"
        f"[FS_HEAD_DIM={hd},FS_DTYPE={dtype},FS_HAS_MASK={mask},FS_ARCH=90,FS_BWD_TMA={tma}"
        + (",FS_HAS_SOFTCAP=1" if cap else "")
        + (",FS_VARLEN=1]" if varlen else "]")
    )


# (hd, dtype, mask, tma, softcap, varlen): every head dim, both dtypes, masks, the TMA and
# cp.async builds, with and without the softcap (its tanh and derivative must not change the
# schedule), dense and packed (varlen: per-sequence rows; its TMA maps span the packed rows)
SAMPLES = [
    (128, 1, 0, 1, 0, 0),
    (128, 0, 1, 0, 0, 0),
    (64, 1, 0, 0, 0, 0),
    (64, 0, 1, 1, 0, 0),
    (256, 1, 1, 1, 0, 0),
    (256, 0, 0, 0, 0, 0),
    (128, 1, 1, 1, 1, 0),
    (64, 0, 0, 0, 1, 0),
    (256, 1, 0, 1, 1, 0),
    (128, 1, 1, 0, 0, 1),
    (64, 1, 1, 0, 1, 1),
    (256, 0, 0, 0, 1, 1),
    (128, 0, 0, 1, 0, 1),
    (64, 1, 1, 1, 1, 1),
    (256, 1, 1, 1, 0, 1),
]


def _variants(arch: str) -> list[dict]:
    return [v for v in _native.kernel_variants(arch) if v["family"] == FAMILY]


@pytest.fixture(scope="module")
def cubins() -> dict[str, bytes]:
    return compile_variants([v["name"] for v in _variants("sm_90a")], "sm_90a")


@pytest.fixture(scope="module")
def sass_of(cubins: dict[str, bytes]):  # noqa: ANN201
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    nvdisasm = find_nvdisasm_dir(tool)
    if nvdisasm is None:
        pytest.skip("cuobjdump -sass needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    return lambda name: _sass(cubins[name], tool, nvdisasm)


def test_variants_cover_head_dims_dtypes_masks_softcap_varlen_determinism_on_sm90a_only() -> None:
    listed = _variants("sm_90a")
    keys = ("FS_HEAD_DIM", "FS_DTYPE", "FS_HAS_MASK", "FS_BWD_TMA")
    optional = ("FS_HAS_SOFTCAP", "FS_VARLEN", "FS_DETERMINISTIC")
    got = [
        tuple(v["defines"][d] for d in keys) + tuple(v["defines"].get(d, 0) for d in optional)
        for v in listed
    ]
    assert len(got) == len(set(got))
    bits = (0, 1)
    assert set(got) == set(itertools.product((64, 128, 256), bits, bits, bits, bits, bits, bits))
    assert all(v["main"] for v in listed), "every wgmma backward variant must stay spill-free"
    assert _variants("sm_80") == [], "wgmma needs sm_90a: no variant for sm_80"


def test_variants_compile_without_spills(cubins: dict[str, bytes]) -> None:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    assert len(cubins) == 192  # (the deterministic builds: half of them)
    for name, cubin in cubins.items():
        assert cubin[:4] == b"\x7fELF", name
        for func, regs, stack, local, _smem in resource_usage(cubin, tool):
            assert stack == 0 and local == 0, f"{name} {func}: stack {stack} B, local {local} B"
            assert regs <= 255, f"{name} {func}: {regs} registers"


def _hgmma_mix(sass: str) -> Counter:
    """HGMMA instructions by shape and operand form: 'ss' (A from shared memory), 'rs' (A from
    registers), with the transpose flags the descriptors carry."""
    mix: Counter = Counter()
    for line in sass.splitlines():
        m = re.search(r"HGMMA\.(\d+x\d+x\d+)\.F32\S*\s+(\S+),\s*(\S+)", line)
        if m is None:
            continue
        a_regs = not m.group(3).startswith("gdesc")
        flags = "".join(f for f in (".tnspA", ".tnspB") if f in line)
        mix[(m.group(1), "rs" if a_regs else "ss", flags)] += 1
    return mix


def _loop_steps(sass: str) -> list[str]:
    """The kernel's HGMMA batches, barriers, arrives and waits in text order (runs of one HGMMA
    shape folded into one step)."""
    events = [
        m.group(1)
        for m in (
            re.search(
                r"(HGMMA\.\w+|BAR\.SYNC|WARPGROUP\.ARRIVE|WARPGROUP\.DEPBAR\.LE gsb0, 0x\d)", x
            )
            for x in sass.splitlines()
        )
        if m is not None
    ]
    steps: list[str] = []
    for ev in events:
        if not (steps and steps[-1] == ev and ev.startswith("HGMMA")):
            steps.append(ev)
    return steps


WAIT1, WAIT0 = "WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0"
ARRIVE = "WARPGROUP.ARRIVE"


@pytest.mark.parametrize("hd,dtype,mask,tma,cap,varlen", [c for c in SAMPLES if c[0] != 256])
def test_every_product_runs_on_hgmma(
    sass_of, hd: int, dtype: int, mask: int, tma: int, cap: int, varlen: int
) -> None:  # noqa: ANN001
    sass = sass_of(_name(hd, dtype, mask, tma, cap, varlen))
    block_m = 64 if hd == 128 else 128
    mix = _hgmma_mix(sass)
    want = Counter(
        {
            # S^T = K Q^T and dP^T = V dO^T: hd / 16 k-steps each, m64 n{block_m}, K-major
            (f"64x{block_m}x16", "ss", ""): 2 * hd // 16,
            # dV += P^T dO, dK += dS^T Q: block_m / 16 k-steps each, m64 n{hd}, B transposed
            (f"64x{hd}x16", "rs", ".tnspB"): 2 * block_m // 16,
            # dQ = dS K: 128 keys / 16 k-steps, m64n64, A and B transposed
            ("64x64x16", "ss", ".tnspA.tnspB"): 8,
        }
    )
    assert mix == want, (dict(mix), sass[-1500:])
    assert " HMMA" not in sass, "an mma.sync tensor-core op left in the wgmma kernel"
    # the loop's schedule: one arrive per batch (S^T + dP^T, dV, dK, dQ) and the kernel's own
    # waits, nothing ptxas added (it serialises wgmmas it cannot prove safe with extra waits)
    steps = _loop_steps(sass)
    sd, dv, dq = f"HGMMA.64x{block_m}x16", f"HGMMA.64x{hd}x16", "HGMMA.64x64x16"
    loop = [
        "BAR.SYNC",
        ARRIVE,
        sd,
        WAIT1,
        ARRIVE,
        dv,
        WAIT1,
        ARRIVE,
        dv,
        "BAR.SYNC",
        ARRIVE,
        dq,
        WAIT0,
    ]
    if tma:  # the barrier after thread 0 initialised the mbarriers, before the loop
        assert steps[0] == "BAR.SYNC", steps
        steps = steps[1:]
    assert steps[: len(loop)] == loop, steps
    # dQ partials: stored to shared memory in fragment order (8 x STS.128 a thread) and added
    # by the TMA unit (one bulk reduce in the loop, one after it), no per-thread RED left
    lines = sass.splitlines()
    assert sum("UBLKRED.G.S.ADD.F32" in line for line in lines) == 2
    assert not any("REDG" in line for line in lines), "a per-thread global reduction is back"
    assert sum("STS.128" in line for line in lines) >= 8
    # Q / dO: TMA boxes (hd / 64 per tensor, before the loop and in it) and lse / D by bulk copy
    # in the TMA build; cp.async for them (and for K / V in both) otherwise
    tma_loads = sum("UTMALDG.4D" in line for line in lines)
    bulk_loads = sum("UBLKCP.S.G" in line for line in lines)
    assert (tma_loads, bulk_loads) == ((2 * 2 * hd // 64, 4) if tma else (0, 0))


@pytest.mark.parametrize("dtype,mask,tma,cap,varlen", [c[1:] for c in SAMPLES if c[0] == 256])
def test_hd256_splits_columns_between_the_warpgroups(
    sass_of, dtype: int, mask: int, tma: int, cap: int, varlen: int
) -> None:  # noqa: ANN001
    """hd256 (the column-split form): S^T / dP^T m64n32 over each warpgroup's 32 queries,
    P^T / dS^T through shared memory, dV / dK m64n128 over its 128 columns with A from shared
    memory, dQ in two m64n64 halves added by 8 vector REDs each, one after dV / dK were issued."""
    sass = sass_of(_name(256, dtype, mask, tma, cap, varlen))
    want = Counter(
        {
            ("64x32x16", "ss", ""): 2 * 256 // 16,  # S^T, dP^T: 16 k-steps each
            ("64x128x16", "ss", ".tnspB"): 2 * 64 // 16,  # dV, dK: 4 k-steps each
            ("64x64x16", "ss", ".tnspA.tnspB"): 2 * 64 // 16,  # dQ: two halves of 4 k-steps
        }
    )
    assert _hgmma_mix(sass) == want, dict(_hgmma_mix(sass))
    assert " HMMA" not in sass
    steps = _loop_steps(sass)
    s32, dv, dq = "HGMMA.64x32x16", "HGMMA.64x128x16", "HGMMA.64x64x16"
    loop = [
        "BAR.SYNC",
        ARRIVE,
        s32,
        WAIT1,
        WAIT0,
        "BAR.SYNC",
        ARRIVE,
        dq,
        dv,
        WAIT1,
        ARRIVE,
        dq,
        WAIT0,
    ]
    if tma:
        assert steps[0] == "BAR.SYNC", steps
        steps = steps[1:]
    assert steps[: len(loop)] == loop, steps
    lines = sass.splitlines()
    reds = [line for line in lines if "REDG" in line]
    assert len(reds) == 16 and all("F32x4" in r for r in reds), reds[:4]
    assert not any("UBLKRED" in line for line in lines)
    tma_loads = sum("UTMALDG.4D" in line for line in lines)
    bulk_loads = sum("UBLKCP.S.G" in line for line in lines)
    assert (tma_loads, bulk_loads) == ((2 * 2 * 256 // 64, 4) if tma else (0, 0))


_INS = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_REG = re.compile(r"(?<![A-Za-z_])R(\d+)(\.64|\.128)?(?![0-9])")


def wgmma_register_hazards(sass: str) -> list[str]:
    """Instructions other than HGMMA that touch (read or write) an accumulator or register-A
    register of an HGMMA not yet completed by a WARPGROUP.DEPBAR, walking the SASS in text order:
    the PTX ISA (wgmma.wait_group) makes any such access undefined, reads included. Commit
    groups end at the HGMMA carrying gsb0; DEPBAR.LE gsb0, N leaves the N most recent pending."""
    pending: list[set[int]] = []  # committed groups in flight, oldest first
    open_group: set[int] = set()
    bad = []
    for line in sass.splitlines():
        m = _INS.search(line)
        if m is None:
            continue
        ins = re.sub(r"^@!?U?P\w+\s+", "", m.group(1))
        op = ins.split()[0]
        args = ins[len(op) :]
        if op.startswith("HGMMA"):
            n = int(re.match(r"HGMMA\.64x(\d+)x16", op).group(1))
            ops = [o.strip() for o in args.split(",")]
            d = int(ops[0][1:])
            open_group |= set(range(d, d + n // 2))
            a = re.fullmatch(r"R(\d+)", ops[1])
            if a:  # register A: four 32-bit registers
                open_group |= set(range(int(a.group(1)), int(a.group(1)) + 4))
            if "gsb0" in ins:
                pending.append(open_group)
                open_group = set()
            continue
        w = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d)", ins)
        if w:
            keep = int(w.group(1))
            pending = pending[len(pending) - keep :] if keep else []
            continue
        busy = set().union(open_group, *pending)
        if not busy:
            continue
        width = 4 if ".128" in op else 2 if ".64" in op else 1
        used: set[int] = set()
        for r in _REG.finditer(args):
            span = {".64": 2, ".128": 4}.get(r.group(2) or "", 1)
            before = args[: r.start()]
            if before.count("[") <= before.count("]"):  # a data register, not an address
                span = max(span, width)
            used |= set(range(int(r.group(1)), int(r.group(1)) + span))
        if used & busy:
            bad.append(f"{ins}  <- in-flight wgmma registers {sorted(used & busy)}")
    return bad


def test_register_hazard_check_can_fail() -> None:
    """The first version of the kernel stored dS^T from sa right after the dK wgmma took sa as
    its register A (before the wait): that SASS shape is reported; stored before, it is not."""
    hgmma = "/*5b50*/ HGMMA.64x128x16.F32.BF16 R88, R196, gdesc[UR24].tnspB, R88, gsb0 ;"
    sts = "/*5b60*/ STS [R163+0x20000], R197 ;"
    wait = "/*63a0*/ WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"
    assert len(wgmma_register_hazards("\n".join([hgmma, sts, wait]))) == 1
    assert wgmma_register_hazards("\n".join([sts, hgmma, wait])) == []
    assert wgmma_register_hazards("\n".join([hgmma, wait, sts])) == []


@pytest.mark.parametrize("hd,dtype,mask,tma,cap,varlen", SAMPLES)
def test_no_register_touched_under_an_inflight_wgmma(
    sass_of, hd: int, dtype: int, mask: int, tma: int, cap: int, varlen: int
) -> None:  # noqa: ANN001
    """No instruction reads or writes the accumulators or register-A operands (pa, sa) of a wgmma
    before the wait that completes it (the verified forwards pass this check too)."""
    bad = wgmma_register_hazards(sass_of(_name(hd, dtype, mask, tma, cap, varlen)))
    assert bad == [], "\n".join(bad[:20])
