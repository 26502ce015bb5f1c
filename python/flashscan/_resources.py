"""Registers, stack / local (spill) bytes and static shared memory of the package's own kernel
variants, read from their CUBINs with `cuobjdump --dump-resource-usage`: the numbers to read
before spending GPU time on a tile change. No GPU is needed: NVRTC compiles each variant
(`_native.compile_variant`) for the arch asked, cuobjdump (the CUDA toolkit's, or the
`nvidia-cuda-cuobjdump` wheel's) reads the CUBIN.

Behind `python -m flashscan resources`; tests/test_kernels_compile.py uses the same reader.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

from . import _backend

__all__ = [
    "CUOBJDUMP_MISSING",
    "Usage",
    "VariantUsage",
    "compile_variants",
    "find_cuobjdump",
    "find_nvdisasm_dir",
    "format_table",
    "measure",
    "normalize_arch",
    "parse_resource_usage",
    "resource_usage",
    "sass",
    "select_variants",
]

CUOBJDUMP_MISSING = (
    "cuobjdump not found on PATH or in an installed wheel: pip install nvidia-cuda-cuobjdump "
    "(or put the CUDA toolkit's bin/ on PATH)"
)

# where the cuobjdump wheels put the tool, under a sys.path entry (CUDA 13 wheels, then 12)
_WHEEL_PATHS = ("nvidia/cu13/bin/cuobjdump", "nvidia/cuda_cuobjdump/bin/cuobjdump")

_FUNCTION = re.compile(r"^\s*Function (\S+):")
_USAGE = re.compile(r"\bREG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_ARCH = re.compile(r"^sm_\d+a?$")


class Usage(NamedTuple):
    """One kernel function of a CUBIN: registers per thread, stack frame and local memory
    per thread in bytes (nonzero: spills or local arrays), static shared memory per block in
    bytes (dynamic shared memory is set at launch and not counted here)."""

    function: str
    registers: int
    stack: int
    local: int
    shared: int

    @property
    def spills(self) -> bool:
        return self.stack > 0 or self.local > 0


@dataclass(frozen=True)
class VariantUsage:
    """A kernel variant (`_native.kernel_variants`) and the usage of each function of its
    CUBIN (a family's CUBIN holds all its kernels: the variant's entry and its helpers)."""

    name: str
    family: str
    entry: str
    main: bool
    functions: tuple[Usage, ...]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["functions"] = [u._asdict() for u in self.functions]
        return d


def find_cuobjdump() -> str | None:
    """cuobjdump's path: on PATH, else in the `nvidia-cuda-cuobjdump` wheel under a sys.path
    entry; None when neither has it."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    for entry in sys.path:
        for sub in _WHEEL_PATHS:
            p = Path(entry or ".") / sub
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    return None


def parse_resource_usage(text: str) -> list[Usage]:
    """The functions of `cuobjdump --dump-resource-usage` output, in its order."""
    rows: list[Usage] = []
    func = ""
    for line in text.splitlines():
        m = _FUNCTION.match(line)
        if m:
            func = m.group(1)
            continue
        m = _USAGE.search(line)
        if m and func:
            reg, stack, shared, local = (int(g) for g in m.groups())
            rows.append(Usage(func, reg, stack, local, shared))
            func = ""
    return rows


def resource_usage(cubin: bytes, cuobjdump: str | None = None) -> list[Usage]:
    """Per-function usage of a CUBIN. Raises FileNotFoundError (naming the wheel to install)
    when no cuobjdump is found, subprocess.CalledProcessError when it fails."""
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        raise FileNotFoundError(CUOBJDUMP_MISSING)
    fd, path = tempfile.mkstemp(suffix=".cubin", prefix="flashscan-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        out = subprocess.run(
            [tool, "--dump-resource-usage", path], capture_output=True, text=True, check=True
        ).stdout
    finally:
        os.unlink(path)
    return parse_resource_usage(out)


def find_nvdisasm_dir(cuobjdump: str) -> str | None:
    """The folder `cuobjdump -sass` needs on PATH for nvdisasm: where it already is on PATH,
    beside cuobjdump (the nvidia-cuda-nvdisasm wheel installs next to nvidia-cuda-cuobjdump's),
    or triton's copy; None when none is found."""
    found = shutil.which("nvdisasm")
    if found:
        return os.path.dirname(found)
    here = os.path.dirname(cuobjdump)
    if os.access(os.path.join(here, "nvdisasm"), os.X_OK):
        return here
    for entry in sys.path:
        cand = os.path.join(entry or ".", "triton", "backends", "nvidia", "bin")
        if os.access(os.path.join(cand, "nvdisasm"), os.X_OK):
            return cand
    return None


def sass(cubin: bytes, cuobjdump: str, nvdisasm_dir: str) -> str:
    """The SASS listing of a CUBIN (`cuobjdump -sass`, nvdisasm found in `nvdisasm_dir`)."""
    fd, path = tempfile.mkstemp(suffix=".cubin", prefix="flashscan-")
    env = dict(os.environ, PATH=f"{nvdisasm_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        done = subprocess.run(
            [cuobjdump, "-sass", path], capture_output=True, text=True, check=True, env=env
        )
        return done.stdout
    finally:
        os.unlink(path)


def normalize_arch(arch: str) -> str:
    """The NVRTC arch name (sm_...) of "sm_90a", "90a", "sm_80", "80"...; ValueError otherwise."""
    a = arch.strip()
    if not a.startswith("sm_"):
        a = "sm_" + a
    if not _ARCH.match(a):
        raise ValueError(f"arch {arch!r}: expected a name like sm_80, sm_86, sm_90a")
    return a


def _native() -> Any:
    native = _backend.native
    if native is None:
        raise RuntimeError(f"the native module is not available: {_backend.status()['reason']}")
    return native


def select_variants(
    arch: str,
    families: list[str] | None = None,
    main_only: bool = False,
    only: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The package's kernel variants for `arch` (`_native.kernel_variants`), only those of
    `families` (all when None), with `main_only` only the main ones, and with `only` only those
    whose name contains one of its substrings (e.g. "ssd2_chunk_scan[FS_DTYPE=1,FS_CHUNK=256").
    ValueError for an unknown family, naming the known ones."""
    variants: list[dict[str, Any]] = list(_native().kernel_variants(arch))
    if families:
        known = sorted({v["family"] for v in variants})
        unknown = [f for f in families if f not in known]
        if unknown:
            raise ValueError(
                f"family {', '.join(unknown)}: unknown; the families are {', '.join(known)}"
            )
        variants = [v for v in variants if v["family"] in families]
    if main_only:
        variants = [v for v in variants if v["main"]]
    if only:
        variants = [v for v in variants if any(o in v["name"] for o in only)]
    return variants


def compile_variants(names: list[str], arch: str, workers: int = 2) -> dict[str, bytes]:
    """The CUBIN of each named variant for `arch`, compiled by NVRTC on `workers` threads (the
    compile releases the GIL), keyed by name in `names` order."""
    native = _native()
    with ThreadPoolExecutor(max(1, workers)) as pool:
        return dict(zip(names, pool.map(lambda n: native.compile_variant(n, arch), names)))


def measure(
    arch: str,
    variants: list[dict[str, Any]],
    cuobjdump: str,
    workers: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[VariantUsage]:
    """Compile each variant for `arch` with NVRTC on `workers` threads (default: up to 4;
    the compile releases the GIL) and read its usage with `cuobjdump`; in `variants` order.
    progress(done, total, name) is called as each variant is done."""
    native = _native()
    total = len(variants)
    done = 0

    def one(v: dict[str, Any]) -> VariantUsage:
        usage = resource_usage(native.compile_variant(v["name"], arch), cuobjdump)
        return VariantUsage(v["name"], v["family"], v["entry"], bool(v["main"]), tuple(usage))

    results: list[VariantUsage] = []
    n = workers or max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(n) as pool:
        for r in pool.map(one, variants):
            results.append(r)
            done += 1
            if progress is not None:
                progress(done, total, r.name)
    return results


def format_table(arch: str, results: list[VariantUsage]) -> str:
    """One line per kernel function: registers, stack and local bytes, static shared memory,
    flags (`main`: a main variant, which must not spill; `SPILL`: stack or local bytes), the
    function and its variant; then a summary line."""
    width = max((len(u.function) for r in results for u in r.functions), default=8)
    head = f"{'regs':>4} {'stack':>5} {'local':>5} {'smem':>6}  {'flags':<10}  "
    lines = [head + f"{'function':<{width}}  variant"]
    nfunc = nspill = nmain_spill = worst = 0
    for r in results:
        for u in r.functions:
            nfunc += 1
            worst = max(worst, u.registers)
            nspill += u.spills
            nmain_spill += u.spills and r.main
            flags = " ".join(f for f, on in (("main", r.main), ("SPILL", u.spills)) if on)
            lines.append(
                f"{u.registers:>4} {u.stack:>5} {u.local:>5} {u.shared:>6}  {flags:<10}  "
                f"{u.function:<{width}}  {r.name}"
            )
    lines.append(
        f"{arch}: {len(results)} variant(s), {nfunc} kernel function(s), at most {worst} "
        f"registers; {nspill} function(s) with stack/local bytes ({nmain_spill} in main variants)"
    )
    return "\n".join(lines)
