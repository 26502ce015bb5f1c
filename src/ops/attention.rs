//! FlashAttention forward: argument checks, variant choice, launch of `cuda/flash_fwd.cu`.

use crate::error::{unsupported, value_err, Error, Result};
use crate::ops::attention_tma;
use crate::ops::flash_tiles::{flash_fwd_tile, FlashTile, HEAD_DIM_TILES, SHORT_SEQLEN_Q};
use crate::runtime::{runtime, KernelSpec, StreamChoice};
use crate::tensor::{common_cuda_device, expect_no_overlap, DType, TensorView};

pub const SOURCE: &str = include_str!("../../cuda/flash_fwd.cu");
pub const FAMILY: &str = "flash_fwd";
pub const ENTRY: &str = "flash_fwd_kernel";

/// The Hopper (sm_90a) wgmma forward: fp16/bf16, head dim 64 or 128, no softcap.
pub const SOURCE_SM90: &str = include_str!("../../cuda/flash_fwd_sm90.cu");
pub const FAMILY_SM90: &str = "flash_fwd_sm90";
pub const ENTRY_SM90: &str = "flash_fwd_sm90_kernel";
/// Query rows per CTA and threads of the sm_90 kernel (two warpgroups of 64 rows).
const SM90_BLOCK_M: i64 = 128;
const SM90_THREADS: u32 = 256;
/// Whether the wgmma path runs by default for a problem it covers (`tma`: the TMA kernel serves
/// it, see `sm90_tma`). Measured on the H100 (2026-11-23): at head dim 128 both sm_90a kernels
/// beat the mma.sync kernel (cp.async wgmma 1.27x, TMA ping-pong 1.85x at bf16 s4096;
/// benches/results/2026-11-23-h100-hopper-fwd.md and -hopper-tma/); at head dim 64 the cp.async
/// wgmma kernel does not (0.92-0.98x) but the TMA kernel does (396 / 348 TFLOP/s bf16 s4096
/// non-causal / causal vs the mma.sync kernel's 314 / 285 a lease earlier, SDPA FA2 steady
/// across both leases), so hd64 follows the TMA switch. Short queries (seqlen_q <= 64) stay on
/// the mma.sync kernel's 64-row tile (unmeasured on the 128-row wgmma tile).
/// Head dims the TMA kernel pads (`attention_tma::tile_head_dim`: 48 on the 64 tile, 80 / 96 /
/// 112 on the 128 one, 136-248 on the 256 one) and 256 itself (2.6x the mma.sync kernel on the
/// H200, `benches/results/2026-12-02-h200-attention-hd256/`) follow the TMA switch.
fn sm90_default(head_dim: i64, seqlen_q: i64, tma: bool) -> bool {
    // (64 and the padded dims: every head dim the TMA kernel has a tile for)
    seqlen_q > SHORT_SEQLEN_Q
        && (head_dim == 128 || (tma && attention_tma::tile_head_dim(head_dim).is_some()))
}

/// Mirrors `struct FlashFwdParams` in cuda/flash_fwd.cu field for field. Strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FlashFwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub q_batch_stride: i64,
    pub q_row_stride: i64,
    pub q_head_stride: i64,
    pub k_batch_stride: i64,
    pub k_row_stride: i64,
    pub k_head_stride: i64,
    pub v_batch_stride: i64,
    pub v_row_stride: i64,
    pub v_head_stride: i64,
    pub o_batch_stride: i64,
    pub o_row_stride: i64,
    pub o_head_stride: i64,
    pub batch: i32,
    pub nheads: i32,
    pub nheads_k: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub head_dim: i32,
    pub softmax_scale: f32,
    pub softcap: f32,
    pub window_left: i32,
    pub window_right: i32,
    /// Varlen builds only (`FS_VARLEN`): the dense kernels' struct ends before these, and the
    /// driver copies only the kernel's own parameter size.
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub total_q: i32,
    pub total_k: i32,
}

const _: () = assert!(std::mem::size_of::<FlashFwdParams>() == 200);

pub struct FlashFwdArgs<'a> {
    pub q: &'a TensorView,
    pub k: &'a TensorView,
    pub v: &'a TensorView,
    pub out: &'a TensorView,
    pub lse: Option<&'a TensorView>,
    pub softmax_scale: f32,
    pub window_left: i64,
    pub window_right: i64,
    pub softcap: f32,
}

/// What the checks resolve: sizes, the normalised window, and the variant to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Problem {
    pub batch: i64,
    pub seqlen_q: i64,
    pub seqlen_k: i64,
    pub nheads: i64,
    pub nheads_k: i64,
    pub head_dim: i64,
    pub window_left: i64,
    pub window_right: i64,
}

pub(crate) fn fits_i32(name: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| unsupported(format!("{name} = {v} exceeds 2^31 - 1")))
}

/// Every check of the forward; pure (no GPU), so it is unit-tested on the CPU.
pub fn check(a: &FlashFwdArgs) -> Result<Problem> {
    check_with(a, &[DType::F16, DType::BF16, DType::F32], None)
}

/// `check` for q / k / v of the dtypes `inputs` (one for all) and out of dtype `out_dtype`
/// (None: q's). The FP8 forward (`attention_fp8`) takes e4m3 inputs and a bf16 out.
pub(crate) fn check_with(
    a: &FlashFwdArgs,
    inputs: &[DType],
    out_dtype: Option<DType>,
) -> Result<Problem> {
    let qs = a.q.expect_rank("q", "batch, seqlen_q, nheads, headdim")?;
    let ks = a.k.expect_rank("k", "batch, seqlen_k, nheads_k, headdim")?;
    a.v.expect_rank("v", "batch, seqlen_k, nheads_k, headdim")?;
    let (batch, seqlen_q, nheads, head_dim) = (qs[0], qs[1], qs[2], qs[3]);
    let (seqlen_k, nheads_k) = (ks[1], ks[2]);
    a.q.expect_dtype("q", inputs)?;
    a.k.expect_same_dtype("k", a.q, "q")?;
    a.v.expect_same_dtype("v", a.q, "q")?;
    match out_dtype {
        None => a.out.expect_same_dtype("out", a.q, "q")?,
        Some(dt) => a.out.expect_dtype("out", &[dt])?,
    }
    if ks[0] != batch || ks[3] != head_dim {
        return Err(value_err(format!(
            "k has shape {:?}, expected (batch={batch}, seqlen_k, nheads_k, headdim={head_dim}) to match q {:?}",
            a.k.shape, a.q.shape
        )));
    }
    a.v.expect_shape("v", &a.k.shape)?;
    a.out.expect_shape("out", &a.q.shape)?;
    if head_dim % 8 != 0 || head_dim > 256 || head_dim == 0 {
        return Err(unsupported(format!(
            "headdim = {head_dim} is not supported: it must be a multiple of 8 between 8 and 256"
        )));
    }
    if nheads_k == 0 || nheads % nheads_k != 0 {
        return Err(value_err(format!(
            "nheads = {nheads} must be a multiple of nheads_k = {nheads_k} (GQA/MQA)"
        )));
    }
    for (name, t) in [("q", a.q), ("k", a.k), ("v", a.v), ("out", a.out)] {
        t.expect_unit_stride(name, 3, "headdim")?;
    }
    a.out.expect_writable("out")?;
    expect_no_overlap(
        &[("out", Some(a.out))],
        &[("q", Some(a.q)), ("k", Some(a.k)), ("v", Some(a.v))],
    )?;
    if let Some(lse) = a.lse {
        lse.expect_dtype("lse", &[DType::F32])?;
        lse.expect_shape("lse", &[batch, nheads, seqlen_q])?;
        lse.expect_contiguous("lse")?;
        lse.expect_writable("lse")?;
    }
    if seqlen_k == 0 && seqlen_q > 0 && batch > 0 {
        return Err(value_err("seqlen_k must be >= 1 (k and v are empty)"));
    }
    for (name, w) in [
        ("window_size[0]", a.window_left),
        ("window_size[1]", a.window_right),
    ] {
        if w < -1 {
            return Err(value_err(format!(
                "{name} = {w}: must be >= 0, or -1 for unbounded"
            )));
        }
    }
    if a.softcap.is_nan() || a.softcap < 0.0 || !a.softcap.is_finite() {
        return Err(value_err(format!(
            "softcap = {} must be finite and >= 0",
            a.softcap
        )));
    }
    if !a.softmax_scale.is_finite() {
        return Err(value_err(format!(
            "softmax_scale = {} must be finite",
            a.softmax_scale
        )));
    }
    if a.softmax_scale <= 0.0 {
        return Err(unsupported(format!(
            "softmax_scale = {} is not supported: it must be > 0",
            a.softmax_scale
        )));
    }
    if seqlen_q + seqlen_k >= (1i64 << 31) {
        return Err(unsupported("seqlen_q + seqlen_k must be < 2^31"));
    }
    // The kernel moves rows in 16-byte vectors: every row start must be 16-byte aligned.
    for (name, t) in [("q", a.q), ("k", a.k), ("v", a.v), ("out", a.out)] {
        let es = t.dtype.size() as i64;
        let misaligned = t.ptr % 16 != 0
            || t.strides[..3]
                .iter()
                .zip(&t.shape[..3])
                .any(|(&s, &n)| n > 1 && (s * es) % 16 != 0);
        if misaligned {
            return Err(value_err(format!(
                "{name} must have 16-byte aligned rows (data pointer and batch/seqlen/head strides \
                 multiples of 16 bytes), got pointer {:#x} and strides {:?}; call .contiguous() first",
                t.ptr, t.strides
            )));
        }
    }
    if batch > 65535 {
        return Err(unsupported(format!(
            "batch = {batch} > 65535 is not supported"
        )));
    }
    // Drop bounds that exclude nothing, so the mask-free variant runs where it can. With
    // bottom-right alignment, query i sees keys [i + sk - sq - left, i + sk - sq + right]: the
    // left bound excludes no key of any row iff left >= sk - 1, the right one iff
    // right >= sq - 1 (causal decode with seqlen_q = 1 needs no mask). Note the right bound is
    // about seqlen_q: with seqlen_q > seqlen_k a right window >= seqlen_k can still hide keys.
    let left = if a.window_left >= seqlen_k - 1 {
        -1
    } else {
        a.window_left
    };
    let right = if a.window_right >= seqlen_q - 1 {
        -1
    } else {
        a.window_right
    };
    Ok(Problem {
        batch,
        seqlen_q,
        seqlen_k,
        nheads,
        nheads_k,
        head_dim,
        window_left: left,
        window_right: right,
    })
}

/// Smallest head-dim tile that holds `head_dim`.
pub fn head_dim_tile(head_dim: i64) -> i64 {
    HEAD_DIM_TILES
        .iter()
        .copied()
        .find(|&t| t >= head_dim)
        .unwrap_or(256)
}

/// The variant for a problem, with its dynamic shared memory in bytes. `varlen` builds the
/// packed-sequence kernel (`FS_VARLEN`; `seqlen_q` is then the longest sequence's).
pub fn spec(
    head_dim: i64,
    dtype: DType,
    has_mask: bool,
    softcap: bool,
    arch_num: i64,
    seqlen_q: i64,
    varlen: bool,
) -> Result<(KernelSpec, FlashTile, u32)> {
    let tile_dim = head_dim_tile(head_dim);
    let code = dtype.kernel_code()?;
    let t = flash_fwd_tile(tile_dim as u32, code as u32, arch_num as u32, seqlen_q);
    let smem = t.smem_bytes(tile_dim as u32, dtype.size() as u32);
    let mut defines = vec![
        ("FS_HEAD_DIM", tile_dim),
        ("FS_DTYPE", code),
        ("FS_BLOCK_M", t.block_m as i64),
        ("FS_BLOCK_N", t.block_n as i64),
        ("FS_NWARPS", t.warps as i64),
        ("FS_KV_STAGES", t.stages as i64),
        ("FS_MIN_BLOCKS", t.min_blocks as i64),
        ("FS_QK_UNROLL", t.qk_unroll as i64),
        ("FS_HAS_MASK", has_mask as i64),
        ("FS_HAS_SOFTCAP", softcap as i64),
        ("FS_PAD_HEADDIM", (tile_dim != head_dim) as i64),
        ("FS_ARCH", arch_num),
    ];
    if varlen {
        // only then: the dense variants keep their defines, cache keys and SASS
        defines.push(("FS_VARLEN", 1));
    }
    Ok((
        KernelSpec {
            family: FAMILY,
            source: SOURCE,
            entry: ENTRY,
            defines,
        },
        t,
        smem,
    ))
}

/// Whether the wgmma path is wanted for a problem it covers: FLASHSCAN_SM90_WGMMA=1 (every
/// covered problem) or =0 (none) overrides `sm90_default`. The variable is read once.
fn sm90_wanted(head_dim: i64, seqlen_q: i64) -> bool {
    static FORCED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let forced = *FORCED.get_or_init(|| match std::env::var("FLASHSCAN_SM90_WGMMA") {
        Ok(v) if v == "1" => Some(true),
        Ok(v) if v == "0" => Some(false),
        _ => None,
    });
    forced.unwrap_or_else(|| sm90_default(head_dim, seqlen_q, sm90_tma()))
}

/// FLASHSCAN_SM90_PIPE=1 selects the pipelined schedule (softmax of tile i overlapping P V of
/// tile i-1, `FS_SM90_PIPE`) of the TMA kernel, or of the cp.async wgmma kernel with
/// FLASHSCAN_SM90_TMA=0 (correct on the H100; no faster there: ptxas hoists the wait). Read once.
fn sm90_pipe() -> bool {
    static PIPE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PIPE.get_or_init(|| std::env::var("FLASHSCAN_SM90_PIPE").is_ok_and(|v| v == "1"))
}

/// The warp-specialised TMA kernel (`cuda/flash_fwd_sm90_tma.cu`, `attention_tma`) runs wherever
/// the wgmma kernel would: the default since it measured 595-661 TFLOP/s at hd128 on the H100
/// (cuDNN 525-634 in the same run; the cp.async wgmma kernel 380-445) and passed its GPU tests
/// in every schedule. FLASHSCAN_SM90_TMA=0 keeps the cp.async wgmma kernel. Read once.
fn sm90_tma() -> bool {
    static TMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TMA.get_or_init(|| !std::env::var("FLASHSCAN_SM90_TMA").is_ok_and(|v| v == "0"))
}

/// The TMA kernel's persistent form (`attention_tma::persistent_spec`) and how it takes its
/// tiles: by default a static stride for unmasked problems and the tile queue for masked ones
/// where it measured faster (`attention_tma::queue_wanted`); FLASHSCAN_SM90_PERSIST=0 keeps one
/// CTA a tile, =queue takes the queue for every problem, =stride keeps masked problems on one
/// CTA a tile (the order of before). Read on every call, so that an A/B runs in one process
/// (on the H200 of 2026-12-02, one configuration measured up to ~10% apart in two processes).
/// None: one CTA a tile.
pub(crate) fn sm90_persist(p: &Problem, has_mask: bool) -> Option<attention_tma::TileOrder> {
    use attention_tma::TileOrder::{Queue, Stride};
    let v = std::env::var("FLASHSCAN_SM90_PERSIST").ok();
    match (v.as_deref(), has_mask) {
        (Some("0"), _) | (Some("stride"), true) => None,
        (Some("queue"), _) => Some(Queue),
        (_, true) => attention_tma::queue_wanted(p.seqlen_k, p.window_left).then_some(Queue),
        _ => Some(Stride),
    }
}

/// FLASHSCAN_SM90_PERSIST_CTAS=N (testing only): the persistent grid's CTAs instead of one an
/// SM, so that small test problems walk many tiles a CTA. Read once.
fn sm90_persist_ctas(sm_count: i64) -> i64 {
    static CTAS: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
    let o = *CTAS.get_or_init(|| {
        std::env::var("FLASHSCAN_SM90_PERSIST_CTAS")
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|n| *n > 0)
    });
    o.unwrap_or(sm_count)
}

/// The TMA kernel's grid: the one-tile `grid` (query blocks, heads, batch), or for a persistent
/// `order` one CTA an SM (`sm90_persist_ctas`), no more than there are tiles.
pub(crate) fn tma_grid(
    grid: (u32, u32, u32),
    order: Option<attention_tma::TileOrder>,
    sm_count: i64,
) -> (u32, u32, u32) {
    if order.is_none() {
        return grid;
    }
    let tiles = grid.0 as i64 * grid.1 as i64 * grid.2 as i64;
    (
        attention_tma::persistent_grid(tiles, sm90_persist_ctas(sm_count)),
        1,
        1,
    )
}

/// FLASHSCAN_SM90_QUEUE_SECTION=N (testing and tuning): (batch, head) pairs a section of the
/// tile queue's order instead of `attention_tma::section_heads`, so that small test problems
/// span several sections. Read on every queue launch (a sweep runs in one process).
fn sm90_queue_section() -> Option<i32> {
    std::env::var("FLASHSCAN_SM90_QUEUE_SECTION")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|n| *n > 0)
}

/// Fills the tile queue's fields of `tp` for a launch on `s`: its section (`section` pairs, or
/// FLASHSCAN_SM90_QUEUE_SECTION) and its counters (next tile, CTAs done): the stream's pair, which
/// every queue launch leaves zeroed; else (under capture, on the per-thread default stream, or
/// with FLASHSCAN_SM90_QUEUE_SCRATCH=1) 8 bytes of scratch zeroed before the launch, returned to be
/// freed once the launch is queued.
pub(crate) fn queue_counters(
    dev: &crate::runtime::DeviceCtx,
    s: crate::runtime::driver::Stream,
    tp: &mut attention_tma::FlashFwdTmaParams,
    section: i32,
) -> Result<Option<crate::runtime::scratch::StreamScratch>> {
    tp.section_heads = sm90_queue_section().unwrap_or(section);
    let shared = if sm90_queue_scratch() {
        None
    } else {
        dev.stream_counters(s)?
    };
    match shared {
        Some(counters) => {
            tp.tile_counter = counters;
            Ok(None)
        }
        None => {
            let mut sc = dev.scratch(s)?;
            let counters = sc.alloc(8)?;
            // SAFETY: a live 8-byte scratch allocation ordered on s.
            unsafe { crate::runtime::driver::zero_async(counters, 8, s)? };
            tp.tile_counter = counters;
            Ok(Some(sc))
        }
    }
}

/// FLASHSCAN_SM90_QUEUE_SCRATCH=1 (testing): the queue's counters from zeroed scratch on every
/// call (the graph-capture path) instead of the stream's pair. Read on every queue launch.
fn sm90_queue_scratch() -> bool {
    std::env::var("FLASHSCAN_SM90_QUEUE_SCRATCH").is_ok_and(|v| v == "1")
}

/// The TMA kernel's schedule: FLASHSCAN_SM90_PINGPONG=1 ping-pong, =0 not; unset: ping-pong
/// unless FLASHSCAN_SM90_PIPE=1 asks for the pipelined one (see `Schedule::from_env`).
fn sm90_pingpong() -> Option<bool> {
    static PP: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *PP.get_or_init(|| match std::env::var("FLASHSCAN_SM90_PINGPONG") {
        Ok(v) if v == "1" => Some(true),
        Ok(v) if v == "0" => Some(false),
        _ => None,
    })
}

/// What the sm_90a kernels (cp.async wgmma and TMA) cover — arch sm_90, fp16/bf16, head dim
/// exactly 64 or 128, no softcap — as the dtype's kernel code; None for everything else.
pub(crate) fn sm90_dtype_code(
    head_dim: i64,
    dtype: DType,
    softcap: bool,
    arch_num: i64,
) -> Option<i64> {
    if arch_num != 90 || softcap || !(head_dim == 64 || head_dim == 128) {
        return None;
    }
    match dtype {
        DType::F16 | DType::BF16 => dtype.kernel_code().ok(),
        _ => None,
    }
}

/// The sm_90a wgmma variant and its dynamic shared memory, when it covers the problem: arch
/// sm_90, fp16/bf16, head dim exactly 64 or 128, no softcap. Everything else takes `spec`.
pub fn sm90_spec(
    head_dim: i64,
    dtype: DType,
    has_mask: bool,
    softcap: bool,
    arch_num: i64,
    pipe: bool,
) -> Option<(KernelSpec, u32)> {
    let code = sm90_dtype_code(head_dim, dtype, softcap, arch_num)?;
    // Q, then two stages of K and V: five 128-row tiles, plus 1 KB to align the base to 1024.
    let smem = 5 * 128 * head_dim as u32 * 2 + 1024;
    let mut defines = vec![
        ("FS_HEAD_DIM", head_dim),
        ("FS_DTYPE", code),
        ("FS_HAS_MASK", has_mask as i64),
        ("FS_ARCH", arch_num),
    ];
    if pipe {
        defines.push(("FS_SM90_PIPE", 1));
    }
    Some((
        KernelSpec {
            family: FAMILY_SM90,
            source: SOURCE_SM90,
            entry: ENTRY_SM90,
            defines,
        },
        smem,
    ))
}

/// Every variant the forward can emit for one arch (for tests and precompile).
pub fn all_specs(arch_num: i64) -> Vec<KernelSpec> {
    specs_of(arch_num, false)
}

/// Every dense (`varlen` false) or packed-sequence variant of the forward for one arch.
pub fn specs_of(arch_num: i64, varlen: bool) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    for &tile in HEAD_DIM_TILES {
        for padded in [false, true] {
            // The smallest real head dim needing this tile with or without padding.
            let hd = if padded { tile - 8 } else { tile };
            for dtype in [DType::F16, DType::BF16, DType::F32] {
                // Long queries, and the short-query tile where it differs.
                for seqlen_q in [SHORT_SEQLEN_Q + 1, 1] {
                    for mask in [false, true] {
                        for cap in [false, true] {
                            if let Ok((s, _, _)) =
                                spec(hd, dtype, mask, cap, arch_num, seqlen_q, varlen)
                            {
                                if !out.contains(&s) {
                                    out.push(s);
                                }
                            }
                            // the sm_90a wgmma kernel serves dense problems only
                            for pipe in [false, true].into_iter().filter(|_| !varlen) {
                                if let Some((s, _)) =
                                    sm90_spec(hd, dtype, mask, cap, arch_num, pipe)
                                {
                                    if !out.contains(&s) {
                                        out.push(s);
                                    }
                                }
                            }
                            let schedules = attention_tma::Schedule::ALL;
                            for sch in schedules {
                                for bm in [128, 192] {
                                    use attention_tma::TileOrder;
                                    let persistent = |order| {
                                        attention_tma::persistent_spec(
                                            hd, dtype, mask, cap, arch_num, sch, bm, order,
                                        )
                                    };
                                    // (packed sequences: the one-tile form of the defaults)
                                    let made = if varlen {
                                        [
                                            attention_tma::varlen_spec(
                                                hd, dtype, mask, cap, arch_num, sch, bm,
                                            ),
                                            None,
                                            None,
                                        ]
                                    } else {
                                        [
                                            attention_tma::spec(
                                                hd, dtype, mask, cap, arch_num, sch, bm,
                                            ),
                                            persistent(TileOrder::Stride),
                                            persistent(TileOrder::Queue),
                                        ]
                                    };
                                    for (s, _) in made.into_iter().flatten() {
                                        if !out.contains(&s) {
                                            out.push(s);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Checks, picks the variant, launches. Returns without work for empty problems.
pub fn forward(a: &FlashFwdArgs, stream: StreamChoice) -> Result<()> {
    let p = check(a)?;
    if p.batch == 0 || p.seqlen_q == 0 || p.nheads == 0 {
        return Ok(());
    }
    let device = common_cuda_device(&[
        ("q", Some(a.q)),
        ("k", Some(a.k)),
        ("v", Some(a.v)),
        ("out", Some(a.out)),
        ("lse", a.lse),
    ])?;
    launch(
        &p,
        dense_params(a),
        a.q.dtype,
        a.softmax_scale,
        a.softcap,
        false,
        device,
        stream,
    )
}

/// The pointers and element strides of a dense call's tensors (sizes and options left 0: see
/// `fill_sizes`).
pub(crate) fn dense_params(a: &FlashFwdArgs) -> FlashFwdParams {
    FlashFwdParams {
        q: a.q.ptr,
        k: a.k.ptr,
        v: a.v.ptr,
        o: a.out.ptr,
        lse: a.lse.map_or(0, |l| l.ptr),
        q_batch_stride: a.q.strides[0],
        q_row_stride: a.q.strides[1],
        q_head_stride: a.q.strides[2],
        k_batch_stride: a.k.strides[0],
        k_row_stride: a.k.strides[1],
        k_head_stride: a.k.strides[2],
        v_batch_stride: a.v.strides[0],
        v_row_stride: a.v.strides[1],
        v_head_stride: a.v.strides[2],
        o_batch_stride: a.out.strides[0],
        o_row_stride: a.out.strides[1],
        o_head_stride: a.out.strides[2],
        ..Default::default()
    }
}

/// Fills in the sizes and options of a checked problem `p` (each size must fit i32).
pub(crate) fn fill_sizes(
    params: &mut FlashFwdParams,
    p: &Problem,
    softmax_scale: f32,
    softcap: f32,
) -> Result<()> {
    params.batch = fits_i32("batch", p.batch)?;
    params.nheads = fits_i32("nheads", p.nheads)?;
    params.nheads_k = fits_i32("nheads_k", p.nheads_k)?;
    params.seqlen_q = fits_i32("seqlen_q", p.seqlen_q)?;
    params.seqlen_k = fits_i32("seqlen_k", p.seqlen_k)?;
    params.head_dim = fits_i32("headdim", p.head_dim)?;
    params.softmax_scale = softmax_scale;
    params.softcap = softcap;
    params.window_left = p.window_left as i32;
    params.window_right = p.window_right as i32;
    Ok(())
}

/// Picks the variant of a checked, non-empty problem `p` and launches it with `params` (every
/// tensor pointer and stride filled in; varlen: cu_seqlens and totals too, batch strides 0,
/// `p.seqlen_q` / `p.seqlen_k` the longest sequence's), filling in sizes and options.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    p: &Problem,
    mut params: FlashFwdParams,
    dtype: DType,
    softmax_scale: f32,
    softcap: f32,
    varlen: bool,
    device: i32,
    stream: StreamChoice,
) -> Result<()> {
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    // The device's context stays current for the whole call (loads, scratch, launches, frees)
    // and the caller's is current again when this returns.
    let _bound = dev.bind()?;
    let arch_num = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let has_mask = p.window_left >= 0 || p.window_right >= 0;
    // (varlen: the TMA kernel's packed-sequence form only; seqlen_q is max_seqlen_q there)
    let wanted = sm90_wanted(p.head_dim, p.seqlen_q);
    let wgmma = if wanted && !varlen {
        sm90_spec(
            p.head_dim,
            dtype,
            has_mask,
            softcap > 0.0,
            arch_num,
            sm90_pipe(),
        )
    } else {
        None
    };
    fill_sizes(&mut params, p, softmax_scale, softcap)?;
    let grid_of = |block_m: i64| -> Result<(u32, u32, u32)> {
        Ok((
            u32::try_from((p.seqlen_q + block_m - 1) / block_m)
                .map_err(|_| unsupported("seqlen_q too large"))?,
            p.nheads as u32,
            p.batch as u32,
        ))
    };
    // The warp-specialised TMA kernel, where wanted and the driver encodes every tensor map;
    // otherwise (a map refused) the cp.async wgmma kernel below (exact head dims) or flash_fwd.
    // Its tile's head dim: the problem's, or the next of 64 / 128 (`tile_head_dim`: padded).
    let tma_hd = if wanted && sm90_tma() {
        attention_tma::tile_head_dim(p.head_dim)
            .filter(|&hd| attention_tma::dtype_code(hd, dtype, arch_num).is_some())
    } else {
        None
    };
    if let Some(hd) = tma_hd {
        let block_m = attention_tma::block_m(hd);
        let schedule = attention_tma::Schedule::from_env(sm90_pipe(), sm90_pingpong());
        let cap = softcap > 0.0;
        // (packed sequences: one CTA a tile)
        let order = sm90_persist(p, has_mask).filter(|_| !varlen);
        let persistent_tma = order.and_then(|o| {
            attention_tma::persistent_spec(hd, dtype, has_mask, cap, arch_num, schedule, block_m, o)
        });
        // (None where the persistent form does not exist: the one-tile grid)
        let order = order.filter(|_| persistent_tma.is_some());
        let tma = persistent_tma.or_else(|| {
            if varlen {
                attention_tma::varlen_spec(hd, dtype, has_mask, cap, arch_num, schedule, block_m)
            } else {
                attention_tma::spec(hd, dtype, has_mask, cap, arch_num, schedule, block_m)
            }
        });
        let tp = attention_tma::params(&params, dtype, block_m, hd, varlen);
        if let (Some((spec, smem)), Ok(mut tp)) = (tma, tp) {
            let kernel = dev.kernel(&spec)?;
            let s = dev.stream(stream)?;
            let threads = attention_tma::threads(block_m);
            let grid = grid_of(block_m)?;
            let grid = tma_grid(grid, order, dev.props.sm_count as i64);
            let scratch = if order == Some(attention_tma::TileOrder::Queue) {
                let section = attention_tma::section_heads(p.seqlen_k, hd, p.nheads, p.nheads_k);
                queue_counters(dev, s, &mut tp, section)?
            } else {
                None
            };
            // SAFETY: tp mirrors the kernel's struct; its maps address exactly the q / k / v
            // tensors checked by the caller, and every pointer in params is on this device; the
            // queue's counters are zero (the stream's pair, or scratch freed after the launch).
            let launched = unsafe { dev.launch(&kernel, grid, (threads, 1, 1), smem, s, &tp) };
            if let Some(sc) = scratch {
                sc.free()?;
            }
            launched?;
            return dev.finish(stream);
        }
    }
    let (spec, block_m, threads, smem) = match wgmma {
        Some((s, smem)) => (s, SM90_BLOCK_M, SM90_THREADS, smem),
        None => {
            let (s, tile, smem) = spec(
                p.head_dim,
                dtype,
                has_mask,
                softcap > 0.0,
                arch_num,
                p.seqlen_q,
                varlen,
            )?;
            (s, tile.block_m as i64, tile.warps * 32, smem)
        }
    };
    let kernel = dev.kernel(&spec)?;
    let grid = grid_of(block_m)?;
    let s = dev.stream(stream)?;
    // SAFETY: params mirrors the kernel's struct; every pointer was checked by the caller to
    // be a CUDA tensor on this device with the shapes and strides the kernel indexes by.
    unsafe { dev.launch(&kernel, grid, (threads, 1, 1), smem, s, &params)? };
    dev.finish(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DeviceKind;

    fn view(shape: &[i64], ptr: u64) -> TensorView {
        TensorView {
            ptr,
            shape: shape.to_vec(),
            strides: crate::dlpack::compact_strides(shape),
            dtype: DType::BF16,
            device: DeviceKind::Cuda,
            device_id: 0,
            readonly: false,
        }
    }

    fn problem(sq: i64, sk: i64, left: i64, right: i64) -> Problem {
        let q = view(&[1, sq, 2, 64], 0x10_0000);
        let k = view(&[1, sk, 2, 64], 0x20_0000);
        let v = view(&[1, sk, 2, 64], 0x30_0000);
        let o = view(&[1, sq, 2, 64], 0x40_0000);
        let a = FlashFwdArgs {
            q: &q,
            k: &k,
            v: &v,
            out: &o,
            lse: None,
            softmax_scale: 0.125,
            window_left: left,
            window_right: right,
            softcap: 0.0,
        };
        check(&a).expect("valid")
    }

    #[test]
    fn wgmma_variant_covers_only_sm90_16bit_hd64_hd128_without_softcap() {
        assert!(sm90_spec(128, DType::BF16, false, false, 90, false).is_some());
        assert!(sm90_spec(64, DType::F16, true, false, 90, false).is_some());
        assert!(sm90_spec(128, DType::BF16, false, false, 80, false).is_none());
        assert!(sm90_spec(128, DType::BF16, false, false, 100, false).is_none());
        assert!(sm90_spec(128, DType::F32, false, false, 90, false).is_none());
        assert!(sm90_spec(96, DType::BF16, false, false, 90, false).is_none());
        assert!(sm90_spec(120, DType::BF16, false, false, 90, false).is_none());
        assert!(sm90_spec(128, DType::BF16, false, true, 90, false).is_none());
        // Q + 2 x (K + V) tiles of 128 x 128 bf16, plus the alignment slack: fits 227 KB
        let (_, smem) = sm90_spec(128, DType::BF16, true, false, 90, false).expect("covered");
        assert_eq!(smem, 164_864);
        assert!(smem <= 232_448);
    }

    #[test]
    fn wgmma_default_is_hd128_and_tma_hd64_with_long_queries() {
        for tma in [true, false] {
            assert!(sm90_default(128, 4096, tma));
            assert!(sm90_default(128, SHORT_SEQLEN_Q + 1, tma));
            assert!(!sm90_default(128, SHORT_SEQLEN_Q, tma));
            assert!(!sm90_default(64, SHORT_SEQLEN_Q, tma));
            assert!(!sm90_default(100, 4096, tma));
            assert!(sm90_default(256, 4096, tma) == tma);
            assert!(sm90_default(192, 4096, tma) == tma);
        }
        // hd64: only the TMA kernel beats the mma.sync kernel there; padded head dims (96 on
        // the 128 tile) run on the TMA kernel only
        assert!(sm90_default(64, 4096, true));
        assert!(!sm90_default(64, 4096, false));
        assert!(sm90_default(96, 4096, true));
        assert!(!sm90_default(96, 4096, false));
        assert!(!sm90_default(96, SHORT_SEQLEN_Q, true));
    }

    #[test]
    fn windows_that_hide_nothing_are_dropped_and_others_kept() {
        // causal decode: one query sees every key
        let p = problem(1, 100, -1, 0);
        assert_eq!((p.window_left, p.window_right), (-1, -1));
        // causal with seqlen_q > 1 keeps its bound
        assert_eq!(problem(60, 60, -1, 0).window_right, 0);
        // seqlen_q > seqlen_k: a right window >= seqlen_k still hides keys from early rows
        assert_eq!(problem(63, 7, 48, 16).window_right, 16);
        assert_eq!(problem(63, 7, 48, 16).window_left, -1);
        assert_eq!(problem(63, 7, 5, 62).window_right, -1);
        assert_eq!(problem(63, 7, 5, 62).window_left, 5);
    }
}
