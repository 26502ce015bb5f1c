"""causal-conv1d (Dao-AILab) as a measured peer from a source checkout (`--conv1d-src DIR`),
where no wheel matches the installed torch + CUDA pair.

Its CUDA extension (`csrc/*.cpp`, `csrc/*.cu`) is built here with torch's `cpp_extension.load`
for this device's arch only (nvcc and ninja needed) and registered as the `causal_conv1d_cuda`
module its Python package imports; the package itself is then imported from the checkout, so
the peer timed is causal-conv1d's own `causal_conv1d_fn` / `causal_conv1d_update`, unmodified.
"""

from __future__ import annotations

import glob
import os
import sys
import time
from typing import Any, Callable

from .fmt import first_line
from .mamba_src import _NVCC_FLAGS, source_commit


def _build(torch: Any, src: str, build_dir: str, log: Callable[[str], None]) -> Any:
    from torch.utils.cpp_extension import load

    csrc = os.path.join(src, "csrc")
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
        name="causal_conv1d_cuda",
        sources=sources,
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=[*_NVCC_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        extra_include_paths=[csrc],
        build_directory=build_dir,
        verbose=False,
    )
    log(f"causal-conv1d: built causal_conv1d_cuda for sm_{arch} in {time.perf_counter() - t:.0f} s")
    return module


def _import_prebuilt(path: str) -> Any:
    """The extension module from a .so built earlier (by `_build` on a machine like this one)
    and carried here without its build tree: imported as is, nothing compiled."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("causal_conv1d_cuda", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(src: str, build_dir: str | None, log: Callable[[str], None]) -> dict[str, Any]:
    """Build and import causal-conv1d from the checkout `src`. Returns {"src_commit",
    "build_s", "error", "module"}: module is the imported `causal_conv1d` package (None, with
    the reason in error, when it could not be built). Never raises."""
    import torch

    src = os.path.abspath(src)
    info: dict[str, Any] = {
        "src_commit": source_commit(src),
        "build_s": None,
        "error": "",
        "module": None,
    }
    t = time.perf_counter()
    try:
        if not os.path.isdir(os.path.join(src, "causal_conv1d")):
            raise FileNotFoundError(f"{src} has no causal_conv1d/ package directory")
        if "causal_conv1d_cuda" not in sys.modules:
            build = build_dir or os.path.join(src, ".flashscan-build")
            so = os.path.join(build, "causal_conv1d_cuda.so")
            if os.path.isfile(so) and not os.path.isfile(os.path.join(build, "build.ninja")):
                # a carried build: the .so alone, no tree for ninja to bring up to date
                sys.modules["causal_conv1d_cuda"] = _import_prebuilt(so)
                log(f"causal-conv1d: imported the prebuilt {so}")
            else:
                sys.modules["causal_conv1d_cuda"] = _build(torch, src, build, log)
        if src not in sys.path:
            sys.path.insert(0, src)
        import causal_conv1d

        info["module"] = causal_conv1d
    except Exception as exc:  # nvcc missing, a compile error...: the peer is absent
        info["error"] = f"{type(exc).__name__}: {first_line(exc, 300)}"
        log(f"causal-conv1d from {src}: not built ({info['error']})")
    info["build_s"] = round(time.perf_counter() - t, 1)
    return info
