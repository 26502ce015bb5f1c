#!/usr/bin/env python3
"""Dev harness for cuda/selective_scan.cu and cuda/state_update.cu (not part of the package).

Compiles the kernels with NVRTC through ctypes (CUBIN for sm_90a, cached on disk), launches them through
the CUDA driver (cuModuleLoadData / cuModuleGetFunction / cuLaunchKernel with ONE params struct by value)
on torch tensors, checks them against a float64 NumPy reference by the correctness rule of DESIGN.md,
and times them with CUDA events over CUDA-graph replays.

    python3 tools/dev_scan.py compile            # no GPU needed: compile every variant the tests use, print regs/spills
    python3 tools/dev_scan.py test [--quick]     # GPU: correctness matrix
    python3 tools/dev_scan.py bench              # GPU: timings (GB/s, floor)
    python3 tools/dev_scan.py all                # test + bench
    compute-sanitizer --tool memcheck python3 tools/dev_scan.py sanitize   # tiny shapes, every path

`plan_scan` / `plan_state_update` are the launch rules the Rust side ports line by line.
Env: FS_NVRTC (path of libnvrtc), FS_CUBIN_DIR (cubin cache, default .dev/scan/cubins), FS_OUT (log dir).
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_DIR = os.path.join(ROOT, "cuda")
CUBIN_DIR = os.environ.get("FS_CUBIN_DIR", os.path.join(ROOT, ".dev", "scan", "cubins"))
ARCH = os.environ.get("FS_ARCH_NAME", "sm_90a")

DT_FP16, DT_BF16, DT_FP32 = 0, 1, 2
DT_NAMES = {DT_FP16: "fp16", DT_BF16: "bf16", DT_FP32: "fp32"}
DT_BYTES = {DT_FP16: 2, DT_BF16: 2, DT_FP32: 4}

# ----------------------------------------------------------------------------------------------- plan
# Launch rules. Port these two functions to the Rust ops line by line.

SCAN_THREADS = 128
SCAN_POLY_NUM = int(os.environ.get("FS_POLY_NUM", "0"))  # exps per 8 done on the FMA pipe
CHUNK_MIN_LEN = 512  # never cut the sequence into chunks shorter than this
CHUNK_LANES_LOW = 128  # chunk when busy lanes per SM (batch*dim*nsplit / sm_count) fall below this


def _next_pow2(x: int) -> int:
    return 1 << (max(x, 1) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan_scan(
    batch,
    dim,
    seqlen,
    dstate,
    ngroups,
    in_dtype,
    bc_dtype,
    b_varying,
    c_varying,
    sm_count=132,
    nchunks=None,
    poly_num=None,
    tune=None,
):
    """Launch plan for selective_scan_fn.

    Returns dict(defines, chans_per_block, nchunks, chunk_len, launches, scratch_floats):
      defines: the FS_* #defines of the prelude (one variant = one compiled module);
      launches: in order, each (entry, grid(x, y, z), block(x, y, z), dynamic smem bytes);
      scratch: chunk_state floats = batch*dim*(nchunks-1)*FS_DSTATE and chunk_dtsum floats =
               batch*dim*(nchunks-1) (both fp32, contiguous; none when nchunks == 1).
    """
    dpad = _next_pow2(dstate)  # FS_DSTATE
    nsplit = min(max(dpad // 4, 1), 16)  # lanes per channel: 4 states a lane up to dstate 64
    ns = dpad // nsplit  # states per lane
    min_blocks = 4 if ns <= 4 else (2 if ns <= 8 else 1)
    threads = (
        SCAN_THREADS if ns <= 8 else 2 * SCAN_THREADS
    )  # dstate 256: halve the B/C staging registers
    # channels per lane group (register blocking over channels). Measured on the H100, 2026-11-22:
    # cpt 2 was slower (341 vs 294 us at b8 d2048 L2048 bf16: half the warps, latency-bound), so cpt = 1.
    cpt = 1
    # timesteps per tile: a lane's slice (tile / nsplit) stays <= 8 steps; B/C tiles stay small at big dstate
    tile = 32 if (nsplit >= 4 and dpad <= 64) else (16 if nsplit >= 2 else 8)
    if (
        dpad == 16
        and seqlen < 2 * CHUNK_MIN_LEN
        and batch * _cdiv(dim, threads // nsplit) < sm_count
    ):
        # Small grid (fewer blocks than SMs), sequence too short to chunk: twice the lanes per channel
        # (2 states a lane), 64 registers, 8 blocks/SM. Measured on the H100 (2026-11-22, b1 d512 L60 bf16):
        # 6.2 us vs 8.0 us; at b32 (512 blocks) it was slower (16.6 vs 15.4 us), hence only small grids.
        nsplit, tile, min_blocks = 8, 16, 8
    tune = tune or {}
    nsplit, cpt, tile = tune.get("nsplit", nsplit), tune.get("cpt", cpt), tune.get("tile", tile)
    min_blocks = tune.get("min_blocks", min_blocks)
    ns = dpad // nsplit
    chans = threads // nsplit * cpt  # channels per block
    dpg = dim // ngroups
    if (b_varying or c_varying) and ngroups > 1:  # a block's channels must share one B/C group
        cpb = max(c for c in range(1, min(chans, dpg) + 1) if dpg % c == 0)
    else:
        cpb = chans
    nblk_d = _cdiv(dim, cpb)
    if nchunks is None:
        # Chunk only when fewer than CHUNK_LANES_LOW lanes per SM would be busy (one warp per scheduler), and
        # then take as many chunks as fill the resident block slots in one wave (a second partial wave
        # cost 15% at b1 d1024 L65536: 17 chunks x 32 blocks > 528 slots).
        lanes_per_sm = batch * dim * nsplit / cpt / sm_count
        nchunks = 1
        if lanes_per_sm < CHUNK_LANES_LOW and seqlen >= 2 * CHUNK_MIN_LEN:
            resident = sm_count * min_blocks
            nchunks = max(1, min(resident // (nblk_d * batch), seqlen // CHUNK_MIN_LEN))
    nchunks = max(1, min(nchunks, _cdiv(seqlen, tile)))
    chunk_len = _cdiv(_cdiv(seqlen, nchunks), tile) * tile  # a multiple of the tile
    nchunks = _cdiv(seqlen, chunk_len)
    row = dpad + 4 if dpad >= 4 else dpad
    bc_floats = 2 * tile * row  # one double-buffered fp32 B or C tile: [2][tile][row]
    dt_floats = (
        4 * (threads // nsplit) * (tile + 1) * cpt
    )  # (dt, dt*u) float2: [2][slots][tile + 1][cpt]
    y_floats = threads * cpt * (tile + 4)  # partial y: [threads][cpt][tile + 4]
    smem_fwd = 4 * ((int(b_varying) + int(c_varying)) * bc_floats + dt_floats + y_floats)
    smem_state = 4 * (int(b_varying) * bc_floats + dt_floats)
    defines = dict(
        FS_IN_DTYPE=in_dtype,
        FS_BC_DTYPE=bc_dtype,
        FS_DSTATE=dpad,
        FS_NSPLIT=nsplit,
        FS_TILE_T=tile,
        FS_THREADS=threads,
        FS_MIN_BLOCKS=min_blocks,
        FS_CPT=cpt,
        FS_B_VARYING=int(b_varying),
        FS_C_VARYING=int(c_varying),
        FS_POLY_NUM=SCAN_POLY_NUM if poly_num is None else poly_num,
        FS_ARCH=90,
    )
    if "pack_bc" in tune:  # dev sweeps: the kernel's default (FS_PACK_BC 1) is not emitted
        defines["FS_PACK_BC"] = tune["pack_bc"]
    block = (threads, 1, 1)
    launches = []
    if nchunks > 1:
        launches.append(
            ("selective_scan_chunk_state", (nblk_d * batch, nchunks - 1, 1), block, smem_state)
        )
    launches.append(("selective_scan_fwd", (nblk_d * batch, nchunks, 1), block, smem_fwd))
    return dict(
        defines=defines,
        chans_per_block=cpb,
        nchunks=nchunks,
        chunk_len=chunk_len,
        launches=launches,
        scratch_chunk_state=batch * dim * (nchunks - 1) * dpad if nchunks > 1 else 0,
        scratch_chunk_dtsum=batch * dim * (nchunks - 1) if nchunks > 1 else 0,
    )


SU_THREADS = 128


SU_BPT_BLOCKS = (
    3  # 2 batch rows per thread when that still gives >= SU_BPT_BLOCKS blocks per SM, else 1
)


def plan_state_update(batch, nheads, dim, dstate, in_dtype, bc_dtype, sm_count=132, bpt=None):
    """Launch plan for selective_state_update: one entry, no scratch. bpt: forced (dev sweeps)."""
    dpad = max(4, _next_pow2(dstate))
    lanes = min(dpad // 4, 32)
    chans = SU_THREADS // lanes
    if bpt is None:
        # A thread updates its channel in bpt batch rows, all their state loads in flight at once (HBM
        # latency hiding); but keep enough blocks to fill the SMs. Measured on the H100 (2026-11-22), bpt
        # 1/2/4: b64 d5120 n16 bf16 23.9/22.6/26.9 us, fp32 21.7/20.8/23.9; b64 h80 d64 n128 166/150/181;
        # b8 d5120 4.8/4.1/5.5; b16 d2048 3.8/3.6/4.9; b32 d512 2.9/3.4/4.6 (256 blocks at bpt 2).
        bpt = 2 if _cdiv(dim, chans) * nheads * _cdiv(batch, 2) >= SU_BPT_BLOCKS * sm_count else 1
    grid = (_cdiv(dim, chans), nheads, _cdiv(batch, bpt))  # nheads, ceil(batch / bpt) <= 65535
    defines = dict(
        FS_IN_DTYPE=in_dtype,
        FS_BC_DTYPE=bc_dtype,
        FS_DSTATE=dpad,
        FS_THREADS=SU_THREADS,
        FS_BPT=bpt,
        FS_ARCH=90,
    )
    return dict(defines=defines, launches=[("selective_state_update", grid, (SU_THREADS, 1, 1), 0)])


# ----------------------------------------------------------------------------------------------- params
class ScanParams(ctypes.Structure):
    _fields_ = (
        [
            (n, ctypes.c_uint64)
            for n in (
                "u",
                "delta",
                "A",
                "B",
                "C",
                "D",
                "delta_bias",
                "z",
                "out",
                "initial_state",
                "last_state",
                "chunk_state",
                "chunk_dtsum",
            )
        ]
        + [
            (n, ctypes.c_int64)
            for n in (
                "batch",
                "dim",
                "seqlen",
                "dstate",
                "ngroups",
                "chunk_len",
                "u_batch",
                "u_dim",
                "delta_batch",
                "delta_dim",
                "z_batch",
                "z_dim",
                "out_batch",
                "out_dim",
                "A_dim",
                "A_dstate",
                "B_batch",
                "B_group",
                "B_dstate",
                "B_dim",
                "C_batch",
                "C_group",
                "C_dstate",
                "C_dim",
                "D_dim",
                "delta_bias_dim",
                "init_batch",
                "init_dim",
                "init_dstate",
                "last_batch",
                "last_dim",
                "last_dstate",
            )
        ]
        + [
            (n, ctypes.c_int32)
            for n in (
                "nchunks",
                "chans_per_block",
                "has_D",
                "has_z",
                "has_delta_bias",
                "softplus",
                "has_initial_state",
                "has_last_state",
                "io_align",
                "pad_",
            )
        ]
    )


class StateUpdateParams(ctypes.Structure):
    _fields_ = (
        [
            (n, ctypes.c_uint64)
            for n in ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "out")
        ]
        + [
            (n, ctypes.c_int64)
            for n in (
                "batch",
                "nheads",
                "dim",
                "dstate",
                "ngroups",
                "state_batch",
                "state_head",
                "state_dim",
                "state_dstate",
                "x_batch",
                "x_head",
                "x_dim",
                "dt_batch",
                "dt_head",
                "dt_dim",
                "z_batch",
                "z_head",
                "z_dim",
                "out_batch",
                "out_head",
                "out_dim",
                "A_head",
                "A_dim",
                "A_dstate",
                "B_batch",
                "B_group",
                "B_dstate",
                "C_batch",
                "C_group",
                "C_dstate",
                "D_head",
                "D_dim",
                "dt_bias_head",
                "dt_bias_dim",
            )
        ]
        + [
            (n, ctypes.c_int32)
            for n in ("has_D", "has_z", "has_dt_bias", "softplus", "vec4", "pad_")
        ]
    )


assert ctypes.sizeof(ScanParams) == 400 and ctypes.sizeof(StateUpdateParams) == 376

# ----------------------------------------------------------------------------------------------- NVRTC


def _find_nvrtc():
    cands = [os.environ.get("FS_NVRTC", "")]
    for sp in sys.path:
        cands += glob.glob(os.path.join(sp, "nvidia", "cu13", "lib", "libnvrtc.so*"))
        cands += glob.glob(os.path.join(sp, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"))
    cands += [
        "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
        "/usr/local/cuda-13.0/lib64/libnvrtc.so",
        "/usr/local/cuda/lib64/libnvrtc.so",
        "libnvrtc.so",
    ]
    for c in cands:
        if not c or "builtins" in c:
            continue
        try:
            return ctypes.CDLL(c), c
        except OSError:
            pass
    raise RuntimeError("libnvrtc not found (set FS_NVRTC)")


_NVRTC = None


def nvrtc():
    global _NVRTC
    if _NVRTC is None:
        _NVRTC = _find_nvrtc()
    return _NVRTC[0]


def prelude(defines):
    return "".join(f"#define {k} {v}\n" for k, v in sorted(defines.items()))


def compile_cubin(src_name, defines, arch=ARCH):
    """NVRTC -> CUBIN bytes, cached under CUBIN_DIR by hash of (source, defines, arch)."""
    src = prelude(defines) + open(os.path.join(CUDA_DIR, src_name)).read()
    key = hashlib.sha1((src + arch).encode()).hexdigest()[:16]
    path = os.path.join(CUBIN_DIR, f"{os.path.splitext(os.path.basename(src_name))[0]}-{key}.cubin")
    if os.path.exists(path):
        return open(path, "rb").read(), path
    lib = nvrtc()
    prog = ctypes.c_void_p()
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), src_name.encode(), 0, None, None)
    assert r == 0, r
    # cuda/ on the include path: the families #include "common/*.cuh" (read from disk here, so the
    # cache key above does not cover header edits: clear CUBIN_DIR after changing one).
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"-default-device", b"-lineinfo"]
    opts.append(f"--include-path={CUDA_DIR}".encode())
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if r != 0:
        raise RuntimeError(f"NVRTC failed for {src_name} {defines}:\n{log.value.decode()}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    os.makedirs(CUBIN_DIR, exist_ok=True)
    tmp = path + f".tmp{os.getpid()}"
    open(tmp, "wb").write(buf.raw)
    os.replace(tmp, path)
    if log.value.strip():
        print(f"[nvrtc log {src_name} {defines}] {log.value.decode().strip()}")
    return buf.raw, path


def resource_usage(path):
    """Registers / spills / stack per entry from cuobjdump (local tool), or {} if absent."""
    exe = None
    for c in [
        os.environ.get("FS_CUOBJDUMP", ""),
        "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cu13/bin/cuobjdump",
        "/usr/local/cuda-13.0/bin/cuobjdump",
        "/usr/local/cuda/bin/cuobjdump",
    ]:
        if c and os.path.exists(c):
            exe = c
            break
    if exe is None:
        return {}
    out = subprocess.run(
        [exe, "--dump-resource-usage", path], capture_output=True, text=True
    ).stdout
    res, fn = {}, None
    for line in out.splitlines():
        if "Function" in line:
            fn = line.split("Function")[1].strip().strip(":")
        elif "REG:" in line and fn:
            res[fn] = dict(tok.split(":", 1) for tok in line.split() if ":" in tok)
    return res


# ----------------------------------------------------------------------------------------------- driver
_CUDA = None
_MODULES = {}


def cuda():
    global _CUDA
    if _CUDA is None:
        _CUDA = ctypes.CDLL("libcuda.so.1")
        _ck(_CUDA.cuInit(0), "cuInit")
    return _CUDA


def _ck(r, what):
    if r != 0:
        raise RuntimeError(f"{what} failed: CUresult {r}")


def get_function(src_name, defines, entry, smem):
    key = (src_name, tuple(sorted(defines.items())), entry)
    f = _MODULES.get(key)
    if f is None:
        cubin, _ = compile_cubin(src_name, defines)
        lib = cuda()
        mkey = (src_name, tuple(sorted(defines.items())))
        mod = _MODULES.get(mkey)
        if mod is None:
            mod = ctypes.c_void_p()
            _ck(lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(cubin)), "cuModuleLoadData")
            _MODULES[mkey] = mod
        f = ctypes.c_void_p()
        _ck(
            lib.cuModuleGetFunction(ctypes.byref(f), mod, entry.encode()),
            f"cuModuleGetFunction({entry})",
        )
        _ck(
            lib.cuFuncSetAttribute(f, 8, ctypes.c_int(200 * 1024)),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED)",
        )
        _MODULES[key] = f
    return f


def launch(f, grid, block, smem, params, stream):
    lib = cuda()
    kp = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(params), ctypes.c_void_p))
    _ck(
        lib.cuLaunchKernel(
            f,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            smem,
            ctypes.c_void_p(stream),
            kp,
            None,
        ),
        "cuLaunchKernel",
    )


# ----------------------------------------------------------------------------------------------- torch wrappers


def _torch():
    import torch

    return torch


def _dt_code(t):
    torch = _torch()
    return {torch.float16: DT_FP16, torch.bfloat16: DT_BF16, torch.float32: DT_FP32}[t.dtype]


def _align_bytes(*tensors_and_strides):
    """Common power-of-two alignment (<= 16) of every row start: base pointer and outer strides in bytes."""
    g = 16
    for t, strides in tensors_and_strides:
        if t is None:
            continue
        es = t.element_size()
        for v in [t.data_ptr()] + [s * es for s in strides]:
            while g > 1 and v % g:
                g //= 2
    return g


def selective_scan(
    u,
    delta,
    A,
    B,
    C,
    D=None,
    z=None,
    delta_bias=None,
    delta_softplus=False,
    return_last_state=False,
    initial_state=None,
    nchunks=None,
    out=None,
    poly_num=None,
    tune=None,
    _cache=None,
    src="selective_scan.cu",
):
    """mamba_ssm selective_scan_fn on torch CUDA tensors through the kernels. Returns out (, last_state)."""
    torch = _torch()
    batch, dim, seqlen = u.shape
    dstate = A.shape[1]
    b_var, c_var = B.dim() >= 3, C.dim() >= 3

    def group_view(X):  # (batch, dstate, L) -> (batch, 1, dstate, L)
        return X.unsqueeze(1) if X.dim() == 3 else X

    Bv = group_view(B) if b_var else B
    Cv = group_view(C) if c_var else C
    ngroups = Bv.shape[1] if b_var else (Cv.shape[1] if c_var else 1)
    in_dt = _dt_code(u)
    bc_dt = _dt_code(Bv if b_var else (Cv if c_var else B))
    for X in (Bv, Cv):
        assert _dt_code(X) == bc_dt, "B and C must share a dtype"
    for X in (u, delta, z):
        if X is not None:
            assert X.stride(-1) == 1 and _dt_code(X) == in_dt
    for X, v in ((Bv, b_var), (Cv, c_var)):
        if v:
            assert X.stride(-1) == 1
    plan = plan_scan(
        batch,
        dim,
        seqlen,
        dstate,
        ngroups,
        in_dt,
        bc_dt,
        b_var,
        c_var,
        nchunks=nchunks,
        poly_num=poly_num,
        tune=tune,
    )
    if out is None:
        out = torch.empty_like(u)
    last = (
        torch.full((batch, dim, dstate), float("nan"), device=u.device, dtype=torch.float32)
        if return_last_state
        else None
    )  # poisoned: every element must be written
    nch = plan["nchunks"]
    scratch_cs = scratch_ds = None
    if nch > 1:
        scratch_cs = torch.empty(
            max(plan["scratch_chunk_state"], 1), device=u.device, dtype=torch.float32
        )
        scratch_ds = torch.empty(
            max(plan["scratch_chunk_dtsum"], 1), device=u.device, dtype=torch.float32
        )
    p = ScanParams()
    ptr = lambda t: 0 if t is None else t.data_ptr()
    p.u, p.delta, p.A, p.B, p.C = ptr(u), ptr(delta), ptr(A), ptr(Bv), ptr(Cv)
    p.D, p.delta_bias, p.z, p.out = ptr(D), ptr(delta_bias), ptr(z), ptr(out)
    p.initial_state, p.last_state = ptr(initial_state), ptr(last)
    p.chunk_state, p.chunk_dtsum = ptr(scratch_cs), ptr(scratch_ds)
    p.batch, p.dim, p.seqlen, p.dstate, p.ngroups, p.chunk_len = (
        batch,
        dim,
        seqlen,
        dstate,
        ngroups,
        plan["chunk_len"],
    )
    p.u_batch, p.u_dim = u.stride(0), u.stride(1)
    p.delta_batch, p.delta_dim = delta.stride(0), delta.stride(1)
    if z is not None:
        p.z_batch, p.z_dim = z.stride(0), z.stride(1)
    p.out_batch, p.out_dim = out.stride(0), out.stride(1)
    p.A_dim, p.A_dstate = A.stride(0), A.stride(1)
    if b_var:
        p.B_batch, p.B_group, p.B_dstate = Bv.stride(0), Bv.stride(1), Bv.stride(2)
    else:
        p.B_dim, p.B_dstate = B.stride(0), B.stride(1)
    if c_var:
        p.C_batch, p.C_group, p.C_dstate = Cv.stride(0), Cv.stride(1), Cv.stride(2)
    else:
        p.C_dim, p.C_dstate = C.stride(0), C.stride(1)
    if D is not None:
        p.D_dim = D.stride(0)
    if delta_bias is not None:
        p.delta_bias_dim = delta_bias.stride(0)
    if initial_state is not None:
        p.init_batch, p.init_dim, p.init_dstate = initial_state.stride()
    if last is not None:
        p.last_batch, p.last_dim, p.last_dstate = last.stride()
    p.nchunks, p.chans_per_block = nch, plan["chans_per_block"]
    p.has_D, p.has_z, p.has_delta_bias = (
        int(D is not None),
        int(z is not None),
        int(delta_bias is not None),
    )
    p.softplus = int(bool(delta_softplus))
    p.has_initial_state, p.has_last_state = int(initial_state is not None), int(last is not None)
    p.io_align = _align_bytes(
        (u, u.stride()[:2]),
        (delta, delta.stride()[:2]),
        (z, z.stride()[:2] if z is not None else ()),
        (out, out.stride()[:2]),
    )
    stream = torch.cuda.current_stream().cuda_stream
    for entry, grid, block, smem in plan["launches"]:
        f = get_function(src, plan["defines"], entry, smem)
        launch(f, grid, block, smem, p, stream)
    if _cache is not None:  # keep scratch alive for graph capture
        _cache.append((scratch_cs, scratch_ds, p))
    return (out, last) if return_last_state else out


def selective_state_update(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    out=None,
    bpt=None,
    src="state_update.cu",
):
    torch = _torch()
    has_heads = state.dim() == 4
    if not has_heads:  # view everything with a head axis of 1
        state4, x3, dt3 = state.unsqueeze(1), x.unsqueeze(1), dt.unsqueeze(1)
        A3 = A.unsqueeze(0)
        B3 = B.unsqueeze(1) if B.dim() == 2 else B
        C3 = C.unsqueeze(1) if C.dim() == 2 else C
        D2 = D.unsqueeze(0) if D is not None else None
        z3 = z.unsqueeze(1) if z is not None else None
        b2 = dt_bias.unsqueeze(0) if dt_bias is not None else None
    else:
        state4, x3, dt3, A3, B3, C3, D2, z3, b2 = state, x, dt, A, B, C, D, z, dt_bias
    batch, nheads, dim, dstate = state4.shape
    ngroups = B3.shape[1]
    in_dt, bc_dt = _dt_code(x), _dt_code(B)
    plan = plan_state_update(batch, nheads, dim, dstate, in_dt, bc_dt, bpt=bpt)
    if out is None:
        out = torch.empty_like(x)
    out3 = out.unsqueeze(1) if not has_heads else out
    p = StateUpdateParams()
    ptr = lambda t: 0 if t is None else t.data_ptr()
    p.state, p.x, p.dt, p.A, p.B, p.C = ptr(state4), ptr(x3), ptr(dt3), ptr(A3), ptr(B3), ptr(C3)
    p.D, p.z, p.dt_bias, p.out = ptr(D2), ptr(z3), ptr(b2), ptr(out3)
    p.batch, p.nheads, p.dim, p.dstate, p.ngroups = batch, nheads, dim, dstate, ngroups
    p.state_batch, p.state_head, p.state_dim, p.state_dstate = state4.stride()
    p.x_batch, p.x_head, p.x_dim = x3.stride()
    p.dt_batch, p.dt_head, p.dt_dim = dt3.stride()
    if z3 is not None:
        p.z_batch, p.z_head, p.z_dim = z3.stride()
    p.out_batch, p.out_head, p.out_dim = out3.stride()
    p.A_head, p.A_dim, p.A_dstate = A3.stride()
    p.B_batch, p.B_group, p.B_dstate = B3.stride()
    p.C_batch, p.C_group, p.C_dstate = C3.stride()
    if D2 is not None:
        p.D_head, p.D_dim = D2.stride()
    if b2 is not None:
        p.dt_bias_head, p.dt_bias_dim = b2.stride()
    p.has_D, p.has_z, p.has_dt_bias, p.softplus = (
        int(D is not None),
        int(z is not None),
        int(dt_bias is not None),
        int(bool(dt_softplus)),
    )
    es_bc = B.element_size()
    vec = (
        dstate % 4 == 0
        and state4.stride(3) == 1
        and A3.stride(2) == 1
        and B3.stride(2) == 1
        and C3.stride(2) == 1
    )
    vec = vec and all(
        (v * 4) % 16 == 0
        for v in (state4.data_ptr() // 4,)
        + state4.stride()[:3]
        + (A3.data_ptr() // 4,)
        + A3.stride()[:2]
    )
    vec = vec and state4.data_ptr() % 16 == 0 and A3.data_ptr() % 16 == 0
    vec = vec and all((v * es_bc) % (4 * es_bc) == 0 for v in B3.stride()[:2] + C3.stride()[:2])
    vec = vec and B3.data_ptr() % (4 * es_bc) == 0 and C3.data_ptr() % (4 * es_bc) == 0
    p.vec4 = int(vec)
    stream = torch.cuda.current_stream().cuda_stream
    for entry, grid, block, smem in plan["launches"]:
        f = get_function(src, plan["defines"], entry, smem)
        launch(f, grid, block, smem, p, stream)
    return out


# ----------------------------------------------------------------------------------------------- reference (NumPy)


def _softplus_np(v):
    return np.where(v <= 20, np.log1p(np.exp(np.minimum(v, 20))), v)


def ref_scan_np(
    u,
    delta,
    A,
    B,
    C,
    D=None,
    z=None,
    delta_bias=None,
    softplus=False,
    initial_state=None,
    dtype=np.float64,
):
    """Sequential reference. u, delta, z (batch, dim, L); A (dim, n); B/C (dim, n) or (batch, g, n, L)."""
    f = lambda a: None if a is None else np.asarray(a, dtype=dtype)
    u, delta, A, B, C, D, z, delta_bias = map(f, (u, delta, A, B, C, D, z, delta_bias))
    batch, dim, L = u.shape
    n = A.shape[1]
    dt = delta + (delta_bias[None, :, None] if delta_bias is not None else 0)
    if softplus:
        dt = _softplus_np(dt)
    x = (
        np.zeros((batch, dim, n), dtype)
        if initial_state is None
        else np.array(initial_state, dtype=dtype)
    )
    y = np.empty((batch, dim, L), dtype)

    def expand(X, t0, t1):  # -> (batch, dim, t, n)
        if X.ndim == 2:
            return np.broadcast_to(X[None, :, None, :], (batch, dim, t1 - t0, n))
        if X.ndim == 3:  # (batch, n, L): one group
            X = X[:, None]
        g = X.shape[1]
        idx = np.arange(dim) // (dim // g)
        return np.transpose(X[:, idx, :, t0:t1], (0, 1, 3, 2))

    step = max(1, min(L, (1 << 24) // max(1, batch * dim * n)))
    for t0 in range(0, L, step):
        t1 = min(L, t0 + step)
        dA = np.exp(dt[:, :, t0:t1, None] * A[None, :, None, :])
        dBu = (dt[:, :, t0:t1] * u[:, :, t0:t1])[..., None] * expand(B, t0, t1)
        Cx = expand(C, t0, t1)
        for t in range(t1 - t0):
            x = dA[:, :, t] * x + dBu[:, :, t]
            y[:, :, t0 + t] = np.einsum("bdn,bdn->bd", x, Cx[:, :, t])
    if D is not None:
        y = y + D[None, :, None] * u
    if z is not None:
        y = y * (z / (1 + np.exp(-z)))
    return y, x


def ref_state_update_np(
    state, x, dt, A, B, C, D=None, z=None, dt_bias=None, softplus=False, dtype=np.float64
):
    """state (b, h, d, n); x, dt, z (b, h, d); A (h, d, n); B, C (b, g, n); D, dt_bias (h, d)."""
    f = lambda a: None if a is None else np.asarray(a, dtype=dtype)
    state, x, dt, A, B, C, D, z, dt_bias = map(f, (state, x, dt, A, B, C, D, z, dt_bias))
    h = state.shape[1]
    g = B.shape[1]
    idx = np.arange(h) // (h // g)
    Bh, Ch = B[:, idx], C[:, idx]  # (b, h, n)
    if dt_bias is not None:
        dt = dt + dt_bias[None]
    if softplus:
        dt = _softplus_np(dt)
    dA = np.exp(dt[..., None] * A[None])
    s = state * dA + (dt * x)[..., None] * Bh[:, :, None, :]
    out = np.einsum("bhdn,bhn->bhd", s, Ch)
    if D is not None:
        out = out + D[None] * x
    if z is not None:
        out = out * (z / (1 + np.exp(-z)))
    return out, s


# ----------------------------------------------------------------------------------------------- tests
TORCH_DT = {}


def _tdt(code):
    torch = _torch()
    return {DT_FP16: torch.float16, DT_BF16: torch.bfloat16, DT_FP32: torch.float32}[code]


def _np(t):
    return t.detach().double().cpu().numpy()


def _round_to(arr64, code):
    """float64 array -> rounded to dtype code -> float64 (the output rounding of a same-precision run)."""
    torch = _torch()
    return torch.from_numpy(np.ascontiguousarray(arr64)).to(_tdt(code)).double().numpy()


class Results:
    def __init__(self):
        self.rows, self.fails = [], 0

    def add(self, name, ok, msg):
        self.rows.append((name, ok, msg))
        if not ok:
            self.fails += 1
        print(("PASS " if ok else "FAIL ") + name + "  " + msg, flush=True)


def judge(out_t, ref64, base32, code):
    """Correctness rule. Returns (ok, msg). base32: same computation in fp32 (NumPy), unrounded."""
    o = _np(out_t)
    if not np.isfinite(o).all():
        return False, f"non-finite outputs: {int((~np.isfinite(o)).sum())} (unwritten or overflow)"
    err = np.abs(o - ref64).max() if o.size else 0.0
    scale = np.abs(ref64).max() if o.size else 1.0
    if code == DT_FP32:
        rel = err / max(scale, 1e-30)
        return rel < 1e-4, f"max_abs={err:.3e} rel={rel:.2e} (fp32 rule rel < 1e-4)"
    base = np.abs(_round_to(base32, code) - ref64).max() if o.size else 0.0
    bound = 2 * base + 1e-5 * scale
    return err <= bound, f"max_abs={err:.3e} bound={bound:.3e} (2 x same-precision {base:.3e})"


def make_scan_inputs(
    batch,
    dim,
    seqlen,
    dstate,
    code,
    bc_code,
    b_form,
    c_form,
    ngroups=1,
    has_D=True,
    has_z=True,
    has_bias=True,
    has_init=False,
    seed=0,
    pad_rows=0,
    on_gpu=False,
):
    """b_form/c_form: 'fixed' (dim, n), 'var3' (batch, n, L), 'var4' (batch, g, n, L).
    pad_rows > 0: u/delta/z live in wider buffers (row stride seqlen + pad_rows): non-contiguous rows.
    on_gpu: draw on the GPU (benchmarks: large inputs)."""
    torch = _torch()
    dev = "cuda" if on_gpu else "cpu"
    g = torch.Generator(device=dev).manual_seed(seed)
    _randn, _rand = torch.randn, torch.rand

    class torch_:  # draw on `dev`
        randn = staticmethod(lambda *a, **k: _randn(*a, device=dev, **k))
        rand = staticmethod(lambda *a, **k: _rand(*a, device=dev, **k))

    dt, bct = _tdt(code), _tdt(bc_code)

    def rows(scale=1.0, shift=0.0, rand=False):
        L2 = seqlen + pad_rows
        x = (torch_.rand if rand else torch_.randn)(batch, dim, L2, generator=g) * scale + shift
        return x.to(dt).cuda()[:, :, :seqlen]

    u = rows()
    delta = rows(0.5, 0.0, rand=True)
    A = (-0.5 * torch_.rand(dim, dstate, generator=g) - 0.01).cuda()

    def bc(form):
        if form == "fixed":
            return torch_.randn(dim, dstate, generator=g).to(bct).cuda()
        if form == "var3":
            return torch_.randn(batch, dstate, seqlen, generator=g).to(bct).cuda()
        return torch_.randn(batch, ngroups, dstate, seqlen, generator=g).to(bct).cuda()

    B, C = bc(b_form), bc(c_form)
    D = torch_.randn(dim, generator=g).cuda() if has_D else None
    z = rows() if has_z else None
    bias = (0.5 * torch_.rand(dim, generator=g) - 0.25).cuda() if has_bias else None
    init = torch_.randn(batch, dim, dstate, generator=g).cuda() if has_init else None
    return dict(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=bias, initial_state=init)


def run_scan_case(
    res,
    name,
    batch,
    dim,
    seqlen,
    dstate,
    code,
    bc_code,
    b_form,
    c_form,
    ngroups=1,
    softplus=True,
    has_D=True,
    has_z=True,
    has_bias=True,
    has_init=False,
    last=True,
    nchunks=None,
    pad_rows=0,
    seed=0,
    tune=None,
):
    torch = _torch()
    inp = make_scan_inputs(
        batch,
        dim,
        seqlen,
        dstate,
        code,
        bc_code,
        b_form,
        c_form,
        ngroups,
        has_D,
        has_z,
        has_bias,
        has_init,
        seed,
        pad_rows,
    )
    out = torch.full(
        (batch, dim, seqlen + pad_rows), float("nan"), dtype=_tdt(code), device="cuda"
    )[:, :, :seqlen]
    res_k = selective_scan(
        inp["u"],
        inp["delta"],
        inp["A"],
        inp["B"],
        inp["C"],
        inp["D"],
        inp["z"],
        inp["delta_bias"],
        softplus,
        return_last_state=last,
        initial_state=inp["initial_state"],
        nchunks=nchunks,
        out=out,
        tune=tune,
    )
    torch.cuda.synchronize()
    npi = {k: (None if v is None else _np(v)) for k, v in inp.items()}
    kw = dict(
        D=npi["D"],
        z=npi["z"],
        delta_bias=npi["delta_bias"],
        softplus=softplus,
        initial_state=npi["initial_state"],
    )
    y64, x64 = ref_scan_np(npi["u"], npi["delta"], npi["A"], npi["B"], npi["C"], **kw)
    y32 = None
    if code != DT_FP32:
        y32, _ = ref_scan_np(
            npi["u"], npi["delta"], npi["A"], npi["B"], npi["C"], dtype=np.float32, **kw
        )
    ok, msg = judge(res_k[0] if last else res_k, y64, y32, code)
    if last and ok:
        ls = _np(res_k[1])
        lerr = np.abs(ls - x64).max() / max(np.abs(x64).max(), 1e-30)
        ok2 = np.isfinite(ls).all() and lerr < 1e-4
        msg += f" last_state rel={lerr:.1e}"
        ok = ok and ok2
    plan = plan_scan(
        batch,
        dim,
        seqlen,
        dstate,
        ngroups if b_form == "var4" or c_form == "var4" else 1,
        code,
        bc_code,
        b_form != "fixed",
        c_form != "fixed",
        nchunks=nchunks,
        tune=tune,
    )
    res.add(
        f"scan {name} {tune or ''} [b{batch} d{dim} L{seqlen} n{dstate} {DT_NAMES[code]}/{DT_NAMES[bc_code]} B:{b_form} C:{c_form}"
        f" g{ngroups} sp{int(softplus)} D{int(has_D)} z{int(has_z)} bias{int(has_bias)} init{int(has_init)}"
        f" nch{plan['nchunks']}]",
        ok,
        msg,
    )


def run_stream_case(res, name, batch, dim, seqlen, dstate, code, cuts, seed=0):
    """Scanning a stream chunk by chunk (initial_state = previous last_state) == one whole scan."""
    torch = _torch()
    inp = make_scan_inputs(
        batch, dim, seqlen, dstate, code, DT_FP32, "var4", "var4", 2, seed=seed, has_init=True
    )
    whole, wlast = selective_scan(
        inp["u"],
        inp["delta"],
        inp["A"],
        inp["B"],
        inp["C"],
        inp["D"],
        inp["z"],
        inp["delta_bias"],
        True,
        return_last_state=True,
        initial_state=inp["initial_state"],
    )
    st = inp["initial_state"]
    pieces = []
    edges = [0] + list(cuts) + [seqlen]
    for a, b in zip(edges[:-1], edges[1:]):
        sl = lambda X: X[..., a:b].contiguous() if X is not None else None
        o, st = selective_scan(
            sl(inp["u"]),
            sl(inp["delta"]),
            inp["A"],
            sl(inp["B"]),
            sl(inp["C"]),
            inp["D"],
            sl(inp["z"]),
            inp["delta_bias"],
            True,
            return_last_state=True,
            initial_state=st,
        )
        pieces.append(o)
    torch.cuda.synchronize()
    cat = torch.cat(pieces, dim=-1)
    e_out = (cat.double() - whole.double()).abs().max().item()
    scale = whole.double().abs().max().item()
    e_st = (st - wlast).abs().max().item() / max(wlast.abs().max().item(), 1e-30)
    ulp = {DT_FP32: 1e-5, DT_BF16: 1.6e-2, DT_FP16: 2e-3}[code]  # allow one output rounding step
    ok = e_out <= ulp * scale and e_st < 1e-5
    res.add(
        f"stream {name} [b{batch} d{dim} L{seqlen} n{dstate} {DT_NAMES[code]} cuts={list(cuts)}]",
        ok,
        f"out diff={e_out:.2e} (scale {scale:.2e}) last_state rel diff={e_st:.1e}",
    )


def run_su_case(
    res,
    name,
    batch,
    nheads,
    dim,
    dstate,
    code,
    bc_code,
    ngroups=1,
    heads=True,
    softplus=True,
    has_D=True,
    has_z=True,
    has_bias=True,
    strided=False,
    seed=0,
    bpt=None,
):
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    dt_t, bc_t = _tdt(code), _tdt(bc_code)
    H = nheads if heads else 1
    shp = (batch, H, dim) if heads else (batch, dim)
    if strided:  # state rows padded by 3 floats -> scalar path
        state_full = torch.randn(batch, H, dim, dstate + 3, generator=g).cuda()
        state = state_full[..., :dstate]
        if not heads:
            state = state[:, 0]
    else:
        state = torch.randn(
            *((batch, H, dim, dstate) if heads else (batch, dim, dstate)), generator=g
        ).cuda()
    x = torch.randn(*shp, generator=g).to(dt_t).cuda()
    dt = (0.5 * torch.rand(*shp, generator=g)).to(dt_t).cuda()
    A = (
        -0.5 * torch.rand(*((H, dim, dstate) if heads else (dim, dstate)), generator=g) - 0.01
    ).cuda()
    G = ngroups if heads else 1
    B = (
        torch.randn(*((batch, G, dstate) if heads else (batch, dstate)), generator=g)
        .to(bc_t)
        .cuda()
    )
    C = torch.randn(*B.shape, generator=g).to(bc_t).cuda()
    pshape = (H, dim) if heads else (dim,)
    D = torch.randn(*pshape, generator=g).cuda() if has_D else None
    z = torch.randn(*shp, generator=g).to(dt_t).cuda() if has_z else None
    bias = (0.5 * torch.rand(*pshape, generator=g) - 0.25).cuda() if has_bias else None
    s0 = _np(state)
    inputs_before = [
        t.clone() for t in (x, dt, A, B, C) + tuple(t for t in (D, z, bias) if t is not None)
    ]
    full_before = state_full.clone() if strided else None
    out = torch.full_like(x, float("nan"))
    selective_state_update(state, x, dt, A, B, C, D, z, bias, softplus, out=out, bpt=bpt)
    torch.cuda.synchronize()
    h4 = lambda a: None if a is None else (a if heads else a[:, None])
    hp = lambda a: None if a is None else (a if heads else a[None])
    ref_out, ref_s = ref_state_update_np(
        h4(s0),
        h4(_np(x)),
        h4(_np(dt)),
        hp(_np(A)),
        _np(B) if heads else _np(B)[:, None],
        _np(C) if heads else _np(C)[:, None],
        hp(_np(D) if D is not None else None),
        h4(_np(z) if z is not None else None),
        hp(_np(bias) if bias is not None else None),
        softplus,
    )
    ref32, _ = ref_state_update_np(
        h4(s0),
        h4(_np(x)),
        h4(_np(dt)),
        hp(_np(A)),
        _np(B) if heads else _np(B)[:, None],
        _np(C) if heads else _np(C)[:, None],
        hp(_np(D) if D is not None else None),
        h4(_np(z) if z is not None else None),
        hp(_np(bias) if bias is not None else None),
        softplus,
        dtype=np.float32,
    )
    ref_out = ref_out if heads else ref_out[:, 0]
    ref32 = ref32 if heads else ref32[:, 0]
    ref_s = ref_s if heads else ref_s[:, 0]
    ok, msg = judge(out, ref_out, ref32, code)
    se = np.abs(_np(state) - ref_s).max() / np.abs(ref_s).max()
    untouched = all(
        torch.equal(a, b)
        for a, b in zip(
            inputs_before, (x, dt, A, B, C) + tuple(t for t in (D, z, bias) if t is not None)
        )
    )
    if strided:
        untouched = untouched and torch.equal(state_full[..., dstate:], full_before[..., dstate:])
    ok = ok and se < 1e-5 and untouched
    res.add(
        f"state_update {name} [b{batch} h{H} d{dim} n{dstate} {DT_NAMES[code]}/{DT_NAMES[bc_code]} g{G}"
        f" sp{int(softplus)} D{int(has_D)} z{int(has_z)} bias{int(has_bias)} strided{int(strided)}]",
        ok,
        msg + f" state rel={se:.1e} inputs_untouched={untouched}",
    )


def test_matrix(quick=False):
    """List of (kind, kwargs) test cases."""
    F, H, BF = DT_FP32, DT_FP16, DT_BF16
    cases = []
    S = lambda name, *a, **k: cases.append(("scan", name, a, k))
    # dtypes x B/C dtype x forms (game-like shape)
    for code in (F, H, BF):
        for bc in sorted({F, code}):
            S("dtypes", 2, 96, 60, 16, code, bc, "var4", "var4", ngroups=1)
    S("fixed-BC", 2, 64, 60, 16, BF, F, "fixed", "fixed")
    S("fixed-B", 2, 64, 61, 16, F, F, "fixed", "var3")
    S("fixed-C", 2, 64, 61, 16, H, H, "var3", "fixed")
    S("var3", 3, 40, 77, 16, BF, BF, "var3", "var3")
    # ngroups
    S("ngroups2", 2, 128, 100, 16, BF, F, "var4", "var4", ngroups=2)
    S("ngroups4", 1, 256, 65, 16, F, F, "var4", "var4", ngroups=4)
    S(
        "ngroups3-odd", 2, 21, 50, 16, BF, BF, "var4", "fixed", ngroups=3
    )  # dim/ngroups = 7 -> 7 channels a block
    S("odd-dim", 2, 37, 33, 16, F, F, "var4", "var4")  # tail block
    # grids of >= 132 blocks: the default tiles (the small-grid plan covers most cases above)
    S("default-plan-bf16", 5, 860, 61, 16, BF, BF, "var4", "var4")
    S("default-plan-fp16", 5, 860, 45, 16, H, H, "var3", "var3", has_init=True)
    S("default-plan-fp32", 5, 860, 33, 16, F, F, "var4", "var4")
    # options on/off
    S(
        "noopts",
        2,
        64,
        70,
        16,
        BF,
        BF,
        "var4",
        "var4",
        softplus=False,
        has_D=False,
        has_z=False,
        has_bias=False,
    )
    S(
        "noopts-fp32",
        2,
        64,
        70,
        16,
        F,
        F,
        "var4",
        "var4",
        softplus=False,
        has_D=False,
        has_z=False,
        has_bias=False,
    )
    S("D-only", 1, 64, 31, 16, H, F, "var4", "var4", softplus=False, has_z=False, has_bias=False)
    S("z-only", 1, 64, 31, 16, BF, F, "var4", "var4", softplus=False, has_D=False, has_bias=False)
    S("init", 2, 64, 60, 16, F, F, "var4", "var4", has_init=True)
    S("init-bf16", 2, 64, 60, 16, BF, BF, "var4", "var4", has_init=True)
    # dstate
    for n in (1, 4, 16, 64, 256):
        S(f"dstate{n}", 2, 48, 70, n, BF, F, "var4", "var4", has_init=True)
        S(f"dstate{n}-fixed", 1, 48, 45, n, F, F, "fixed", "fixed")
    for n in (3, 10, 100):
        S(f"dstate{n}-pad", 1, 40, 37, n, F, F, "var4", "var4", has_init=True)
    for n in (2, 8, 32):
        S(f"dstate{n}", 2, 40, 83, n, H, F, "var4", "var4", has_init=True)
        S(f"dstate{n}-chunks", 1, 40, 700, n, BF, BF, "var4", "fixed", has_init=True, nchunks=3)
    # seqlens
    for L in (1, 2, 7, 60, 64, 2047, 4096):
        S(f"seqlen{L}", 2, 64, L, 16, BF, F, "var4", "var4")
        S(f"seqlen{L}-fp32", 1, 64, L, 16, F, F, "var4", "var4", has_init=True)
    S("seqlen4096-unchunked", 2, 64, 4096, 16, BF, F, "var4", "var4", has_init=True, nchunks=1)
    S("seqlen100000", 1, 40, 100000, 16, BF, F, "var4", "var4", has_init=True)
    S("seqlen100000-fp32", 1, 32, 100000, 16, F, F, "fixed", "var4")
    # unaligned / strided rows
    S("unaligned-bf16", 2, 48, 61, 16, BF, BF, "var4", "var4", pad_rows=1)
    S("stride8B-bf16", 2, 48, 64, 16, BF, BF, "var4", "var4", pad_rows=4)
    S("unaligned-fp32", 2, 48, 61, 16, F, F, "var4", "var4", pad_rows=3)
    # forced chunking (small seqlen per chunk) vs reference
    for nch in (2, 3, 7):
        S(f"chunks{nch}", 2, 64, 1000, 16, F, F, "var4", "var4", has_init=True, nchunks=nch)
    S("chunks5-bf16", 1, 64, 3001, 16, BF, BF, "var4", "fixed", nchunks=5, has_init=True)
    S("chunks4-n64", 1, 48, 999, 64, F, F, "var4", "var4", nchunks=4)
    S("chunks3-nosp", 1, 64, 777, 16, H, F, "var4", "var4", nchunks=3, softplus=False)
    # stream
    cases.append(("stream", "stream-fp32", (1, 64, 1000, 16, F, (1, 64, 517)), {}))
    cases.append(("stream", "stream-bf16", (2, 48, 2047, 16, BF, (600, 1400)), {}))
    # state update
    U = lambda name, *a, **k: cases.append(("su", name, a, k))
    for code in (F, H, BF):
        U("dtypes", 4, 1, 96, 16, code, F, heads=False)
        U("dtypes-heads", 2, 4, 48, 16, code, code, ngroups=2)
    for n in (1, 4, 16, 64, 256):
        U(f"dstate{n}", 3, 2, 40, n, BF, F, ngroups=1)
    U(
        "noopts",
        4,
        1,
        64,
        16,
        BF,
        BF,
        heads=False,
        softplus=False,
        has_D=False,
        has_z=False,
        has_bias=False,
    )
    U("strided", 2, 2, 33, 16, F, F, strided=True)
    U("strided-noheads", 2, 1, 33, 16, BF, BF, heads=False, strided=True)
    for bpt in (1, 2, 4):  # batch rows per thread, tails (batch % bpt != 0) included
        U(f"bpt{bpt}", 5, 1, 96, 16, BF, BF, heads=False, bpt=bpt)
        U(f"bpt{bpt}-heads", 7, 3, 40, 64, F, F, ngroups=3, bpt=bpt)
        U(f"bpt{bpt}-strided", 6, 2, 33, 16, H, F, strided=True, bpt=bpt)
        U(f"bpt{bpt}-n256", 3, 1, 20, 256, BF, F, heads=False, bpt=bpt)
    if quick:
        cases = [c for c in cases if "100000" not in c[1]]
    return cases


TUNES = [
    dict(nsplit=4, cpt=1, tile=32),
    dict(nsplit=8, cpt=2, tile=16),
    dict(nsplit=8, cpt=2, tile=32),
    dict(nsplit=4, cpt=2, tile=32),
]


def run_tune_tests(res):
    """The variants the benchmark compares, each on a few cases (the full matrix runs the default plan)."""
    F, BF = DT_FP32, DT_BF16
    for tune in TUNES:
        run_scan_case(res, "tune", 2, 64, 60, 16, BF, BF, "var4", "var4", tune=tune)
        run_scan_case(
            res, "tune", 1, 37, 777, 16, F, F, "var4", "var3", has_init=True, nchunks=3, tune=tune
        )
        run_scan_case(
            res, "tune", 2, 24, 101, 16, BF, F, "var4", "fixed", ngroups=3, pad_rows=1, tune=tune
        )


def run_tests(quick=False):
    res = Results()
    t0 = time.time()
    for kind, name, a, k in test_matrix(quick):
        try:
            if kind == "scan":
                run_scan_case(res, name, *a, **k)
            elif kind == "stream":
                run_stream_case(res, name, *a[:5], a[5])
            else:
                run_su_case(res, name, *a, **k)
        except Exception as e:  # keep going: one failure must not hide the others
            import traceback

            traceback.print_exc()
            res.add(f"{kind} {name}", False, f"exception {type(e).__name__}: {e}")
    run_tune_tests(res)
    print(
        f"\n{len(res.rows) - res.fails} passed, {res.fails} failed  ({time.time() - t0:.1f} s)",
        flush=True,
    )
    return res


# ----------------------------------------------------------------------------------------------- bench
HBM_BPS = 3.0e12  # measured device copy on this H100 (read + write)
SM_COUNT = 132
CLOCK_HZ = 1.755e9  # H100 SXM sustained SM clock (boost 1.98 GHz)
MUFU_PER_CLK_SM = 16


def gpu_time_us(fn, n_inner=20, reps=7):
    """Median GPU time of fn() in us: n_inner calls captured in a CUDA graph, replayed reps times."""
    torch = _torch()
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n_inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / n_inner)
    return float(np.median(times))


def bench_scan(
    name,
    batch,
    dim,
    seqlen,
    dstate,
    code,
    bc_code=None,
    anchor_us=None,
    nchunks=None,
    poly=None,
    rotate=True,
    n_inner=20,
    tune=None,
    src="selective_scan.cu",
):
    torch = _torch()
    bc_code = code if bc_code is None else bc_code
    es, bes = DT_BYTES[code], DT_BYTES[bc_code]
    nbytes = batch * dim * seqlen * es * 4 + 2 * batch * dstate * seqlen * bes
    nsets = max(1, min(8, _cdiv(int(200e6), nbytes))) if rotate else 1
    sets = [
        make_scan_inputs(
            batch, dim, seqlen, dstate, code, bc_code, "var4", "var4", 1, seed=i, on_gpu=True
        )
        for i in range(nsets)
    ]
    outs = [torch.empty_like(s_["u"]) for s_ in sets]
    keep = []
    it = [0]
    calls = []
    for i, s_ in enumerate(sets):
        calls.append(
            lambda s_=s_, o=outs[i]: selective_scan(
                s_["u"],
                s_["delta"],
                s_["A"],
                s_["B"],
                s_["C"],
                s_["D"],
                s_["z"],
                s_["delta_bias"],
                True,
                out=o,
                nchunks=nchunks,
                poly_num=poly,
                tune=tune,
                _cache=keep,
                src=src,
            )
        )

    def fn():
        calls[it[0] % nsets]()
        it[0] += 1

    t = gpu_time_us(fn, n_inner=max(n_inner, nsets), reps=5)
    nexp = batch * dim * seqlen * dstate
    plan = plan_scan(
        batch, dim, seqlen, dstate, 1, code, bc_code, True, True, nchunks=nchunks, tune=tune
    )
    t_mem = nbytes / HBM_BPS * 1e6
    t_exp = nexp / (MUFU_PER_CLK_SM * SM_COUNT * CLOCK_HZ) * 1e6
    row = (
        f"scan {name:<34s} {t:9.1f} us  {nbytes / t / 1e3:7.0f} GB/s  floor max(mem {t_mem:.1f}, exp {t_exp:.1f}) us"
        f"  nch={plan['nchunks']} poly={SCAN_POLY_NUM if poly is None else poly}"
        f" split={plan['defines']['FS_NSPLIT']} cpt={plan['defines']['FS_CPT']} T={plan['defines']['FS_TILE_T']}"
        + (f"  mamba {anchor_us} us -> {anchor_us / t:.1f}x" if anchor_us else "")
    )
    print(row, flush=True)
    del keep[:]
    return row


def bench_su(
    name, batch, nheads, dim, dstate, code, anchor_us=None, bpt=None, src="state_update.cu"
):
    torch = _torch()
    heads = nheads > 1
    H = nheads
    nbytes = (
        batch * H * dim * dstate * 4 * 2
        + batch * H * dim * DT_BYTES[code] * 4
        + H * dim * dstate * 4
    )
    nsets = max(1, min(8, _cdiv(int(200e6), nbytes)))
    sets = []
    for i in range(nsets):
        shp = (batch, H, dim) if heads else (batch, dim)
        st = torch.randn(
            *((batch, H, dim, dstate) if heads else (batch, dim, dstate)), device="cuda"
        )
        x = torch.randn(*shp, device="cuda").to(_tdt(code))
        dt = (0.5 * torch.rand(*shp, device="cuda")).to(_tdt(code))
        A = -0.5 * torch.rand(*((H, dim, dstate) if heads else (dim, dstate)), device="cuda")
        B = torch.randn(*((batch, 1, dstate) if heads else (batch, dstate)), device="cuda").to(
            _tdt(code)
        )
        C = torch.randn_like(B)
        ps = (H, dim) if heads else (dim,)
        sets.append(
            (
                st,
                x,
                dt,
                A,
                B,
                C,
                torch.randn(*ps, device="cuda"),
                torch.randn_like(x),
                torch.rand(*ps, device="cuda"),
                torch.empty_like(x),
            )
        )
    it = [0]

    def fn():
        s_ = sets[it[0] % nsets]
        selective_state_update(*s_[:9], dt_softplus=True, out=s_[9], bpt=bpt, src=src)
        it[0] += 1

    t = gpu_time_us(fn, n_inner=max(20, nsets), reps=5)
    # host-side cost of one call through this ctypes path (not the Rust path)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    host = (time.perf_counter() - t0) / 200 * 1e6
    row = (
        f"state_update {name:<26s} {t:9.1f} us  {nbytes / t / 1e3:7.0f} GB/s ({nbytes / t / 1e3 / (HBM_BPS / 1e9) * 100:.0f}% of copy bw)"
        f"  floor {nbytes / HBM_BPS * 1e6:.1f} us  ctypes-call {host:.0f} us"
        + (f"  triton {anchor_us} us (from Python)" if anchor_us else "")
    )
    print(row, flush=True)
    return row


def run_bench():
    rows = []
    B = rows.append
    F, BF = DT_FP32, DT_BF16
    B(bench_scan("game b32 d512 L60 n16 fp32", 32, 512, 60, 16, F, anchor_us=86))
    B(bench_scan("game b32 d512 L60 n16 bf16", 32, 512, 60, 16, BF, anchor_us=86))
    B(bench_scan("game b32 bf16 (L2-hot)", 32, 512, 60, 16, BF, rotate=False))
    B(bench_scan("game b1 d512 L60 n16 bf16", 1, 512, 60, 16, BF, anchor_us=20))
    for poly in (0, 1):
        B(
            bench_scan(
                f"b8 d2048 L2048 bf16 poly{poly}",
                8,
                2048,
                2048,
                16,
                BF,
                anchor_us=594,
                poly=poly,
                n_inner=5,
            )
        )
    for tune in TUNES:
        for poly in (0, 1):
            B(
                bench_scan(
                    f"b8 d2048 L2048 bf16 poly{poly} tuned",
                    8,
                    2048,
                    2048,
                    16,
                    BF,
                    poly=poly,
                    n_inner=5,
                    tune=tune,
                )
            )
        B(bench_scan("game b32 bf16 tuned", 32, 512, 60, 16, BF, tune=tune))
    B(bench_scan("b8 d2048 L2048 fp32", 8, 2048, 2048, 16, F, n_inner=5))
    B(bench_scan("b8 d2048 L8192 bf16", 8, 2048, 8192, 16, BF, anchor_us=2800, n_inner=3))
    for nch in (1, 2):
        B(
            bench_scan(
                f"b2 d5120 L16384 bf16 nch{nch}",
                2,
                5120,
                16384,
                16,
                BF,
                anchor_us=3700,
                nchunks=nch,
                n_inner=3,
            )
        )
    for nch in (16, 32, None):
        B(
            bench_scan(
                f"b1 d1024 L65536 bf16 nch{nch or 'auto'}",
                1,
                1024,
                65536,
                16,
                BF,
                nchunks=nch,
                n_inner=3,
            )
        )
    for nch in (1, 4, 8, None):
        B(
            bench_scan(
                f"b1 d4096 L32768 bf16 nch{nch or 'auto'}",
                1,
                4096,
                32768,
                16,
                BF,
                nchunks=nch,
                n_inner=3,
            )
        )
    B(bench_scan("b1 d512 L1000000 bf16 auto", 1, 512, 1000000, 16, BF, n_inner=2))
    B(bench_su("b32 d512 n16 fp32-x", 32, 1, 512, 16, F, anchor_us=110))
    B(bench_su("b32 d512 n16 bf16-x", 32, 1, 512, 16, BF, anchor_us=110))
    B(bench_su("b64 d5120 n16 bf16-x", 64, 1, 5120, 16, BF, anchor_us=123))
    B(bench_su("b64 d5120 n16 fp32-x", 64, 1, 5120, 16, F, anchor_us=123))
    B(bench_su("b64 h80 d64 n128 bf16", 64, 80, 64, 128, BF))
    print("\n".join(["", "== bench =="] + rows), flush=True)


# ----------------------------------------------------------------------------------------------- compile-only


def compile_all():
    """Compile every variant the tests and benches use (no GPU); print registers / spills per entry."""
    variants = all_variants()
    t0 = time.time()
    for (src, _), d in sorted(variants.items(), key=lambda kv: str(kv[0])):
        t1 = time.time()
        _, path = compile_cubin(src, d)
        ru = resource_usage(path)
        short = {
            k.replace("FS_", ""): v
            for k, v in d.items()
            if k not in ("FS_ARCH", "FS_THREADS", "FS_TILE_T")
        }
        for fn, kv in ru.items():
            print(
                f"{src:18s} {fn:28s} REG {kv.get('REG', '?'):>3s} STACK {kv.get('STACK', '?'):>4s} "
                f"SHARED {kv.get('SHARED', '?'):>5s} LOCAL {kv.get('LOCAL', '?'):>3s}  {short}  ({time.time() - t1:.1f}s)"
            )
    print(f"{len(variants)} variants in {time.time() - t0:.1f} s; cubins in {CUBIN_DIR}")


def _compile_one(item):
    try:
        compile_cubin(item[0], item[1])
    except Exception as e:  # reported by the caller
        return f"{item}: {e}"
    return None


def precompile(jobs=16):
    """Compile every variant of all_variants() in parallel processes (fills the cubin cache)."""
    from multiprocessing import Pool

    items = [(src, d) for (src, _), d in all_variants().items()]
    with Pool(jobs) as pool:
        errs = [e for e in pool.map(_compile_one, items) if e]
    print(f"precompiled {len(items)} variants, {len(errs)} errors", flush=True)
    for e in errs[:5]:
        print(e, flush=True)


def all_variants():
    """{(source, defines key): defines} of every kernel variant the tests and benches use."""
    variants = {}
    for kind, name, a, k in test_matrix():
        if kind == "scan":
            batch, dim, seqlen, dstate, code, bc, bf, cf = a[:8]
            g = k.get("ngroups", 1)
            plan = plan_scan(
                batch,
                dim,
                seqlen,
                dstate,
                g,
                code,
                bc,
                bf != "fixed",
                cf != "fixed",
                nchunks=k.get("nchunks"),
            )
            variants[("selective_scan.cu", tuple(sorted(plan["defines"].items())))] = plan[
                "defines"
            ]
        elif kind == "stream":
            plan = plan_scan(1, 64, 100, a[3], 2, a[4], DT_FP32, True, True)
            variants[("selective_scan.cu", tuple(sorted(plan["defines"].items())))] = plan[
                "defines"
            ]
        else:
            batch, nheads, dim, dstate, code, bc = a[:6]
            plan = plan_state_update(batch, nheads, dim, dstate, code, bc, bpt=k.get("bpt"))
            variants[("state_update.cu", tuple(sorted(plan["defines"].items())))] = plan["defines"]
    for code in (DT_FP32, DT_BF16):
        for poly in (0, 1):
            for tune in [None] + TUNES:
                for bc, bf, cf in (
                    (code, True, True),
                    (DT_FP32, True, True),
                    (DT_FP32, True, False),
                ):
                    plan = plan_scan(
                        8, 2048, 2048, 16, 1, code, bc, bf, cf, poly_num=poly, tune=tune
                    )
                    variants[("selective_scan.cu", tuple(sorted(plan["defines"].items())))] = plan[
                        "defines"
                    ]
    for code in (DT_FP32, DT_BF16):
        plan = plan_state_update(64, 1, 5120, 16, code, code)
        variants[("state_update.cu", tuple(sorted(plan["defines"].items())))] = plan["defines"]
        plan = plan_state_update(64, 80, 64, 128, code, code)
        variants[("state_update.cu", tuple(sorted(plan["defines"].items())))] = plan["defines"]
    for code in (DT_FP32, DT_BF16):
        for bpt in (1, 2, 4):
            for n in (16, 128):
                plan = plan_state_update(64, 1, 5120, n, code, code, bpt=bpt)
                variants[("state_update.cu", tuple(sorted(plan["defines"].items())))] = plan[
                    "defines"
                ]
    return variants


def run_sanitize_cases():
    """Tiny shapes for compute-sanitizer (memcheck / racecheck): every code path, little work."""
    res = Results()
    F, H, BF = DT_FP32, DT_FP16, DT_BF16
    run_scan_case(res, "san", 1, 40, 100, 16, BF, F, "var4", "var4", has_init=True)
    run_scan_case(res, "san-chunks", 1, 40, 300, 16, F, F, "var4", "var3", has_init=True, nchunks=3)
    run_scan_case(res, "san-fixed", 1, 37, 33, 16, BF, BF, "fixed", "fixed", pad_rows=1)
    run_scan_case(res, "san-n256", 1, 20, 40, 256, F, F, "var4", "var4")
    run_scan_case(res, "san-n1", 1, 20, 40, 1, BF, F, "var4", "fixed")
    run_scan_case(res, "san-n8", 1, 20, 40, 8, H, F, "var4", "var4", nchunks=2)
    run_scan_case(res, "san-n64", 1, 20, 70, 64, BF, BF, "var4", "var4", nchunks=2)
    run_su_case(res, "san", 2, 2, 40, 16, BF, F)
    run_su_case(res, "san-strided", 2, 1, 33, 16, F, F, heads=False, strided=True)
    run_scan_case(res, "san-packed-bf16", 2, 24, 45, 16, BF, BF, "var4", "var4", pad_rows=1)
    run_scan_case(res, "san-packed-fp16-n64", 1, 20, 37, 64, H, H, "var3", "var3", has_init=True)
    run_su_case(res, "san-bpt2", 5, 1, 40, 16, BF, BF, heads=False, bpt=2)
    run_su_case(res, "san-bpt4", 6, 2, 33, 16, F, F, strided=True, bpt=4)
    print(f"{len(res.rows) - res.fails} passed, {res.fails} failed", flush=True)
    return res


def main():
    np.seterr(all="ignore")
    args = sys.argv[1:] or ["all"]
    if args[0] == "compile":
        compile_all()
        return
    if args[0] == "precompile":
        precompile()
        return
    torch = _torch()
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # primary context current on this thread
    print(f"device: {torch.cuda.get_device_name()}  nvrtc: {_find_nvrtc()[1]}", flush=True)
    fails = 0
    if args[0] in ("test", "all"):
        fails = run_tests(quick="--quick" in args).fails
    if args[0] == "sanitize":
        fails = run_sanitize_cases().fails
    if args[0] == "profile":  # under ncu: a few launches of the main shape (default plan)
        s_ = make_scan_inputs(8, 2048, 2048, 16, DT_BF16, DT_BF16, "var4", "var4", 1, on_gpu=True)
        for _ in range(4):
            selective_scan(
                s_["u"],
                s_["delta"],
                s_["A"],
                s_["B"],
                s_["C"],
                s_["D"],
                s_["z"],
                s_["delta_bias"],
                True,
            )
        torch.cuda.synchronize()
    if args[0] in ("bench", "all"):
        run_bench()
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
