"""Type stubs for `flashscan._native`, the Rust core (PyO3).

The Rust core knows nothing of torch/cupy/jax: tensors reach it either as an object that
speaks DLPack (`__dlpack__` / `__dlpack_device__`), as a DLPack capsule, or as a plain
descriptor tuple (the fast path the Python layer builds for torch tensors, where calling
`__dlpack__` would cost microseconds per tensor):

    (data_ptr: int, shape: tuple[int, ...], strides: tuple[int, ...] (in elements),
     dtype: str, device_type: int (1 = CPU, 2 = CUDA), device_id: int)

dtype strings: "float16", "bfloat16", "float32", "float64", and "int32" (index tensors).

`stream` is the raw CUstream handle of the caller's current stream (torch / cupy), launched
on with no host synchronisation. `stream=None` means: use flashscan's own non-blocking stream
for that device and synchronise it before returning (for frameworks with no stream notion,
such as jax).
"""

from typing import Any, Callable

TensorArg = object | tuple[int, tuple[int, ...], tuple[int, ...], str, int, int]

class FlashscanError(Exception):
    """Base class of every flashscan error."""

class UnsupportedError(FlashscanError):
    """A valid request this build or GPU cannot serve (head dim > 256, GPU below sm_80...)."""

class CompileError(FlashscanError):
    """NVRTC rejected a kernel; `args[1]` (and the message) holds the NVRTC log."""

class CudaError(FlashscanError):
    """A CUDA driver call failed (message names the call and the CUresult)."""

def version() -> str: ...
def backend_status() -> dict[str, Any]:
    """Lazily initialises the CUDA backend (driver + NVRTC) and reports:
    {"available": bool, "reason": str | None,
     "driver_version": int | None, "driver_path": str | None,
     "nvrtc_version": tuple[int, int] | None, "nvrtc_path": str | None,
     "devices": [{"index": int, "name": str, "compute_capability": (int, int),
                  "arch": str, "supported": bool, "sm_count": int}],
     "cache_dir": str}
    Never raises for a missing GPU/driver/NVRTC: available is False and reason says why."""

def describe(x: TensorArg) -> dict[str, Any]:
    """Imports `x` through DLPack (or the descriptor tuple) and returns
    {"device_type": int, "device_id": int, "dtype": str, "shape": tuple, "strides": tuple,
     "data_ptr": int, "readonly": bool, "byte_offset": int, "versioned": bool}."""

def empty(shape: tuple[int, ...], dtype: str, device_id: int, stream: int | None) -> object:
    """A new CUDA buffer owned by flashscan, returned as an object with `__dlpack__` and
    `__dlpack_device__` (for frameworks, like jax, that have no `empty` we can call)."""

def flash_attn_fwd(
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    out: TensorArg,
    lse: TensorArg | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    stream: int | None,
) -> None:
    """q (b, sq, h, d), k/v (b, sk, hk, d), out like q, lse (b, h, sq) float32 or None.
    window_left/right: -1 = unbounded; causal is window_right = 0 (bottom-right aligned)."""

def flash_attn_fwd_fp8(
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    out: TensorArg,
    lse: TensorArg | None,
    q_descale: TensorArg | None,
    k_descale: TensorArg | None,
    v_descale: TensorArg | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    stream: int | None,
) -> None:
    """The FP8 forward (sm_90): q (b, sq, h, d), k/v (b, sk, hk, d) float8_e4m3fn with d a
    multiple of 16 up to 128, out like q in bfloat16, lse (b, h, sq) float32 or None; descales
    float32 (b, hk) or broadcastable, None = 1."""

def kvcache_append(
    k_new: TensorArg | None,
    v_new: TensorArg | None,
    k_cache: TensorArg,
    v_cache: TensorArg,
    cache_seqlens: TensorArg,
    cache_batch_idx: TensorArg | None,
    cache_leftpad: TensorArg | None,
    block_table: TensorArg | None,
    rotary_cos: TensorArg | None,
    rotary_sin: TensorArg | None,
    rotary_interleaved: bool,
    q: TensorArg | None,
    q_rot: TensorArg | None,
    stream: int | None,
) -> None:
    """Writes k_new / v_new (batch, seqlen_new, nheads_k, d) into the cache in place at slots
    cache_seqlens[b] + i (int32 (batch,); not updated), through block_table (int32 (batch,
    max_blocks)) for a paged cache (num_blocks, block_size, nheads_k, d) or cache_batch_idx for a
    contiguous one (batch_cache, seqlen_cache, nheads_k, d). With rotary_cos / rotary_sin
    (seqlen_ro, rotary_dim / 2; q's dtype or float32) k_new is rotated at position
    cache_seqlens[b] + i - cache_leftpad[b] and q (batch, seqlen_q, nheads, d) at
    cache_seqlens[b] - cache_leftpad[b] + i into q_rot (q itself is not modified; without rotary
    q is copied). k_new/v_new, q/q_rot, cos/sin are None only in pairs. fp16 / bf16.
    Device index values are validated in the kernel: a slot past the capacity, a bad block id or
    cache row is never written; a rotary position outside [0, seqlen_ro) gives NaN."""

def flash_attn_kvcache(
    q: TensorArg,
    k_cache: TensorArg,
    v_cache: TensorArg,
    out: TensorArg,
    lse: TensorArg | None,
    seqlens_k: TensorArg,
    cache_batch_idx: TensorArg | None,
    cache_leftpad: TensorArg | None,
    block_table: TensorArg | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    num_splits: int,
    stream: int | None,
    seqlens_k_add: int = 0,
) -> None:
    """Attention of q (batch, seqlen_q, nheads, d) over keys [cache_leftpad[b], seqlens_k[b]) of
    each sequence's cache (layouts as kvcache_append), bottom-right aligned (query i at key
    position seqlens_k[b] - seqlen_q + i); window -1 = unbounded, causal is window_right = 0.
    out like q; lse (batch, nheads, seqlen_q) float32 or None. A query that sees no key gets out 0,
    lse -inf. num_splits: 0 = heuristic, >= 1 forced (clamped to the key blocks of the cache
    capacity and to 128); split partials live in stream-ordered scratch (graph-capturable).
    fp16 / bf16 (float32 raises UnsupportedError); head dims multiples of 8 up to 256.
    A seqlens_k past the capacity is clamped; a bad block id or cache row is never read and
    makes that sequence's out / lse NaN. seqlens_k_add (>= 0) is added to every seqlens_k[b] on
    the device: after an append of n keys at cache_seqlens, pass cache_seqlens and n."""

def selective_scan_fwd(
    u: TensorArg,
    delta: TensorArg,
    A: TensorArg,
    B: TensorArg,
    C: TensorArg,
    D: TensorArg | None,
    z: TensorArg | None,
    delta_bias: TensorArg | None,
    initial_state: TensorArg | None,
    out: TensorArg,
    last_state: TensorArg | None,
    delta_softplus: bool,
    stream: int | None,
    saved_states: TensorArg | None = None,
    replay: bool = False,
) -> ScanFwdReplay | None:
    """The scan forward, launched; with replay=True checked and planned but not launched:
    returns the call's ScanFwdReplay (None where it is not one launch)."""

class ScanServer:
    """`selective_scan_fn`'s planned torch signatures served in one native call: torch
    tensors read through torch's DLPack C exchange table, the replay plan found by signature,
    out allocated through torch, launched on torch's current stream."""

    def __init__(self, tensor: type, grad_enabled: Callable[[], bool], float32: Any) -> None: ...
    def serve(
        self,
        u: Any,
        delta: Any,
        A: Any,
        B: Any,
        C: Any,
        D: Any,
        z: Any,
        delta_bias: Any,
        initial_state: Any,
        delta_softplus: Any,
        return_last_state: Any,
        learn: bool,
    ) -> Any | None:
        """out (or (out, last_state)) when the call's signature is planned (with learn:
        planned now when the native checks pass); None when it does not serve the call."""

    def plan_count(self) -> int:
        """Signatures held, refused ones included (tests)."""

class StateUpdateServer:
    """`selective_state_update`'s planned torch signatures served in one native call (the
    op's checks run on every call: the state is written in place)."""

    def __init__(self, tensor: type) -> None: ...
    def serve(
        self,
        state: Any,
        x: Any,
        dt: Any,
        A: Any,
        B: Any,
        C: Any,
        D: Any,
        z: Any,
        dt_bias: Any,
        dt_softplus: Any,
        learn: bool,
    ) -> Any | None:
        """out when the call's signature is planned (with learn: planned now); None when it
        does not serve the call."""

    def plan_count(self) -> int:
        """Signatures held, refused ones included (tests)."""

class ConvUpdateServer:
    """`causal_conv1d_update`'s checked torch signatures served in one native call (the op's
    checks run on every call: conv_state is written in place)."""

    def __init__(self, tensor: type) -> None: ...
    def serve(
        self,
        x: Any,
        conv_state: Any,
        weight: Any,
        bias: Any,
        cache_seqlens: Any,
        activation: Any,
        learn: bool,
    ) -> Any | None:
        """out when the call's signature is planned (with learn: planned now); None when it
        does not serve the call."""

    def plan_count(self) -> int:
        """Signatures held, refused ones included (tests)."""

class SsdServer:
    """`mamba_chunk_scan_combined`'s planned torch signatures served in one native call (no
    autograd, no varlen states; the op's checks on every call; workspaces from the device's
    stream-ordered pool)."""

    def __init__(self, tensor: type, grad_enabled: Callable[[], bool], float32: Any) -> None: ...
    def serve(
        self,
        x: Any,
        dt: Any,
        A: Any,
        B: Any,
        C: Any,
        chunk_size: Any,
        D: Any,
        z: Any,
        dt_bias: Any,
        initial_states: Any,
        seq_idx: Any,
        cu_seqlens: Any,
        dt_softplus: Any,
        dt_limit: Any,
        return_final_states: Any,
        return_varlen_states: Any,
        learn: bool,
    ) -> Any | None:
        """out or (out, final_states) when the call's signature is planned (with learn:
        planned now); None when it does not serve the call."""

    def plan_count(self) -> int:
        """Signatures held, refused ones included (tests)."""

def torch_exchange_read(
    t: Any,
) -> tuple[int, list[int], list[int], tuple[int, int, int], int, int] | None:
    """A torch tensor read through torch's DLPack C exchange table: (pointer, shape, strides,
    (dtype code, bits, lanes), device type, device id); None where torch has no table."""

class ScanFwdReplay:
    """A checked one-launch scan forward of one signature (shapes, strides, dtypes, device,
    which optionals are given, flags), replayed on raw pointers of tensors of that signature:
    no descriptors, no checks but the pointers' presence and element alignment."""

    def launch(
        self,
        u: int,
        delta: int,
        A: int,
        B: int,
        C: int,
        D: int,
        z: int,
        delta_bias: int,
        initial_state: int,
        out: int,
        last_state: int,
        saved_states: int,
        stream: int | None,
    ) -> None: ...

class ScanBwdReplay:
    """A checked scan backward of one signature, replayed on raw pointers (selective_scan_bwd's
    argument order, 0 for an absent optional)."""

    def launch(
        self,
        u: int,
        delta: int,
        A: int,
        B: int,
        C: int,
        D: int,
        z: int,
        delta_bias: int,
        initial_state: int,
        dout: int,
        saved_states: int,
        dlast_state: int,
        du: int,
        ddelta: int,
        dA: int,
        dB: int,
        dC: int,
        dD: int,
        dz: int,
        ddelta_bias: int,
        dinitial_state: int,
        stream: int | None,
    ) -> None: ...

def scan_saved_state_count(seqlen: int) -> int: ...
def flash_attn_bwd(
    dout: TensorArg,
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    out: TensorArg,
    lse: TensorArg,
    dq: TensorArg,
    dk: TensorArg,
    dv: TensorArg,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    stream: int | None,
) -> None: ...
def flash_attn_varlen_fwd(
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    cu_seqlens_q: TensorArg,
    cu_seqlens_k: TensorArg,
    out: TensorArg,
    lse: TensorArg | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    stream: int | None,
) -> None:
    """Attention over packed sequences: q/out (total_q, nheads, hd), k/v (total_k, nheads_k,
    hd), cu_seqlens int32 (batch + 1,) on the device (row bounds clamped into [0, total]),
    lse (nheads, total_q) float32 or None; out and lse written in place."""

def flash_attn_varlen_bwd(
    dout: TensorArg,
    q: TensorArg,
    k: TensorArg,
    v: TensorArg,
    out: TensorArg,
    lse: TensorArg,
    dq: TensorArg,
    dk: TensorArg,
    dv: TensorArg,
    cu_seqlens_q: TensorArg,
    cu_seqlens_k: TensorArg,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    stream: int | None,
) -> None:
    """The backward of flash_attn_varlen_fwd: dq, dk, dv written in place."""

def selective_scan_bwd(
    u: TensorArg,
    delta: TensorArg,
    A: TensorArg,
    B: TensorArg,
    C: TensorArg,
    D: TensorArg | None,
    z: TensorArg | None,
    delta_bias: TensorArg | None,
    initial_state: TensorArg | None,
    dout: TensorArg,
    saved_states: TensorArg | None,
    dlast_state: TensorArg | None,
    du: TensorArg,
    ddelta: TensorArg,
    dA: TensorArg,
    dB: TensorArg,
    dC: TensorArg,
    dD: TensorArg | None,
    dz: TensorArg | None,
    ddelta_bias: TensorArg | None,
    dinitial_state: TensorArg | None,
    delta_softplus: bool,
    stream: int | None,
    replay: bool = False,
) -> ScanBwdReplay | None:
    """The scan's backward: every gradient written in place (with replay=True: checked and
    planned, not launched; returns the call's ScanBwdReplay, None for an empty problem). dA,
    dD, ddelta_bias, dinitial_state float32; dB / dC float32 or B's dtype (a 16-bit dB / dC
    is summed in float32 scratch and rounded once); du, ddelta, dz in u's dtype."""

def selective_state_update(
    state: TensorArg,
    x: TensorArg,
    dt: TensorArg,
    A: TensorArg,
    B: TensorArg,
    C: TensorArg,
    D: TensorArg | None,
    z: TensorArg | None,
    dt_bias: TensorArg | None,
    out: TensorArg,
    dt_softplus: bool,
    stream: int | None,
) -> None: ...
def ssd_fwd(
    x: TensorArg,
    dt: TensorArg,
    A: TensorArg,
    B: TensorArg,
    C: TensorArg,
    D: TensorArg | None,
    z: TensorArg | None,
    dt_bias: TensorArg | None,
    initial_states: TensorArg | None,
    seq_idx: TensorArg | None,
    out: TensorArg,
    final_states: TensorArg | None,
    states: TensorArg,
    decay: TensorArg,
    chunk_size: int,
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
    stream: int | None,
    cb: TensorArg | None = None,
    states16: TensorArg | None = None,
    cu_seqlens: TensorArg | None = None,
    varlen_states: TensorArg | None = None,
) -> None:
    """Mamba-2 SSD chunked scan forward into out (and final_states, float32). states
    (batch, nchunks, nheads, headdim, dstate) and decay (batch, nheads, nchunks) are float32
    contiguous workspaces; chunk_size 64, 128 or 256; B, C, z in x's dtype; seq_idx int32.
    cb (batch, nchunks, ngroups, chunk_size, chunk_size) float32 contiguous, when given,
    selects the second forward path for float16 / bfloat16 x (cuda/ssd_fwd2.cu). states16
    (like states, in x's dtype, contiguous; second path only): the 16-bit H_c written there,
    for `ssd_bwd`'s kept_states16 (with decay as kept_decay). cu_seqlens ((nseq + 1,) int32,
    checked by the caller: offsets from 0 to seqlen, seq_idx resetting where each sequence
    starts) with varlen_states ((nseq, nheads, headdim, dstate) float32; batch 1, second path):
    the state after each packed sequence."""

def ssd_bwd(
    x: TensorArg,
    dt: TensorArg,
    A: TensorArg,
    B: TensorArg,
    C: TensorArg,
    D: TensorArg | None,
    z: TensorArg | None,
    dt_bias: TensorArg | None,
    initial_states: TensorArg | None,
    seq_idx: TensorArg | None,
    dout: TensorArg,
    dfinal_states: TensorArg | None,
    dx: TensorArg,
    ddt: TensorArg,
    dA: TensorArg,
    dB: TensorArg,
    dC: TensorArg,
    dD: TensorArg | None,
    dz: TensorArg | None,
    ddt_bias: TensorArg | None,
    dinitial_states: TensorArg | None,
    chunk_size: int,
    dt_softplus: bool,
    dt_min: float,
    dt_max: float,
    stream: int | None,
    tf32: bool = False,
    kept_states16: TensorArg | None = None,
    kept_decay: TensorArg | None = None,
) -> None:
    """Mamba-2 SSD chunked scan backward: every gradient, each like its input (shape and
    dtype; dD, dz, ddt_bias, dinitial_states exactly when D, z, dt_bias, initial_states are
    given), from dout (like x) and dfinal_states ((batch, nheads, headdim, dstate), or None).
    The forward's chunk states are recomputed into stream-ordered fp32 scratch; no float
    atomics (bitwise deterministic). Inputs as `ssd_fwd` takes them. fp16 / bf16 x, B, C,
    dout run the 16-bit kernels on the call's own tensors: only where `ssd_bwd_16bit(z is
    not None)` says so (else UnsupportedError). tf32: float32 data copied from 16-bit tensors
    (exact in tf32), so the second backward path (the default; FLASHSCAN_SSD_BWD=1 takes the
    first) may round the operands of its products to tf32 once instead of 3xTF32.
    kept_states16 / kept_decay (both or neither; 16-bit calls): the forward's states16 and
    decay, read instead of recomputing the chunk states and the state passing."""

def ssd_bwd_16bit(has_z: bool) -> bool:
    """Whether `ssd_bwd` takes a 16-bit call's own fp16 / bf16 tensors (calls without z on
    the second path, unless FLASHSCAN_SSD_DX16=0) rather than float32 copies with tf32."""

def kernel_variants(arch: str = "sm_90a") -> list[dict[str, Any]]:
    """Every kernel variant the package can emit for `arch`: {"family": str, "name": str,
    "defines": dict[str, int], "entry": str, "main": bool} ("main" marks the variants that
    must show no local-memory spills)."""

def compile_variant(name: str, arch: str) -> bytes:
    """Compiles one variant (by name, from kernel_variants()) to a CUBIN for `arch`
    ("sm_80", "sm_90a", ...) with NVRTC alone: no GPU needed."""

def precompile(
    device_id: int,
    progress: Callable[[int, int, str], None] | None = None,
    all: bool = False,
    workers: int | None = None,
) -> int:
    """Compiles the common kernel variants (every variant with all=True) for the device's arch
    into the disk cache on `workers` threads (default: CPU count); returns how many were
    compiled (not already cached). progress(done, total, name) is called per variant."""

def precompile_arch(
    arch: str,
    progress: Callable[[int, int, str], None] | None = None,
    all: bool = False,
    workers: int | None = None,
    families: list[str] | None = None,
) -> int:
    """`precompile` for an arch named instead of a GPU: NVRTC alone compiles the common variants
    (every one with all=True; only `families` when given) into the disk cache, skipping intact
    entries; returns how many it compiled. A GPU process finds them under the same NVRTC
    major.minor. ValueError for an unknown family or arch."""

def cache_dir() -> str: ...

# ---- causal conv1d (src/conv_bindings.rs) ------------------------------------------------------
def causal_conv1d_fwd(
    x: TensorArg,
    weight: TensorArg,
    bias: TensorArg | None,
    initial_states: TensorArg | None,
    seq_idx: TensorArg | None,
    out: TensorArg,
    final_states: TensorArg | None,
    silu: bool,
    stream: int | None,
) -> None:
    """out = conv(x) (+ bias, SiLU); final_states = the last width - 1 inputs, when given.
    x / out: (batch, dim, seqlen), seqlen or dim stride 1 (the same for both)."""

def causal_conv1d_bwd(
    x: TensorArg,
    weight: TensorArg,
    bias: TensorArg | None,
    initial_states: TensorArg | None,
    seq_idx: TensorArg | None,
    dout: TensorArg,
    dfinal_states: TensorArg | None,
    dx: TensorArg,
    dweight: TensorArg,
    dbias: TensorArg | None,
    dinitial_states: TensorArg | None,
    silu: bool,
    stream: int | None,
) -> None:
    """Fills dx (laid out like x), dweight, dbias and dinitial_states (when given)."""

def causal_conv1d_update(
    x: TensorArg,
    conv_state: TensorArg,
    weight: TensorArg,
    bias: TensorArg | None,
    cache_seqlens: TensorArg | None,
    out: TensorArg,
    silu: bool,
    stream: int | None,
) -> None:
    """One decode step: out from x and conv_state; conv_state updated in place (a ring when
    cache_seqlens is given)."""

def xla_ffi_targets() -> dict[str, Any]:
    """The XLA typed-FFI handlers (flash_attn_fwd/bwd, selective_scan_fwd/bwd,
    selective_state_update) as PyCapsules of their function pointers, for
    `jax.ffi.register_ffi_target(name, capsule, platform="CUDA", api_version=1)`."""

def xla_ffi_api_version() -> tuple[int, int]:
    """The XLA FFI API version (major, minor) the handlers answer at the metadata stage."""
