//! Mamba-2 SSD chunked scan, forward (`mamba_chunk_scan_combined`): argument checks and the
//! three launches of `cuda/ssd.cu` (chunk states, state passing, chunk outputs) on one stream.
//! The caller provides the fp32 workspaces (chunk states, chunk decays) so that a call
//! allocates nothing here and stays graph-capturable.

use super::{ssd_scan_ws, ssd_state_pass};
use crate::error::{type_err, unsupported, value_err, Error, Result};
use crate::runtime::{runtime, DeviceCtx, KernelSpec, Stream, StreamChoice};
use crate::tensor::{common_cuda_device, expect_no_overlap, DType, TensorView};

pub const SOURCE: &str = include_str!("../../cuda/ssd.cu");
pub const FAMILY: &str = "ssd";
/// The second forward path (`cuda/ssd_fwd2.cu`, fp16 / bf16): C B^T once per group into the
/// `cb` workspace, cp.async + ldmatrix operands. Chosen when the caller passes `cb`
/// (python/flashscan/ssd.py does so for 16-bit x unless FLASHSCAN_SSD_FWD=1).
pub const SOURCE2: &str = include_str!("../../cuda/ssd_fwd2.cu");
pub const FAMILY2: &str = "ssd_fwd2";
pub const ENTRY2_CB: &str = "ssd2_chunk_cb";
pub const ENTRY2_STATE: &str = "ssd2_chunk_state";
pub const ENTRY2_PASS: &str = "ssd2_state_passing";
pub const ENTRY2_SCAN: &str = "ssd2_chunk_scan";
/// chunk_prologue (dt', cum, seg) once per (batch, head, chunk) into a scratch record that
/// ssd2_chunk_state and ssd2_chunk_scan load (every launch but `one_block`'s).
pub const ENTRY2_PREP: &str = "ssd2_chunk_prep";
/// ssd2_chunk_cb + ssd2_chunk_scan in one kernel for a single block of <= 64 positions
/// (`one_block`).
pub const ENTRY2_SCAN_ONE: &str = "ssd2_chunk_scan_one";
/// The states after each packed sequence (return_varlen_states): one CTA per (sequence, tile, head).
pub const ENTRY2_VARLEN: &str = "ssd2_varlen_states";
/// ssd2_chunk_state and ssd2_state_passing in one kernel on sm_90a (src/ops/ssd_state_pass.rs):
/// one CTA per (batch, head, tile) carries H through the chunks in its accumulator.
pub const ENTRY2_STATE_PASS: &str = "ssd2_chunk_state_pass";
/// ssd2_chunk_state's tile of states per CTA (channels x states: 64 x 128).
const STATE2_TILE_N: i64 = 128;
pub const ENTRY_STATE: &str = "ssd_chunk_state";
pub const ENTRY_PASS: &str = "ssd_state_passing";
pub const ENTRY_SCAN: &str = "ssd_chunk_scan";
/// Chunk sizes with a compiled variant (mamba_ssm's Mamba-2 uses 256).
pub const CHUNKS: [i64; 3] = [64, 128, 256];
pub const MAX_DSTATE: i64 = 256;
pub const MAX_HEADDIM: i64 = 256;
const THREADS: u32 = 128;
const PASS_THREADS: i64 = 256;
/// The chunk prologue's heads and threads a CTA (cuda/common/ssd.cuh kPrepHeads, kPrepThreads):
/// ssd2_chunk_prep and ssd_bwd_prologue.
pub(crate) const PREP_HEADS: i64 = 8;
pub(crate) const PREP_THREADS: u32 = 128;

/// The grid of the kernels on those 8-head CTAs (ssd2_chunk_prep, ssd_bwd_prologue,
/// ssd_bwd_dt): (nchunks, ceil(nheads / PREP_HEADS), batch).
pub(crate) fn head_block_grid(p: &Problem) -> Result<(u32, u32, u32)> {
    Ok((
        grid_u32(p.nchunks, "seqlen / chunk_size")?,
        grid_u32((p.nheads + PREP_HEADS - 1) / PREP_HEADS, "nheads")?,
        grid_u32(p.batch, "batch")?,
    ))
}
const TILE: i64 = 64;

/// Mirrors `struct SsdParams` in cuda/ssd.cu (488 bytes). Strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SsdParams {
    pub x: u64,
    pub dt: u64,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub z: u64,
    pub dt_bias: u64,
    pub init: u64,
    pub seq_idx: u64,
    pub out: u64,
    pub states: u64,
    pub decay: u64,
    pub final_states: u64,
    pub batch: i64,
    pub seqlen: i64,
    pub nheads: i64,
    pub headdim: i64,
    pub ngroups: i64,
    pub dstate: i64,
    pub nchunks: i64,
    pub x_s: [i64; 3],
    pub dt_s: [i64; 3],
    pub b_s: [i64; 3],
    pub c_s: [i64; 3],
    pub z_s: [i64; 3],
    pub out_s: [i64; 3],
    pub init_s: [i64; 4],
    pub final_s: [i64; 4],
    pub seq_s: [i64; 2],
    pub d_s: [i64; 2],
    pub a_s: i64,
    pub bias_s: i64,
    pub dt_min: f32,
    pub dt_max: f32,
    pub dt_dtype: i32,
    pub a_dtype: i32,
    pub d_dtype: i32,
    pub bias_dtype: i32,
    pub init_dtype: i32,
    /// 1: ssd_chunk_state may load x / B rows 16 bytes at a time (fp32, aligned rows; set by the
    /// backward's recompute only)
    pub vec_xb: i32,
    pub has_d: i32,
    pub has_z: i32,
    pub has_dt_bias: i32,
    pub has_init: i32,
    pub has_seq: i32,
    pub has_final: i32,
    pub softplus: i32,
    /// 1: ssd_chunk_state may round its fp32 operands to tf32 once (the second backward path's
    /// recompute of 16-bit data); 0 on every forward call
    pub tf32x1: i32,
}

const _: () = assert!(std::mem::size_of::<SsdParams>() == 488);

/// Mirrors `struct Ssd2Params` in cuda/ssd_fwd2.cu (528 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Ssd2Params {
    pub p: SsdParams,
    pub cb: u64,
    /// stream-ordered scratch of `prep_bytes` for ssd2_chunk_prep's records (set by `launch2`)
    pub prep: u64,
    pub vec_x: i32,
    pub vec_bc: i32,
    pub vec_z: i32,
    pub vec_out: i32,
    pub vec_states: i32,
    /// 1: ssd2_state_passing leaves H_c in fp32 (the backward's recompute)
    pub states_f32: i32,
    /// the kept 16-bit H_c (`SsdArgs::states16`), or 0: packed in place over the fp32 slots
    pub h16: u64,
    /// return_varlen_states: cu_seqlens (int32), the output and its strides, the sequences
    pub cu_seqlens: u64,
    pub varlen: u64,
    pub varlen_s: [i64; 4],
    pub nseq: i32,
    /// 1: ssd2_chunk_cb writes C B^T in x's dtype for ssd2_chunk_scan_ws (`ssd_scan_ws::plan`)
    pub cb16: i32,
}

const _: () = assert!(std::mem::size_of::<Ssd2Params>() == 592);

/// The inputs and options of a call, shared by the forward and the backward (`ops::ssd_bwd`).
pub struct SsdInputs<'a> {
    pub x: &'a TensorView,
    pub dt: &'a TensorView,
    pub a: &'a TensorView,
    pub b: &'a TensorView,
    pub c: &'a TensorView,
    pub d: Option<&'a TensorView>,
    pub z: Option<&'a TensorView>,
    pub dt_bias: Option<&'a TensorView>,
    pub initial_states: Option<&'a TensorView>,
    pub seq_idx: Option<&'a TensorView>,
    pub chunk_size: i64,
    pub dt_softplus: bool,
    pub dt_limit: (f64, f64),
}

pub struct SsdArgs<'a> {
    pub inputs: SsdInputs<'a>,
    pub out: &'a TensorView,
    pub final_states: Option<&'a TensorView>,
    /// (batch, nchunks, nheads, headdim, dstate) float32, contiguous (the second path leaves the
    /// 16-bit H_c packed at the start of each chunk's slot: scratch, not a result)
    pub states: &'a TensorView,
    /// (batch, nheads, nchunks) float32, contiguous
    pub decay: &'a TensorView,
    /// (batch, nchunks, ngroups, chunk_size, chunk_size) float32, contiguous: given, the second
    /// forward path runs (fp16 / bf16 x; an fp32 x ignores it and runs the default path); then
    /// `cb` and `states` must start 8-byte aligned (its float2 accesses)
    pub cb: Option<&'a TensorView>,
    /// (batch, nchunks, nheads, headdim, dstate) in x's dtype, contiguous, second path only: the
    /// state passing writes the 16-bit H_c (the state entering each chunk) here, where the scan
    /// reads it, so that the backward can take it with `decay` (`SsdBwdArgs::kept`) instead of
    /// recomputing both (written only when the call carries states: `needs_carried_states`)
    pub states16: Option<&'a TensorView>,
    /// return_varlen_states (batch 1, the second path): cu_seqlens (nseq + 1,) int32 on the
    /// device, already checked by the caller (from 0 to seqlen, non-decreasing, seq_idx
    /// changing exactly where a sequence starts), and the output (nseq, nheads, headdim, dstate)
    /// float32, both or neither
    pub varlen: Option<(&'a TensorView, &'a TensorView)>,
}

impl SsdInputs<'_> {
    pub fn named(&self) -> [(&'static str, Option<&TensorView>); 10] {
        [
            ("x", Some(self.x)),
            ("dt", Some(self.dt)),
            ("A", Some(self.a)),
            ("B", Some(self.b)),
            ("C", Some(self.c)),
            ("D", self.d),
            ("z", self.z),
            ("dt_bias", self.dt_bias),
            ("initial_states", self.initial_states),
            ("seq_idx", self.seq_idx),
        ]
    }
}

impl SsdArgs<'_> {
    fn outputs(&self) -> [(&'static str, Option<&TensorView>); 7] {
        [
            ("out", Some(self.out)),
            ("final_states", self.final_states),
            ("states", Some(self.states)),
            ("decay", Some(self.decay)),
            ("cb", self.cb),
            ("states16", self.states16),
            ("varlen_states", self.varlen.map(|v| v.1)),
        ]
    }
}

/// Sizes of a checked call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    pub batch: i64,
    pub seqlen: i64,
    pub nheads: i64,
    pub headdim: i64,
    pub ngroups: i64,
    pub dstate: i64,
    pub nchunks: i64,
}

/// The shapes the unit tests of the SSD launch rules reason about: Mamba-2 2.7B-like b8 L2048
/// (80 heads x 64, state 128, chunk 256) and the real-time b32 L60 (8 heads x 64, state 64).
#[cfg(test)]
pub(crate) const LAYER_2K: Problem = Problem {
    batch: 8,
    seqlen: 2048,
    nheads: 80,
    headdim: 64,
    ngroups: 1,
    dstate: 128,
    nchunks: 8,
};
#[cfg(test)]
pub(crate) const REALTIME: Problem = Problem {
    batch: 32,
    seqlen: 60,
    nheads: 8,
    headdim: 64,
    ngroups: 1,
    dstate: 64,
    nchunks: 1,
};

const FLOATS: [DType; 3] = [DType::F16, DType::BF16, DType::F32];

pub(crate) fn s3(t: &TensorView) -> [i64; 3] {
    [t.strides[0], t.strides[1], t.strides[2]]
}

pub(crate) fn s4(t: &TensorView) -> [i64; 4] {
    [t.strides[0], t.strides[1], t.strides[2], t.strides[3]]
}

/// A (nheads,) float parameter: its stride.
fn per_head(t: &TensorView, arg: &str, nheads: i64) -> Result<i64> {
    t.expect_dtype(arg, &FLOATS)?;
    t.expect_shape(arg, &[nheads])?;
    Ok(t.strides[0])
}

/// Checks every input and option; the sizes of the call.
pub fn check_inputs(a: &SsdInputs) -> Result<Problem> {
    a.x.expect_dtype("x", &FLOATS)?;
    let xs =
        a.x.expect_rank("x", "batch, seqlen, nheads, headdim")?
            .to_vec();
    let (batch, seqlen, nheads, headdim) = (xs[0], xs[1], xs[2], xs[3]);
    a.x.expect_unit_stride("x", 3, "headdim")?;
    if !CHUNKS.contains(&a.chunk_size) {
        return Err(unsupported(format!(
            "chunk_size = {} has no CUDA kernel: allowed {CHUNKS:?}",
            a.chunk_size
        )));
    }
    if !(1..=MAX_HEADDIM).contains(&headdim) {
        return Err(unsupported(format!(
            "headdim = {headdim} is not supported: 1..={MAX_HEADDIM}"
        )));
    }
    a.dt.expect_dtype("dt", &FLOATS)?;
    a.dt.expect_shape("dt", &[batch, seqlen, nheads])?;
    per_head(a.a, "A", nheads)?;
    let bs =
        a.b.expect_rank("B", "batch, seqlen, ngroups, dstate")?
            .to_vec();
    let (ngroups, dstate) = (bs[2], bs[3]);
    if ngroups < 1 || nheads % ngroups != 0 {
        return Err(value_err(format!(
            "B has ngroups = {ngroups}, which must divide nheads = {nheads}"
        )));
    }
    if !(1..=MAX_DSTATE).contains(&dstate) {
        return Err(unsupported(format!(
            "dstate = {dstate} is not supported: 1..={MAX_DSTATE}"
        )));
    }
    for (name, t) in [("B", a.b), ("C", a.c)] {
        if t.dtype != a.x.dtype {
            return Err(unsupported(format!(
                "{name} is {} but x is {}: the CUDA kernels read B and C in x's dtype",
                t.dtype.name(),
                a.x.dtype.name()
            )));
        }
        t.expect_shape(name, &[batch, seqlen, ngroups, dstate])?;
        t.expect_unit_stride(name, 3, "dstate")?;
    }
    if let Some(z) = a.z {
        z.expect_same_dtype("z", a.x, "x")?;
        z.expect_shape("z", &xs)?;
        z.expect_unit_stride("z", 3, "headdim")?;
    }
    if let Some(d) = a.d {
        d.expect_dtype("D", &FLOATS)?;
        if d.shape != [nheads] && d.shape != [nheads, headdim] {
            return Err(value_err(format!(
                "D must have shape ({nheads},) or ({nheads}, {headdim}), got {:?}",
                d.shape
            )));
        }
    }
    if let Some(t) = a.dt_bias {
        per_head(t, "dt_bias", nheads)?;
    }
    let st_shape = [batch, nheads, headdim, dstate];
    if let Some(t) = a.initial_states {
        t.expect_dtype("initial_states", &FLOATS)?;
        t.expect_shape("initial_states", &st_shape)?;
    }
    if let Some(t) = a.seq_idx {
        if t.dtype != DType::I32 {
            return Err(type_err(format!(
                "seq_idx must be int32 on the GPU, got {}",
                t.dtype.name()
            )));
        }
        t.expect_shape("seq_idx", &[batch, seqlen])?;
    }
    let nchunks = (seqlen + a.chunk_size - 1) / a.chunk_size;
    let (lo, hi) = a.dt_limit;
    if lo.is_nan() || hi.is_nan() || lo > hi {
        return Err(value_err(format!(
            "dt_limit must be (low, high) with low <= high, got ({lo}, {hi})"
        )));
    }
    if batch * nheads > 65535 {
        return Err(unsupported("batch * nheads must be <= 65535"));
    }
    Ok(Problem {
        batch,
        seqlen,
        nheads,
        headdim,
        ngroups,
        dstate,
        nchunks,
    })
}

/// Checks the forward's inputs, outputs and workspaces.
pub fn check(a: &SsdArgs) -> Result<Problem> {
    let p = check_inputs(&a.inputs)?;
    let x = a.inputs.x;
    let xs = x.shape.clone();
    let (batch, nheads, headdim, dstate, nchunks) =
        (p.batch, p.nheads, p.headdim, p.dstate, p.nchunks);
    let st_shape = [batch, nheads, headdim, dstate];
    a.out.expect_same_dtype("out", x, "x")?;
    a.out.expect_shape("out", &xs)?;
    a.out.expect_unit_stride("out", 3, "headdim")?;
    a.out.expect_writable("out")?;
    if let Some(t) = a.final_states {
        t.expect_dtype("final_states", &[DType::F32])?;
        t.expect_shape("final_states", &st_shape)?;
        t.expect_writable("final_states")?;
    }
    let q = a.inputs.chunk_size;
    let cb =
        a.cb.map(|t| ("cb", t, vec![batch, nchunks, p.ngroups, q, q]));
    for (name, t, shape) in [
        (
            "states",
            a.states,
            vec![batch, nchunks, nheads, headdim, dstate],
        ),
        ("decay", a.decay, vec![batch, nheads, nchunks]),
    ]
    .into_iter()
    .chain(cb)
    {
        t.expect_dtype(name, &[DType::F32])?;
        t.expect_shape(name, &shape)?;
        t.expect_contiguous(name)?;
        t.expect_writable(name)?;
    }
    if let (Some(cb), true) = (a.cb, x.dtype != DType::F32) {
        fwd2_workspaces_aligned(cb, a.states)?;
    }
    if let Some(t) = a.states16 {
        if a.cb.is_none() || x.dtype == DType::F32 {
            return Err(value_err(
                "states16 is written by the second forward path only (fp16 / bf16 x with cb)",
            ));
        }
        t.expect_same_dtype("states16", x, "x")?;
        t.expect_shape("states16", &[batch, nchunks, nheads, headdim, dstate])?;
        t.expect_contiguous("states16")?;
        t.expect_writable("states16")?;
    }
    if let Some((cu, out)) = a.varlen {
        if a.cb.is_none() || x.dtype == DType::F32 {
            return Err(unsupported(
                "mamba_chunk_scan_combined: return_varlen_states on the GPU covers fp16 / bf16 x \
                 on the second forward path (FLASHSCAN_SSD_FWD unset)",
            ));
        }
        if batch != 1 {
            return Err(value_err(format!(
                "return_varlen_states packs its sequences in one batch row, got batch={batch}"
            )));
        }
        cu.expect_dtype("cu_seqlens", &[DType::I32])?;
        if cu.rank() != 1 || cu.shape[0] < 2 {
            return Err(value_err(format!(
                "cu_seqlens: expected (nseq + 1,) offsets, got shape {:?}",
                cu.shape
            )));
        }
        let nseq = cu.shape[0] - 1;
        out.expect_dtype("varlen_states", &[DType::F32])?;
        out.expect_shape("varlen_states", &[nseq, nheads, headdim, dstate])?;
        out.expect_writable("varlen_states")?;
        if nseq > i32::MAX as i64 {
            return Err(value_err("cu_seqlens: too many sequences"));
        }
    }
    let mut read = a.inputs.named().to_vec();
    read.push(("cu_seqlens", a.varlen.map(|v| v.0)));
    expect_no_overlap(&a.outputs(), &read)?;
    Ok(p)
}

/// The second path stores float2 pairs into the `cb` and `states` workspaces (ssd2_chunk_cb,
/// ssd2_chunk_state) and reads `cb` by float2: both must start 8-byte aligned (a misaligned
/// vector access is a CUDA error, not a slow path). ssd.py's fresh allocations always are.
fn fwd2_workspaces_aligned(cb: &TensorView, states: &TensorView) -> Result<()> {
    for (name, t) in [("cb", cb), ("states", states)] {
        if t.ptr % 8 != 0 {
            return Err(value_err(format!(
                "{name} must start 8-byte aligned for the second SSD forward path (cuda/ssd_fwd2.cu)"
            )));
        }
    }
    Ok(())
}

pub(crate) fn spec(entry: &'static str, dtype: i64, chunk: i64, arch: i64) -> KernelSpec {
    KernelSpec {
        family: FAMILY,
        source: SOURCE,
        entry,
        defines: vec![("FS_DTYPE", dtype), ("FS_CHUNK", chunk), ("FS_ARCH", arch)],
    }
}

/// The state-passing kernel reads and writes fp32 only: one variant (FS_DTYPE / FS_CHUNK fixed).
pub(crate) fn pass_spec(arch: i64) -> KernelSpec {
    spec(ENTRY_PASS, 2, 64, arch)
}

pub(crate) fn spec2(entry: &'static str, dtype: i64, chunk: i64, arch: i64) -> KernelSpec {
    KernelSpec {
        family: FAMILY2,
        source: SOURCE2,
        entry,
        defines: vec![("FS_DTYPE", dtype), ("FS_CHUNK", chunk), ("FS_ARCH", arch)],
    }
}

pub fn all_specs(arch: i64) -> Vec<KernelSpec> {
    let mut out = vec![pass_spec(arch)];
    for chunk in CHUNKS {
        for dtype in [0, 1, 2] {
            out.push(spec(ENTRY_STATE, dtype, chunk, arch));
            out.push(spec(ENTRY_SCAN, dtype, chunk, arch));
        }
    }
    out
}

/// The second path's variants (16-bit data only).
pub fn all_specs2(arch: i64) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    for chunk in CHUNKS {
        for dtype in [0, 1] {
            for entry in [
                ENTRY2_PREP,
                ENTRY2_CB,
                ENTRY2_STATE,
                ENTRY2_PASS,
                ENTRY2_SCAN,
                ENTRY2_SCAN_ONE,
                ENTRY2_VARLEN,
            ] {
                out.push(spec2(entry, dtype, chunk, arch));
            }
            if arch == 90 {
                out.push(spec2(ENTRY2_STATE_PASS, dtype, chunk, arch));
            }
            if arch == 90 && chunk == ssd_scan_ws::CHUNK {
                out.push(spec2(ssd_scan_ws::ENTRY, dtype, chunk, arch));
                out.push(spec2(ssd_scan_ws::ENTRY_PIPE, dtype, chunk, arch));
            }
        }
    }
    out
}

pub(crate) fn dtype_code(t: Option<&TensorView>) -> Result<i32> {
    Ok(match t {
        Some(t) => t.dtype.kernel_code()? as i32,
        None => 2,
    })
}

/// The parameter block of a checked call without its outputs and workspaces (null pointers:
/// the caller sets them).
pub fn params(a: &SsdInputs, p: &Problem) -> Result<SsdParams> {
    let d_s = match a.d {
        Some(d) if d.rank() == 2 => [d.strides[0], d.strides[1]],
        Some(d) => [d.strides[0], 0],
        None => [0, 0],
    };
    Ok(SsdParams {
        x: a.x.ptr,
        dt: a.dt.ptr,
        a: a.a.ptr,
        b: a.b.ptr,
        c: a.c.ptr,
        d: a.d.map_or(0, |t| t.ptr),
        z: a.z.map_or(0, |t| t.ptr),
        dt_bias: a.dt_bias.map_or(0, |t| t.ptr),
        init: a.initial_states.map_or(0, |t| t.ptr),
        seq_idx: a.seq_idx.map_or(0, |t| t.ptr),
        out: 0,
        states: 0,
        decay: 0,
        final_states: 0,
        batch: p.batch,
        seqlen: p.seqlen,
        nheads: p.nheads,
        headdim: p.headdim,
        ngroups: p.ngroups,
        dstate: p.dstate,
        nchunks: p.nchunks,
        x_s: s3(a.x),
        dt_s: s3(a.dt),
        b_s: s3(a.b),
        c_s: s3(a.c),
        z_s: a.z.map_or([0; 3], s3),
        out_s: [0; 3],
        init_s: a.initial_states.map_or([0; 4], s4),
        final_s: [0; 4],
        seq_s: a.seq_idx.map_or([0; 2], |t| [t.strides[0], t.strides[1]]),
        d_s,
        a_s: a.a.strides[0],
        bias_s: a.dt_bias.map_or(0, |t| t.strides[0]),
        // f64 -> f32 keeps infinities (the default upper limit) as infinities
        dt_min: a.dt_limit.0 as f32,
        dt_max: a.dt_limit.1 as f32,
        dt_dtype: a.dt.dtype.kernel_code()? as i32,
        a_dtype: a.a.dtype.kernel_code()? as i32,
        d_dtype: dtype_code(a.d)?,
        bias_dtype: dtype_code(a.dt_bias)?,
        init_dtype: dtype_code(a.initial_states)?,
        vec_xb: 0,
        has_d: a.d.is_some() as i32,
        has_z: a.z.is_some() as i32,
        has_dt_bias: a.dt_bias.is_some() as i32,
        has_init: a.initial_states.is_some() as i32,
        has_seq: a.seq_idx.is_some() as i32,
        has_final: 0,
        softplus: a.dt_softplus as i32,
        tf32x1: 0,
    })
}

pub(crate) fn tiles(n: i64) -> i64 {
    (n + TILE - 1) / TILE
}

pub(crate) fn grid_u32(v: i64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| unsupported(format!("{what} too large for one launch")))
}

/// Kernels 1 and 2 (chunk states, state passing): `params.states` then holds the state entering
/// each chunk, `params.decay` each chunk's decay (and `final_states` the last state, when set).
///
/// # Safety
/// `params` must describe checked tensors and workspaces of the sizes `p` gives, on `dev`.
pub(crate) unsafe fn launch_states(
    dev: &DeviceCtx,
    params: &SsdParams,
    p: &Problem,
    dtype: i64,
    chunk: i64,
    arch: i64,
    st: Stream,
) -> Result<()> {
    let k_state = dev.kernel(&spec(ENTRY_STATE, dtype, chunk, arch))?;
    let k_pass = dev.kernel(&pass_spec(arch))?;
    let bh = grid_u32(p.batch * p.nheads, "batch * nheads")?;
    dev.launch(
        &k_state,
        (
            grid_u32(p.nchunks, "seqlen / chunk_size")?,
            grid_u32(tiles(p.headdim) * tiles(p.dstate), "headdim * dstate")?,
            bh,
        ),
        (THREADS, 1, 1),
        0,
        st,
        params,
    )?;
    dev.launch(
        &k_pass,
        (
            grid_u32(
                (p.headdim * p.dstate + PASS_THREADS - 1) / PASS_THREADS,
                "headdim * dstate",
            )?,
            bh,
            1,
        ),
        (PASS_THREADS as u32, 1, 1),
        0,
        st,
        params,
    )
}

pub fn forward(a: &SsdArgs, stream: StreamChoice) -> Result<()> {
    let p = check(a)?;
    if p.batch == 0 || p.seqlen == 0 || p.nheads == 0 {
        return Ok(());
    }
    let inp = &a.inputs;
    let mut named = inp.named().to_vec();
    named.extend(a.outputs());
    let device = common_cuda_device(&named)?;
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    let _bound = dev.bind()?; // current for the second path's scratch (declared before it)
    let arch = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let dtype = inp.x.dtype.kernel_code()?;
    let mut params = params(inp, &p)?;
    params.out = a.out.ptr;
    params.out_s = s3(a.out);
    params.states = a.states.ptr;
    params.decay = a.decay.ptr;
    if let Some(t) = a.final_states {
        params.final_states = t.ptr;
        params.final_s = s4(t);
        params.has_final = 1;
    }
    let bh = grid_u32(p.batch * p.nheads, "batch * nheads")?;
    let st = dev.stream(stream)?;
    if let (Some(cb), true) = (a.cb, dtype != 2) {
        let q = Ssd2Params {
            p: params,
            cb: cb.ptr,
            prep: 0,
            vec_x: rows16(inp.x, p.headdim),
            vec_bc: (rows16(inp.b, p.dstate) == 1 && rows16(inp.c, p.dstate) == 1) as i32,
            vec_z: inp.z.map_or(0, |z| rows16(z, p.headdim)),
            vec_out: rows16(a.out, p.headdim),
            vec_states: (a.states.ptr % 16 == 0 && a.states16.map_or(true, |t| t.ptr % 16 == 0))
                as i32,
            states_f32: 0,
            h16: a.states16.map_or(0, |t| t.ptr),
            cu_seqlens: a.varlen.map_or(0, |v| v.0.ptr),
            varlen: a.varlen.map_or(0, |v| v.1.ptr),
            varlen_s: a.varlen.map_or([0; 4], |v| s4(v.1)),
            // (checked: nseq fits in i32)
            nseq: a.varlen.map_or(0, |v| (v.0.shape[0] - 1) as i32),
            cb16: 0,
        };
        // SAFETY: as below; cb was checked (shape, fp32, contiguous, no overlap).
        unsafe { launch2(dev, &q, &p, dtype, inp.chunk_size, arch, st)? };
        return dev.finish(stream);
    }
    // compiled here, not above: the second path never runs the default scan
    let k_scan = dev.kernel(&spec(ENTRY_SCAN, dtype, inp.chunk_size, arch))?;
    // SAFETY: params mirrors SsdParams; shapes, dtypes, devices, strides and the workspaces'
    // sizes were checked; the three kernels run in order on one stream.
    unsafe {
        launch_states(dev, &params, &p, dtype, inp.chunk_size, arch, st)?;
        dev.launch(
            &k_scan,
            (
                grid_u32(p.nchunks * (inp.chunk_size / TILE), "seqlen / 64")?,
                grid_u32(tiles(p.headdim), "headdim")?,
                bh,
            ),
            (THREADS, 1, 1),
            0,
            st,
            &params,
        )?;
    }
    dev.finish(stream)
}

/// 1 when every row of a 16-bit (.., last) tensor starts 16-byte aligned and `last` is a
/// multiple of 8 elements: ssd_fwd2's cp.async / vector accesses are then valid.
pub(crate) fn rows16(t: &TensorView, last: i64) -> i32 {
    let n = t.strides.len();
    // a size-1 dimension's stride is never stepped over: any value will do
    let strides_ok = t.strides[..n - 1]
        .iter()
        .zip(&t.shape)
        .all(|(s, &d)| d == 1 || s % 8 == 0);
    (t.ptr % 16 == 0 && last % 8 == 0 && strides_ok) as i32
}

/// Whether the second path's chunk states and state passing must run: more than one chunk, or
/// initial states to carry in, or final states to write out.
pub(crate) fn needs_carried_states(nchunks: i64, has_init: i32, has_final: i32) -> bool {
    nchunks > 1 || has_init != 0 || has_final != 0
}

/// The backward's recompute on the second path's kernels, from a 16-bit call's own x, B and C
/// (`params` points at them, with their strides): the chunk prologue records (scratch),
/// ssd2_chunk_cb's C B^T blocks into `cb` (the backward's CB workspace: the layout and blocks
/// ssd_bwd_cb writes), ssd2_chunk_state, and ssd2_state_passing leaving H_c in fp32
/// (`states_f32`), so `params.states` / `params.decay` end as `launch_states` leaves them. At b8
/// L2048 80 x 64, state 128 on the H100 the first path's pair took 0.86 ms on fp32 copies,
/// ssd2's forward pair 0.26 ms. `with_states` false (a call with no carried state: one chunk, no
/// initial or final state, where the backward reads neither H_c nor f_c) launches only C B^T.
///
/// # Safety
/// As `launch_states`'s, with `x16` / `b16` / `c16` the tensors `params.x` / `.b` / `.c`
/// describe and `cb` a writable fp32 workspace of (batch, nchunks, ngroups, chunk, chunk).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn launch_states2(
    dev: &DeviceCtx,
    params: &SsdParams,
    (x16, b16, c16): (&TensorView, &TensorView, &TensorView),
    cb: u64,
    p: &Problem,
    dtype: i64,
    chunk: i64,
    arch: i64,
    st: Stream,
    with_states: bool,
) -> Result<()> {
    let q = Ssd2Params {
        p: *params,
        cb,
        prep: 0,
        vec_x: rows16(x16, p.headdim),
        vec_bc: rows16(b16, p.dstate) & rows16(c16, p.dstate),
        vec_z: 0,
        vec_out: 0,
        vec_states: (params.states % 16 == 0) as i32,
        states_f32: 1,
        h16: 0,
        cu_seqlens: 0,
        varlen: 0,
        varlen_s: [0; 4],
        nseq: 0,
        cb16: 0,
    };
    let launch = Launch2::new(dev, dtype, chunk, arch, st, p)?;
    if !with_states {
        // SAFETY: as the caller's (C B^T reads only C and B)
        return unsafe { launch.cb(&q, p) };
    }
    let mut q = q;
    let mut scratch = dev.scratch(st)?;
    q.prep = scratch.alloc(prep_bytes(p, chunk))?;
    // SAFETY: as the caller's; the records are written before the state kernel reads them (one
    // stream) and freed after it in stream order
    let launched = (|| unsafe {
        launch.prep(&q, p)?;
        launch.cb(&q, p)?;
        launch.states(&q, p)
    })();
    scratch.free()?;
    launched
}

/// Whether the whole call is one 64-row block without initial states: ssd2_chunk_scan_one then
/// forms its C B^T block itself and ssd2_chunk_cb is not launched (the real-time shape, b32 L60:
/// the CB launch was 3.8 of its 15.7 us of kernels on the H100).
fn one_block(p: &Problem, has_init: i32) -> bool {
    p.nchunks == 1 && p.seqlen <= TILE && has_init == 0
}

/// Bytes of ssd2_chunk_prep's records: 3 kQ 4-byte words per (batch, head, chunk).
fn prep_bytes(p: &Problem, chunk: i64) -> usize {
    (p.batch * p.nheads * p.nchunks * 3 * chunk * 4) as usize
}

/// The second path's launches: the chunk prologue records (scratch), C B^T per group, chunk
/// states (64 x 128 tiles), state passing (one CTA per (batch, head); H_c left in x's dtype over
/// chunk c's slot), chunk outputs. A call of one chunk with neither initial nor final states
/// skips the chunk states and the state passing: the scan reads no carried state in chunk 0
/// without initial states (the real-time shape, b32 L60: 16 of its 32 us of kernels went to them
/// on the H100). A call of one 64-row block (`one_block`) runs C B^T and the outputs as one
/// kernel with its own prologue; it needs the records only for the final states' kernels.
///
/// # Safety
/// `q` must describe checked tensors and workspaces (cb included) of the sizes `p` gives, on `dev`.
unsafe fn launch2(
    dev: &DeviceCtx,
    q: &Ssd2Params,
    p: &Problem,
    dtype: i64,
    chunk: i64,
    arch: i64,
    st: Stream,
) -> Result<()> {
    let fused = one_block(p, q.p.has_init);
    // return_varlen_states reads the fp32 H_c and the records: the states always run then
    let varlen = q.varlen != 0;
    let states = needs_carried_states(p.nchunks, q.p.has_init, q.p.has_final) || varlen;
    let launch = Launch2::new(dev, dtype, chunk, arch, st, p)?;
    if fused && !states {
        // SAFETY: as the caller's; the fused kernel reads no records
        return unsafe { launch.scan(q, p, true) };
    }
    let mut q = *q;
    let mut scratch = dev.scratch(st)?;
    q.prep = scratch.alloc(prep_bytes(p, chunk))?;
    if varlen {
        // the state passing leaves fp32 H_c in place for ssd2_varlen_states and the 16-bit
        // ones (which the scan reads) in h16: the caller's kept tensor, else scratch
        q.states_f32 = 1;
        if q.h16 == 0 {
            let n = p.batch * p.nchunks * p.nheads * p.headdim * p.dstate;
            q.h16 = scratch.alloc(2 * n.max(1) as usize)?;
            q.vec_states &= (q.h16 % 16 == 0) as i32;
        }
    }
    // the warp-specialised chunk outputs where they apply (sm_90a, bf16, chunk 256, no z or
    // seq_idx; FLASHSCAN_SSD_SCAN_WS=0 keeps ssd2_chunk_scan): they read C B^T in x's dtype
    let ws = if fused {
        None
    } else {
        ssd_scan_ws::plan(&q, p, dtype, chunk, arch)
    };
    q.cb16 = ws.is_some() as i32;
    // SAFETY: as the caller's; ssd2_chunk_prep writes the records before the state and scan
    // kernels read them (one stream), and they are freed after those launches.
    let launched = (|| unsafe {
        launch.prep(&q, p)?;
        if !fused {
            launch.cb(&q, p)?;
        }
        if states {
            launch.states(&q, p)?;
        }
        if varlen {
            launch.varlen(&q, p)?;
        }
        if let Some(maps) = ws {
            return ssd_scan_ws::launch(dev, &q, p, &maps, dtype, chunk, arch, st);
        }
        launch.scan(&q, p, fused)
    })();
    scratch.free()?; // ordered after the launches on the same stream
    launched
}

/// What every launch of one second-path call shares.
struct Launch2<'a> {
    dev: &'a DeviceCtx,
    dtype: i64,
    chunk: i64,
    arch: i64,
    st: Stream,
    bh: u32,
    nchunks: u32,
}

impl<'a> Launch2<'a> {
    fn new(
        dev: &'a DeviceCtx,
        dtype: i64,
        chunk: i64,
        arch: i64,
        st: Stream,
        p: &Problem,
    ) -> Result<Self> {
        Ok(Launch2 {
            dev,
            dtype,
            chunk,
            arch,
            st,
            bh: grid_u32(p.batch * p.nheads, "batch * nheads")?,
            nchunks: grid_u32(p.nchunks, "seqlen / chunk_size")?,
        })
    }

    /// ssd2_chunk_prep: one CTA of PREP_THREADS per (chunk, PREP_HEADS heads, batch).
    ///
    /// # Safety
    /// As `one`'s.
    unsafe fn prep(&self, q: &Ssd2Params, p: &Problem) -> Result<()> {
        // SAFETY: as the caller's
        unsafe { self.one(ENTRY2_PREP, head_block_grid(p)?, PREP_THREADS, q) }
    }

    /// ssd2_chunk_cb: one lower 64 x 64 block of C B^T per CTA, per (chunk, group, batch).
    ///
    /// # Safety
    /// As `one`'s.
    unsafe fn cb(&self, q: &Ssd2Params, p: &Problem) -> Result<()> {
        let nb = self.chunk / TILE;
        let grid = (
            grid_u32(p.nchunks * (nb * (nb + 1) / 2), "seqlen / chunk_size")?,
            grid_u32(p.ngroups, "ngroups")?,
            grid_u32(p.batch, "batch")?,
        );
        // SAFETY: as the caller's
        unsafe { self.one(ENTRY2_CB, grid, THREADS, q) }
    }

    /// ssd2_chunk_state (64 x 128 tiles), then ssd2_state_passing, one CTA per (batch, head): it
    /// overwrites each chunk's slot with H (16-bit, or fp32 under `states_f32`) in place. Where
    /// `ssd_state_pass::plan` takes the call, ssd2_chunk_state_pass instead, one CTA per (batch,
    /// head, tile): the same H_c, decays and final states, no fp32 S_c.
    ///
    /// # Safety
    /// As `one`'s; the prep records are written.
    unsafe fn states(&self, q: &Ssd2Params, p: &Problem) -> Result<()> {
        let n_tiles = (p.dstate + STATE2_TILE_N - 1) / STATE2_TILE_N;
        let tiles = grid_u32(tiles(p.headdim) * n_tiles, "headdim * dstate")?;
        if let Some(maps) = ssd_state_pass::plan(q, p, self.dtype, self.arch) {
            let (dev, st) = (self.dev, self.st);
            let (dtype, chunk, arch) = (self.dtype, self.chunk, self.arch);
            // SAFETY: as the caller's
            return unsafe {
                ssd_state_pass::launch(dev, q, &maps, (self.bh, tiles), dtype, chunk, arch, st)
            };
        }
        let grid = (self.nchunks, tiles, self.bh);
        // SAFETY: as the caller's
        unsafe {
            self.one(ENTRY2_STATE, grid, THREADS, q)?;
            self.one(ENTRY2_PASS, (self.bh, 1, 1), PASS_THREADS as u32, q)
        }
    }

    /// ssd2_varlen_states: one CTA per (sequence, 64 x 128 tile, head) of batch row 0.
    ///
    /// # Safety
    /// As `one`'s; the records and the fp32 H_c (`states_f32`) are written.
    unsafe fn varlen(&self, q: &Ssd2Params, p: &Problem) -> Result<()> {
        let n_tiles = (p.dstate + STATE2_TILE_N - 1) / STATE2_TILE_N;
        let grid = (
            grid_u32(q.nseq as i64, "the number of sequences")?,
            grid_u32(tiles(p.headdim) * n_tiles, "headdim * dstate")?,
            grid_u32(p.nheads, "nheads")?,
        );
        // SAFETY: as the caller's
        unsafe { self.one(ENTRY2_VARLEN, grid, THREADS, q) }
    }

    /// # Safety
    /// `q` must describe checked tensors and workspaces for `entry`'s reads and writes.
    unsafe fn one(
        &self,
        entry: &'static str,
        grid: (u32, u32, u32),
        threads: u32,
        q: &Ssd2Params,
    ) -> Result<()> {
        let k = self
            .dev
            .kernel(&spec2(entry, self.dtype, self.chunk, self.arch))?;
        // SAFETY: as the caller's
        unsafe { self.dev.launch(&k, grid, (threads, 1, 1), 0, self.st, q) }
    }

    /// The chunk outputs: ssd2_chunk_scan, or ssd2_chunk_scan_one for a `one_block` call.
    ///
    /// # Safety
    /// As `one`'s.
    unsafe fn scan(&self, q: &Ssd2Params, p: &Problem, fused: bool) -> Result<()> {
        let (entry, row_blocks) = if fused {
            (ENTRY2_SCAN_ONE, 1)
        } else {
            (ENTRY2_SCAN, p.nchunks * (self.chunk / TILE))
        };
        let grid = (
            grid_u32(row_blocks, "seqlen / 64")?,
            grid_u32(tiles(p.headdim), "headdim")?,
            self.bh,
        );
        // SAFETY: as the caller's
        unsafe { self.one(entry, grid, THREADS, q) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_cover_every_dtype_and_chunk() {
        let s = all_specs(90);
        assert_eq!(s.len(), 1 + 2 * 3 * CHUNKS.len());
        assert!(s.iter().any(|k| k.entry == ENTRY_PASS));
        let s2 = all_specs2(90);
        // (+ the warp-specialised chunk outputs, both forms, at chunk 256 and the fused states at
        // every chunk, sm_90a only)
        assert_eq!(s2.len(), 8 * 2 * CHUNKS.len() + 2 * 2);
        assert!(s2.iter().any(|k| k.entry == ssd_scan_ws::ENTRY_PIPE));
        assert_eq!(all_specs2(80).len(), 7 * 2 * CHUNKS.len());
        assert!(s2.iter().all(|k| k.family == FAMILY2));
        assert!(s2.iter().any(|k| k.entry == ENTRY2_PREP));
        assert!(s2.iter().any(|k| k.entry == ENTRY2_VARLEN));
    }

    #[test]
    fn one_chunk_without_carried_states_skips_state_launches() {
        assert!(!needs_carried_states(1, 0, 0));
        let mut p = REALTIME;
        assert!(one_block(&p, 0));
        assert!(!one_block(&p, 1));
        p.seqlen = 64;
        assert!(one_block(&p, 0));
        p.seqlen = 65;
        assert!(!one_block(&p, 0));
        p.seqlen = 300;
        p.nchunks = 2;
        assert!(!one_block(&p, 0));
        assert!(needs_carried_states(2, 0, 0));
        assert!(needs_carried_states(1, 1, 0));
        assert!(needs_carried_states(1, 0, 1));
    }

    fn view(shape: &[i64], strides: &[i64], ptr: u64) -> TensorView {
        TensorView {
            ptr,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            dtype: DType::BF16,
            device: crate::tensor::DeviceKind::Cuda,
            device_id: 0,
            readonly: true,
        }
    }

    #[test]
    fn fwd2_workspaces_must_start_8_byte_aligned() {
        let mut cb = view(&[1, 1, 1, 64, 64], &[4096, 4096, 4096, 64, 1], 0x1000);
        let mut states = view(&[1, 1, 1, 64, 64], &[4096, 4096, 4096, 64, 1], 0x2000);
        cb.dtype = DType::F32;
        states.dtype = DType::F32;
        assert!(fwd2_workspaces_aligned(&cb, &states).is_ok());
        states.ptr = 0x2004; // a float32 view one element in: float2 stores would fault
        assert!(fwd2_workspaces_aligned(&cb, &states).is_err());
        states.ptr = 0x2008;
        cb.ptr = 0x1004;
        assert!(fwd2_workspaces_aligned(&cb, &states).is_err());
    }

    #[test]
    fn rows16_wants_aligned_rows_and_a_last_dim_of_eights() {
        let dense = [2, 100, 4, 64];
        let st = crate::dlpack::compact_strides(&dense);
        assert_eq!(rows16(&view(&dense, &st, 0x1000), 64), 1);
        assert_eq!(rows16(&view(&dense, &st, 0x1008), 64), 0); // 8-byte aligned start
        let odd = [2, 100, 4, 33];
        let st = crate::dlpack::compact_strides(&odd);
        assert_eq!(rows16(&view(&odd, &st, 0x1000), 33), 0);
        // a Mamba-2 split view: row stride 644 elements (not a multiple of 8)
        assert_eq!(rows16(&view(&dense, &[64_400, 644, 64, 1], 0x1000), 64), 0);
        // a size-1 dimension's stride does not matter
        assert_eq!(
            rows16(&view(&[2, 100, 1, 64], &[6400, 64, 3, 1], 0x1000), 64),
            1
        );
    }
}
