"""Run metadata: device, driver, package versions, commit and the command line."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import re
import shlex
import subprocess
import sys
from typing import Any

from .timing import Timer


def git_commit(fs: Any) -> str | None:
    env = os.environ.get("FLASHSCAN_COMMIT")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(fs.__file__))
    for cwd in (here, os.getcwd()):
        try:
            rev = subprocess.run(
                ["git", "rev-parse", "--short=12", "HEAD"],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=10,
            )
            if rev.returncode != 0 or not rev.stdout.strip():
                continue
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=10,
            )
            return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def nvidia_smi_driver() -> str | None:
    try:
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def command_line(root: str | None) -> str:
    """How this run was started, as `python ...`."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("flashscan", "__main__.py")):
        argv = ["-m", "flashscan"] + argv[1:]
    return " ".join(shlex.quote(a) for a in ["python"] + argv)


def slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", ""))
    return s.strip("-") or "gpu"


def collect_meta(torch: Any, fs: Any, device: Any, timer: Timer, quick: bool) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(device)
    root = None
    info: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        info = dict(fs.info())
    triton_v = None
    with contextlib.suppress(Exception):
        import triton

        triton_v = triton.__version__
    cudnn_v = None
    with contextlib.suppress(Exception):
        cudnn_v = torch.backends.cudnn.version()
    driver = nvidia_smi_driver()
    if info.get("driver_version") is not None:
        driver = f"{driver or '?'} (CUDA driver API {info['driver_version']})"
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "date": _dt.date.today().isoformat(),
        "date_utc": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "device": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": getattr(props, "multi_processor_count", None),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "driver": driver,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": cudnn_v,
        "triton": triton_v,
        "python": platform.python_version(),
        "flashscan": getattr(fs, "__version__", None),
        "flashscan_file": os.path.abspath(fs.__file__),
        "flashscan_commit": git_commit(fs),
        "flashscan_backend": (
            f"{info.get('backend')} (available: {info.get('available')}"
            + (f", reason: {info.get('reason')}" if info.get("reason") else "")
            + ")"
        )
        if info
        else None,
        "nvrtc": info.get("nvrtc_version"),
        "flashscan_info": info,
        "command": command_line(root),
        "timer": timer.description,
        "quick": quick,
    }
