"""`python -m flashscan info | demo | precompile | resources | bench`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

import flashscan
from flashscan import _backend, reference

# ---------------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------------


def _fmt_version(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (tuple, list)):
        return ".".join(str(x) for x in v)
    if isinstance(v, int) and v >= 1000:  # CUDA driver version: 12040 -> 12.4
        return f"{v // 1000}.{(v % 1000) // 10}"
    return str(v)


def cmd_info(args: argparse.Namespace) -> int:
    inf = flashscan.info()
    if args.json:
        print(json.dumps(inf, indent=2, default=str))
        return 0
    print(f"flashscan {inf['version']}")
    print(f"  backend         {inf['backend']}")
    if inf["reason"]:
        print(f"  reason          {inf['reason']}")
    print(f"  native module   {'loaded' if inf['native'] else 'missing'}")
    drv = _fmt_version(inf["driver_version"])
    print(f"  CUDA driver     {drv}  {inf['driver_path'] or ''}".rstrip())
    nv = _fmt_version(inf["nvrtc_version"])
    print(f"  NVRTC           {nv}  {inf['nvrtc_path'] or ''}".rstrip())
    print(f"  cache dir       {inf['cache_dir']}")
    print(f"  fallback policy {inf['fallback_policy']}")
    if inf["devices"]:
        print("  devices")
        for d in inf["devices"]:
            cc = d.get("compute_capability")
            cc_s = f"{cc[0]}.{cc[1]}" if cc else "?"
            ok = "supported" if d.get("supported") else "NOT supported (needs sm_80+)"
            print(
                f"    cuda:{d.get('index')}  {d.get('name', '?')}  cc {cc_s}  "
                f"{d.get('arch', '?')}  {d.get('sm_count', '?')} SMs  {ok}"
            )
    else:
        print("  devices         none")
    fw = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in inf["frameworks"].items())
    print(f"  frameworks      {fw}")
    print(f"  python          {inf['python']} ({inf['platform']}), numpy {inf['numpy']}")
    return 0


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------


class _Backend:
    """How the demo makes arrays, synchronises and reads results back."""

    def __init__(
        self,
        name: str,
        dtype: str,
        to_dev: Callable[[np.ndarray, str], Any],
        to_np: Callable[[Any], np.ndarray],
        sync: Callable[[], None],
        device: str,
    ) -> None:
        self.name, self.dtype, self.to_dev, self.to_np = name, dtype, to_dev, to_np
        self.sync, self.device = sync, device


def _pick_backend(force: str | None) -> tuple[_Backend, str]:
    note = ""
    if force != "numpy" and flashscan.available():
        if force in (None, "torch"):
            try:
                import torch

                if torch.cuda.is_available():
                    dt = {
                        "float16": torch.float16,
                        "bfloat16": torch.bfloat16,
                        "float32": torch.float32,
                    }

                    def t_dev(a: np.ndarray, dtype: str) -> Any:
                        return torch.from_numpy(a).to("cuda", dt[dtype])

                    def t_np(x: Any) -> np.ndarray:
                        return x.float().cpu().numpy()

                    name = torch.cuda.get_device_name(0)
                    return _Backend(
                        "cuda (torch)", "bfloat16", t_dev, t_np, torch.cuda.synchronize, name
                    ), note
                note = "torch is installed but torch.cuda.is_available() is False"
            except ImportError:
                note = "torch is not installed"
        if force in (None, "cupy"):
            try:
                import cupy

                def c_dev(a: np.ndarray, dtype: str) -> Any:
                    return cupy.asarray(a.astype(dtype))

                def c_np(x: Any) -> np.ndarray:
                    return cupy.asnumpy(x).astype(np.float32)

                def c_sync() -> None:
                    cupy.cuda.get_current_stream().synchronize()

                name = str(flashscan.info()["devices"][0].get("name", "GPU"))
                return _Backend("cuda (cupy)", "float16", c_dev, c_np, c_sync, name), ""
            except ImportError:
                note = (note + "; " if note else "") + "cupy is not installed"
        note = f"the CUDA backend is available but no GPU framework is usable ({note})"
    elif force not in (None, "numpy"):
        note = f"--framework {force} asked for, but the CUDA backend is unavailable"
    else:
        reason = flashscan.info()["reason"]
        note = "" if force == "numpy" else f"CUDA backend unavailable: {reason}"

    def n_dev(a: np.ndarray, dtype: str) -> Any:
        return a.astype(dtype)

    def n_np(x: Any) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    return _Backend("numpy (reference)", "float32", n_dev, n_np, lambda: None, "cpu"), note


def _time(fn: Callable[[], Any], sync: Callable[[], None], reps: int) -> tuple[float, float]:
    """(first call seconds, median seconds of later calls)."""
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return first, float(np.median(times))


_TOL = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}  # max error / max |reference|


def cmd_demo(args: argparse.Namespace) -> int:
    be, note = _pick_backend(args.framework)
    print(f"flashscan {flashscan.__version__} demo: backend {be.name} on {be.device}")
    if note:
        print(f"  ({note})")
    rng = np.random.default_rng(args.seed)
    ok = True
    reps = args.reps

    # Attention: the real-time shape of the issues, causal.
    b, s, h, d = 4, 256, 8, 64
    q, k, v = (rng.standard_normal((b, s, h, d)).astype(np.float32) for _ in range(3))
    qd, kd, vd = (be.to_dev(a, be.dtype) for a in (q, k, v))
    # The reference sees the same (rounded) values the backend sees.
    q, k, v = (be.to_np(x).astype(np.float64) for x in (qd, kd, vd))
    ref = reference.flash_attn_func(q, k, v, causal=True, accum_dtype=np.float64)
    first, med = _time(lambda: flashscan.flash_attn_func(qd, kd, vd, causal=True), be.sync, reps)
    got = be.to_np(flashscan.flash_attn_func(qd, kd, vd, causal=True))
    err = float(np.abs(got - ref).max())
    rel = err / max(float(np.abs(ref).max()), 1e-30)
    good = rel <= _TOL[be.dtype]
    ok &= good
    print(
        f"  flash_attn_func   ({b}, {s}, {h}, {d}) {be.dtype} causal: max error {err:.3e} "
        f"({rel:.1e} relative, limit {_TOL[be.dtype]:.0e}) {'ok' if good else 'FAILED'}; "
        f"first call {first * 1e3:.1f} ms, then {med * 1e6:.0f} us"
    )

    # Selective scan: varying B/C, D, z, delta_bias, softplus.
    b, dim, L, n = 2, 256, 256, 16
    u = rng.standard_normal((b, dim, L)).astype(np.float32)
    delta = (0.5 * rng.standard_normal((b, dim, L)) - 1.0).astype(np.float32)
    A = -np.exp(rng.uniform(-1.0, 1.0, (dim, n))).astype(np.float32)
    B = rng.standard_normal((b, n, L)).astype(np.float32)
    C = rng.standard_normal((b, n, L)).astype(np.float32)
    D = rng.standard_normal(dim).astype(np.float32)
    z = rng.standard_normal((b, dim, L)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(dim)).astype(np.float32)
    ud, dd, Bd, Cd, zd = (be.to_dev(a, be.dtype) for a in (u, delta, B, C, z))
    Ad, Dd, biasd = (be.to_dev(a, "float32") for a in (A, D, bias))
    u64, d64, B64, C64, z64 = (be.to_np(x).astype(np.float64) for x in (ud, dd, Bd, Cd, zd))
    ref = reference.selective_scan_fn(
        u64,
        d64,
        A.astype(np.float64),
        B64,
        C64,
        D.astype(np.float64),
        z64,
        bias.astype(np.float64),
        delta_softplus=True,
    )

    def scan() -> Any:
        return flashscan.selective_scan_fn(ud, dd, Ad, Bd, Cd, Dd, zd, biasd, delta_softplus=True)

    first, med = _time(scan, be.sync, reps)
    got = be.to_np(scan())
    err = float(np.abs(got - ref).max())
    rel = err / max(float(np.abs(ref).max()), 1e-30)
    good = rel <= _TOL[be.dtype]
    ok &= good
    print(
        f"  selective_scan_fn ({b}, {dim}, {L}) dstate {n} {be.dtype}: max error {err:.3e} "
        f"({rel:.1e} relative, limit {_TOL[be.dtype]:.0e}) {'ok' if good else 'FAILED'}; "
        f"first call {first * 1e3:.1f} ms, then {med * 1e6:.0f} us"
    )
    print("demo passed" if ok else "demo FAILED")
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------
# precompile
# ---------------------------------------------------------------------------------------------


class _Progress:
    """progress(done, total, name) for _native.precompile: one line rewritten on a terminal,
    one line per variant otherwise."""

    def __init__(self, where: str, tty: bool) -> None:
        self.where, self.tty, self.width = where, tty, 0

    def __call__(self, done: int, total: int, name: str) -> None:
        line = f"{self.where} [{done:>{len(str(total))}}/{total}] {name}"
        if self.tty:
            pad = max(0, self.width - len(line))
            self.width = len(line)
            print("\r" + line + " " * pad, end="", flush=True)
        else:
            print(line, flush=True)


def _precompile_into_cache(
    where: str, build: Callable[[_Progress], int], errors: tuple[type[BaseException], ...]
) -> bool:
    """One precompile run (`build(progress)`, a native precompile returning how many variants it
    compiled) for `where` ("cuda:0", "sm_90a"), timed and reported; False (reported) on `errors`."""
    native = _backend.native
    assert native is not None
    tty = sys.stdout.isatty()
    t0 = time.perf_counter()
    try:
        n = int(build(_Progress(where, tty)))
    except errors as exc:
        if tty:
            print()
        print(f"precompile: {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    if tty:
        print()
    print(
        f"{where}: {n} kernel variant(s) compiled, the rest were cached "
        f"({time.perf_counter() - t0:.1f} s); cache: {native.cache_dir()}"
    )
    return True


def _precompile_arch(args: argparse.Namespace) -> int:
    """precompile --arch: NVRTC alone, no GPU (e.g. a container image built on a machine without
    one). The cache entries are found at run time under the same NVRTC major.minor and arch."""
    native = _backend.native
    if native is None:
        reason = flashscan.info()["reason"]
        print(f"precompile: the native module is unavailable: {reason}", file=sys.stderr)
        return 1
    from flashscan import _resources

    try:
        arch = _resources.normalize_arch(args.arch)
    except ValueError as exc:
        print(f"precompile: {exc}", file=sys.stderr)
        return 2
    if arch == "sm_90":  # (what a GPU of compute 9.0 looks up: its wgmma / TMA kernels)
        arch = "sm_90a"

    def build(progress: _Progress) -> int:
        return native.precompile_arch(
            arch, progress, all=args.all, workers=args.workers, families=args.family
        )

    return 0 if _precompile_into_cache(arch, build, (flashscan.FlashscanError, ValueError)) else 1


def cmd_precompile(args: argparse.Namespace) -> int:
    if args.arch is not None:
        return _precompile_arch(args)
    if args.family:
        print("precompile: --family goes with --arch", file=sys.stderr)
        return 2
    if not flashscan.available():
        print(
            "precompile: no usable CUDA GPU here, nothing to compile "
            f"({flashscan.info()['reason']}).\nKernels are compiled for the GPU they run on: "
            "run this on the machine with the GPU, or name its arch with --arch (sm_90a for "
            "an H100) to compile with NVRTC alone.",
            file=sys.stderr,
        )
        return 1
    native = _backend.native
    assert native is not None
    devices = sorted(_backend.usable_devices()) if args.device is None else [args.device]
    for dev in devices:
        if dev not in _backend.usable_devices():
            print(f"precompile: {_backend.device_reason(dev)}", file=sys.stderr)
            return 1

        def build(progress: _Progress, dev: int = dev) -> int:
            return native.precompile(dev, progress, all=args.all, workers=args.workers)

        if not _precompile_into_cache(f"cuda:{dev}", build, (flashscan.FlashscanError,)):
            return 1
    return 0


# ---------------------------------------------------------------------------------------------
# resources
# ---------------------------------------------------------------------------------------------


def cmd_resources(args: argparse.Namespace) -> int:
    """Compile the package's kernel variants for --arch with NVRTC (no GPU) and print each
    kernel's registers, stack/local bytes and static shared memory, as cuobjdump reads them."""
    from . import _resources

    native = _backend.native
    if native is None:
        print(f"resources: {_backend.status()['reason']}", file=sys.stderr)
        return 1
    nvrtc = native.backend_status().get("nvrtc_version")
    if nvrtc is None:
        print(
            "resources: NVRTC not found (pip install nvidia-cuda-nvrtc): it compiles the kernels",
            file=sys.stderr,
        )
        return 1
    tool = _resources.find_cuobjdump()
    if tool is None:
        print(f"resources: {_resources.CUOBJDUMP_MISSING}", file=sys.stderr)
        return 1
    try:
        arch = _resources.normalize_arch(args.arch)
        variants = _resources.select_variants(arch, args.family, args.main, args.only)
    except ValueError as exc:
        print(f"resources: {exc}", file=sys.stderr)
        return 2
    if not variants:
        print(f"resources: no kernel variant matches for {arch}", file=sys.stderr)
        return 1
    tty = sys.stderr.isatty()

    def progress(done: int, total: int, name: str) -> None:
        if tty:
            print(f"\r  {done}/{total} compiled", end="", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    try:
        results = _resources.measure(arch, variants, tool, args.workers, progress)
    except Exception as exc:  # a compile error or a failing cuobjdump: say which and stop
        if tty:
            print(file=sys.stderr)
        print(f"resources: {arch}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if tty:
        print(file=sys.stderr)
    if args.json:
        report = {
            "arch": arch,
            "nvrtc_version": nvrtc,
            "cuobjdump": tool,
            "variants": [r.as_dict() for r in results],
        }
        print(json.dumps(report, indent=2))
    else:
        print(_resources.format_table(arch, results))
        secs = time.perf_counter() - t0
        print(f"({secs:.1f} s; NVRTC {_fmt_version(nvrtc)}, {tool})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashscan",
        description="flashscan: FlashAttention and Mamba selective-scan kernels.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_info = sub.add_parser("info", help="show the backend, devices, driver/NVRTC and cache")
    p_info.add_argument("--json", action="store_true", help="print info() as JSON")
    p_info.set_defaults(func=cmd_info)
    p_demo = sub.add_parser(
        "demo", help="run attention and the scan on the available backend, check and time them"
    )
    p_demo.add_argument(
        "--framework",
        choices=("torch", "cupy", "numpy"),
        default=None,
        help="which arrays to use (default: torch or cupy on a usable GPU, else numpy)",
    )
    p_demo.add_argument("--reps", type=int, default=10, help="timed calls after the first")
    p_demo.add_argument("--seed", type=int, default=0)
    p_demo.set_defaults(func=cmd_demo)
    p_pre = sub.add_parser(
        "precompile",
        help="compile the common kernel variants (or --all) for this GPU into the disk cache",
    )
    p_pre.add_argument("--all", action="store_true", help="every variant, not only the common ones")
    p_pre.add_argument(
        "--workers", type=int, default=None, help="parallel NVRTC compiles (default: CPU count)"
    )
    p_pre.add_argument("--device", type=int, default=None, help="CUDA device (default: all)")
    p_pre.add_argument(
        "--arch",
        default=None,
        help="compile for this arch with NVRTC alone, no GPU needed (sm_80, sm_86, sm_89, sm_90a, "
        "sm_100, sm_120): for a container image built on a machine without one; the entries are "
        "used where the run-time NVRTC has the same major.minor",
    )
    p_pre.add_argument(
        "--family",
        action="append",
        default=None,
        help="with --arch: only this kernel family (repeatable; see `resources`)",
    )
    p_pre.set_defaults(func=cmd_precompile)
    p_res = sub.add_parser(
        "resources",
        help="compile the kernel variants with NVRTC (no GPU) and print registers, "
        "stack/spill bytes and static shared memory per kernel (needs cuobjdump)",
    )
    p_res.add_argument(
        "--arch", default="sm_90a", help="target arch: sm_80, sm_86, sm_89, sm_90a... (sm_90a)"
    )
    p_res.add_argument(
        "--family",
        action="append",
        default=None,
        metavar="NAME",
        help="only this kernel family (flash_fwd, flash_bwd, flash_decode, selective_scan, "
        "selective_scan_bwd, state_update, causal_conv1d, ssd, ssd_fwd2, ssd_bwd); repeatable",
    )
    p_res.add_argument("--main", action="store_true", help="only the main variants")
    p_res.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="SUBSTR",
        help="only the variants whose name contains SUBSTR, e.g. "
        "'ssd2_chunk_scan[FS_DTYPE=1,FS_CHUNK=256' (one compile instead of a family's); repeatable",
    )
    p_res.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p_res.add_argument(
        "--workers", type=int, default=None, help="parallel NVRTC compiles (default: up to 4)"
    )
    p_res.set_defaults(func=cmd_resources)
    sub.add_parser(
        "bench",
        help="time flashscan against the peers present here (benches/compare.py); "
        "`bench --help` for options",
        add_help=False,
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from . import bench  # imports torch/triton lazily, only for this command

        return int(bench.main(argv[1:]))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
