//! Causal depthwise conv1d (causal-conv1d semantics): forward, backward and the decode update.
//! Argument checks, layout choice (channel-first: seqlen stride 1, or channel-last: dim
//! stride 1) and launch of `cuda/causal_conv1d.cu`.

use crate::error::{type_err, unsupported, value_err, Error, Result};
use crate::runtime::{runtime, KernelSpec, StreamChoice};
use crate::tensor::{
    byte_offsets_fit_i32, common_cuda_device, expect_no_overlap, DType, TensorView,
};

pub const SOURCE: &str = include_str!("../../cuda/causal_conv1d.cu");
pub const FAMILY: &str = "causal_conv1d";
const THREADS: i64 = 128;
const WARPS: i64 = THREADS / 32;
/// Positions per warp of the channel-last forward (the kernel's kT) and backward (its kTB).
const CL_STEPS: i64 = 32;
const CL_STEPS_BWD: i64 = 64;
/// Steps (THREADS x one 16-byte slice of positions each) a block of the channel-first backward
/// walks (the kernel's kStepsCF).
const CF_BWD_STEPS: i64 = 4;
/// Columns ((channel, tap) sums) per block of the dweight / dbias reduce (one a lane).
const REDUCE_COLS: i64 = 32;
/// Channels per lane of the channel-last kernels (the kernel's kVecF).
const CL_CHANNELS: i64 = 4;
/// Blocks an SM of `causal_conv1d_fwd_cl_short` (its `__launch_bounds__` minimum: <= 102
/// registers a thread).
const SHORT_FWD_BLOCKS_PER_SM: i64 = 5;

/// Mirrors `struct Conv1dParams` in cuda/causal_conv1d.cu (496 bytes). Strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Conv1dParams {
    pub x: u64,
    pub weight: u64,
    pub bias: u64,
    pub init: u64,
    pub seq_idx: u64,
    pub out: u64,
    pub final_states: u64,
    pub dout: u64,
    pub dfinal: u64,
    pub dx: u64,
    pub dinit: u64,
    pub partials: u64,
    pub dweight: u64,
    pub dbias: u64,
    pub state: u64,
    pub cache_seqlens: u64,
    pub batch: i64,
    pub dim: i64,
    pub seqlen: i64,
    pub state_len: i64,
    pub nparts: i64,
    pub x_s: [i64; 3],
    pub out_s: [i64; 3],
    pub init_s: [i64; 3],
    pub final_s: [i64; 3],
    pub dout_s: [i64; 3],
    pub dfinal_s: [i64; 3],
    pub dx_s: [i64; 3],
    pub dinit_s: [i64; 3],
    pub state_s: [i64; 3],
    pub seq_s: [i64; 2],
    pub w_s: [i64; 2],
    pub dw_s: [i64; 2],
    pub bias_s: i64,
    pub dbias_s: i64,
    pub silu: i32,
    pub has_bias: i32,
    pub has_init: i32,
    pub has_seq: i32,
    pub has_final: i32,
    pub has_dfinal: i32,
    pub has_dinit: i32,
    pub circular: i32,
    /// Channel-last forward / backward: positions a warp walks (`cl_rows`).
    pub cl_rows: i32,
    /// Channel-first `*_rows` kernels: log2 of the threads a row (`cf_rows`).
    pub cf_lg: i32,
    /// 32-bit index arithmetic: the decode update where every element offset fits
    /// (`offsets_fit_i32`), the channel-last short walks where every byte offset does
    /// (`byte_offsets_fit_i32`).
    pub idx32: i32,
    /// The channel-last short walks: a lane's weights and bias load as vectors
    /// (`weights_packed`).
    pub w_vec: i32,
}

const _: () = assert!(std::mem::size_of::<Conv1dParams>() == 496);

/// Whether every element offset of every tensor (the largest: sum of (size - 1) * stride) is
/// below 2^31 with no negative stride: then a kernel may index them in 32-bit arithmetic.
fn offsets_fit_i32(ts: &[Option<&TensorView>]) -> bool {
    ts.iter()
        .flatten()
        .all(|t| t.max_offset().is_some_and(|last| last < i32::MAX as i64))
}

/// Which axis of x (and of every tensor shaped like it) is contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// (batch, dim, seqlen) with seqlen stride 1: causal-conv1d's default.
    ChannelFirst,
    /// dim stride 1: `x.transpose(1, 2)` of a contiguous (batch, seqlen, dim).
    ChannelLast,
}

/// The layout of x: channel-first when its seqlen axis is contiguous (or has one element),
/// channel-last when its dim axis is.
pub fn layout_of(x: &TensorView) -> Result<Layout> {
    if x.shape[2] <= 1 || x.strides[2] == 1 {
        Ok(Layout::ChannelFirst)
    } else if x.shape[1] <= 1 || x.strides[1] == 1 {
        Ok(Layout::ChannelLast)
    } else {
        Err(value_err(format!(
            "x must be contiguous along seqlen (stride(2) == 1) or along dim (stride(1) == 1, \
             the channel-last layout), got strides {:?}; call .contiguous() first",
            x.strides
        )))
    }
}

/// Strides of a (batch, dim, seqlen) tensor laid out like x, its contiguous axis set to 1
/// (where that axis has one element its stride is moot).
fn like_x(t: &TensorView, arg: &str, shape: &[i64], layout: Layout) -> Result<[i64; 3]> {
    t.expect_shape(arg, shape)?;
    let axis = match layout {
        Layout::ChannelFirst => 2,
        Layout::ChannelLast => 1,
    };
    t.expect_unit_stride(arg, axis, if axis == 2 { "seqlen" } else { "dim" })?;
    let mut s = [t.strides[0], t.strides[1], t.strides[2]];
    s[axis] = 1;
    Ok(s)
}

fn strides3(t: &TensorView) -> [i64; 3] {
    [t.strides[0], t.strides[1], t.strides[2]]
}

fn ptr(t: Option<&TensorView>) -> u64 {
    t.map_or(0, |t| t.ptr)
}

/// The shared checks of the forward and the backward: x, weight, bias, initial_states, seq_idx.
/// Returns (batch, dim, seqlen, width, layout) with the strides of those inputs in `p`.
fn check_inputs(
    x: &TensorView,
    weight: &TensorView,
    bias: Option<&TensorView>,
    init: Option<&TensorView>,
    seq_idx: Option<&TensorView>,
    p: &mut Conv1dParams,
) -> Result<(i64, i64, i64, i64, Layout)> {
    x.expect_rank("x", "batch, dim, seqlen")?;
    x.expect_dtype("x", &[DType::F16, DType::BF16, DType::F32])?;
    let (batch, dim, seqlen) = (x.shape[0], x.shape[1], x.shape[2]);
    weight.expect_rank("weight", "dim, width")?;
    weight.expect_dtype("weight", &[x.dtype, DType::F32])?;
    let width = weight.shape[1];
    if !(2..=4).contains(&width) {
        return Err(unsupported(format!(
            "weight has width {width}: causal_conv1d supports widths 2, 3 and 4"
        )));
    }
    weight.expect_shape("weight", &[dim, width])?;
    let layout = layout_of(x)?;
    p.x_s = like_x(x, "x", &[batch, dim, seqlen], layout)?;
    p.w_s = [weight.strides[0], weight.strides[1]];
    if let Some(b) = bias {
        b.expect_same_dtype("bias", weight, "weight")?;
        b.expect_shape("bias", &[dim])?;
        p.bias_s = b.strides[0];
    }
    if let Some(t) = init {
        t.expect_same_dtype("initial_states", x, "x")?;
        t.expect_shape("initial_states", &[batch, dim, width - 1])?;
        p.init_s = strides3(t);
    }
    if let Some(s) = seq_idx {
        if init.is_some() {
            return Err(value_err(
                "seq_idx and initial_states cannot be given together (as in causal-conv1d)",
            ));
        }
        s.expect_dtype("seq_idx", &[DType::I32])?;
        s.expect_shape("seq_idx", &[batch, seqlen])?;
        p.seq_s = [s.strides[0], s.strides[1]];
    }
    if batch > 65535 {
        return Err(unsupported("batch must be <= 65535"));
    }
    p.batch = batch;
    p.dim = dim;
    p.seqlen = seqlen;
    p.x = x.ptr;
    p.weight = weight.ptr;
    p.bias = ptr(bias);
    p.init = ptr(init);
    p.seq_idx = ptr(seq_idx);
    p.has_bias = bias.is_some() as i32;
    p.has_init = init.is_some() as i32;
    p.has_seq = seq_idx.is_some() as i32;
    Ok((batch, dim, seqlen, width, layout))
}

/// The kernel variant: `entry` with x's dtype, weight's dtype and the width. FS_ENTRY (the
/// entry's index in ENTRIES) makes the translation unit hold that kernel alone.
pub fn spec(entry: &'static str, x: DType, w: DType, width: i64) -> Result<KernelSpec> {
    let index = ENTRIES
        .iter()
        .position(|&e| e == entry)
        .ok_or_else(|| Error::Internal(format!("unknown causal_conv1d entry {entry}")))?;
    if entry == "causal_conv1d_fwd_cl_wide" && x == DType::F32 {
        return Err(unsupported("causal_conv1d_fwd_cl_wide: 16-bit x only"));
    }
    Ok(KernelSpec {
        family: FAMILY,
        source: SOURCE,
        entry,
        defines: vec![
            ("FS_DTYPE", x.kernel_code()?),
            ("FS_W_DTYPE", w.kernel_code()?),
            ("FS_WIDTH", width),
            ("FS_ENTRY", index as i64),
        ],
    })
}

pub const ENTRIES: [&str; 13] = [
    "causal_conv1d_fwd_cf",
    "causal_conv1d_fwd_cl",
    "causal_conv1d_bwd_cf",
    "causal_conv1d_bwd_cl",
    "causal_conv1d_dw_reduce",
    "causal_conv1d_update",
    "causal_conv1d_bwd_cf_seq",
    "causal_conv1d_fwd_cf_rows",
    "causal_conv1d_bwd_cf_rows",
    "causal_conv1d_fwd_cf_fast",
    "causal_conv1d_fwd_cl_short",
    "causal_conv1d_bwd_cl_short",
    "causal_conv1d_fwd_cl_wide",
];

/// Every variant: 13 entries (the wide forward 16-bit only) x (x dtype, weight dtype: x's or fp32) x width 2..4. The
/// forward and update entries are "main" (they must not spill).
pub fn all_specs(_arch: i64) -> Vec<(KernelSpec, bool)> {
    let mut out = Vec::new();
    for entry in ENTRIES {
        let main = !entry.contains("bwd") && !entry.contains("reduce");
        for x in [DType::F16, DType::BF16, DType::F32] {
            let ws: &[DType] = if x == DType::F32 {
                &[DType::F32]
            } else {
                &[x, DType::F32]
            };
            for &w in ws {
                for width in 2..=4 {
                    if let Ok(s) = spec(entry, x, w, width) {
                        out.push((s, main));
                    }
                }
            }
        }
    }
    out
}

/// Elements of one 16-byte access of `dt`.
fn vec_elems(dt: DType) -> i64 {
    16 / dt.size() as i64
}

/// (grid, parts along time) of the forward or backward for a layout; `cl_steps`: positions per warp
/// of the channel-last kernel launched (CL_STEPS or CL_STEPS_BWD).
fn grid(
    layout: Layout,
    dt: DType,
    batch: i64,
    dim: i64,
    seqlen: i64,
    cl_steps: i64,
) -> Result<((u32, u32, u32), i64)> {
    let too_big = || unsupported("dim * seqlen too large for one launch");
    match layout {
        Layout::ChannelFirst => {
            let chunk = THREADS * 2 * vec_elems(dt);
            let nchunks = (seqlen + chunk - 1) / chunk;
            let gx = u32::try_from(dim * nchunks).map_err(|_| too_big())?;
            Ok(((gx, batch as u32, 1), nchunks))
        }
        Layout::ChannelLast => {
            let gx = (dim + 32 * CL_CHANNELS - 1) / (32 * CL_CHANNELS);
            let gy = (seqlen + WARPS * cl_steps - 1) / (WARPS * cl_steps);
            let gy32 = u32::try_from(gy)
                .ok()
                .filter(|&v| v <= 65535)
                .ok_or_else(too_big)?;
            Ok(((gx as u32, gy32, batch as u32), gy))
        }
    }
}

/// The channel-first `*_rows` kernels' split of short rows: `Some(log2 T)` when T threads of
/// `per_thread` positions each (the fewest, a power of two) cover a row and T < THREADS, so a
/// block serves THREADS / T rows; `None`: one row a block (the long rows' kernels). Per thread:
/// the forward 2 x 16 bytes, the backward 16. One row a block left most threads of short rows
/// idle (b32 L60 d640 bf16: 20480 blocks of 4 working threads in the forward, 8 in the backward).
fn cf_rows(per_thread: i64, seqlen: i64) -> Option<i32> {
    let mut lg = 0;
    while (per_thread << lg) < seqlen {
        lg += 1;
    }
    ((1i64 << lg) < THREADS).then_some(lg)
}

/// Whether every thread of a long-row channel-first forward takes the fast body (the kernel's
/// `causal_conv1d_fwd_cf_fast`): no seq_idx or final states, seqlen a multiple of a thread's
/// 2 x 16 bytes, and every row of x and out 16-byte aligned (base and the batch / dim strides).
fn cf_fast(p: &Conv1dParams, dt: DType) -> bool {
    let v = vec_elems(dt);
    let rows16 =
        |base: u64, s: &[i64; 3]| base % 16 == 0 && s[0] % v == 0 && s[1] % v == 0 && s[2] == 1;
    p.has_seq == 0
        && p.has_final == 0
        && p.seqlen % (2 * v) == 0
        && rows16(p.x, &p.x_s)
        && rows16(p.out, &p.out_s)
}

/// Whether every lane slice of a channel-last tensor like x is `channels` elements at a
/// `channels`-aligned offset (the kernels' `rows_aligned`): base, batch and time strides.
/// CL_CHANNELS for the 4-channel kernels, CL_WIDE_CHANNELS for the wide forward.
fn cl_rows_aligned(base: u64, s: &[i64; 3], dt: DType, channels: i64) -> bool {
    base % (channels as u64 * dt.size() as u64) == 0 && s[0] % channels == 0 && s[2] % channels == 0
}

/// Whether a channel-last launch of `rows` positions a warp takes the short-walk entries
/// (`causal_conv1d_{fwd,bwd}_cl_short`): 4 or 8 rows (`cl_rows` on a grid that would not fill a
/// wave), no seq_idx, full lane slices, every lane slice of `tensors` aligned, and every byte
/// offset of the call's tensors below 2^31 (`idx32`: the short walks index in 32 bits only).
fn cl_short(
    p: &Conv1dParams,
    rows: i64,
    idx32: bool,
    dt: DType,
    tensors: &[(u64, &[i64; 3])],
) -> bool {
    rows <= 8
        && idx32
        && p.has_seq == 0
        && p.dim % CL_CHANNELS == 0
        && tensors
            .iter()
            .all(|(b, s)| cl_rows_aligned(*b, s, dt, CL_CHANNELS))
}

/// Channels a lane of the wide channel-last forward (`causal_conv1d_fwd_cl_wide`): one 16-byte
/// slice of 16-bit x.
const CL_WIDE_CHANNELS: i64 = 8;

/// Whether a channel-last forward of `rows` positions a warp takes `causal_conv1d_fwd_cl_wide`:
/// full walks (rows == CL_STEPS: long sequences), 16-bit x, no seq_idx, dim a multiple of 8 and
/// every lane's 8-channel slice of x and out 16-byte aligned, packed weights (`weights_packed`:
/// the kernel loads a lane's 8 x width weights as vectors; per-element loads there spilled).
/// Measured (H200, b8 L2048 d5376 bf16, GPU time, same wheel): 100.3-100.5 us with the 4-channel
/// kernel, 89.7-90.4 wide (`benches/results/2026-11-29-h200-conv1d-short-walks-packed/`).
/// FLASHSCAN_CONV1D_WIDE=0 keeps the 4-channel kernel (A/B). Read once.
fn cl_wide(
    p: &Conv1dParams,
    rows: i64,
    dt: DType,
    weight: &TensorView,
    bias: Option<&TensorView>,
) -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    rows == CL_STEPS
        && dt != DType::F32
        && p.has_seq == 0
        && p.dim % CL_WIDE_CHANNELS == 0
        && cl_rows_aligned(p.x, &p.x_s, dt, CL_WIDE_CHANNELS)
        && cl_rows_aligned(p.out, &p.out_s, dt, CL_WIDE_CHANNELS)
        && weights_packed(weight, bias, CL_WIDE_CHANNELS)
        && *WIDE.get_or_init(|| std::env::var("FLASHSCAN_CONV1D_WIDE").as_deref() != Ok("0"))
}

/// Whether a lane of `channels` channels (the short walks' CL_CHANNELS, the wide forward's
/// CL_WIDE_CHANNELS) loads its channels x width weights as one contiguous run and its biases as
/// vectors (the kernels' `lane_weights_short`, `fwd_cl_wide`): weight rows contiguous (strides
/// (width, 1)) from a 16-byte-aligned base, bias (if any) contiguous from a base aligned to its
/// vector (channels elements, at most 16 bytes). A lane's offsets are then multiples of its run's
/// bytes (8- or 16-byte vector accesses: see the kernels).
fn weights_packed(weight: &TensorView, bias: Option<&TensorView>, channels: i64) -> bool {
    let width = weight.shape[1];
    let es = weight.dtype.size() as u64;
    let bias_align = (channels as u64 * es).min(16);
    weight.strides[..] == [width, 1]
        && weight.ptr % 16 == 0
        && bias.map_or(true, |b| b.strides[0] == 1 && b.ptr % bias_align == 0)
}

/// Grid of a `*_rows` kernel: THREADS >> lg rows a block, (ceil(dim / rows), batch).
fn cf_rows_grid(lg: i32, batch: i64, dim: i64) -> Result<(u32, u32, u32)> {
    let rows = THREADS >> lg;
    let gx = u32::try_from((dim + rows - 1) / rows).map_err(|_| unsupported("dim too large"))?;
    Ok((gx, batch as u32, 1))
}

/// `cl_rows` for a channel-last call (`full` positions a warp at most), 0 for a channel-first one
/// (its kernels never read it).
fn walk_rows(
    layout: Layout,
    full: i64,
    p: &Conv1dParams,
    sm_count: i64,
    blocks_per_sm: i64,
) -> i64 {
    match layout {
        Layout::ChannelLast => cl_rows(full, p.batch, p.dim, p.seqlen, sm_count, blocks_per_sm),
        Layout::ChannelFirst => 0,
    }
}

/// Positions a warp of the channel-last forward (`full` = CL_STEPS, `blocks_per_sm` = its 4)
/// or backward (CL_STEPS_BWD, 3) walks: the fewest (a power of two, >= 4) whose grid still fits
/// one wave of blocks, or `full` when even that grid does not. A short sequence otherwise gives
/// each warp its whole length in order: at b32 L60 d640 (Mamba-2 real-time) 160 warps of 60 rows,
/// a latency chain with most SMs idle (H200: 9.3 us forward). Shorter walks re-read H rows of
/// history each (L2 hits), and only full-length warps take the lean walk: long grids keep `full`.
/// Measured (H200, b32 L60 d640 bf16, GPU time): 60 rows a warp 9.3 us forward / 51.6 forward +
/// backward, 4 rows (640 blocks, 1.2 waves; warps rather than blocks counted) 7.4 / 33.9, 8 rows
/// (this rule) 5.5 / 24.5. The forward's short walk runs 5 blocks an SM (96 registers or fewer)
/// and is asked with that wave: 4 rows there (640 blocks, one wave), 4.1-4.2 -> 3.4 us against
/// 8 rows (2026-11-29, `benches/results/2026-11-29-h200-conv1d-short-walks-packed/`).
fn cl_rows(full: i64, batch: i64, dim: i64, seqlen: i64, sm_count: i64, blocks_per_sm: i64) -> i64 {
    let lanes = (dim + 32 * CL_CHANNELS - 1) / (32 * CL_CHANNELS);
    let blocks = |r: i64| lanes * batch * ((seqlen + WARPS * r - 1) / (WARPS * r));
    let wave = sm_count.max(1) * blocks_per_sm;
    let mut r = full;
    while r > 4 && blocks(r / 2) <= wave {
        r /= 2;
    }
    r
}

/// (grid, parts along time) of the channel-first backward: a block walks CF_BWD_STEPS steps of
/// THREADS 16-byte slices of a row, so a row takes ceil(steps / CF_BWD_STEPS) blocks.
fn cf_bwd_grid(dt: DType, batch: i64, dim: i64, seqlen: i64) -> Result<((u32, u32, u32), i64)> {
    let step = THREADS * vec_elems(dt);
    let nsteps = (seqlen + step - 1) / step;
    let nsplit = (nsteps + CF_BWD_STEPS - 1) / CF_BWD_STEPS;
    let gx = u32::try_from(dim * nsplit)
        .map_err(|_| unsupported("dim * seqlen too large for one launch"))?;
    Ok(((gx, batch as u32, 1), nsplit))
}

pub struct Conv1dFwdArgs<'a> {
    pub x: &'a TensorView,
    pub weight: &'a TensorView,
    pub bias: Option<&'a TensorView>,
    pub initial_states: Option<&'a TensorView>,
    pub seq_idx: Option<&'a TensorView>,
    pub out: &'a TensorView,
    pub final_states: Option<&'a TensorView>,
    pub silu: bool,
}

/// Checks a forward call; returns the filled params (pointers, sizes, strides, flags) and the layout.
pub fn check_fwd(a: &Conv1dFwdArgs) -> Result<(Conv1dParams, Layout, i64)> {
    let mut p = Conv1dParams::default();
    let (batch, dim, seqlen, width, layout) =
        check_inputs(a.x, a.weight, a.bias, a.initial_states, a.seq_idx, &mut p)?;
    a.out.expect_same_dtype("out", a.x, "x")?;
    a.out.expect_writable("out")?;
    p.out_s = like_x(a.out, "out", &[batch, dim, seqlen], layout)?;
    p.out = a.out.ptr;
    if let Some(f) = a.final_states {
        if a.seq_idx.is_some() {
            return Err(value_err(
                "seq_idx and return_final_states cannot be used together (as in causal-conv1d)",
            ));
        }
        f.expect_same_dtype("final_states_out", a.x, "x")?;
        f.expect_shape("final_states_out", &[batch, dim, width - 1])?;
        f.expect_writable("final_states_out")?;
        p.final_s = strides3(f);
        p.final_states = f.ptr;
        p.has_final = 1;
    }
    p.silu = a.silu as i32;
    expect_no_overlap(
        &[("out", Some(a.out)), ("final_states_out", a.final_states)],
        &[
            ("x", Some(a.x)),
            ("weight", Some(a.weight)),
            ("bias", a.bias),
            ("initial_states", a.initial_states),
            ("seq_idx", a.seq_idx),
        ],
    )?;
    Ok((p, layout, width))
}

pub fn forward(a: &Conv1dFwdArgs, stream: StreamChoice) -> Result<()> {
    let (mut p, layout, width) = check_fwd(a)?;
    if p.batch == 0 || p.dim == 0 || p.seqlen == 0 {
        return Ok(());
    }
    let device = common_cuda_device(&[
        ("x", Some(a.x)),
        ("weight", Some(a.weight)),
        ("bias", a.bias),
        ("initial_states", a.initial_states),
        ("seq_idx", a.seq_idx),
        ("out", Some(a.out)),
        ("final_states_out", a.final_states),
    ])?;
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    // the device's context stays current for the whole call; the caller's is restored after
    let _bound = dev.bind()?;
    let cf_rows_lg = cf_rows(2 * vec_elems(a.x.dtype), p.seqlen);
    let sms = dev.props.sm_count as i64;
    let rows = walk_rows(layout, CL_STEPS, &p, sms, 4);
    // the short walk's wave: 5 blocks an SM (its launch bounds), so at b32 L60 d640 warps of 4
    // positions (640 blocks) fit one
    let short_rows = walk_rows(layout, CL_STEPS, &p, sms, SHORT_FWD_BLOCKS_PER_SM);
    let entry = match layout {
        Layout::ChannelFirst if cf_rows_lg.is_some() => "causal_conv1d_fwd_cf_rows",
        Layout::ChannelFirst if cf_fast(&p, a.x.dtype) => "causal_conv1d_fwd_cf_fast",
        Layout::ChannelFirst => "causal_conv1d_fwd_cf",
        Layout::ChannelLast
            if cl_short(
                &p,
                short_rows,
                byte_offsets_fit_i32(&[
                    Some(a.x),
                    Some(a.weight),
                    a.bias,
                    a.initial_states,
                    Some(a.out),
                    a.final_states,
                ]),
                a.x.dtype,
                &[(p.x, &p.x_s), (p.out, &p.out_s)],
            ) =>
        {
            "causal_conv1d_fwd_cl_short"
        }
        Layout::ChannelLast if cl_wide(&p, rows, a.x.dtype, a.weight, a.bias) => {
            "causal_conv1d_fwd_cl_wide"
        }
        Layout::ChannelLast => "causal_conv1d_fwd_cl",
    };
    let rows = if entry == "causal_conv1d_fwd_cl_short" {
        short_rows
    } else {
        rows
    };
    if entry == "causal_conv1d_fwd_cl_short" {
        p.idx32 = 1;
        p.w_vec = weights_packed(a.weight, a.bias, CL_CHANNELS) as i32;
    }
    let k = dev.kernel(&spec(entry, a.x.dtype, a.weight.dtype, width)?)?;
    let g = match (layout, cf_rows_lg) {
        (Layout::ChannelFirst, Some(lg)) => {
            p.cf_lg = lg;
            cf_rows_grid(lg, p.batch, p.dim)?
        }
        (Layout::ChannelFirst, None) => grid(layout, a.x.dtype, p.batch, p.dim, p.seqlen, 0)?.0,
        (Layout::ChannelLast, _) => {
            p.cl_rows = rows as i32;
            let (g, _) = grid(layout, a.x.dtype, p.batch, p.dim, p.seqlen, rows)?;
            if entry == "causal_conv1d_fwd_cl_wide" {
                // 32 lanes of 8 channels a block column
                let gx = (p.dim + 32 * CL_WIDE_CHANNELS - 1) / (32 * CL_WIDE_CHANNELS);
                (gx as u32, g.1, g.2)
            } else {
                g
            }
        }
    };
    let st = dev.stream(stream)?;
    // SAFETY: params mirrors Conv1dParams; shapes, dtypes, layouts, devices were checked.
    unsafe { dev.launch(&k, g, (THREADS as u32, 1, 1), 0, st, &p)? };
    dev.finish(stream)
}

pub struct Conv1dBwdArgs<'a> {
    pub x: &'a TensorView,
    pub weight: &'a TensorView,
    pub bias: Option<&'a TensorView>,
    pub initial_states: Option<&'a TensorView>,
    pub seq_idx: Option<&'a TensorView>,
    pub dout: &'a TensorView,
    pub dfinal_states: Option<&'a TensorView>,
    pub dx: &'a TensorView,
    pub dweight: &'a TensorView,
    pub dbias: Option<&'a TensorView>,
    pub dinitial_states: Option<&'a TensorView>,
    pub silu: bool,
}

pub fn check_bwd(a: &Conv1dBwdArgs) -> Result<(Conv1dParams, Layout, i64)> {
    let mut p = Conv1dParams::default();
    let (batch, dim, seqlen, width, layout) =
        check_inputs(a.x, a.weight, a.bias, a.initial_states, a.seq_idx, &mut p)?;
    let xs = [batch, dim, seqlen];
    a.dout.expect_same_dtype("dout", a.x, "x")?;
    p.dout_s = like_x(a.dout, "dout", &xs, layout)?;
    a.dx.expect_same_dtype("dx", a.x, "x")?;
    a.dx.expect_writable("dx")?;
    p.dx_s = like_x(a.dx, "dx", &xs, layout)?;
    a.dweight.expect_same_dtype("dweight", a.weight, "weight")?;
    a.dweight.expect_shape("dweight", &[dim, width])?;
    a.dweight.expect_writable("dweight")?;
    p.dw_s = [a.dweight.strides[0], a.dweight.strides[1]];
    if let Some(d) = a.dbias {
        if a.bias.is_none() {
            return Err(value_err("dbias given without bias"));
        }
        d.expect_same_dtype("dbias", a.weight, "weight")?;
        d.expect_shape("dbias", &[dim])?;
        d.expect_writable("dbias")?;
        p.dbias_s = d.strides[0];
    }
    let states = [batch, dim, width - 1];
    if let Some(d) = a.dfinal_states {
        if a.seq_idx.is_some() {
            return Err(value_err(
                "seq_idx and final states cannot be used together",
            ));
        }
        d.expect_same_dtype("dfinal_states", a.x, "x")?;
        d.expect_shape("dfinal_states", &states)?;
        p.dfinal_s = strides3(d);
        p.has_dfinal = 1;
    }
    if let Some(d) = a.dinitial_states {
        if a.initial_states.is_none() {
            return Err(value_err("dinitial_states given without initial_states"));
        }
        d.expect_same_dtype("dinitial_states", a.x, "x")?;
        d.expect_shape("dinitial_states", &states)?;
        d.expect_writable("dinitial_states")?;
        p.dinit_s = strides3(d);
        p.has_dinit = 1;
    }
    p.dout = a.dout.ptr;
    p.dfinal = ptr(a.dfinal_states);
    p.dx = a.dx.ptr;
    p.dweight = a.dweight.ptr;
    p.dbias = ptr(a.dbias);
    p.dinit = ptr(a.dinitial_states);
    p.silu = a.silu as i32;
    expect_no_overlap(
        &[
            ("dx", Some(a.dx)),
            ("dweight", Some(a.dweight)),
            ("dbias", a.dbias),
            ("dinitial_states", a.dinitial_states),
        ],
        &[
            ("x", Some(a.x)),
            ("weight", Some(a.weight)),
            ("bias", a.bias),
            ("initial_states", a.initial_states),
            ("seq_idx", a.seq_idx),
            ("dout", Some(a.dout)),
            ("dfinal_states", a.dfinal_states),
        ],
    )?;
    Ok((p, layout, width))
}

pub fn backward(a: &Conv1dBwdArgs, stream: StreamChoice) -> Result<()> {
    let (mut p, layout, width) = check_bwd(a)?;
    if p.dim == 0 {
        return Ok(());
    }
    let device = common_cuda_device(&[
        ("x", Some(a.x)),
        ("weight", Some(a.weight)),
        ("bias", a.bias),
        ("initial_states", a.initial_states),
        ("seq_idx", a.seq_idx),
        ("dout", Some(a.dout)),
        ("dfinal_states", a.dfinal_states),
        ("dx", Some(a.dx)),
        ("dweight", Some(a.dweight)),
        ("dbias", a.dbias),
        ("dinitial_states", a.dinitial_states),
    ])?;
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    // the device's context stays current for the whole call; the caller's is restored after
    let _bound = dev.bind()?;
    let (xd, wd) = (a.x.dtype, a.weight.dtype);
    let empty = p.batch == 0 || p.seqlen == 0;
    if empty && p.has_dinit == 1 {
        // nothing to differentiate through: dinitial_states would be dfinal shifted; keep the
        // kernels simple and send such calls to the reference
        return Err(unsupported(
            "seqlen 0 with initial_states: use the reference path",
        ));
    }
    // channel-first: the lean walk, or with seq_idx the general one (its own entry and grid)
    let cf_seq = layout == Layout::ChannelFirst && p.has_seq == 1;
    let cf_rows_lg =
        cf_rows(vec_elems(xd), p.seqlen).filter(|_| layout == Layout::ChannelFirst && !cf_seq);
    let rows = walk_rows(layout, CL_STEPS_BWD, &p, dev.props.sm_count as i64, 3);
    let main_entry = match layout {
        Layout::ChannelFirst if cf_seq => "causal_conv1d_bwd_cf_seq",
        Layout::ChannelFirst if cf_rows_lg.is_some() => "causal_conv1d_bwd_cf_rows",
        Layout::ChannelFirst => "causal_conv1d_bwd_cf",
        Layout::ChannelLast
            if p.has_dinit == 0
                && p.has_dfinal == 0
                && cl_short(
                    &p,
                    rows,
                    byte_offsets_fit_i32(&[
                        Some(a.x),
                        Some(a.weight),
                        a.bias,
                        a.initial_states,
                        Some(a.dout),
                        Some(a.dx),
                        Some(a.dweight),
                        a.dbias,
                    ]),
                    xd,
                    &[(p.x, &p.x_s), (p.dout, &p.dout_s), (p.dx, &p.dx_s)],
                ) =>
        {
            "causal_conv1d_bwd_cl_short"
        }
        Layout::ChannelLast => "causal_conv1d_bwd_cl",
    };
    if main_entry == "causal_conv1d_bwd_cl_short" {
        // as the forward's short walk
        p.idx32 = 1;
        p.w_vec = weights_packed(a.weight, a.bias, CL_CHANNELS) as i32;
    }
    let main_k = dev.kernel(&spec(main_entry, xd, wd, width)?)?;
    let red_k = dev.kernel(&spec("causal_conv1d_dw_reduce", xd, wd, width)?)?;
    let (g, tparts) = if empty {
        ((0, 0, 0), 0)
    } else if let Some(lg) = cf_rows_lg {
        p.cf_lg = lg;
        (cf_rows_grid(lg, p.batch, p.dim)?, 1)
    } else if layout == Layout::ChannelFirst && !cf_seq {
        cf_bwd_grid(xd, p.batch, p.dim, p.seqlen)?
    } else {
        p.cl_rows = rows as i32;
        grid(layout, xd, p.batch, p.dim, p.seqlen, rows)?
    };
    p.nparts = p.batch * tparts;
    let red_grid = u32::try_from((p.dim * (width + 1) + REDUCE_COLS - 1) / REDUCE_COLS)
        .map_err(|_| unsupported("dim too large"))?;
    let s = dev.stream(stream)?;
    let bytes = (p.nparts.max(1) * p.dim * (width + 1) * 4) as usize;
    let mut scratch = dev.scratch(s)?;
    p.partials = scratch.alloc(bytes)?;
    // SAFETY: params mirrors Conv1dParams; every tensor was checked above; the scratch holds
    // nparts * dim * (width + 1) floats, each written by the main kernel before the reduce reads it.
    let launched = (|| unsafe {
        if !empty {
            dev.launch(&main_k, g, (THREADS as u32, 1, 1), 0, s, &p)?;
        }
        dev.launch(&red_k, (red_grid, 1, 1), (THREADS as u32, 1, 1), 0, s, &p)
    })();
    scratch.free()?; // ordered after the launches on the same stream
    launched?;
    dev.finish(stream)
}

pub struct Conv1dUpdateArgs<'a> {
    pub x: &'a TensorView,
    pub conv_state: &'a TensorView,
    pub weight: &'a TensorView,
    pub bias: Option<&'a TensorView>,
    pub cache_seqlens: Option<&'a TensorView>,
    pub out: &'a TensorView,
    pub silu: bool,
}

/// (batch, dim) or (batch, dim, seqlen) as 3-D strides (a 2-D one has seqlen 1).
fn seq3(t: &TensorView, arg: &str, want: &[i64]) -> Result<[i64; 3]> {
    t.expect_shape(arg, want)?;
    Ok(if t.rank() == 3 {
        strides3(t)
    } else {
        [t.strides[0], t.strides[1], 1]
    })
}

pub fn check_update(a: &Conv1dUpdateArgs) -> Result<(Conv1dParams, i64)> {
    let mut p = Conv1dParams::default();
    a.x.expect_dtype("x", &[DType::F16, DType::BF16, DType::F32])?;
    let (batch, dim, seqlen) = match a.x.rank() {
        2 => (a.x.shape[0], a.x.shape[1], 1),
        3 => (a.x.shape[0], a.x.shape[1], a.x.shape[2]),
        r => {
            return Err(value_err(format!(
                "x must have shape (batch, dim) or (batch, dim, seqlen), got {r} dims {:?}",
                a.x.shape
            )))
        }
    };
    p.x_s = seq3(a.x, "x", &a.x.shape.clone())?;
    a.out.expect_same_dtype("out", a.x, "x")?;
    a.out.expect_writable("out")?;
    p.out_s = seq3(a.out, "out", &a.x.shape)?;
    a.weight.expect_rank("weight", "dim, width")?;
    a.weight.expect_dtype("weight", &[a.x.dtype, DType::F32])?;
    let width = a.weight.shape[1];
    if !(2..=4).contains(&width) {
        return Err(unsupported(format!(
            "weight has width {width}: causal_conv1d_update supports widths 2, 3 and 4"
        )));
    }
    a.weight.expect_shape("weight", &[dim, width])?;
    p.w_s = [a.weight.strides[0], a.weight.strides[1]];
    if let Some(b) = a.bias {
        b.expect_same_dtype("bias", a.weight, "weight")?;
        b.expect_shape("bias", &[dim])?;
        p.bias_s = b.strides[0];
    }
    a.conv_state
        .expect_rank("conv_state", "batch, dim, state_len")?;
    a.conv_state.expect_same_dtype("conv_state", a.x, "x")?;
    a.conv_state.expect_writable("conv_state")?;
    let state_len = a.conv_state.shape[2];
    if state_len > i32::MAX as i64 {
        return Err(unsupported("conv_state's state_len must be < 2^31"));
    }
    if state_len < width - 1 {
        return Err(value_err(format!(
            "conv_state has state_len {state_len}: it must be >= width - 1 = {}",
            width - 1
        )));
    }
    a.conv_state
        .expect_shape("conv_state", &[batch, dim, state_len])?;
    p.state_s = strides3(a.conv_state);
    if let Some(cs) = a.cache_seqlens {
        cs.expect_dtype("cache_seqlens", &[DType::I32])?;
        cs.expect_shape("cache_seqlens", &[batch])?;
        if cs.strides[0] != 1 && batch > 1 {
            return Err(value_err("cache_seqlens must be contiguous"));
        }
        p.circular = 1;
    }
    if a.x.dtype == DType::F64 {
        return Err(type_err("float64 is not supported on the GPU"));
    }
    if batch > 65535 {
        return Err(unsupported("batch must be <= 65535"));
    }
    expect_no_overlap(
        &[("out", Some(a.out)), ("conv_state", Some(a.conv_state))],
        &[
            ("x", Some(a.x)),
            ("weight", Some(a.weight)),
            ("bias", a.bias),
            ("cache_seqlens", a.cache_seqlens),
        ],
    )?;
    p.batch = batch;
    p.dim = dim;
    p.seqlen = seqlen;
    p.state_len = state_len;
    p.x = a.x.ptr;
    p.out = a.out.ptr;
    p.weight = a.weight.ptr;
    p.bias = ptr(a.bias);
    p.has_bias = a.bias.is_some() as i32;
    p.state = a.conv_state.ptr;
    p.cache_seqlens = ptr(a.cache_seqlens);
    p.silu = a.silu as i32;
    p.idx32 = offsets_fit_i32(&[
        Some(a.x),
        Some(a.out),
        Some(a.conv_state),
        Some(a.weight),
        a.bias,
    ]) as i32;
    Ok((p, width))
}

pub fn update(a: &Conv1dUpdateArgs, stream: StreamChoice) -> Result<()> {
    let (p, width) = check_update(a)?;
    if p.batch == 0 || p.dim == 0 || p.seqlen == 0 {
        return Ok(());
    }
    let device = common_cuda_device(&[
        ("x", Some(a.x)),
        ("conv_state", Some(a.conv_state)),
        ("weight", Some(a.weight)),
        ("bias", a.bias),
        ("cache_seqlens", a.cache_seqlens),
        ("out", Some(a.out)),
    ])?;
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    // the device's context stays current for the whole call; the caller's is restored after
    let _bound = dev.bind()?;
    let k = dev.kernel(&spec(
        "causal_conv1d_update",
        a.x.dtype,
        a.weight.dtype,
        width,
    )?)?;
    let gx =
        u32::try_from((p.dim + THREADS - 1) / THREADS).map_err(|_| unsupported("dim too large"))?;
    let st = dev.stream(stream)?;
    // SAFETY: params mirrors Conv1dParams; shapes, dtypes, devices and the state length were checked.
    unsafe {
        dev.launch(
            &k,
            (gx, p.batch as u32, 1),
            (THREADS as u32, 1, 1),
            0,
            st,
            &p,
        )?
    };
    dev.finish(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tensor::cuda_view as view;

    #[test]
    fn layouts_are_told_apart() {
        let cf = view(&[2, 8, 16], &[128, 16, 1], DType::BF16, 0);
        assert_eq!(layout_of(&cf).ok(), Some(Layout::ChannelFirst));
        let cl = view(&[2, 8, 16], &[128, 1, 8], DType::BF16, 0);
        assert_eq!(layout_of(&cl).ok(), Some(Layout::ChannelLast));
        let bad = view(&[2, 8, 16], &[256, 32, 2], DType::BF16, 0);
        assert!(layout_of(&bad).is_err());
    }

    #[test]
    fn forward_checks_name_the_argument() {
        let x = view(&[2, 8, 16], &[128, 16, 1], DType::BF16, 0x1000);
        let w = view(&[8, 5], &[5, 1], DType::F32, 0x10000);
        let out = view(&[2, 8, 16], &[128, 16, 1], DType::BF16, 0x20000);
        let a = Conv1dFwdArgs {
            x: &x,
            weight: &w,
            bias: None,
            initial_states: None,
            seq_idx: None,
            out: &out,
            final_states: None,
            silu: false,
        };
        let e = check_fwd(&a).unwrap_err().to_string();
        assert!(e.contains("width 5"), "{e}");
        let w = view(&[8, 4], &[4, 1], DType::F32, 0x10000);
        let a = Conv1dFwdArgs { weight: &w, ..a };
        let (p, layout, width) = check_fwd(&a).unwrap();
        assert_eq!((layout, width, p.seqlen), (Layout::ChannelFirst, 4, 16));
        let out_cl = view(&[2, 8, 16], &[128, 1, 8], DType::BF16, 0x20000);
        let a = Conv1dFwdArgs { out: &out_cl, ..a };
        assert!(check_fwd(&a).unwrap_err().to_string().contains("out"));
    }

    /// The launch geometry the host computes must be the one the kernel walks: its kT / kTB /
    /// kVecF constants (a mismatch leaves positions or channels unwritten, silently).
    #[test]
    fn channel_last_grid_matches_the_kernel_constants() {
        for (name, value) in [
            ("kT", CL_STEPS),
            ("kTB", CL_STEPS_BWD),
            ("kVecF", CL_CHANNELS),
            ("kThreads", THREADS),
        ] {
            let decl = format!("constexpr int {name} = {value};");
            assert!(
                SOURCE.contains(&decl),
                "cuda/causal_conv1d.cu lacks `{decl}`"
            );
        }
        let ((gx, gy, gz), parts) =
            grid(Layout::ChannelLast, DType::BF16, 8, 5376, 2048, CL_STEPS).unwrap();
        assert_eq!((gx, gy, gz, parts), (42, 16, 8, 16));
        let ((_, gy, _), parts) = grid(
            Layout::ChannelLast,
            DType::BF16,
            8,
            5376,
            2049,
            CL_STEPS_BWD,
        )
        .unwrap();
        assert_eq!((gy, parts), (9, 9)); // 256 positions a block: one more for the last position
    }

    /// 32-bit indexing only where every offset fits: a (256, 5376, 3) state does, a (2^20,
    /// 4096) x does not; negative strides never take it.
    #[test]
    fn update_indexes_in_32_bits_where_offsets_fit() {
        let small = view(&[256, 5376, 3], &[5376 * 3, 3, 1], DType::BF16, 0x1000);
        let big = view(&[1 << 20, 4096], &[4096, 1], DType::BF16, 0x1000);
        let neg = view(&[4, 8], &[-8, 1], DType::BF16, 0x1000);
        let edge = view(&[2, 1 << 30], &[1 << 30, 1], DType::BF16, 0x1000);
        assert!(offsets_fit_i32(&[Some(&small), None]));
        assert!(!offsets_fit_i32(&[Some(&small), Some(&big)]));
        assert!(!offsets_fit_i32(&[Some(&neg)]));
        // last offset 2^31 - 1: not below i32::MAX
        assert!(!offsets_fit_i32(&[Some(&edge)]));
    }

    /// Long grids keep the kernels' full walks (the lean walks need them); short sequences and
    /// small batches the shortest walks whose grid still fits one wave of blocks, never below 4
    /// rows.
    #[test]
    fn channel_last_rows_fill_the_sms() {
        assert_eq!(cl_rows(CL_STEPS, 8, 5376, 2048, 132, 4), CL_STEPS);
        assert_eq!(cl_rows(CL_STEPS_BWD, 8, 5376, 2048, 132, 3), CL_STEPS_BWD);
        // b32 L60 d640: 5 lane groups x 32 rows of a batch; 4 rows a warp would be 640 blocks
        // (> 528 = one wave of 4 an SM), 8 rows 320
        assert_eq!(cl_rows(CL_STEPS, 32, 640, 60, 132, 4), 8);
        assert_eq!(cl_rows(CL_STEPS_BWD, 32, 640, 60, 132, 3), 8);
        // the forward short walk's 5 blocks an SM: 640 blocks of 4-position warps fit one wave
        assert_eq!(
            cl_rows(CL_STEPS, 32, 640, 60, 132, SHORT_FWD_BLOCKS_PER_SM),
            4
        );
        // b8 L60 d5376: 42 x 8 = 336 blocks at 32 or 16 rows a warp (60 rows: one block of 4
        // warps), 672 at 8 (> 528)
        assert_eq!(cl_rows(CL_STEPS, 8, 5376, 60, 132, 4), 16);
        assert_eq!(cl_rows(CL_STEPS, 1, 1, 1, 132, 4), 4);
        // every position is some warp's: the grid covers seqlen with the rows chosen
        for (b, d, l) in [(32, 640, 60), (1, 7, 5), (2, 300, 129), (8, 5376, 60)] {
            for (full, per_sm) in [(CL_STEPS, 4), (CL_STEPS_BWD, 3)] {
                let r = cl_rows(full, b, d, l, 132, per_sm);
                assert!(r >= 4 && r <= full && full % r == 0);
                let ((_, gy, _), parts) =
                    grid(Layout::ChannelLast, DType::BF16, b, d, l, r).unwrap();
                assert!(gy as i64 * WARPS * r >= l && parts == gy as i64);
            }
        }
    }

    /// The channel-first `*_rows` kernels take rows that fewer than THREADS threads cover
    /// (the forward's kItems = 2 x 16 bytes a thread, the backward's one 16-byte slice).
    #[test]
    fn channel_first_short_rows_share_blocks() {
        // bf16 forward: 16 positions a thread; L60 -> 4 threads, 32 rows a block
        assert_eq!(cf_rows(16, 60), Some(2));
        assert_eq!(cf_rows_grid(2, 32, 640).unwrap(), (20, 32, 1));
        // up to 64 threads (1024 positions); 1025 and the long rows: one row a block
        assert_eq!(cf_rows(16, 1024), Some(6));
        assert_eq!(cf_rows(16, 1025), None);
        assert_eq!(cf_rows(16, 2048), None);
        // bf16 backward (8 a thread): L60 -> 8 threads; fp32 (4): 16; seqlen 1: one thread
        assert_eq!(cf_rows(8, 60), Some(3));
        assert_eq!(cf_rows(4, 60), Some(4));
        assert_eq!(cf_rows(8, 1), Some(0));
        assert_eq!(cf_rows_grid(0, 2, 129).unwrap(), (2, 2, 1));
        // every (row, position) is some thread's
        for (d, l, per) in [
            (1, 1, 16),
            (7, 60, 8),
            (640, 60, 16),
            (33, 1000, 16),
            (5, 511, 8),
        ] {
            let lg = cf_rows(per, l).unwrap();
            let (gx, _, _) = cf_rows_grid(lg, 1, d).unwrap();
            assert!(gx as i64 * (THREADS >> lg) >= d && (per << lg) >= l);
        }
    }

    /// The channel-first backward's blocks walk kStepsCF steps of kThreads slices of kVec
    /// positions: the host's split of a row must be the kernel's (a mismatch leaves dx unwritten).
    #[test]
    fn channel_first_backward_grid_matches_the_kernel_constants() {
        for decl in [
            format!("constexpr int kStepsCF = {CF_BWD_STEPS};"),
            "constexpr int kStepCF = kThreads * kVec;".to_string(),
        ] {
            assert!(
                SOURCE.contains(&decl),
                "cuda/causal_conv1d.cu lacks `{decl}`"
            );
        }
        // bf16: 1024 positions a step; 2048 -> 2 steps, one block a row
        let ((gx, gy, gz), parts) = cf_bwd_grid(DType::BF16, 8, 5376, 2048).unwrap();
        assert_eq!((gx, gy, gz, parts), (5376, 8, 1, 1));
        // 4097 positions: 5 steps -> 2 blocks a row; fp32 (512 a step): 9 steps -> 3
        assert_eq!(cf_bwd_grid(DType::BF16, 1, 7, 4097).unwrap().1, 2);
        assert_eq!(cf_bwd_grid(DType::F32, 1, 7, 4097).unwrap().1, 3);
        assert_eq!(cf_bwd_grid(DType::F16, 2, 3, 1).unwrap(), ((3, 2, 1), 1));
    }

    #[test]
    fn wide_forward_needs_full_walks_16bit_aligned_slices_and_packed_weights() {
        use crate::tensor::cuda_view;
        // channel-last bf16 x (batch 8, dim 5376, seqlen 2048): strides (2048 * 5376, 1, 5376)
        let mut p = Conv1dParams {
            dim: 5376,
            seqlen: 2048,
            x: 1 << 20,
            out: 1 << 21,
            x_s: [2048 * 5376, 1, 5376],
            out_s: [2048 * 5376, 1, 5376],
            ..Default::default()
        };
        let w = cuda_view(&[5376, 4], &[4, 1], DType::BF16, 4096);
        let wt = cuda_view(&[5376, 4], &[1, 5376], DType::BF16, 4096);
        let ok =
            |p: &Conv1dParams, rows: i64, dt: DType, w: &TensorView| cl_wide(p, rows, dt, w, None);
        if std::env::var("FLASHSCAN_CONV1D_WIDE").as_deref() == Ok("0") {
            return; // turned off for this process: nothing to check
        }
        assert!(ok(&p, CL_STEPS, DType::BF16, &w));
        assert!(ok(&p, CL_STEPS, DType::F16, &w));
        assert!(
            !ok(&p, 16, DType::BF16, &w),
            "a shortened walk keeps the 4-channel kernel"
        );
        assert!(!ok(&p, CL_STEPS, DType::F32, &w), "16-bit x only");
        assert!(!ok(&p, CL_STEPS, DType::BF16, &wt), "per-element weights");
        p.x = (1 << 20) + 8; // 8-byte-aligned slices: the 4-channel kernel's, not 16
        assert!(!ok(&p, CL_STEPS, DType::BF16, &w));
        p.x = 1 << 20;
        p.out_s[2] = 5380; // a row stride that is not a multiple of 8 elements
        assert!(!ok(&p, CL_STEPS, DType::BF16, &w));
        p.out_s[2] = 5376;
        p.has_seq = 1;
        assert!(!ok(&p, CL_STEPS, DType::BF16, &w));
        p.has_seq = 0;
        p.dim = 5372; // a partial 8-channel slice
        assert!(!ok(&p, CL_STEPS, DType::BF16, &w));
    }

    #[test]
    fn packed_weights_need_contiguous_aligned_rows() {
        use crate::tensor::cuda_view;
        let w = |strides: &[i64], ptr: u64| cuda_view(&[640, 4], strides, DType::BF16, ptr);
        let bias = |stride: i64, ptr: u64| cuda_view(&[640], &[stride], DType::BF16, ptr);
        assert!(weights_packed(&w(&[4, 1], 4096), None, CL_CHANNELS));
        assert!(weights_packed(
            &w(&[4, 1], 4096),
            Some(&bias(1, 8200)),
            CL_CHANNELS
        ));
        assert!(
            !weights_packed(&w(&[1, 640], 4096), None, CL_CHANNELS),
            "a transposed weight"
        );
        assert!(
            !weights_packed(&w(&[8, 1], 4096), None, CL_CHANNELS),
            "rows of a wider buffer"
        );
        assert!(
            !weights_packed(&w(&[4, 1], 4104), None, CL_CHANNELS),
            "an 8-byte-aligned base"
        );
        assert!(
            !weights_packed(&w(&[4, 1], 4096), Some(&bias(2, 8192)), CL_CHANNELS),
            "a strided bias"
        );
        assert!(
            !weights_packed(&w(&[4, 1], 4096), Some(&bias(1, 8196)), CL_CHANNELS),
            "a 4-byte-aligned bias"
        );
        let w32 = cuda_view(&[640, 3], &[3, 1], DType::F32, 4096);
        let b32 = |ptr: u64| cuda_view(&[640], &[1], DType::F32, ptr);
        assert!(weights_packed(&w32, Some(&b32(8192)), CL_CHANNELS));
        // the wide forward's 8-channel lanes: 16-byte bias vectors for 16-bit weights too
        assert!(weights_packed(
            &w(&[4, 1], 4096),
            Some(&bias(1, 8208)),
            CL_WIDE_CHANNELS
        ));
        assert!(!weights_packed(
            &w(&[4, 1], 4096),
            Some(&bias(1, 8200)),
            CL_WIDE_CHANNELS
        ));
        assert!(
            !weights_packed(&w32, Some(&b32(8200)), CL_CHANNELS),
            "fp32 biases: 16-byte vectors"
        );
    }

    #[test]
    fn short_and_fast_entries_need_whole_aligned_slices() {
        // channel-last bf16 x (batch 2, dim 640, seqlen 60): strides (60 * 640, 1, 640)
        let mut p = Conv1dParams {
            dim: 640,
            seqlen: 60,
            x: 4096,
            x_s: [60 * 640, 1, 640],
            ..Default::default()
        };
        let ok =
            |p: &Conv1dParams, rows: i64| cl_short(p, rows, true, DType::BF16, &[(p.x, &p.x_s)]);
        assert!(ok(&p, 8) && ok(&p, 4));
        assert!(!ok(&p, 16), "a full walk keeps the general kernel");
        assert!(
            !cl_short(&p, 8, false, DType::BF16, &[(p.x, &p.x_s)]),
            "offsets past 2^31 bytes keep the general kernel (the short walks index in 32 bits)"
        );
        p.x = 4096 + 2; // one element off: slices no longer 8-byte aligned
        assert!(!ok(&p, 8));
        p.x = 4096;
        p.x_s[2] = 642; // a time stride that breaks the slices' alignment
        assert!(!ok(&p, 8));
        p.x_s[2] = 640;
        p.has_seq = 1;
        assert!(!ok(&p, 8));
        p.has_seq = 0;
        p.dim = 642; // a partial last slice
        assert!(!ok(&p, 8));
        // fp32 slices are 16 bytes: an 8-byte aligned base is not enough
        assert!(!cl_rows_aligned(
            4104,
            &[640, 1, 4],
            DType::F32,
            CL_CHANNELS
        ));
        assert!(cl_rows_aligned(4112, &[640, 1, 4], DType::F32, CL_CHANNELS));

        // channel-first bf16 rows of 64 positions (2 x 8 elements a thread), aligned
        let mut q = Conv1dParams {
            seqlen: 64,
            x: 4096,
            out: 8192,
            x_s: [640 * 64, 64, 1],
            out_s: [640 * 64, 64, 1],
            ..Default::default()
        };
        assert!(cf_fast(&q, DType::BF16));
        q.seqlen = 60; // not a multiple of 16 elements
        assert!(!cf_fast(&q, DType::BF16));
        q.seqlen = 64;
        q.has_final = 1;
        assert!(!cf_fast(&q, DType::BF16));
        q.has_final = 0;
        q.out = 8192 + 8;
        assert!(!cf_fast(&q, DType::BF16));
    }

    #[test]
    fn every_variant_is_listed_once() {
        let v = all_specs(90);
        // 12 entries x 5 dtype pairs x 3 widths, + the wide forward's 4 16-bit pairs x 3 widths
        assert_eq!(v.len(), 12 * 5 * 3 + 4 * 3);
        let names: std::collections::HashSet<String> = v.iter().map(|(s, _)| s.name()).collect();
        assert_eq!(names.len(), v.len());
    }
}
