"""Run metadata: device, driver, package versions, commit and the command line, recorded without
machine-local paths (home or temporary directories, site-packages, virtual environments): a path
is kept relative to the repository when it lies inside it, else reduced to a neutral form."""

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

_PACKAGE_DIRS = ("site-packages", "dist-packages")


def repo_root(fs: Any = None) -> str | None:
    """The flashscan checkout this run belongs to: the one that holds the imported package
    (python/flashscan/), else the current directory's, if it looks like one."""
    candidates = []
    if fs is not None and getattr(fs, "__file__", None):
        pkg = os.path.dirname(os.path.abspath(fs.__file__))
        candidates.append(os.path.dirname(os.path.dirname(pkg)))
    candidates.append(os.getcwd())
    for c in candidates:
        if os.path.isfile(os.path.join(c, "pyproject.toml")) and os.path.isdir(
            os.path.join(c, "benches")
        ):
            return c
    return None


def neutral_path(path: str, root: str | None) -> str:
    """`path` without what only this machine knows: repository-relative when inside `root`;
    `<site-packages>/...` inside an installed environment; else `<local>/<name>`. Relative
    paths are left as they are."""
    if not os.path.isabs(path):
        return path
    p = os.path.normpath(path)
    if root is not None:
        r = os.path.normpath(os.path.abspath(root))
        if p == r:
            return "."
        if p.startswith(r + os.sep):
            return os.path.relpath(p, r).replace(os.sep, "/")
    parts = p.split(os.sep)
    for marker in _PACKAGE_DIRS:
        if marker in parts:
            rest = parts[len(parts) - 1 - parts[::-1].index(marker) + 1 :]
            return "/".join([f"<{marker}>", *rest])
    return f"<local>/{os.path.basename(p)}"


def neutral_text(text: str, root: str | None) -> str:
    """`text` with every absolute path in it (a token starting with `/`) made neutral."""
    return re.sub(r"(?<![\w.~:/-])/[^\s'\"`,;()=]+", lambda m: neutral_path(m.group(0), root), text)


def _package_file(fs: Any, root: str | None) -> str:
    """Where the imported flashscan lives: `python/flashscan/__init__.py` in this checkout,
    `<site-packages>/flashscan/__init__.py` installed, else `<local>/flashscan/__init__.py`."""
    pkg = os.path.dirname(os.path.abspath(fs.__file__))
    return neutral_path(pkg, root) + "/" + os.path.basename(fs.__file__)


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
    """How this run was started, as `python ...`, with absolute paths made neutral."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("flashscan", "__main__.py")):
        argv = ["-m", "flashscan"] + argv[1:]
    return " ".join(shlex.quote(neutral_text(a, root)) for a in ["python"] + argv)


def neutral_info(info: dict[str, Any], root: str | None) -> dict[str, Any]:
    """flashscan.info() with its paths (NVRTC library, cache directory) made neutral."""
    return {k: neutral_text(v, root) if isinstance(v, str) else v for k, v in info.items()}


def slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", ""))
    return s.strip("-") or "gpu"


def collect_meta(torch: Any, fs: Any, device: Any, timer: Timer, quick: bool) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(device)
    root = repo_root(fs)
    info: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        info = neutral_info(dict(fs.info()), root)
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
        "flashscan_file": _package_file(fs, root),
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
