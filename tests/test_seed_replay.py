"""FLASHSCAN_TEST_SEED replays a test's draw: every source the tests draw from is seeded from it
(Python's `random`, which the GPU helpers turn into torch.Generator seeds, and the `rng`
fixture). Checked in child pytest runs of a probe test under this directory's conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

_PROBE = """
import random


def test_probe(rng):
    print("DRAW", random.getrandbits(62), int(rng.integers(1 << 62)))
"""


def _draw(tmp: Path, seed: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "FLASHSCAN_TEST_SEED"}
    if seed is not None:
        env["FLASHSCAN_TEST_SEED"] = seed
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(tmp)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if "DRAW" in ln]
    assert len(lines) == 1, done.stdout[-2000:]
    return lines[0][lines[0].index("DRAW") :]


def test_seed_replays_every_draw(tmp_path: Path) -> None:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(_PROBE)
    first = _draw(tmp_path, "3434922452882669254")
    assert _draw(tmp_path, "3434922452882669254") == first
    assert _draw(tmp_path, "12345") != first
    assert _draw(tmp_path, None) != _draw(tmp_path, None)  # fresh entropy without the variable
