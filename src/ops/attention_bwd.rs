//! FlashAttention backward: argument checks, launch plan, the three launches of
//! `cuda/flash_bwd.cu` (preprocess: D = rowsum(dO * O), lse in log2, zeroed dq accumulator;
//! main: dK, dV per kv block and fp32 dq partials; convert: dq = scale * accumulator, cast).
//! On sm_90a the main launch runs `cuda/flash_bwd_sm90.cu` (wgmma) wherever it covers the
//! problem (`main_choice`); FLASHSCAN_SM90_BWD=0 keeps it on the mma.sync kernel.

use crate::error::{unsupported, value_err, Error, Result};
use crate::ops::attention::{self, head_dim_tile, FlashFwdArgs, Problem};
use crate::ops::attention_tma;
use crate::ops::flash_tiles::HEAD_DIM_TILES;
use crate::runtime::driver::encode_tensor_map_4d;
use crate::runtime::{runtime, KernelSpec, StreamChoice};
use crate::tensor::{common_cuda_device, expect_no_overlap, DType, TensorView};

pub const SOURCE: &str = include_str!("../../cuda/flash_bwd.cu");
pub const FAMILY: &str = "flash_bwd";
pub const ENTRY_PRE: &str = "flash_bwd_preprocess";
pub const ENTRY_MAIN: &str = "flash_bwd_kernel";
pub const ENTRY_CONVERT: &str = "flash_bwd_dq_convert";
pub const SOURCE_SM90: &str = include_str!("../../cuda/flash_bwd_sm90.cu");
pub const FAMILY_SM90: &str = "flash_bwd_sm90";
pub const ENTRY_SM90: &str = "flash_bwd_sm90_kernel";

/// Rows per block of the preprocess and convert passes (256 threads, 8 per row).
const AUX_ROWS: i64 = 32;
const AUX_THREADS: u32 = 256;

/// Mirrors `struct FlashBwdParams` in cuda/flash_bwd.cu field for field (344 bytes dense,
/// 368 varlen).
/// Strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FlashBwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub dout: u64,
    pub lse: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    pub dq_accum: u64,
    pub dpsum: u64,
    pub lse_log2: u64,
    pub strides: [i64; 24],
    pub batch: i32,
    pub nheads: i32,
    pub nheads_k: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub head_dim: i32,
    pub seqlen_q_pad: i32,
    pub nsplit: i32,
    pub deterministic: i32,
    pub softmax_scale: f32,
    pub softcap: f32,
    pub window_left: i32,
    pub window_right: i32,
    /// The wgmma backward's deterministic walk: this launch's first kv block (`launch`).
    pub kv_block0: i32,
    /// Varlen builds only (`FS_VARLEN`): the dense kernels' struct ends before these (344
    /// bytes), and the driver copies only the kernel's own parameter size.
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub total_q: i32,
    pub total_k: i32,
}

const _: () = assert!(std::mem::size_of::<FlashBwdParams>() == 368);

pub struct FlashBwdArgs<'a> {
    pub dout: &'a TensorView,
    pub q: &'a TensorView,
    pub k: &'a TensorView,
    pub v: &'a TensorView,
    /// The forward's output.
    pub out: &'a TensorView,
    /// (batch, nheads, seqlen_q) f32 as the forward writes it (natural-log LSE of the scaled,
    /// softcapped scores; -inf for rows that see no key).
    pub lse: &'a TensorView,
    pub dq: &'a TensorView,
    pub dk: &'a TensorView,
    pub dv: &'a TensorView,
    pub softmax_scale: f32,
    pub window_left: i64,
    pub window_right: i64,
    pub softcap: f32,
    pub deterministic: bool,
}

/// Tile of the main kernel: `FS_BLOCK_M` queries per step, `FS_BLOCK_N` keys per CTA (16 or 32
/// per warp: `FS_BLOCK_N` = 16 * warps or 32 * warps), `FS_STAGES` Q/dO buffers, `FS_DSPLIT`
/// head-dim slices (CTAs) for dK / dV / dQ, `FS_MIN_BLOCKS` CTAs per SM (launch bounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BwdTile {
    pub block_m: u32,
    pub block_n: u32,
    pub warps: u32,
    pub stages: u32,
    pub dsplit: u32,
    pub min_blocks: u32,
}

const fn t(block_m: u32, block_n: u32, stages: u32, dsplit: u32) -> BwdTile {
    BwdTile {
        block_m,
        block_n,
        warps: block_n / 16,
        stages,
        dsplit,
        min_blocks: 1,
    }
}

/// A tile whose warps own 32 keys each (`block_n` = 32 * `warps`).
const fn t32(block_m: u32, block_n: u32, stages: u32, min_blocks: u32) -> BwdTile {
    BwdTile {
        block_m,
        block_n,
        warps: block_n / 32,
        stages,
        dsplit: 1,
        min_blocks,
    }
}

impl BwdTile {
    /// Dynamic shared memory: K, V, `stages` x (Q, dO), dS^T, `stages` x (lse, D) rows.
    pub fn smem_bytes(&self, head_dim_tile: u32, elem_bytes: u32) -> u32 {
        let row = head_dim_tile * elem_bytes + 16;
        let srow = self.block_m * elem_bytes + 16;
        (2 * self.block_n + 2 * self.stages * self.block_m) * row
            + self.block_n * srow
            + self.stages * 2 * self.block_m * 4
    }
}

/// The tile per head-dim tile, dtype code (0 fp16, 1 bf16, 2 fp32) and arch (cc * 10).
/// sm_90 rows measured on the H100 (2026-11-23: 64 x 128, 8 warps, beat 64 x 64 with two CTAs
/// per SM at hd128; at hd64 32 x 128 with 4 warps of 32 keys, one stage, two CTAs per SM, beat
/// 64 x 128 / 8 warps by 1.2-1.4x in the backward: half the shared-memory reads per mma in the
/// dK / dV product and fewer in S / dP); the others are shared-memory-checked only.
pub fn flash_bwd_tile(head_dim_tile: u32, dtype_code: u32, arch: u32) -> BwdTile {
    let idx = match head_dim_tile {
        0..=32 => 0,
        33..=64 => 1,
        65..=96 => 2,
        97..=128 => 3,
        129..=192 => 4,
        _ => 5,
    };
    let hopper = matches!(arch, 90 | 100 | 101 | 103);
    let a100 = matches!(arch, 80 | 87);
    if dtype_code == 2 {
        // 3xTF32: fp32 tiles are twice the bytes; the head dim is split so that the dK / dV
        // accumulators stay at <= 64 columns per CTA.
        if !hopper && !a100 {
            return [
                t(32, 64, 1, 1),
                t(32, 64, 1, 1),
                t(32, 32, 1, 2),
                t(32, 32, 1, 2),
                t(16, 16, 1, 4),
                t(16, 16, 1, 4),
            ][idx];
        }
        if a100 && idx == 5 {
            return t(32, 32, 1, 4);
        }
        return [
            t(64, 64, 2, 1),
            t(64, 64, 2, 1),
            t(64, 64, 1, 2),
            t(64, 64, 1, 2),
            t(32, 64, 1, 4),
            t(32, 64, 1, 4),
        ][idx];
    }
    if hopper {
        [
            t(64, 128, 2, 1),
            t32(32, 128, 1, 2),
            t(64, 128, 2, 1),
            t(64, 128, 2, 1),
            t(64, 128, 1, 2),
            t(64, 128, 1, 2),
        ][idx]
    } else if a100 {
        [
            t(64, 128, 2, 1),
            t(64, 128, 2, 1),
            t(64, 128, 2, 1),
            t(64, 128, 2, 1),
            t(64, 64, 1, 2),
            t(64, 64, 1, 2),
        ][idx]
    } else {
        [
            t(64, 128, 2, 1),
            t(64, 128, 2, 1),
            t(64, 64, 1, 1),
            t(64, 64, 1, 1),
            t(32, 32, 1, 2),
            t(32, 32, 1, 2),
        ][idx]
    }
}

/// The forward's validation with the backward's view of `out` and `lse` (inputs here, so they
/// need not be writable).
fn forward_problem(a: &FlashBwdArgs) -> Result<Problem> {
    let mut out = a.out.clone();
    out.readonly = false;
    let mut lse = a.lse.clone();
    lse.readonly = false;
    attention::check(&FlashFwdArgs {
        q: a.q,
        k: a.k,
        v: a.v,
        out: &out,
        lse: Some(&lse),
        softmax_scale: a.softmax_scale,
        window_left: a.window_left,
        window_right: a.window_right,
        softcap: a.softcap,
    })
}

/// Every row start 16-byte aligned (the kernels move rows in 16-byte vectors).
pub(crate) fn expect_aligned_rows(name: &str, t: &TensorView) -> Result<()> {
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
    Ok(())
}

/// Every check of the backward; pure (no GPU), so it is unit-tested on the CPU.
pub fn check(a: &FlashBwdArgs) -> Result<Problem> {
    let p = forward_problem(a)?;
    a.dout
        .expect_rank("dout", "batch, seqlen_q, nheads, headdim")?;
    a.dq.expect_rank("dq", "batch, seqlen_q, nheads, headdim")?;
    a.dk.expect_rank("dk", "batch, seqlen_k, nheads_k, headdim")?;
    a.dv.expect_rank("dv", "batch, seqlen_k, nheads_k, headdim")?;
    for (name, t) in [("dout", a.dout), ("dq", a.dq), ("dk", a.dk), ("dv", a.dv)] {
        t.expect_same_dtype(name, a.q, "q")?;
    }
    a.dout.expect_shape("dout", &a.q.shape)?;
    a.dq.expect_shape("dq", &a.q.shape)?;
    a.dk.expect_shape("dk", &a.k.shape)?;
    a.dv.expect_shape("dv", &a.v.shape)?;
    for (name, t) in [("dout", a.dout), ("dq", a.dq), ("dk", a.dk), ("dv", a.dv)] {
        t.expect_unit_stride(name, 3, "headdim")?;
        expect_aligned_rows(name, t)?;
    }
    for (name, t) in [("dq", a.dq), ("dk", a.dk), ("dv", a.dv)] {
        t.expect_writable(name)?;
    }
    expect_no_overlap(
        &[("dq", Some(a.dq)), ("dk", Some(a.dk)), ("dv", Some(a.dv))],
        &[
            ("dout", Some(a.dout)),
            ("q", Some(a.q)),
            ("k", Some(a.k)),
            ("v", Some(a.v)),
            ("out", Some(a.out)),
            ("lse", Some(a.lse)),
        ],
    )?;
    if p.nheads > 65535 || p.nheads_k * 4 > 65535 {
        return Err(unsupported(format!(
            "nheads = {} is not supported by the backward (at most 65535 q heads, 16383 kv heads)",
            p.nheads
        )));
    }
    Ok(p)
}

fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

fn round256(bytes: i64) -> i64 {
    cdiv(bytes, 256) * 256
}

/// Launch plan: tile, padded query length, grid of the main kernel, scratch layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub tile: BwdTile,
    pub head_dim_tile: i64,
    pub seqlen_q_pad: i64,
    pub n_kv_blocks: i64,
    /// fp32 accumulator slices: 1, or the deterministic split count.
    pub nsplit: i64,
    /// Launches of the main kernel: 1, or the wgmma backward's deterministic walk,
    /// ceil(n_kv_blocks / nsplit) launches of `grid_main` (`walk_split`).
    pub launches: i64,
    pub grid_main: (u32, u32, u32),
    /// Scratch: dq_accum at 0, dpsum at `dpsum_off`, lse_log2 at `lse_off`; `scratch_bytes` in all.
    pub dpsum_off: i64,
    pub lse_off: i64,
    pub scratch_bytes: i64,
}

/// The plan for a checked problem. Deterministic mode: `nsplit` CTAs per (batch, kv head, head-dim
/// slice), each taking kv blocks x, x + nsplit, ... in order into its own accumulator slice, with
/// nsplit = ceil(sm_count / (batch * nheads_k * dsplit)) capped at the kv block count, so the
/// scratch grows to nsplit fp32 copies of dq (summed in fixed order by the convert pass).
pub fn plan(
    p: &Problem,
    dtype_code: u32,
    arch: u32,
    sm_count: i64,
    deterministic: bool,
) -> Result<Plan> {
    let tile = flash_bwd_tile(head_dim_tile(p.head_dim) as u32, dtype_code, arch);
    plan_for_tile(p, tile, sm_count, deterministic, false)
}

/// `plan` for a given main-kernel tile (the sm_90a wgmma kernel's, `SM90_TILE_*`, with `wgmma`,
/// or `flash_bwd_tile`'s): the padded query length follows its `block_m`.
pub fn plan_for_tile(
    p: &Problem,
    tile: BwdTile,
    sm_count: i64,
    deterministic: bool,
    wgmma: bool,
) -> Result<Plan> {
    let hdt = head_dim_tile(p.head_dim);
    let bm = tile.block_m as i64;
    let seqlen_q_pad = cdiv(p.seqlen_q, bm) * bm;
    let n_kv_blocks = cdiv(p.seqlen_k, tile.block_n as i64);
    let ctas_per_split = p.batch * p.nheads_k * tile.dsplit as i64;
    let nsplit = match (deterministic, wgmma) {
        (false, _) => 1,
        (true, false) => cdiv(sm_count.max(1), ctas_per_split.max(1)).clamp(1, n_kv_blocks.max(1)),
        (true, true) => walk_split(n_kv_blocks, ctas_per_split, sm_count),
    };
    let launches = if deterministic && wgmma {
        cdiv(n_kv_blocks.max(1), nsplit)
    } else {
        1
    };
    let gx = if deterministic { nsplit } else { n_kv_blocks };
    let too_big = |_| unsupported("problem too large for one launch of the attention backward");
    let grid_main = (
        u32::try_from(gx).map_err(too_big)?,
        u32::try_from(p.nheads_k * tile.dsplit as i64).map_err(too_big)?,
        u32::try_from(p.batch).map_err(too_big)?,
    );
    if seqlen_q_pad >= (1i64 << 31) {
        return Err(unsupported("seqlen_q too large for the attention backward"));
    }
    let rows = p.batch * p.nheads * seqlen_q_pad;
    let acc_bytes = nsplit * rows * hdt * 4;
    let dpsum_off = round256(acc_bytes);
    let lse_off = dpsum_off + round256(rows * 4);
    Ok(Plan {
        tile,
        head_dim_tile: hdt,
        seqlen_q_pad,
        n_kv_blocks,
        nsplit,
        launches,
        grid_main,
        dpsum_off,
        lse_off,
        scratch_bytes: lse_off + round256(rows * 4),
    })
}

/// Slices of the wgmma backward's deterministic walk (cuda/flash_bwd_sm90.cu, "Deterministic
/// mode"): ceil(n_kv / nsplit) launches in stream order, each of nsplit CTAs per (batch, kv head)
/// at one CTA an SM, as long as its slowest wave. The count in 1 ..= ceil(sm_count /
/// ctas_per_split) (the scratch the mma.sync kernel's walk takes) with the fewest launches x
/// waves; the fewest slices among equals.
fn walk_split(n_kv: i64, ctas_per_split: i64, sm_count: i64) -> i64 {
    let (n_kv, cps, sms) = (n_kv.max(1), ctas_per_split.max(1), sm_count.max(1));
    let cap = cdiv(sms, cps).min(n_kv);
    let cost = |ns: i64| cdiv(n_kv, ns) * cdiv(ns * cps, sms);
    (1..=cap).fold(1, |best, ns| if cost(ns) < cost(best) { ns } else { best })
}

/// The main kernel's variant, its tile and dynamic shared memory (`varlen`: the
/// packed-sequence build, `FS_VARLEN`).
pub fn main_spec(
    head_dim: i64,
    dtype: DType,
    has_mask: bool,
    softcap: bool,
    arch_num: i64,
    varlen: bool,
) -> Result<(KernelSpec, BwdTile, u32)> {
    let hdt = head_dim_tile(head_dim);
    let code = dtype.kernel_code()?;
    let tile = flash_bwd_tile(hdt as u32, code as u32, arch_num as u32);
    let smem = tile.smem_bytes(hdt as u32, dtype.size() as u32);
    let mut defines = vec![
        ("FS_HEAD_DIM", hdt),
        ("FS_DTYPE", code),
        ("FS_BLOCK_M", tile.block_m as i64),
        ("FS_BLOCK_N", tile.block_n as i64),
        ("FS_NWARPS", tile.warps as i64),
        ("FS_STAGES", tile.stages as i64),
        ("FS_DSPLIT", tile.dsplit as i64),
        ("FS_MIN_BLOCKS", tile.min_blocks as i64),
        ("FS_HAS_MASK", has_mask as i64),
        ("FS_HAS_SOFTCAP", softcap as i64),
        ("FS_PAD_HEADDIM", (hdt != head_dim) as i64),
        ("FS_ARCH", arch_num),
    ];
    if varlen {
        defines.push(("FS_VARLEN", 1));
    }
    Ok((
        KernelSpec {
            family: FAMILY,
            source: SOURCE,
            entry: ENTRY_MAIN,
            defines,
        },
        tile,
        smem,
    ))
}

/// The sm_90a wgmma kernel's tile (`cuda/flash_bwd_sm90.cu`): 128 keys per CTA, two warpgroups
/// (8 warps) of 64 keys each, two Q / dO stages; 64 queries per step at hd128 (dK / dV
/// accumulators of 64 x 128 per warpgroup), 128 at hd64.
pub const SM90_TILE_HD128: BwdTile = BwdTile {
    block_m: 64,
    block_n: 128,
    warps: 8,
    stages: 2,
    dsplit: 1,
    min_blocks: 1,
};
pub const SM90_TILE_HD64: BwdTile = BwdTile {
    block_m: 128,
    ..SM90_TILE_HD128
};
/// hd256: 64 keys per CTA shared by both warpgroups, each owning 128 of the dK / dV / dQ columns
/// (the kernel header's column-split form), 64 queries per step.
pub const SM90_TILE_HD256: BwdTile = BwdTile {
    block_n: 64,
    ..SM90_TILE_HD128
};

/// The wgmma backward's tile at a head dim it covers (64, 128 or 256): its block_m is also the
/// row count of the dQ blocks the convert pass reads back (`sm90_convert_spec`).
fn sm90_tile(head_dim: i64) -> BwdTile {
    match head_dim {
        128 => SM90_TILE_HD128,
        256 => SM90_TILE_HD256,
        _ => SM90_TILE_HD64,
    }
}

/// The wgmma backward's dtype code where it covers the problem: sm_90, fp16 / bf16, head dim
/// exactly 64, 128 or 256 (softcap or not).
fn sm90_bwd_dtype_code(head_dim: i64, dtype: DType, arch_num: i64) -> Option<i64> {
    if arch_num != 90 || !SM90_HEAD_DIMS.contains(&head_dim) {
        return None;
    }
    match dtype {
        DType::F16 | DType::BF16 => dtype.kernel_code().ok(),
        _ => None,
    }
}

/// The wgmma backward's dynamic shared memory for a tile (the kernel's kSmemBytes): K, V
/// (block_n rows), 2 x (Q, dO) (block_m rows), dS^T (block_n x block_m; hd256 adds P^T of the
/// same shape), 2 x 2 x block_m floats, 2 stages of the fp32 dQ block (block_m x hd; none at
/// hd256, which adds dQ from registers), 2 mbarriers (16 bytes), 1 KB for aligning the base to
/// the 1024-byte swizzle atom.
fn sm90_smem_bytes(tile: BwdTile, head_dim: u32) -> u32 {
    let (bm, bn, hd) = (tile.block_m, tile.block_n, head_dim);
    let wide = hd == 256;
    let s_tiles = if wide { 2 } else { 1 };
    let dq_stages = if wide { 0 } else { 2 };
    2 * bn * hd * 2
        + 4 * bm * hd * 2
        + s_tiles * bn * bm * 2
        + 4 * bm * 4
        + dq_stages * bm * hd * 4
        + 16
        + 1024
}

/// The wgmma backward's variant, tile and dynamic shared memory when it covers the problem
/// (`sm90_bwd_dtype_code`; dense or varlen, deterministic or not); None for everything else.
pub fn sm90_main_spec(
    head_dim: i64,
    dtype: DType,
    has_mask: bool,
    softcap: bool,
    arch_num: i64,
    varlen: bool,
    deterministic: bool,
) -> Option<(KernelSpec, BwdTile, u32)> {
    let code = sm90_bwd_dtype_code(head_dim, dtype, arch_num)?;
    let tile = sm90_tile(head_dim);
    let smem = sm90_smem_bytes(tile, head_dim as u32);
    // FS_BWD_TMA 1 (Q / dO by TMA, the maps in the parameter: `sm90_tma_params`) by default;
    // `launch` switches a call to 0 (cp.async) when a map cannot be encoded (`without_tma`).
    let mut defines = vec![
        ("FS_HEAD_DIM", head_dim),
        ("FS_DTYPE", code),
        ("FS_HAS_MASK", has_mask as i64),
        ("FS_ARCH", arch_num),
        ("FS_BWD_TMA", 1),
    ];
    if softcap {
        // only softcap variants carry the define: the others keep their names (and kernel cache)
        defines.push(("FS_HAS_SOFTCAP", 1));
    }
    if varlen {
        defines.push(("FS_VARLEN", 1));
    }
    if deterministic {
        // a launch of the walk (`launch`): block kv_block0 + x into accumulator slice x
        defines.push(("FS_DETERMINISTIC", 1));
    }
    Some((
        KernelSpec {
            family: FAMILY_SM90,
            source: SOURCE_SM90,
            entry: ENTRY_SM90,
            defines,
        },
        tile,
        smem,
    ))
}

/// Mirrors `struct FlashBwdTmaParams` in cuda/flash_bwd_sm90.cu: the tensor maps of q and dout
/// (64-byte aligned, 128 bytes each), then the plain parameters (the dense kernel's 344 bytes
/// of them: the driver copies the kernel's own parameter size).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct FlashBwdTmaParams {
    pub tm_q: [u64; 16],
    pub tm_do: [u64; 16],
    pub base: FlashBwdParams,
}

const _: () = assert!(std::mem::offset_of!(FlashBwdTmaParams, base) == 256);

/// The TMA build's parameter for `params` (sizes filled in): q and dout maps with boxes of 64
/// columns x `block_m` rows of one head (varlen: over the packed rows, batch 1). An error means
/// "run the cp.async build".
pub fn sm90_tma_params(
    params: &FlashBwdParams,
    dtype: DType,
    block_m: u32,
    varlen: bool,
) -> Result<FlashBwdTmaParams> {
    let bf16 = dtype == DType::BF16;
    let [q, dout] = sm90_map_args(params, block_m, varlen);
    let map = |ptr: u64, a: Option<attention_tma::MapArgs>| -> Result<[u64; 16]> {
        let a = a.ok_or_else(|| unsupported("a stride TMA cannot address"))?;
        encode_tensor_map_4d(ptr, bf16, a.dims, a.strides, a.box_dims)
    };
    Ok(FlashBwdTmaParams {
        tm_q: map(params.q, q)?,
        tm_do: map(params.dout, dout)?,
        base: *params,
    })
}

/// The q and dout maps' arguments (None where TMA cannot address the tensor). Varlen: the
/// packed rows (total_q) as one batch; the kernel adds its sequence's first row.
fn sm90_map_args(
    params: &FlashBwdParams,
    block_m: u32,
    varlen: bool,
) -> [Option<attention_tma::MapArgs>; 2] {
    let hd = params.head_dim as i64;
    let (sq, b) = if varlen {
        (params.total_q as i64, 1)
    } else {
        (params.seqlen_q as i64, params.batch as i64)
    };
    let h = params.nheads as i64;
    // (batch, row, head) strides per tensor in the kernel's order: q at 0, dout at 12
    let of = |i: usize| {
        let s = &params.strides[i..i + 3];
        attention_tma::map_args(block_m, hd, sq, h, b, s[1], s[2], s[0])
    };
    [of(0), of(12)]
}

/// `spec` (a wgmma backward variant) as its cp.async build (FS_BWD_TMA 0).
pub fn without_tma(mut spec: KernelSpec) -> KernelSpec {
    for d in spec.defines.iter_mut() {
        if d.0 == "FS_BWD_TMA" {
            d.1 = 0;
        }
    }
    spec
}

/// FLASHSCAN_SM90_BWD_TMA=0 keeps the wgmma backward on its cp.async build (read per call).
fn sm90_bwd_tma_enabled() -> bool {
    std::env::var("FLASHSCAN_SM90_BWD_TMA").as_deref() != Ok("0")
}

/// The wgmma backward serves every problem it covers unless FLASHSCAN_SM90_BWD=0 (the default
/// since its first GPU run: correct, sanitizer-clean, 1.07-1.41x the mma.sync kernel's
/// fwd+bwd). Read on every call, not cached: the GPU tests switch it within one process.
fn sm90_bwd_enabled() -> bool {
    std::env::var("FLASHSCAN_SM90_BWD").as_deref() != Ok("0")
}

/// The main kernel for a problem: the wgmma kernel when `sm90` is asked for and covers it, else
/// `main_spec`'s (deterministic, other head dims / dtypes / archs).
#[allow(clippy::too_many_arguments)]
pub fn main_choice(
    sm90: bool,
    head_dim: i64,
    dtype: DType,
    has_mask: bool,
    softcap: bool,
    arch_num: i64,
    varlen: bool,
    deterministic: bool,
) -> Result<(KernelSpec, BwdTile, u32)> {
    if sm90 {
        let spec = sm90_main_spec(
            head_dim,
            dtype,
            has_mask,
            softcap,
            arch_num,
            varlen,
            deterministic,
        );
        if let Some(found) = spec {
            return Ok(found);
        }
    }
    main_spec(head_dim, dtype, has_mask, softcap, arch_num, varlen)
}

/// The head dims the wgmma backward builds (others pad to the mma.sync kernel's tiles).
const SM90_HEAD_DIMS: [i64; 3] = [64, 128, 256];

/// Every variant of the wgmma backward for one arch (none but sm_90): dense and varlen,
/// deterministic or not, each in the TMA and the cp.async build.
pub fn sm90_specs(arch_num: i64) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    for det in [false, true] {
        for varlen in [false, true] {
            for hd in SM90_HEAD_DIMS {
                for dtype in [DType::F16, DType::BF16] {
                    for mask in [false, true] {
                        for softcap in [false, true] {
                            if let Some((s, _, _)) =
                                sm90_main_spec(hd, dtype, mask, softcap, arch_num, varlen, det)
                            {
                                out.push(without_tma(s.clone()));
                                out.push(s);
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The convert pass that reads the wgmma backward's dQ accumulator: blocks of `block_m` rows in
/// that kernel's fragment order (`FS_DQ_FRAG`, cuda/flash_bwd_sm90.cu's header).
pub fn sm90_convert_spec(
    head_dim: i64,
    dtype: DType,
    arch_num: i64,
    varlen: bool,
) -> Result<KernelSpec> {
    let tile = sm90_tile(head_dim);
    let mut spec = aux_spec(head_dim, dtype, arch_num, ENTRY_CONVERT, varlen)?;
    spec.defines.push(("FS_DQ_FRAG", tile.block_m as i64));
    Ok(spec)
}

/// The convert pass for the main kernel `main`: the wgmma kernel leaves dQ in its fragment
/// order, which only its own convert variant reads.
pub fn convert_choice(
    main: &KernelSpec,
    head_dim: i64,
    dtype: DType,
    arch_num: i64,
    varlen: bool,
) -> Result<KernelSpec> {
    if main.family == FAMILY_SM90 {
        sm90_convert_spec(head_dim, dtype, arch_num, varlen)
    } else {
        aux_spec(head_dim, dtype, arch_num, ENTRY_CONVERT, varlen)
    }
}

/// The convert variants of every wgmma backward variant (sm_90 only).
pub fn sm90_aux_specs(arch_num: i64) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    if sm90_specs(arch_num).is_empty() {
        return out;
    }
    for varlen in [false, true] {
        for hd in SM90_HEAD_DIMS {
            for dtype in [DType::F16, DType::BF16] {
                if let Ok(s) = sm90_convert_spec(hd, dtype, arch_num, varlen) {
                    out.push(s);
                }
            }
        }
    }
    out
}

/// The preprocess / convert variant (depends on dtype and head-dim tile only).
pub fn aux_spec(
    head_dim: i64,
    dtype: DType,
    arch_num: i64,
    entry: &'static str,
    varlen: bool,
) -> Result<KernelSpec> {
    let mut defines = vec![
        ("FS_HEAD_DIM", head_dim_tile(head_dim)),
        ("FS_DTYPE", dtype.kernel_code()?),
        ("FS_AUX_ONLY", 1),
        ("FS_ARCH", arch_num),
    ];
    if varlen {
        defines.push(("FS_VARLEN", 1));
    }
    Ok(KernelSpec {
        family: FAMILY,
        source: SOURCE,
        entry,
        defines,
    })
}

/// Every variant the backward can emit for one arch (for tests and precompile).
pub fn all_specs(arch_num: i64) -> Vec<KernelSpec> {
    specs_of(arch_num, false)
}

/// Every dense (`varlen` false) or packed-sequence variant of the backward for one arch.
pub fn specs_of(arch_num: i64, varlen: bool) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    for &tile in HEAD_DIM_TILES {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            for entry in [ENTRY_PRE, ENTRY_CONVERT] {
                if let Ok(s) = aux_spec(tile, dtype, arch_num, entry, varlen) {
                    out.push(s);
                }
            }
            for padded in [false, true] {
                let hd = if padded { tile - 8 } else { tile };
                for mask in [false, true] {
                    for cap in [false, true] {
                        if let Ok((s, _, _)) = main_spec(hd, dtype, mask, cap, arch_num, varlen) {
                            if !out.contains(&s) {
                                out.push(s);
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Checks, plans, launches (preprocess, main, convert on one stream, scratch stream-ordered so
/// the call is graph-capturable). dq, dk, dv are written in full.
pub fn backward(a: &FlashBwdArgs, stream: StreamChoice) -> Result<()> {
    let p = check(a)?;
    if p.batch == 0 || p.nheads == 0 || p.seqlen_k == 0 {
        return Ok(());
    }
    let (device, params) =
        device_and_params(a, &[], |t| [t.strides[0], t.strides[1], t.strides[2]])?;
    launch(&p, params, &BwdRun::of(a, false), device, stream)
}

/// The common CUDA device of `a`'s nine tensors and of `extra` (the varlen call's
/// cu_seqlens), and the params holding the nine pointers and, in the kernel's order (q, k, v,
/// o, dout, dq, dk, dv), each tensor's (batch, row, head) strides as `strides_of` reads them.
pub(crate) fn device_and_params(
    a: &FlashBwdArgs,
    extra: &[(&str, Option<&TensorView>)],
    strides_of: fn(&TensorView) -> [i64; 3],
) -> Result<(i32, FlashBwdParams)> {
    let mut tensors = vec![
        ("dout", Some(a.dout)),
        ("q", Some(a.q)),
        ("k", Some(a.k)),
        ("v", Some(a.v)),
        ("out", Some(a.out)),
        ("lse", Some(a.lse)),
        ("dq", Some(a.dq)),
        ("dk", Some(a.dk)),
        ("dv", Some(a.dv)),
    ];
    tensors.extend_from_slice(extra);
    let device = common_cuda_device(&tensors)?;
    let mut strides = [0i64; 24];
    for (i, t) in [a.q, a.k, a.v, a.out, a.dout, a.dq, a.dk, a.dv]
        .iter()
        .enumerate()
    {
        strides[3 * i..3 * i + 3].copy_from_slice(&strides_of(t));
    }
    let params = FlashBwdParams {
        q: a.q.ptr,
        k: a.k.ptr,
        v: a.v.ptr,
        o: a.out.ptr,
        dout: a.dout.ptr,
        lse: a.lse.ptr,
        dq: a.dq.ptr,
        dk: a.dk.ptr,
        dv: a.dv.ptr,
        strides,
        ..Default::default()
    };
    Ok((device, params))
}

/// What `launch` needs beyond the problem and the tensors' pointers and strides.
pub(crate) struct BwdRun {
    pub dtype: DType,
    pub softmax_scale: f32,
    pub softcap: f32,
    pub deterministic: bool,
    /// The packed-sequence build: `p.batch` sequences of at most `p.seqlen_q` / `p.seqlen_k`
    /// rows; `params` then carries cu_seqlens and the totals, batch strides 0.
    pub varlen: bool,
}

impl BwdRun {
    pub(crate) fn of(a: &FlashBwdArgs, varlen: bool) -> BwdRun {
        BwdRun {
            dtype: a.q.dtype,
            softmax_scale: a.softmax_scale,
            softcap: a.softcap,
            deterministic: a.deterministic,
            varlen,
        }
    }
}

/// Plans and runs the three launches of a checked, non-empty problem `p` whose `params` hold
/// every tensor pointer and stride (and, varlen, cu_seqlens and totals); fills in the sizes,
/// options and the stream-ordered scratch.
pub(crate) fn launch(
    p: &Problem,
    mut params: FlashBwdParams,
    run: &BwdRun,
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
    let (mut mspec, tile, smem) = main_choice(
        sm90_bwd_enabled(),
        p.head_dim,
        run.dtype,
        has_mask,
        run.softcap > 0.0,
        arch_num,
        run.varlen,
        run.deterministic,
    )?;
    // the scratch's padded query length follows the chosen kernel's block_m
    let wgmma = mspec.family == FAMILY_SM90;
    let pl = plan_for_tile(p, tile, dev.props.sm_count as i64, run.deterministic, wgmma)?;
    let pre_k = dev.kernel(&aux_spec(
        p.head_dim, run.dtype, arch_num, ENTRY_PRE, run.varlen,
    )?)?;
    let conv_k = dev.kernel(&convert_choice(
        &mspec, p.head_dim, run.dtype, arch_num, run.varlen,
    )?)?;
    let i32_of = |name: &str, v: i64| {
        i32::try_from(v).map_err(|_| unsupported(format!("{name} = {v} exceeds 2^31 - 1")))
    };
    params.batch = i32_of("batch", p.batch)?;
    params.nheads = i32_of("nheads", p.nheads)?;
    params.nheads_k = i32_of("nheads_k", p.nheads_k)?;
    params.seqlen_q = i32_of("seqlen_q", p.seqlen_q)?;
    params.seqlen_k = i32_of("seqlen_k", p.seqlen_k)?;
    params.head_dim = i32_of("headdim", p.head_dim)?;
    params.seqlen_q_pad = i32_of("seqlen_q", pl.seqlen_q_pad)?;
    params.nsplit = pl.nsplit as i32;
    params.deterministic = run.deterministic as i32;
    params.softmax_scale = run.softmax_scale;
    params.softcap = run.softcap;
    params.window_left = p.window_left as i32;
    params.window_right = p.window_right as i32;
    // the wgmma kernel's TMA build needs q / dout maps; where the driver refuses one (or
    // FLASHSCAN_SM90_BWD_TMA=0) its cp.async build runs
    let mut tma = None;
    if mspec.family == FAMILY_SM90 {
        tma = if sm90_bwd_tma_enabled() {
            sm90_tma_params(&params, run.dtype, tile.block_m, run.varlen).ok()
        } else {
            None
        };
        if tma.is_none() {
            mspec = without_tma(mspec);
        }
    }
    let main_k = dev.kernel(&mspec)?;
    let nh = p.nheads as u32;
    let nb = p.batch as u32;
    let aux_grid = |rows: i64| -> Result<(u32, u32, u32)> {
        let x =
            u32::try_from(cdiv(rows, AUX_ROWS)).map_err(|_| unsupported("seqlen_q too large"))?;
        Ok((x, nh, nb))
    };
    let pre_grid = aux_grid(pl.seqlen_q_pad)?;
    let conv_grid = aux_grid(p.seqlen_q)?;
    let s = dev.stream(stream)?;
    let mut scratch = dev.scratch(s)?;
    let base = scratch.alloc(pl.scratch_bytes as usize)?;
    params.dq_accum = base;
    params.dpsum = base + pl.dpsum_off as u64;
    params.lse_log2 = base + pl.lse_off as u64;
    // SAFETY: params mirrors the kernel's struct; every tensor pointer was checked by the
    // caller (shape, dtype, strides, alignment, device); the scratch holds the plan's three
    // regions.
    let launched = (|| unsafe {
        if p.seqlen_q > 0 {
            dev.launch(&pre_k, pre_grid, (AUX_THREADS, 1, 1), 0, s, &params)?;
        }
        // With seqlen_q == 0 the main kernel only writes dK = dV = 0.
        let block = (tile.warps * 32, 1, 1);
        // (the deterministic walk: launch i takes kv blocks i nsplit ..; the stream orders them)
        for i in 0..pl.launches {
            params.kv_block0 = (i * pl.nsplit) as i32;
            match tma.as_mut() {
                Some(tp) => {
                    tp.base = params; // the scratch pointers were filled in after the maps
                    dev.launch(&main_k, pl.grid_main, block, smem, s, tp)?
                }
                None => dev.launch(&main_k, pl.grid_main, block, smem, s, &params)?,
            }
        }
        if p.seqlen_q > 0 {
            dev.launch(&conv_k, conv_grid, (AUX_THREADS, 1, 1), 0, s, &params)?;
        }
        Ok(())
    })();
    scratch.free()?; // ordered after the launches on the same stream
    launched?;
    dev.finish(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DeviceKind;

    fn view(shape: &[i64], ptr: u64, dtype: DType) -> TensorView {
        TensorView {
            ptr,
            shape: shape.to_vec(),
            strides: crate::dlpack::compact_strides(shape),
            dtype,
            device: DeviceKind::Cuda,
            device_id: 0,
            readonly: false,
        }
    }

    struct Views {
        t: Vec<TensorView>,
    }

    /// q, k, v, out, lse, dout, dq, dk, dv at disjoint addresses.
    fn views(sq: i64, sk: i64, h: i64, hk: i64, d: i64) -> Views {
        let mut t = Vec::new();
        let shapes: [(&[i64], DType); 9] = [
            (&[2, sq, h, d], DType::BF16),
            (&[2, sk, hk, d], DType::BF16),
            (&[2, sk, hk, d], DType::BF16),
            (&[2, sq, h, d], DType::BF16),
            (&[2, h, sq], DType::F32),
            (&[2, sq, h, d], DType::BF16),
            (&[2, sq, h, d], DType::BF16),
            (&[2, sk, hk, d], DType::BF16),
            (&[2, sk, hk, d], DType::BF16),
        ];
        for (i, (s, dt)) in shapes.iter().enumerate() {
            t.push(view(s, 0x1000_0000 * (i as u64 + 1), *dt));
        }
        Views { t }
    }

    fn args(v: &Views, left: i64, right: i64, det: bool) -> FlashBwdArgs<'_> {
        FlashBwdArgs {
            q: &v.t[0],
            k: &v.t[1],
            v: &v.t[2],
            out: &v.t[3],
            lse: &v.t[4],
            dout: &v.t[5],
            dq: &v.t[6],
            dk: &v.t[7],
            dv: &v.t[8],
            softmax_scale: 0.125,
            window_left: left,
            window_right: right,
            softcap: 0.0,
            deterministic: det,
        }
    }

    #[test]
    fn device_and_params_packs_pointers_and_strides_in_kernel_order() {
        let mut v = views(7, 9, 4, 2, 64);
        let a = args(&v, -1, -1, false);
        let (dev, p) =
            device_and_params(&a, &[], |t| [t.strides[0], t.strides[1], t.strides[2]]).unwrap();
        assert_eq!(dev, 0);
        assert_eq!(
            (p.q, p.k, p.v, p.o, p.lse),
            (a.q.ptr, a.k.ptr, a.v.ptr, a.out.ptr, a.lse.ptr)
        );
        assert_eq!(
            (p.dout, p.dq, p.dk, p.dv),
            (a.dout.ptr, a.dq.ptr, a.dk.ptr, a.dv.ptr)
        );
        // q, k, v, o, dout, dq, dk, dv: (batch, row, head) each
        let (sq, sk) = ([7 * 256, 256, 64], [9 * 128, 128, 64]);
        let want = [sq, sk, sk, sq, sq, sq, sk, sk].concat();
        assert_eq!(p.strides.to_vec(), want);
        let (_, p) = device_and_params(&a, &[], |t| [0, t.strides[1], t.strides[2]]).unwrap();
        assert_eq!(p.strides[..6], [0, 256, 64, 0, 128, 64]);
        // an extra tensor on another device, or one of the nine, is refused by name
        let mut cu = view(&[3], 0xf000_0000, DType::I32);
        cu.device_id = 1;
        let err = device_and_params(&a, &[("cu_seqlens_q", Some(&cu))], |t| {
            [0, t.strides[1], t.strides[2]]
        });
        assert!(format!("{:?}", err.unwrap_err()).contains("cu_seqlens_q"));
        v.t[8].device_id = 1;
        let a = args(&v, -1, -1, false);
        let err = device_and_params(&a, &[], |t| [t.strides[0], t.strides[1], t.strides[2]]);
        assert!(format!("{:?}", err.unwrap_err()).contains("dv"));
    }

    #[test]
    fn checks_accept_valid_and_normalise_the_window() {
        let v = views(100, 300, 8, 2, 64);
        let p = check(&args(&v, -1, 0, false)).expect("valid");
        assert_eq!((p.window_left, p.window_right, p.nheads_k), (-1, 0, 2));
        // a causal decode query sees every key: no mask
        let v = views(1, 300, 8, 2, 64);
        assert_eq!(
            check(&args(&v, -1, 0, false)).expect("valid").window_right,
            -1
        );
    }

    #[test]
    fn checks_reject_bad_outputs() {
        let mut v = views(100, 300, 8, 2, 64);
        v.t[7].shape = vec![2, 300, 8, 64]; // dk with q's head count
        v.t[7].strides = crate::dlpack::compact_strides(&v.t[7].shape);
        assert!(check(&args(&v, -1, -1, false)).is_err());
        let mut v = views(100, 300, 8, 2, 64);
        v.t[6].ptr = v.t[5].ptr; // dq aliases dout
        assert!(check(&args(&v, -1, -1, false)).is_err());
        let mut v = views(100, 300, 8, 2, 64);
        v.t[8].dtype = DType::F16;
        assert!(check(&args(&v, -1, -1, false)).is_err());
        let mut v = views(100, 300, 8, 2, 64);
        v.t[6].readonly = true;
        assert!(check(&args(&v, -1, -1, false)).is_err());
        let mut v = views(100, 300, 8, 2, 64);
        v.t[5].ptr += 8; // dout rows not 16-byte aligned
        assert!(check(&args(&v, -1, -1, false)).is_err());
        // read-only forward outputs are fine (they are inputs here)
        let mut v = views(100, 300, 8, 2, 64);
        v.t[3].readonly = true;
        v.t[4].readonly = true;
        assert!(check(&args(&v, -1, -1, false)).is_ok());
    }

    #[test]
    fn plan_grid_and_scratch() {
        let v = views(1000, 1000, 8, 2, 128);
        let p = check(&args(&v, -1, 0, false)).expect("valid");
        let pl = plan(&p, 1, 90, 132, false).expect("plan");
        assert_eq!(pl.tile, t(64, 128, 2, 1));
        // hd64 on sm_90: 4 warps of 32 keys, one stage, two CTAs per SM
        let hd64 = flash_bwd_tile(64, 1, 90);
        assert_eq!((hd64.block_m, hd64.block_n, hd64.warps), (32, 128, 4));
        assert_eq!((hd64.stages, hd64.min_blocks), (1, 2));
        assert_eq!(pl.seqlen_q_pad, 1024);
        assert_eq!(pl.grid_main, (8, 2, 2));
        assert_eq!(pl.nsplit, 1);
        assert_eq!(pl.dpsum_off, 2 * 8 * 1024 * 128 * 4);
        assert_eq!(pl.scratch_bytes, pl.dpsum_off + 2 * 2 * 8 * 1024 * 4);
        // deterministic: ceil(132 / (2 * 2)) = 33 slices, capped at the 8 kv blocks
        let pl = plan(&p, 1, 90, 132, true).expect("plan");
        assert_eq!((pl.nsplit, pl.grid_main.0), (8, 8));
        assert_eq!(pl.dpsum_off, 8 * 2 * 8 * 1024 * 128 * 4);
        // hd256 splits the head dim over two CTAs
        let v = views(1000, 1000, 8, 2, 256);
        let p = check(&args(&v, -1, -1, false)).expect("valid");
        assert_eq!(
            plan(&p, 0, 90, 132, false).expect("plan").grid_main,
            (8, 4, 2)
        );
    }

    #[test]
    fn every_tile_fits_the_arch_shared_memory_and_the_kernel_asserts() {
        for (arch, limit) in [(90, 232_448), (80, 166_912), (86, 101_376), (89, 101_376)] {
            for &hd in HEAD_DIM_TILES {
                for dtype in 0..3 {
                    let tile = flash_bwd_tile(hd as u32, dtype, arch);
                    let elem = if dtype == 2 { 4 } else { 2 };
                    let smem = tile.smem_bytes(hd as u32, elem);
                    assert!(
                        smem <= limit,
                        "sm_{arch} hd{hd} dtype{dtype}: {smem} > {limit}"
                    );
                    let keys_per_warp = tile.block_n / tile.warps;
                    assert_eq!(tile.block_n, keys_per_warp * tile.warps);
                    assert!(keys_per_warp == 16 || keys_per_warp == 32);
                    assert_eq!(tile.block_m % 16, 0);
                    assert_eq!((hd as u32 / tile.dsplit) % 16, 0);
                }
            }
        }
    }

    #[test]
    fn sm90_switch_picks_the_wgmma_kernel_only_where_it_covers() {
        let fam = |sm90, hd, dt, cap, arch, varlen, det| {
            main_choice(sm90, hd, dt, true, cap, arch, varlen, det)
                .expect("a variant")
                .0
                .family
        };
        // switched on: sm_90 fp16 / bf16 hd64 / hd128 / hd256, dense, non-deterministic
        for hd in [64, 128, 256] {
            for dt in [DType::F16, DType::BF16] {
                assert_eq!(fam(true, hd, dt, false, 90, false, false), FAMILY_SM90);
                // switched off: the mma.sync kernel
                assert_eq!(fam(false, hd, dt, false, 90, false, false), FAMILY);
            }
        }
        // everything it does not cover falls back even when switched on
        assert_eq!(fam(true, 128, DType::F32, false, 90, false, false), FAMILY);
        assert_eq!(fam(true, 96, DType::BF16, false, 90, false, false), FAMILY);
        assert_eq!(fam(true, 120, DType::BF16, false, 90, false, false), FAMILY);
        assert_eq!(fam(true, 192, DType::BF16, false, 90, false, false), FAMILY);
        assert_eq!(fam(true, 248, DType::BF16, false, 90, false, false), FAMILY);
        // softcap: the wgmma kernel at its head dims, the mma.sync one elsewhere
        assert_eq!(
            fam(true, 256, DType::BF16, true, 90, false, false),
            FAMILY_SM90
        );
        assert_eq!(
            fam(true, 64, DType::F16, true, 90, false, false),
            FAMILY_SM90
        );
        assert_eq!(fam(true, 192, DType::BF16, true, 90, false, false), FAMILY);
        // varlen: the wgmma kernel's packed build (TMA unless a map cannot be encoded)
        for hd in [64, 128, 256] {
            let (s, _, _) =
                main_choice(true, hd, DType::BF16, true, true, 90, true, false).expect("covered");
            assert_eq!(s.family, FAMILY_SM90);
            assert!(s.defines.contains(&("FS_VARLEN", 1)));
            assert!(s.defines.contains(&("FS_BWD_TMA", 1)));
        }
        assert_eq!(fam(false, 128, DType::BF16, false, 90, true, false), FAMILY);
        assert_eq!(fam(true, 96, DType::BF16, false, 90, true, false), FAMILY);
        // deterministic: the wgmma kernel's walk build, dense and varlen
        for varlen in [false, true] {
            let (s, _, _) = main_choice(true, 128, DType::BF16, true, false, 90, varlen, true)
                .expect("covered");
            assert_eq!(s.family, FAMILY_SM90);
            assert!(s.defines.contains(&("FS_DETERMINISTIC", 1)));
        }
        assert_eq!(fam(false, 128, DType::BF16, false, 90, false, true), FAMILY);
        assert_eq!(fam(true, 128, DType::BF16, false, 80, false, true), FAMILY);
        assert_eq!(fam(true, 128, DType::BF16, false, 80, false, false), FAMILY);
        assert_eq!(
            fam(true, 128, DType::BF16, false, 100, false, false),
            FAMILY
        );
        // the tile, block and shared memory the launcher uses
        let (s, tile, smem) =
            main_choice(true, 128, DType::BF16, false, false, 90, false, false).expect("covered");
        assert_eq!(s.entry, ENTRY_SM90);
        assert_eq!(tile, SM90_TILE_HD128);
        assert_eq!(
            (tile.block_m, tile.block_n, tile.warps * 32),
            (64, 128, 256)
        );
        // K, V 32 KB each, 4 x 16 KB Q / dO, dS^T 16 KB, lse / D 1 KB, 2 x dQ 32 KB, 2
        // mbarriers, 1 KB alignment
        assert_eq!(smem, 65536 + 65536 + 16384 + 1024 + 65536 + 16 + 1024);
        let (_, tile, smem) =
            main_choice(true, 64, DType::F16, false, false, 90, false, false).expect("covered");
        assert_eq!((tile.block_m, tile.block_n, tile.warps), (128, 128, 8));
        assert_eq!(smem, 32768 + 65536 + 32768 + 2048 + 65536 + 16 + 1024);
        assert!(
            smem <= 232_448 - 1024,
            "fits sm_90's 227 KB with the static 1 KB"
        );
    }

    #[test]
    fn sm90_deterministic_walk_takes_the_fewest_launch_waves() {
        // 132 SMs. b4 x 16 kv heads, 32 kv blocks: 2 slices (16 launches of one wave) beat 3
        // (11 launches of two waves) and 1 (32 launches)
        assert_eq!(walk_split(32, 64, 132), 2);
        // b1 x 16, 128 blocks: 8 slices (128 CTAs), not 9 (144: two waves)
        assert_eq!(walk_split(128, 16, 132), 8);
        // b8 x 16, 16 blocks: 1 slice and 2 cost the same 16 waves: the smaller scratch
        assert_eq!(walk_split(16, 128, 132), 1);
        // more CTAs than SMs, or a single block: one slice
        assert_eq!(walk_split(8, 256, 132), 1);
        assert_eq!(walk_split(1, 4, 132), 1);
        // the plan: nsplit CTAs a (batch, kv head), ceil(n_kv / nsplit) launches, nsplit slices
        let v = views(4096, 4096, 16, 16, 128);
        let p = check(&args(&v, -1, -1, true)).expect("valid");
        let pl = plan_for_tile(&p, SM90_TILE_HD128, 132, true, true).expect("plan");
        assert_eq!((pl.nsplit, pl.launches, pl.grid_main), (4, 8, (4, 16, 2)));
        assert_eq!(pl.dpsum_off, 4 * 2 * 16 * 4096 * 128 * 4);
        let pl = plan_for_tile(&p, SM90_TILE_HD128, 132, false, true).expect("plan");
        assert_eq!((pl.nsplit, pl.launches, pl.grid_main), (1, 1, (32, 16, 2)));
    }

    #[test]
    fn sm90_plan_pads_queries_to_its_block() {
        // hd64 on the wgmma kernel steps 128 queries: the scratch pads seqlen_q to 128, not the
        // mma.sync tile's 32
        let v = views(1000, 1000, 8, 2, 64);
        let p = check(&args(&v, -1, 0, false)).expect("valid");
        let pl = plan_for_tile(&p, SM90_TILE_HD64, 132, false, true).expect("plan");
        assert_eq!(pl.seqlen_q_pad, 1024);
        assert_eq!(pl.grid_main, (8, 2, 2));
        let v = views(1025, 1000, 8, 2, 64);
        let p = check(&args(&v, -1, 0, false)).expect("valid");
        assert_eq!(
            plan_for_tile(&p, SM90_TILE_HD64, 132, false, true)
                .expect("plan")
                .seqlen_q_pad,
            1024 + 128
        );
        assert_eq!(
            plan(&p, 1, 90, 132, false).expect("plan").seqlen_q_pad,
            1024 + 32
        );
    }

    #[test]
    fn sm90_specs_are_listed_for_sm90_only() {
        let specs = sm90_specs(90);
        // hd 64 / 128 / 256 x fp16 / bf16 x mask x softcap x dense / varlen x deterministic or
        // not x TMA / cp.async
        assert_eq!(specs.len(), 192);
        let count = |d: (&str, i64)| specs.iter().filter(|s| s.defines.contains(&d)).count();
        assert_eq!(count(("FS_HAS_SOFTCAP", 1)), 96);
        assert_eq!(count(("FS_HAS_SOFTCAP", 0)), 0);
        assert_eq!(count(("FS_VARLEN", 1)), 96);
        assert_eq!(count(("FS_VARLEN", 0)), 0);
        assert_eq!(count(("FS_DETERMINISTIC", 1)), 96);
        assert_eq!(count(("FS_DETERMINISTIC", 0)), 0);
        assert_eq!(count(("FS_BWD_TMA", 1)), 96);
        assert_eq!(count(("FS_BWD_TMA", 0)), 96);
        assert!(specs.iter().all(|s| s.family == FAMILY_SM90));
        assert!(sm90_specs(80).is_empty());
        assert!(sm90_specs(100).is_empty());
    }

    #[test]
    fn tma_maps_read_q_and_dout_strides_as_head_dim_rows_heads_batches() {
        let (b, s, h, d) = (2i64, 100i64, 4i64, 128i64);
        let mut params = FlashBwdParams {
            batch: b as i32,
            seqlen_q: s as i32,
            nheads: h as i32,
            head_dim: d as i32,
            ..Default::default()
        };
        params.strides[0..3].copy_from_slice(&[s * h * d, h * d, d]); // q: bshd
        params.strides[12..15].copy_from_slice(&[h * s * d, d, s * d]); // dout: a bhsd view
        let [q, dout] = sm90_map_args(&params, 64, false);
        let q = q.expect("q");
        assert_eq!(q.dims, [128, 100, 4, 2]);
        assert_eq!(
            q.strides,
            [(h * d * 2) as u64, (d * 2) as u64, (s * h * d * 2) as u64]
        );
        assert_eq!(q.box_dims, [64, 64, 1, 1]);
        let dout = dout.expect("dout");
        assert_eq!(
            dout.strides,
            [(d * 2) as u64, (s * d * 2) as u64, (h * s * d * 2) as u64]
        );
        // a row stride TMA cannot step (not a multiple of 16 bytes): the cp.async build
        params.strides[13] = d + 3;
        assert!(sm90_map_args(&params, 64, false)[1].is_none());
        // varlen: the packed rows as one batch (total_q rows; the batch stride is never stepped)
        params.total_q = 777;
        params.strides[0] = 0;
        let [q, _] = sm90_map_args(&params, 64, true);
        assert_eq!(q.expect("varlen q").dims, [128, 777, 4, 1]);
        let (spec, _, _) =
            sm90_main_spec(128, DType::BF16, false, false, 90, false, false).expect("covered");
        assert!(spec.defines.contains(&("FS_BWD_TMA", 1)));
        assert!(without_tma(spec).defines.contains(&("FS_BWD_TMA", 0)));
        // hd256: 64 keys a CTA, K, V 32 KB each, 4 x 32 KB Q / dO, dS^T and P^T 8 KB each,
        // lse / D 1 KB, no dQ stage, 2 mbarriers, 1 KB alignment: one CTA an SM (227 KB)
        let (_, tile, smem) =
            main_choice(true, 256, DType::BF16, false, false, 90, false, false).expect("covered");
        assert_eq!(tile, SM90_TILE_HD256);
        assert_eq!((tile.block_m, tile.block_n), (64, 64));
        assert_eq!(smem, 65536 + 131072 + 16384 + 1024 + 16 + 1024);
        assert!(smem <= 227 * 1024);
    }

    #[test]
    fn the_wgmma_kernel_gets_the_fragment_order_convert() {
        let frag = |s: &KernelSpec| {
            s.defines
                .iter()
                .find(|&&(k, _)| k == "FS_DQ_FRAG")
                .map(|&(_, v)| v)
        };
        for (hd, bm) in [(128, 64), (64, 128), (256, 64)] {
            for dtype in [DType::F16, DType::BF16] {
                let (main, tile, _) =
                    main_choice(true, hd, dtype, false, false, 90, false, false).expect("main");
                assert_eq!(main.family, FAMILY_SM90);
                assert_eq!(tile.block_m, bm);
                let conv = convert_choice(&main, hd, dtype, 90, false).expect("convert");
                assert_eq!(conv.entry, ENTRY_CONVERT);
                assert_eq!(
                    frag(&conv),
                    Some(bm as i64),
                    "hd {hd}: dQ blocks of block_m rows"
                );
                assert!(sm90_aux_specs(90).contains(&conv), "precompiled");
                // the deterministic walk reads the same order (its convert sums the slices)
                let (main, _, _) =
                    main_choice(true, hd, dtype, false, false, 90, false, true).expect("main");
                assert_eq!(main.family, FAMILY_SM90);
                let det = convert_choice(&main, hd, dtype, 90, false).expect("convert");
                assert_eq!(det, conv);
                // the mma.sync kernel keeps the row-major convert
                let (main, _, _) =
                    main_choice(false, hd, dtype, false, false, 90, false, true).expect("main");
                assert_eq!(main.family, FAMILY);
                let conv = convert_choice(&main, hd, dtype, 90, false).expect("convert");
                assert_eq!(frag(&conv), None);
            }
        }
        // varlen: the fragment-order convert of the packed build
        let (main, _, _) =
            main_choice(true, 128, DType::BF16, false, false, 90, true, false).expect("main");
        let conv = convert_choice(&main, 128, DType::BF16, 90, true).expect("convert");
        assert_eq!(frag(&conv), Some(64));
        assert!(conv.defines.contains(&("FS_VARLEN", 1)));
        assert!(sm90_aux_specs(90).contains(&conv), "precompiled");
        assert_eq!(sm90_aux_specs(90).len(), 12);
        assert!(sm90_aux_specs(80).is_empty());
    }

    #[test]
    fn all_specs_cover_both_aux_entries() {
        let specs = all_specs(90);
        assert!(specs.iter().any(|s| s.entry == ENTRY_PRE));
        assert!(specs.iter().any(|s| s.entry == ENTRY_CONVERT));
        // 6 tiles x 3 dtypes x (2 aux + 2 pads x 2 masks x 2 caps)
        assert_eq!(specs.len(), 6 * 3 * (2 + 8));
    }
}
