#!/usr/bin/env python3
"""Dev harness for cuda/flash_fwd.cu (no Rust): NVRTC compile + CUDA driver launch through ctypes.

Modes
  resources [--arch 80,90]        compile the tile table locally (no GPU needed) and print
                                  registers / spill bytes / smem per variant (ptxas -v + cuobjdump)
  precompile [--arch 90]          fill the cubin cache for every variant the check/bench modes use
  check [--quick]                 correctness sweep on the GPU vs a float64 torch reference
  bench [--variants ...]          TFLOP/s vs torch SDPA (FLASH_ATTENTION, CUDNN_ATTENTION), bf16
  latency                         per-call time at batch 32/1, seqlen 60, 8 heads, hd 64
  all                             check + bench + latency in one process

The launch path mirrors what the Rust side does: the same #define prelude, one by-value
FlashFwdParams struct, grid (ceil(seqlen_q / BLOCK_M), nheads, batch), block NWARPS * 32,
dynamic smem (> 48 KB through cuFuncSetAttribute), the caller's current torch stream.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import hashlib
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_PATH = os.path.join(REPO, "cuda", "flash_fwd.cu")
CACHE_DIR = os.environ.get("FS_DEV_CACHE", os.path.join(REPO, ".dev", "flash", "cache"))

DT_F16, DT_BF16, DT_F32 = 0, 1, 2
DT_NAMES = {DT_F16: "fp16", DT_BF16: "bf16", DT_F32: "fp32"}
HEAD_DIM_TILES = (32, 64, 96, 128, 192, 256)


# ----------------------------------------------------------------------------------------------
# Tile table: (arch, dtype, padded head dim) -> BLOCK_M, BLOCK_N, NWARPS, KV_STAGES.
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    nwarps: int
    stages: int
    min_blocks: int = 1
    qk_unroll: int = 16  # FS_QK_UNROLL: 1 keeps the big tiles spill-free

    def smem_bytes(self, head_dim: int, dtype: int) -> int:
        elem = 4 if dtype == DT_F32 else 2
        return (self.block_m + 2 * self.stages * self.block_n) * (head_dim * elem + 16)

    @property
    def name(self) -> str:
        b = f"b{self.min_blocks}" if self.min_blocks != 1 else ""
        u = f"u{self.qk_unroll}" if self.qk_unroll != 16 else ""
        return f"{self.block_m}x{self.block_n}w{self.nwarps}s{self.stages}{b}{u}"

    @staticmethod
    def parse(s: str) -> "Tile":
        m = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)(?:b(\d+))?(?:u(\d+))?", s)
        if not m:
            raise ValueError(f"variant {s!r}: expected e.g. 128x64w4s2, 128x64w8s2b2, 128x64w4s1u1")
        bm, bn, nw, st, mb, qu = m.groups()
        return Tile(int(bm), int(bn), int(nw), int(st), int(mb or 1), int(qu or 16))


def pick_tile(arch: int, dtype: int, head_dim_tile: int, seqlen_q: int = 1 << 30) -> Tile:
    """The table the Rust launcher should copy (H100 rows measured, others smem-checked)."""
    T = Tile
    if dtype == DT_F32:  # 3xTF32
        if arch >= 90 or arch == 80:
            s = 2 if arch >= 90 else 1
            return {
                32: T(64, 64, 4, s),
                64: T(64, 64, 4, s),
                96: T(64, 32, 4, s),
                128: T(64, 32, 4, s),
                192: T(64, 32, 4, s),
                256: T(64, 32, 4, s),
            }[head_dim_tile]
        # sm86 / sm89: 99 KB per block
        return {
            32: T(64, 64, 4, 1),
            64: T(64, 64, 4, 1),
            96: T(64, 32, 4, 1),
            128: T(64, 32, 4, 1),
            192: T(64, 32, 4, 1),
            256: T(32, 32, 2, 1),
        }[head_dim_tile]
    if seqlen_q <= 64 and head_dim_tile <= 128:
        # short queries (real-time shapes): 64-row tiles halve the wasted rows and double the CTAs
        s = 2 if arch >= 90 else 1
        return T(64, 64, 4, s)
    # 4-warp 128-row tiles (two 16-row slabs per warp) run at the 255-register limit; the choices
    # below are the fastest measured (sm90) / the FlashAttention-2 shapes (others) that compile
    # with 0 spill bytes for every flag combination. u1 = QK^T k loop not unrolled (FS_QK_UNROLL 1).
    if arch >= 90:
        return {
            32: T(128, 64, 4, 2),
            64: T(128, 128, 4, 1),
            96: T(128, 64, 4, 1, 1, 1),
            128: T(128, 64, 4, 1, 1, 1),
            192: T(128, 64, 8, 2),
            256: T(128, 64, 8, 2),
        }[head_dim_tile]
    if arch == 80:
        return {
            32: T(128, 128, 4, 1),
            64: T(128, 64, 4, 1),
            96: T(128, 64, 4, 1),
            128: T(128, 64, 4, 1, 1, 1),
            192: T(128, 64, 8, 1),
            256: T(128, 64, 8, 1),
        }[head_dim_tile]
    # sm86 / sm89 (99 KB of shared memory per block)
    return {
        32: T(128, 128, 4, 1),
        64: T(128, 64, 4, 1, 1, 1),
        96: T(128, 64, 4, 1),
        128: T(64, 64, 4, 1),
        192: T(64, 64, 4, 1),
        256: T(64, 64, 4, 1),
    }[head_dim_tile]


SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}


def head_dim_tile(head_dim: int) -> int:
    for d in HEAD_DIM_TILES:
        if head_dim <= d:
            return d
    raise ValueError(f"head_dim {head_dim} > 256")


@dataclass(frozen=True)
class Variant:
    head_dim: int  # padded (tile) head dim
    dtype: int
    tile: Tile
    has_mask: int
    has_softcap: int
    pad_headdim: int
    arch: int

    def prelude(self) -> str:
        return (
            f"#define FS_HEAD_DIM {self.head_dim}\n#define FS_DTYPE {self.dtype}\n"
            f"#define FS_BLOCK_M {self.tile.block_m}\n#define FS_BLOCK_N {self.tile.block_n}\n"
            f"#define FS_NWARPS {self.tile.nwarps}\n#define FS_KV_STAGES {self.tile.stages}\n"
            f"#define FS_MIN_BLOCKS {self.tile.min_blocks}\n#define FS_QK_UNROLL {self.tile.qk_unroll}\n"
            f"#define FS_HAS_MASK {self.has_mask}\n#define FS_HAS_SOFTCAP {self.has_softcap}\n"
            f"#define FS_PAD_HEADDIM {self.pad_headdim}\n#define FS_ARCH {self.arch}\n"
        )

    @property
    def smem(self) -> int:
        return self.tile.smem_bytes(self.head_dim, self.dtype)

    @property
    def name(self) -> str:
        return (
            f"sm{self.arch} hd{self.head_dim} {DT_NAMES[self.dtype]} {self.tile.name} "
            f"mask{self.has_mask} cap{self.has_softcap} pad{self.pad_headdim}"
        )


# ----------------------------------------------------------------------------------------------
# NVRTC through ctypes
# ----------------------------------------------------------------------------------------------
def _find_nvrtc() -> str:
    cands = []
    if os.environ.get("FS_NVRTC"):
        cands.append(os.environ["FS_NVRTC"])
    for p in sys.path:
        cands += glob.glob(os.path.join(p, "nvidia", "cu13", "lib", "libnvrtc.so*"))
        cands += glob.glob(os.path.join(p, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"))
    cands += ["/usr/local/cuda/lib64/libnvrtc.so", "/usr/local/cuda-13.0/lib64/libnvrtc.so"]
    cands = [c for c in cands if os.path.exists(c) and "builtins" not in c]
    if not cands:
        found = ctypes.util.find_library("nvrtc")
        if found:
            return found
        raise RuntimeError("libnvrtc not found (set FS_NVRTC)")
    return cands[0]


class Nvrtc:
    def __init__(self) -> None:
        self.path = _find_nvrtc()
        self.lib = ctypes.CDLL(self.path)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, src: str, arch: int, extra=()) -> tuple[bytes, str]:
        prog = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(
                ctypes.byref(prog), src.encode(), b"flash_fwd.cu", 0, None, None
            ),
            "nvrtcCreateProgram",
        )
        archs = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
        opts = [
            f"--gpu-architecture={archs}",
            "-std=c++17",
            "-default-device",
            "--ptxas-options=--verbose",
            f"--include-path={os.path.join(REPO, 'cuda')}",  # for #include "common/*.cuh"
            *extra,
        ]
        copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = self.lib.nvrtcCompileProgram(prog, len(opts), copts)
        size = ctypes.c_size_t()
        self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        self.lib.nvrtcGetProgramLog(prog, log)
        logs = log.value.decode(errors="replace")
        if rc != 0:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
            raise RuntimeError(f"NVRTC compile failed:\n{logs}")
        self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        self._check(self.lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return buf.raw, logs


_NVRTC: Nvrtc | None = None


def nvrtc() -> Nvrtc:
    global _NVRTC
    if _NVRTC is None:
        _NVRTC = Nvrtc()
    return _NVRTC


def kernel_source() -> str:
    with open(KERNEL_PATH) as f:
        return f.read()


def cache_key(v: Variant) -> str:
    return hashlib.sha256((v.prelude() + kernel_source() + f"|sm{v.arch}").encode()).hexdigest()[
        :24
    ]


def get_cubin(v: Variant, force: bool = False) -> tuple[bytes, str]:
    """Cubin (and ptxas log) for a variant, cached on disk by prelude + source + arch."""
    os.makedirs(CACHE_DIR, exist_ok=True)
    key = cache_key(v)
    path = os.path.join(CACHE_DIR, key + ".cubin")
    logp = os.path.join(CACHE_DIR, key + ".log")
    if not force and os.path.exists(path):
        with open(path, "rb") as f:
            data = f.read()
        log = open(logp).read() if os.path.exists(logp) else ""
        return data, log
    data, log = nvrtc().compile(v.prelude() + kernel_source(), v.arch)
    fd, tmp = tempfile.mkstemp(dir=CACHE_DIR)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    with open(logp, "w") as f:
        f.write(log)
    return data, log


def compile_many(variants, force=False, workers=None) -> None:
    variants = list(dict.fromkeys(variants))
    todo = [
        v
        for v in variants
        if force or not os.path.exists(os.path.join(CACHE_DIR, cache_key(v) + ".cubin"))
    ]
    if not todo:
        return
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as ex:
        list(ex.map(lambda v: get_cubin(v, force), todo))
    print(f"[compile] {len(todo)} variants in {time.time() - t0:.1f} s", flush=True)


def parse_ptxas(log: str) -> dict:
    out = {}
    m = re.search(r"Used (\d+) registers", log)
    out["regs"] = int(m.group(1)) if m else -1
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    out["spill_st"], out["spill_ld"] = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    m = re.search(r"(\d+) bytes stack frame", log)
    out["stack"] = int(m.group(1)) if m else -1
    return out


def cuobjdump_usage(cubin: bytes) -> str:
    exe = None
    for p in sys.path:
        c = os.path.join(p, "nvidia", "cu13", "bin", "cuobjdump")
        if os.path.exists(c):
            exe = c
            break
    exe = exe or "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        name = f.name
    try:
        r = subprocess.run([exe, "--dump-resource-usage", name], capture_output=True, text=True)
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", r.stdout)
        return m.group(0) if m else r.stdout.strip()[-200:]
    except OSError as e:
        return f"cuobjdump unavailable: {e}"
    finally:
        os.unlink(name)


# ----------------------------------------------------------------------------------------------
# CUDA driver through ctypes
# ----------------------------------------------------------------------------------------------
class FlashFwdParams(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("q_batch_stride", ctypes.c_longlong),
        ("q_row_stride", ctypes.c_longlong),
        ("q_head_stride", ctypes.c_longlong),
        ("k_batch_stride", ctypes.c_longlong),
        ("k_row_stride", ctypes.c_longlong),
        ("k_head_stride", ctypes.c_longlong),
        ("v_batch_stride", ctypes.c_longlong),
        ("v_row_stride", ctypes.c_longlong),
        ("v_head_stride", ctypes.c_longlong),
        ("o_batch_stride", ctypes.c_longlong),
        ("o_row_stride", ctypes.c_longlong),
        ("o_head_stride", ctypes.c_longlong),
        ("batch", ctypes.c_int),
        ("nheads", ctypes.c_int),
        ("nheads_k", ctypes.c_int),
        ("seqlen_q", ctypes.c_int),
        ("seqlen_k", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("softmax_scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("window_left", ctypes.c_int),
        ("window_right", ctypes.c_int),
    ]


assert ctypes.sizeof(FlashFwdParams) == 176


class Driver:
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        self.lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        self.lib.cuModuleGetFunction.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
            ctypes.c_char_p,
        ]
        self.lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self.lib.cuFuncGetAttribute.argtypes = [
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        self.funcs: dict[Variant, tuple[int, dict]] = {}

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(s))
            raise RuntimeError(f"{what}: CUDA error {rc} {s.value.decode() if s.value else ''}")

    def function(self, v: Variant):
        if v in self.funcs:
            return self.funcs[v]
        cubin, log = get_cubin(v)
        mod = ctypes.c_void_p()
        rc = self.lib.cuModuleLoadData(ctypes.byref(mod), cubin)
        if rc != 0:  # e.g. a cubin cached by a newer NVRTC: rebuild with the NVRTC here
            print(f"[load] cached cubin refused (rc {rc}), recompiling {v.name}", flush=True)
            cubin, log = get_cubin(v, force=True)
            self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), cubin), "cuModuleLoadData")
        fn = ctypes.c_void_p()
        self.check(
            self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"flash_fwd_kernel"),
            "cuModuleGetFunction",
        )
        self.check(
            self.lib.cuFuncSetAttribute(
                fn, self.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, v.smem
            ),
            "cuFuncSetAttribute",
        )
        regs, local = ctypes.c_int(), ctypes.c_int()
        self.lib.cuFuncGetAttribute(ctypes.byref(regs), self.CU_FUNC_ATTRIBUTE_NUM_REGS, fn)
        self.lib.cuFuncGetAttribute(
            ctypes.byref(local), self.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn
        )
        info = {"regs": regs.value, "local": local.value, **parse_ptxas(log)}
        self.funcs[v] = (fn.value, info)
        return self.funcs[v]

    def launch(
        self, fn: int, grid, block: int, smem: int, stream: int, params: FlashFwdParams
    ) -> None:
        pptr = ctypes.cast(ctypes.pointer(params), ctypes.c_void_p)
        args = (ctypes.c_void_p * 1)(pptr)
        self.check(
            self.lib.cuLaunchKernel(
                fn, grid[0], grid[1], grid[2], block, 1, 1, smem, stream, args, None
            ),
            "cuLaunchKernel",
        )


# ----------------------------------------------------------------------------------------------
# torch-side wrapper (what the Rust op does)
# ----------------------------------------------------------------------------------------------
_DRV: Driver | None = None
_ARCH: int | None = None


def drv() -> Driver:
    global _DRV
    if _DRV is None:
        _DRV = Driver()
    return _DRV


def device_arch() -> int:
    global _ARCH
    if _ARCH is None:
        import torch

        maj, mnr = torch.cuda.get_device_capability()
        _ARCH = 90 if maj >= 9 else maj * 10 + mnr
    return _ARCH


def set_arch(arch: int) -> None:
    global _ARCH
    _ARCH = arch


def torch_dtype_code(dt) -> int:
    import torch

    return {torch.float16: DT_F16, torch.bfloat16: DT_BF16, torch.float32: DT_F32}[dt]


def make_variant(q, head_dim, causal_or_window, softcap, tile: Tile | None = None, seqlen_q=None):
    arch = device_arch()
    dt = torch_dtype_code(q.dtype)
    hdt = head_dim_tile(head_dim)
    tile = tile or pick_tile(arch, dt, hdt, seqlen_q if seqlen_q is not None else q.shape[1])
    return Variant(
        hdt, dt, tile, int(causal_or_window), int(softcap > 0), int(head_dim < hdt), arch
    )


def build_params(q, k, v, out, lse, scale, softcap, wl, wr) -> FlashFwdParams:
    b, sq, h, d = q.shape
    _, sk, hk, _ = k.shape
    return FlashFwdParams(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        lse.data_ptr() if lse is not None else None,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        b,
        h,
        hk,
        sq,
        sk,
        d,
        scale,
        softcap,
        wl,
        wr,
    )


def flash_fwd(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    return_lse=False,
    out=None,
    tile: Tile | None = None,
    lse_out=None,
):
    import torch

    b, sq, h, d = q.shape
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    wl, wr = window_size
    if causal:
        wr = 0
    masked = wl >= 0 or wr >= 0
    var = make_variant(q, d, masked, softcap, tile)
    fn, _ = drv().function(var)
    if out is None:
        out = torch.empty_like(q)
    lse = lse_out
    if lse is None and return_lse:
        lse = torch.empty((b, h, sq), device=q.device, dtype=torch.float32)
    params = build_params(q, k, v, out, lse, scale, softcap, wl, wr)
    grid = ((sq + var.tile.block_m - 1) // var.tile.block_m, h, b)
    drv().launch(
        fn, grid, var.tile.nwarps * 32, var.smem, torch.cuda.current_stream().cuda_stream, params
    )
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------------------------
# references
# ----------------------------------------------------------------------------------------------
def visible_mask(sq, sk, wl, wr, device):
    import torch

    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if wl >= 0:
        vis &= j >= i + sk - sq - wl
    if wr >= 0:
        vis &= j <= i + sk - sq + wr
    return vis


def attention_ref(q, k, v, scale, wl, wr, softcap, compute_dtype):
    """Plain attention in compute_dtype (float64 = the reference; q.dtype = the same-precision baseline)."""
    import torch

    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qq = q.to(compute_dtype).transpose(1, 2)
    kk = k.to(compute_dtype).transpose(1, 2).repeat_interleave(h // hk, dim=1)
    vv = v.to(compute_dtype).transpose(1, 2).repeat_interleave(h // hk, dim=1)
    s = torch.matmul(qq, kk.transpose(-1, -2)) * scale
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    vis = visible_mask(sq, sk, wl, wr, q.device)
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s.double() if compute_dtype == torch.float64 else s.float(), dim=-1)
    pr = torch.softmax(s, dim=-1)
    pr = torch.nan_to_num(pr, nan=0.0)  # rows with no visible key
    o = torch.matmul(pr, vv).transpose(1, 2)
    return o, lse


# ----------------------------------------------------------------------------------------------
# correctness sweep
# ----------------------------------------------------------------------------------------------
SEQLENS = (1, 7, 63, 64, 65, 128, 1000, 4097)


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
    lse: bool = True
    layout: str = "bshd"  # "bshd" contiguous, "packed": q/k/v slices of one qkv buffer, "strided"

    def label(self) -> str:
        m = (
            "causal"
            if self.causal
            else ("win%d,%d" % self.window if self.window != (-1, -1) else "full")
        )
        return (
            f"{self.dtype} b{self.b} sq{self.sq} sk{self.sk} h{self.h}/{self.hk} d{self.d} {m}"
            f"{' cap%g' % self.softcap if self.softcap else ''}{' ' + self.layout if self.layout != 'bshd' else ''}"
        )


def make_inputs(c: Case, gen):
    import torch

    dt = getattr(torch, {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[c.dtype])
    dev = "cuda"
    if c.layout == "packed" and c.sq == c.sk and c.h == c.hk:
        qkv = torch.randn(c.b, c.sq, 3, c.h, c.d, device=dev, generator=gen).to(dt)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if (
        c.layout == "strided"
    ):  # (b, h, s, d) storage viewed as (b, s, h, d), row padding of 8 elements
        q = (
            torch.randn(c.b, c.h, c.sq, c.d + 8, device=dev, generator=gen)
            .to(dt)[..., : c.d]
            .transpose(1, 2)
        )
        k = (
            torch.randn(c.b, c.hk, c.sk, c.d + 8, device=dev, generator=gen)
            .to(dt)[..., : c.d]
            .transpose(1, 2)
        )
        v = (
            torch.randn(c.b, c.hk, c.sk, c.d + 8, device=dev, generator=gen)
            .to(dt)[..., : c.d]
            .transpose(1, 2)
        )
        return q, k, v
    q = torch.randn(c.b, c.sq, c.h, c.d, device=dev, generator=gen).to(dt)
    k = torch.randn(c.b, c.sk, c.hk, c.d, device=dev, generator=gen).to(dt)
    v = torch.randn(c.b, c.sk, c.hk, c.d, device=dev, generator=gen).to(dt)
    return q, k, v


def case_variant(c: Case):
    dt = {"fp16": DT_F16, "bf16": DT_BF16, "fp32": DT_F32}[c.dtype]
    masked = c.causal or c.window != (-1, -1)
    hdt = head_dim_tile(c.d)
    return Variant(
        hdt,
        dt,
        pick_tile(device_arch(), dt, hdt, c.sq),
        int(masked),
        int(c.softcap > 0),
        int(c.d < hdt),
        device_arch(),
    )


def run_case(c: Case, gen) -> dict:
    import torch

    q, k, v = make_inputs(c, gen)
    scale = 1.0 / math.sqrt(c.d)
    wl, wr = c.window
    if c.causal:
        wr = 0
    out = torch.full((c.b, c.sq, c.h, c.d), float("nan"), device="cuda", dtype=q.dtype)
    if c.layout == "strided":  # output with padded rows too
        out = torch.full((c.b, c.h, c.sq, c.d + 8), float("nan"), device="cuda", dtype=q.dtype)[
            ..., : c.d
        ].transpose(1, 2)
    lse = (
        torch.full((c.b, c.h, c.sq), float("nan"), device="cuda", dtype=torch.float32)
        if c.lse
        else None
    )
    flash_fwd(q, k, v, scale, c.causal, c.window, c.softcap, out=out, lse_out=lse)
    torch.cuda.synchronize()
    o_ref, lse_ref = attention_ref(q, k, v, scale, wl, wr, c.softcap, torch.float64)
    o_base, _ = attention_ref(q, k, v, scale, wl, wr, c.softcap, q.dtype)
    res = {"case": c.label()}
    res["nan"] = bool(torch.isnan(out).any().item())
    err = (out.double() - o_ref).abs().max().item() if not res["nan"] else float("inf")
    base = (o_base.double() - o_ref).abs().max().item()
    ref_max = o_ref.abs().max().item()
    res.update(err=err, base=base, ref_max=ref_max)
    if c.dtype == "fp32":
        res["ok"] = (not res["nan"]) and err <= max(1e-4 * max(ref_max, 1e-30), 2 * base + 1e-6)
    else:
        res["ok"] = (not res["nan"]) and err <= 2 * base + 1e-5
    if c.lse:
        lse_ref = lse_ref.float().view(c.b, c.h, c.sq) if lse_ref.dim() == 3 else lse_ref.float()
        inf_ref = torch.isinf(lse_ref)
        inf_ok = bool(torch.equal(torch.isinf(lse) & (lse < 0), inf_ref))
        fin = ~inf_ref
        lerr = (lse[fin].double() - lse_ref[fin].double()).abs().max().item() if fin.any() else 0.0
        lnan = bool(torch.isnan(lse).any().item())
        res.update(lse_err=lerr)
        lse_tol = 1e-4 + 2e-5 * (lse_ref[fin].abs().max().item() if fin.any() else 0.0)
        res["ok"] = res["ok"] and inf_ok and not lnan and lerr <= lse_tol
        if not inf_ok or lnan:
            res["lse_inf_mismatch"] = True
    return res


def build_cases(quick: bool):
    import random

    rnd = random.Random(1234)
    cases: list[Case] = []
    # 1. every seqlen pair, bf16 hd64 (GQA ratios rotate), three mask modes
    seqs = SEQLENS if not quick else (1, 7, 64, 65, 1000)
    kinds = [dict(), dict(causal=True), None]
    for sq in seqs:
        for sk in seqs:
            for kind in kinds:
                if kind is None:
                    wl, wr = rnd.choice([(0, 0), (5, 3), (64, -1), (-1, 17), (200, 0), (1, 70)])
                    kind = dict(window=(wl, wr))
                h, hk = rnd.choice([(4, 4), (4, 1), (8, 2)])
                b = 1 if max(sq, sk) > 1000 else rnd.choice([1, 2, 3])
                cases.append(Case("bf16", b, sq, sk, h, hk, 64, **kind))
    # 2. fp16 hd128 and fp32 hd64 over a subset of seqlen pairs
    sub = [
        (1, 1),
        (7, 4097),
        (4097, 7),
        (63, 65),
        (65, 63),
        (128, 1000),
        (1000, 128),
        (1000, 1000),
        (4097, 4097),
    ]
    if quick:
        sub = sub[:6]
    for dt, d in (("fp16", 128), ("fp32", 64)):
        for sq, sk in sub:
            for kind in (dict(), dict(causal=True), dict(window=(100, 20))):
                cases.append(Case(dt, 1 if max(sq, sk) > 1000 else 2, sq, sk, 4, 2, d, **kind))
    # 3. every head dim 8..256 (padding), rotating dtype/mask/softcap
    for d in range(8, 257, 8):
        for dt in ("bf16", "fp16", "fp32"):
            if quick and d % 32 not in (0, 8):
                continue
            sq, sk = rnd.choice([(65, 130), (130, 65), (200, 200), (1, 77)])
            kind = rnd.choice(
                [
                    dict(),
                    dict(causal=True),
                    dict(window=(33, 5)),
                    dict(softcap=30.0),
                    dict(causal=True, softcap=15.0),
                ]
            )
            cases.append(Case(dt, 2, sq, sk, 4, rnd.choice([4, 2, 1]), d, **kind))
    # 4. every tile variant x (mask, softcap) x dtype on a mid shape
    for dt in ("bf16", "fp16", "fp32"):
        for d in HEAD_DIM_TILES:
            for kind in (
                dict(),
                dict(causal=True),
                dict(softcap=20.0),
                dict(window=(40, 40), softcap=5.0),
            ):
                cases.append(Case(dt, 2, 257, 385, 4, 1, d, **kind))
    # 5. layouts, long rows, seqlen_q > seqlen_k causal (rows with no key), big batch
    cases += [
        Case("bf16", 2, 513, 513, 4, 4, 64, causal=True, layout="packed"),
        Case("fp16", 2, 300, 700, 4, 2, 128, layout="strided"),
        Case("fp32", 2, 300, 700, 4, 2, 96, causal=True, layout="strided"),
        Case("bf16", 1, 4097, 100, 2, 1, 128, causal=True),
        Case("bf16", 1, 1000, 63, 2, 2, 256, causal=True, softcap=10.0),
        Case("bf16", 16, 60, 60, 8, 8, 64),
        Case("bf16", 32, 60, 60, 8, 8, 64, causal=True),
        Case("bf16", 1, 8192, 8192, 2, 1, 128, causal=True),
        Case("fp16", 1, 4097, 4097, 2, 2, 256, window=(1000, 0)),
    ]
    return cases


def check(quick: bool) -> bool:
    import torch

    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    cases = build_cases(quick)
    compile_many([case_variant(c) for c in cases])
    t0 = time.time()
    fails, worst = [], {}
    for idx, c in enumerate(cases):
        try:
            r = run_case(c, gen)
        except Exception as e:  # noqa: BLE001
            r = {"case": c.label(), "ok": False, "error": repr(e)[:300]}
        if not r["ok"]:
            fails.append(r)
            print("FAIL", r, flush=True)
        else:
            ratio = r["err"] / max(r["base"], 1e-12)
            key = c.dtype
            if key not in worst or ratio > worst[key][0]:
                worst[key] = (ratio, r)
    torch.cuda.synchronize()
    print(
        f"\n[check] {len(cases)} cases, {len(fails)} failures, {time.time() - t0:.1f} s", flush=True
    )
    for k, (ratio, r) in worst.items():
        print(
            f"  worst {k}: err/base = {ratio:.3f}  ({r['case']}: err {r['err']:.3g} base {r['base']:.3g}"
            f" lse_err {r.get('lse_err', 0):.2g})"
        )
    return not fails


# ----------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------
def time_gpu(fn, iters=None, reps=5, budget_s=0.15):
    import torch

    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    one = max(s.elapsed_time(e) / 1e3, 1e-6)
    iters = iters or max(3, min(200, int(budget_s / reps / one)))
    times = []
    for _ in range(reps):
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / iters)
    return statistics.median(times)  # ms


def bench(
    variants_by_hd: dict[int, list[str]] | None,
    seqlens=(512, 1024, 2048, 4096, 8192, 16384),
    hds=(64, 128),
) -> list:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    arch = device_arch()
    rows = []
    variants_by_hd = variants_by_hd or {}
    all_vars = []
    for hd in hds:
        tiles = [Tile.parse(s) for s in variants_by_hd.get(hd, [])] or [
            pick_tile(arch, DT_BF16, hd)
        ]
        for t in tiles:
            for m in (0, 1):
                all_vars.append(Variant(hd, DT_BF16, t, m, 0, 0, arch))
    compile_many(all_vars)
    for hd in hds:
        tiles = [Tile.parse(s) for s in variants_by_hd.get(hd, [])] or [
            pick_tile(arch, DT_BF16, head_dim_tile(hd))
        ]
        h = max(1, round(2048 / hd))
        for sl in seqlens:
            b = 16384 // sl
            q = torch.randn(b, sl, h, hd, device="cuda", dtype=torch.bfloat16)
            k = torch.randn_like(q)
            v = torch.randn_like(q)
            out = torch.empty_like(q)
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            for causal in (False, True):
                flops = 4 * b * h * sl * sl * hd / (2 if causal else 1)
                res = {"hd": hd, "seqlen": sl, "batch": b, "nheads": h, "causal": causal}
                for t in tiles:
                    ms = time_gpu(lambda: flash_fwd(q, k, v, causal=causal, out=out, tile=t))  # noqa: F821 (called before the del below)
                    res[t.name] = flops / ms / 1e9
                for name, be in (
                    ("FA2", SDPBackend.FLASH_ATTENTION),
                    ("cuDNN", SDPBackend.CUDNN_ATTENTION),
                ):
                    try:
                        with sdpa_kernel(be):
                            ms = time_gpu(
                                lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            )
                        res[name] = flops / ms / 1e9
                    except Exception as e:  # noqa: BLE001
                        res[name] = float("nan")
                        print(f"[bench] {name} failed: {e!r}"[:200])
                rows.append(res)
                print(
                    "[bench]",
                    {k2: (round(v2, 1) if isinstance(v2, float) else v2) for k2, v2 in res.items()},
                    flush=True,
                )
            del q, k, v, out
    return rows


def graph_us(launch, n=50) -> float:
    """GPU time per call: n calls captured in one CUDA graph, replays timed with events."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            launch()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            launch()
    g.replay()
    torch.cuda.synchronize()
    return time_gpu(g.replay, iters=20) * 1e3 / n


def latency() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    arch = device_arch()
    configs = []
    for b in (32, 1):
        configs.append(
            (
                torch.bfloat16,
                b,
                {
                    "ours_64row": pick_tile(arch, DT_BF16, 64, 60),
                    "ours_128row": pick_tile(arch, DT_BF16, 64),
                },
                (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)),
            )
        )
    configs.append(
        (
            torch.float32,
            32,
            {"ours_3xtf32": pick_tile(arch, DT_F32, 64, 60)},
            (("memeff", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)),
        )
    )
    compile_many(
        [
            Variant(64, torch_dtype_code(dt), t, m, 0, 0, arch)
            for dt, _, tiles, _ in configs
            for t in tiles.values()
            for m in (0, 1)
        ]
    )
    for dtype, b, tiles, backends in configs:
        for causal in (False, True):
            q = torch.randn(b, 60, 8, 64, device="cuda", dtype=dtype)
            k, v = torch.randn_like(q), torch.randn_like(q)
            out = torch.empty_like(q)
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            line = {
                "dtype": str(dtype)[6:],
                "batch": b,
                "seqlen": 60,
                "nheads": 8,
                "hd": 64,
                "causal": causal,
            }
            for tname, t in tiles.items():
                var = Variant(64, torch_dtype_code(dtype), t, int(causal), 0, 0, arch)
                fn, _ = drv().function(var)
                prm = build_params(q, k, v, out, None, 0.125, 0.0, -1, 0 if causal else -1)
                grid = ((60 + t.block_m - 1) // t.block_m, 8, b)

                def launch(fn=fn, grid=grid, t=t, var=var, prm=prm, stream=None):
                    st = torch.cuda.current_stream().cuda_stream if stream is None else stream
                    drv().launch(fn, grid, t.nwarps * 32, var.smem, st, prm)

                line[tname + "_graph_us"] = graph_us(launch)
                stream = torch.cuda.current_stream().cuda_stream
                line[tname + "_launch_wall_us"] = wall_us(lambda: launch(stream=stream))
            # the full dev wrapper (Python argument handling + launch), for reference
            line["ours_pywrapper_wall_us"] = wall_us(
                lambda: flash_fwd(q, k, v, causal=causal, out=out), n=500
            )
            for name, be in backends:
                try:
                    with sdpa_kernel(be):
                        f = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)  # noqa: E731
                        line[name + "_graph_us"] = graph_us(f)
                        line[name + "_wall_us"] = wall_us(f)
                except Exception as e:  # noqa: BLE001
                    line[name + "_graph_us"] = float("nan")
                    print(f"[latency] {name}: {e!r}"[:200])
            print(
                "[latency]",
                {k2: (round(v2, 2) if isinstance(v2, float) else v2) for k2, v2 in line.items()},
                flush=True,
            )


def wall_us(f, n=2000) -> float:
    import torch

    for _ in range(50):
        f()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def print_bench_table(rows) -> None:
    meta = ("hd", "seqlen", "batch", "nheads", "causal")
    for hd in sorted({r["hd"] for r in rows}):
        rs = [r for r in rows if r["hd"] == hd]
        keys = [k for k in rs[0] if k not in meta]
        names = ", ".join(k for k in rs[0] if k not in meta + ("FA2", "cuDNN"))
        print(f"\nTFLOP/s hd{hd} (bf16, batch*seqlen=16k, nheads={rs[0]['nheads']}; tiles {names})")
        print(f"{'seqlen':>6} {'causal':>6} " + " ".join(f"{k:>14}" for k in keys) + "   best/FA2")
        for r in rs:
            ours = [r[k] for k in keys if k not in ("FA2", "cuDNN")]
            print(
                f"{r['seqlen']:>6} {str(r['causal']):>6} "
                + " ".join(f"{r[k]:>14.1f}" for k in keys)
                + f"   {max(ours) / r['FA2']:.2f}"
            )


# ----------------------------------------------------------------------------------------------
# sanitize: torch-free launches (driver API + numpy) for compute-sanitizer memcheck / racecheck
# ----------------------------------------------------------------------------------------------
def sanitize(subset: bool) -> bool:
    import numpy as np

    d = drv()
    lib = d.lib
    d.check(lib.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    d.check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
    lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
    arch = 90 if major.value >= 9 else major.value * 10 + minor.value
    set_arch(arch)
    ctx = ctypes.c_void_p()
    d.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    d.check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    for f in (
        "cuMemAlloc_v2",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemsetD8_v2",
        "cuMemFree_v2",
    ):
        getattr(lib, f).restype = ctypes.c_int
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    lib.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    rng = np.random.default_rng(0)

    def to_dev(a: np.ndarray) -> int:
        ptr = ctypes.c_uint64()
        d.check(lib.cuMemAlloc_v2(ctypes.byref(ptr), a.nbytes), "cuMemAlloc")
        d.check(lib.cuMemcpyHtoD_v2(ptr.value, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
        return ptr.value

    def encode(x: np.ndarray, dt: int) -> np.ndarray:
        if dt == DT_F16:
            return x.astype(np.float16)
        if dt == DT_BF16:
            return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return x.astype(np.float32)

    def decode(raw: np.ndarray, dt: int) -> np.ndarray:
        if dt == DT_F16:
            return raw.view(np.float16).astype(np.float32)
        if dt == DT_BF16:
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return raw.view(np.float32)

    ok = True
    variants = []
    for dt in (DT_F16, DT_BF16, DT_F32):
        for hd in HEAD_DIM_TILES:
            tiles = [pick_tile(arch, dt, hd)] + (
                [pick_tile(arch, dt, hd, 60)] if dt != DT_F32 and hd <= 128 else []
            )
            for t in dict.fromkeys(tiles):
                combos = [(1, 0, 0)] if subset else [(0, 0, 0), (1, 0, 1), (0, 1, 1), (1, 1, 0)]
                variants += [Variant(hd, dt, t, m, c, pd, arch) for m, c, pd in combos]
    compile_many(variants)
    t0 = time.time()
    for v in variants:
        hd = v.head_dim - 8 if v.pad_headdim else v.head_dim
        elem = 4 if v.dtype == DT_F32 else 2
        for b, sq, sk, h, hk, wl, wr in (
            (2, 70, 131, 4, 2, -1, 0 if v.has_mask else -1),
            (1, 150, 40, 2, 1, 17, 0 if v.has_mask else -1),
        ):
            if not v.has_mask:
                wl = -1
            q = encode(rng.standard_normal((b, sq, h, hd)), v.dtype)
            k = encode(rng.standard_normal((b, sk, hk, hd)), v.dtype)
            vv = encode(rng.standard_normal((b, sk, hk, hd)), v.dtype)
            dq, dk, dv = to_dev(q), to_dev(k), to_dev(vv)
            onbytes = b * sq * h * hd * elem
            do = ctypes.c_uint64()
            d.check(lib.cuMemAlloc_v2(ctypes.byref(do), onbytes), "cuMemAlloc")
            d.check(lib.cuMemsetD8_v2(do.value, 0xFF, onbytes), "cuMemset")  # NaN poison
            dl = ctypes.c_uint64()
            d.check(lib.cuMemAlloc_v2(ctypes.byref(dl), b * h * sq * 4), "cuMemAlloc")
            d.check(lib.cuMemsetD8_v2(dl.value, 0xFF, b * h * sq * 4), "cuMemset")
            prm = FlashFwdParams(
                dq,
                dk,
                dv,
                do.value,
                dl.value,
                sq * h * hd,
                h * hd,
                hd,
                sk * hk * hd,
                hk * hd,
                hd,
                sk * hk * hd,
                hk * hd,
                hd,
                sq * h * hd,
                h * hd,
                hd,
                b,
                h,
                hk,
                sq,
                sk,
                hd,
                hd**-0.5,
                7.0 if v.has_softcap else 0.0,
                wl,
                wr,
            )
            fn, _ = d.function(v)
            d.launch(
                fn,
                ((sq + v.tile.block_m - 1) // v.tile.block_m, h, b),
                v.tile.nwarps * 32,
                v.smem,
                0,
                prm,
            )
            rc = lib.cuCtxSynchronize()
            out = np.empty(onbytes, dtype=np.uint8)
            lse = np.empty(b * h * sq, dtype=np.float32)
            if rc == 0:
                lib.cuMemcpyDtoH_v2(out.ctypes.data, do.value, onbytes)
                lib.cuMemcpyDtoH_v2(lse.ctypes.data, dl.value, lse.nbytes)
            o = decode(out, v.dtype)
            bad = rc != 0 or np.isnan(o).any() or np.isnan(lse).any()
            if bad:
                ok = False
                print(
                    f"[sanitize] FAIL {v.name} shape {(b, sq, sk, h, hk, hd)} rc {rc}", flush=True
                )
                if rc != 0:
                    return False
            for ptr in (dq, dk, dv, do.value, dl.value):
                lib.cuMemFree_v2(ptr)
    print(
        f"[sanitize] {len(variants)} variants x 2 shapes launched on sm{arch}, "
        f"{'all outputs written' if ok else 'FAILURES'} ({time.time() - t0:.1f} s)",
        flush=True,
    )
    return ok


# ----------------------------------------------------------------------------------------------
# resources (local, no GPU)
# ----------------------------------------------------------------------------------------------
def table_variants(arch: int, extra_tiles=()):
    vs = []
    for dt in (DT_F16, DT_BF16, DT_F32):
        for hd in HEAD_DIM_TILES:
            tiles = {pick_tile(arch, dt, hd)}
            if dt != DT_F32 and hd <= 128:
                tiles.add(pick_tile(arch, dt, hd, 60))
            for t in tiles:
                for mask in (0, 1):
                    for cap in (0, 1):
                        for pad in (0, 1):
                            vs.append(Variant(hd, dt, t, mask, cap, pad, arch))
    for hd, t in extra_tiles:
        for mask in (0, 1):
            vs.append(Variant(hd, DT_BF16, t, mask, 0, 0, arch))
    return vs


def resources(archs, extra_tiles=(), full=False) -> None:
    for arch in archs:
        vs = table_variants(arch, extra_tiles)
        if not full:  # main variants: no pad, no softcap (+ one softcap/pad per tile below)
            vs = [v for v in vs if not (v.has_softcap and v.pad_headdim)]
        compile_many(vs)
        print(f"\n== sm_{arch}{'a' if arch == 90 else ''} (NVRTC {nvrtc().version}) ==")
        print(f"{'variant':<52} {'smem':>7} {'regs':>4} {'spill st/ld':>11}  cuobjdump")
        for v in vs:
            cubin, log = get_cubin(v)
            info = parse_ptxas(log)
            lim = SMEM_LIMIT.get(arch, 101376)
            flag = "" if v.smem <= lim else "  SMEM>LIMIT"
            print(
                f"{v.name:<52} {v.smem:>7} {info['regs']:>4} {info['spill_st']:>5}/{info['spill_ld']:<5}  "
                f"{cuobjdump_usage(cubin)}{flag}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "mode", choices=["resources", "precompile", "check", "bench", "latency", "sanitize", "all"]
    )
    ap.add_argument("--subset", action="store_true", help="sanitize: one flag combination per tile")
    ap.add_argument("--quick", action="store_true", help="smaller correctness sweep")
    ap.add_argument(
        "--arch", default="80,90", help="archs for resources/precompile (e.g. 80,86,90)"
    )
    ap.add_argument("--full", action="store_true", help="resources: every flag combination")
    ap.add_argument(
        "--v64", default="", help="bench: comma list of tiles for hd64, e.g. 128x128w4s2,128x64w4s2"
    )
    ap.add_argument("--v128", default="", help="bench: comma list of tiles for hd128")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--hds", default="64,128", help="bench: head dims")
    args = ap.parse_args()
    vmap = {64: [s for s in args.v64.split(",") if s], 128: [s for s in args.v128.split(",") if s]}
    vmap = {k: v for k, v in vmap.items() if v}
    extra = [(hd, Tile.parse(s)) for hd, lst in vmap.items() for s in lst]
    if args.mode == "resources":
        resources([int(a) for a in args.arch.split(",")], extra, args.full)
        return 0
    if args.mode == "precompile":
        for arch in (int(a) for a in args.arch.split(",")):
            set_arch(arch)
            vs = table_variants(arch, extra)
            vs += [case_variant(c) for c in build_cases(False)]
            vs += [
                Variant(64, DT_BF16, t, m, 0, 0, arch)
                for t in (pick_tile(arch, DT_BF16, 64, 60), pick_tile(arch, DT_BF16, 64))
                for m in (0, 1)
            ]
            compile_many(vs)
        return 0
    if args.mode == "sanitize":
        return 0 if sanitize(args.subset) else 1
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(
        f"[device] {torch.cuda.get_device_name()} sm{device_arch()} torch {torch.__version__} "
        f"NVRTC {nvrtc().version} ({nvrtc().path})",
        flush=True,
    )
    ok = True
    if args.mode in ("check", "all"):
        ok = check(args.quick)
    if args.mode in ("bench", "all"):
        rows = bench(
            vmap,
            tuple(int(s) for s in args.seqlens.split(",")),
            tuple(int(x) for x in args.hds.split(",")),
        )
        print_bench_table(rows)
    if args.mode in ("latency", "all"):
        latency()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
