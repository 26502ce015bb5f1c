"""Small FP8 attention cases (e4m3 q / k / v, descales) against float64, for the sanitizers:
`compute-sanitizer --tool memcheck python tools/fp8_small.py`. Prints one line a case and
ALL OK when every case passes the correctness rule of tests/test_fp8_gpu.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
from conftest import check_rule  # noqa: E402
from test_fp8_gpu import attention_ref, dequant, make  # noqa: E402

import flashscan  # noqa: E402

# (head dim 64 below: on the FP8 kernel, not the 16-bit path it takes by default)
os.environ["FLASHSCAN_FP8_SMALL_HEAD_DIMS"] = "1"

CASES = [
    (1, 130, 200, 2, 1, 128, True, (-1, -1), False, "per-head"),
    (3, 300, 200, 4, 2, 128, False, (-1, -1), False, "per-head"),
    (2, 1, 129, 2, 2, 64, False, (-1, -1), False, "scalar"),
    (1, 300, 300, 2, 2, 96, False, (40, 8), True, "none"),
]


def main() -> int:
    bad = 0
    for case in CASES:
        b, sq, sk, h, hk, d, causal, window, _, _ = case
        q8, k8, v8, qd, kd, vd = make(case, seed=sq + sk)
        out = torch.full((b, sq, h, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        o, lse = flashscan.flash_attn_func(
            q8,
            k8,
            v8,
            causal=causal,
            window_size=window,
            return_lse=True,
            out=out,
            q_descale=qd,
            k_descale=kd,
            v_descale=vd,
        )
        torch.cuda.synchronize()
        qf, kf, vf = dequant(q8, qd, hk), dequant(k8, kd, hk), dequant(v8, vd, hk)
        ref, ref_lse = attention_ref(qf, kf, vf, causal, window, fp8=False)
        base, base_lse = attention_ref(qf, kf, vf, causal, window, fp8=True)
        try:
            r = check_rule(o, ref, base, atol=1e-3, name="out")
            check_rule(lse, ref_lse, base_lse, atol=1e-3, name="lse")
            print(f"ok   {case}: {r}", flush=True)
        except AssertionError as exc:
            bad += 1
            print(f"FAIL {case}: {exc}", flush=True)
    print("ALL OK" if bad == 0 else f"{bad} FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
