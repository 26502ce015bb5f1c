//! The warp-specialised Hopper forward (`cuda/flash_fwd_sm90_tma.cu`): its variants, its shared
//! memory, and the TMA tensor maps of Q, K and V that ride in its parameter.
//!
//! The default where the wgmma path runs (FLASHSCAN_SM90_TMA=0 opts out): `attention::launch`
//! runs it for every problem the cp.async wgmma kernel covers, for head dim 256, softcap and head
//! dims padded to its 64-, 128- or 256-column tile (`tile_head_dim`), and for packed sequences
//! (`varlen_spec`), and falls back to that kernel (exact dense head dims) or
//! the mma.sync one when the driver refuses a tensor map (an unusual stride, an old driver).

use crate::error::Result;
use crate::ops::attention::{self, FlashFwdParams};
use crate::runtime::driver::encode_tensor_map_4d;
use crate::runtime::KernelSpec;
use crate::tensor::DType;

pub const SOURCE: &str = include_str!("../../cuda/flash_fwd_sm90_tma.cu");
pub const FAMILY: &str = "flash_fwd_sm90_tma";
pub const ENTRY: &str = "flash_fwd_sm90_tma_kernel";
/// Threads of a CTA computing `block_m` query rows: a producer warpgroup and one consumer
/// warpgroup per 64 rows.
pub fn threads(block_m: i64) -> u32 {
    128 * (1 + block_m as u32 / 64)
}
/// Rows of a Q tile at block_m 128 (and of a K / V tile, see `block_n`), and the 64-element
/// (128-byte) column block one TMA box fills.
const TILE_ROWS: u32 = 128;
const BOX_COLS: u32 = 64;

/// Keys per K / V tile (`FS_BLOCK_N`): 128, or 64 at head dim 256, where O's 128 accumulator
/// registers a thread leave room for a 64-key S and P only, and two stages of 64-key K and V
/// beside the 64 KB Q tile fill the 227 KB of shared memory.
pub fn block_n(head_dim: i64) -> u32 {
    if head_dim > 128 {
        64
    } else {
        TILE_ROWS
    }
}

/// What the TMA kernel covers (arch sm_90, fp16/bf16, tile head dim 64, 128 or 256; softcap
/// too, see `spec`) as the dtype's kernel code; None for everything else.
pub fn dtype_code(head_dim: i64, dtype: DType, arch_num: i64) -> Option<i64> {
    // (the wgmma kernel's conditions, at a head dim it covers, and 256 on top)
    matches!(head_dim, 64 | 128 | 256)
        .then(|| attention::sm90_dtype_code(128, dtype, false, arch_num))
        .flatten()
}

/// The kernel's head dim (its tile width, `FS_HEAD_DIM`) for a problem's: 64, 128 or 256 itself,
/// or the next of them for a multiple of 8 below (48 -> 64, 80 / 96 / 112 -> 128, 136 .. 248 ->
/// 256): the tensor maps
/// keep the real width, TMA fills the tile's columns past it with zeros, and the epilogue stores
/// only O's own columns. The rows stay 16-byte multiples (TMA strides, 16-byte output chunks).
/// FLASHSCAN_SM90_PAD=0 (read on every call, for A/B runs) keeps the exact dims only; padded dims
/// from `PAD_MIN_HEAD_DIM` up by default (see there).
pub fn tile_head_dim(head_dim: i64) -> Option<i64> {
    if head_dim == 64 || head_dim == 128 || head_dim == 256 {
        return Some(head_dim); // (no environment read on the common path)
    }
    let pad = !std::env::var("FLASHSCAN_SM90_PAD").is_ok_and(|v| v == "0");
    let min = std::env::var("FLASHSCAN_SM90_PAD_MIN")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(PAD_MIN_HEAD_DIM);
    padded_tile(head_dim, pad, min)
}

/// `tile_head_dim` for given switches: `pad` off keeps 64, 128 and 256 only; `min`, the
/// smallest padded head dim taken.
fn padded_tile(head_dim: i64, pad: bool, min: i64) -> Option<i64> {
    match head_dim {
        64 | 128 | 256 => Some(head_dim),
        _ if !pad || head_dim % 8 != 0 || head_dim < min.max(8) || head_dim > 256 => None,
        _ if head_dim < 64 => Some(64),
        _ if head_dim < 128 => Some(128),
        _ => Some(256),
    }
}

/// The smallest padded head dim the TMA kernel takes by default (see `tile_head_dim`). Measured
/// on the H200 (2026-12-02, bf16, in one process against the mma.sync kernel's own tiles,
/// `benches/results/2026-12-02-h200-attention-padded-head-dims/`): 1.24x at 32 (the 64 tile, half
/// of it zeros), 1.53-1.63x at 40-48, 1.82-1.89x at 80, 1.59-1.80x at 96, 2.07-2.09x at 112;
/// below 32 (a quarter of the tile or less) unmeasured, so it stays on the mma.sync kernel.
/// On the 256 tile (2026-12-02, `benches/results/2026-12-02-h200-attention-hd256/`): 2.1x at 192
/// (0.86-0.96x cuDNN, which has a tile of its own there), 1.79x at 136 causal.
/// FLASHSCAN_SM90_PAD_MIN (read on every call) moves it.
pub const PAD_MIN_HEAD_DIM: i64 = 32;

/// K/V ring depth: three stages where they fit beside Q in 227 KB with room to spare (head dim
/// 64); two at head dim 128 (three would fit too, by 2 KB: untried) and 256 (64-key tiles). FLASHSCAN_SM90_KV_STAGES
/// (2-5, read once) overrides it at head dim 64 for tuning (the CPU suite compiles the
/// defaults only).
pub fn kv_stages(head_dim: i64) -> i64 {
    static OVERRIDE: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
    let o = *OVERRIDE.get_or_init(|| {
        std::env::var("FLASHSCAN_SM90_KV_STAGES")
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|n| (2..=5).contains(n))
    });
    if head_dim <= 64 {
        o.unwrap_or(3)
    } else {
        2
    }
}

/// Dynamic shared memory: Q (block_m x head_dim) and `stages` K/V pairs of block_n x head_dim
/// 16-bit tiles, 1 KB to align the base to 1024, and the mbarriers (bar_q, full_k/v, empty_k/v
/// per stage; 8 bytes each).
pub fn smem_bytes(head_dim: i64, stages: i64, block_m: i64) -> u32 {
    let tile = block_n(head_dim) * head_dim as u32 * 2;
    let q = block_m as u32 * head_dim as u32 * 2;
    q + 2 * stages as u32 * tile + 1024 + 8 * (1 + 4 * stages as u32)
}

/// Query rows per CTA: 128 (two consumer warpgroups) at head dim 128; 192 (three consumer
/// warpgroups, the plain schedule: the pipelined ones need more than the 128 registers a
/// 512-thread CTA gives each thread, and spill) at head dim 64, where the softmax costs as much
/// as the GEMMs and two warpgroups cannot hide it: measured on the H100 (2026-11-27, bf16,
/// batch x seqlen 16k, 32 heads) 424-507 TFLOP/s against 364-425 for 128 rows in ping-pong
/// (cuDNN 407-457 in the same run). FLASHSCAN_SM90_BLOCK_M=128 keeps 128 rows at head dim 64.
/// Read once.
pub fn block_m(head_dim: i64) -> i64 {
    static BM: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let hd64 = *BM.get_or_init(|| match std::env::var("FLASHSCAN_SM90_BLOCK_M") {
        Ok(v) if v == "128" => 128,
        _ => 192,
    });
    if head_dim == 64 {
        hd64
    } else {
        128
    }
}

/// Which consumer schedule the kernel is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Each warpgroup: S, softmax, P V in turn (the two warpgroups overlap each other freely).
    Plain,
    /// `FS_SM90_PIPE`: S(i) issued with P(i-1) V(i-1), the softmax between their waits.
    Pipe,
    /// `FS_SM90_PINGPONG` on top of Pipe: the warpgroups take turns issuing GEMMs.
    PingPong,
}

impl Schedule {
    pub const ALL: [Schedule; 3] = [Schedule::Plain, Schedule::Pipe, Schedule::PingPong];

    /// FLASHSCAN_SM90_PINGPONG=1: ping-pong (with the pipelined order); =0: pipelined with
    /// FLASHSCAN_SM90_PIPE=1, else plain; unset: pipelined with FLASHSCAN_SM90_PIPE=1, else
    /// ping-pong (the default: the fastest on the H100).
    pub fn from_env(pipe: bool, pingpong: Option<bool>) -> Schedule {
        match (pipe, pingpong) {
            (_, Some(true)) => Schedule::PingPong,
            (true, _) => Schedule::Pipe,
            (false, Some(false)) => Schedule::Plain,
            (false, None) => Schedule::PingPong,
        }
    }
}

/// The variant and its dynamic shared memory, for the problems `attention::sm90_spec` covers.
pub fn spec(
    head_dim: i64,
    dtype: DType,
    has_mask: bool,
    softcap: bool,
    arch_num: i64,
    schedule: Schedule,
    block_m: i64,
) -> Option<(KernelSpec, u32)> {
    let code = dtype_code(head_dim, dtype, arch_num)?;
    if block_m != 128 && (block_m != 192 || head_dim != 64) {
        return None;
    }
    // three consumers: the plain schedule (see `block_m`)
    let schedule = if block_m == 192 {
        Schedule::Plain
    } else {
        schedule
    };
    // softcap in the default schedules only (head dim 64's three consumers, else ping-pong): the
    // others are tuning alternatives, and each doubles the variants the CPU suite compiles (head
    // dim 64 ping-pong on 128 rows also spilled 8 bytes with it, NVRTC 13.0); a softcap call
    // with another schedule takes the mma.sync kernel
    if softcap && !default_schedule(head_dim, schedule, block_m) {
        return None;
    }
    let stages = kv_stages(head_dim);
    let mut defines = vec![
        ("FS_HEAD_DIM", head_dim),
        ("FS_DTYPE", code),
        ("FS_HAS_MASK", has_mask as i64),
        ("FS_ARCH", arch_num),
        ("FS_KV_STAGES", stages),
    ];
    if schedule != Schedule::Plain {
        defines.push(("FS_SM90_PIPE", 1));
    }
    if schedule == Schedule::PingPong {
        defines.push(("FS_SM90_PINGPONG", 1));
    }
    if block_m != 128 {
        defines.push(("FS_BLOCK_M", block_m));
    }
    if block_n(head_dim) != TILE_ROWS {
        defines.push(("FS_BLOCK_N", block_n(head_dim) as i64));
    }
    if softcap {
        defines.push(("FS_HAS_SOFTCAP", 1));
    }
    if let Some(n) = exp_poly() {
        defines.push(("FS_EXP_POLY", n));
    }
    Some((
        KernelSpec {
            family: FAMILY,
            source: SOURCE,
            entry: ENTRY,
            defines,
        },
        smem_bytes(head_dim, stages, block_m),
    ))
}

/// FLASHSCAN_SM90_EXP_POLY=N (1-16; read on every call, off by default): of every 16 column
/// pairs of S, N exponentiate on the FMA pipe (a degree-3 polynomial, `FS_EXP_POLY`) instead of
/// MUFU. Measured on the H200 (2026-12-02, bf16, hd64 s2048, in one process,
/// `benches/results/2026-12-02-h200-attention-exp-fma/`): N = 2 costs 2.6-7.6% without softcap
/// (the plain schedule is issue-bound, not MUFU-bound) and gains 4.5-7% with softcap 50 (tanh and
/// exp2 both on MUFU); N = 4 costs more. A tuning switch until a wider measurement picks defaults;
/// the CPU suite compiles the default (0) only.
pub(crate) fn exp_poly() -> Option<i64> {
    std::env::var("FLASHSCAN_SM90_EXP_POLY")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|n| (1..=16).contains(n))
}

/// Whether (head dim, schedule, block_m) is a default build: head dim 64's three consumers (plain,
/// 192 rows), ping-pong on 128 rows at 128 and 256. Softcap and packed sequences are built for
/// these only.
fn default_schedule(head_dim: i64, schedule: Schedule, block_m: i64) -> bool {
    block_m == 192 || (schedule == Schedule::PingPong && head_dim != 64)
}

/// The packed-sequence (`flash_attn_varlen_func`) form of `spec`'s variant (`FS_VARLEN`: each
/// tile reads its sequence's bounds from cu_seqlens; one CTA a tile), for the default schedules
/// only (see `default_schedule`; other schedules send varlen calls to the mma.sync kernel).
#[allow(clippy::too_many_arguments)]
pub fn varlen_spec(
    head_dim: i64,
    dtype: DType,
    has_mask: bool,
    softcap: bool,
    arch_num: i64,
    schedule: Schedule,
    block_m: i64,
) -> Option<(KernelSpec, u32)> {
    let (mut k, smem) = spec(
        head_dim, dtype, has_mask, softcap, arch_num, schedule, block_m,
    )?;
    // (spec forces plain on 192 rows: check what it built)
    let built = if block_m == 192 {
        Schedule::Plain
    } else {
        schedule
    };
    if !default_schedule(head_dim, built, block_m) {
        return None;
    }
    k.defines.push(("FS_VARLEN", 1));
    Some((k, smem))
}

/// How the persistent kernel's CTAs find their tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileOrder {
    /// `FS_SM90_PERSIST=1`: CTA i takes tiles i, i + grid, ... (equal tiles: unmasked only).
    Stride,
    /// `FS_SM90_PERSIST=2`: each CTA's producer takes the next tile index from a global counter
    /// (zeroed before the launch) once it issued its tile's loads; sections of pairs sized to L2,
    /// masked tiles longest first (see `section_heads`). Balances uneven (masked) tiles.
    Queue,
}

/// The persistent form of `spec`'s variant (one CTA an SM walking the tiles, the next tile's
/// loads under this one's last P V and epilogue, O staged in a buffer of its own) taking its
/// tiles in `order`, and its dynamic shared memory; None where `spec` has none, and for masked
/// problems in `Stride` order (their tiles differ in cost: a static stride would not balance).
#[allow(clippy::too_many_arguments)]
pub fn persistent_spec(
    head_dim: i64,
    dtype: DType,
    has_mask: bool,
    softcap: bool,
    arch_num: i64,
    schedule: Schedule,
    block_m: i64,
    order: TileOrder,
) -> Option<(KernelSpec, u32)> {
    // (at head dim 64 on 128 rows, whose default is 192 rows, plain: the pipelined schedule
    // spills 16 bytes when persistent, and ping-pong 16-32 with the queue, NVRTC 13.0; they keep
    // the one-tile grid)
    let spills = head_dim == 64
        && block_m == 128
        && match order {
            TileOrder::Stride => schedule == Schedule::Pipe,
            TileOrder::Queue => schedule != Schedule::Plain,
        };
    // (head dim 256: Q and two K / V stages fill shared memory; no room for the O buffer)
    if (has_mask && order == TileOrder::Stride) || spills || head_dim > 128 {
        return None;
    }
    let (mut k, smem) = spec(
        head_dim, dtype, has_mask, softcap, arch_num, schedule, block_m,
    )?;
    let queue = order == TileOrder::Queue;
    k.defines
        .push(("FS_SM90_PERSIST", if queue { 2 } else { 1 }));
    // + the O staging buffer (as large as Q) and the q_empty barrier; the queue's four barriers
    // and two slots
    let extra = (block_m * head_dim * 2) as u32 + 8 + if queue { 40 } else { 0 };
    Some((k, smem + extra))
}

/// Longest seqlen_k a masked problem without a left window takes the tile queue at (beyond it
/// one CTA a tile): on the H200 (2026-12-02, bf16, causal, batch x seqlen 16k, interleaved in
/// one process) the queue gained +15-20% at s512, +8% at s2048, +3-6% at s4096, but at s16384
/// nothing at head dim 64 and -3..-5% at 128 (`benches/results/2026-12-02-h200-attention-queue/`).
const QUEUE_MAX_SEQLEN_K: i64 = 8192;

/// Whether a masked problem takes the tile queue by default: where its tiles are short, i.e.
/// seqlen_k <= QUEUE_MAX_SEQLEN_K or a left window bounds every tile's keys.
pub fn queue_wanted(seqlen_k: i64, window_left: i64) -> bool {
    seqlen_k <= QUEUE_MAX_SEQLEN_K || (0..QUEUE_MAX_SEQLEN_K).contains(&window_left)
}

/// K / V bytes the tile queue's sections aim to keep in L2 (H100 / H200: 50 MB of L2).
const SECTION_L2_BYTES: i64 = 32 << 20;

/// (batch, head) pairs in one section of the tile queue's order: as many as share K / V heads
/// whose 16-bit K and V (seqlen_k x head_dim each) fit SECTION_L2_BYTES, at least one K / V
/// head's worth (`nheads / nheads_k` consecutive heads share one under GQA).
pub fn section_heads(seqlen_k: i64, head_dim: i64, nheads: i64, nheads_k: i64) -> i32 {
    let kv_head_bytes = (seqlen_k * head_dim * 2 * 2).max(1);
    let group = (nheads / nheads_k.max(1)).max(1);
    let kv_heads = (SECTION_L2_BYTES / kv_head_bytes).max(1);
    (kv_heads * group).clamp(1, i32::MAX as i64) as i32
}

/// The persistent kernel's grid: one CTA an SM (its shared memory allows no second; `ctas` is
/// the SM count), no more than there are tiles.
pub fn persistent_grid(tiles: i64, ctas: i64) -> u32 {
    tiles.min(ctas).clamp(1, u32::MAX as i64) as u32
}

/// Mirrors `struct FlashFwdTmaParams` in cuda/flash_fwd_sm90_tma.cu: three encoded tensor maps
/// (64-byte aligned, 128 bytes each), the tile queue's counter and section, then the plain
/// parameters. The kernel's struct is 576 bytes (its FlashFwdParams lacks the varlen tail); the
/// driver copies that many from here.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct FlashFwdTmaParams {
    pub tm_q: [u64; 16],
    pub tm_k: [u64; 16],
    pub tm_v: [u64; 16],
    /// `int*`, the queue's two counters (zero at the launch, left zero); 0 for the stride
    pub tile_counter: u64,
    /// `section_heads`; 0 for the stride
    pub section_heads: i32,
    pub pad: i32,
    pub base: FlashFwdParams,
}

const _: () = assert!(std::mem::offset_of!(FlashFwdTmaParams, tile_counter) == 384);
const _: () = assert!(std::mem::offset_of!(FlashFwdTmaParams, base) == 400);
const _: () = assert!(std::mem::size_of::<FlashFwdTmaParams>() >= 576);

/// What cuTensorMapEncodeTiled receives for one (batch, seqlen, heads, head_dim) operand:
/// dims innermost first (head_dim, seqlen, heads, batch), the byte strides of dims 1..3, and the
/// box (one 64-column block of `box_rows` rows of one head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapArgs {
    pub dims: [u64; 4],
    pub strides: [u64; 3],
    pub box_dims: [u32; 4],
}

/// The map arguments of an operand with `rows` x `heads` x `batch` rows of `head_dim` 16-bit
/// elements and the given element strides; None where TMA cannot address it (a negative
/// stride, or one that is not a multiple of 16 bytes on a dimension longer than 1).
#[allow(clippy::too_many_arguments)] // the box, then one (size, stride) pair per dimension
pub fn map_args(
    box_rows: u32,
    head_dim: i64,
    rows: i64,
    heads: i64,
    batch: i64,
    row_stride: i64,
    head_stride: i64,
    batch_stride: i64,
) -> Option<MapArgs> {
    map_args_of(
        2,
        box_rows,
        head_dim,
        rows,
        heads,
        batch,
        row_stride,
        head_stride,
        batch_stride,
    )
}

/// `map_args` for `es`-byte elements (2, or 1 for the FP8 forward's e4m3 Q and K): the box is
/// one 128-byte column block (64 or 128 elements) of `box_rows` rows.
#[allow(clippy::too_many_arguments)] // the element, the box, one (size, stride) pair a dimension
pub fn map_args_of(
    es: i64,
    box_rows: u32,
    head_dim: i64,
    rows: i64,
    heads: i64,
    batch: i64,
    row_stride: i64,
    head_stride: i64,
    batch_stride: i64,
) -> Option<MapArgs> {
    let mut strides = [0u64; 3];
    for (i, (n, s)) in [
        (rows, row_stride),
        (heads, head_stride),
        (batch, batch_stride),
    ]
    .into_iter()
    .enumerate()
    {
        strides[i] = if n == 1 {
            // never stepped along: any legal value (a broadcast or odd stride is fine here)
            (head_dim * es).max(16) as u64
        } else if s > 0 && (s * es) % 16 == 0 && s * es < (1i64 << 40) {
            (s * es) as u64
        } else {
            return None;
        };
    }
    // (a head dim below the tile's: the boxes past it read zeros; rows stay 16-byte multiples)
    if (head_dim * es) % 16 != 0 || head_dim > 256 || rows < 1 || heads < 1 || batch < 1 {
        return None;
    }
    Some(MapArgs {
        dims: [head_dim as u64, rows as u64, heads as u64, batch as u64],
        strides,
        box_dims: [BOX_COLS * 2 / es as u32, box_rows, 1, 1],
    })
}

fn encode(ptr: u64, bf16: bool, a: Option<MapArgs>) -> Result<[u64; 16]> {
    let a = a.ok_or_else(|| crate::error::unsupported("a stride TMA cannot address"))?;
    encode_tensor_map_4d(ptr, bf16, a.dims, a.strides, a.box_dims)
}

/// The kernel parameter for `params` (sizes already filled in), `block_m` query rows per CTA
/// and the kernel's tile head dim: Q, K and V maps encoded by the driver (Q's boxes are 64 rows
/// at block_m 192, which the kernel loads three of; K's and V's `block_n` rows). `varlen`: the
/// maps span the packed rows (total_q / total_k) with batch 1. An error means "use the cp.async
/// kernel" (or the mma.sync one), not a failed call.
pub fn params(
    params: &FlashFwdParams,
    dtype: DType,
    block_m: i64,
    tile_head_dim: i64,
    varlen: bool,
) -> Result<FlashFwdTmaParams> {
    let bf16 = dtype == DType::BF16;
    let hd = params.head_dim as i64;
    let (b, sq, sk) = if varlen {
        (1, params.total_q as i64, params.total_k as i64)
    } else {
        (
            params.batch as i64,
            params.seqlen_q as i64,
            params.seqlen_k as i64,
        )
    };
    let (h, hk) = (params.nheads as i64, params.nheads_k as i64);
    let q_box = if block_m == 128 { TILE_ROWS } else { 64 };
    let q = map_args(
        q_box,
        hd,
        sq,
        h,
        b,
        params.q_row_stride,
        params.q_head_stride,
        params.q_batch_stride,
    );
    let kv_box = block_n(tile_head_dim);
    let k = map_args(
        kv_box,
        hd,
        sk,
        hk,
        b,
        params.k_row_stride,
        params.k_head_stride,
        params.k_batch_stride,
    );
    let v = map_args(
        kv_box,
        hd,
        sk,
        hk,
        b,
        params.v_row_stride,
        params.v_head_stride,
        params.v_batch_stride,
    );
    Ok(FlashFwdTmaParams {
        tm_q: encode(params.q, bf16, q)?,
        tm_k: encode(params.k, bf16, k)?,
        tm_v: encode(params.v, bf16, v)?,
        tile_counter: 0,
        section_heads: 0,
        pad: 0,
        base: *params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_bshd_maps_step_rows_heads_batches_in_bytes() {
        // (batch 4, seqlen 4096, 16 heads, 128) contiguous bf16: row = 16 * 128 elements
        let a =
            map_args(128, 128, 4096, 16, 4, 16 * 128, 128, 4096 * 16 * 128).expect("addressable");
        assert_eq!(a.dims, [128, 4096, 16, 4]);
        assert_eq!(a.strides, [4096, 256, 4096 * 16 * 128 * 2]);
        assert_eq!(a.box_dims, [64, 128, 1, 1]);
        // head dim 64, GQA K with 2 heads, odd seqlen: the box still covers 128 rows (TMA
        // zero-fills the tail)
        let k = map_args(128, 64, 333, 2, 3, 2 * 64, 64, 333 * 2 * 64).expect("addressable");
        assert_eq!(k.dims, [64, 333, 2, 3]);
        assert_eq!(k.strides, [256, 128, 333 * 256]);
    }

    #[test]
    fn bhsd_views_and_size_one_dims_get_legal_strides() {
        // a (b, s, h, d) view of a (b, h, s, d) tensor: row stride d, head stride s * d
        let a = map_args(128, 128, 1000, 8, 2, 128, 1000 * 128, 8 * 1000 * 128).expect("ok");
        assert_eq!(a.strides, [256, 256_000, 2_048_000]);
        // batch 1 with a broadcast (0) batch stride, and seqlen 1 with a stride never stepped
        let b = map_args(128, 64, 1, 4, 1, 0, 64, 0).expect("size-1 dims are never stepped");
        assert_eq!(b.dims, [64, 1, 4, 1]);
        assert_eq!(b.strides, [128, 128, 128]);
    }

    #[test]
    fn unaddressable_strides_are_refused() {
        assert_eq!(map_args(128, 128, 10, 2, 2, 136, 128, -2720), None); // negative
        assert_eq!(map_args(128, 128, 10, 2, 2, 260, 128, 2600), None); // 520 bytes: not 16-aligned
        assert_eq!(map_args(128, 100, 10, 2, 2, 200, 100, 2000), None); // rows of 200 bytes
        assert_eq!(map_args(64, 264, 10, 2, 2, 528, 264, 5280), None); // wider than a tile
                                                                       // head dim 256 (and 192 padded to it): 64-row K / V boxes
        let kv = map_args(64, 192, 10, 2, 2, 384, 192, 3840).expect("addressable");
        assert_eq!((kv.dims[0], kv.box_dims), (192, [64, 64, 1, 1]));
    }

    #[test]
    fn padded_head_dims_keep_their_width_in_the_map_and_take_the_next_tile() {
        // head dim 96 on the 128 tile: the map holds 96 columns (the second box reads 32 of
        // them and 32 zeros); the rows, 192 bytes, step in 16-byte multiples
        let a = map_args(128, 96, 1000, 8, 2, 8 * 96, 96, 1000 * 8 * 96).expect("addressable");
        assert_eq!(a.dims, [96, 1000, 8, 2]);
        assert_eq!(a.strides, [8 * 96 * 2, 192, 1000 * 8 * 96 * 2]);
        assert_eq!(a.box_dims, [64, 128, 1, 1]);
        for (hd, tile) in [
            (64, 64),
            (128, 128),
            (48, 64),
            (80, 128),
            (96, 128),
            (112, 128),
        ] {
            assert_eq!(padded_tile(hd, true, 8), Some(tile), "head dim {hd}");
        }
        for (hd, tile) in [(256, 256), (136, 256), (192, 256), (248, 256)] {
            assert_eq!(padded_tile(hd, true, 8), Some(tile), "head dim {hd}");
        }
        for hd in [100, 130, 260, 264, 512, 0, -8] {
            assert_eq!(padded_tile(hd, true, 8), None, "head dim {hd}");
        }
        assert_eq!(padded_tile(256, false, 8), Some(256));
        assert_eq!(padded_tile(192, false, 8), None);
        // switched off: the exact tiles only; a minimum: smaller head dims stay off the kernel
        assert_eq!(padded_tile(96, false, 8), None);
        assert_eq!(padded_tile(64, false, 8), Some(64));
        assert_eq!(padded_tile(32, true, 40), None);
        assert_eq!(padded_tile(48, true, 40), Some(64));
        assert_eq!(padded_tile(24, true, PAD_MIN_HEAD_DIM), None);
        assert_eq!(padded_tile(32, true, PAD_MIN_HEAD_DIM), Some(64));
    }

    #[test]
    fn smem_fits_the_227_kb_opt_in_limit() {
        assert_eq!(smem_bytes(128, 2, 128), 5 * 32768 + 1024 + 72);
        assert!(smem_bytes(128, kv_stages(128), 128) <= 232_448);
        assert!(smem_bytes(64, kv_stages(64), 128) <= 232_448);
        assert!(smem_bytes(128, 3, 128) <= 232_448);
        // three consumers at head dim 64: a 192-row Q tile
        assert_eq!(smem_bytes(64, 3, 192), 24576 + 6 * 16384 + 1024 + 8 * 13);
        assert!(smem_bytes(64, kv_stages(64), 192) <= 232_448);
    }

    #[test]
    fn block_m_192_is_head_dim_64_plain_with_three_consumers_and_64_row_q_boxes() {
        use Schedule::*;
        assert_eq!((threads(128), threads(192)), (384, 512));
        assert!(spec(128, DType::BF16, false, false, 90, Plain, 192).is_none());
        assert!(spec(64, DType::BF16, false, false, 90, Plain, 256).is_none());
        for sch in Schedule::ALL {
            let (k, smem) = spec(64, DType::BF16, true, false, 90, sch, 192).expect("covered");
            let has = |d: &str| k.defines.iter().any(|(n, _)| *n == d);
            assert!(k.defines.contains(&("FS_BLOCK_M", 192)));
            assert!(
                !has("FS_SM90_PIPE") && !has("FS_SM90_PINGPONG"),
                "{sch:?}: plain only"
            );
            assert_eq!(smem, smem_bytes(64, 3, 192));
        }
        // persistent: a static stride unmasked only, the O buffer and q_empty on top; the
        // queue masked or not, its barriers and slots on top of that
        use TileOrder::{Queue, Stride};
        assert!(persistent_spec(64, DType::BF16, true, false, 90, Plain, 192, Stride).is_none());
        let (k, smem) =
            persistent_spec(64, DType::BF16, false, false, 90, Plain, 192, Stride).expect("ok");
        assert!(k.defines.contains(&("FS_SM90_PERSIST", 1)));
        assert_eq!(smem, smem_bytes(64, 3, 192) + 24576 + 8);
        assert!(smem <= 232_448);
        for mask in [false, true] {
            let (k, smem_q) =
                persistent_spec(64, DType::BF16, mask, false, 90, Plain, 192, Queue).expect("ok");
            assert!(k.defines.contains(&("FS_SM90_PERSIST", 2)));
            assert_eq!(smem_q, smem + 40);
            let (_, smem) =
                persistent_spec(128, DType::BF16, mask, false, 90, PingPong, 128, Queue)
                    .expect("covered");
            assert!(smem <= 232_448 && smem == smem_bytes(128, kv_stages(128), 128) + 32768 + 48);
        }
        let (_, smem) = persistent_spec(128, DType::BF16, false, false, 90, PingPong, 128, Stride)
            .expect("covered");
        assert!(smem <= 232_448 && smem == smem_bytes(128, kv_stages(128), 128) + 32768 + 8);
        // the queue by default: short keys, or a left window bounding them
        assert!(queue_wanted(512, -1) && queue_wanted(8192, -1) && !queue_wanted(8193, -1));
        assert!(queue_wanted(1 << 20, 4096) && !queue_wanted(1 << 20, 8192));
        // the queue's sections: K / V of 32 MiB, at least one K / V head's group of heads
        assert_eq!(section_heads(2048, 64, 32, 32), 64); // 512 KiB a head
        assert_eq!(section_heads(16384, 128, 16, 16), 4); // 8 MiB a head
        assert_eq!(section_heads(1 << 20, 128, 16, 2), 8); // 512 MiB a K / V head: one group
        assert_eq!(section_heads(512, 64, 32, 8), 256 * 4);
        assert_eq!(
            (persistent_grid(7, 132), persistent_grid(4096, 132)),
            (7, 132)
        );
        // block_m 128 keeps the variant names (and caches) of before: no FS_BLOCK_M define
        let (k, _) = spec(64, DType::BF16, true, false, 90, PingPong, 128).expect("covered");
        assert!(!k.defines.iter().any(|(n, _)| *n == "FS_BLOCK_M"));
        let q = map_args(64, 64, 4096, 16, 4, 16 * 64, 64, 4096 * 16 * 64).expect("ok");
        assert_eq!(q.box_dims, [64, 64, 1, 1]);
    }

    #[test]
    fn covers_what_the_cp_async_wgmma_kernel_covers() {
        use Schedule::*;
        assert!(spec(128, DType::BF16, true, false, 90, Plain, 128).is_some());
        assert!(spec(64, DType::F16, false, false, 90, Pipe, 128).is_some());
        assert!(spec(128, DType::BF16, false, false, 80, Plain, 128).is_none());
        assert!(spec(128, DType::F32, false, false, 90, Plain, 128).is_none());
        assert!(spec(96, DType::BF16, false, false, 90, Plain, 128).is_none());
    }

    #[test]
    fn varlen_builds_the_default_schedules_on_one_cta_a_tile() {
        use Schedule::*;
        let is_varlen = |k: &KernelSpec| k.defines.contains(&("FS_VARLEN", 1));
        for (hd, bm, sch) in [(64, 192, Plain), (64, 192, PingPong), (128, 128, PingPong)] {
            let (k, smem) = varlen_spec(hd, DType::F16, true, true, 90, sch, bm).expect("covered");
            assert!(is_varlen(&k) && k.defines.contains(&("FS_HAS_SOFTCAP", 1)));
            assert_eq!(
                smem,
                spec(hd, DType::F16, true, true, 90, sch, bm).expect("ok").1
            );
        }
        assert!(varlen_spec(256, DType::BF16, false, false, 90, PingPong, 128).is_some());
        assert!(varlen_spec(128, DType::BF16, false, false, 90, Pipe, 128).is_none());
        assert!(varlen_spec(64, DType::BF16, false, false, 90, PingPong, 128).is_none());
        assert!(varlen_spec(128, DType::F32, false, false, 90, PingPong, 128).is_none());
    }

    #[test]
    fn softcap_builds_the_default_schedules_only() {
        use Schedule::*;
        let has_cap = |k: &KernelSpec| k.defines.contains(&("FS_HAS_SOFTCAP", 1));
        for (hd, bm) in [(64, 192), (128, 128), (256, 128)] {
            let (k, _) = spec(hd, DType::BF16, true, true, 90, PingPong, bm).expect("covered");
            assert!(has_cap(&k), "head dim {hd}");
            let (k, _) = spec(hd, DType::BF16, true, false, 90, PingPong, bm).expect("covered");
            assert!(!has_cap(&k), "head dim {hd}");
        }
        // three consumers run plain whatever is asked; 128 rows only ping-pong
        assert!(spec(64, DType::F16, false, true, 90, Pipe, 192).is_some());
        assert!(spec(128, DType::BF16, false, true, 90, Plain, 128).is_none());
        assert!(spec(128, DType::BF16, false, true, 90, Pipe, 128).is_none());
        assert!(spec(64, DType::BF16, false, true, 90, PingPong, 128).is_none());
        assert!(spec(128, DType::F32, false, true, 90, PingPong, 128).is_none());
        let (k, _) = persistent_spec(
            128,
            DType::BF16,
            true,
            true,
            90,
            PingPong,
            128,
            TileOrder::Queue,
        )
        .expect("covered");
        assert!(has_cap(&k) && k.defines.contains(&("FS_SM90_PERSIST", 2)));
    }

    #[test]
    fn head_dim_256_runs_64_key_tiles_on_one_cta_a_tile() {
        use Schedule::*;
        assert_eq!((block_n(64), block_n(128), block_n(256)), (128, 128, 64));
        for sch in Schedule::ALL {
            let (k, smem) = spec(256, DType::BF16, true, false, 90, sch, 128).expect("covered");
            assert!(k.defines.contains(&("FS_BLOCK_N", 64)));
            assert!(k.defines.contains(&("FS_KV_STAGES", 2)));
            // Q 64 KB, two stages of 64-key K and V (32 KB each), alignment and barriers
            assert_eq!(smem, 65536 + 4 * 32768 + 1024 + 72);
            assert!(smem <= 232_448);
            for order in [TileOrder::Stride, TileOrder::Queue] {
                let persistent =
                    persistent_spec(256, DType::BF16, false, false, 90, sch, 128, order);
                assert!(persistent.is_none(), "no room for the O buffer");
            }
        }
        assert!(spec(256, DType::BF16, false, false, 90, Plain, 192).is_none());
        assert!(spec(256, DType::F32, false, false, 90, Plain, 128).is_none());
        assert!(spec(192, DType::BF16, false, false, 90, Plain, 128).is_none());
        // 64 and 128 keep their variant names: no FS_BLOCK_N define
        let (k, _) = spec(128, DType::BF16, false, false, 90, PingPong, 128).expect("covered");
        assert!(!k.defines.iter().any(|(n, _)| *n == "FS_BLOCK_N"));
    }

    #[test]
    fn ping_pong_builds_on_the_pipelined_order() {
        let defines = |sch| {
            spec(128, DType::BF16, false, false, 90, sch, 128)
                .expect("covered")
                .0
                .defines
        };
        let has = |d: &Vec<(&str, i64)>, k| d.contains(&(k, 1));
        let (plain, pipe, pp) = (
            defines(Schedule::Plain),
            defines(Schedule::Pipe),
            defines(Schedule::PingPong),
        );
        assert!(!has(&plain, "FS_SM90_PIPE") && !has(&plain, "FS_SM90_PINGPONG"));
        assert!(has(&pipe, "FS_SM90_PIPE") && !has(&pipe, "FS_SM90_PINGPONG"));
        assert!(has(&pp, "FS_SM90_PIPE") && has(&pp, "FS_SM90_PINGPONG"));
        assert_eq!(Schedule::from_env(false, Some(true)), Schedule::PingPong);
        assert_eq!(Schedule::from_env(true, Some(true)), Schedule::PingPong);
        assert_eq!(Schedule::from_env(true, Some(false)), Schedule::Pipe);
        assert_eq!(Schedule::from_env(true, None), Schedule::Pipe);
        assert_eq!(Schedule::from_env(false, Some(false)), Schedule::Plain);
        // unset: the default, ping-pong
        assert_eq!(Schedule::from_env(false, None), Schedule::PingPong);
    }
}
