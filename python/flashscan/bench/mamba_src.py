"""mamba_ssm as a measured peer from a source checkout (`--mamba-src DIR`), where no mamba_ssm
wheel matches the installed torch + CUDA pair.

Its CUDA selective scan (`csrc/selective_scan`) is built here with torch's
`cpp_extension.load` (nvcc and ninja needed; about a minute on 16 cores for one arch) and
registered as the `selective_scan_cuda` module mamba_ssm's interface imports. The `mamba_ssm`
package is then made importable from the checkout without running its top-level `__init__`
(which imports every model and hence transformers): its ops modules load as they would from
an install, so the peers timed are mamba_ssm's own `selective_scan_fn` (CUDA) and its Triton
`selective_state_update`, unmodified.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
import types
from typing import Any, Callable

from .fmt import first_line

# nvcc flags of mamba_ssm's own build (setup.py), for this device's arch only.
_NVCC_FLAGS = [
    "-O3",
    "-std=c++17",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "-lineinfo",
]


def source_commit(src: str) -> str:
    """The checkout's commit: a COMMIT file in it (a snapshot carried inside another work tree,
    where `git -C src` would name the enclosing repository's commit), else `git rev-parse` of a
    checkout that is its own repository, else 'unknown'."""
    path = os.path.join(src, "COMMIT")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "unknown"
    try:
        top = subprocess.run(
            ["git", "-C", src, "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(src):
            return "unknown"
        out = subprocess.run(
            ["git", "-C", src, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _build_scan(torch: Any, src: str, build_dir: str, log: Callable[[str], None]) -> Any:
    from torch.utils.cpp_extension import load

    csrc = os.path.join(src, "csrc", "selective_scan")
    sources = sorted(glob.glob(os.path.join(csrc, "*.cpp")) + glob.glob(os.path.join(csrc, "*.cu")))
    if not sources:
        raise FileNotFoundError(f"no sources under {csrc}")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    os.makedirs(build_dir, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    t = time.perf_counter()
    module = load(
        name="selective_scan_cuda",
        sources=sources,
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=[*_NVCC_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        extra_include_paths=[csrc],
        build_directory=build_dir,
        verbose=False,
    )
    log(f"mamba_ssm: built selective_scan_cuda for sm_{arch} in {time.perf_counter() - t:.0f} s")
    return module


def register_package(src: str) -> None:
    """Make `mamba_ssm` importable from the checkout `src` without executing its
    `__init__.py` (it imports the models, and through them transformers): a package object
    whose submodules resolve from the checkout. Enough for the Triton ops (SSD, state update),
    which need only triton and einops."""
    if "mamba_ssm" in sys.modules:
        return
    src = os.path.abspath(src)
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [os.path.join(src, "mamba_ssm")]
    pkg.__version__ = f"source {source_commit(src)}"  # type: ignore[attr-defined]
    sys.modules["mamba_ssm"] = pkg


def load(src: str, build_dir: str | None, log: Callable[[str], None]) -> dict[str, Any]:
    """Build and register mamba_ssm from the checkout `src`. Returns what the report records:
    {"src_commit", "build_s", "error"} (error is "" on success). Never raises: a peer that
    cannot be built is reported absent, with the reason, by `detect_peers`."""
    import torch

    src = os.path.abspath(src)
    info: dict[str, Any] = {"src_commit": source_commit(src), "build_s": None, "error": ""}
    t = time.perf_counter()
    try:
        if not os.path.isdir(os.path.join(src, "mamba_ssm")):
            raise FileNotFoundError(f"{src} has no mamba_ssm/ package directory")
        if "selective_scan_cuda" not in sys.modules:
            build = build_dir or os.path.join(src, ".flashscan-build")
            sys.modules["selective_scan_cuda"] = _build_scan(torch, src, build, log)
        register_package(src)
    except Exception as exc:  # nvcc missing, a compile error...: the peer is absent
        info["error"] = f"{type(exc).__name__}: {first_line(exc, 300)}"
        log(f"mamba_ssm from {src}: not built ({info['error']})")
    info["build_s"] = round(time.perf_counter() - t, 1)
    return info
