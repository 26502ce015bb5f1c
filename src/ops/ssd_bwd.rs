//! Mamba-2 SSD chunked scan, backward (`mamba_chunk_scan_combined`'s gradients): argument checks
//! and the launches of `cuda/ssd_bwd.cu` on one stream, after the forward's chunk-state kernels
//! (`ops::ssd::launch_states`, or ssd2's `launch_states2` for 16-bit tensors) recompute the
//! state entering each chunk. fp32 tensors run the fp32 kernels (a 16-bit call's float32 copies
//! among them, `tf32`); fp16 / bf16 tensors run the 16-bit unit's kernels (`runs_16bit`: calls
//! without z on the second path) on the call's own data. Every gradient is written
//! once by one thread (no float atomics: the result is bitwise deterministic). The fp32 scratch
//! (chunk states and their gradients, per-position and per-chunk partials) is stream-ordered
//! (`cuMemAllocAsync`): a call allocates nothing else and stays graph-capturable.

use crate::error::{unsupported, value_err, Error, Result};
use crate::ops::ssd::{
    self, check_inputs, dtype_code, grid_u32, s3, s4, tiles, Problem, SsdInputs, SsdParams,
};
use crate::ops::ssd_bwd_state_pass;
use crate::runtime::{runtime, KernelSpec, LoadedKernel, StreamChoice};
use crate::tensor::{common_cuda_device, expect_no_overlap, TensorView};
use std::sync::Arc;

pub const SOURCE: &str = include_str!("../../cuda/ssd_bwd.cu");
pub const FAMILY: &str = "ssd_bwd";
pub const ENTRY_OUT: &str = "ssd_bwd_chunk_out";
pub const ENTRY_DSTATE: &str = "ssd_bwd_chunk_dstate";
pub const ENTRY_PASS: &str = "ssd_bwd_state_passing";
pub const ENTRY_DX: &str = "ssd_bwd_chunk_dx";
pub const ENTRY_DC: &str = "ssd_bwd_chunk_dc";
pub const ENTRY_DB: &str = "ssd_bwd_chunk_db";
pub const ENTRY_DT: &str = "ssd_bwd_dt";
pub const ENTRY_REDUCE: &str = "ssd_bwd_reduce";
pub const ENTRY_PROLOGUE: &str = "ssd_bwd_prologue";
pub const ENTRY_CB: &str = "ssd_bwd_cb";
pub const ENTRY_DCB: &str = "ssd_bwd_dcb";
pub const ENTRY_DC2: &str = "ssd_bwd_chunk_dc2";
pub const ENTRY_DB2: &str = "ssd_bwd_chunk_db2";
pub const ENTRY_OUT2: &str = "ssd_bwd_chunk_out2";
pub const ENTRY_DX2: &str = "ssd_bwd_chunk_dx2";
/// The 16-bit builds' dx kernel (cuda/ssd_bwd.cu section 8f), launched from the 16-bit unit.
pub const ENTRY_DX16: &str = "ssd_bwd_chunk_dx16";
/// The 16-bit builds' dCB kernel (section 8g), launched from the 16-bit unit.
pub const ENTRY_DCB16: &str = "ssd_bwd_dcb16";
/// The 16-bit builds' dC / dB kernels (section 8h).
pub const ENTRY_DC16: &str = "ssd_bwd_chunk_dc16";
pub const ENTRY_DB16: &str = "ssd_bwd_chunk_db16";
/// The 16-bit builds' L_c kernel (section 8i).
pub const ENTRY_DSTATE16: &str = "ssd_bwd_chunk_dstate16";
pub const ENTRY_DSTATE16_HILO: &str = "ssd_bwd_chunk_dstate16_hilo";
/// The 16-bit builds' sums of dc16 / db16's head-share partials (section 8h).
pub const ENTRY_SHARE_SUM_DC: &str = "ssd_bwd_share_sum_dc";
pub const ENTRY_SHARE_SUM_DB: &str = "ssd_bwd_share_sum_db";
/// Every entry of the family: one translation unit per (dtype, chunk) holds them all.
const ENTRIES: [&str; 15] = [
    ENTRY_OUT,
    ENTRY_DSTATE,
    ENTRY_PASS,
    ENTRY_DX,
    ENTRY_DC,
    ENTRY_DB,
    ENTRY_DT,
    ENTRY_REDUCE,
    ENTRY_PROLOGUE,
    ENTRY_CB,
    ENTRY_DCB,
    ENTRY_DC2,
    ENTRY_DB2,
    ENTRY_OUT2,
    ENTRY_DX2,
];
const THREADS: u32 = 128;
const PASS_THREADS: i64 = 256;
const TILE: i64 = 64;
/// Channel tiles of 64 the per-position partials keep (headdim <= 256).
const ROW_TILES: i64 = 4;

/// Mirrors `struct SsdBwdParams` in cuda/ssd_bwd.cu (1032 bytes). Strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SsdBwdParams {
    pub f: SsdParams,
    pub dout: u64,
    pub dfinal: u64,
    pub dx: u64,
    pub ddt: u64,
    pub da: u64,
    pub db: u64,
    pub dc: u64,
    pub dd: u64,
    pub dz: u64,
    pub dbias: u64,
    pub dinit: u64,
    pub dstates: u64,
    pub rowdot: u64,
    pub x1: u64,
    pub x2: u64,
    pub dfpart: u64,
    pub ddpart: u64,
    pub dapart: u64,
    pub dbpart: u64,
    pub dout_s: [i64; 3],
    pub dfinal_s: [i64; 4],
    pub dx_s: [i64; 3],
    pub ddt_s: [i64; 3],
    pub db_s: [i64; 3],
    pub dc_s: [i64; 3],
    pub dz_s: [i64; 3],
    pub dinit_s: [i64; 4],
    pub dd_s: [i64; 2],
    pub da_s: i64,
    pub dbias_s: i64,
    pub npass_tiles: i64,
    pub nlblocks: i64,
    pub dfinal_dtype: i32,
    pub has_dfinal: i32,
    pub ptiles: i32,
    pub d_per_channel: i32,
    pub cb: u64,
    pub dcb: u64,
    pub pdt: u64,
    pub pcum: u64,
    pub pseg: u64,
    pub tf32x1: i32,
    pub vec_x: i32,
    pub vec_bc: i32,
    pub dcb_splits: i32,
    pub strad: u64,
    pub stiles: i32,
    pub pass_vec: i32,
    pub share_part: u64,
    pub dcdb_shares: i32,
    /// 1: states16 is the forward's kept H_c (`SsdBwdArgs::kept`)
    pub kept: i32,
    pub states16: u64,
    pub dstates16: u64,
    pub vec_states16: i32,
    pub terms: i32,
    /// 1: the share sums take 4 elements a thread (`sum_vec`)
    pub sum_vec: i32,
    pub pad3_: i32,
}

const _: () = assert!(std::mem::size_of::<SsdBwdParams>() == 1032);

/// The share sums' (ssd_bwd_share_sum_dc / _db) 4-element form: every partial summed in one
/// thread (at most `MAX_SHARES`, the kernel's kMaxShares), dB and dC dense rows whose element
/// count is a multiple of 4 and whose starts allow 8-byte stores.
const MAX_SHARES: i64 = 8;
fn sum_vec(shares: i64, elems: i64, db: &TensorView, dc: &TensorView) -> bool {
    shares <= MAX_SHARES
        && elems % 4 == 0
        && [db, dc].iter().all(|t| t.is_contiguous() && t.ptr % 8 == 0)
}

pub struct SsdBwdArgs<'a> {
    pub inputs: SsdInputs<'a>,
    /// like x
    pub dout: &'a TensorView,
    /// (batch, nheads, headdim, dstate), any float dtype, or None (zero)
    pub dfinal_states: Option<&'a TensorView>,
    pub dx: &'a TensorView,
    pub ddt: &'a TensorView,
    pub da: &'a TensorView,
    pub db: &'a TensorView,
    pub dc: &'a TensorView,
    /// present exactly when the input is
    pub dd: Option<&'a TensorView>,
    pub dz: Option<&'a TensorView>,
    pub ddt_bias: Option<&'a TensorView>,
    pub dinitial_states: Option<&'a TensorView>,
    /// the fp32 data came from 16-bit tensors (exact in tf32): products may round their
    /// operands to tf32 once instead of the 3xTF32 split (second path only)
    pub tf32: bool,
    /// (states16, decay) the forward kept (`SsdArgs::states16` and its `decay`): H_c in x's
    /// dtype, (batch, nchunks, nheads, headdim, dstate), and f_c in fp32, (batch, nheads,
    /// nchunks). A 16-bit call then skips the recompute of both (ssd2_chunk_prep, _state and
    /// _state_passing) and the reverse state passing reads the 16-bit H_c for its df sums
    /// instead of the fp32 ones (H200, b8 L2048 80 x 64, state 128: forward+backward 2.72 ->
    /// 2.46 ms of kernels); None: recomputed
    pub kept: Option<(&'a TensorView, &'a TensorView)>,
}

/// The 16-bit unit's kernels (cuda/ssd_bwd.cu sections 8f-8i) of a call on 16-bit tensors.
struct Kernels16 {
    dx: Arc<LoadedKernel>,
    dcb: Arc<LoadedKernel>,
    dc: Arc<LoadedKernel>,
    db: Arc<LoadedKernel>,
    dstate: Arc<LoadedKernel>,
    sum_dc: Arc<LoadedKernel>,
    sum_db: Arc<LoadedKernel>,
}

/// Whether the 16-bit L_c product splits its scaled dout into a hi / lo pair
/// (`ssd_bwd_chunk_dstate16_hilo`: two mma, ~16 significant bits; FLASHSCAN_SSD_DSTATE_HILO=1, read
/// per call) or rounds it once (`ssd_bwd_chunk_dstate16`: one mma, as Triton's dstates kernel; the
/// default). H200, b8 L2048 bf16: 149.5 against 170.9 us, the worst ddt / dA / ddt_bias error ratios
/// over 40 seeded cases 0.30 / 0.28 / 0.66 against the split's 0.30 / 0.25 / 0.74.
fn dstate_hilo() -> bool {
    std::env::var("FLASHSCAN_SSD_DSTATE_HILO").as_deref() == Ok("1")
}

/// FLASHSCAN_SSD_DX16=0 keeps every 16-bit call on the fp32 kernels over float32 copies (a
/// measurement override, read per call).
fn dx16_enabled() -> bool {
    std::env::var("FLASHSCAN_SSD_DX16").as_deref() != Ok("0")
}

/// Whether a 16-bit call (with z or not) runs on its own fp16 / bf16 tensors: the 16-bit unit's
/// kernels cover calls without z on the second path. With z their g = dout silu(z) would be
/// rounded to 16 bits for the mma, which put an fp16 ddt_bias at 1.1x its limit in one matrix
/// draw on the H100 (2026-11-27); such calls give float32 copies (tf32) to the fp32 kernels,
/// which keep g in fp32. The caller asks before it copies (`_native.ssd_bwd_16bit`).
pub fn runs_16bit(has_z: bool) -> bool {
    !has_z && second_path() && dx16_enabled()
}

/// Which backward path a call takes: the second (cuda/ssd_bwd.cu section 8: the prologue once,
/// CB and a head-summed dCB once per group, dC / dB as plain products over it) unless
/// FLASHSCAN_SSD_BWD=1 asks for the first (dC / dB per head in chunk_dc / chunk_db). Read per
/// call. H100, b8 L2048 80 x 64 heads, dstate 128, bf16 (2026-11-24): forward+backward 17.2 ms
/// of kernels against the first path's 58.6 ms; both pass the backward GPU matrix.
fn second_path() -> bool {
    std::env::var("FLASHSCAN_SSD_BWD").as_deref() != Ok("1")
}

/// 1 when every row of an fp32 (.., last) tensor starts 16-byte aligned and `last` is a multiple
/// of 4 elements: the second path's 16-byte loads are then valid.
fn rows16_f32(t: &TensorView, last: i64) -> bool {
    let n = t.strides.len();
    let strides_ok = t.strides[..n - 1]
        .iter()
        .zip(&t.shape)
        .all(|(s, &d)| d == 1 || s % 4 == 0);
    t.dtype == crate::tensor::DType::F32 && t.ptr % 16 == 0 && last % 4 == 0 && strides_ok
}

impl SsdBwdArgs<'_> {
    fn read(&self) -> Vec<(&'static str, Option<&TensorView>)> {
        let mut v = self.inputs.named().to_vec();
        v.push(("dout", Some(self.dout)));
        v.push(("dfinal_states", self.dfinal_states));
        v.push(("kept_states16", self.kept.map(|k| k.0)));
        v.push(("kept_decay", self.kept.map(|k| k.1)));
        v
    }
    fn outputs(&self) -> [(&'static str, Option<&TensorView>); 9] {
        [
            ("dx", Some(self.dx)),
            ("ddt", Some(self.ddt)),
            ("dA", Some(self.da)),
            ("dB", Some(self.db)),
            ("dC", Some(self.dc)),
            ("dD", self.dd),
            ("dz", self.dz),
            ("ddt_bias", self.ddt_bias),
            ("dinitial_states", self.dinitial_states),
        ]
    }
}

/// A gradient like its input: same dtype and shape, writable; present exactly when the input is.
fn like(
    name: &str,
    grad: Option<&TensorView>,
    input_name: &str,
    input: Option<&TensorView>,
) -> Result<()> {
    match (grad, input) {
        (Some(g), Some(t)) => {
            g.expect_same_dtype(name, t, input_name)?;
            g.expect_shape(name, &t.shape)?;
            g.expect_writable(name)
        }
        (None, None) => Ok(()),
        (Some(_), None) => Err(value_err(format!(
            "{name} was given but {input_name} was not"
        ))),
        (None, Some(_)) => Err(value_err(format!(
            "{name} is missing: {input_name} was given"
        ))),
    }
}

pub fn check(a: &SsdBwdArgs) -> Result<Problem> {
    let i = &a.inputs;
    let p = check_inputs(i)?;
    a.dout.expect_same_dtype("dout", i.x, "x")?;
    a.dout.expect_shape("dout", &i.x.shape)?;
    a.dout.expect_unit_stride("dout", 3, "headdim")?;
    if let Some(t) = a.dfinal_states {
        t.expect_dtype(
            "dfinal_states",
            &[
                crate::tensor::DType::F16,
                crate::tensor::DType::BF16,
                crate::tensor::DType::F32,
            ],
        )?;
        t.expect_shape("dfinal_states", &[p.batch, p.nheads, p.headdim, p.dstate])?;
    }
    like("dx", Some(a.dx), "x", Some(i.x))?;
    like("ddt", Some(a.ddt), "dt", Some(i.dt))?;
    like("dA", Some(a.da), "A", Some(i.a))?;
    like("dB", Some(a.db), "B", Some(i.b))?;
    like("dC", Some(a.dc), "C", Some(i.c))?;
    like("dD", a.dd, "D", i.d)?;
    like("dz", a.dz, "z", i.z)?;
    like("ddt_bias", a.ddt_bias, "dt_bias", i.dt_bias)?;
    like(
        "dinitial_states",
        a.dinitial_states,
        "initial_states",
        i.initial_states,
    )?;
    a.dx.expect_unit_stride("dx", 3, "headdim")?;
    a.db.expect_unit_stride("dB", 3, "dstate")?;
    a.dc.expect_unit_stride("dC", 3, "dstate")?;
    if let Some(t) = a.dz {
        t.expect_unit_stride("dz", 3, "headdim")?;
    }
    if is_16bit(i) {
        if !runs_16bit(i.z.is_some()) {
            return Err(unsupported(
                "16-bit x runs the 16-bit backward kernels, which cover calls without z on the \
                 second path (ssd_bwd_16bit says when); give float32 copies with tf32=True",
            ));
        }
        // the 16-bit tiles' loads: unit stride along headdim / dstate
        i.x.expect_unit_stride("x", 3, "headdim")?;
        i.b.expect_unit_stride("B", 3, "dstate")?;
        i.c.expect_unit_stride("C", 3, "dstate")?;
    }
    if let Some((s16, decay)) = a.kept {
        if !is_16bit(i) {
            return Err(value_err(
                "kept_states16 / kept_decay: only a 16-bit call's backward takes the forward's \
                 states",
            ));
        }
        s16.expect_same_dtype("kept_states16", i.x, "x")?;
        s16.expect_shape(
            "kept_states16",
            &[p.batch, p.nchunks, p.nheads, p.headdim, p.dstate],
        )?;
        s16.expect_contiguous("kept_states16")?;
        if s16.ptr % 16 != 0 {
            // (the 16-bit kernels' cp.async rows and the state passing's 8-byte groups)
            return Err(value_err("kept_states16 must start 16-byte aligned"));
        }
        decay.expect_dtype("kept_decay", &[crate::tensor::DType::F32])?;
        decay.expect_shape("kept_decay", &[p.batch, p.nheads, p.nchunks])?;
        decay.expect_contiguous("kept_decay")?;
    }
    expect_no_overlap(&a.outputs(), &a.read())?;
    if p.batch == 0 || p.seqlen == 0 || p.nheads == 0 {
        return Err(unsupported(
            "an empty SSD call has no CUDA backward (the reference computes it)",
        ));
    }
    Ok(p)
}

/// x (and so B, C, dout: checked alike) in fp16 / bf16.
fn is_16bit(i: &SsdInputs) -> bool {
    matches!(
        i.x.dtype,
        crate::tensor::DType::F16 | crate::tensor::DType::BF16
    )
}

fn spec(entry: &'static str, dtype: i64, chunk: i64, arch: i64) -> KernelSpec {
    KernelSpec {
        family: FAMILY,
        source: SOURCE,
        entry,
        defines: vec![("FS_DTYPE", dtype), ("FS_CHUNK", chunk), ("FS_ARCH", arch)],
    }
}

/// One variant per (dtype, chunk). The kernels that do not depend on the dtype (state passing,
/// dt, reduce) are built with the call's defines too: every entry of a call then comes from one
/// translation unit, one NVRTC compile (the disk cache is keyed by the translation unit, so
/// the other entries load from it), and its CUBIN holds all eight kernels, which is what the
/// compile test measures; listing each entry would compile the same unit eight times.
pub fn all_specs(arch: i64) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    for chunk in ssd::CHUNKS {
        for dtype in [0, 1, 2] {
            out.push(spec(ENTRY_OUT, dtype, chunk, arch));
        }
    }
    out
}

/// Offsets (in floats, 16-byte aligned) of the scratch arrays in one allocation.
struct Layout {
    states: i64,
    decay: i64,
    dstates: i64,
    rowdot: i64,
    x1: i64,
    x2: i64,
    dfpart: i64,
    ddpart: i64,
    dapart: i64,
    dbpart: i64,
    /// second path only (0 sized otherwise)
    cb: i64,
    dcb: i64,
    pdt: i64,
    pcum: i64,
    pseg: i64,
    /// the straddle records of the stable da: kRec (128) floats per (batch, head, chunk, block pair)
    strad: i64,
    /// dc16 / db16's head-share partials: shares x (batch, seqlen, ngroups, dstate) (16-bit
    /// calls only: 0 sized for shares 0)
    share_part: i64,
    /// H_c and dS_c in the input's 16-bit dtype (u16 elements, like states / dstates), written by
    /// the reverse state passing for dx16 / dc16 / db16 (16-bit calls only)
    states16: i64,
    dstates16: i64,
    total: i64,
}

/// ssd_bwd_dcb's head shares per group (each share its own dcb array, summed by chunk_dc2 /
/// chunk_db2 as they load it): at most 16 heads each, and enough shares for about two CTAs per
/// SM when the blocks alone are few (the real-time shape, b32 L60 8 heads: 32 live blocks, its
/// one share of 8 heads took 71 us on the H100); at most 8 shares, at most one per head.
fn dcb_splits(p: &Problem, chunk: i64) -> i64 {
    let hpg = (p.nheads / p.ngroups.max(1)).max(1);
    let pairs = |rows: i64| {
        let nb = (rows + TILE - 1) / TILE;
        nb * (nb + 1) / 2
    };
    let tail = p.seqlen - (p.nchunks - 1) * chunk;
    let live = p.batch * p.ngroups * ((p.nchunks - 1) * pairs(chunk) + pairs(tail));
    let for_loop = (hpg + 15) / 16;
    let for_sms = (264 + live - 1) / live.max(1);
    for_loop.max(for_sms).clamp(1, 8.min(hpg))
}

/// ssd_bwd_chunk_dc16 / _db16's head shares: each (64-row block, 64-state tile, batch, group)
/// CTA walks its group's heads in series, and at b8 L2048 80 heads, state 128 their 512 CTAs
/// made 1.3-1.9 waves with 70% of issue cycles idle on the H100 (ncu, 2026-11-27). Shares split
/// the head loop so that about 2048 CTAs run (several waves of 2-3 a SM), at most 8 shares and
/// one head each; each share leaves an fp32 partial that a sum kernel adds in share order. H100,
/// b8 L2048 (2026-11-27): dc16 + db16 + sums 951 us unsplit, 723 with 2 shares, 687 with 4.
/// FLASHSCAN_SSD_DCDB_SHARES=k forces k (read per call; sweeps).
fn dcdb_shares(p: &Problem, chunk: i64) -> i64 {
    let hpg = (p.nheads / p.ngroups.max(1)).max(1);
    if let Some(k) = std::env::var("FLASHSCAN_SSD_DCDB_SHARES")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
    {
        return k.clamp(1, hpg);
    }
    let tail = p.seqlen - (p.nchunks - 1) * chunk;
    let row_blocks = (p.nchunks - 1) * (chunk / TILE) + (tail + TILE - 1) / TILE;
    let live = row_blocks * ((p.dstate + TILE - 1) / TILE) * p.batch * p.ngroups;
    ((2048 + live - 1) / live.max(1)).clamp(1, 8.min(hpg))
}

/// Dynamic shared memory of ssd_bwd_chunk_dc16 / _db16 (cuda/ssd_bwd.cu kDcdbStages): the A and
/// state tiles of each stage, 2 x stages x 64 rows x 72 (kLd64) 16-bit values; three stages on the
/// parts with 228 KB of shared memory an SM (sm_90, sm_100, sm_103: 3 CTAs an SM at 168
/// registers either way), two elsewhere.
fn dcdb16_smem(arch: i64) -> u32 {
    let stages = if matches!(arch, 90 | 100 | 103) { 3 } else { 2 };
    2 * stages * 64 * 72 * 2
}

/// Lower 64 x 64 blocks (pairs of an l-block and an s-block at or below it) of one chunk.
fn pairs(chunk: i64) -> i64 {
    let nb = chunk / TILE;
    nb * (nb + 1) / 2
}

#[allow(clippy::too_many_arguments)]
fn layout(
    p: &Problem,
    chunk: i64,
    has_d: bool,
    npass_parts: i64,
    second: bool,
    shares: i64,
    kept: bool,
    fused_pass: bool,
) -> Layout {
    let bh = p.batch * p.nheads;
    let mut at = 0i64;
    let mut take = |n: i64| {
        let o = at;
        at += (n + 3) / 4 * 4;
        o
    };
    let st = p.batch * p.nchunks * p.nheads * p.headdim * p.dstate;
    let rows = bh * p.seqlen * ROW_TILES;
    // the forward's kept H_c and f_c (`SsdBwdArgs::kept`) take their place: no room here
    let fresh = !kept as i64;
    let states = take(fresh * st);
    let decay = take(fresh * bh * p.nchunks);
    // (the fused L_c + reverse state passing keeps L_c in its accumulator: no fp32 workspace)
    let dstates = take(if fused_pass { 0 } else { st });
    let rowdot = take(rows);
    let x1 = take(rows);
    let x2 = take(rows);
    let dfpart = take(bh * npass_parts * p.nchunks);
    let ddpart = if has_d {
        take(bh * p.nchunks * (chunk / TILE) * p.headdim)
    } else {
        0
    };
    let dapart = take(bh * p.nchunks);
    let dbpart = take(bh * p.nchunks);
    let k = second as i64;
    let blocks = k * p.batch * p.nchunks * p.ngroups * chunk * chunk;
    let cb = take(blocks);
    let dcb = take(blocks * dcb_splits(p, chunk));
    let pdt = take(k * bh * p.nchunks * chunk);
    let pcum = take(k * bh * p.nchunks * chunk);
    let pseg = take(k * p.batch * p.nchunks * chunk);
    let strad = take(k * bh * p.nchunks * pairs(chunk) * 2 * TILE);
    // one share writes dC / dB itself: no partials
    let parts = if shares > 1 { shares } else { 0 };
    let share_part = take(parts * p.batch * p.seqlen * p.ngroups * p.dstate);
    let half = (shares > 0) as i64 * ((st + 1) / 2); // st u16 elements in f32 slots
    let states16 = take(fresh * half);
    let dstates16 = take(half);
    Layout {
        states,
        decay,
        dstates,
        rowdot,
        x1,
        x2,
        dfpart,
        ddpart,
        dapart,
        dbpart,
        cb,
        dcb,
        pdt,
        pcum,
        pseg,
        strad,
        share_part,
        states16,
        dstates16,
        total: at,
    }
}

/// Runs the backward: every gradient written once, in its input's dtype.
pub fn backward(a: &SsdBwdArgs, stream: StreamChoice) -> Result<()> {
    let p = check(a)?;
    let i = &a.inputs;
    let mut named = a.read();
    named.extend(a.outputs());
    let device = common_cuda_device(&named)?;
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    // The device's context stays current for the whole call (loads, scratch, launches, frees).
    let _bound = dev.bind()?;
    let arch = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let dtype = i.x.dtype.kernel_code()?;
    let chunk = i.chunk_size;
    let mut k = Vec::with_capacity(ENTRIES.len());
    for entry in ENTRIES {
        k.push(dev.kernel(&spec(entry, dtype, chunk, arch))?);
    }
    let [k_out, k_dstate, k_pass, k_dx, k_dc, k_db, k_dt, k_reduce, k_pro, k_cb, k_dcb, k_dc2, k_db2, k_out2, k_dx2] =
        &k[..]
    else {
        return Err(unsupported("ssd_bwd: kernel list"));
    };
    let st = dev.stream(stream)?;

    // the reverse state passing: 4 consecutive elements a thread when they form 16-byte groups
    // (the scratch slots are 16-byte aligned when headdim * dstate is a multiple of 4)
    let pn = p.headdim * p.dstate;
    let pass_vec = (pn % 4 == 0) as i32;
    let per_thread = if pass_vec == 1 { 4 } else { 1 };
    let npass_tiles = (pn + PASS_THREADS * per_thread - 1) / (PASS_THREADS * per_thread);
    // the state passing leaves one df partial per warp
    let npass_parts = npass_tiles * (PASS_THREADS / 32);
    let second = second_path();
    // a 16-bit call (check: without z, on the second path) runs the 16-bit unit's kernels; the
    // fp32 list's prologue, state passing, dt and reduce read none of x, B, C, dout
    let sixteen = is_16bit(i);
    let k16 = if sixteen {
        let load = |entry| dev.kernel(&spec(entry, dtype, chunk, arch));
        Some(Kernels16 {
            dx: load(ENTRY_DX16)?,
            dcb: load(ENTRY_DCB16)?,
            dc: load(ENTRY_DC16)?,
            db: load(ENTRY_DB16)?,
            dstate: load(if dstate_hilo() {
                ENTRY_DSTATE16_HILO
            } else {
                ENTRY_DSTATE16
            })?,
            sum_dc: load(ENTRY_SHARE_SUM_DC)?,
            sum_db: load(ENTRY_SHARE_SUM_DB)?,
        })
    } else {
        None
    };
    // dc16 / db16's head shares (16-bit calls only)
    let terms = ssd::needs_carried_states(
        p.nchunks,
        i.initial_states.is_some() as i32,
        a.dfinal_states.is_some() as i32,
    );
    let shares = if !sixteen {
        0
    } else if terms {
        dcdb_shares(&p, chunk)
    } else {
        1 // one chunk and no state in or out: no state term to split, only its partial stores
    };
    // two or more shares leave fp32 partials that the sum kernels add; one stores dC / dB itself
    let summed = sixteen && shares > 1;
    let elems = p.batch * p.seqlen * p.ngroups * p.dstate;
    let vec4 = summed && sum_vec(shares, elems, a.db, a.dc);
    // the forward's H_c and f_c, where a 16-bit call with a state term can use them
    let kept_by_fwd = a.kept.filter(|_| sixteen && terms);
    let kept = kept_by_fwd.is_some();
    // L_c and the reverse state passing in one sm_90a kernel where the call takes it (the
    // forward's kept H_c, TMA-addressable rows: ssd_bwd_state_pass::plan), else the pair
    let fused_pass = match kept_by_fwd {
        Some((h16, _)) if second => ssd_bwd_state_pass::plan(
            &ssd_bwd_state_pass::Call {
                arch,
                bf16: dtype == 1,
                has_seq: i.seq_idx.is_some(),
                hilo: dstate_hilo(),
                dout: a.dout,
                c: i.c,
                kept: h16,
            },
            &p,
        ),
        _ => None,
    };
    // its df partials: one per warp of each (batch, head, tile) CTA
    let npass_parts = if fused_pass.is_some() {
        ssd_bwd_state_pass::tiles(&p) * ssd_bwd_state_pass::WARPS
    } else {
        npass_parts
    };
    let lay = layout(
        &p,
        chunk,
        i.d.is_some(),
        npass_parts,
        second,
        shares,
        kept,
        fused_pass.is_some(),
    );
    let mut scratch = dev.scratch(st)?;
    let base = scratch.alloc(4 * lay.total.max(1) as usize)?;
    let at = |off: i64| base + 4 * off as u64;

    let mut f = ssd::params(i, &p)?;
    // the recompute of H_c (ssd_chunk_state) in 1xTF32 on the second path: H_c feeds no
    // cancelling sum there (cuda/ssd_bwd.cu section 8)
    f.tf32x1 = (a.tf32 && second) as i32;
    f.vec_xb = (rows16_f32(i.x, p.headdim) && rows16_f32(i.b, p.dstate)) as i32;
    // (kept: no kernel reads an fp32 H_c; the reverse state passing reads the 16-bit one)
    f.states = if kept { 0 } else { at(lay.states) };
    f.decay = kept_by_fwd.map_or(at(lay.decay), |(_, d)| d.ptr);
    let opt = |t: Option<&TensorView>| t.map_or(0, |t| t.ptr);
    let q = SsdBwdParams {
        f,
        dout: a.dout.ptr,
        dfinal: opt(a.dfinal_states),
        dx: a.dx.ptr,
        ddt: a.ddt.ptr,
        da: a.da.ptr,
        db: a.db.ptr,
        dc: a.dc.ptr,
        dd: opt(a.dd),
        dz: opt(a.dz),
        dbias: opt(a.ddt_bias),
        dinit: opt(a.dinitial_states),
        dstates: if fused_pass.is_some() {
            0
        } else {
            at(lay.dstates)
        },
        rowdot: at(lay.rowdot),
        x1: at(lay.x1),
        x2: at(lay.x2),
        dfpart: at(lay.dfpart),
        ddpart: if i.d.is_some() { at(lay.ddpart) } else { 0 },
        dapart: at(lay.dapart),
        dbpart: at(lay.dbpart),
        dout_s: s3(a.dout),
        dfinal_s: a.dfinal_states.map_or([0; 4], s4),
        dx_s: s3(a.dx),
        ddt_s: s3(a.ddt),
        db_s: s3(a.db),
        dc_s: s3(a.dc),
        dz_s: a.dz.map_or([0; 3], s3),
        dinit_s: a.dinitial_states.map_or([0; 4], s4),
        dd_s: match a.dd {
            Some(t) if t.rank() == 2 => [t.strides[0], t.strides[1]],
            Some(t) => [t.strides[0], 0],
            None => [0, 0],
        },
        da_s: a.da.strides[0],
        dbias_s: a.ddt_bias.map_or(0, |t| t.strides[0]),
        npass_tiles: npass_parts,
        nlblocks: p.nchunks * (chunk / TILE),
        dfinal_dtype: dtype_code(a.dfinal_states)?,
        has_dfinal: a.dfinal_states.is_some() as i32,
        ptiles: tiles(p.headdim) as i32,
        d_per_channel: i.d.is_some_and(|d| d.rank() == 2) as i32,
        cb: if second { at(lay.cb) } else { 0 },
        dcb: if second { at(lay.dcb) } else { 0 },
        pdt: if second { at(lay.pdt) } else { 0 },
        pcum: if second { at(lay.pcum) } else { 0 },
        pseg: if second { at(lay.pseg) } else { 0 },
        strad: if second { at(lay.strad) } else { 0 },
        stiles: tiles(p.dstate) as i32,
        pass_vec,
        share_part: if summed { at(lay.share_part) } else { 0 },
        dcdb_shares: shares as i32,
        kept: kept as i32,
        // (without a state term no kernel reads them: the state passing skips the stores)
        states16: match kept_by_fwd {
            Some((h, _)) => h.ptr,
            None if sixteen && terms => at(lay.states16),
            None => 0,
        },
        dstates16: if sixteen && terms {
            at(lay.dstates16)
        } else {
            0
        },
        // the arrays start 16-byte aligned (layout's take): rows of dstate u16 are when dstate
        // is a multiple of 8
        vec_states16: (p.dstate % 8 == 0) as i32,
        terms: terms as i32,
        sum_vec: vec4 as i32,
        pad3_: 0,
        tf32x1: a.tf32 as i32,
        // 16-byte rows: of fp32 data (last dimension a multiple of 4) for the fp32 kernels, of
        // 16-bit data (a multiple of 8) for the 16-bit unit's
        vec_x: if sixteen {
            ssd::rows16(i.x, p.headdim)
                & ssd::rows16(a.dout, p.headdim)
                & ssd::rows16(a.dx, p.headdim)
        } else {
            (rows16_f32(i.x, p.headdim)
                && rows16_f32(a.dout, p.headdim)
                && i.z.map_or(true, |z| rows16_f32(z, p.headdim))) as i32
        },
        vec_bc: if sixteen {
            ssd::rows16(i.b, p.dstate) & ssd::rows16(i.c, p.dstate)
        } else {
            (rows16_f32(i.b, p.dstate) && rows16_f32(i.c, p.dstate)) as i32
        },
        dcb_splits: dcb_splits(&p, chunk) as i32,
    };
    let bh = grid_u32(p.batch * p.nheads, "batch * nheads")?;
    let bg = grid_u32(p.batch * p.ngroups, "batch * ngroups")?;
    let nc = grid_u32(p.nchunks, "seqlen / chunk_size")?;
    let rows = grid_u32(p.nchunks * (chunk / TILE), "seqlen / 64")?;
    let pt = grid_u32(tiles(p.headdim), "headdim")?;
    let nt = grid_u32(tiles(p.dstate), "dstate")?;
    let block = (THREADS, 1, 1);
    // SAFETY: q mirrors SsdBwdParams; every tensor's shape, dtype, device and strides were
    // checked; the scratch holds `lay.total` floats and each array lies at its offset with the
    // size `layout` gives it; the launches run in order on one stream, the scratch is freed
    // after them in stream order.
    unsafe {
        // H_c and f_c again: from the 16-bit tensors on ssd2's kernels (with CB into the
        // workspace), or on the first path's fp32 kernels
        // (a 16-bit call with no state term skips them, L_c and the reverse state passing: no
        // kernel reads H_c, f_c, dS_c or the df partials then; ssd_bwd_dt takes df = 0)
        let carried = !sixteen || terms;
        if sixteen {
            let cb = at(lay.cb);
            let x16 = (i.x, i.b, i.c);
            let again = carried && !kept; // (kept: only C B^T)
            ssd::launch_states2(dev, &q.f, x16, cb, &p, dtype, chunk, arch, st, again)?;
        } else {
            ssd::launch_states(dev, &q.f, &p, dtype, chunk, arch, st)?;
        }
        if second {
            // the prologue and CB workspaces first: the dCB blocks, chunk_out2 and chunk_dx2
            // read them
            let blocks = grid_u32(p.nchunks * pairs(chunk), "seqlen / chunk_size")?;
            let g = grid_u32(p.ngroups, "ngroups")?;
            let shares = grid_u32(p.ngroups * dcb_splits(&p, chunk), "ngroups")?;
            let b = grid_u32(p.batch, "batch")?;
            // ssd2_chunk_prep's CTAs: 8 heads each (cuda/common/ssd.cuh heads_chunk_prologue)
            dev.launch(
                k_pro,
                ssd::head_block_grid(&p)?,
                (ssd::PREP_THREADS, 1, 1),
                0,
                st,
                &q,
            )?;
            match &k16 {
                Some(k) => dev.launch(&k.dcb, (blocks, shares, b), block, 0, st, &q)?,
                None => {
                    dev.launch(k_cb, (blocks, g, b), block, 0, st, &q)?;
                    dev.launch(k_dcb, (blocks, shares, b), block, 0, st, &q)?
                }
            }
        }
        let (k_o, k_x) = if second {
            (k_out2, k_dx2)
        } else {
            (k_out, k_dx)
        };
        // the second path's da does not use y_pre, and its dD comes from chunk_dx2: y_pre is
        // formed again only for dz
        if !second || i.z.is_some() {
            dev.launch(k_o, (rows, pt, bh), block, 0, st, &q)?;
        }
        if let Some(maps) = &fused_pass {
            // (fused_pass implies 16-bit, kept and a state term: carried)
            let grid = (bh, grid_u32(ssd_bwd_state_pass::tiles(&p), "headdim")?);
            let spec = spec(ssd_bwd_state_pass::ENTRY, dtype, chunk, arch);
            ssd_bwd_state_pass::launch(dev, &spec, &q, maps, grid, st)?;
        } else if carried {
            match &k16 {
                // 64 x 128 tiles (ssd2_chunk_state's)
                Some(k) => {
                    let nt128 = grid_u32((p.dstate + 127) / 128, "dstate")?;
                    dev.launch(&k.dstate, (nc, pt * nt128, bh), block, 0, st, &q)?
                }
                None => dev.launch(k_dstate, (nc, pt * nt, bh), block, 0, st, &q)?,
            }
            dev.launch(
                k_pass,
                (grid_u32(npass_tiles, "headdim * dstate")?, bh, 1),
                (PASS_THREADS as u32, 1, 1),
                0,
                st,
                &q,
            )?;
        }
        if let Some(k) = &k16 {
            dev.launch(&k.dx, (rows, pt, bh), block, 0, st, &q)?;
            // grid y = (head share, state tile); the fp32 partials summed into the gradient after
            // each, in one scratch array (dB's overwrite dC's after their sum ran: one stream); one
            // share stores the gradient itself
            let nts = grid_u32(tiles(p.dstate) * shares, "dstate")?;
            let per_block = PASS_THREADS * if vec4 { 4 } else { 1 };
            let sum_grid = (
                grid_u32((elems + per_block - 1) / per_block, "elements")?,
                1,
                1,
            );
            for (kern, sum) in [(&k.dc, &k.sum_dc), (&k.db, &k.sum_db)] {
                dev.launch(kern, (rows, nts, bg), block, dcdb16_smem(arch), st, &q)?;
                if summed {
                    dev.launch(sum, sum_grid, (PASS_THREADS as u32, 1, 1), 0, st, &q)?;
                }
            }
        } else if second {
            dev.launch(k_x, (rows, pt, bh), block, 0, st, &q)?;
            dev.launch(k_dc2, (rows, nt, bg), block, 0, st, &q)?;
            dev.launch(k_db2, (rows, nt, bg), block, 0, st, &q)?;
        } else {
            dev.launch(k_x, (rows, pt, bh), block, 0, st, &q)?;
            dev.launch(k_dc, (rows, nt, bg), block, 0, st, &q)?;
            dev.launch(k_db, (rows, nt, bg), block, 0, st, &q)?;
        }
        // 8 heads a CTA, as the prologues (cuda/common/ssd.cuh heads_dt_to_smem)
        dev.launch(
            k_dt,
            ssd::head_block_grid(&p)?,
            (ssd::PREP_THREADS, 1, 1),
            0,
            st,
            &q,
        )?;
        dev.launch(
            k_reduce,
            (grid_u32(p.nheads, "nheads")?, 1, 1),
            (PASS_THREADS as u32, 1, 1),
            0,
            st,
            &q,
        )?;
    }
    scratch.free()?;
    dev.finish(stream)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_cover_every_dtype_and_chunk() {
        let s = all_specs(90);
        assert_eq!(s.len(), 3 * ssd::CHUNKS.len());
    }

    #[test]
    fn dcb_shares_bound_the_head_loop_and_fill_the_gpu() {
        // b8 L2048 80 heads, chunk 256: 640 live blocks; the loop bound gives 5 shares of 16
        let mut p = ssd::LAYER_2K;
        assert_eq!(dcb_splits(&p, 256), 5);
        p.ngroups = 80; // one head per group
        assert_eq!(dcb_splits(&p, 256), 1);
        p.ngroups = 1;
        p.nheads = 1024;
        assert_eq!(dcb_splits(&p, 256), 8);
        // the real-time shape: 32 live blocks, 8 heads: one share per head
        let rt = ssd::REALTIME;
        assert_eq!(dcb_splits(&rt, 256), 8);
        // a tail chunk counts only its live blocks: 1 chunk of 130 positions = 3 pairs
        let tail = Problem {
            batch: 100,
            seqlen: 130,
            nheads: 2,
            ngroups: 1,
            nchunks: 1,
            ..rt
        };
        assert_eq!(dcb_splits(&tail, 256), 1);
    }

    #[test]
    fn dcdb_shares_fill_the_gpu_within_the_heads() {
        // b8 L2048 80 heads, state 128, chunk 256: 32 row blocks x 2 state tiles x 8 = 512 CTAs
        let p = ssd::LAYER_2K;
        assert_eq!(dcdb_shares(&p, 256), 4);
        // the real-time shape (with a state term: initial states): 32 CTAs for 8 heads: one head a share
        let rt = ssd::REALTIME;
        assert_eq!(dcdb_shares(&rt, 256), 8);
        // one head a group: nothing to split
        assert_eq!(dcdb_shares(&Problem { ngroups: 8, ..rt }, 256), 1);
        // a large grid: no split
        assert_eq!(dcdb_shares(&Problem { batch: 64, ..p }, 256), 1);
    }

    #[test]
    fn scratch_arrays_do_not_overlap() {
        let p = Problem {
            batch: 2,
            seqlen: 100,
            nheads: 3,
            headdim: 48,
            ngroups: 1,
            dstate: 16,
            nchunks: 2,
        };
        let l = layout(&p, 64, true, 3, true, 2, false, false);
        let offs = [
            l.states,
            l.decay,
            l.dstates,
            l.rowdot,
            l.x1,
            l.x2,
            l.dfpart,
            l.ddpart,
            l.dapart,
            l.dbpart,
            l.cb,
            l.dcb,
            l.pdt,
            l.pcum,
            l.pseg,
            l.strad,
            l.share_part,
            l.states16,
            l.dstates16,
            l.total,
        ];
        // two shares of (batch, seqlen, ngroups, dstate)
        assert_eq!(l.states16 - l.share_part, 2 * 2 * 100 * 16);
        // the 16-bit H_c and dS_c: (batch, nchunks, nheads, headdim, dstate) u16 each
        let st = 2 * 2 * 3 * 48 * 16;
        assert_eq!(l.dstates16 - l.states16, st / 2);
        assert_eq!(l.total - l.dstates16, st / 2);
        assert_eq!(
            layout(&p, 64, true, 3, true, 0, false, false).total,
            l.share_part
        );
        // one share stores dC / dB itself: no partials
        let one = layout(&p, 64, true, 3, true, 1, false, false);
        assert_eq!(one.states16, one.share_part);
        assert!(offs.windows(2).all(|w| w[0] < w[1]));
        assert!(offs.iter().all(|o| o % 4 == 0));
        // the second path's arrays take no room on the first
        let first = layout(&p, 64, true, 3, false, 0, false, false);
        assert_eq!(first.total, first.cb);
        assert_eq!(l.dcb - l.cb, 2 * 2 * 64 * 64);
        assert_eq!(l.pdt - l.dcb, 2 * 2 * 64 * 64 * dcb_splits(&p, 64));
        // the forward's kept H_c / f_c: no fp32 H_c, f_c or 16-bit H_c of the backward's own
        let k = layout(&p, 64, true, 3, true, 2, true, false);
        assert_eq!((k.states, k.decay, k.dstates), (0, 0, 0));
        assert_eq!(k.dstates16, k.states16);
        assert_eq!(l.total - k.total, l.dstates - l.states + st / 2);
        // the fused L_c + reverse state passing (kept H_c): no fp32 L_c / dS_c either
        let f = layout(&p, 64, true, 3, true, 2, true, true);
        assert_eq!(f.rowdot, f.dstates);
        assert_eq!(k.total - f.total, st);
    }
}
