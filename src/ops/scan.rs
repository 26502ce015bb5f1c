//! Mamba selective scan forward: argument checks, launch plan, launches of
//! `cuda/selective_scan.cu` (one pass, or chunk-state pass + scan pass for long sequences
//! with few channels).

use crate::error::{unsupported, value_err, Error, Result};
use crate::ops::next_pow2;
use crate::runtime::driver::Stream;
use crate::runtime::{runtime, DeviceCtx, KernelSpec, LoadedKernel, StreamChoice};
use crate::tensor::{
    byte_offsets_fit_i32, common_cuda_device, expect_no_overlap, DType, TensorView,
};
use std::sync::Arc;

pub const SOURCE: &str = include_str!("../../cuda/selective_scan.cu");
pub const FAMILY: &str = "selective_scan";
pub const ENTRY_FWD: &str = "selective_scan_fwd";
pub const ENTRY_CHUNK_STATE: &str = "selective_scan_chunk_state";

/// Threads per block below dstate 128 (the kernel's `FS_THREADS`; doubled above).
const SCAN_THREADS: i64 = 128;
/// Never cut the sequence into chunks shorter than this.
const CHUNK_MIN_LEN: i64 = 512;
/// Chunk only when fewer busy lanes per SM than this (one warp per scheduler) remain.
const CHUNK_LANES_LOW: i64 = 128;
/// Sequences up to this many steps take `short_seq_tiles` at dstate 16 (the measured range).
const SHORT_SEQ: i64 = 64;
pub const MAX_DSTATE: i64 = 256;
/// Saved-state spacing for the backward (steps): the forward, given `saved_states`, writes the
/// state at the end of every SAVE_CHUNK-step chunk but the last. A multiple of every tile (8..32).
pub const SAVE_CHUNK: i64 = 256;

/// Number of saved states (the `nsaved` axis of `saved_states`) for a sequence length: one per
/// chunk boundary inside the sequence; 0 when the sequence is one chunk.
pub fn saved_state_count(seqlen: i64) -> i64 {
    if seqlen <= 0 {
        0
    } else {
        (seqlen + SAVE_CHUNK - 1) / SAVE_CHUNK - 1
    }
}

/// Mirrors `struct ScanHot` in cuda/selective_scan.cu (128 bytes): 32-bit copies of the fields
/// the scan's setup reads, beside the setup's pointers at the head of the parameter block, read
/// by the `FS_IDX32` variants (the setup then touches three constant-cache lines instead of the
/// seven the 64-bit fields span). `ScanParams::fill_hot` writes them from the 64-bit fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanHot {
    pub dim: i32,
    pub seqlen: i32,
    pub dstate: i32,
    pub ngroups: i32,
    pub chunk_len: i32,
    pub blocks_per_row: i32,
    pub chans_per_block: i32,
    /// bit 0 has_d, 1 has_z, 2 has_delta_bias, 3 softplus, 4 has_initial_state, 5 has_last_state
    pub flags: i32,
    pub io_align: i32,
    pub u_batch: i32,
    pub u_dim: i32,
    pub delta_batch: i32,
    pub delta_dim: i32,
    pub z_batch: i32,
    pub z_dim: i32,
    pub a_dim: i32,
    pub a_dstate: i32,
    pub b_batch: i32,
    pub b_group: i32,
    pub b_dstate: i32,
    pub c_batch: i32,
    pub c_group: i32,
    pub c_dstate: i32,
    pub d_dim: i32,
    pub delta_bias_dim: i32,
    pub init_batch: i32,
    pub init_dim: i32,
    pub init_dstate: i32,
    // read at the end: the block's fourth line
    pub nchunks: i32,
    pub out_batch: i32,
    pub out_dim: i32,
    pub pad_: i32,
}

const _: () = assert!(std::mem::size_of::<ScanHot>() == 128);

/// Mirrors `struct ScanParams` in cuda/selective_scan.cu (528 bytes). Strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanParams {
    pub u: u64,
    pub delta: u64,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub delta_bias: u64,
    pub z: u64,
    /// 32-bit copies for the `FS_IDX32` variants (`fill_hot`)
    pub hot: ScanHot,
    pub out: u64,
    pub initial_state: u64,
    pub last_state: u64,
    pub chunk_state: u64,
    pub chunk_dtsum: u64,
    pub batch: i64,
    pub dim: i64,
    pub seqlen: i64,
    pub dstate: i64,
    pub ngroups: i64,
    pub chunk_len: i64,
    pub u_batch: i64,
    pub u_dim: i64,
    pub delta_batch: i64,
    pub delta_dim: i64,
    pub z_batch: i64,
    pub z_dim: i64,
    pub out_batch: i64,
    pub out_dim: i64,
    pub a_dim: i64,
    pub a_dstate: i64,
    pub b_batch: i64,
    pub b_group: i64,
    pub b_dstate: i64,
    pub b_dim: i64,
    pub c_batch: i64,
    pub c_group: i64,
    pub c_dstate: i64,
    pub c_dim: i64,
    pub d_dim: i64,
    pub delta_bias_dim: i64,
    pub init_batch: i64,
    pub init_dim: i64,
    pub init_dstate: i64,
    pub last_batch: i64,
    pub last_dim: i64,
    pub last_dstate: i64,
    pub nchunks: i32,
    pub chans_per_block: i32,
    pub has_d: i32,
    pub has_z: i32,
    pub has_delta_bias: i32,
    pub softplus: i32,
    pub has_initial_state: i32,
    pub has_last_state: i32,
    pub io_align: i32,
    /// ceil(dim / chans_per_block): the blocks of one batch row (grid x = batch * this).
    pub blocks_per_row: i32,
}

const _: () = assert!(std::mem::size_of::<ScanParams>() == 528);

impl ScanParams {
    /// Writes `hot` from the 64-bit fields. A value outside i32 is written as 0: only a call
    /// whose byte offsets all fit in 31 bits takes an `FS_IDX32` variant (`Problem::idx32`),
    /// and every stride and size of such a call fits.
    pub fn fill_hot(&mut self) {
        let n = |v: i64| i32::try_from(v).unwrap_or(0);
        let flags = [
            self.has_d,
            self.has_z,
            self.has_delta_bias,
            self.softplus,
            self.has_initial_state,
            self.has_last_state,
        ]
        .iter()
        .enumerate()
        .fold(0, |acc, (i, &f)| acc | (((f != 0) as i32) << i));
        self.hot = ScanHot {
            dim: n(self.dim),
            seqlen: n(self.seqlen),
            dstate: n(self.dstate),
            ngroups: n(self.ngroups),
            chunk_len: n(self.chunk_len),
            nchunks: self.nchunks,
            blocks_per_row: self.blocks_per_row,
            chans_per_block: self.chans_per_block,
            flags,
            io_align: self.io_align,
            u_batch: n(self.u_batch),
            u_dim: n(self.u_dim),
            delta_batch: n(self.delta_batch),
            delta_dim: n(self.delta_dim),
            z_batch: n(self.z_batch),
            z_dim: n(self.z_dim),
            out_batch: n(self.out_batch),
            out_dim: n(self.out_dim),
            a_dim: n(self.a_dim),
            a_dstate: n(self.a_dstate),
            b_batch: n(self.b_batch),
            b_group: n(self.b_group),
            b_dstate: n(self.b_dstate),
            c_batch: n(self.c_batch),
            c_group: n(self.c_group),
            c_dstate: n(self.c_dstate),
            d_dim: n(self.d_dim),
            delta_bias_dim: n(self.delta_bias_dim),
            init_batch: n(self.init_batch),
            init_dim: n(self.init_dim),
            init_dstate: n(self.init_dstate),
            pad_: 0,
        };
    }
}

/// Mirrors `struct ScanParams` of the saving variant (`FS_SAVE_STATES 1`): the plain struct,
/// then the saved-state pointer and strides (568 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanParamsSave {
    pub base: ScanParams,
    pub saved: u64,
    pub saved_batch: i64,
    pub saved_dim: i64,
    pub saved_chunk: i64,
    pub saved_dstate: i64,
}

const _: () = assert!(std::mem::size_of::<ScanParamsSave>() == 568);

pub struct ScanArgs<'a> {
    pub u: &'a TensorView,
    pub delta: &'a TensorView,
    pub a: &'a TensorView,
    pub b: &'a TensorView,
    pub c: &'a TensorView,
    pub d: Option<&'a TensorView>,
    pub z: Option<&'a TensorView>,
    pub delta_bias: Option<&'a TensorView>,
    pub initial_state: Option<&'a TensorView>,
    pub out: &'a TensorView,
    pub last_state: Option<&'a TensorView>,
    /// f32 (batch, dim, saved_state_count(seqlen), dstate): the state at the end of each saved
    /// chunk boundary, written when present (for the backward).
    pub saved_states: Option<&'a TensorView>,
    pub delta_softplus: bool,
}

impl ScanArgs<'_> {
    /// Every input by name (absent optional ones are None).
    fn inputs(&self) -> [(&'static str, Option<&TensorView>); 9] {
        [
            ("u", Some(self.u)),
            ("delta", Some(self.delta)),
            ("A", Some(self.a)),
            ("B", Some(self.b)),
            ("C", Some(self.c)),
            ("D", self.d),
            ("z", self.z),
            ("delta_bias", self.delta_bias),
            ("initial_state", self.initial_state),
        ]
    }
}

/// B or C: fixed (dim, dstate) or varying (batch, [ngroups,] dstate, seqlen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BcForm {
    pub varying: bool,
    pub ngroups: i64,
    /// (batch, group, dstate) strides when varying; (dim, dstate) in the last two when fixed.
    pub strides: [i64; 4],
}

pub(crate) fn bc_form(
    t: &TensorView,
    arg: &str,
    batch: i64,
    dim: i64,
    dstate: i64,
    seqlen: i64,
) -> Result<BcForm> {
    let s = &t.strides;
    match t.rank() {
        2 => {
            t.expect_shape(arg, &[dim, dstate])?;
            Ok(BcForm { varying: false, ngroups: 1, strides: [0, 0, s[1], s[0]] })
        }
        3 => {
            t.expect_shape(arg, &[batch, dstate, seqlen])?;
            t.expect_unit_stride(arg, 2, "seqlen")?;
            Ok(BcForm { varying: true, ngroups: 1, strides: [s[0], 0, s[1], 0] })
        }
        4 => {
            let g = t.shape[1];
            t.expect_shape(arg, &[batch, g, dstate, seqlen])?;
            t.expect_unit_stride(arg, 3, "seqlen")?;
            if g == 0 || dim % g != 0 {
                return Err(value_err(format!(
                    "{arg} has ngroups = {g}, which must divide dim = {dim}"
                )));
            }
            Ok(BcForm { varying: true, ngroups: g, strides: [s[0], s[1], s[2], 0] })
        }
        r => Err(value_err(format!(
            "{arg} must have shape (dim, dstate), (batch, dstate, seqlen) or (batch, ngroups, dstate, seqlen); got {r} dims {:?}",
            t.shape
        ))),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    pub batch: i64,
    pub dim: i64,
    pub seqlen: i64,
    pub dstate: i64,
    pub b: BcForm,
    pub c: BcForm,
    pub ngroups: i64,
    /// Every byte offset of every tensor of the call is below 2^31 (`byte_offsets_fit_i32`).
    pub idx32: bool,
}

/// Every check of the forward; pure (no GPU).
pub fn check(a: &ScanArgs) -> Result<Problem> {
    check_core(a, true)
}

/// The forward's checks. `outputs = false` (the backward, which passes `dout` as `out`) checks
/// `out` like an input of u's dtype and shape, and skips the writability / overlap checks of
/// `out`, `last_state` and `saved_states` (the backward checks its own).
pub(crate) fn check_core(a: &ScanArgs, outputs: bool) -> Result<Problem> {
    let us = a.u.expect_rank("u", "batch, dim, seqlen")?;
    let (batch, dim, seqlen) = (us[0], us[1], us[2]);
    a.u.expect_dtype("u", &[DType::F16, DType::BF16, DType::F32])?;
    a.u.expect_unit_stride("u", 2, "seqlen")?;
    for (name, t) in [("delta", Some(a.delta)), ("z", a.z), ("out", Some(a.out))] {
        if let Some(t) = t {
            t.expect_same_dtype(name, a.u, "u")?;
            t.expect_shape(name, &a.u.shape)?;
            t.expect_unit_stride(name, 2, "seqlen")?;
        }
    }
    let as_ = a.a.expect_rank("A", "dim, dstate")?;
    let dstate = as_[1];
    a.a.expect_dtype("A", &[DType::F32])?;
    a.a.expect_shape("A", &[dim, dstate])?;
    if !(1..=MAX_DSTATE).contains(&dstate) {
        return Err(unsupported(format!(
            "dstate = {dstate} is not supported: 1..={MAX_DSTATE}"
        )));
    }
    let bf = bc_form(a.b, "B", batch, dim, dstate, seqlen)?;
    let cf = bc_form(a.c, "C", batch, dim, dstate, seqlen)?;
    a.b.expect_dtype("B", &[a.u.dtype, DType::F32])?;
    a.c.expect_same_dtype("C", a.b, "B")?;
    if bf.varying && cf.varying && bf.ngroups != cf.ngroups {
        return Err(value_err(format!(
            "B has {} groups but C has {}: they must match",
            bf.ngroups, cf.ngroups
        )));
    }
    let ngroups = if bf.varying { bf.ngroups } else { cf.ngroups };
    for (name, t) in [("D", a.d), ("delta_bias", a.delta_bias)] {
        if let Some(t) = t {
            t.expect_dtype(name, &[DType::F32])?;
            t.expect_shape(name, &[dim])?;
        }
    }
    for (name, t) in [
        ("initial_state", a.initial_state),
        ("last_state", a.last_state),
    ] {
        if let Some(t) = t {
            t.expect_dtype(name, &[DType::F32])?;
            t.expect_shape(name, &[batch, dim, dstate])?;
        }
    }
    if let Some(t) = a.saved_states {
        t.expect_dtype("saved_states", &[DType::F32])?;
        t.expect_shape(
            "saved_states",
            &[batch, dim, saved_state_count(seqlen), dstate],
        )?;
    }
    if outputs {
        a.out.expect_writable("out")?;
        if let Some(l) = a.last_state {
            l.expect_writable("last_state")?;
            if seqlen == 0 {
                return Err(value_err("seqlen = 0 with last_state: nothing to scan"));
            }
        }
        if let Some(t) = a.saved_states {
            t.expect_writable("saved_states")?;
        }
        expect_no_overlap(
            &[
                ("out", Some(a.out)),
                ("last_state", a.last_state),
                ("saved_states", a.saved_states),
            ],
            &a.inputs(),
        )?;
    }
    Ok(Problem {
        batch,
        dim,
        seqlen,
        dstate,
        b: bf,
        c: cf,
        ngroups,
        idx32: byte_offsets_fit_i32(&[
            Some(a.u),
            Some(a.delta),
            Some(a.a),
            Some(a.b),
            Some(a.c),
            a.d,
            a.z,
            a.delta_bias,
            a.initial_state,
            Some(a.out),
            a.last_state,
            a.saved_states,
        ]),
    })
}

fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// Tile constants for a padded dstate (see the kernel's header for their meaning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    pub dpad: i64,
    pub nsplit: i64,
    pub threads: i64,
    pub min_blocks: i64,
    pub tile: i64,
    /// 32-bit index arithmetic in the kernel (`FS_IDX32`): the short-sequence plans and (since
    /// 2026-12-03) the long dstate-16 plans with B and C varying, taken only where
    /// `Problem::idx32` holds.
    pub idx32: bool,
    /// Channels a lane group owns (`FS_CPT`: 1, 2 or 4): one B / C read serves them all.
    pub cpt: i64,
}

pub fn tiles(dstate: i64) -> Tiles {
    let dpad = next_pow2(dstate);
    let nsplit = (dpad / 4).clamp(1, 16);
    let ns = dpad / nsplit;
    let min_blocks = if ns <= 4 {
        4
    } else if ns <= 8 {
        2
    } else {
        1
    };
    let threads = if ns <= 8 {
        SCAN_THREADS
    } else {
        2 * SCAN_THREADS
    };
    let tile = if nsplit >= 4 && dpad <= 64 {
        32
    } else if nsplit >= 2 {
        16
    } else {
        8
    };
    Tiles {
        dpad,
        nsplit,
        threads,
        min_blocks,
        tile,
        idx32: false,
        cpt: 1,
    }
}

/// The launch plan: how many chunks, channels per block, shared memory per entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub tiles: Tiles,
    pub chans_per_block: i64,
    pub blocks_per_row: i64,
    pub nchunks: i64,
    pub chunk_len: i64,
    pub smem_fwd: i64,
    pub smem_state: i64,
}

/// Small grids (fewer blocks than SMs) with a sequence too short to chunk, dstate 16: twice the
/// lanes per channel (2 states a lane), 64 registers, 8 blocks/SM. Measured on the H100
/// (2026-11-22, b1 d512 L60 bf16): 6.2 us vs 8.0 us; slower at b32 (512 blocks), so small grids only.
pub fn small_grid_tiles(t: Tiles) -> Tiles {
    Tiles {
        nsplit: 8,
        tile: 16,
        min_blocks: 8,
        ..t
    }
}

/// Sequences of at most 64 steps at dstate 16 (the real-time shapes): lanes per channel by how
/// many 128-thread blocks the grid would have. Measured on the H100 (2026-11-24, d512 L60 bf16,
/// kernel us; `benches/results/2026-11-24-h100-realtime/`): b1 / b2 / b4 / b8 / b16 / b32 —
/// 16 lanes, tile 64: 4.41 / 4.56 / 5.32 / 9.58 / 14.4 / 26.5; 8 lanes, tile 32: 5.21 / 5.20 /
/// 5.38 / 6.13 / 8.18 / 14.9; 4 lanes, tile 16: 6.98 / 7.03 / 7.06 / 7.24 / 8.68 / 12.2; the
/// plans before: 5.87 / 5.88 / 5.98 / 7.0 / 9.32 / 13.3. 16 lanes pay up to ~2 blocks per SM
/// (b4: 256 blocks), 8 lanes up to ~4 (b16: 512 blocks).
pub fn short_seq_tiles(t: Tiles, channels: i64, sm_count: i64) -> Tiles {
    let blocks = |nsplit: i64| cdiv(channels * nsplit, SCAN_THREADS);
    let (nsplit, tile) = if blocks(16) <= 2 * sm_count {
        (16, 64)
    } else if blocks(8) <= 4 * sm_count {
        (8, 32)
    } else {
        (4, 16)
    };
    Tiles {
        nsplit,
        tile,
        threads: SCAN_THREADS,
        min_blocks: 4,
        idx32: true,
        ..t
    }
}

/// A `nsplit,tile,threads,min_blocks[,cpt]` tuning override of a scan launch's tiles (for sweeps
/// on a GPU, not a user setting; `cpt`, channels a lane group, defaults to 1 and only the forward
/// takes another): None when unset, Err when malformed.
pub(crate) type TileOverride = Option<std::result::Result<[i64; 5], String>>;

/// The override in environment variable `var` (each caller reads it once, into a `OnceLock`).
pub(crate) fn tiles_from_env(var: &str) -> TileOverride {
    let v = std::env::var(var).ok()?;
    Some(parse_tiles(&v))
}

/// An integer measurement override from environment variable `var`, None when unset, not a
/// number or outside `range` (each caller reads it once, into a `OnceLock`).
fn env_int_in(var: &str, range: std::ops::RangeInclusive<i64>) -> Option<i64> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| range.contains(v))
}

/// `FLASHSCAN_SCAN_PACK_BC=0|1`: a measurement override of the packed 16-bit B / C staging
/// (`FS_PACK_BC` in cuda/selective_scan.cu; unset: the kernel's default).
fn pack_bc_override() -> Option<i64> {
    static O: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
    *O.get_or_init(|| env_int_in("FLASHSCAN_SCAN_PACK_BC", 0..=1))
}

/// `FLASHSCAN_SCAN_POLY=0..8`: a measurement override of how many of every 8 exps of the forward's
/// recurrence run on the FMA pipe (`FS_POLY_NUM` in cuda/selective_scan.cu; unset: 0).
fn poly_override() -> Option<i64> {
    static O: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
    *O.get_or_init(|| env_int_in("FLASHSCAN_SCAN_POLY", 0..=8))
}

/// `FLASHSCAN_SCAN_IDX32=0`: a measurement override keeping the long dstate-16 plans (forward and
/// backward) on 64-bit index arithmetic (the short-sequence plans are built 32-bit only).
pub(crate) fn idx32_long_off() -> bool {
    static O: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *O.get_or_init(|| std::env::var("FLASHSCAN_SCAN_IDX32").as_deref() == Ok("0"))
}

/// Whether a long dstate-16 plan indexes in 32 bits: B and C both varying (the Mamba-1 layout)
/// and the call's byte offsets fit. Measured on the H200 (2026-12-03, `tools/scan_tile_sweep.py`,
/// kernel us, same wheel, two rounds): b8 d2048 L2048 271.1 / 271.5 -> 263.7 / 264.1, L8192 1067
/// -> 1041, b2 d5120 L16384 (chunked) 1681 -> 1643; 4% fewer instructions (ncu), outputs
/// bit-identical. The fixed-B / fixed-C forms keep 64-bit (fp32 with a fixed B spilled 8 B under
/// CI's NVRTC; not measured either), as do other dstates (not measured).
fn idx32_applies(p: &Problem, dpad: i64) -> bool {
    dpad == 16 && p.b.varying && p.c.varying && p.idx32 && !idx32_long_off()
}

/// `FLASHSCAN_SCAN_TILES`: the forward's override.
fn tiles_override() -> &'static TileOverride {
    static O: std::sync::OnceLock<TileOverride> = std::sync::OnceLock::new();
    O.get_or_init(|| tiles_from_env("FLASHSCAN_SCAN_TILES"))
}

fn parse_tiles(v: &str) -> std::result::Result<[i64; 5], String> {
    let bad = || format!("tile override {v:?}: want nsplit,tile,threads,min_blocks[,cpt]");
    let mut n: Vec<i64> = v
        .split(',')
        .map(|x| x.trim().parse::<i64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| bad())?;
    if n.len() == 4 {
        n.push(1);
    }
    <[i64; 5]>::try_from(n).map_err(|_| bad())
}

/// Whether an override's tiles satisfy the kernel's static asserts for a padded dstate.
fn override_fits(o: &[i64; 5], dpad: i64) -> bool {
    let [nsplit, tile, threads, min_blocks, cpt] = *o;
    (1..=32).contains(&nsplit)
        && nsplit & (nsplit - 1) == 0
        && dpad % nsplit == 0
        && tile >= 8
        && tile % 8 == 0
        && tile % nsplit == 0
        && SAVE_CHUNK % tile == 0
        && (32..=1024).contains(&threads)
        && threads % 32 == 0
        && threads % tile == 0
        && (1..=32).contains(&min_blocks)
        && matches!(cpt, 1 | 2 | 4)
}

/// Whether a problem takes the short-sequence plans (and with them the 32-bit indexing).
fn short_seq_applies(p: &Problem, dpad: i64) -> bool {
    dpad == 16 && p.seqlen <= SHORT_SEQ && p.idx32
}

/// The forward's tiles without an override: `short_seq_tiles` for <= 64 steps at dstate 16
/// (where 32-bit offsets fit),
/// `small_grid_tiles` for other small grids there, `wide_tiles` where `wide_tiles_pay`, else
/// `tiles`.
fn default_tiles(p: &Problem, sm_count: i64) -> Tiles {
    let t = tiles(p.dstate);
    if short_seq_applies(p, t.dpad) {
        return short_seq_tiles(t, p.batch * p.dim, sm_count);
    }
    let t = Tiles {
        idx32: idx32_applies(p, t.dpad),
        ..t
    };
    if t.dpad == 16
        && p.seqlen < 2 * CHUNK_MIN_LEN
        && p.batch * cdiv(p.dim, t.threads / t.nsplit) < sm_count
    {
        return small_grid_tiles(t);
    }
    if wide_tiles_pay(p, t, sm_count) {
        return wide_tiles(t);
    }
    t
}

/// 256-thread blocks, 2 an SM (same registers a thread as 128 x 4): one staged B / C tile
/// serves 64 channels instead of 32.
pub fn wide_tiles(t: Tiles) -> Tiles {
    Tiles {
        threads: 2 * SCAN_THREADS,
        min_blocks: 2,
        ..t
    }
}

/// Whether a dstate-16 forward with B and C varying takes `wide_tiles`: where its blocks fit one
/// wave (<= 2 an SM, unchunked) and leave no SM more channels than the 128-thread plan does (the
/// busiest SM sets the time of a one-wave grid), sequences of 1024 steps or more. Measured on the H200 (2026-12-04,
/// `tools/scan_tile_sweep.py`, kernel us, bf16): b8 d2048 L2048 264.2 -> 259.4 / 259.1 (256 blocks,
/// 128 channels on the busiest SM either way), L8192 1043.0 -> 1024.4 / 1022.1; b2 d5120 L16384
/// 1644.8 -> 2046.7 (160 blocks: 128 channels on 28 SMs against 96 with 320 blocks of 32: not
/// taken). The H100 had the same split (2026-11-27: 275.8 vs 285.9, 1085 vs 1123; 2148 vs 1801).
fn wide_tiles_pay(p: &Problem, t: Tiles, sm_count: i64) -> bool {
    // (sequences shorter than 1024 steps: not measured)
    if t.dpad != 16
        || !p.b.varying
        || !p.c.varying
        || t.threads != SCAN_THREADS
        || p.seqlen < 2 * CHUNK_MIN_LEN
    {
        return false;
    }
    let sm = sm_count.max(1);
    let (narrow, wide) = (plan_with(p, t, sm), plan_with(p, wide_tiles(t), sm));
    let blocks = |pl: &Plan| pl.blocks_per_row * p.batch * pl.nchunks;
    let busiest = |pl: &Plan| cdiv(blocks(pl), sm) * pl.chans_per_block;
    narrow.nchunks == 1
        && wide.nchunks == 1
        && blocks(&wide) <= wide.tiles.min_blocks * sm
        && busiest(&wide) <= busiest(&narrow)
}

/// The forward's tiles: the override when set (an error if it does not fit this dstate), else
/// `default_tiles`.
fn forward_tiles(p: &Problem, sm_count: i64) -> Result<Tiles> {
    let Some(o) = tiles_override() else {
        return Ok(default_tiles(p, sm_count));
    };
    let o = o.as_ref().map_err(|e| value_err(e.clone()))?;
    override_tiles(o, p)
}

/// An override's tiles for a problem: its four numbers over `tiles(dstate)`, with the 32-bit
/// index arithmetic where the default plans would take it (so a sweep compares plans on the
/// same indexing); an error where it does not fit the dstate.
fn override_tiles(o: &[i64; 5], p: &Problem) -> Result<Tiles> {
    let t = tiles(p.dstate);
    if !override_fits(o, t.dpad) {
        return Err(value_err(format!(
            "FLASHSCAN_SCAN_TILES {o:?} does not fit dstate {} (padded {})",
            p.dstate, t.dpad
        )));
    }
    Ok(Tiles {
        nsplit: o[0],
        tile: o[1],
        threads: o[2],
        min_blocks: o[3],
        idx32: short_seq_applies(p, t.dpad) || idx32_applies(p, t.dpad),
        cpt: o[4],
        ..t
    })
}

/// The plan without an override (what `forward` runs when `FLASHSCAN_SCAN_TILES` is unset).
pub fn plan(p: &Problem, sm_count: i64) -> Plan {
    plan_with(p, default_tiles(p, sm_count), sm_count)
}

fn plan_with(p: &Problem, t: Tiles, sm_count: i64) -> Plan {
    let chans = t.threads / t.nsplit * t.cpt; // t.cpt channels a lane group
    let dpg = p.dim / p.ngroups;
    let cpb = if (p.b.varying || p.c.varying) && p.ngroups > 1 {
        // A block's channels must share one B/C group.
        (1..=chans.min(dpg))
            .rev()
            .find(|c| dpg % c == 0)
            .unwrap_or(1)
    } else {
        chans
    };
    let nblk_d = cdiv(p.dim, cpb);
    let mut nchunks = 1;
    let lanes_per_sm = p.batch * p.dim * t.nsplit / t.cpt / sm_count.max(1);
    if lanes_per_sm < CHUNK_LANES_LOW && p.seqlen >= 2 * CHUNK_MIN_LEN {
        let resident = sm_count * t.min_blocks;
        nchunks = (resident / (nblk_d * p.batch).max(1))
            .min(p.seqlen / CHUNK_MIN_LEN)
            .max(1);
    }
    nchunks = nchunks.min(cdiv(p.seqlen, t.tile)).max(1);
    let chunk_len = cdiv(cdiv(p.seqlen, nchunks), t.tile) * t.tile;
    let nchunks = cdiv(p.seqlen, chunk_len);
    let row = if t.dpad >= 4 { t.dpad + 4 } else { t.dpad };
    let bc_floats = 2 * t.tile * row;
    let dt_floats = 4 * (t.threads / t.nsplit) * (t.tile + 1) * t.cpt;
    let y_floats = t.threads * t.cpt * (t.tile + 4);
    let nvar = p.b.varying as i64 + p.c.varying as i64;
    Plan {
        tiles: t,
        chans_per_block: cpb,
        blocks_per_row: nblk_d,
        nchunks,
        chunk_len,
        smem_fwd: 4 * (nvar * bc_floats + dt_floats + y_floats),
        smem_state: 4 * (p.b.varying as i64 * bc_floats + dt_floats),
    }
}

#[allow(clippy::too_many_arguments)]
pub fn spec(
    t: &Tiles,
    in_dtype: DType,
    bc_dtype: DType,
    bv: bool,
    cv: bool,
    save: bool,
    arch: i64,
    entry: &'static str,
) -> Result<KernelSpec> {
    let mut defines = vec![
        ("FS_IN_DTYPE", in_dtype.kernel_code()?),
        ("FS_BC_DTYPE", bc_dtype.kernel_code()?),
        ("FS_DSTATE", t.dpad),
        ("FS_NSPLIT", t.nsplit),
        ("FS_TILE_T", t.tile),
        ("FS_THREADS", t.threads),
        ("FS_MIN_BLOCKS", t.min_blocks),
        ("FS_CPT", t.cpt),
        ("FS_B_VARYING", bv as i64),
        ("FS_C_VARYING", cv as i64),
        ("FS_POLY_NUM", poly_override().unwrap_or(0)),
        ("FS_ARCH", arch),
    ];
    if t.idx32 {
        defines.push(("FS_IDX32", 1));
    }
    if let Some(v) = pack_bc_override() {
        defines.push(("FS_PACK_BC", v));
    }
    if save {
        // Only the saving variants carry these: the plain ones stay byte-identical.
        defines.push(("FS_SAVE_STATES", 1));
        defines.push(("FS_SAVE_LEN", SAVE_CHUNK));
    }
    Ok(KernelSpec {
        family: FAMILY,
        source: SOURCE,
        entry,
        defines,
    })
}

/// The (u / delta, B / C) dtype pairs the scan kernels are built for, in variant-list order: a
/// 16-bit input with its own dtype or fp32 B / C, fp32 with fp32.
pub(crate) const IN_BC_DTYPES: [(DType, DType); 5] = [
    (DType::F16, DType::F16),
    (DType::F16, DType::F32),
    (DType::BF16, DType::BF16),
    (DType::BF16, DType::F32),
    (DType::F32, DType::F32),
];

/// Every variant (one per translation unit; both entries live in it).
pub fn all_specs(arch: i64) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    let mut all_tiles: Vec<Tiles> = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        .iter()
        .map(|&d| tiles(d))
        .collect();
    all_tiles.push(small_grid_tiles(tiles(16)));
    // the short-sequence tiles (16 / 8 / 4 lanes a channel): <= 64 steps never save states
    let short: Vec<Tiles> = [1, 8192, 1 << 20]
        .iter()
        .map(|&channels| short_seq_tiles(tiles(16), channels, 132))
        .collect();
    let n_long = all_tiles.len();
    all_tiles.extend(short);
    for (i, t) in all_tiles.into_iter().enumerate() {
        for (in_dt, bc) in IN_BC_DTYPES {
            for (bv, cv) in [(false, false), (false, true), (true, false), (true, true)] {
                for save in [false, true] {
                    if save && i >= n_long {
                        continue;
                    }
                    if let Ok(s) = spec(&t, in_dt, bc, bv, cv, save, arch, ENTRY_FWD) {
                        out.push(s);
                    }
                }
            }
        }
    }
    // the long dstate-16 plans' 32-bit forms (`idx32_applies`: B and C varying) and the wide
    // blocks (`wide_tiles_pay`: B and C varying), 64- and 32-bit
    let wide = wide_tiles(tiles(16));
    for t in [
        Tiles {
            idx32: true,
            ..tiles(16)
        },
        Tiles {
            idx32: true,
            ..small_grid_tiles(tiles(16))
        },
        wide,
        Tiles {
            idx32: true,
            ..wide
        },
    ] {
        for (in_dt, bc) in IN_BC_DTYPES {
            for save in [false, true] {
                if let Ok(s) = spec(&t, in_dt, bc, true, true, save, arch, ENTRY_FWD) {
                    out.push(s);
                }
            }
        }
    }
    out
}

/// Largest power of two (<= g) dividing every value.
fn pow2_divisor(mut g: u64, values: impl IntoIterator<Item = u64>) -> u64 {
    for v in values {
        while g > 1 && v % g != 0 {
            g /= 2;
        }
    }
    g
}

/// `io_align` of the strides alone: the largest power of two (<= 16 bytes) dividing every
/// batch and channel step of the tensors (a replay folds in each call's pointers).
pub(crate) fn stride_align(ts: &[&TensorView]) -> u64 {
    pow2_divisor(
        16,
        ts.iter().flat_map(|t| {
            let es = t.dtype.size() as u64;
            [
                (t.strides[0] as u64).wrapping_mul(es),
                (t.strides[1] as u64).wrapping_mul(es),
            ]
        }),
    )
}

/// Largest power of two (<= 16 bytes) dividing every row start of u, delta, z and out.
pub(crate) fn io_align(ts: &[&TensorView]) -> i32 {
    pow2_divisor(stride_align(ts), ts.iter().map(|t| t.ptr)) as i32
}

/// A replay's pointers against the planned call's arguments: each nonzero exactly where the
/// planned call had that tensor (so a required pointer is never null).
pub(crate) fn expect_planned(ptrs: &[u64], present: &[bool]) -> Result<()> {
    if ptrs.len() != present.len() || ptrs.iter().zip(present).any(|(&p, &has)| (p != 0) != has) {
        return Err(value_err(
            "the pointers do not match the plan's arguments (a null pointer, or an optional given or left out unlike the planned call)",
        ));
    }
    Ok(())
}

/// A replay's io_align: `stride_align` folded with this call's (pointer, element size) pairs
/// (pointer 0: an absent tensor), each pointer first checked against its element size.
pub(crate) fn replay_align(stride_align: u64, ptrs: &[(u64, u64)]) -> Result<i32> {
    if ptrs.iter().any(|&(p, es)| p % es != 0) {
        return Err(value_err("a pointer is not aligned to its element size"));
    }
    let present = ptrs.iter().map(|&(p, _)| p).filter(|&p| p != 0);
    Ok(pow2_divisor(stride_align, present) as i32)
}

/// A forward call made ready to launch: the device, the scan kernel, the launch shape and
/// the parameter block holding the call's pointers.
struct Prepared {
    dev: Arc<DeviceCtx>,
    fwd: Arc<LoadedKernel>,
    pl: Plan,
    arch: i64,
    grid_x: u32,
    block: (u32, u32, u32),
    save: bool,
    params: ScanParamsSave,
}

/// Every check of a forward call, its plan, kernel and parameter block; None when the
/// problem is empty (nothing to launch).
fn prepare(a: &ScanArgs) -> Result<Option<(Problem, Prepared)>> {
    let p = check(a)?;
    if p.batch == 0 || p.dim == 0 || p.seqlen == 0 {
        return Ok(None);
    }
    let mut named = a.inputs().to_vec();
    named.extend([
        ("out", Some(a.out)),
        ("last_state", a.last_state),
        ("saved_states", a.saved_states),
    ]);
    let device = common_cuda_device(&named)?;
    if p.batch > 65535 * 8 {
        return Err(unsupported("batch too large"));
    }
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?.clone();
    // The device's context stays current while kernels load.
    let _bound = dev.bind()?;
    let arch = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let pl = plan_with(
        &p,
        forward_tiles(&p, dev.props.sm_count as i64)?,
        dev.props.sm_count as i64,
    );
    let grid_x = u32::try_from(pl.blocks_per_row * p.batch)
        .map_err(|_| unsupported("batch * dim too large for one launch"))?;
    if pl.nchunks > 65535 {
        return Err(unsupported("sequence too long for one launch"));
    }
    let block = (pl.tiles.threads as u32, 1, 1);
    let save = a.saved_states.is_some() && saved_state_count(p.seqlen) > 0;
    let fwd = dev.kernel(&spec(
        &pl.tiles,
        a.u.dtype,
        a.b.dtype,
        p.b.varying,
        p.c.varying,
        save,
        arch,
        ENTRY_FWD,
    )?)?;
    let mut base = ScanParams {
        u: a.u.ptr,
        delta: a.delta.ptr,
        a: a.a.ptr,
        b: a.b.ptr,
        c: a.c.ptr,
        d: a.d.map_or(0, |t| t.ptr),
        delta_bias: a.delta_bias.map_or(0, |t| t.ptr),
        z: a.z.map_or(0, |t| t.ptr),
        out: a.out.ptr,
        initial_state: a.initial_state.map_or(0, |t| t.ptr),
        last_state: a.last_state.map_or(0, |t| t.ptr),
        batch: p.batch,
        dim: p.dim,
        seqlen: p.seqlen,
        dstate: p.dstate,
        ngroups: p.ngroups,
        chunk_len: pl.chunk_len,
        u_batch: a.u.strides[0],
        u_dim: a.u.strides[1],
        delta_batch: a.delta.strides[0],
        delta_dim: a.delta.strides[1],
        z_batch: a.z.map_or(0, |t| t.strides[0]),
        z_dim: a.z.map_or(0, |t| t.strides[1]),
        out_batch: a.out.strides[0],
        out_dim: a.out.strides[1],
        a_dim: a.a.strides[0],
        a_dstate: a.a.strides[1],
        b_batch: p.b.strides[0],
        b_group: p.b.strides[1],
        b_dstate: p.b.strides[2],
        b_dim: p.b.strides[3],
        c_batch: p.c.strides[0],
        c_group: p.c.strides[1],
        c_dstate: p.c.strides[2],
        c_dim: p.c.strides[3],
        d_dim: a.d.map_or(0, |t| t.strides[0]),
        delta_bias_dim: a.delta_bias.map_or(0, |t| t.strides[0]),
        init_batch: a.initial_state.map_or(0, |t| t.strides[0]),
        init_dim: a.initial_state.map_or(0, |t| t.strides[1]),
        init_dstate: a.initial_state.map_or(0, |t| t.strides[2]),
        last_batch: a.last_state.map_or(0, |t| t.strides[0]),
        last_dim: a.last_state.map_or(0, |t| t.strides[1]),
        last_dstate: a.last_state.map_or(0, |t| t.strides[2]),
        nchunks: pl.nchunks as i32,
        chans_per_block: pl.chans_per_block as i32,
        blocks_per_row: pl.blocks_per_row as i32,
        has_d: a.d.is_some() as i32,
        has_z: a.z.is_some() as i32,
        has_delta_bias: a.delta_bias.is_some() as i32,
        softplus: a.delta_softplus as i32,
        has_initial_state: a.initial_state.is_some() as i32,
        has_last_state: a.last_state.is_some() as i32,
        io_align: io_align(
            &[a.u, a.delta, a.out]
                .into_iter()
                .chain(a.z)
                .collect::<Vec<_>>(),
        ),
        ..Default::default()
    };
    base.fill_hot();
    let sv = a.saved_states.filter(|_| save);
    let params = ScanParamsSave {
        saved: sv.map_or(0, |t| t.ptr),
        saved_batch: sv.map_or(0, |t| t.strides[0]),
        saved_dim: sv.map_or(0, |t| t.strides[1]),
        saved_chunk: sv.map_or(0, |t| t.strides[2]),
        saved_dstate: sv.map_or(0, |t| t.strides[3]),
        base,
    };
    let prep = Prepared {
        dev,
        fwd,
        pl,
        arch,
        grid_x,
        block,
        save,
        params,
    };
    Ok(Some((p, prep)))
}

impl Prepared {
    /// Launches `k` with `params` (ScanParamsSave when the variant saves states, else its
    /// ScanParams prefix).
    ///
    /// # Safety
    /// Every pointer in `params` must be valid for what the kernel indexes with the sizes and
    /// strides `params` holds (checked by `prepare` for its call).
    unsafe fn launch(
        &self,
        k: &LoadedKernel,
        grid: (u32, u32, u32),
        smem: i64,
        s: Stream,
        params: &ScanParamsSave,
    ) -> Result<()> {
        // SAFETY: the caller's; P is the struct of the variant's TU.
        unsafe {
            if self.save {
                self.dev.launch(k, grid, self.block, smem as u32, s, params)
            } else {
                self.dev
                    .launch(k, grid, self.block, smem as u32, s, &params.base)
            }
        }
    }
}

pub fn forward(a: &ScanArgs, stream: StreamChoice) -> Result<()> {
    let Some((p, prep)) = prepare(a)? else {
        return Ok(());
    };
    let dev = &prep.dev;
    // The device's context stays current for the whole call (scratch, launches, frees) and
    // the caller's is current again when this returns.
    let _bound = dev.bind()?;
    let pl = &prep.pl;
    let s = dev.stream(stream)?;
    let mut params = prep.params;
    let grid_x = prep.grid_x;
    if pl.nchunks == 1 {
        // SAFETY: `prepare` checked every pointer of `a` (shape, dtype, device, strides).
        unsafe { prep.launch(&prep.fwd, (grid_x, 1, 1), pl.smem_fwd, s, &params)? };
        return dev.finish(stream);
    }
    // Chunked: scratch for each chunk's end state and dt sum, stream-ordered so it is safe
    // under graph capture and freed once the two launches have run.
    let rows = p.batch * p.dim * (pl.nchunks - 1);
    let mut scratch = dev.scratch(s)?;
    params.base.chunk_state = scratch.alloc((rows * pl.tiles.dpad * 4) as usize)?;
    params.base.chunk_dtsum = scratch.alloc((rows * 4) as usize)?;
    let state_k = dev.kernel(&spec(
        &pl.tiles,
        a.u.dtype,
        a.b.dtype,
        p.b.varying,
        p.c.varying,
        prep.save,
        prep.arch,
        ENTRY_CHUNK_STATE,
    )?);
    // The scratch buffers hold rows * dpad and rows floats as the kernel expects; the other
    // pointers were checked by `prepare`.
    let launched = state_k.and_then(|k| {
        // SAFETY: as above.
        unsafe {
            prep.launch(
                &k,
                (grid_x, (pl.nchunks - 1) as u32, 1),
                pl.smem_state,
                s,
                &params,
            )?;
            prep.launch(
                &prep.fwd,
                (grid_x, pl.nchunks as u32, 1),
                pl.smem_fwd,
                s,
                &params,
            )
        }
    });
    scratch.free()?; // ordered after the launches on the same stream
    launched?;
    dev.finish(stream)
}

/// The pointers of one forward call (0 for an absent optional).
#[derive(Clone, Copy, Debug, Default)]
pub struct FwdPtrs {
    pub u: u64,
    pub delta: u64,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub z: u64,
    pub delta_bias: u64,
    pub initial_state: u64,
    pub out: u64,
    pub last_state: u64,
    pub saved_states: u64,
}

/// A checked one-launch forward of one signature (shapes, strides, dtypes, device, which
/// optionals are present, flags), replayed with new pointers by a caller that made sure its
/// tensors have that signature (flashscan.torch's lean path: the signature is its cache key).
/// What it saves per call: the descriptors' import, every check, the plan and the kernel
/// lookup.
pub struct FwdReplay {
    prep: Prepared,
    /// io_align of the strides alone (the pointers' alignment is folded in per call)
    stride_align: u64,
    elem: [u64; 4],
    /// which arguments the planned call had, in `FwdPtrs` order
    present: [bool; 12],
}

/// The replayable plan of the call `a` (every check done, kernel loaded); None when the call
/// is not one launch (an empty problem, or a chunked sequence).
pub fn forward_replay(a: &ScanArgs) -> Result<Option<FwdReplay>> {
    let Some((_, prep)) = prepare(a)? else {
        return Ok(None);
    };
    if prep.pl.nchunks != 1 {
        return Ok(None);
    }
    let strided: Vec<&TensorView> = [a.u, a.delta, a.out].into_iter().chain(a.z).collect();
    let es = |t: Option<&TensorView>| t.map_or(1, |t| t.dtype.size() as u64);
    Ok(Some(FwdReplay {
        stride_align: stride_align(&strided),
        elem: [es(Some(a.u)), es(Some(a.delta)), es(Some(a.out)), es(a.z)],
        present: [
            true,
            true,
            true,
            true,
            true,
            a.d.is_some(),
            a.z.is_some(),
            a.delta_bias.is_some(),
            a.initial_state.is_some(),
            true,
            a.last_state.is_some(),
            a.saved_states.is_some(),
        ],
        prep,
    }))
}

impl FwdReplay {
    /// The planned call on new pointers (the caller's tensors have the planned signature).
    /// Checks only what the pointers alone can break: null pointers, the optionals present
    /// as planned, the element alignment of every pointer.
    pub fn launch(&self, x: &FwdPtrs, stream: StreamChoice) -> Result<()> {
        let ptrs = [
            x.u,
            x.delta,
            x.a,
            x.b,
            x.c,
            x.d,
            x.z,
            x.delta_bias,
            x.initial_state,
            x.out,
            x.last_state,
            x.saved_states,
        ];
        expect_planned(&ptrs, &self.present)?;
        let [eu, ed, eo, ez] = self.elem;
        let align = replay_align(
            self.stride_align,
            &[(x.u, eu), (x.delta, ed), (x.out, eo), (x.z, ez)],
        )?;
        let mut params = self.prep.params;
        let b = &mut params.base;
        (b.u, b.delta, b.a, b.b, b.c, b.out) = (x.u, x.delta, x.a, x.b, x.c, x.out);
        (b.d, b.z, b.delta_bias) = (x.d, x.z, x.delta_bias);
        (b.initial_state, b.last_state) = (x.initial_state, x.last_state);
        b.io_align = align;
        b.hot.io_align = align;
        if self.prep.save {
            params.saved = x.saved_states;
        }
        let dev = &self.prep.dev;
        let s = dev.stream(stream)?;
        // SAFETY: the plan's call was checked by `prepare`; the caller guarantees these
        // pointers are tensors of that call's signature (what the lean path's cache key holds).
        unsafe {
            self.prep.launch(
                &self.prep.fwd,
                (self.prep.grid_x, 1, 1),
                self.prep.pl.smem_fwd,
                s,
                &params,
            )?
        };
        dev.finish(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tensor::cuda_view as view;

    #[test]
    fn replay_align_is_io_align_with_the_pointers_folded_in_later() {
        let u = view(&[2, 8, 60], &[480, 60, 1], DType::BF16, 0x1000);
        let z = view(&[2, 8, 60], &[480, 60, 1], DType::BF16, 0x2008);
        let out = view(&[2, 8, 61], &[488, 61, 1], DType::BF16, 0x3000);
        for ts in [vec![&u], vec![&u, &z], vec![&u, &z, &out], vec![&out]] {
            let pairs: Vec<(u64, u64)> = ts.iter().map(|t| (t.ptr, 2)).collect();
            let got = replay_align(stride_align(&ts), &pairs).unwrap();
            assert_eq!(got, io_align(&ts), "{:?}", ts.len());
        }
        // 60 bf16 = 120-byte rows: 8-byte steps; 61 = 122: 2; a pointer at 0x2008: 8
        assert_eq!(stride_align(&[&u]), 8);
        assert_eq!(stride_align(&[&out]), 2);
        // an absent tensor (pointer 0) changes nothing; an odd pointer is refused
        assert_eq!(replay_align(16, &[(0x1000, 2), (0, 2)]).unwrap(), 16);
        assert!(replay_align(16, &[(0x1001, 2)]).is_err());
    }

    #[test]
    fn replay_pointers_must_be_given_exactly_where_the_plan_had_tensors() {
        let planned = [true, true, false];
        assert!(expect_planned(&[0x10, 0x20, 0], &planned).is_ok());
        assert!(expect_planned(&[0, 0x20, 0], &planned).is_err()); // a null required pointer
        assert!(expect_planned(&[0x10, 0x20, 0x30], &planned).is_err()); // one not planned
        assert!(expect_planned(&[0x10, 0x20], &planned).is_err()); // a missing argument
    }

    fn problem(batch: i64, dim: i64, seqlen: i64, dstate: i64) -> Problem {
        let f = BcForm {
            varying: true,
            ngroups: 1,
            strides: [0; 4],
        };
        Problem {
            batch,
            dim,
            seqlen,
            dstate,
            b: f,
            c: f,
            ngroups: 1,
            idx32: true,
        }
    }

    #[test]
    fn tile_override_parses_and_is_checked() {
        assert_eq!(parse_tiles("8, 16,128,8"), Ok([8, 16, 128, 8, 1]));
        assert_eq!(parse_tiles("8,16,128,4,2"), Ok([8, 16, 128, 4, 2]));
        assert!(!override_fits(&[8, 16, 128, 4, 3], 16)); // FS_CPT: 1, 2 or 4
        assert!(parse_tiles("8,16,128").is_err());
        assert!(parse_tiles("8,x,128,8").is_err());
        assert!(override_fits(&[8, 16, 128, 8, 1], 16));
        assert!(override_fits(&[16, 16, 64, 8, 1], 16));
        assert!(!override_fits(&[32, 32, 128, 4, 1], 16)); // more lanes than states
        assert!(!override_fits(&[4, 12, 128, 4, 1], 16)); // tile not a multiple of 8
        assert!(!override_fits(&[4, 64, 96, 4, 1], 16)); // threads not a multiple of the tile
        assert!(!override_fits(&[3, 24, 96, 4, 1], 48));
        // an override indexes in 32 bits where the default plans would: dstate 16, offsets fit
        let t = override_tiles(&[4, 32, 128, 4, 1], &problem(32, 512, 60, 16)).unwrap();
        assert!(t.idx32 && (t.nsplit, t.tile) == (4, 32));
        assert!(
            override_tiles(&[4, 32, 128, 4, 1], &problem(32, 512, 65, 16))
                .unwrap()
                .idx32
        );
        assert!(
            !override_tiles(&[4, 32, 128, 4, 1], &problem(32, 512, 65, 32))
                .unwrap()
                .idx32
        );
        let big = Problem {
            idx32: false,
            ..problem(32, 512, 60, 16)
        };
        assert!(!override_tiles(&[4, 32, 128, 4, 1], &big).unwrap().idx32);
        assert!(override_tiles(&[32, 32, 128, 4, 1], &problem(32, 512, 60, 16)).is_err());
    }

    #[test]
    fn plan_matches_the_kernel_notes() {
        // game shape: one pass, 32 channels per block of 128 threads (4 lanes each), tile 16
        let pl = plan(&problem(32, 512, 60, 16), 132);
        assert_eq!(pl.nchunks, 1);
        assert_eq!(pl.chans_per_block, 32);
        assert_eq!((pl.tiles.nsplit, pl.tiles.tile), (4, 16));
        assert!(pl.tiles.idx32);
        assert_eq!(pl.smem_fwd, 4 * (2 * 2 * 16 * 20 + 4 * 32 * 17 + 128 * 20));
        // offsets past 2^31 bytes: the 64-bit kernel's tiles (here the default ones)
        let big = Problem {
            idx32: false,
            ..problem(32, 512, 60, 16)
        };
        assert_eq!(plan(&big, 132).tiles, tiles(16));
        // long sequences at dstate 16: the default tiles (here their wide form) in 32 bits where
        // offsets fit, other dstates 64-bit
        let pl = plan(&problem(8, 2048, 2048, 16), 132);
        assert_eq!(
            pl.tiles,
            Tiles {
                idx32: true,
                ..wide_tiles(tiles(16))
            }
        );
        assert!(!plan(&problem(8, 2048, 2048, 64), 132).tiles.idx32);
        let long = problem(8, 2048, 2048, 16);
        let fixed_b = Problem {
            b: BcForm {
                varying: false,
                ..long.b
            },
            ..long
        };
        assert!(!plan(&fixed_b, 132).tiles.idx32);
        // the same at batch 1 / 8: 16 lanes a channel, one tile of 64; 8 lanes, tile 32
        let pl = plan(&problem(1, 512, 60, 16), 132);
        assert_eq!(
            (pl.tiles.nsplit, pl.tiles.tile, pl.chans_per_block),
            (16, 64, 8)
        );
        let pl = plan(&problem(8, 512, 60, 16), 132);
        assert_eq!((pl.tiles.nsplit, pl.tiles.tile), (8, 32));
        // longer small grids keep the small-grid tiles; other dstates the default
        let pl = plan(&problem(1, 512, 65, 16), 132);
        assert_eq!((pl.tiles.nsplit, pl.tiles.tile), (8, 16));
        let pl = plan(&problem(1, 512, 60, 64), 132);
        assert_eq!(pl.tiles, tiles(64));
        // long sequence, few channels: chunked into a multiple of the tile
        let pl = plan(&problem(1, 1024, 65536, 16), 132);
        assert!(pl.nchunks > 1 && pl.chunk_len % pl.tiles.tile == 0);
        assert!(pl.nchunks * pl.chunk_len >= 65536 && (pl.nchunks - 1) * pl.chunk_len < 65536);
    }

    #[test]
    fn wide_blocks_where_one_wave_leaves_no_sm_busier() {
        let wide = |p: &Problem| plan(p, 132).tiles.threads == 2 * SCAN_THREADS;
        // 256 blocks of 64 channels on 132 SMs x 2: 128 channels on the busiest SM, as with 512
        // blocks of 32 at 4 an SM
        assert!(wide(&problem(8, 2048, 2048, 16)));
        assert!(wide(&problem(8, 2048, 8192, 16)));
        let pl = plan(&problem(8, 2048, 2048, 16), 132);
        assert_eq!(
            (pl.chans_per_block, pl.blocks_per_row, pl.nchunks),
            (64, 32, 1)
        );
        // 160 blocks of 64: 128 channels on 28 SMs, against 96 with 320 blocks of 32
        assert!(!wide(&problem(2, 5120, 16384, 16)));
        // more than one wave of wide blocks (b16: 512 blocks), chunked sequences, other dstates
        assert!(!wide(&problem(16, 2048, 2048, 16)));
        assert!(!wide(&problem(1, 1024, 65536, 16)));
        assert!(!wide(&problem(8, 2048, 2048, 64)));
        assert!(!wide(&problem(8, 2048, 1000, 16)));
        // a fixed B or C: no shared B / C tile to gain from
        let long = problem(8, 2048, 2048, 16);
        for (bv, cv) in [(false, true), (true, false)] {
            let p = Problem {
                b: BcForm {
                    varying: bv,
                    ..long.b
                },
                c: BcForm {
                    varying: cv,
                    ..long.c
                },
                ..long
            };
            assert!(!wide(&p));
        }
        // the wide plan's variants are in the compiled list, 64- and 32-bit
        let specs = all_specs(90);
        for idx32 in [false, true] {
            let t = Tiles {
                idx32,
                ..wide_tiles(tiles(16))
            };
            let s = spec(
                &t,
                DType::BF16,
                DType::BF16,
                true,
                true,
                false,
                90,
                ENTRY_FWD,
            )
            .unwrap();
            assert!(specs.contains(&s), "idx32 {idx32}");
        }
    }

    #[test]
    fn fill_hot_copies_the_setup_fields_in_32_bits() {
        let mut p = ScanParams {
            dim: 512,
            seqlen: 60,
            dstate: 16,
            ngroups: 1,
            chunk_len: 64,
            nchunks: 1,
            blocks_per_row: 16,
            chans_per_block: 32,
            u_batch: 30720,
            u_dim: 60,
            out_dim: 61,
            b_group: 960,
            c_dstate: 60,
            delta_bias_dim: 1,
            has_z: 1,
            softplus: 1,
            has_last_state: 1,
            io_align: 8,
            init_dim: 16,
            // outside i32: written as 0 (such a call never takes a 32-bit variant)
            delta_batch: 1 << 33,
            ..Default::default()
        };
        p.fill_hot();
        let h = p.hot;
        assert_eq!((h.dim, h.seqlen, h.dstate, h.ngroups), (512, 60, 16, 1));
        assert_eq!((h.chunk_len, h.nchunks, h.blocks_per_row), (64, 1, 16));
        assert_eq!((h.chans_per_block, h.io_align), (32, 8));
        assert_eq!((h.u_batch, h.u_dim, h.out_dim), (30720, 60, 61));
        assert_eq!((h.b_group, h.c_dstate, h.delta_bias_dim), (960, 60, 1));
        assert_eq!((h.init_dim, h.delta_batch), (16, 0));
        // has_z (bit 1), softplus (bit 3), has_last_state (bit 5)
        assert_eq!(h.flags, 0b101010);
        // the head of the block, as the kernel's struct has it
        assert_eq!(std::mem::offset_of!(ScanParams, hot), 64);
        assert_eq!(std::mem::offset_of!(ScanParams, out), 192);
    }

    #[test]
    fn tiles_cover_every_dstate() {
        for d in 1..=256 {
            let t = tiles(d);
            assert!(t.dpad >= d && t.dpad % t.nsplit == 0 && t.tile % t.nsplit == 0);
        }
    }
}
