"""The package's layers read top to bottom: the import graph between flashscan's modules (read
from the source with `ast`, imports inside functions included) has no cycle, and the core (the
framework-free ops and what they stand on) never reaches the torch adapter. Grad-requiring torch
calls still reach `flashscan.torch` through the `_routes` registry, also when the caller never
imported it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "python" / "flashscan"

# the framework-free core: checks, dispatch, native calls and the host fallback
CORE = (
    "flashscan.attention",
    "flashscan.scan",
    "flashscan._checks",
    "flashscan._frameworks",
    "flashscan._backend",
    "flashscan._routes",
    "flashscan.reference",
    "flashscan.reference_bwd",
    "flashscan.ssd",
    "flashscan.reference_ssd",
)
ADAPTER = "flashscan.torch"


def package_modules(root: Path = PACKAGE_DIR, name: str = "flashscan") -> dict[str, Path]:
    """Dotted module name -> source file, for every .py of the package (subpackages too)."""
    mods: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join((name, *parts))] = path
    return mods


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that `name` imports anywhere in its source (top level, functions,
    `if TYPE_CHECKING:` blocks). `from . import x` is an import of submodule `x` when there is
    one, else of the package that holds the name; a submodule's implicit import of its
    parent package (which Python runs first) is not an edge."""

    def owner(dotted: str) -> str | None:
        # the longest prefix of `dotted` that is one of our modules
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            cand = ".".join(parts[:n])
            if cand in modules:
                return cand
        return None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                targets.append(sub if sub in modules else mod)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            # importlib.import_module("flashscan.x") / __import__: an import all the same
            targets = [node.args[0].value]
        for t in targets:
            o = owner(t)
            if o is not None and o != name:
                found.add(o)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


# --- the test's own parser, on small made-up packages -------------------------------------------


def _graph_of(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    modules = package_modules(root, "pkg")
    return {n: imports_of(n, p, modules) for n, p in modules.items()}


def test_parser_sees_lazy_relative_and_absolute_imports(tmp_path: Path) -> None:
    g = _graph_of(
        tmp_path,
        {
            "__init__.py": "from .core import f\n",
            "core.py": "import numpy\ndef f():\n    from . import adapter as a\n    return a\n",
            "adapter.py": "import torch\nfrom pkg.core import f\nfrom . import helpers\n",
            "helpers.py": "import importlib\nm = importlib.import_module('pkg.core')\n",
            "sub/__init__.py": "from .. import helpers\nfrom ..core import f\n",
        },
    )
    assert g == {
        "pkg": {"pkg.core"},
        "pkg.core": {"pkg.adapter"},
        "pkg.adapter": {"pkg.core", "pkg.helpers"},
        "pkg.helpers": {"pkg.core"},
        "pkg.sub": {"pkg.helpers", "pkg.core"},
    }
    assert find_cycle(g) == ["pkg.core", "pkg.adapter", "pkg.core"]
    assert reachable(g, "pkg.helpers") == {"pkg.core", "pkg.adapter", "pkg.helpers"}


# --- flashscan itself -----------------------------------------------------------------------------


def test_every_core_module_exists() -> None:
    graph = import_graph()
    assert set(CORE) | {ADAPTER, "flashscan"} <= set(graph)


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_core_never_reaches_the_torch_adapter() -> None:
    graph = import_graph()
    for mod in CORE:
        reached = reachable(graph, mod)
        assert ADAPTER not in reached, f"{mod} imports {ADAPTER} (directly or through a chain)"
        assert "flashscan" not in reached, f"{mod} imports the package's __init__ (the top)"


def test_routes_imports_nothing_from_flashscan() -> None:
    assert import_graph()["flashscan._routes"] == set()


def test_grad_calls_route_to_the_adapter_when_never_imported() -> None:
    """In a fresh process that never imports flashscan.torch, a grad-requiring torch call of
    the public API still runs the differentiable op (it loads the adapter on first need)."""
    pytest.importorskip("torch")
    code = textwrap.dedent(
        """
        import sys
        import flashscan
        import torch  # after flashscan: the adapter is loaded on first need

        assert "flashscan.torch" not in sys.modules
        q = torch.randn(1, 4, 2, 8)
        assert flashscan.flash_attn_func(q, q, q).grad_fn is None
        assert "flashscan.torch" not in sys.modules  # no grad: the adapter stays unloaded
        q.requires_grad_()
        out = flashscan.flash_attn_func(q, q, q, causal=True)
        assert out.grad_fn is not None
        assert "flashscan.torch" in sys.modules
        u = torch.randn(1, 4, 6, requires_grad=True)
        A = -torch.rand(4, 3)
        B = torch.randn(1, 3, 6)
        y = flashscan.selective_scan_fn(u, torch.rand(1, 4, 6), A, B, B)
        (out.sum() + y.sum()).backward()
        assert q.grad is not None and u.grad is not None
        try:
            flashscan.flash_attn_func(q, q, q, out=torch.empty(1, 4, 2, 8))
        except ValueError as e:
            assert "out: an out= array cannot take part in autograd" in str(e)
        else:
            raise AssertionError("out= with autograd did not raise")
        print("routed")
        """
    )
    r = _run_fresh(code)
    assert r.returncode == 0 and "routed" in r.stdout, r.stdout + r.stderr


def _run_fresh(code: str) -> subprocess.CompletedProcess:
    """`code` in a new interpreter that imports this flashscan."""
    import flashscan

    env = dict(os.environ)
    pkg_root = str(Path(flashscan.__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg_root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_compile_as_the_first_call_traces_the_adapter_op() -> None:
    """torch imported before flashscan: the adapter is loaded at import, so a grad-requiring
    call that torch.compile(fullgraph=True) traces before any eager call finds its op."""
    pytest.importorskip("torch")
    code = textwrap.dedent(
        """
        import sys
        import torch
        import flashscan

        assert "flashscan.torch" in sys.modules
        q = torch.randn(1, 7, 2, 16, requires_grad=True)
        k, v = torch.randn(1, 7, 2, 16), torch.randn(1, 7, 2, 16)
        f = torch.compile(lambda q, k, v: flashscan.flash_attn_func(q, k, v, causal=True).sum(),
                          fullgraph=True)
        f(q, k, v).backward()
        ref = flashscan.reference.flash_attn_func(q.detach().numpy(), k.numpy(), v.numpy(),
                                                  causal=True)
        assert abs(float(f(q, k, v)) - float(ref.sum())) < 1e-3 and q.grad is not None
        print("compiled")
        """
    )
    r = _run_fresh(code)
    assert r.returncode == 0 and "compiled" in r.stdout, r.stdout + r.stderr
