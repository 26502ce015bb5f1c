# ruff: noqa: B023, E501, E731, E702, E401, I001  (a profiling script: lambdas bound per loop iteration on purpose)
"""Where the host time of one SSD training step goes at the real-time shape (b32 L60, 8 heads x
64, state 64, bf16, chunk 256; x / dt / B / C bf16, A / D / dt_bias fp32, dt_softplus, as
benches/ssd.py): flashscan.torch.mamba_chunk_scan_combined + torch.autograd.grad of the seven
inputs. Prints the step's wall per call (synchronised loop), the host time of its parts without
a sync (forward alone, autograd.grad alone, the backward implementation alone, the native
backward call alone on prepared descriptors), and cProfile's top entries by own time. Needs a GPU.

    python tools/ssd_step_profile.py [--batch 32] [--steps 300]
"""

import argparse, cProfile, io, pstats, statistics, time, torch
import flashscan.torch as fst
from flashscan import _native
from flashscan.bench.timing import best_wall_us

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--steps", type=int, default=300)
args = ap.parse_args()
b, L, h, p, n = args.batch, 60, 8, 64, 64
dev, bf = "cuda", torch.bfloat16
a = {
    "x": torch.randn(b, L, h, p, device=dev, dtype=bf),
    "dt": (torch.rand(b, L, h, device=dev) * 2 - 4).to(bf),
    "A": -torch.exp(torch.rand(h, device=dev) * 2),
    "B": (torch.randn(b, L, 1, n, device=dev) * n**-0.25).to(bf),
    "C": (torch.randn(b, L, 1, n, device=dev) * n**-0.25).to(bf),
    "D": torch.randn(h, device=dev),
    "dt_bias": torch.rand(h, device=dev) * 0.5,
}
lv = {k: v.clone().requires_grad_() for k, v in a.items()}
leaves = list(lv.values())
dout = torch.randn_like(a["x"])
kw = dict(chunk_size=256, dt_softplus=True)


def fwd():
    return fst.mamba_chunk_scan_combined(**lv, **kw)


def step():
    return torch.autograd.grad(fwd(), leaves, dout)


def host_us(fn, n=args.steps):
    """Median host time of fn without a sync (the GPU runs behind)."""
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


print(f"# SSD training step host profile, b{b} L{L} {h} x {p}, state {n}, bf16")
wall = best_wall_us(step, torch.cuda.synchronize, calls=args.steps, warmup=30, repeat=1)
print(f"step wall per call (synchronised loop): {wall:.1f} us")
print(f"step host per call (no sync): {host_us(step):.1f} us")
print(f"forward alone, grad enabled: {host_us(fwd):.1f} us")
with torch.no_grad():
    print(f"forward alone, no grad: {host_us(fwd):.1f} us")

# autograd.grad alone: one retained graph, the backward run again and again
out = fwd()
print(
    f"autograd.grad alone: {host_us(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)):.1f} us"
)

# the backward implementation alone (what _MambaChunkScan.backward calls)
det = {k: v.detach() for k, v in a.items()}
impl = lambda: fst._ssd_bwd_impl(
    dout,
    None,
    det["x"],
    det["dt"],
    det["A"],
    det["B"],
    det["C"],
    256,
    det["D"],
    None,
    det["dt_bias"],
    None,
    None,
    True,
    0.0,
    float("inf"),
)
print(f"_ssd_bwd_impl alone: {host_us(impl):.1f} us")

# the native call alone on descriptors made once
names = fst._SSD_NAMES
kin = (det["x"], det["dt"], det["A"], det["B"], det["C"], det["D"], None, det["dt_bias"], None)
grads = tuple(None if t is None else t.new_empty(t.shape) for t in kin)
descs = (
    *(fst._desc(t, nm) for t, nm in zip(kin, names)),
    None,
    fst._desc(dout, "dout"),
    None,
    *(fst._desc(g, "d" + nm) for g, nm in zip(grads, names)),
)
stream = fst._stream(det["x"])
native = lambda: _native.ssd_bwd(*descs, 256, True, 0.0, float("inf"), stream, False)
print(f"_native.ssd_bwd alone (descriptors prepared): {host_us(native):.1f} us")
print(
    f"descriptors of the 20 tensors: {host_us(lambda: [fst._desc(t, 'x') for t in (*kin[:6], dout, *grads[:6])]) / 13 * 20:.1f} us"
)
print(
    f"9 gradient allocations: {host_us(lambda: tuple(None if t is None else t.new_empty(t.shape) for t in kin)):.1f} us"
)

pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    step()
torch.cuda.synchronize()
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print("\n## cProfile, 200 steps, by own time")
print(s.getvalue())
