#!/usr/bin/env python3
"""Dev harness for cuda/flash_bwd.cu (no Rust): NVRTC compile + CUDA driver launch through ctypes.

Modes
  resources [--arch 80,90]   compile every table variant locally (no GPU) and print regs/spills/smem
  check [--quick]            correctness sweep vs float64 torch autograd (device)
  bench                      bwd-only and fwd+bwd TFLOP/s vs torch SDPA FLASH_ATTENTION (device)
  sanitize                   a few small cases (run under compute-sanitizer)
  all                        check + bench

The launch path mirrors src/ops/attention_bwd.rs: the same #define prelude (same order), one
by-value FlashBwdParams, one scratch buffer (dq_accum | dpsum | lse_log2, 256-byte aligned parts),
three launches: preprocess (ceil(sq_pad/32), h, b) x 256, main (n_kv_blocks or nsplit,
hk * DSPLIT, b) x NWARPS*32, convert (ceil(sq/32), h, b) x 256. The forward (O, LSE) comes from
tools/dev_flash_fwd.py (our forward kernel).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dev_flash_fwd as ff  # noqa: E402

REPO = ff.REPO
# FS_BWD_SRC: another kernel source (A/B timing of an edit against a saved copy)
KERNEL_PATH = os.environ.get("FS_BWD_SRC") or os.path.join(REPO, "cuda", "flash_bwd.cu")
CACHE_DIR = os.environ.get("FS_DEV_CACHE_BWD", os.path.join(REPO, ".dev", "flash_bwd", "cache"))
DT_F16, DT_BF16, DT_F32 = 0, 1, 2
HEAD_DIM_TILES = (32, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class BTile:
    block_m: int
    block_n: int
    nwarps: int
    stages: int
    dsplit: int
    min_blocks: int = 1

    @property
    def name(self):
        return f"{self.block_m}x{self.block_n}w{self.nwarps}s{self.stages}d{self.dsplit}b{self.min_blocks}"

    def smem(self, hd: int, dtype: int) -> int:
        es = 4 if dtype == DT_F32 else 2
        row = hd * es + 16
        srow = self.block_m * es + 16
        return (
            (2 * self.block_n + 2 * self.stages * self.block_m) * row
            + self.block_n * srow
            + self.stages * 2 * self.block_m * 4
        )


def T(bm, bn, st, ds=1, mb=1, w=None):
    """A tile; each warp owns 16 keys unless `w` (warps) says otherwise (block_n / w = 16 or 32)."""
    return BTile(bm, bn, w or bn // 16, st, ds, mb)


def pick_tile(arch: int, dtype: int, hdt: int) -> BTile:
    """Mirror of flash_bwd_tile in src/ops/attention_bwd.rs."""
    idx = {32: 0, 64: 1, 96: 2, 128: 3, 192: 4, 256: 5}[hdt]
    cls = "hopper" if arch in (90, 100, 101, 103) else ("a100" if arch in (80, 87) else "consumer")
    if dtype == DT_F32:
        if cls == "consumer":
            return [
                T(32, 64, 1),
                T(32, 64, 1),
                T(32, 32, 1, 2),
                T(32, 32, 1, 2),
                T(16, 16, 1, 4),
                T(16, 16, 1, 4),
            ][idx]
        if cls == "a100" and idx == 5:
            return T(32, 32, 1, 4)
        return [
            T(64, 64, 2),
            T(64, 64, 2),
            T(64, 64, 1, 2),
            T(64, 64, 1, 2),
            T(32, 64, 1, 4),
            T(32, 64, 1, 4),
        ][idx]
    if cls == "hopper":
        return [
            T(64, 128, 2),
            T(32, 128, 1, 1, 2, w=4),
            T(64, 128, 2),
            T(64, 128, 2),
            T(64, 128, 1, 2),
            T(64, 128, 1, 2),
        ][idx]
    if cls == "a100":
        return [
            T(64, 128, 2),
            T(64, 128, 2),
            T(64, 128, 2),
            T(64, 128, 2),
            T(64, 64, 1, 2),
            T(64, 64, 1, 2),
        ][idx]
    return [
        T(64, 128, 2),
        T(64, 128, 2),
        T(64, 64, 1),
        T(64, 64, 1),
        T(32, 32, 1, 2),
        T(32, 32, 1, 2),
    ][idx]


def head_dim_tile(d: int) -> int:
    for t in HEAD_DIM_TILES:
        if d <= t:
            return t
    raise ValueError(d)


@dataclass(frozen=True)
class BVariant:
    head_dim: int
    dtype: int
    tile: BTile | None  # None = the aux build (preprocess / convert)
    has_mask: int
    has_softcap: int
    pad: int
    arch: int

    def prelude(self) -> str:
        if self.tile is None:
            d = [
                ("FS_HEAD_DIM", self.head_dim),
                ("FS_DTYPE", self.dtype),
                ("FS_AUX_ONLY", 1),
                ("FS_ARCH", self.arch),
            ]
        else:
            t = self.tile
            d = [
                ("FS_HEAD_DIM", self.head_dim),
                ("FS_DTYPE", self.dtype),
                ("FS_BLOCK_M", t.block_m),
                ("FS_BLOCK_N", t.block_n),
                ("FS_NWARPS", t.nwarps),
                ("FS_STAGES", t.stages),
                ("FS_DSPLIT", t.dsplit),
                ("FS_MIN_BLOCKS", t.min_blocks),
                ("FS_HAS_MASK", self.has_mask),
                ("FS_HAS_SOFTCAP", self.has_softcap),
                ("FS_PAD_HEADDIM", self.pad),
                ("FS_ARCH", self.arch),
            ]
        return "".join(f"#define {k} {v}\n" for k, v in d) + '#line 1 "flash_bwd.cu"\n'

    @property
    def name(self):
        if self.tile is None:
            return f"aux hd{self.head_dim} dt{self.dtype} sm{self.arch}"
        return f"sm{self.arch} hd{self.head_dim} dt{self.dtype} {self.tile.name} m{self.has_mask} c{self.has_softcap} p{self.pad}"


def source() -> str:
    with open(KERNEL_PATH) as f:
        return f.read()


def get_cubin(v: BVariant, force=False):
    os.makedirs(CACHE_DIR, exist_ok=True)
    key = hashlib.sha256((v.prelude() + source() + f"|{v.arch}").encode()).hexdigest()[:24]
    path = os.path.join(CACHE_DIR, key + ".cubin")
    logp = path + ".log"
    if not force and os.path.exists(path):
        return open(path, "rb").read(), (open(logp).read() if os.path.exists(logp) else "")
    data, log = ff.nvrtc().compile(v.prelude() + source(), v.arch)
    fd, tmp = tempfile.mkstemp(dir=CACHE_DIR)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    open(logp, "w").write(log)
    return data, log


def compile_many(vs):
    from concurrent.futures import ThreadPoolExecutor

    vs = list(dict.fromkeys(vs))
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        list(ex.map(get_cubin, vs))
    print(f"[compile] {len(vs)} variants ready in {time.time() - t0:.1f} s", flush=True)


# ----------------------------------------------------------------------------------------------
class FlashBwdParams(ctypes.Structure):
    _fields_ = (
        [
            (n, ctypes.c_void_p)
            for n in (
                "q",
                "k",
                "v",
                "o",
                "dout",
                "lse",
                "dq",
                "dk",
                "dv",
                "dq_accum",
                "dpsum",
                "lse_log2",
            )
        ]
        + [
            (f"{t}_{s}_stride", ctypes.c_longlong)
            for t in ("q", "k", "v", "o", "do", "dq", "dk", "dv")
            for s in ("batch", "row", "head")
        ]
        + [
            (n, ctypes.c_int)
            for n in (
                "batch",
                "nheads",
                "nheads_k",
                "seqlen_q",
                "seqlen_k",
                "head_dim",
                "seqlen_q_pad",
                "nsplit",
                "deterministic",
            )
        ]
        + [
            ("softmax_scale", ctypes.c_float),
            ("softcap", ctypes.c_float),
            ("window_left", ctypes.c_int),
            ("window_right", ctypes.c_int),
        ]
    )


assert ctypes.sizeof(FlashBwdParams) == 12 * 8 + 24 * 8 + 9 * 4 + 4 * 4 + 4, ctypes.sizeof(
    FlashBwdParams
)

_FUNCS: dict = {}


def function(v: BVariant, entry: str):
    key = (v, entry)
    if key in _FUNCS:
        return _FUNCS[key]
    d = ff.drv()
    cubin, log = get_cubin(v)
    mod = ctypes.c_void_p()
    rc = d.lib.cuModuleLoadData(ctypes.byref(mod), cubin)
    if rc != 0:
        cubin, log = get_cubin(v, force=True)
        d.check(d.lib.cuModuleLoadData(ctypes.byref(mod), cubin), "cuModuleLoadData")
    fn = ctypes.c_void_p()
    d.check(d.lib.cuModuleGetFunction(ctypes.byref(fn), mod, entry.encode()), "cuModuleGetFunction")
    if v.tile is not None:
        d.check(
            d.lib.cuFuncSetAttribute(fn, 8, v.tile.smem(v.head_dim, v.dtype)), "cuFuncSetAttribute"
        )
    _FUNCS[key] = fn.value
    return fn.value


def launch(fn, grid, block, smem, params):
    import torch

    d = ff.drv()
    pptr = ctypes.cast(ctypes.pointer(params), ctypes.c_void_p)
    args = (ctypes.c_void_p * 1)(pptr)
    d.check(
        d.lib.cuLaunchKernel(
            fn,
            grid[0],
            grid[1],
            grid[2],
            block,
            1,
            1,
            smem,
            torch.cuda.current_stream().cuda_stream,
            args,
            None,
        ),
        "cuLaunchKernel",
    )


SM_COUNT = None


def flash_bwd(
    dout,
    q,
    k,
    v,
    out,
    lse,
    scale,
    wl,
    wr,
    softcap,
    deterministic=False,
    tile=None,
    dq=None,
    dk=None,
    dv=None,
):
    """What attention_bwd::backward does (window args as the forward takes them)."""
    import torch

    global SM_COUNT
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    left = -1 if wl >= sk - 1 else wl
    right = -1 if wr >= sq - 1 else wr
    arch = ff.device_arch()
    dt = ff.torch_dtype_code(q.dtype)
    hdt = head_dim_tile(d)
    tile = tile or pick_tile(arch, dt, hdt)
    var = BVariant(
        hdt, dt, tile, int(left >= 0 or right >= 0), int(softcap > 0), int(d < hdt), arch
    )
    aux = BVariant(hdt, dt, None, 0, 0, 0, arch)
    dq = dq if dq is not None else torch.empty_like(q)
    dk = dk if dk is not None else torch.empty_like(k)
    dv = dv if dv is not None else torch.empty_like(v)
    sq_pad = (sq + tile.block_m - 1) // tile.block_m * tile.block_m
    n_tiles = (sk + tile.block_n - 1) // tile.block_n
    if SM_COUNT is None:
        SM_COUNT = torch.cuda.get_device_properties(0).multi_processor_count
    nsplit = 1
    if deterministic:
        nsplit = max(1, min(n_tiles, -(-SM_COUNT // (b * hk * tile.dsplit))))
    acc_bytes = nsplit * b * h * sq_pad * hdt * 4
    row_bytes = b * h * sq_pad * 4
    r256 = lambda x: (x + 255) // 256 * 256  # noqa: E731
    total = r256(acc_bytes) + 2 * r256(row_bytes)
    scratch = torch.empty(total // 4, dtype=torch.float32, device=q.device)
    base = scratch.data_ptr()
    p = FlashBwdParams()
    p.q, p.k, p.v, p.o, p.dout, p.lse = (
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        dout.data_ptr(),
        lse.data_ptr(),
    )
    p.dq, p.dk, p.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    p.dq_accum, p.dpsum, p.lse_log2 = (
        base,
        base + r256(acc_bytes),
        base + r256(acc_bytes) + r256(row_bytes),
    )
    for name, t in (
        ("q", q),
        ("k", k),
        ("v", v),
        ("o", out),
        ("do", dout),
        ("dq", dq),
        ("dk", dk),
        ("dv", dv),
    ):
        setattr(p, f"{name}_batch_stride", t.stride(0))
        setattr(p, f"{name}_row_stride", t.stride(1))
        setattr(p, f"{name}_head_stride", t.stride(2))
    p.batch, p.nheads, p.nheads_k, p.seqlen_q, p.seqlen_k, p.head_dim = b, h, hk, sq, sk, d
    p.seqlen_q_pad, p.nsplit, p.deterministic = sq_pad, nsplit, int(deterministic)
    p.softmax_scale, p.softcap, p.window_left, p.window_right = scale, softcap, left, right
    launch(function(aux, "flash_bwd_preprocess"), ((sq_pad + 31) // 32, h, b), 256, 0, p)
    gx = nsplit if deterministic else n_tiles
    launch(
        function(var, "flash_bwd_kernel"),
        (gx, hk * tile.dsplit, b),
        tile.nwarps * 32,
        tile.smem(hdt, dt),
        p,
    )
    launch(function(aux, "flash_bwd_dq_convert"), ((sq + 31) // 32, h, b), 256, 0, p)
    return dq, dk, dv, scratch  # scratch returned so the caller keeps it alive until the stream ran


# ----------------------------------------------------------------------------------------------
def ref_grads(q, k, v, dout, scale, wl, wr, softcap, cdt):
    import torch

    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qq = q.detach().to(cdt).requires_grad_()
    kk = k.detach().to(cdt).requires_grad_()
    vv = v.detach().to(cdt).requires_grad_()
    qt = qq.transpose(1, 2)
    kt = kk.transpose(1, 2).repeat_interleave(h // hk, dim=1)
    vt = vv.transpose(1, 2).repeat_interleave(h // hk, dim=1)
    s = torch.matmul(qt, kt.transpose(-1, -2)) * scale
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    vis = ff.visible_mask(sq, sk, wl, wr, q.device)
    s = s.masked_fill(~vis, float("-inf"))
    pr = torch.softmax(s, dim=-1)
    pr = pr.masked_fill(~vis.any(-1, keepdim=True), 0.0)  # rows with no visible key: P = 0, O = 0
    o = torch.matmul(pr, vt).transpose(1, 2)
    o.backward(dout.to(cdt))
    return qq.grad, kk.grad, vv.grad


@dataclass
class Case:
    dtype: str
    b: int
    sq: int
    sk: int
    h: int
    hk: int
    d: int
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    det: bool = False

    def label(self):
        m = (
            "causal"
            if self.causal
            else ("win%d,%d" % self.window if self.window != (-1, -1) else "full")
        )
        return (
            f"{self.dtype} b{self.b} sq{self.sq} sk{self.sk} h{self.h}/{self.hk} d{self.d} {m}"
            f"{' cap%g' % self.softcap if self.softcap else ''}{' det' if self.det else ''}"
        )


def run_case(c: Case, gen) -> dict:
    import torch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[c.dtype]
    q = torch.randn(c.b, c.sq, c.h, c.d, device="cuda", generator=gen).to(dt)
    k = torch.randn(c.b, c.sk, c.hk, c.d, device="cuda", generator=gen).to(dt)
    v = torch.randn(c.b, c.sk, c.hk, c.d, device="cuda", generator=gen).to(dt)
    dout = torch.randn(c.b, c.sq, c.h, c.d, device="cuda", generator=gen).to(dt)
    scale = 1.0 / math.sqrt(c.d)
    wl, wr = c.window
    if c.causal:
        wr = 0
    out, lse = ff.flash_fwd(q, k, v, scale, c.causal, c.window, c.softcap, return_lse=True)
    dq = torch.full_like(q, float("nan"))
    dk = torch.full_like(k, float("nan"))
    dv = torch.full_like(v, float("nan"))
    flash_bwd(dout, q, k, v, out, lse, scale, wl, wr, c.softcap, c.det, dq=dq, dk=dk, dv=dv)
    torch.cuda.synchronize()
    refs = ref_grads(q, k, v, dout, scale, wl, wr, c.softcap, torch.float64)
    bases = (
        ref_grads(q, k, v, dout, scale, wl, wr, c.softcap, dt) if c.dtype != "fp32" else (None,) * 3
    )
    res = {"case": c.label(), "ok": True, "worst_ratio": 0.0}
    parts = []
    gscale = max(r.abs().max().item() for r in refs)  # slack is relative to the largest gradient
    for name, ours, ref, base in zip(("dq", "dk", "dv"), (dq, dk, dv), refs, bases):
        nan = bool(torch.isnan(ours).any().item())
        err = (ours.double() - ref).abs().max().item() if not nan else float("inf")
        rmax = ref.abs().max().item()
        if c.dtype == "fp32":
            tol = 1e-4 * max(rmax, 1e-30) + 1e-6 * gscale
            ratio = err / tol
        else:
            berr = (base.double() - ref).abs().max().item()
            tol = 2 * berr + 1e-5 * gscale + 1e-7
            ratio = err / max(berr, 1e-30)
        ok = (not nan) and err <= tol
        res["ok"] &= ok
        res["worst_ratio"] = max(
            res["worst_ratio"], ratio if c.dtype != "fp32" else err / max(rmax, 1e-30)
        )
        parts.append(f"{name}:{err:.2e}/{tol:.2e}{'' if ok else '!'}")
    res["detail"] = " ".join(parts)
    return res


def build_cases(quick=False):
    import random

    rnd = random.Random(7)
    cases = []
    pairs = [
        (1, 1),
        (7, 7),
        (63, 65),
        (65, 63),
        (128, 128),
        (1000, 1000),
        (7, 1000),
        (1000, 7),
        (128, 1000),
        (1000, 128),
        (4097, 4097),
        (63, 4097),
        (4097, 65),
    ]
    if quick:
        pairs = [(7, 7), (65, 63), (128, 128), (1000, 128), (63, 1000)]
    kinds = [dict(), dict(causal=True), None]
    for sq, sk in pairs:
        for kind in kinds:
            if kind is None:
                kind = dict(
                    window=rnd.choice([(0, 0), (5, 3), (64, -1), (-1, 17), (200, 0), (1, 70)])
                )
            h, hk = rnd.choice([(4, 4), (4, 1), (8, 2)])
            b = 1 if max(sq, sk) > 1000 else rnd.choice([1, 2])
            cases.append(Case("bf16", b, sq, sk, h, hk, 64, **kind))
    sub = (
        [(65, 63), (128, 1000), (1000, 128), (1000, 1000)] if not quick else [(65, 63), (128, 128)]
    )
    for d in (32, 40, 64, 72, 96, 128, 192, 256):
        for dts in ("fp16", "bf16", "fp32"):
            for sq, sk in sub:
                kind = rnd.choice(
                    [
                        dict(),
                        dict(causal=True),
                        dict(window=(30, 10)),
                        dict(softcap=30.0),
                        dict(causal=True, softcap=20.0),
                    ]
                )
                h, hk = rnd.choice([(4, 4), (4, 1), (8, 2)])
                cases.append(Case(dts, rnd.choice([1, 2]), sq, sk, h, hk, d, **kind))
    # deterministic mode and softcap on the main shapes
    for d in (64, 128):
        cases.append(Case("bf16", 2, 1000, 1000, 4, 2, d, causal=True, det=True))
        cases.append(Case("fp16", 1, 4097, 4097, 2, 2, d, softcap=30.0))
        cases.append(Case("bf16", 2, 300, 700, 8, 1, d, window=(100, 50), det=True))
    cases.append(Case("fp32", 1, 1000, 1000, 2, 1, 128, causal=True, det=True))
    # rows with no visible key (forward writes lse -inf): sq > sk causal, narrow windows
    cases.append(Case("bf16", 1, 200, 50, 2, 2, 64, causal=True))
    cases.append(Case("fp16", 1, 200, 50, 2, 1, 128, window=(3, 0)))
    return cases


def check(quick=False) -> bool:
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    cases = build_cases(quick)
    vs, fvs = set(), set()
    arch = ff.device_arch()
    for c in cases:
        dt = {"fp16": DT_F16, "bf16": DT_BF16, "fp32": DT_F32}[c.dtype]
        hdt = head_dim_tile(c.d)
        wl, wr = c.window
        if c.causal:
            wr = 0
        left = -1 if wl >= c.sk - 1 else wl
        right = -1 if wr >= c.sq - 1 else wr
        vs.add(BVariant(hdt, dt, None, 0, 0, 0, arch))
        vs.add(
            BVariant(
                hdt,
                dt,
                pick_tile(arch, dt, hdt),
                int(left >= 0 or right >= 0),
                int(c.softcap > 0),
                int(c.d < hdt),
                arch,
            )
        )
        fmask = int(c.causal or c.window != (-1, -1))
        fvs.add(
            ff.Variant(
                hdt,
                dt,
                ff.pick_tile(arch, dt, hdt, c.sq),
                fmask,
                int(c.softcap > 0),
                int(c.d < hdt),
                arch,
            )
        )
    ff.compile_many(fvs)
    compile_many(vs)
    fails = 0
    worst = {}
    t0 = time.time()
    for c in cases:
        try:
            r = run_case(c, gen)
        except Exception as e:  # noqa: BLE001
            r = {"case": c.label(), "ok": False, "detail": f"EXC {e}", "worst_ratio": float("inf")}
        worst[c.dtype] = max(worst.get(c.dtype, 0.0), r["worst_ratio"])
        if not r["ok"]:
            fails += 1
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']:55s} {r['detail']}", flush=True)
    print(
        f"[check] {len(cases) - fails}/{len(cases)} passed in {time.time() - t0:.0f} s; worst err/base ratio "
        f"(fp32: err/max|ref|): {worst}",
        flush=True,
    )
    return fails == 0


def bench(tiles_by_hd=None):
    import torch
    import torch.nn.functional as F
    import triton.testing as tt
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tiles_by_hd = tiles_by_hd or {}
    rows = []
    arch = ff.device_arch()
    vs = []
    for hd in (64, 128):
        for dt in (DT_BF16, DT_F16):
            for tl in [pick_tile(arch, dt, hd)] + [x for x in tiles_by_hd.get(hd, []) if x]:
                for m in (0, 1):
                    vs.append(BVariant(hd, dt, tl, m, 0, 0, arch))
            vs.append(BVariant(hd, dt, None, 0, 0, 0, arch))
            for m in (0, 1):
                vs_f = ff.Variant(hd, dt, ff.pick_tile(arch, dt, hd, 4096), m, 0, 0, arch)
                ff.compile_many([vs_f])
    compile_many(vs)
    for dname, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for hd in (64, 128):
            h = 2048 // hd
            tiles = tiles_by_hd.get(hd) or [None]
            for sl in (2048, 4096, 8192, 16384):
                b = 16384 // sl
                q = torch.randn(b, sl, h, hd, device="cuda", dtype=dt)
                k, v, dout = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
                scale = hd**-0.5
                for causal in (False, True):
                    fl = 4 * b * h * sl * sl * hd / (2 if causal else 1)
                    out, lse = ff.flash_fwd(q, k, v, scale, causal, (-1, -1), 0.0, return_lse=True)
                    wr = 0 if causal else -1
                    res = {}
                    for tl in tiles:
                        tn = tl.name if tl else "default"
                        bwd = lambda: flash_bwd(
                            dout, q, k, v, out, lse, scale, -1, wr, 0.0, False, tile=tl
                        )  # noqa: E731

                        def fb(tl=tl):
                            o2, l2 = ff.flash_fwd(
                                q, k, v, scale, causal, (-1, -1), 0.0, return_lse=True
                            )
                            flash_bwd(dout, q, k, v, o2, l2, scale, -1, wr, 0.0, False, tile=tl)

                        res[f"ours[{tn}] bwd"] = tt.do_bench(
                            bwd, warmup=10, rep=60, return_mode="median"
                        )
                        res[f"ours[{tn}] f+b"] = tt.do_bench(
                            fb, warmup=10, rep=60, return_mode="median"
                        )
                    res["ours det bwd"] = tt.do_bench(
                        lambda: flash_bwd(dout, q, k, v, out, lse, scale, -1, wr, 0.0, True),
                        warmup=5,
                        rep=40,
                        return_mode="median",
                    )
                    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
                    dot = dout.transpose(1, 2)
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        res["FA2 bwd"] = tt.do_bench(
                            lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True),
                            warmup=10,
                            rep=60,
                            return_mode="median",
                        )

                        def fa_fb():
                            o3 = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            torch.autograd.grad(o3, (qt, kt, vt), dot)

                        res["FA2 f+b"] = tt.do_bench(fa_fb, warmup=10, rep=60, return_mode="median")
                    line = (
                        f"bench {dname} hd{hd} h{h} b{b} s{sl} {'causal' if causal else 'full  '}:"
                    )
                    for key, ms in res.items():
                        flops = fl * (2.5 if "bwd" in key else 3.5)
                        line += f" | {key} {ms * 1e3:.0f}us {flops / ms / 1e9:.0f}TF"
                    print(line, flush=True)
                    rows.append(res)
    return rows


def sanitize():
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    for c in [
        Case("bf16", 2, 65, 63, 4, 2, 64, causal=True),
        Case("fp16", 1, 7, 130, 2, 1, 72, window=(5, 3)),
        Case("fp32", 1, 33, 70, 2, 2, 40, softcap=20.0),
        Case("bf16", 1, 100, 100, 2, 2, 256, det=True),
        Case("bf16", 1, 70, 20, 2, 2, 128, causal=True),
    ]:
        r = run_case(c, gen)
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']} {r['detail']}", flush=True)


def resources(archs):
    vs = []
    for arch in archs:
        for hdt in HEAD_DIM_TILES:
            for dt in (0, 1, 2):
                t = pick_tile(arch, dt, hdt)
                for m in (0, 1):
                    for cap in (0, 1):
                        vs.append(BVariant(hdt, dt, t, m, cap, 0, arch))
                vs.append(BVariant(hdt, dt, None, 0, 0, 0, arch))
    extra = os.environ.get("FS_BWD_EXTRA", "")
    for item in filter(None, extra.split(";")):
        hd, dt, bm, bn, st, ds, mb, *w = map(int, item.split(","))
        for arch in archs:
            for m in (0, 1):
                vs.append(BVariant(hd, dt, T(bm, bn, st, ds, mb, *w), m, 0, 0, arch))
    compile_many(vs)
    for v in vs:
        cub, log = get_cubin(v)
        r = ff.parse_ptxas(log)
        smem = v.tile.smem(v.head_dim, v.dtype) if v.tile else 0
        print(
            f"{v.name:60s} regs {r['regs']:3d} spill {r['spill_st']}/{r['spill_ld']} smem {smem}",
            flush=True,
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--arch", default="90")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--tiles", default="", help="hd:bm,bn,st,ds,mb[,warps];... extra tiles to bench"
    )
    a = ap.parse_args()
    if a.mode == "resources":
        resources([int(x) for x in a.arch.split(",")])
        return 0
    tiles = {}
    for item in filter(None, a.tiles.split(";")):
        hd, spec = item.split(":")
        bm, bn, st, ds, mb, *w = map(int, spec.split(","))
        tiles.setdefault(int(hd), [None]).append(T(bm, bn, st, ds, mb, *w))
    ok = True
    if a.mode in ("check", "all"):
        ok = check(a.quick)
    if a.mode in ("bench", "all"):
        bench(tiles)
    if a.mode == "sanitize":
        sanitize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
