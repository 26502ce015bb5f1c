//! Mamba selective scan backward: argument checks, launch plan, launches of
//! `cuda/selective_scan_bwd.cu` (zero the accumulated gradients, chunk states when the forward
//! saved none, then the backward proper; for dB / dC in B's 16-bit dtype, one rounding of their
//! float32 scratch accumulators into the outputs).

use crate::error::{unsupported, value_err, Error, Result};
use crate::ops::next_pow2;
use crate::ops::scan::{self, Problem, ScanArgs, SAVE_CHUNK};
use crate::runtime::{runtime, DeviceCtx, KernelSpec, LoadedKernel, StreamChoice};
use crate::tensor::{
    byte_offsets_fit_i32, common_cuda_device, expect_no_overlap, DType, TensorView,
};
use std::sync::Arc;

pub const SOURCE: &str = include_str!("../../cuda/selective_scan_bwd.cu");
pub const FAMILY: &str = "selective_scan_bwd";
pub const ENTRY_BWD: &str = "selective_scan_bwd";
pub const ENTRY_STATES: &str = "selective_scan_bwd_states";
pub const ENTRY_ZERO: &str = "selective_scan_bwd_zero";
pub const ENTRY_CAST: &str = "selective_scan_bwd_cast";

/// Threads per block and `__launch_bounds__` min blocks. Up to dstate 32 (two states a lane, at
/// most 16 lanes a channel): 256 threads, 2 blocks (128 registers, 8 B of spills at dstate 16).
/// Measured on the H100 (2026-11-23, Mamba-1 config, bf16, dstate 16, CUDA-graph medians):
/// b8 d2048 L2048 256/2: 1494 us, 128/3 (167 registers, no spills): 1909 us, 128/4: 1601 us;
/// L8192: 5933 / 7615 / 6390 us; b32 d512 L60: 52 / 66 / 55 us. Above dstate 32: 128 threads,
/// 3 blocks (fewer spills with more states a lane). `DSTATE16_TILES` for the 16-bit, B-and-C
/// varying calls at dstate 16.
const BWD_THREADS_SMALL_STATE: i64 = 256;
const BWD_MIN_BLOCKS_SMALL_STATE: i64 = 2;
const BWD_THREADS: i64 = 128;
const BWD_MIN_BLOCKS: i64 = 3;
/// The zero-fill launch: blocks of 256 threads, at most this many blocks (grid-stride loop).
const ZERO_THREADS: u32 = 256;
const ZERO_MAX_BLOCKS: i64 = 1024;

/// Mirrors `struct ScanBwdParams` in cuda/selective_scan_bwd.cu (712 bytes). Strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanBwdParams {
    pub u: u64,
    pub delta: u64,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub delta_bias: u64,
    pub z: u64,
    pub initial_state: u64,
    pub dout: u64,
    pub saved: u64,
    pub dlast: u64,
    pub du: u64,
    pub ddelta: u64,
    pub da: u64,
    pub db: u64,
    pub dc: u64,
    pub dd: u64,
    pub dz: u64,
    pub ddelta_bias: u64,
    pub dinit: u64,
    pub ck: u64,
    pub batch: i64,
    pub dim: i64,
    pub seqlen: i64,
    pub dstate: i64,
    pub ngroups: i64,
    pub nsaved: i64,
    pub u_batch: i64,
    pub u_dim: i64,
    pub delta_batch: i64,
    pub delta_dim: i64,
    pub z_batch: i64,
    pub z_dim: i64,
    pub dout_batch: i64,
    pub dout_dim: i64,
    pub du_batch: i64,
    pub du_dim: i64,
    pub ddelta_batch: i64,
    pub ddelta_dim: i64,
    pub dz_batch: i64,
    pub dz_dim: i64,
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
    pub saved_batch: i64,
    pub saved_dim: i64,
    pub saved_chunk: i64,
    pub saved_dstate: i64,
    pub dlast_batch: i64,
    pub dlast_dim: i64,
    pub dlast_dstate: i64,
    pub da_dim: i64,
    pub da_dstate: i64,
    pub db_batch: i64,
    pub db_group: i64,
    pub db_dstate: i64,
    pub db_dim: i64,
    pub dc_batch: i64,
    pub dc_group: i64,
    pub dc_dstate: i64,
    pub dc_dim: i64,
    pub dd_dim: i64,
    pub ddelta_bias_dim: i64,
    pub dinit_batch: i64,
    pub dinit_dim: i64,
    pub dinit_dstate: i64,
    /// Element counts of dA, dB, dC, dD, ddelta_bias (0 when absent) for the zero-fill.
    pub zero_n: [i64; 5],
    pub chans_per_block: i32,
    pub nitems: i32,
    pub has_d: i32,
    pub has_z: i32,
    pub has_delta_bias: i32,
    pub softplus: i32,
    pub has_initial_state: i32,
    pub has_saved: i32,
    pub has_dlast: i32,
    pub io_align: i32,
}

const _: () = assert!(std::mem::size_of::<ScanBwdParams>() == 712);

/// Mirrors `struct ScanBwdCastParams` in cuda/selective_scan_bwd.cu: dB / dC accumulated in
/// float32 scratch (`src`), rounded into their 16-bit outputs (`dst`); n = 0 skips one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanBwdCastParams {
    pub src: [u64; 2],
    pub dst: [u64; 2],
    pub n: [i64; 2],
}

const _: () = assert!(std::mem::size_of::<ScanBwdCastParams>() == 48);

pub struct ScanBwdArgs<'a> {
    pub u: &'a TensorView,
    pub delta: &'a TensorView,
    pub a: &'a TensorView,
    pub b: &'a TensorView,
    pub c: &'a TensorView,
    pub d: Option<&'a TensorView>,
    pub z: Option<&'a TensorView>,
    pub delta_bias: Option<&'a TensorView>,
    pub initial_state: Option<&'a TensorView>,
    /// (batch, dim, seqlen), dtype of u.
    pub dout: &'a TensorView,
    /// From the forward; None -> recomputed here.
    pub saved_states: Option<&'a TensorView>,
    /// f32 (batch, dim, dstate): gradient reaching the returned last state, or None (= 0).
    pub dlast_state: Option<&'a TensorView>,
    pub du: &'a TensorView,
    pub ddelta: &'a TensorView,
    /// f32 (dim, dstate), contiguous.
    pub da: &'a TensorView,
    /// f32, shape of B / C, contiguous.
    pub db: &'a TensorView,
    pub dc: &'a TensorView,
    /// f32 (dim,), iff D.
    pub dd: Option<&'a TensorView>,
    /// Shape / dtype of z, iff z.
    pub dz: Option<&'a TensorView>,
    /// f32 (dim,), iff delta_bias.
    pub ddelta_bias: Option<&'a TensorView>,
    /// f32 (batch, dim, dstate), iff initial_state.
    pub dinitial_state: Option<&'a TensorView>,
    pub delta_softplus: bool,
}

impl<'a> ScanBwdArgs<'a> {
    /// The forward's view of the inputs (dout in the place of out), for `scan::check_core`.
    fn forward_args(&self) -> ScanArgs<'a> {
        ScanArgs {
            u: self.u,
            delta: self.delta,
            a: self.a,
            b: self.b,
            c: self.c,
            d: self.d,
            z: self.z,
            delta_bias: self.delta_bias,
            initial_state: self.initial_state,
            out: self.dout,
            last_state: self.dlast_state,
            saved_states: self.saved_states,
            delta_softplus: self.delta_softplus,
        }
    }

    fn inputs(&self) -> [(&'static str, Option<&TensorView>); 12] {
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
            ("dout", Some(self.dout)),
            ("saved_states", self.saved_states),
            ("dlast_state", self.dlast_state),
        ]
    }

    fn outputs(&self) -> [(&'static str, Option<&TensorView>); 9] {
        [
            ("du", Some(self.du)),
            ("ddelta", Some(self.ddelta)),
            ("dA", Some(self.da)),
            ("dB", Some(self.db)),
            ("dC", Some(self.dc)),
            ("dD", self.dd),
            ("dz", self.dz),
            ("ddelta_bias", self.ddelta_bias),
            ("dinitial_state", self.dinitial_state),
        ]
    }
}

/// A gradient is given exactly when its input is.
fn expect_paired(
    grad: &str,
    g: Option<&TensorView>,
    input: &str,
    i: Option<&TensorView>,
) -> Result<()> {
    match (g.is_some(), i.is_some()) {
        (true, false) => Err(value_err(format!("{grad} is given but {input} is not"))),
        (false, true) => Err(value_err(format!(
            "{input} is given, so {grad} is required"
        ))),
        _ => Ok(()),
    }
}

/// Every check of the backward; pure (no GPU). Returns the problem and the dB / dC forms.
pub fn check(a: &ScanBwdArgs) -> Result<(Problem, scan::BcForm, scan::BcForm)> {
    // The forward's checks of the inputs, dout standing where out is (dtype and shape of u) and
    // dlast_state where last_state is (f32 (batch, dim, dstate)).
    let p = scan::check_core(&a.forward_args(), false)?;
    expect_paired("dD", a.dd, "D", a.d)?;
    expect_paired("dz", a.dz, "z", a.z)?;
    expect_paired("ddelta_bias", a.ddelta_bias, "delta_bias", a.delta_bias)?;
    expect_paired(
        "dinitial_state",
        a.dinitial_state,
        "initial_state",
        a.initial_state,
    )?;
    for (name, t) in [("du", Some(a.du)), ("ddelta", Some(a.ddelta)), ("dz", a.dz)] {
        if let Some(t) = t {
            t.expect_same_dtype(name, a.u, "u")?;
            t.expect_shape(name, &a.u.shape)?;
            t.expect_unit_stride(name, 2, "seqlen")?;
        }
    }
    // Accumulated gradients: contiguous (zero-filled as flat arrays); f32 but for dB / dC.
    a.da.expect_dtype("dA", &[DType::F32])?;
    a.da.expect_shape("dA", &a.a.shape)?;
    let dbf = scan::bc_form(a.db, "dB", p.batch, p.dim, p.dstate, p.seqlen)?;
    let dcf = scan::bc_form(a.dc, "dC", p.batch, p.dim, p.dstate, p.seqlen)?;
    // dB / dC: float32 (accumulated in place) or the input's dtype (accumulated in float32
    // scratch, rounded once into the output at the end)
    for (name, g, t) in [("dB", a.db, a.b), ("dC", a.dc, a.c)] {
        g.expect_dtype(name, &[DType::F32, t.dtype])?;
        if g.shape != t.shape {
            return Err(value_err(format!(
                "{name} must have the shape of {} {:?}; got {:?}",
                &name[1..],
                t.shape,
                g.shape
            )));
        }
    }
    for (name, t) in [("dD", a.dd), ("ddelta_bias", a.ddelta_bias)] {
        if let Some(t) = t {
            t.expect_dtype(name, &[DType::F32])?;
            t.expect_shape(name, &[p.dim])?;
        }
    }
    for (name, t) in [
        ("dA", Some(a.da)),
        ("dB", Some(a.db)),
        ("dC", Some(a.dc)),
        ("dD", a.dd),
        ("ddelta_bias", a.ddelta_bias),
    ] {
        if let Some(t) = t {
            t.expect_contiguous(name)?;
        }
    }
    if let Some(t) = a.dinitial_state {
        t.expect_dtype("dinitial_state", &[DType::F32])?;
        t.expect_shape("dinitial_state", &[p.batch, p.dim, p.dstate])?;
    }
    for (name, t) in a.outputs() {
        if let Some(t) = t {
            t.expect_writable(name)?;
        }
    }
    expect_no_overlap(&a.outputs(), &a.inputs())?;
    // The forward's test covered the inputs (dout, dlast_state and saved_states among them); a
    // 32-bit backward also needs the gradients' offsets to fit (the f32 scratch of a 16-bit dB /
    // dC is indexed in elements, which fit where dB's bytes do).
    let p = Problem {
        idx32: p.idx32 && byte_offsets_fit_i32(&a.outputs().map(|(_, t)| t)),
        ..p
    };
    Ok((p, dbf, dcf))
}

fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// Tile constants for a dstate (see the kernel's header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BwdTiles {
    pub dpad: i64,
    pub nsplit: i64,
    pub tile: i64,
    pub threads: i64,
    pub min_blocks: i64,
    /// 32-bit index arithmetic in the kernel (`FS_IDX32`): `DSTATE16_TILES` only, taken where
    /// every byte offset of the call's tensors, gradients included, fits (`Problem::idx32` as
    /// `check` leaves it).
    pub idx32: bool,
}

impl BwdTiles {
    /// States per lane.
    pub fn ns(&self) -> i64 {
        self.dpad / self.nsplit
    }
}

/// dstate 16 with 16-bit u / delta and both B and C varying (the Mamba-1 training layer), outside
/// the small grids: 4 lanes a channel (4 states a lane), 8-step tiles, 128 threads, 4 blocks (128
/// registers, 48-56 B of stack on NVRTC 13.5: inside the training variants' spill bound; the
/// fixed-B or fixed-C and fp32 variants of this plan would spill 72-160 B, so they keep `tiles`).
/// Measured on the H100 (2026-11-27, `tools/scan_tile_sweep.py --bwd`, bf16, D, z, delta_bias,
/// softplus, kernel us): b8 d2048 L2048 1458 vs 1532 for `tiles(16)` (8 lanes / 16 steps / 256
/// threads / 2 blocks); L8192 5794 vs 6092; b2 d5120 L16384 9575 vs 9895; b32 d512 L60 50.3 vs
/// 52.2. Tried in the same sweep and slower at L2048: 4 lanes 128/3 (1991), 4 lanes 4 steps 128/4
/// (1806), 8 lanes 8 steps 128/4 (1856), 4 lanes 4 steps 256/2 (1871).
pub const DSTATE16_TILES: BwdTiles = BwdTiles {
    dpad: 16,
    nsplit: 4,
    tile: 8,
    threads: 128,
    min_blocks: 4,
    idx32: false,
};

/// Two states a lane up to dstate 64 (32 lanes a channel), more above; the register history of a
/// tile (2 * tile * states-per-lane floats) stays at <= 64 registers.
pub fn tiles(dstate: i64) -> BwdTiles {
    let dpad = next_pow2(dstate);
    let nsplit = (dpad / 2).clamp(1, 32);
    let ns = dpad / nsplit;
    let tile = if ns >= 8 {
        4
    } else if ns == 4 || nsplit <= 2 {
        8
    } else {
        16
    };
    let small = dpad <= 32;
    BwdTiles {
        dpad,
        nsplit,
        tile,
        threads: if small {
            BWD_THREADS_SMALL_STATE
        } else {
            BWD_THREADS
        },
        min_blocks: if small {
            BWD_MIN_BLOCKS_SMALL_STATE
        } else {
            BWD_MIN_BLOCKS
        },
        idx32: false,
    }
}

/// The launch plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BwdPlan {
    pub tiles: BwdTiles,
    pub chans_per_block: i64,
    pub nitems: i64,
    /// Blocks of the persistent backward launch (<= nitems).
    pub grid: i64,
    pub smem: i64,
    pub nsaved: i64,
    /// Checkpoint scratch (floats): grid * (SAVE_CHUNK / tile) * threads * states-per-lane.
    pub ck_floats: i64,
}

/// `FLASHSCAN_SCAN_BWD_TILES`: the backward's tuning override (`scan::TileOverride`).
fn tiles_override() -> &'static scan::TileOverride {
    static O: std::sync::OnceLock<scan::TileOverride> = std::sync::OnceLock::new();
    O.get_or_init(|| scan::tiles_from_env("FLASHSCAN_SCAN_BWD_TILES"))
}

/// Whether an override's tiles satisfy the backward kernel's static asserts for a padded dstate.
fn override_fits(o: &[i64; 5], dpad: i64) -> bool {
    let [nsplit, tile, threads, min_blocks, cpt] = *o;
    (1..=32).contains(&nsplit)
        && nsplit & (nsplit - 1) == 0
        && dpad % nsplit == 0
        && tile >= 4
        && tile % 4 == 0
        && SAVE_CHUNK % tile == 0
        && (32..=1024).contains(&threads)
        && threads % 32 == 0
        && (1..=32).contains(&min_blocks)
        && cpt == 1 // (the backward has one channel a lane group)
}

/// Small grids of short sequences at dstate 16: one state a lane (16 lanes a channel) while the
/// grid stays within one block per SM. Measured on the H100 (2026-11-24, d512 L60 bf16, kernel us,
/// `benches/results/2026-11-24-h100-realtime/`): b1 15.7 vs 19.9 with 8 lanes; at b32 (1024
/// blocks) 72.1 vs 51.4, so not there.
fn small_grid_tiles(p: &Problem, sm_count: i64) -> BwdTiles {
    let t = tiles(p.dstate);
    let wide = wide_tiles(t);
    let blocks = p.batch * cdiv(p.dim, wide.threads / wide.nsplit);
    if t.dpad == 16 && p.seqlen <= 64 && blocks <= sm_count {
        wide
    } else {
        t
    }
}

/// `tiles` with 16 lanes a channel (one state a lane at dstate 16): `small_grid_tiles`' choice.
fn wide_tiles(t: BwdTiles) -> BwdTiles {
    BwdTiles { nsplit: 16, ..t }
}

/// The tiles without an override: `small_grid_tiles`' choice, with `DSTATE16_TILES` where that
/// is `tiles(16)` and the call is what the plan was measured on.
fn default_tiles(p: &Problem, in_dt: DType, sm_count: i64) -> BwdTiles {
    let t = small_grid_tiles(p, sm_count);
    let measured = p.b.varying && p.c.varying && in_dt != DType::F32;
    if t == tiles(16) && measured {
        // 32-bit indices where they fit. H200 (2026-12-03): see the kernel's FS_IDX32 note.
        BwdTiles {
            idx32: p.idx32 && !scan::idx32_long_off(),
            ..DSTATE16_TILES
        }
    } else {
        t
    }
}

/// The backward's tiles: the override when set (an error if it does not fit this dstate), else
/// `default_tiles`.
fn bwd_tiles(p: &Problem, in_dt: DType, sm_count: i64) -> Result<BwdTiles> {
    let t = default_tiles(p, in_dt, sm_count);
    match tiles_override() {
        None => Ok(t),
        Some(o) => {
            let o = o.as_ref().map_err(|e| value_err(e.clone()))?;
            if !override_fits(o, t.dpad) {
                return Err(value_err(format!(
                    "FLASHSCAN_SCAN_BWD_TILES {o:?} does not fit dstate {} (padded {})",
                    p.dstate, t.dpad
                )));
            }
            Ok(BwdTiles {
                nsplit: o[0],
                tile: o[1],
                threads: o[2],
                min_blocks: o[3],
                ..t
            })
        }
    }
}

pub fn plan(p: &Problem, in_dt: DType, sm_count: i64) -> BwdPlan {
    plan_with(p, default_tiles(p, in_dt, sm_count), sm_count)
}

fn plan_with(p: &Problem, t: BwdTiles, sm_count: i64) -> BwdPlan {
    let chans = t.threads / t.nsplit;
    let dpg = p.dim / p.ngroups;
    let cpb = if (p.b.varying || p.c.varying) && p.ngroups > 1 {
        (1..=chans.min(dpg))
            .rev()
            .find(|c| dpg % c == 0)
            .unwrap_or(1)
    } else {
        chans
    };
    let nitems = p.batch * cdiv(p.dim, cpb);
    let grid = nitems.min(sm_count.max(1) * t.min_blocks).max(1);
    let row = if t.dpad >= 4 { t.dpad + 4 } else { t.dpad };
    let nvar = p.b.varying as i64 + p.c.varying as i64;
    let floats = nvar * t.tile * row
        + 4 * chans * t.tile
        + t.threads * 3 * (t.tile + 2)
        + if nvar > 0 {
            t.threads / 32 * 2 * t.dpad * (t.tile + 1)
        } else {
            0
        };
    BwdPlan {
        tiles: t,
        chans_per_block: cpb,
        nitems,
        grid,
        smem: 4 * floats,
        nsaved: scan::saved_state_count(p.seqlen),
        ck_floats: grid * (SAVE_CHUNK / t.tile) * t.threads * t.ns(),
    }
}

pub fn spec(
    t: &BwdTiles,
    in_dtype: DType,
    bc_dtype: DType,
    bv: bool,
    cv: bool,
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
        ("FS_B_VARYING", bv as i64),
        ("FS_C_VARYING", cv as i64),
        ("FS_CHUNK", SAVE_CHUNK),
        ("FS_ARCH", arch),
    ];
    if t.idx32 {
        defines.push(("FS_IDX32", 1));
    }
    Ok(KernelSpec {
        family: FAMILY,
        source: SOURCE,
        entry,
        defines,
    })
}

/// Every variant (one translation unit per define set; its three entries live in it).
pub fn all_specs(arch_num: i64) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    let mut all: Vec<BwdTiles> = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        .iter()
        .map(|&d| tiles(d))
        .collect();
    // small_grid_tiles' choice
    all.push(wide_tiles(tiles(16)));
    // default_tiles' DSTATE16_TILES: 16-bit u / delta, B and C varying; 64- and 32-bit indices
    for idx32 in [false, true] {
        let t = BwdTiles {
            idx32,
            ..DSTATE16_TILES
        };
        for in_dt in [DType::F16, DType::BF16] {
            for bc in [in_dt, DType::F32] {
                if let Ok(s) = spec(&t, in_dt, bc, true, true, arch_num, ENTRY_BWD) {
                    out.push(s);
                }
            }
        }
    }
    for t in all {
        for (in_dt, bc) in scan::IN_BC_DTYPES {
            for (bv, cv) in [(false, false), (false, true), (true, false), (true, true)] {
                if let Ok(s) = spec(&t, in_dt, bc, bv, cv, arch_num, ENTRY_BWD) {
                    out.push(s);
                }
            }
        }
    }
    out
}

fn ptr(t: Option<&TensorView>) -> u64 {
    t.map_or(0, |t| t.ptr)
}

fn stride(t: Option<&TensorView>, i: usize) -> i64 {
    t.map_or(0, |t| t.strides[i])
}

/// A backward call made ready to launch: the device, its kernels, the launch plan, the
/// parameter blocks holding the call's pointers.
struct BwdPrepared {
    dev: Arc<DeviceCtx>,
    pl: BwdPlan,
    /// batch, dim or seqlen is 0: only the zero-fill (and the cast) run
    empty: bool,
    /// the chunk-states launch runs (several chunks, no saved states)
    states: bool,
    zero_k: Arc<LoadedKernel>,
    bwd_k: Option<Arc<LoadedKernel>>,
    states_k: Option<Arc<LoadedKernel>>,
    cast_k: Option<Arc<LoadedKernel>>,
    params: ScanBwdParams,
    /// dB / dC rounded from float32 scratch: dst and n set, src per call
    cast: ScanBwdCastParams,
}

/// Every check of a backward call, its plan, kernels and parameter blocks.
fn prepare(a: &ScanBwdArgs) -> Result<BwdPrepared> {
    let (p, dbf, dcf) = check(a)?;
    let mut named = a.inputs().to_vec();
    named.extend(a.outputs());
    let device = common_cuda_device(&named)?;
    if p.seqlen == 0 && a.dinitial_state.is_some() && p.batch * p.dim > 0 {
        return Err(unsupported(
            "seqlen = 0 with initial_state: nothing to differentiate",
        ));
    }
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?.clone();
    // The device's context stays current while kernels load.
    let _bound = dev.bind()?;
    let arch = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let sm_count = dev.props.sm_count as i64;
    let in_dt = a.u.dtype;
    let pl = plan_with(&p, bwd_tiles(&p, in_dt, sm_count)?, sm_count);
    let nitems = i32::try_from(pl.nitems)
        .map_err(|_| unsupported("batch * dim too large for one launch"))?;
    let (bv, cv) = (p.b.varying, p.c.varying);
    let kspec = |entry| spec(&pl.tiles, in_dt, a.b.dtype, bv, cv, arch, entry);
    let empty = p.batch == 0 || p.dim == 0 || p.seqlen == 0;
    let states = !empty && pl.nsaved > 0 && a.saved_states.is_none();
    // dB / dC in B's 16-bit dtype: float32 accumulators in scratch, rounded into the outputs by
    // the last launch (so the caller converts nothing)
    let mut cast = ScanBwdCastParams::default();
    for (k, g) in [a.db, a.dc].into_iter().enumerate() {
        if g.dtype != DType::F32 && g.numel() > 0 {
            cast.dst[k] = g.ptr;
            cast.n[k] = g.numel();
        }
    }
    let params = ScanBwdParams {
        u: a.u.ptr,
        delta: a.delta.ptr,
        a: a.a.ptr,
        b: a.b.ptr,
        c: a.c.ptr,
        d: ptr(a.d),
        delta_bias: ptr(a.delta_bias),
        z: ptr(a.z),
        initial_state: ptr(a.initial_state),
        dout: a.dout.ptr,
        saved: ptr(a.saved_states),
        dlast: ptr(a.dlast_state),
        du: a.du.ptr,
        ddelta: a.ddelta.ptr,
        da: a.da.ptr,
        db: a.db.ptr,
        dc: a.dc.ptr,
        dd: ptr(a.dd),
        dz: ptr(a.dz),
        ddelta_bias: ptr(a.ddelta_bias),
        dinit: ptr(a.dinitial_state),
        ck: 0,
        batch: p.batch,
        dim: p.dim,
        seqlen: p.seqlen,
        dstate: p.dstate,
        ngroups: p.ngroups,
        nsaved: pl.nsaved,
        u_batch: a.u.strides[0],
        u_dim: a.u.strides[1],
        delta_batch: a.delta.strides[0],
        delta_dim: a.delta.strides[1],
        z_batch: stride(a.z, 0),
        z_dim: stride(a.z, 1),
        dout_batch: a.dout.strides[0],
        dout_dim: a.dout.strides[1],
        du_batch: a.du.strides[0],
        du_dim: a.du.strides[1],
        ddelta_batch: a.ddelta.strides[0],
        ddelta_dim: a.ddelta.strides[1],
        dz_batch: stride(a.dz, 0),
        dz_dim: stride(a.dz, 1),
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
        d_dim: stride(a.d, 0),
        delta_bias_dim: stride(a.delta_bias, 0),
        init_batch: stride(a.initial_state, 0),
        init_dim: stride(a.initial_state, 1),
        init_dstate: stride(a.initial_state, 2),
        saved_batch: stride(a.saved_states, 0),
        saved_dim: stride(a.saved_states, 1),
        saved_chunk: stride(a.saved_states, 2),
        saved_dstate: stride(a.saved_states, 3),
        dlast_batch: stride(a.dlast_state, 0),
        dlast_dim: stride(a.dlast_state, 1),
        dlast_dstate: stride(a.dlast_state, 2),
        da_dim: a.da.strides[0],
        da_dstate: a.da.strides[1],
        db_batch: dbf.strides[0],
        db_group: dbf.strides[1],
        db_dstate: dbf.strides[2],
        db_dim: dbf.strides[3],
        dc_batch: dcf.strides[0],
        dc_group: dcf.strides[1],
        dc_dstate: dcf.strides[2],
        dc_dim: dcf.strides[3],
        dd_dim: stride(a.dd, 0),
        ddelta_bias_dim: stride(a.ddelta_bias, 0),
        dinit_batch: stride(a.dinitial_state, 0),
        dinit_dim: stride(a.dinitial_state, 1),
        dinit_dstate: stride(a.dinitial_state, 2),
        zero_n: [
            a.da.numel(),
            a.db.numel(),
            a.dc.numel(),
            a.dd.map_or(0, |t| t.numel()),
            a.ddelta_bias.map_or(0, |t| t.numel()),
        ],
        chans_per_block: pl.chans_per_block as i32,
        nitems,
        has_d: a.d.is_some() as i32,
        has_z: a.z.is_some() as i32,
        has_delta_bias: a.delta_bias.is_some() as i32,
        softplus: a.delta_softplus as i32,
        has_initial_state: a.initial_state.is_some() as i32,
        has_saved: 0,
        has_dlast: a.dlast_state.is_some() as i32,
        io_align: scan::io_align(
            &[a.u, a.delta, a.dout, a.du, a.ddelta]
                .into_iter()
                .chain(a.z)
                .chain(a.dz)
                .collect::<Vec<_>>(),
        ),
    };
    let load = |entry, wanted: bool| -> Result<Option<Arc<LoadedKernel>>> {
        wanted.then(|| dev.kernel(&kspec(entry)?)).transpose()
    };
    Ok(BwdPrepared {
        zero_k: dev.kernel(&kspec(ENTRY_ZERO)?)?,
        bwd_k: load(ENTRY_BWD, !empty)?,
        states_k: load(ENTRY_STATES, states)?,
        cast_k: load(ENTRY_CAST, cast.n[0].max(cast.n[1]) > 0)?,
        dev: dev.clone(),
        pl,
        empty,
        states,
        params,
        cast,
    })
}

impl BwdPrepared {
    /// The launches of one call with `params` / `cast` (this call's pointers): scratch, the
    /// zero-fill, the chunk states when needed, the backward, the rounding of dB / dC.
    ///
    /// # Safety
    /// Every pointer in `params` and `cast.dst` must be valid for what the kernels index with
    /// the sizes and strides `params` holds (checked by `prepare` for its call).
    unsafe fn run(
        &self,
        mut params: ScanBwdParams,
        mut cast: ScanBwdCastParams,
        stream: StreamChoice,
    ) -> Result<()> {
        let dev = &self.dev;
        let pl = &self.pl;
        // The device's context stays current for the whole call (scratch, launches, frees)
        // and the caller's is current again when this returns.
        let _bound = dev.bind()?;
        let s = dev.stream(stream)?;
        let mut scratch = dev.scratch(s)?;
        for k in 0..2 {
            if cast.n[k] > 0 {
                cast.src[k] = scratch.alloc(4 * cast.n[k] as usize)?;
            }
        }
        if cast.n[0] > 0 {
            params.db = cast.src[0];
        }
        if cast.n[1] > 0 {
            params.dc = cast.src[1];
        }
        let zero_blocks = (params.zero_n.iter().max().copied().unwrap_or(0) / ZERO_THREADS as i64
            + 1)
        .min(ZERO_MAX_BLOCKS) as u32;
        let block = (pl.tiles.threads as u32, 1, 1);
        // SAFETY (every launch): the caller's, plus: params mirrors ScanBwdParams; the zero
        // kernel writes zero_n[i] f32 elements of the contiguous dA, dB, dC, dD, ddelta_bias
        // (for 16-bit dB / dC their float32 scratch accumulators of the same counts); ck holds
        // grid * (SAVE_CHUNK / tile) * threads * ns floats as indexed by blockIdx.x; saved holds
        // every chunk state the kernel reads (nsaved > 0 implies it is set); cast mirrors
        // ScanBwdCastParams, src[k] the n[k] floats summed by the launches before it.
        unsafe {
            // 1. zero the accumulated gradients (flat, contiguous: checked).
            dev.launch(
                &self.zero_k,
                (zero_blocks, 1, 1),
                (ZERO_THREADS, 1, 1),
                0,
                s,
                &params,
            )?;
            if let Some(bwd_k) = &self.bwd_k {
                params.ck = scratch.alloc((4 * pl.ck_floats) as usize)?;
                // 2. chunk states, when the sequence has several chunks and the forward saved
                // none: the states kernel writes batch*dim*nsaved*dstate floats of the scratch
                // allocated here, with the strides set here.
                if let Some(states_k) = self.states_k.as_ref().filter(|_| self.states) {
                    let (batch, dim, dstate) = (params.batch, params.dim, params.dstate);
                    let n = batch * dim * pl.nsaved * dstate;
                    params.saved = scratch.alloc((4 * n) as usize)?;
                    params.saved_dstate = 1;
                    params.saved_chunk = dstate;
                    params.saved_dim = pl.nsaved * dstate;
                    params.saved_batch = dim * pl.nsaved * dstate;
                    dev.launch(
                        states_k,
                        (params.nitems as u32, 1, 1),
                        block,
                        pl.smem as u32,
                        s,
                        &params,
                    )?;
                }
                params.has_saved = (params.saved != 0) as i32;
                // 3. the backward: persistent grid over the items.
                dev.launch(
                    bwd_k,
                    (pl.grid as u32, 1, 1),
                    block,
                    pl.smem as u32,
                    s,
                    &params,
                )?;
            }
            // 4. dB / dC rounded into their 16-bit outputs (dim 0: zeros).
            if let Some(cast_k) = &self.cast_k {
                let n = cast.n[0].max(cast.n[1]);
                let blocks = (n / ZERO_THREADS as i64 + 1).min(ZERO_MAX_BLOCKS) as u32;
                dev.launch(cast_k, (blocks, 1, 1), (ZERO_THREADS, 1, 1), 0, s, &cast)?;
            }
        }
        scratch.free()?; // ordered after the launches on the same stream
        dev.finish(stream)
    }
}

pub fn backward(a: &ScanBwdArgs, stream: StreamChoice) -> Result<()> {
    let prep = prepare(a)?;
    // SAFETY: `prepare` checked every pointer of `a` (shape, dtype, device, strides).
    unsafe { prep.run(prep.params, prep.cast, stream) }
}

/// The pointers of one backward call, in `ScanBwdArgs` order (0 for an absent optional).
#[derive(Clone, Copy, Debug, Default)]
pub struct BwdPtrs {
    pub inputs: [u64; 12],
    pub outputs: [u64; 9],
}

/// A checked backward of one signature (shapes, strides, dtypes, device, which optionals are
/// present, flags), replayed with new pointers by a caller that made sure its tensors have
/// that signature (flashscan.torch's lean path: its cache key). What it saves per call: the
/// import of 21 descriptors, every check, the plan and the kernel lookups.
pub struct BwdReplay {
    prep: BwdPrepared,
    /// io_align of the strides alone (the pointers' alignment is folded in per call)
    stride_align: u64,
    /// element sizes of u, delta, dout, du, ddelta, z, dz (the io_align tensors)
    elem: [u64; 7],
    present: [bool; 21],
}

/// The replayable plan of the call `a` (every check done, kernels loaded); None for an empty
/// problem.
pub fn backward_replay(a: &ScanBwdArgs) -> Result<Option<BwdReplay>> {
    let prep = prepare(a)?;
    if prep.empty {
        return Ok(None);
    }
    let aligned: Vec<&TensorView> = [a.u, a.delta, a.dout, a.du, a.ddelta]
        .into_iter()
        .chain(a.z)
        .chain(a.dz)
        .collect();
    let es = |t: Option<&TensorView>| t.map_or(1, |t| t.dtype.size() as u64);
    let mut present = [false; 21];
    for (i, (_, t)) in a.inputs().iter().chain(a.outputs().iter()).enumerate() {
        present[i] = t.is_some();
    }
    Ok(Some(BwdReplay {
        stride_align: scan::stride_align(&aligned),
        elem: [
            es(Some(a.u)),
            es(Some(a.delta)),
            es(Some(a.dout)),
            es(Some(a.du)),
            es(Some(a.ddelta)),
            es(a.z),
            es(a.dz),
        ],
        present,
        prep,
    }))
}

impl BwdReplay {
    /// The planned call on new pointers (the caller's tensors have the planned signature).
    /// Checks only what the pointers alone can break: the arguments present as planned (no
    /// null pointer), the element alignment of the io_align tensors.
    pub fn launch(&self, x: &BwdPtrs, stream: StreamChoice) -> Result<()> {
        let mut all = [0u64; 21];
        all[..12].copy_from_slice(&x.inputs);
        all[12..].copy_from_slice(&x.outputs);
        scan::expect_planned(&all, &self.present)?;
        let [u, delta, a, b, c, d, z, delta_bias, init, dout, saved, dlast] = x.inputs;
        let [du, ddelta, da, db, dc, dd, dz, ddb, dinit] = x.outputs;
        let [e_u, e_delta, e_dout, e_du, e_ddelta, e_z, e_dz] = self.elem;
        let pairs = [
            (u, e_u),
            (delta, e_delta),
            (dout, e_dout),
            (du, e_du),
            (ddelta, e_ddelta),
            (z, e_z),
            (dz, e_dz),
        ];
        let align = scan::replay_align(self.stride_align, &pairs)?;
        let mut p = self.prep.params;
        (p.u, p.delta, p.a, p.b, p.c, p.d) = (u, delta, a, b, c, d);
        (p.delta_bias, p.z, p.initial_state, p.dout, p.dlast) = (delta_bias, z, init, dout, dlast);
        p.saved = if self.prep.states { 0 } else { saved };
        (p.du, p.ddelta, p.da, p.db, p.dc, p.dd) = (du, ddelta, da, db, dc, dd);
        (p.dz, p.ddelta_bias, p.dinit) = (dz, ddb, dinit);
        p.io_align = align;
        let mut cast = self.prep.cast;
        for (k, ptr) in [db, dc].into_iter().enumerate() {
            if cast.n[k] > 0 {
                cast.dst[k] = ptr;
            }
        }
        // SAFETY: the plan's call was checked by `prepare`; the caller guarantees these
        // pointers are tensors of that call's signature (what the lean path's cache key holds).
        unsafe { self.prep.run(p, cast, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DeviceKind;

    fn view(shape: &[i64], dtype: DType, ptr: u64) -> TensorView {
        let mut strides = vec![1; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        TensorView {
            ptr,
            shape: shape.to_vec(),
            strides,
            dtype,
            device: DeviceKind::Cuda,
            device_id: 0,
            readonly: false,
        }
    }

    struct Set {
        t: Vec<TensorView>,
    }

    /// u, delta, A, B, C, D, dout, du, ddelta, dA, dB, dC, dD (varying B/C, one group), at
    /// disjoint addresses.
    fn set(batch: i64, dim: i64, seqlen: i64, dstate: i64) -> Set {
        let shapes: Vec<(Vec<i64>, DType)> = vec![
            (vec![batch, dim, seqlen], DType::BF16),
            (vec![batch, dim, seqlen], DType::BF16),
            (vec![dim, dstate], DType::F32),
            (vec![batch, 1, dstate, seqlen], DType::BF16),
            (vec![batch, 1, dstate, seqlen], DType::BF16),
            (vec![dim], DType::F32),
            (vec![batch, dim, seqlen], DType::BF16),
            (vec![batch, dim, seqlen], DType::BF16),
            (vec![batch, dim, seqlen], DType::BF16),
            (vec![dim, dstate], DType::F32),
            (vec![batch, 1, dstate, seqlen], DType::F32),
            (vec![batch, 1, dstate, seqlen], DType::F32),
            (vec![dim], DType::F32),
        ];
        let t = shapes
            .iter()
            .enumerate()
            .map(|(i, (s, d))| view(s, *d, 0x1000_0000 * (i as u64 + 1)))
            .collect();
        Set { t }
    }

    fn args(s: &Set) -> ScanBwdArgs<'_> {
        let t = &s.t;
        ScanBwdArgs {
            u: &t[0],
            delta: &t[1],
            a: &t[2],
            b: &t[3],
            c: &t[4],
            d: Some(&t[5]),
            z: None,
            delta_bias: None,
            initial_state: None,
            dout: &t[6],
            saved_states: None,
            dlast_state: None,
            du: &t[7],
            ddelta: &t[8],
            da: &t[9],
            db: &t[10],
            dc: &t[11],
            dd: Some(&t[12]),
            dz: None,
            ddelta_bias: None,
            dinitial_state: None,
            delta_softplus: true,
        }
    }

    #[test]
    fn checks_accept_a_consistent_set_and_name_bad_gradients() {
        let s = set(2, 64, 300, 16);
        let a = args(&s);
        let (p, dbf, _) = check(&a).unwrap();
        assert_eq!((p.batch, p.dim, p.seqlen, p.dstate), (2, 64, 300, 16));
        assert!(dbf.varying);
        // dD required with D
        let mut a2 = args(&s);
        a2.dd = None;
        assert!(check(&a2).unwrap_err().to_string().contains("dD"));
        // dz without z
        let dz = view(&[2, 64, 300], DType::BF16, 0x9_0000_0000);
        let mut a3 = args(&s);
        a3.dz = Some(&dz);
        assert!(check(&a3).unwrap_err().to_string().contains("dz"));
        // dA in the wrong dtype
        let bad = view(&[64, 16], DType::BF16, 0x9_1000_0000);
        let mut a4 = args(&s);
        a4.da = &bad;
        assert!(check(&a4).unwrap_err().to_string().contains("dA"));
        // an output aliasing an input
        let mut a5 = args(&s);
        a5.du = s.t.first().unwrap();
        assert!(check(&a5).unwrap_err().to_string().contains("overlaps"));
        // saved states of the wrong chunk count
        let sv = view(&[2, 64, 5, 16], DType::F32, 0x9_2000_0000);
        let mut a6 = args(&s);
        a6.saved_states = Some(&sv);
        assert!(check(&a6).unwrap_err().to_string().contains("saved_states"));
        let sv = view(
            &[2, 64, scan::saved_state_count(300), 16],
            DType::F32,
            0x9_2000_0000,
        );
        let mut a7 = args(&s);
        a7.saved_states = Some(&sv);
        assert!(check(&a7).is_ok());
        // dB / dC in B's 16-bit dtype (rounded from float32 scratch), not in another
        let db16 = view(&[2, 1, 16, 300], DType::BF16, 0x9_3000_0000);
        let dc16 = view(&[2, 1, 16, 300], DType::BF16, 0x9_4000_0000);
        let mut a8 = args(&s);
        a8.db = &db16;
        a8.dc = &dc16;
        assert!(check(&a8).is_ok());
        let dbh = view(&[2, 1, 16, 300], DType::F16, 0x9_3000_0000);
        let mut a9 = args(&s);
        a9.db = &dbh;
        let err = check(&a9).unwrap_err().to_string();
        assert!(err.contains("dB") && err.contains("float16"), "{err}");
    }

    #[test]
    fn saved_state_count_matches_the_chunking() {
        assert_eq!(scan::saved_state_count(0), 0);
        assert_eq!(scan::saved_state_count(1), 0);
        assert_eq!(scan::saved_state_count(SAVE_CHUNK), 0);
        assert_eq!(scan::saved_state_count(SAVE_CHUNK + 1), 1);
        assert_eq!(scan::saved_state_count(100_000), 390);
    }

    #[test]
    fn plan_matches_the_kernel_notes() {
        let s = set(8, 2048, 2048, 16);
        let (p, _, _) = check(&args(&s)).unwrap();
        // 16-bit, B and C varying: the measured dstate-16 plan
        // (in 32-bit indices: every byte offset, the gradients' included, fits)
        let pl = plan(&p, DType::BF16, 132);
        assert!(p.idx32);
        assert_eq!(
            pl.tiles,
            BwdTiles {
                idx32: true,
                ..DSTATE16_TILES
            }
        );
        assert_eq!((pl.tiles.nsplit, pl.tiles.tile), (4, 8));
        // offsets past 2^31 bytes: the 64-bit build of the same tiles
        let big = Problem { idx32: false, ..p };
        assert_eq!(plan(&big, DType::BF16, 132).tiles, DSTATE16_TILES);
        assert_eq!((pl.tiles.threads, pl.tiles.min_blocks), (128, 4));
        assert_eq!(pl.chans_per_block, 32);
        assert_eq!(pl.nitems, 8 * 64);
        // every item resident (132 x 4 slots)
        assert_eq!(pl.grid, 8 * 64);
        // sB + sC + sDT + sP + sRed (floats), as the kernel's Smem
        let smem = 2 * 8 * 20 + 4 * 32 * 8 + 128 * 3 * 10 + 4 * 2 * 16 * 9;
        assert_eq!(pl.smem, 4 * smem);
        assert_eq!(pl.ck_floats, pl.grid * (256 / 8) * 128 * 4);
        assert_eq!(pl.nsaved, 7);
        // fp32: tiles(16)
        let pl = plan(&p, DType::F32, 132);
        assert_eq!(pl.tiles, tiles(16));
        assert_eq!((pl.tiles.nsplit, pl.tiles.tile), (8, 16));
        assert_eq!((pl.tiles.threads, pl.tiles.min_blocks), (256, 2));
        assert_eq!(pl.grid, 132 * 2);
        let smem = 2 * 16 * 20 + 4 * 32 * 16 + 256 * 3 * 18 + 8 * 2 * 16 * 17;
        assert_eq!(pl.smem, 4 * smem);
        assert_eq!(pl.ck_floats, pl.grid * (256 / 16) * 256 * 2);
        // a fixed B: tiles(16)
        let fixed = Problem {
            b: scan::BcForm {
                varying: false,
                ..p.b
            },
            ..p
        };
        assert_eq!(plan(&fixed, DType::BF16, 132).tiles, tiles(16));
    }

    #[test]
    fn small_grids_of_short_sequences_take_16_lanes() {
        let p = |batch, seqlen, dstate| {
            let f = scan::BcForm {
                varying: true,
                ngroups: 1,
                strides: [0; 4],
            };
            Problem {
                batch,
                dim: 512,
                seqlen,
                dstate,
                b: f,
                c: f,
                ngroups: 1,
                idx32: true,
            }
        };
        assert_eq!(plan(&p(1, 60, 16), DType::BF16, 132).tiles.nsplit, 16);
        assert_eq!(plan(&p(4, 60, 16), DType::BF16, 132).tiles.nsplit, 16); // 128 blocks
        let d16 = BwdTiles {
            idx32: true,
            ..DSTATE16_TILES
        };
        assert_eq!(plan(&p(8, 60, 16), DType::BF16, 132).tiles, d16);
        assert_eq!(plan(&p(1, 65, 16), DType::BF16, 132).tiles, d16);
        let wide = plan(&p(1, 60, 16), DType::BF16, 132).tiles;
        assert_eq!((wide.tile, wide.threads, wide.min_blocks), (16, 256, 2));
        assert_eq!(plan(&p(1, 60, 64), DType::BF16, 132).tiles, tiles(64));
    }

    #[test]
    fn tile_override_is_checked() {
        assert!(override_fits(&[8, 16, 256, 2, 1], 16));
        assert!(override_fits(&[16, 8, 128, 4, 1], 16));
        assert!(!override_fits(&[32, 16, 256, 2, 1], 16)); // more lanes than states
        assert!(!override_fits(&[8, 6, 256, 2, 1], 16)); // tile not a multiple of 4
        assert!(!override_fits(&[8, 16, 100, 2, 1], 16)); // not whole warps
        assert!(!override_fits(&[8, 16, 256, 2, 2], 16)); // one channel a lane group
    }

    #[test]
    fn tiles_cover_every_dstate() {
        for d in 1..=256 {
            let t = tiles(d);
            assert!(t.dpad >= d && t.dpad % t.nsplit == 0);
            assert!(SAVE_CHUNK % t.tile == 0 && t.tile % 4 == 0);
            assert!(2 * t.tile * t.ns() <= 64);
            assert!(t.threads % t.nsplit == 0 && t.nsplit <= 32);
        }
    }
}
