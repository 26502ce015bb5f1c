//! Decode attention against a KV cache (`flash_attn_with_kvcache`'s native core): argument
//! checks, tile and split choice, the launches of `cuda/flash_decode.cu` (split-KV attention and
//! the combine of the splits), and the cache geometry and index checks that the append which
//! precedes them (`kvcache_append.rs`) shares.
//!
//! Values inside the int32 index tensors live on the device and are never read here (a host read
//! would synchronise and break graph capture): the kernels clamp or validate every index they
//! read (see the header of cuda/flash_decode.cu).

use crate::error::{type_err, unsupported, value_err, Error, Result};
use crate::ops::attention::head_dim_tile;
use crate::ops::flash_tiles::HEAD_DIM_TILES;
use crate::runtime::{runtime, KernelSpec, StreamChoice};
use crate::tensor::{common_cuda_device, expect_no_overlap, DType, TensorView};

pub const SOURCE: &str = include_str!("../../cuda/flash_decode.cu");
pub const FAMILY: &str = "flash_decode";
pub const ENTRY_MAIN: &str = "flash_decode_kernel";
pub const ENTRY_COMBINE: &str = "flash_decode_combine";
pub const ENTRY_APPEND: &str = "kvcache_append";

/// Threads of the combine (one block of 4 warps per combined row) and append kernels.
pub(crate) const AUX_THREADS: u32 = 128;
/// Splits of the heuristic take at least this many key blocks each (prologue, partial writes and
/// the combine amortised over >= 256 keys).
pub const MIN_BLOCKS_PER_SPLIT: i64 = 4;
/// Upper bound on splits, chosen or forced (bounds the fp32 scratch and the combine's loop).
pub const MAX_SPLITS: i64 = 128;

/// Mirrors `struct FlashDecodeParams` in cuda/flash_decode.cu field for field (264 bytes).
/// Strides in elements; for a paged cache the k/v batch stride is the cache-block stride.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FlashDecodeParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub o_partial: u64,
    pub lse_partial: u64,
    pub seqlens_k: u64,
    pub cache_batch_idx: u64,
    pub cache_leftpad: u64,
    pub block_table: u64,
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
    pub block_table_stride: i64,
    pub batch: i32,
    pub nheads: i32,
    pub nheads_k: i32,
    pub group: i32,
    pub seqlen_q: i32,
    pub head_dim: i32,
    pub cache_rows: i32,
    pub capacity: i32,
    pub block_size: i32,
    pub max_blocks: i32,
    pub num_splits: i32,
    pub m_blocks: i32,
    pub softmax_scale: f32,
    pub softcap: f32,
    pub window_left: i32,
    pub window_right: i32,
    pub seqlens_k_add: i32,
    pub pad_: i32,
}

const _: () = assert!(std::mem::size_of::<FlashDecodeParams>() == 264);

/// Mirrors `struct KvAppendParams` in cuda/flash_decode.cu field for field (320 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KvAppendParams {
    pub k_new: u64,
    pub v_new: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub cache_seqlens: u64,
    pub cache_batch_idx: u64,
    pub cache_leftpad: u64,
    pub block_table: u64,
    pub rotary_cos: u64,
    pub rotary_sin: u64,
    pub q: u64,
    pub q_rot: u64,
    /// k_new, v_new, k_cache, v_cache, q, q_rot: (batch, row, head) strides each.
    pub strides: [i64; 18],
    pub block_table_stride: i64,
    pub cos_row_stride: i64,
    pub sin_row_stride: i64,
    pub batch: i32,
    pub seqlen_new: i32,
    pub nheads_k: i32,
    pub seqlen_q: i32,
    pub nheads: i32,
    pub head_dim: i32,
    pub cache_rows: i32,
    pub capacity: i32,
    pub block_size: i32,
    pub max_blocks: i32,
    pub rotary_dim: i32,
    pub seqlen_ro: i32,
    pub interleaved: i32,
    pub cs_f32: i32,
}

const _: () = assert!(std::mem::size_of::<KvAppendParams>() == 320);

// ---- the cache ---------------------------------------------------------------------------------

/// The cache as the kernels address it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheGeom {
    pub paged: bool,
    pub nheads_k: i64,
    pub head_dim: i64,
    /// Contiguous: batch_cache; paged: num_blocks.
    pub cache_rows: i64,
    /// Keys one sequence can hold: seqlen_cache, or max_blocks * block_size.
    pub capacity: i64,
    /// Paged: keys per block (0 when contiguous).
    pub block_size: i64,
    /// Paged: block_table columns (0 when contiguous).
    pub max_blocks: i64,
}

pub(crate) fn expect_index(name: &str, t: &TensorView, batch: i64) -> Result<()> {
    t.expect_dtype(name, &[DType::I32])?;
    t.expect_rank(name, "batch")?;
    t.expect_shape(name, &[batch])?;
    t.expect_contiguous(name)?;
    if t.ptr % 4 != 0 {
        return Err(value_err(format!(
            "{name} must be 4-byte aligned, got pointer {:#x}",
            t.ptr
        )));
    }
    Ok(())
}

/// Every row start 16-byte aligned and the head dim contiguous (the kernels move rows in
/// 16-byte vectors).
pub(crate) fn expect_rows16(name: &str, t: &TensorView) -> Result<()> {
    t.expect_unit_stride(name, 3, "headdim")?;
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

pub(crate) fn expect_data_dtype(name: &str, t: &TensorView) -> Result<()> {
    match t.dtype {
        DType::F16 | DType::BF16 => Ok(()),
        DType::F32 => Err(unsupported(format!(
            "{name} is float32: the KV-cache kernels take float16 or bfloat16 (the Python layer \
             runs float32 through the reference)"
        ))),
        other => Err(type_err(format!(
            "{name} has dtype {}, allowed: float16, bfloat16",
            other.name()
        ))),
    }
}

/// Checks k_cache / v_cache (and block_table / cache_batch_idx against them) for `batch`
/// sequences; returns the geometry.
pub(crate) fn check_cache(
    k_cache: &TensorView,
    v_cache: &TensorView,
    block_table: Option<&TensorView>,
    cache_batch_idx: Option<&TensorView>,
    batch: i64,
) -> Result<CacheGeom> {
    let layout = if block_table.is_some() {
        "num_blocks, block_size, nheads_k, headdim"
    } else {
        "batch_cache, seqlen_cache, nheads_k, headdim"
    };
    let ks = k_cache.expect_rank("k_cache", layout)?.to_vec();
    v_cache.expect_rank("v_cache", layout)?;
    expect_data_dtype("k_cache", k_cache)?;
    v_cache.expect_same_dtype("v_cache", k_cache, "k_cache")?;
    v_cache.expect_shape("v_cache", &ks)?;
    expect_rows16("k_cache", k_cache)?;
    expect_rows16("v_cache", v_cache)?;
    let (rows, row_len, nheads_k, head_dim) = (ks[0], ks[1], ks[2], ks[3]);
    if nheads_k == 0 {
        return Err(value_err("k_cache has nheads_k = 0"));
    }
    if let Some(bt) = block_table {
        if cache_batch_idx.is_some() {
            return Err(value_err(
                "cache_batch_idx is only supported with a contiguous cache (block_table is given)",
            ));
        }
        bt.expect_dtype("block_table", &[DType::I32])?;
        let bs = bt.expect_rank("block_table", "batch, max_blocks_per_seq")?;
        if bs[0] != batch {
            return Err(value_err(format!(
                "block_table has shape {:?}, expected (batch={batch}, max_blocks_per_seq)",
                bt.shape
            )));
        }
        bt.expect_unit_stride("block_table", 1, "max_blocks_per_seq")?;
        if bt.ptr % 4 != 0 || bt.strides[0] < 0 {
            return Err(value_err(
                "block_table must be 4-byte aligned with rows in order",
            ));
        }
        if row_len == 0 || row_len % 16 != 0 {
            return Err(value_err(format!(
                "paged k_cache has block_size = {row_len}: it must be a positive multiple of 16"
            )));
        }
        if rows == 0 && batch > 0 {
            return Err(value_err("paged k_cache has no blocks (num_blocks = 0)"));
        }
        Ok(CacheGeom {
            paged: true,
            nheads_k,
            head_dim,
            cache_rows: rows,
            capacity: bs[1] * row_len,
            block_size: row_len,
            max_blocks: bs[1],
        })
    } else {
        if let Some(cbi) = cache_batch_idx {
            expect_index("cache_batch_idx", cbi, batch)?;
            if rows == 0 && batch > 0 {
                return Err(value_err("k_cache is empty (batch_cache = 0)"));
            }
        } else if rows < batch {
            return Err(value_err(format!(
                "k_cache has batch_cache = {rows} rows but batch = {batch} (pass cache_batch_idx \
                 to map sequences to cache rows)"
            )));
        }
        Ok(CacheGeom {
            paged: false,
            nheads_k,
            head_dim,
            cache_rows: rows,
            capacity: row_len,
            block_size: 0,
            max_blocks: 0,
        })
    }
}

pub(crate) fn check_head_dim(head_dim: i64) -> Result<()> {
    if head_dim % 8 != 0 || head_dim > 256 || head_dim == 0 {
        return Err(unsupported(format!(
            "headdim = {head_dim} is not supported: it must be a multiple of 8 between 8 and 256"
        )));
    }
    Ok(())
}

pub(crate) fn i32_of(name: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| unsupported(format!("{name} = {v} exceeds 2^31 - 1")))
}

pub(crate) fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

// ---- attention -----------------------------------------------------------------------------------

pub struct KvcacheArgs<'a> {
    pub q: &'a TensorView,
    pub k_cache: &'a TensorView,
    pub v_cache: &'a TensorView,
    pub out: &'a TensorView,
    pub lse: Option<&'a TensorView>,
    pub seqlens_k: &'a TensorView,
    /// Added to every seqlens_k[b] on the device (>= 0): a caller that appended n keys in the
    /// same step passes the cache_seqlens it appended at and n, with no extra array.
    pub seqlens_k_add: i64,
    pub cache_batch_idx: Option<&'a TensorView>,
    pub cache_leftpad: Option<&'a TensorView>,
    pub block_table: Option<&'a TensorView>,
    pub softmax_scale: f32,
    pub window_left: i64,
    pub window_right: i64,
    pub softcap: f32,
    pub num_splits: i64,
}

/// What the checks resolve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeProblem {
    pub batch: i64,
    pub seqlen_q: i64,
    pub nheads: i64,
    pub cache: CacheGeom,
    /// Windows with the bounds that can hide no key dropped (-1).
    pub window_left: i64,
    pub window_right: i64,
}

impl DecodeProblem {
    pub fn group(&self) -> i64 {
        self.nheads / self.cache.nheads_k
    }
}

/// Every check of `flash_attn_kvcache`; pure (no GPU), so it is unit-tested on the CPU.
pub fn check(a: &KvcacheArgs) -> Result<DecodeProblem> {
    let qs = a.q.expect_rank("q", "batch, seqlen_q, nheads, headdim")?;
    let (batch, seqlen_q, nheads, head_dim) = (qs[0], qs[1], qs[2], qs[3]);
    expect_data_dtype("q", a.q)?;
    a.k_cache.expect_same_dtype("k_cache", a.q, "q")?;
    a.out.expect_same_dtype("out", a.q, "q")?;
    a.out.expect_shape("out", &a.q.shape)?;
    check_head_dim(head_dim)?;
    let cache = check_cache(
        a.k_cache,
        a.v_cache,
        a.block_table,
        a.cache_batch_idx,
        batch,
    )?;
    if cache.head_dim != head_dim {
        return Err(value_err(format!(
            "k_cache has headdim {} but q has {head_dim}",
            cache.head_dim
        )));
    }
    if nheads % cache.nheads_k != 0 {
        return Err(value_err(format!(
            "nheads = {nheads} must be a multiple of nheads_k = {} (GQA/MQA)",
            cache.nheads_k
        )));
    }
    expect_index("seqlens_k", a.seqlens_k, batch)?;
    if a.seqlens_k_add < 0 {
        return Err(value_err(format!(
            "seqlens_k_add must be >= 0, got {}",
            a.seqlens_k_add
        )));
    }
    if let Some(lp) = a.cache_leftpad {
        expect_index("cache_leftpad", lp, batch)?;
    }
    expect_rows16("q", a.q)?;
    expect_rows16("out", a.out)?;
    a.out.expect_writable("out")?;
    if let Some(lse) = a.lse {
        lse.expect_dtype("lse", &[DType::F32])?;
        lse.expect_shape("lse", &[batch, nheads, seqlen_q])?;
        lse.expect_contiguous("lse")?;
        lse.expect_writable("lse")?;
    }
    expect_no_overlap(
        &[("out", Some(a.out)), ("lse", a.lse)],
        &[
            ("q", Some(a.q)),
            ("k_cache", Some(a.k_cache)),
            ("v_cache", Some(a.v_cache)),
            ("seqlens_k", Some(a.seqlens_k)),
            ("cache_batch_idx", a.cache_batch_idx),
            ("cache_leftpad", a.cache_leftpad),
            ("block_table", a.block_table),
        ],
    )?;
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
    if !a.softcap.is_finite() || a.softcap < 0.0 {
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
    if a.num_splits < 0 {
        return Err(value_err(format!(
            "num_splits = {}: must be >= 0 (0 = chosen by the heuristic)",
            a.num_splits
        )));
    }
    if cache.capacity + seqlen_q >= (1i64 << 31) {
        return Err(unsupported(
            "cache capacity + seqlen_q must be < 2^31 (positions are 32-bit)",
        ));
    }
    if batch > 65535 || cache.nheads_k > 65535 {
        return Err(unsupported(format!(
            "batch = {batch} / nheads_k = {} is not supported (at most 65535 each)",
            cache.nheads_k
        )));
    }
    // Drop bounds that hide no key (so large values cannot overflow 32-bit position math):
    // query i sits at position hi - seqlen_q + i < capacity; a left window >= capacity reaches
    // before key 0 for every query, a right window >= seqlen_q - 1 past the last key.
    let left = if a.window_left >= cache.capacity {
        -1
    } else {
        a.window_left
    };
    let right = if a.window_right >= seqlen_q - 1 {
        -1
    } else {
        a.window_right
    };
    Ok(DecodeProblem {
        batch,
        seqlen_q,
        nheads,
        cache,
        window_left: left,
        window_right: right,
    })
}

/// Tile of the attention kernel: `block_m` packed (query, group head) rows, `block_n` keys per
/// K/V tile, `warps` (a `block_m / 16` x rest grid: rows x key slices), `stages` K/V buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeTile {
    pub block_m: u32,
    pub block_n: u32,
    pub warps: u32,
    pub stages: u32,
}

/// Rows (seqlen_q * group) up to this go to the 16-row tile (decode); more to the 64-row one.
pub const SMALL_ROWS: i64 = 16;

const fn dt(block_m: u32, block_n: u32, warps: u32, stages: u32) -> DecodeTile {
    DecodeTile {
        block_m,
        block_n,
        warps,
        stages,
    }
}

/// The tile per head-dim tile, arch (cc * 10) and rows per kv head (seqlen_q * group).
/// Not yet measured (2026-11-23): chosen by byte counts. A 64-key tile of K and V is 32 KB at
/// hd128; 3 stages keep two tiles (64 KB) in flight per CTA while one is consumed, and two CTAs
/// fit an H100 SM (228 KB), which is far above the ~20 KB per SM that 3 TB/s at ~1 us latency
/// needs. hd > 128 uses 2 stages (a tile is twice the bytes). sm_80 (163 KB) and the 99 KB
/// consumer parts shrink the tiles that would not fit.
pub fn decode_tile(head_dim_tile: u32, arch: u32, rows: i64) -> DecodeTile {
    let small = rows <= SMALL_ROWS;
    let big_hd = head_dim_tile > 128;
    match arch {
        90 | 100 | 101 | 103 => match (small, big_hd) {
            (true, false) => dt(16, 64, 4, 3),
            (true, true) => dt(16, 64, 4, 2),
            (false, false) => dt(64, 64, 4, 3),
            (false, true) => dt(64, 64, 4, 2),
        },
        80 | 87 => match (small, big_hd) {
            (true, false) => dt(16, 64, 4, 3),
            (true, true) => dt(16, 64, 4, 2),
            (false, false) => dt(64, 64, 4, 3),
            (false, true) => dt(64, 32, 4, 2),
        },
        _ => match (small, big_hd) {
            (true, false) => dt(16, 64, 4, 2),
            (true, true) => dt(16, 32, 2, 2),
            (false, false) => dt(64, 64, 4, 2),
            (false, true) => dt(32, 32, 2, 2),
        },
    }
}

impl DecodeTile {
    /// Dynamic shared memory, as `kSmemBytes` in cuda/flash_decode.cu: Q tile, merge statistics,
    /// and the larger of the K/V stages and the fp32 merge rows.
    pub fn smem_bytes(&self, head_dim_tile: u32) -> u32 {
        let row = head_dim_tile * 2 + 16;
        let warps_n = self.warps / (self.block_m / 16);
        let q = self.block_m * row;
        let stats = (2 * warps_n + 2) * self.block_m * 4;
        let stages = self.stages * 2 * self.block_n * row;
        let merge = warps_n * self.block_m * (head_dim_tile + 4) * 4;
        q + stats + stages.max(merge)
    }
}

/// The split count. `forced` >= 1 is the caller's (clamped to [1, min(n_blocks, MAX_SPLITS)]);
/// 0 asks the heuristic: with `ctas` = batch * nheads_k * m_blocks CTAs unsplit and `slots` =
/// CTAs the GPU holds at once (SMs x CTAs per SM), a problem that fills the slots is not split;
/// otherwise the splits s (each >= MIN_BLOCKS_PER_SPLIT key blocks of the longest possible
/// sequence, at most MAX_SPLITS) are scored by wave efficiency w / ceil(w), w = ctas * s / slots,
/// and the smallest s within 90% of the best wins (fewer splits: less combine work and scratch).
/// Decode is bandwidth-bound: what matters is every SM streaming K/V for the whole call.
pub fn choose_splits(forced: i64, ctas: i64, slots: i64, n_blocks: i64) -> i64 {
    let limit = n_blocks.clamp(1, MAX_SPLITS);
    if forced >= 1 {
        return forced.min(limit);
    }
    if ctas >= slots || n_blocks <= 1 {
        return 1;
    }
    let cap = (n_blocks / MIN_BLOCKS_PER_SPLIT).clamp(1, MAX_SPLITS);
    let eff = |s: i64| {
        let w = (ctas * s) as f64 / slots.max(1) as f64;
        w / w.ceil()
    };
    let best = (1..=cap).map(eff).fold(0.0, f64::max);
    (1..=cap).find(|&s| eff(s) >= 0.9 * best).unwrap_or(1)
}

/// Launch plan of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodePlan {
    pub tile: DecodeTile,
    pub head_dim_tile: i64,
    pub smem: u32,
    pub m_blocks: i64,
    pub num_splits: i64,
    pub grid: (u32, u32, u32),
    /// fp32 scratch: partial O at 0, partial LSE at `lse_off`, `scratch_bytes` in all (0: none).
    pub lse_off: i64,
    pub scratch_bytes: i64,
}

/// The plan for a checked problem on a GPU with `sm_count` SMs and `smem_per_sm` bytes of
/// shared memory per SM. CTAs per SM for the heuristic: as many as shared memory allows, at
/// most 2 (the 16-row tiles use ~170 registers x 128 threads).
pub fn plan(
    p: &DecodeProblem,
    arch: u32,
    sm_count: i64,
    smem_per_sm: i64,
    num_splits: i64,
) -> Result<DecodePlan> {
    let hdt = head_dim_tile(p.cache.head_dim);
    let rows = p.seqlen_q * p.group();
    let tile = decode_tile(hdt as u32, arch, rows);
    let smem = tile.smem_bytes(hdt as u32);
    let m_blocks = cdiv(rows, tile.block_m as i64);
    let ctas = p.batch * p.cache.nheads_k * m_blocks;
    let per_sm = (smem_per_sm / (smem as i64 + 1024)).clamp(1, 2);
    let n_blocks = cdiv(p.cache.capacity, tile.block_n as i64);
    let splits = choose_splits(num_splits, ctas, sm_count.max(1) * per_sm, n_blocks);
    let too_big = |_| unsupported("problem too large for one launch of the decode attention");
    let grid = (
        u32::try_from(m_blocks * splits).map_err(too_big)?,
        u32::try_from(p.cache.nheads_k).map_err(too_big)?,
        u32::try_from(p.batch).map_err(too_big)?,
    );
    let (lse_off, scratch_bytes) = if splits > 1 {
        let all_rows = splits * p.batch * p.nheads * p.seqlen_q;
        let o_bytes = cdiv(all_rows * p.cache.head_dim * 4, 256) * 256;
        (o_bytes, o_bytes + all_rows * 4)
    } else {
        (0, 0)
    };
    Ok(DecodePlan {
        tile,
        head_dim_tile: hdt,
        smem,
        m_blocks,
        num_splits: splits,
        grid,
        lse_off,
        scratch_bytes,
    })
}

/// The attention kernel's variant for a tile.
pub fn main_spec(
    hdt: i64,
    tile: DecodeTile,
    dtype: DType,
    softcap: bool,
    arch_num: i64,
) -> Result<KernelSpec> {
    Ok(KernelSpec {
        family: FAMILY,
        source: SOURCE,
        entry: ENTRY_MAIN,
        defines: vec![
            ("FS_HEAD_DIM", hdt),
            ("FS_DTYPE", dtype.kernel_code()?),
            ("FS_BLOCK_M", tile.block_m as i64),
            ("FS_BLOCK_N", tile.block_n as i64),
            ("FS_NWARPS", tile.warps as i64),
            ("FS_STAGES", tile.stages as i64),
            ("FS_HAS_SOFTCAP", softcap as i64),
            ("FS_ARCH", arch_num),
        ],
    })
}

/// The combine / append variant (dtype only).
pub fn aux_spec(dtype: DType, arch_num: i64, entry: &'static str) -> Result<KernelSpec> {
    Ok(KernelSpec {
        family: FAMILY,
        source: SOURCE,
        entry,
        defines: vec![
            ("FS_DTYPE", dtype.kernel_code()?),
            ("FS_AUX_ONLY", 1),
            ("FS_ARCH", arch_num),
        ],
    })
}

/// Every variant of the family for one arch, with whether it is a main variant (must not spill:
/// the attention kernels at hd64 / hd128 and the two small kernels).
pub fn all_specs(arch_num: i64) -> Vec<(KernelSpec, bool)> {
    let mut out: Vec<(KernelSpec, bool)> = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for entry in [ENTRY_COMBINE, ENTRY_APPEND] {
            if let Ok(s) = aux_spec(dtype, arch_num, entry) {
                out.push((s, true));
            }
        }
        for &hdt in HEAD_DIM_TILES {
            for rows in [1, SMALL_ROWS + 1] {
                let tile = decode_tile(hdt as u32, arch_num as u32, rows);
                for cap in [false, true] {
                    if let Ok(s) = main_spec(hdt, tile, dtype, cap, arch_num) {
                        if !out.iter().any(|(o, _)| *o == s) {
                            out.push((s, hdt == 64 || hdt == 128));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Checks, plans, launches the attention (and the combine when the keys are split). Scratch for
/// the partials comes from the stream-ordered pool and is freed on the stream: no host sync, so
/// the call is CUDA-graph capturable.
pub fn attention(a: &KvcacheArgs, stream: StreamChoice) -> Result<()> {
    let p = check(a)?;
    if p.batch == 0 || p.seqlen_q == 0 || p.nheads == 0 {
        return Ok(());
    }
    let device = common_cuda_device(&[
        ("q", Some(a.q)),
        ("k_cache", Some(a.k_cache)),
        ("v_cache", Some(a.v_cache)),
        ("out", Some(a.out)),
        ("lse", a.lse),
        ("seqlens_k", Some(a.seqlens_k)),
        ("cache_batch_idx", a.cache_batch_idx),
        ("cache_leftpad", a.cache_leftpad),
        ("block_table", a.block_table),
    ])?;
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    // The device's context stays current for the whole call (loads, scratch, launches, frees)
    // and the caller's is current again when this returns.
    let _bound = dev.bind()?;
    let arch_num = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let pl = plan(
        &p,
        arch_num as u32,
        dev.props.sm_count as i64,
        dev.props.max_smem_optin as i64 + 1024,
        a.num_splits,
    )?;
    let main_k = dev.kernel(&main_spec(
        pl.head_dim_tile,
        pl.tile,
        a.q.dtype,
        a.softcap > 0.0,
        arch_num,
    )?)?;
    let g = &p.cache;
    let mut params = FlashDecodeParams {
        q: a.q.ptr,
        k: a.k_cache.ptr,
        v: a.v_cache.ptr,
        o: a.out.ptr,
        lse: a.lse.map_or(0, |l| l.ptr),
        seqlens_k: a.seqlens_k.ptr,
        cache_batch_idx: a.cache_batch_idx.map_or(0, |t| t.ptr),
        cache_leftpad: a.cache_leftpad.map_or(0, |t| t.ptr),
        block_table: a.block_table.map_or(0, |t| t.ptr),
        q_batch_stride: a.q.strides[0],
        q_row_stride: a.q.strides[1],
        q_head_stride: a.q.strides[2],
        k_batch_stride: a.k_cache.strides[0],
        k_row_stride: a.k_cache.strides[1],
        k_head_stride: a.k_cache.strides[2],
        v_batch_stride: a.v_cache.strides[0],
        v_row_stride: a.v_cache.strides[1],
        v_head_stride: a.v_cache.strides[2],
        o_batch_stride: a.out.strides[0],
        o_row_stride: a.out.strides[1],
        o_head_stride: a.out.strides[2],
        block_table_stride: a.block_table.map_or(0, |t| t.strides[0]),
        batch: i32_of("batch", p.batch)?,
        nheads: i32_of("nheads", p.nheads)?,
        nheads_k: i32_of("nheads_k", g.nheads_k)?,
        group: i32_of("nheads / nheads_k", p.group())?,
        seqlen_q: i32_of("seqlen_q", p.seqlen_q)?,
        head_dim: i32_of("headdim", g.head_dim)?,
        cache_rows: i32_of("k_cache.shape[0]", g.cache_rows)?,
        capacity: i32_of("cache capacity", g.capacity)?,
        block_size: i32_of("block_size", g.block_size)?,
        max_blocks: i32_of("max_blocks_per_seq", g.max_blocks)?,
        num_splits: pl.num_splits as i32,
        m_blocks: i32_of("m_blocks", pl.m_blocks)?,
        softmax_scale: a.softmax_scale,
        softcap: a.softcap,
        window_left: p.window_left as i32,
        window_right: p.window_right as i32,
        seqlens_k_add: i32_of("seqlens_k_add", a.seqlens_k_add)?,
        pad_: 0,
        ..Default::default()
    };
    let block = (pl.tile.warps * 32, 1, 1);
    let s = dev.stream(stream)?;
    if pl.num_splits == 1 {
        // SAFETY: params mirrors the kernel's struct; every tensor was checked above (shape,
        // dtype, strides, alignment, device); device index values are validated in-kernel.
        unsafe { dev.launch(&main_k, pl.grid, block, pl.smem, s, &params)? };
        return dev.finish(stream);
    }
    let combine_k = dev.kernel(&aux_spec(a.q.dtype, arch_num, ENTRY_COMBINE)?)?;
    let rows = p.batch * p.nheads * p.seqlen_q;
    // one block of AUX_THREADS / 32 warps per combined row
    let combine_grid = (
        u32::try_from(rows).map_err(|_| unsupported("too many rows for the decode combine"))?,
        1,
        1,
    );
    let mut scratch = dev.scratch(s)?;
    let base = scratch.alloc(pl.scratch_bytes as usize)?;
    params.o_partial = base;
    params.lse_partial = base + pl.lse_off as u64;
    // SAFETY: as above; the scratch holds the plan's partial O and LSE for num_splits splits.
    let launched = (|| unsafe {
        dev.launch(&main_k, pl.grid, block, pl.smem, s, &params)?;
        dev.launch(&combine_k, combine_grid, (AUX_THREADS, 1, 1), 0, s, &params)
    })();
    scratch.free()?; // ordered after both launches on the same stream
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

    /// q, k_cache, v_cache, out, lse, seqlens_k, block_table at disjoint addresses.
    struct Set {
        t: Vec<TensorView>,
    }

    fn set(b: i64, sq: i64, h: i64, hk: i64, d: i64, paged: Option<(i64, i64, i64)>) -> Set {
        let cache: Vec<i64> = match paged {
            Some((blocks, bs, _)) => vec![blocks, bs, hk, d],
            None => vec![b, 1000, hk, d],
        };
        let mut t = vec![
            view(&[b, sq, h, d], 0x1000_0000, DType::BF16),
            view(&cache, 0x2000_0000, DType::BF16),
            view(&cache, 0x6000_0000, DType::BF16),
            view(&[b, sq, h, d], 0xa000_0000, DType::BF16),
            view(&[b, h, sq], 0xb000_0000, DType::F32),
            view(&[b], 0xc000_0000, DType::I32),
        ];
        if let Some((_, _, max_blocks)) = paged {
            t.push(view(&[b, max_blocks], 0xd000_0000, DType::I32));
        }
        Set { t }
    }

    fn args(s: &Set, left: i64, right: i64) -> KvcacheArgs<'_> {
        KvcacheArgs {
            q: &s.t[0],
            k_cache: &s.t[1],
            v_cache: &s.t[2],
            out: &s.t[3],
            lse: Some(&s.t[4]),
            seqlens_k: &s.t[5],
            seqlens_k_add: 0,
            cache_batch_idx: None,
            cache_leftpad: None,
            block_table: s.t.get(6),
            softmax_scale: 0.125,
            window_left: left,
            window_right: right,
            softcap: 0.0,
            num_splits: 0,
        }
    }

    fn err_of(r: Result<DecodeProblem>) -> String {
        r.expect_err("should fail").to_string()
    }

    #[test]
    fn checks_accept_contiguous_and_paged() {
        let s = set(3, 1, 32, 8, 128, None);
        let p = check(&args(&s, -1, 0)).expect("valid");
        assert_eq!(
            (p.cache.capacity, p.group(), p.cache.paged),
            (1000, 4, false)
        );
        // causal decode (one query) hides nothing: no mask bound
        assert_eq!((p.window_left, p.window_right), (-1, -1));
        let s = set(3, 4, 32, 8, 128, Some((40, 64, 10)));
        let p = check(&args(&s, 5000, 0)).expect("valid");
        assert_eq!(
            (p.cache.capacity, p.cache.block_size, p.cache.cache_rows),
            (640, 64, 40)
        );
        assert_eq!((p.window_left, p.window_right), (-1, 0));
    }

    #[test]
    fn checks_name_the_bad_argument() {
        let mut s = set(2, 1, 8, 2, 64, None);
        s.t[5].dtype = DType::F32;
        assert!(err_of(check(&args(&s, -1, -1))).contains("seqlens_k"));
        let mut s = set(2, 1, 8, 2, 64, None);
        s.t[5].shape = vec![3];
        assert!(err_of(check(&args(&s, -1, -1))).contains("seqlens_k"));
        let mut s = set(2, 1, 8, 3, 64, None);
        s.t[2].shape[2] = 3;
        assert!(err_of(check(&args(&s, -1, -1))).contains("multiple of nheads_k"));
        let mut s = set(2, 1, 8, 2, 64, None);
        s.t[3].ptr = s.t[0].ptr; // out aliases q
        assert!(err_of(check(&args(&s, -1, -1))).contains("out overlaps q"));
        let mut s = set(2, 1, 8, 2, 64, None);
        s.t[1].shape[0] = 1; // fewer cache rows than batch, no cache_batch_idx
        s.t[2].shape[0] = 1;
        assert!(err_of(check(&args(&s, -1, -1))).contains("batch_cache"));
        let mut s = set(2, 1, 8, 2, 64, Some((10, 24, 4)));
        s.t[1].strides = crate::dlpack::compact_strides(&s.t[1].shape);
        assert!(err_of(check(&args(&s, -1, -1))).contains("block_size"));
        let s = set(2, 1, 8, 2, 72, None);
        let mut a = args(&s, -1, -1);
        let (mut q, mut o) = (s.t[0].clone(), s.t[3].clone());
        q.dtype = DType::F32;
        o.dtype = DType::F32;
        a.q = &q;
        a.out = &o;
        match check(&a) {
            Err(Error::Unsupported(m)) => assert!(m.contains("float32")),
            other => panic!("{other:?}"),
        }
        let mut s = set(2, 1, 8, 2, 64, None);
        s.t[0].ptr += 8; // q rows not 16-byte aligned
        assert!(err_of(check(&args(&s, -1, -1))).contains("16-byte"));
        let s = set(2, 1, 8, 2, 64, None);
        let mut a = args(&s, -1, -1);
        a.num_splits = -1;
        assert!(err_of(check(&a)).contains("num_splits"));
        let s = set(2, 1, 8, 2, 64, Some((10, 16, 4)));
        let cbi = view(&[2], 0xe000_0000, DType::I32);
        let mut a = args(&s, -1, -1);
        a.cache_batch_idx = Some(&cbi);
        assert!(err_of(check(&a)).contains("cache_batch_idx"));
        let s = set(2, 1, 8, 2, 100, None);
        match check(&args(&s, -1, -1)) {
            Err(Error::Unsupported(m)) => assert!(m.contains("headdim")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn split_heuristic() {
        // forced: clamped to the key blocks and MAX_SPLITS
        assert_eq!(choose_splits(7, 8, 264, 100), 7);
        assert_eq!(choose_splits(7, 8, 264, 3), 3);
        assert_eq!(choose_splits(1000, 8, 264, 10_000), MAX_SPLITS);
        // a full GPU is not split
        assert_eq!(choose_splits(0, 512, 264, 16), 1);
        assert_eq!(choose_splits(0, 264, 264, 512), 1);
        // b1, 8 kv heads, 32k cache (512 blocks): ~one full wave of 264 slots
        let s = choose_splits(0, 8, 264, 512);
        assert!((30..=33).contains(&s), "{s}");
        // b8, 8 kv heads, 8k cache: 4 splits = 256 CTAs (5 would start a second, mostly empty wave)
        assert_eq!(choose_splits(0, 64, 264, 128), 4);
        // b32, 8 kv heads: 256 CTAs already nearly fill 264 slots
        assert_eq!(choose_splits(0, 256, 264, 64), 1);
        // short caches: each split keeps >= MIN_BLOCKS_PER_SPLIT blocks
        assert_eq!(choose_splits(0, 1, 264, 7), 1);
        assert!(choose_splits(0, 1, 264, 64) <= 64 / MIN_BLOCKS_PER_SPLIT);
    }

    #[test]
    fn plan_and_scratch() {
        let s = set(1, 1, 32, 8, 128, None);
        let mut p = check(&args(&s, -1, -1)).expect("valid");
        p.cache.capacity = 32768;
        let pl = plan(&p, 90, 132, 233_472, 0).expect("plan");
        assert_eq!(pl.tile, dt(16, 64, 4, 3));
        assert_eq!(pl.m_blocks, 1);
        assert_eq!(pl.grid, (pl.num_splits as u32, 8, 1));
        let rows = pl.num_splits * 32;
        assert_eq!(pl.lse_off, cdiv(rows * 128 * 4, 256) * 256);
        assert_eq!(pl.scratch_bytes, pl.lse_off + rows * 4);
        // forced single split: no scratch
        let pl = plan(&p, 90, 132, 233_472, 1).expect("plan");
        assert_eq!((pl.num_splits, pl.scratch_bytes), (1, 0));
        // seqlen_q 13 x group 4 = 52 rows: one 64-row block
        let s = set(1, 13, 32, 8, 128, None);
        let p = check(&args(&s, -1, 0)).expect("valid");
        let pl = plan(&p, 90, 132, 233_472, 2).expect("plan");
        assert_eq!((pl.tile.block_m, pl.m_blocks, pl.grid.0), (64, 1, 2));
        // 16 x 8 = 128 rows: two adjacent M blocks per split
        let s = set(1, 16, 64, 8, 128, None);
        let p = check(&args(&s, -1, 0)).expect("valid");
        let pl = plan(&p, 90, 132, 233_472, 3).expect("plan");
        assert_eq!((pl.m_blocks, pl.grid.0), (2, 6));
    }

    #[test]
    fn every_tile_fits_and_matches_the_kernel_asserts() {
        for (arch, limit) in [(90, 232_448), (80, 166_912), (86, 101_376), (89, 101_376)] {
            for &hd in HEAD_DIM_TILES {
                for rows in [1, 16, 17, 128] {
                    let t = decode_tile(hd as u32, arch, rows);
                    let smem = t.smem_bytes(hd as u32);
                    assert!(
                        smem <= limit,
                        "sm_{arch} hd{hd} rows{rows}: {smem} > {limit}"
                    );
                    let warps_m = t.block_m / 16;
                    assert_eq!(t.block_m % 16, 0);
                    assert_eq!(t.warps % warps_m, 0);
                    assert_eq!((t.block_n / (t.warps / warps_m)) % 16, 0);
                    assert!((2..=4).contains(&t.stages));
                }
            }
        }
        // hd128 decode on Hopper: Q 16 rows + stats + 3 x (K, V) 64-key tiles
        assert_eq!(
            dt(16, 64, 4, 3).smem_bytes(128),
            16 * 272 + 10 * 16 * 4 + 3 * 2 * 64 * 272
        );
    }
}
