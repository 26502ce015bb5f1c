"""Compare the SASS of every kernel variant between two builds of flashscan (no GPU needed).

    python tools/sass_diff.py A B [--arch sm_90a:all --arch sm_80:main] [--only TEXT] [--jobs 2]
                              [--nvrtc-a LIB] [--nvrtc-b LIB]

A and B: a PYTHONPATH entry holding `flashscan/` with its `_native` extension, a wheel (.whl), or
a folder written by `--save`. Each side compiles its variants (ARCH:all, or ARCH:main: the main
ones; --only: names containing TEXT) through `_native.kernel_variants` / `compile_variant` in a
subprocess and disassembles them with `cuobjdump -sass` (it needs `nvdisasm`: the
nvidia-cuda-nvdisasm wheel or triton's copy is found). Prints per arch how many variants have the
same SASS (instructions and encodings, registers, stack, shared and local memory); for each that
differs, both instruction counts and resources. Exit status 1 when any differ.

--nvrtc-a / --nvrtc-b: that side compiles with this libnvrtc.so (its FLASHSCAN_NVRTC; its folder
also goes on LD_LIBRARY_PATH for the builtins library beside it). One build under two NVRTCs
shows what the compiler version alone changes: the H100 machine (and torch cu130) runs NVRTC
13.0 while the CPU checks install the newest wheel, and on 2026-11-27 the two gave
ssd_bwd_chunk_dc16 202 and 168 registers (2 and 3 CTAs per SM). For example:

    pip install --target /tmp/nvrtc130 "nvidia-cuda-nvrtc==13.0.*"
    python tools/sass_diff.py W.whl W.whl --arch sm_90a:all --only ssd_bwd \
        --nvrtc-b /tmp/nvrtc130/nvidia/cu13/lib/libnvrtc.so.13
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

INSN = re.compile(r"^/\*[0-9a-f]{4,}\*/ ")
RESOURCE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
BINS = ("", "nvidia/cu13/bin", "nvidia/cuda_nvdisasm/bin", "triton/backends/nvidia/bin")


def _tool(name: str) -> Path:
    for entry in [*os.environ.get("PATH", "").split(os.pathsep), *sys.path]:
        for sub in BINS:
            if os.access(Path(entry, sub, name), os.X_OK) and Path(entry, sub, name).is_file():
                return Path(entry, sub, name)
    sys.exit(f"{name} not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def dump(out: Path, archs: list[str], only: list[str], jobs: int) -> None:
    """Every selected variant's `cuobjdump -sass --dump-resource-usage` as out/ARCH/N.sass."""
    from flashscan import _native

    cuobjdump = str(_tool("cuobjdump"))
    env = dict(os.environ, PATH=f"{_tool('nvdisasm').parent}{os.pathsep}{os.environ['PATH']}")
    for spec in archs:
        arch, which = spec.split(":")
        names = [v["name"] for v in _native.kernel_variants(arch) if which == "all" or v["main"]]
        names = [n for n in names if not only or any(o in n for o in only)]
        (out / arch).mkdir(parents=True, exist_ok=True)

        def one(i: int, arch: str = arch, names: list[str] = names) -> None:
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(_native.compile_variant(names[i], arch))  # releases the GIL
                f.flush()
                cmd = [cuobjdump, "-sass", "--dump-resource-usage", f.name]
                res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            (out / arch / f"{i}.sass").write_text(res.stdout)

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, range(len(names))))
        (out / arch / "index.json").write_text(json.dumps(names))


def side(src: str, args: argparse.Namespace, keep: Path | None, nvrtc: str | None) -> Path:
    """A folder of dumps: src itself when it is one, else written by a subprocess on src (with
    `nvrtc` as its libnvrtc when given)."""
    if Path(src, args.arch[0].split(":")[0], "index.json").is_file():
        return Path(src)
    out, path = keep or Path(tempfile.mkdtemp(prefix="sass-")), src
    if src.endswith(".whl"):
        path = tempfile.mkdtemp(prefix="wheel-")
        zipfile.ZipFile(src).extractall(path)
    cmd = [sys.executable, __file__, "--dump", str(out), "--jobs", str(args.jobs)]
    cmd += [x for a in args.arch for x in ("--arch", a)] + [
        x for o in args.only for x in ("--only", o)
    ]
    env = dict(os.environ, PYTHONPATH=path)
    if nvrtc:
        lib = Path(nvrtc).resolve()
        if not lib.is_file():
            sys.exit(f"--nvrtc: {nvrtc} is not a file")
        env["FLASHSCAN_NVRTC"] = str(lib)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(lib.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
    subprocess.run(cmd, env=env, check=True, cwd=tempfile.gettempdir())
    return out


def parse(text: str) -> tuple[list[str], dict[str, tuple[int, ...]]]:
    """SASS lines (code, encodings, function names; whitespace dropped) and resources."""
    lines, res, fn = [], {}, ""
    for line in text.splitlines():
        fn = line.split()[-1].rstrip(":") if "Function " in line else fn
        if m := RESOURCE.search(line):
            res[fn] = tuple(int(x) for x in m.groups())
        if line.strip().startswith(("/*", "Function", "code for")):
            lines.append(" ".join(line.split()))
    return lines, res


def compare(a: Path, b: Path, archs: list[str]) -> int:
    differ = 0
    for arch in (spec.split(":")[0] for spec in archs):
        index = [json.loads((d / arch / "index.json").read_text()) for d in (a, b)]
        ia = {n: i for i, n in enumerate(index[0])}
        names = [(n, ia[n], ib) for ib, n in enumerate(index[1]) if n in ia]
        same = 0
        for name, i, j in names:
            (la, ra), (lb, rb) = (
                parse((d / arch / f"{k}.sass").read_text()) for d, k in ((a, i), (b, j))
            )
            if la == lb and ra == rb:
                same += 1
                continue
            na, nb = (sum(1 for x in lines if INSN.match(x)) for lines in (la, lb))
            resources = f"REG/STACK/SHARED/LOCAL {ra} -> {rb}"
            print(f"  DIFF {arch} {name}: {na} -> {nb} instructions, {resources}")
        print(
            f"{arch}: {same} identical, {len(names) - same} different (of {len(names)}; "
            f"{len(index[1]) - len(names)} of B not in A)"
        )
        differ += len(index[1]) - same
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", nargs="?")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--arch", action="append", help="ARCH:all or ARCH:main (repeatable)")
    ap.add_argument("--only", action="append", default=[], help="name substring (repeatable)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--save", type=Path, help="keep the dumps of A and B in DIR/a and DIR/b")
    ap.add_argument("--nvrtc-a", help="libnvrtc.so for side A (default: the one flashscan finds)")
    ap.add_argument("--nvrtc-b", help="libnvrtc.so for side B")
    ap.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.arch = args.arch or ["sm_90a:all", "sm_80:main"]
    if args.dump:
        dump(args.dump, args.arch, args.only, args.jobs)
        return 0
    if not (args.a and args.b):
        ap.error("give two builds to compare")
    keep = {k: args.save / k if args.save else None for k in "ab"}
    a = side(args.a, args, keep["a"], args.nvrtc_a)
    return compare(a, side(args.b, args, keep["b"], args.nvrtc_b), args.arch)


if __name__ == "__main__":
    sys.exit(main())
