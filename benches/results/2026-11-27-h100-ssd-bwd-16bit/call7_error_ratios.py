"""Call 7: every gradient's error over the rule's limit, over fresh draws, with the 16-bit SSD
backward kernels and with the fp32 kernels on the same draws (no z, seqlen 1000).

Run from the repository root on a GPU machine: python3 THIS_FILE DRAWS. Prints, per case and
path, `gradient:max/median` of err / limit (limit = 2 * baseline error + 1e-6 + rtol * max|ref|,
tests/conftest.py's rule with test_ssd_gpu's GRAD_RTOL)."""

import os
import sys

sys.path.insert(0, "tests")

import numpy as np
import test_ssd_gpu as T
from conftest import max_err, to_f64

CASES = [
    ("float16", 2, 64, 128, 1000, 128),
    ("float16", 1, 128, 64, 1000, 256),
    ("bfloat16", 1, 128, 64, 1000, 256),
]


def ratios(a: dict, chunk: int, dout, dfinal, ref: dict, base: dict) -> dict:
    got = T.grads_of(T.ours(a, chunk), a, dout, dfinal)
    out = {}
    for k in ref:
        g, r, b = to_f64(got[k]), to_f64(ref[k]), to_f64(base[k])
        rtol = T.GRAD_RTOL[a["x"].dtype]
        lim = 2 * max_err(b, r) + 1e-6 + rtol * float(np.abs(r).max())
        out[k] = max_err(g, r) / lim
    return out


def main(draws: int) -> None:
    for dt_name, g, n, p, L, chunk in CASES:
        worst: dict = {"16": {}, "32": {}}
        for _ in range(draws):
            a = T.ssd_inputs(2, L, 4, p, g, n, T.DTYPES[dt_name], D2=True)
            del a["z"]
            dout, dfinal = T.upstream(a)
            ref = T.ref_grads(a, chunk, dout, dfinal)
            base = T.grads_of(lambda lv, q=chunk: T.baseline_lowp(lv, q, True), a, dout, dfinal)
            for mode in ("16", "32"):
                os.environ["FLASHSCAN_SSD_DX16"] = "1" if mode == "16" else "0"
                for k, v in ratios(a, chunk, dout, dfinal, ref, base).items():
                    worst[mode].setdefault(k, []).append(v)
        for mode in ("16", "32"):
            cols = " ".join(f"{k}:{max(v):.2f}/{np.median(v):.2f}" for k, v in worst[mode].items())
            print(dt_name, g, n, p, L, chunk, "path", mode, cols)


if __name__ == "__main__":
    main(int(sys.argv[1]))
