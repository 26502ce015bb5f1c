"""flashscan.distributed: ring attention and the sharded scan equal the same op over the whole
sequence, on CPU process groups (gloo; 2 and 4 processes on this machine, through the NumPy
references) and on 2 GPUs (NCCL, `tests/ring_cases.py` under torchrun); the shard helpers and
the argument checks. The cases themselves live in tests/ring_cases.py.

The processes fork from a forkserver that imported torch and flashscan once (spawning each
would import torch per process: seconds each on a shared machine).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import ring_cases  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402

from flashscan import distributed as fsd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _run(world: int, dtypes: tuple[torch.dtype, ...], tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "flashscan.torch", "flashscan.distributed", "ring_cases"])
    # a failing rank raises; start_processes re-raises it here with the rank's traceback
    tmp.start_processes(
        ring_cases.spawned,
        args=(world, str(tmp_path / "init"), dtypes),
        nprocs=world,
        start_method="forkserver",
    )


def test_ring_and_scan_two_ranks(tmp_path: Path) -> None:
    _run(2, (torch.float64, torch.float32), tmp_path)


def test_ring_and_scan_four_ranks(tmp_path: Path) -> None:
    _run(4, (torch.float64,), tmp_path)


# ---------------------------------------------------------------------------------------------
# Shard helpers and checks (no process group)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_zigzag_shards_round_trip(world: int) -> None:
    x = torch.randn(2, 8 * world, 3, 4)
    shards = [fsd.zigzag_shard(x, r, world) for r in range(world)]
    c = x.shape[1] // (2 * world)
    for r, s in enumerate(shards):
        assert torch.equal(s[:, :c], x[:, r * c : (r + 1) * c])
        assert torch.equal(s[:, c:], x[:, (2 * world - 1 - r) * c : (2 * world - r) * c])
    assert torch.equal(fsd.zigzag_unshard(shards), x)


def test_contiguous_shards_round_trip() -> None:
    x = torch.randn(2, 5, 12)
    shards = [fsd.shard(x, r, 3, dim=-1) for r in range(3)]
    assert torch.equal(shards[1], x[..., 4:8])
    assert torch.equal(fsd.unshard(shards, dim=-1), x)


def test_shard_length_must_divide() -> None:
    x = torch.randn(1, 10, 2, 8)
    with pytest.raises(ValueError, match="does not divide by world_size = 3"):
        fsd.shard(x, 0, 3)
    with pytest.raises(ValueError, match="2 \\* world_size = 4"):
        fsd.zigzag_shard(x[:, :6], 0, 2)


def test_ring_checks_its_arguments() -> None:
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="window_size"):
        fsd.ring_flash_attn_func(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match="layout"):
        fsd.ring_flash_attn_func(q, q, q, layout="striped")
    with pytest.raises(ValueError, match="odd"):
        fsd.ring_flash_attn_func(q[:, :7], q[:, :7], q[:, :7], layout="zigzag")
    with pytest.raises(ValueError, match="must be equal"):
        fsd.ring_flash_attn_func(q, q[:, :4], q[:, :4])


def test_needs_a_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # pragma: no cover - not in this suite
        pytest.skip("a process group is initialised in this process")
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        fsd.ring_flash_attn_func(q, q, q)


# ---------------------------------------------------------------------------------------------
# 2 GPUs: the same cases with NCCL in bfloat16 and float32, through torchrun
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_ring_and_scan_two_gpus_nccl() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    torchrun = shutil.which("torchrun")
    cmd = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    r = subprocess.run(
        [*cmd, "--standalone", "--nproc-per-node", "2", str(ROOT / "tests" / "ring_cases.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    assert "all cases passed on 2 ranks" in r.stdout
