"""dA / ddt_bias / dD error ratios (err / limit of the rule) over fresh draws, 16-bit kernels vs fp32 kernels."""
import os, sys
sys.path.insert(0, "tests")
import numpy as np
import torch
import test_ssd_gpu as T
from conftest import max_err, to_f64

def ratios(a, chunk, dout, dfinal, ref, base):
    got = T.grads_of(T.ours(a, chunk), a, dout, dfinal)
    out = {}
    for k in ref:
        g, r, b = to_f64(got[k]), to_f64(ref[k]), to_f64(base[k])
        lim = 2 * max_err(b, r) + 1e-6 + T.GRAD_RTOL[a["x"].dtype] * float(np.abs(r).max())
        out[k] = max_err(g, r) / lim
    return out

cases = [("float16", 2, 64, 128, 1000, 128), ("float16", 1, 128, 64, 1000, 256), ("bfloat16", 1, 128, 64, 1000, 256)]
for dt_name, g, n, p, L, chunk in cases:
    worst = {"16": {}, "32": {}}
    for draw in range(int(sys.argv[1])):
        a = T.ssd_inputs(2, L, 4, p, g, n, T.DTYPES[dt_name], D2=True)
        del a["z"]
        dout, dfinal = T.upstream(a)
        ref = T.ref_grads(a, chunk, dout, dfinal)
        base = T.grads_of(lambda lv: T.baseline_lowp(lv, chunk, True), a, dout, dfinal)
        for mode in ("16", "32"):
            os.environ["FLASHSCAN_SSD_DX16"] = "1" if mode == "16" else "0"
            for k, v in ratios(a, chunk, dout, dfinal, ref, base).items():
                worst[mode].setdefault(k, []).append(v)
    for mode in ("16", "32"):
        print(dt_name, g, n, p, L, chunk, "path", mode, " ".join(f"{k}:{max(v):.2f}/{np.median(v):.2f}" for k, v in worst[mode].items()))
