"""Every kernel variant the package can emit compiles to CUBIN with NVRTC alone (no GPU), for
Hopper (sm_90a, every variant) and Ampere (sm_80: the main variants, and every variant in
bfloat16, which covers each tile shape of every family: tiles depend on head dim / dstate /
sequence length, not on the dtype, and compiling every dtype for both archs doubled CI time).
The main variants show no local-memory spills; the training variants (backward, state-saving
forward, the varlen builds) stay within a small bound."""

from __future__ import annotations

import os

import pytest

from flashscan._resources import CUOBJDUMP_MISSING, compile_variants, find_cuobjdump, resource_usage

_native = pytest.importorskip("flashscan._native")


ARCHS = ["sm_80", "sm_90a"]


def _nvrtc_present() -> bool:
    return _native.backend_status()["nvrtc_version"] is not None


pytestmark = pytest.mark.skipif(
    not _nvrtc_present(), reason="NVRTC not installed (pip install nvidia-cuda-nvrtc)"
)


_BACKWARD_FAMILIES = ("flash_bwd.", "selective_scan_bwd.", "ssd_bwd.")
_BF16_DEFINES = ("FS_DTYPE=1,", "FS_IN_DTYPE=1,", "FS_DTYPE=1]", "FS_IN_DTYPE=1]")


def _variants(arch: str) -> list[dict]:
    variants = _native.kernel_variants(arch)
    if arch == "sm_80":
        variants = [v for v in variants if v["main"] or any(d in v["name"] for d in _BF16_DEFINES)]
    return variants


def _compile_all(arch: str) -> dict[str, bytes]:
    names = [v["name"] for v in _variants(arch)]
    return compile_variants(names, arch, workers=max(1, min(8, os.cpu_count() or 1)))


@pytest.fixture(scope="module", params=ARCHS)
def compiled(request: pytest.FixtureRequest) -> tuple[str, dict[str, bytes]]:
    return request.param, _compile_all(request.param)


def test_every_variant_compiles_to_cubin(compiled: tuple[str, dict[str, bytes]]) -> None:
    arch, cubins = compiled
    assert cubins, "no kernel variants listed"
    for name, cubin in cubins.items():
        assert cubin[:4] == b"\x7fELF", f"{name} for {arch} is not an ELF CUBIN"


def test_main_variants_do_not_spill(compiled: tuple[str, dict[str, bytes]]) -> None:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    arch, cubins = compiled
    main = {v["name"] for v in _native.kernel_variants(arch) if v["main"]}
    assert main, "no main variants listed"
    bad = []  # every offender, not only the first: one CI run names them all
    for name in sorted(main):
        usage = resource_usage(cubins[name], tool)
        assert usage, f"cuobjdump reported nothing for {name}"
        for func, regs, stack, local, _smem in usage:
            if stack or local or regs > 255:
                bad.append(f"{name} ({arch}) {func}: {regs} regs, stack {stack} B, local {local} B")
    assert not bad, "spills or too many registers:\n" + "\n".join(bad)


# ssd2_chunk_scan_ws (sm_90a): ptxas compiles each role's code under its setmaxnreg count; at 24
# registers its producer's loop state lives in a stack frame (48 B under NVRTC 13.5, 64 under
# 13.0; measured with it, 2026-12-04: 253 us against ssd2_chunk_scan's 320 at b8 L2048). Bounded,
# not zero. ssd2_chunk_scan_ws_pipe's producer, at 56, has none (held to 0).
# ssd2_chunk_state_pass (sm_90a): __launch_bounds__(128, 5) holds it to 96 registers so that 640
# (batch, head) CTAs of b8 80 heads are one wave on 132 SMs; 16 B of stack (a step's second A
# fragment parked while the first's HGMMA runs).
SSD_FWD2_STACK_BOUND = {
    "ssd2_chunk_scan_ws": 64,
    "ssd2_chunk_state_pass": 16,
}


def test_ssd_fwd2_variants_do_not_spill(compiled: tuple[str, dict[str, bytes]]) -> None:
    """The second SSD forward (cuda/ssd_fwd2.cu, the 16-bit default): held to the main
    variants' rule, no spilled bytes (the warp-specialised chunk outputs: a bounded frame)."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    arch, cubins = compiled
    names = sorted(n for n in cubins if n.startswith("ssd_fwd2."))
    assert names, "no ssd_fwd2 variants listed"
    for name in names:
        for func, regs, stack, local, _smem in resource_usage(cubins[name], tool):
            bound = SSD_FWD2_STACK_BOUND.get(func, 0)
            assert stack <= bound and local <= bound, (
                f"{name} ({arch}) {func}: stack frame {stack} B, local {local} B (spills)"
            )
            assert regs <= 255, f"{name} ({arch}) {func}: {regs} registers"


# Training variants' spill bound (bytes of stack/local per kernel); measured 2026-11-23 with
# NVRTC 13.5: at most ~130 B (fp32 attention backward), most 0-16 B.
TRAINING_SPILL_BOUND = 256


def test_training_variants_spill_within_bound(compiled: tuple[str, dict[str, bytes]]) -> None:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    arch, cubins = compiled
    names = [
        n
        for n in cubins
        if n.startswith(_BACKWARD_FAMILIES) or "FS_SAVE_STATES=1" in n or "FS_VARLEN=1" in n
    ]
    assert names, "no training variants listed"
    worst = ("", 0)
    for name in names:
        for func, regs, stack, local, _smem in resource_usage(cubins[name], tool):
            assert regs <= 255, f"{name} ({arch}) {func}: {regs} registers"
            if max(stack, local) > worst[1]:
                worst = (f"{name} {func}", max(stack, local))
    assert worst[1] <= TRAINING_SPILL_BOUND, f"{arch}: {worst[0]} spills {worst[1]} B"


# sm_90 / sm_100: 64K registers and 228 KB of shared memory an SM, 1 KB of it reserved per CTA
_SM90_REGS, _SM90_SMEM, _CTA_RESERVED = 65536, 233472, 1024
# ssd_bwd_chunk_dc16 / _db16's dynamic shared memory on sm_90 (src/ops/ssd_bwd.rs dcdb16_smem:
# 2 tiles x 3 stages x 64 rows x 72 16-bit values)
_DCDB16_DYNAMIC = 2 * 3 * 64 * 72 * 2
# CTAs an SM each 16-bit SSD backward kernel was measured at (H100 / H200, 2026-11-27 .. 28);
# the 128-thread kernels' registers and shared memory must keep them there
_SSD_BWD16_CTAS = {
    "ssd_bwd_chunk_dx16": 4,
    "ssd_bwd_dcb16": 4,
    "ssd_bwd_chunk_dstate16": 4,
    "ssd_bwd_chunk_dstate16_hilo": 4,
    "ssd_bwd_chunk_dc16": 3,
    "ssd_bwd_chunk_db16": 3,
    # L_c + the reverse state passing fused (the default since 2026-12-05, 140.5-141.3 against
    # the pair's 214 us on the H200: five CTAs an SM at 96 registers and two stages, the 640
    # CTAs of b8 80 heads one wave; its 64 B
    # frame: the dfinal prologue's one-time spills and a step's parked A fragment, as
    # ssd2_chunk_state_pass's 16)
    "ssd_bwd_dstate_pass": 5,
}


# spilled bytes a kernel may show: none under NVRTC 13.0 (the GPU machine's, 2026-11-28); NVRTC
# 13.5 (CI's wheel) gives the fp16 chunk-64 ssd_bwd_dcb16 24-32 bytes of stack
_SSD_BWD16_SPILL_BOUND = 64


def _ctas_per_sm(regs: int, threads: int, smem: int) -> int:
    per_warp = ((regs * 32 + 255) // 256) * 256  # registers are allocated 256 a warp
    by_regs = _SM90_REGS // (per_warp * (threads // 32))
    by_smem = _SM90_SMEM // (smem + _CTA_RESERVED)
    return min(by_regs, by_smem)


def test_ssd_bwd16_kernels_keep_their_occupancy_on_sm90(
    compiled: tuple[str, dict[str, bytes]],
) -> None:
    """The 16-bit SSD backward kernels are latency-bound (ncu, 2026-11-28): a register or a few
    bytes of shared memory more can cost a CTA an SM and 10-25% of the kernel's time, silently.
    Every dtype / chunk variant on sm_90a: at most a few spilled bytes, and the CTAs an SM it was
    measured at."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(CUOBJDUMP_MISSING)
    arch, cubins = compiled
    if arch != "sm_90a":
        pytest.skip("the occupancy budget is sm_90's")
    names = [n for n in cubins if n.startswith("ssd_bwd.") and "FS_DTYPE=2" not in n]
    assert names, "no 16-bit ssd_bwd variants listed"
    seen = set()
    for name in names:
        for func, regs, stack, local, smem in resource_usage(cubins[name], tool):
            want = _SSD_BWD16_CTAS.get(func)
            if want is None:
                continue
            seen.add(func)
            assert max(stack, local) <= _SSD_BWD16_SPILL_BOUND, (
                f"{name} {func}: {stack} B stack, {local} B local"
            )
            dynamic = _DCDB16_DYNAMIC if func in ("ssd_bwd_chunk_dc16", "ssd_bwd_chunk_db16") else 0
            got = _ctas_per_sm(regs, 128, smem + dynamic)
            assert got >= want, (
                f"{name} {func}: {regs} registers, {smem} + {dynamic} B shared: {got} CTAs an SM,"
                f" measured at {want}"
            )
    assert seen == set(_SSD_BWD16_CTAS), sorted(set(_SSD_BWD16_CTAS) - seen)


@pytest.mark.parametrize("arch", ["sm_100", "sm_120"])
def test_every_family_compiles_for_blackwell(arch: str) -> None:
    """What a Blackwell GPU (compute 10.0 / 12.0: `sm_100` / `sm_120`, no arch-specific suffix)
    would compile at first use: one variant of every family (a main one where it has one), the
    whole family file with the arch's own paths (the sm_90a-only wgmma / TMA / setmaxnreg code
    must stay out). Until 2026-11-29 the SSD's wgmma forms were taken for FS_ARCH >= 90 and
    failed in ptxas there. (A stratified sample of 135 of the ~1800 variants each arch lists,
    every family, compiled clean for both on 2026-12-01; all of them take ~2 CPU-hours, so CI
    compiles one a family.)"""
    # a main variant where the family lists one, else its first that builds more than the small
    # auxiliary kernels (FS_AUX_ONLY)
    by_family: dict[str, str] = {}
    rank = lambda v: (not v["main"], "FS_AUX_ONLY=1" in v["name"])  # noqa: E731
    for v in sorted(_native.kernel_variants(arch), key=rank):
        by_family.setdefault(v["family"], v["name"])
    assert len(by_family) >= 10, sorted(by_family)
    workers = max(1, min(8, os.cpu_count() or 1))
    cubins = compile_variants(sorted(by_family.values()), arch, workers=workers)
    for name, cubin in cubins.items():
        assert cubin[:4] == b"\x7fELF", f"{name} for {arch} is not an ELF CUBIN"


def test_unknown_variant_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no kernel variant named"):
        _native.compile_variant("nope[]", "sm_90a")
    with pytest.raises(ValueError, match="arch"):
        _native.kernel_variants("hopper")
