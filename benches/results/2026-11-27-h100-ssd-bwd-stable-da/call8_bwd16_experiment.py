"""Call 8's experiment (run from the repository root on the GPU machine): the SSD backward's
16-bit kernel variants, which flashscan.torch does not run today (16-bit calls go through fp32
copies), against the correctness rule now that the second path's da has no cancellation, and
their time at the bench's b8 L2048 shape. flashscan.torch's `_ssd_bwd_impl` is re-created with the
copies switched off and swapped in for the run; nothing of it is part of the package."""

from __future__ import annotations

import inspect
import sys
import textwrap
from typing import Any

import torch

sys.path[:0] = ["tests", "tools"]
import ssd_profile as prof  # noqa: E402
import test_ssd_gpu as T  # noqa: E402
from conftest import check_rule  # noqa: E402

import flashscan.torch as fst  # noqa: E402

SWITCH = "tf32 = x.dtype in (torch.float16, torch.bfloat16)"
NS = fst.__dict__
ORIG = fst._ssd_bwd_impl
_src = textwrap.dedent(inspect.getsource(ORIG))
assert SWITCH in _src
exec(_src.replace(SWITCH, "tf32 = False"), NS)  # the same function without the fp32 copies
P16 = NS["_ssd_bwd_impl"]


def use(fn: Any) -> None:
    NS["_ssd_bwd_impl"] = fn


def main() -> None:
    cases = [c for c in T.BWD_CASES if c[0] != "float32"]
    cases.append(("bfloat16-noz", 1, 128, 64, 549, 256, False))
    for case in cases:
        dt_name, g, n, p, L, chunk, D2 = case
        dtype = T.DTYPES[dt_name.replace("-noz", "")]
        a = T.ssd_inputs(2, L, 4, p, g, n, dtype, D2=D2)
        if dt_name.endswith("-noz"):
            del a["z"]
        dout, dfinal = T.upstream(a)
        ref = T.ref_grads(a, chunk, dout, dfinal)
        base = T.grads_of(lambda lv, c=chunk: T.baseline_lowp(lv, c, True), a, dout, dfinal)
        res: dict[str, dict[str, float]] = {}
        for name, fn in (("fp32copies", ORIG), ("16bit", P16)):
            use(fn)
            got = T.grads_of(T.ours(a, chunk), a, dout, dfinal)
            bad = []
            for k in ref:
                try:
                    r = check_rule(
                        got[k], ref[k], base[k], atol=1e-6, rtol=T.GRAD_RTOL[dtype], name="d" + k
                    )
                    res.setdefault(k, {})[name] = r.err / max(r.limit, 1e-30)
                except AssertionError as e:
                    bad.append(str(e)[:160])
                    res.setdefault(k, {})[name] = float("inf")
            print(f"{case} {name}: {'PASS' if not bad else 'FAIL'} {bad}", flush=True)
        ratios = {k: {m: round(v, 3) for m, v in d.items()} for k, d in res.items()}
        print("   err/limit:", ratios, flush=True)
    a = prof.ssd_inputs(torch, prof.SHAPES["2k"], torch.bfloat16)
    for name, fn in (("fp32copies", ORIG), ("16bit", P16)):
        use(fn)
        step = prof.training_step(torch, fst.mamba_chunk_scan_combined, a, 256)
        prof.profile(torch, f"2k fwd+bwd bf16, backward {name}", step, 2)
    use(ORIG)


if __name__ == "__main__":
    main()
