"""Compare the SASS of every kernel variant between two builds of flashscan (no GPU needed).

    python tools/sass_diff.py A B [--arch sm_90a:all --arch sm_80:main] [--only TEXT] [--jobs 2]
                              [--save DIR]

A and B are each a PYTHONPATH entry holding `flashscan/` (with its `_native` extension), a wheel
(.whl), or a folder that `--save` wrote earlier. Each side compiles its variants through the
package's public `_native.kernel_variants` / `_native.compile_variant` in a subprocess, then
`cuobjdump -sass` (needs `nvdisasm` on PATH or beside a cuobjdump / in triton's bin) disassembles
them (--only: just the variants whose name contains TEXT). Prints, per arch, how many variants have identical SASS, and for each that differs the
instruction counts and the registers / local memory of both sides. Exit status 1 when any differ.
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

INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*/\*")
RESOURCE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def _tool(name: str) -> str:
    for entry in [*os.environ.get("PATH", "").split(os.pathsep), *sys.path]:
        for sub in ("", "nvidia/cu13/bin", "nvidia/cuda_nvdisasm/bin", "triton/backends/nvidia/bin"):
            p = Path(entry, sub, name)
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    sys.exit(f"{name} not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def dump(out: Path, archs: list[str], jobs: int, only: list[str]) -> None:
    """Compile and disassemble every selected variant into out/<arch>/<n>.sass (+ index.json)."""
    from flashscan import _native

    cuobjdump = _tool("cuobjdump")
    env = dict(os.environ, PATH=f"{Path(_tool('nvdisasm')).parent}{os.pathsep}{os.environ['PATH']}")
    for spec in archs:
        arch, which = spec.split(":")
        variants = [
            v["name"]
            for v in _native.kernel_variants(arch)
            if (which == "all" or v["main"]) and (not only or any(o in v["name"] for o in only))
        ]
        (out / arch).mkdir(parents=True, exist_ok=True)

        def one(i_name: tuple[int, str], arch: str = arch) -> None:
            i, name = i_name
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(_native.compile_variant(name, arch))
                f.flush()
                run = [cuobjdump, "-sass", "--dump-resource-usage", f.name]
                text = subprocess.run(run, env=env, check=True, capture_output=True, text=True)
            (out / arch / f"{i}.sass").write_text(text.stdout)

        with ThreadPoolExecutor(jobs) as pool:  # compile_variant releases the GIL
            list(pool.map(one, enumerate(variants)))
        (out / arch / "index.json").write_text(json.dumps(variants))


def side(src: str, archs: list[str], jobs: int, only: list[str], keep: Path | None) -> Path:
    """A folder of dumps for one side: src itself when it is one, else made by a subprocess."""
    if Path(src, archs[0].split(":")[0], "index.json").is_file():
        return Path(src)
    out = keep or Path(tempfile.mkdtemp(prefix="sass-"))
    path = src
    if src.endswith(".whl"):
        path = tempfile.mkdtemp(prefix="wheel-")
        zipfile.ZipFile(src).extractall(path)
    cmd = [sys.executable, __file__, "--dump", str(out), "--jobs", str(jobs)]
    cmd += [a for spec in archs for a in ("--arch", spec)] + [a for o in only for a in ("--only", o)]
    subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=path), check=True, cwd=tempfile.gettempdir())
    return out


def parse(text: str) -> tuple[list[str], dict[str, tuple[int, ...]]]:
    """Instruction lines (text + encodings, whitespace dropped) and per-function resources."""
    lines, res, fn = [], {}, None
    for line in text.splitlines():
        if "Function " in line:
            fn = line.split()[-1].rstrip(":")
        m = RESOURCE.search(line)
        if m and fn:
            res[fn] = tuple(int(x) for x in m.groups())
        if line.strip().startswith(("/*", "Function", "code for")):
            lines.append(" ".join(line.split()))
    return lines, res


def compare(a: Path, b: Path, archs: list[str]) -> int:
    differ = 0
    for spec in archs:
        arch = spec.split(":")[0]
        ia_of = {n: i for i, n in enumerate(json.loads((a / arch / "index.json").read_text()))}
        ib_of = {n: i for i, n in enumerate(json.loads((b / arch / "index.json").read_text()))}
        names = [n for n in ib_of if n in ia_of]
        if len(names) != len(ib_of):
            print(f"{arch}: {len(ib_of) - len(names)} variants of B are not in A")
            differ += 1
        same = 0
        for name in names:
            la, ra = parse((a / arch / f"{ia_of[name]}.sass").read_text())
            lb, rb = parse((b / arch / f"{ib_of[name]}.sass").read_text())
            if la == lb and ra == rb:
                same += 1
                continue
            ia = sum(1 for x in la if INSN.match(x))
            ib = sum(1 for x in lb if INSN.match(x))
            print(f"  DIFF {arch} {name}: {ia} -> {ib} instructions; REG/STACK/SHARED/LOCAL {ra} -> {rb}")
        print(f"{arch}: {same} identical, {len(names) - same} different (of {len(names)})")
        differ += len(names) - same
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", nargs="?")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--arch", action="append", help="ARCH:all or ARCH:main (repeatable)")
    ap.add_argument("--only", action="append", default=[], help="name substring (repeatable)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--save", type=Path, help="keep the dumps of A and B under DIR/a, DIR/b")
    ap.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    archs = args.arch or ["sm_90a:all", "sm_80:main"]
    if args.dump:
        dump(args.dump, archs, args.jobs, args.only)
        return 0
    if not (args.a and args.b):
        ap.error("give two builds to compare")
    keep = {k: args.save / k if args.save else None for k in "ab"}
    a = side(args.a, archs, args.jobs, args.only, keep["a"])
    b = side(args.b, archs, args.jobs, args.only, keep["b"])
    return compare(a, b, archs)


if __name__ == "__main__":
    sys.exit(main())
