"""GPU tests of the warp-specialised Hopper forward (cuda/flash_fwd_sm90_tma.cu): TMA loads by a
producer warpgroup into an mbarrier ring, two consumer warpgroups, three schedules.

The kernel is the default where the wgmma path runs (FLASHSCAN_SM90_TMA=0 opts out; the schedule
env is read once per process), so each schedule runs in a child process (this file run as a script)
with its own kernel cache directory; the test then also checks that the TMA kernel was really built
there (not the cp.async fallback). The child kills nothing: a deadlocked ring shows as the parent's
timeout. Correctness rule of DESIGN.md (float64 reference, same-precision baseline, NaN-poisoned
out=, LSE) over tails (seqlen not a multiple of 128, seqlen 1), seqlen_q != seqlen_k, GQA/MQA,
causal and windows, softcap, head dims 64, 128 and 256 and the ones padded to them (32-248), fp16
and bf16, and a (b, h, s, d) tensor seen as (b, s, h, d) (non-contiguous strides).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent

# b, sq, sk, h, hk, d, causal, window, bhsd (q/k/v as permuted views)
CASES = [
    (2, 256, 256, 4, 4, 128, False, (-1, -1), False),
    (2, 333, 333, 4, 4, 128, False, (-1, -1), False),
    (1, 1000, 1000, 4, 2, 128, True, (-1, -1), False),
    (2, 200, 517, 4, 4, 128, True, (-1, -1), False),
    (2, 517, 200, 4, 1, 128, True, (-1, -1), False),
    (1, 700, 700, 2, 2, 128, False, (100, 30), False),
    (3, 17, 300, 2, 2, 128, False, (-1, -1), True),
    (2, 1, 129, 4, 4, 128, True, (-1, -1), False),
    (2, 129, 1, 2, 2, 128, False, (-1, -1), False),
    (2, 256, 256, 4, 4, 64, False, (-1, -1), True),
    (1, 777, 777, 4, 2, 64, True, (-1, -1), False),
    (2, 300, 650, 2, 2, 64, False, (64, 0), False),
    # more tiles than an H100 / H200 has SMs: the persistent kernel's CTAs walk several tiles
    # (with FLASHSCAN_SM90_PERSIST_CTAS=3 below every case above walks many); masked ones on
    # the tile queue, with L2 sections of several (batch, head) pairs, and tiles no key is
    # visible to (seqlen_q > seqlen_k, causal) among them
    (4, 1100, 1100, 16, 4, 128, False, (-1, -1), False),
    (6, 300, 1000, 8, 2, 128, False, (-1, -1), False),
    (8, 999, 999, 8, 8, 64, False, (-1, -1), False),
    (4, 1100, 1100, 16, 4, 128, True, (-1, -1), False),
    (8, 999, 999, 8, 8, 64, True, (-1, -1), False),
    (6, 1300, 500, 8, 2, 64, True, (-1, -1), False),
    (3, 900, 1500, 8, 8, 128, False, (256, 64), False),
    # head dims below the kernel's tile (64 or 128): the maps keep the real width, TMA fills the
    # columns past it with zeros, the epilogue stores O's own columns only
    (2, 333, 333, 4, 2, 96, True, (-1, -1), False),
    (1, 517, 300, 4, 4, 80, False, (64, 16), False),
    (2, 200, 200, 4, 4, 48, False, (-1, -1), True),
    (2, 700, 700, 2, 2, 112, True, (-1, -1), False),
    (2, 129, 1, 2, 2, 32, False, (-1, -1), False),
    (4, 1100, 1100, 12, 4, 96, False, (-1, -1), False),
    (6, 999, 999, 8, 8, 80, True, (-1, -1), False),
    (3, 700, 1300, 8, 2, 40, True, (-1, -1), False),
    # head dim 256: 64-key K / V tiles, two P V wgmmas a k-step (one CTA a tile in every
    # schedule); 136-248 padded to it
    (2, 333, 333, 4, 2, 256, False, (-1, -1), False),
    (1, 517, 517, 2, 2, 256, True, (-1, -1), False),
    (2, 200, 450, 2, 1, 256, True, (-1, -1), True),
    (1, 600, 600, 2, 2, 256, False, (100, 20), False),
    (2, 1, 65, 2, 2, 256, True, (-1, -1), False),
    (2, 65, 1, 2, 2, 256, False, (-1, -1), False),
    (2, 300, 300, 4, 4, 192, True, (-1, -1), False),
    (1, 257, 400, 2, 2, 136, False, (-1, -1), False),
    (2, 190, 190, 2, 2, 248, False, (-1, -1), True),
]
# softcap (the default schedules build it; the others send these to the mma.sync kernel):
# b, sq, sk, h, hk, d, causal, window, bhsd, softcap; cap 1 saturates tanh for most scores
SOFTCAP_CASES = [
    (2, 333, 333, 4, 2, 128, True, (-1, -1), False, 30.0),
    (2, 300, 650, 2, 2, 64, False, (64, 0), False, 50.0),
    (1, 777, 777, 4, 2, 64, True, (-1, -1), True, 1.0),
    (2, 517, 200, 4, 1, 256, True, (-1, -1), False, 50.0),
    (1, 600, 600, 2, 2, 256, False, (-1, -1), False, 1.0),
    (2, 333, 333, 4, 4, 96, False, (-1, -1), False, 20.0),
    (4, 1100, 1100, 16, 4, 128, False, (-1, -1), False, 30.0),
    (8, 999, 999, 8, 8, 64, True, (-1, -1), False, 50.0),
]
# packed sequences (flash_attn_varlen_func) on the TMA kernel's one-tile form:
# q lengths, k lengths, h, hk, d, causal, window, softcap; lengths 0 / 1, around the 128- and
# 192-row tiles, seqlen_q != seqlen_k per sequence
VARLEN_CASES = [
    ([191, 0, 1, 193, 128, 129, 64], [191, 5, 0, 300, 127, 129, 64], 4, 2, 64, True, (-1, -1), 0.0),
    ([1000, 7, 513], [1000, 7, 513], 4, 4, 128, False, (-1, -1), 0.0),
    ([64, 200, 333], [1064, 900, 333], 8, 2, 128, True, (-1, -1), 30.0),
    ([300, 129], [450, 129], 2, 1, 256, True, (-1, -1), 0.0),
    ([517, 65], [517, 65], 4, 4, 96, False, (64, 16), 0.0),
    ([257, 3, 190], [257, 3, 190], 2, 2, 256, False, (-1, -1), 1.0),
    ([385, 700], [385, 700], 4, 4, 64, False, (100, 0), 50.0),
]
SCHEDULES = {
    # 128 query rows a CTA (two consumer warpgroups) at every head dim, each schedule
    "plain": {"FLASHSCAN_SM90_PINGPONG": "0", "FLASHSCAN_SM90_BLOCK_M": "128"},
    "pipe": {"FLASHSCAN_SM90_PIPE": "1", "FLASHSCAN_SM90_BLOCK_M": "128"},
    "plain-persist-3": {
        "FLASHSCAN_SM90_PINGPONG": "0",
        "FLASHSCAN_SM90_BLOCK_M": "128",
        "FLASHSCAN_SM90_PERSIST_CTAS": "3",
    },
    "pipe-persist-5": {
        "FLASHSCAN_SM90_PIPE": "1",
        "FLASHSCAN_SM90_BLOCK_M": "128",
        "FLASHSCAN_SM90_PERSIST_CTAS": "5",
    },
    "pingpong": {"FLASHSCAN_SM90_PINGPONG": "1", "FLASHSCAN_SM90_BLOCK_M": "128"},
    # the defaults: head dim 64 on three consumer warpgroups (192 query rows, the plain
    # schedule), head dim 128 ping-pong; unmasked problems on the persistent kernel
    "default": {},
    # the persistent kernel on 3 CTAs (every case walks many tiles a CTA; masked ones on the
    # tile queue), and off
    "persist-3": {"FLASHSCAN_SM90_PERSIST_CTAS": "3", "FLASHSCAN_SM90_QUEUE_SECTION": "5"},
    "one-tile": {"FLASHSCAN_SM90_PERSIST": "0"},
    # the tile queue for unmasked problems too, on the full grid and on 2 CTAs; masked
    # problems back on one CTA a tile
    "queue": {"FLASHSCAN_SM90_PERSIST": "queue"},
    "queue-2": {
        "FLASHSCAN_SM90_PERSIST": "queue",
        "FLASHSCAN_SM90_PERSIST_CTAS": "2",
        "FLASHSCAN_SM90_QUEUE_SECTION": "3",
    },
    "plain-queue-4": {
        "FLASHSCAN_SM90_PINGPONG": "0",
        "FLASHSCAN_SM90_BLOCK_M": "128",
        "FLASHSCAN_SM90_PERSIST": "queue",
        "FLASHSCAN_SM90_PERSIST_CTAS": "4",
    },
    "stride": {"FLASHSCAN_SM90_PERSIST": "stride"},
    # the queue's counters from scratch zeroed per call (the capture path) instead of the
    # stream's pair
    "queue-scratch-3": {
        "FLASHSCAN_SM90_QUEUE_SCRATCH": "1",
        "FLASHSCAN_SM90_PERSIST_CTAS": "3",
        "FLASHSCAN_SM90_QUEUE_SECTION": "2",
    },
}


def run_cases() -> int:
    """The child: every case in fp16 and bf16; prints one line per case, returns failures."""
    import torch

    sys.path.insert(0, str(HERE))
    from conftest import check_rule
    from test_attention_gpu import attention_torch

    import flashscan

    failures = 0
    for dtype in (torch.bfloat16, torch.float16):
        for b, sq, sk, h, hk, d, causal, window, bhsd, cap in [
            (*c, 0.0) for c in CASES
        ] + SOFTCAP_CASES:
            torch.manual_seed(sq * 31 + sk * 7 + d + h)

            shapes = [(sq, h), (sk, hk), (sk, hk)]
            if bhsd:  # (b, h, s, d) storage seen as (b, s, h, d)
                q, k, v = (
                    torch.randn(b, n, s, d, device="cuda", dtype=dtype).transpose(1, 2)
                    for s, n in shapes
                )
            else:
                q, k, v = (torch.randn(b, s, n, d, device="cuda", dtype=dtype) for s, n in shapes)
            out = torch.full((b, sq, h, d), float("nan"), device="cuda", dtype=dtype)
            o, lse = flashscan.flash_attn_func(
                q, k, v, causal=causal, window_size=window, softcap=cap, return_lse=True, out=out
            )
            torch.cuda.synchronize()
            kw = {"causal": causal, "window": window, "softcap": cap}
            ref, ref_lse = attention_torch(q, k, v, **kw)
            base, base_lse = attention_torch(q, k, v, **kw, upcast=False)
            name = (
                f"{str(dtype)[6:]} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} causal={causal} win={window}"
                f" cap={cap}"
            )
            try:
                r = check_rule(o, ref, base, atol=1e-3, name="out")
                check_rule(lse, ref_lse, ref_lse, atol=1e-3, name="lse")
                print(f"ok   {name}: {r}", flush=True)
            except AssertionError as exc:
                failures += 1
                print(f"FAIL {name}: {exc}", flush=True)
    return failures


def run_varlen_cases() -> int:
    """The child with --varlen: every packed case in fp16 and bf16 (out poisoned, LSE (h, total_q)
    against float64 per sequence); prints one line per case, returns failures."""
    import random

    import torch

    sys.path.insert(0, str(HERE))
    from conftest import check_rule
    from test_varlen_gpu import packed, reference

    import flashscan

    random.seed(2026)
    failures = 0
    for dtype in (torch.bfloat16, torch.float16):
        for lq, lk, h, hk, d, causal, window, cap in VARLEN_CASES:
            q, k, v, cq, ck = packed(lq, lk, h, hk, d, dtype)
            out = torch.full_like(q, float("nan"))
            o, lse = flashscan.flash_attn_varlen_func(
                q, k, v, cq, ck, max(lq), max(lk), None, causal, window, cap, True, out
            )
            torch.cuda.synchronize()
            ref, ref_lse = reference(lq, lk, q, k, v, causal, window, cap, upcast=True)
            base, _ = reference(lq, lk, q, k, v, causal, window, cap, upcast=False)
            name = f"varlen {str(dtype)[6:]} q{lq} k{lk} h{h}/{hk} d{d} causal={causal}"
            name += f" win={window} cap={cap}"
            try:
                r = check_rule(o, ref, base, atol=1e-3, name="out")
                check_rule(lse, ref_lse, ref_lse, atol=1e-3, name="lse")
                print(f"ok   {name}: {r}", flush=True)
            except AssertionError as exc:
                failures += 1
                print(f"FAIL {name}: {exc}", flush=True)
    return failures


@pytest.fixture(scope="module")
def hopper() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TMA forward is sm_90a (H100 / H200) only")


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_tma_forward_matches_float64(schedule: str, hopper: None, tmp_path: Path) -> None:
    env = dict(os.environ, FLASHSCAN_SM90_WGMMA="1", FLASHSCAN_SM90_TMA="1")
    for k in (
        "FLASHSCAN_SM90_PIPE",
        "FLASHSCAN_SM90_PINGPONG",
        "FLASHSCAN_SM90_BLOCK_M",
        "FLASHSCAN_SM90_PERSIST",
        "FLASHSCAN_SM90_PERSIST_CTAS",
        "FLASHSCAN_SM90_QUEUE_SECTION",
        "FLASHSCAN_SM90_QUEUE_SCRATCH",
    ):
        env.pop(k, None)
    env.update(SCHEDULES[schedule], FLASHSCAN_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a deadlocked mbarrier ring or turn barrier hangs the child
    )
    print(done.stdout[-6000:], done.stderr[-3000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    built = [p.name for p in tmp_path.iterdir() if p.name.startswith("flash_fwd_sm90_tma-")]
    assert built, f"the TMA kernel was not built (fallback taken?): {os.listdir(tmp_path)}"


@pytest.mark.gpu
def test_tma_varlen_matches_float64(hopper: None, tmp_path: Path) -> None:
    """Packed sequences run on the TMA kernel (the child's only calls are varlen ones, so the
    kernel built in its cache is theirs) and match float64 per sequence."""
    env = dict(os.environ, FLASHSCAN_SM90_WGMMA="1", FLASHSCAN_SM90_TMA="1")
    for k in [
        k
        for k in env
        if k.startswith("FLASHSCAN_SM90_")
        and k not in ("FLASHSCAN_SM90_WGMMA", "FLASHSCAN_SM90_TMA")
    ]:
        env.pop(k)
    env["FLASHSCAN_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, __file__, "--varlen"], env=env, capture_output=True, text=True, timeout=600
    )
    print(done.stdout[-6000:], done.stderr[-3000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    built = [p.name for p in tmp_path.iterdir() if p.name.startswith("flash_fwd_sm90_tma-")]
    assert built, f"the TMA kernel was not built for varlen: {os.listdir(tmp_path)}"


def _check_causal(q: Any, k: Any, v: Any, out: Any) -> None:
    sys.path.insert(0, str(HERE))
    from conftest import check_rule
    from test_attention_gpu import attention_torch

    ref, _ = attention_torch(q, k, v, causal=True)
    base, _ = attention_torch(q, k, v, causal=True, upcast=False)
    check_rule(out, ref, base, atol=1e-3, name="out")


@pytest.mark.gpu
def test_tile_queue_counters_on_concurrent_streams_and_in_a_graph(hopper: None) -> None:
    """Causal problems take their tiles from a queue whose counters each stream shares between
    its launches (the last CTA zeroes them), or, under capture, from scratch zeroed in the graph:
    calls on two streams at once, many calls in a row, graph replays and a plain call on the
    capturing stream afterwards all compute every tile exactly once."""
    import torch

    import flashscan

    for key in ("FLASHSCAN_SM90_PERSIST", "FLASHSCAN_SM90_QUEUE_SCRATCH"):
        os.environ.pop(key, None)
    # 9 query blocks x 64 (batch, head) pairs: more tiles than SMs, the queue's path
    shape = (4, 1100, 16, 128)
    mk = lambda: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    inputs = [[(mk(), mk(), mk()) for _ in range(4)] for _ in streams]
    outs = [
        [torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        for _ in streams
    ]
    torch.cuda.synchronize()
    for i in range(4):  # interleaved launches on both streams, overlapping on the GPU
        for s, st in enumerate(streams):
            with torch.cuda.stream(st):
                q, k, v = inputs[s][i]
                flashscan.flash_attn_func(q, k, v, causal=True, out=outs[s][i])
    torch.cuda.synchronize()
    for s in range(2):
        for i in range(4):
            _check_causal(*inputs[s][i], outs[s][i])

    q, k, v = mk(), mk(), mk()
    out = torch.empty_like(q)
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        flashscan.flash_attn_func(q, k, v, causal=True, out=out)
    torch.cuda.current_stream().wait_stream(st)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flashscan.flash_attn_func(q, k, v, causal=True, out=out)
    for _ in range(3):
        q.copy_(mk())
        k.copy_(mk())
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check_causal(q, k, v, out)
    # the graph used scratch of its own: the current stream's pair is still zero
    out2 = torch.full_like(q, float("nan"))
    flashscan.flash_attn_func(q, k, v, causal=True, out=out2)
    torch.cuda.synchronize()
    _check_causal(q, k, v, out2)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("profile", ["rising", "falling", "spike"])
def test_exponent_base_moves_only_when_scores_rise_far(d: int, profile: str, hopper: None) -> None:
    """A row's exponent base moves only when a tile holds a score more than 2^8 above it (the
    conditional rescale): keys scaled along the sequence so that the scores rise or fall by far
    more than that across the tiles (the kernel walks them last to first), or one late key far
    above the rest, so that tiles with and without a rescale and P up to 2^8 all occur; the
    output and LSE still follow the float64 reference."""
    import torch

    sys.path.insert(0, str(HERE))
    from conftest import check_rule
    from test_attention_gpu import attention_torch

    import flashscan

    for key in ("FLASHSCAN_SM90_PERSIST", "FLASHSCAN_SM90_QUEUE_SCRATCH"):
        os.environ.pop(key, None)
    torch.manual_seed(d + len(profile))
    b, s, h = 2, 1000, 4
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            q = torch.randn(b, s, h, d, device="cuda")
            k = torch.randn(b, s, h, d, device="cuda")
            v = torch.randn(b, s, h, d, device="cuda")
            ramp = torch.linspace(0.25, 4.0, s, device="cuda")
            if profile == "rising":
                k *= ramp[None, :, None, None]
            elif profile == "falling":
                k *= ramp.flip(0)[None, :, None, None]
            else:  # one key per (batch, head) row far above every other score, in an early tile
                k[:, 37] = q[:, 900] * 3.0
            q, k, v = (x.to(dtype) for x in (q, k, v))
            out = torch.full_like(q, float("nan"))
            o, lse = flashscan.flash_attn_func(q, k, v, causal=causal, return_lse=True, out=out)
            torch.cuda.synchronize()
            ref, ref_lse = attention_torch(q, k, v, causal=causal)
            base, _ = attention_torch(q, k, v, causal=causal, upcast=False)
            name = f"{profile} d{d} {str(dtype)[6:]} causal={causal}"
            check_rule(o, ref, base, atol=1e-3, name=f"out {name}")
            check_rule(lse, ref_lse, ref_lse, atol=1e-3, name=f"lse {name}")


if __name__ == "__main__":
    sys.exit(1 if (run_varlen_cases() if "--varlen" in sys.argv else run_cases()) else 0)
