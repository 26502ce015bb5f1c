//! The KV-cache append of `flash_attn_with_kvcache` (`kvcache_append` in cuda/flash_decode.cu):
//! new keys and values written into the cache at `cache_seqlens` (through `block_table` when
//! paged), rotary applied to the new keys and to q. Shares the cache geometry, index checks and
//! kernel specs with the decode attention in `attention_decode`.

use crate::error::{type_err, unsupported, value_err, Error, Result};
use crate::ops::attention_decode::{
    aux_spec, cdiv, check_cache, check_head_dim, expect_index, expect_rows16, i32_of, CacheGeom,
    KvAppendParams, AUX_THREADS, ENTRY_APPEND,
};
use crate::runtime::{runtime, StreamChoice};
use crate::tensor::{common_cuda_device, expect_no_overlap, DType, TensorView};

pub struct AppendArgs<'a> {
    pub k_new: Option<&'a TensorView>,
    pub v_new: Option<&'a TensorView>,
    pub k_cache: &'a TensorView,
    pub v_cache: &'a TensorView,
    pub cache_seqlens: &'a TensorView,
    pub cache_batch_idx: Option<&'a TensorView>,
    pub cache_leftpad: Option<&'a TensorView>,
    pub block_table: Option<&'a TensorView>,
    pub rotary_cos: Option<&'a TensorView>,
    pub rotary_sin: Option<&'a TensorView>,
    pub rotary_interleaved: bool,
    pub q: Option<&'a TensorView>,
    pub q_rot: Option<&'a TensorView>,
}

/// What the append checks resolve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendProblem {
    pub batch: i64,
    pub seqlen_new: i64,
    pub seqlen_q: i64,
    pub nheads: i64,
    pub cache: CacheGeom,
    pub rotary_dim: i64,
    pub seqlen_ro: i64,
}

fn both_or_neither<'a>(
    a: (&str, Option<&'a TensorView>),
    b: (&str, Option<&'a TensorView>),
) -> Result<Option<(&'a TensorView, &'a TensorView)>> {
    match (a.1, b.1) {
        (Some(x), Some(y)) => Ok(Some((x, y))),
        (None, None) => Ok(None),
        _ => Err(value_err(format!(
            "{} and {} must be given together (or both be None)",
            a.0, b.0
        ))),
    }
}

/// Every check of `kvcache_append`; pure (no GPU).
pub fn check_append(a: &AppendArgs) -> Result<AppendProblem> {
    let kv = both_or_neither(("k_new", a.k_new), ("v_new", a.v_new))?;
    let qq = both_or_neither(("q", a.q), ("q_rot", a.q_rot))?;
    let rot = both_or_neither(("rotary_cos", a.rotary_cos), ("rotary_sin", a.rotary_sin))?;
    let batch = match (kv, qq) {
        (Some((k, _)), _) => k.expect_rank("k_new", "batch, seqlen_new, nheads_k, headdim")?[0],
        (None, Some((q, _))) => q.expect_rank("q", "batch, seqlen_q, nheads, headdim")?[0],
        (None, None) => a.cache_seqlens.shape.first().copied().unwrap_or(0),
    };
    let cache = check_cache(
        a.k_cache,
        a.v_cache,
        a.block_table,
        a.cache_batch_idx,
        batch,
    )?;
    check_head_dim(cache.head_dim)?;
    a.k_cache.expect_writable("k_cache")?;
    a.v_cache.expect_writable("v_cache")?;
    expect_index("cache_seqlens", a.cache_seqlens, batch)?;
    if let Some(lp) = a.cache_leftpad {
        expect_index("cache_leftpad", lp, batch)?;
    }
    let mut seqlen_new = 0;
    if let Some((k, v)) = kv {
        let ks = k.expect_rank("k_new", "batch, seqlen_new, nheads_k, headdim")?;
        v.expect_rank("v_new", "batch, seqlen_new, nheads_k, headdim")?;
        if ks[2] != cache.nheads_k || ks[3] != cache.head_dim {
            return Err(value_err(format!(
                "k_new has shape {:?}, expected (batch, seqlen_new, nheads_k={}, headdim={}) to \
                 match k_cache",
                k.shape, cache.nheads_k, cache.head_dim
            )));
        }
        v.expect_shape("v_new", &k.shape)?;
        k.expect_same_dtype("k_new", a.k_cache, "k_cache")?;
        v.expect_same_dtype("v_new", a.k_cache, "k_cache")?;
        expect_rows16("k_new", k)?;
        expect_rows16("v_new", v)?;
        seqlen_new = ks[1];
    }
    let (mut seqlen_q, mut nheads) = (0, 0);
    if let Some((q, q_rot)) = qq {
        let qs = q.expect_rank("q", "batch, seqlen_q, nheads, headdim")?;
        if qs[0] != batch || qs[3] != cache.head_dim {
            return Err(value_err(format!(
                "q has shape {:?}, expected (batch={batch}, seqlen_q, nheads, headdim={})",
                q.shape, cache.head_dim
            )));
        }
        q.expect_same_dtype("q", a.k_cache, "k_cache")?;
        q_rot.expect_same_dtype("q_rot", q, "q")?;
        q_rot.expect_shape("q_rot", &q.shape)?;
        q_rot.expect_writable("q_rot")?;
        expect_rows16("q", q)?;
        expect_rows16("q_rot", q_rot)?;
        (seqlen_q, nheads) = (qs[1], qs[2]);
    }
    let (mut rotary_dim, mut seqlen_ro) = (0, 0);
    if let Some((cos, sin)) = rot {
        let cs = cos.expect_rank("rotary_cos", "seqlen_ro, rotary_dim / 2")?;
        sin.expect_shape("rotary_sin", cs)?;
        let data = a.k_cache.dtype;
        for (name, t) in [("rotary_cos", cos), ("rotary_sin", sin)] {
            if t.dtype != data && t.dtype != DType::F32 {
                return Err(type_err(format!(
                    "{name} has dtype {}, allowed: {} (as the cache) or float32",
                    t.dtype.name(),
                    data.name()
                )));
            }
            t.expect_unit_stride(name, 1, "rotary_dim / 2")?;
            if t.strides[0] < 0 {
                return Err(value_err(format!("{name} must have rows in order")));
            }
        }
        sin.expect_same_dtype("rotary_sin", cos, "rotary_cos")?;
        (seqlen_ro, rotary_dim) = (cs[0], 2 * cs[1]);
        if rotary_dim == 0 || rotary_dim > cache.head_dim {
            return Err(value_err(format!(
                "rotary_dim = {rotary_dim} (2 * rotary_cos.shape[1]) must be in [2, headdim = {}]",
                cache.head_dim
            )));
        }
    }
    // k_cache and v_cache may be two views of one stacked tensor (their spans overlap while their
    // elements do not), so they are checked against the inputs and q_rot, not against each other.
    let inputs = [
        ("k_new", a.k_new),
        ("v_new", a.v_new),
        ("q", a.q),
        ("rotary_cos", a.rotary_cos),
        ("rotary_sin", a.rotary_sin),
        ("cache_seqlens", Some(a.cache_seqlens)),
        ("cache_batch_idx", a.cache_batch_idx),
        ("cache_leftpad", a.cache_leftpad),
        ("block_table", a.block_table),
    ];
    expect_no_overlap(&[("q_rot", a.q_rot)], &inputs)?;
    let mut with_q_rot = inputs.to_vec();
    with_q_rot.push(("q_rot", a.q_rot));
    expect_no_overlap(&[("k_cache", Some(a.k_cache))], &with_q_rot)?;
    expect_no_overlap(&[("v_cache", Some(a.v_cache))], &with_q_rot)?;
    if cache.capacity + seqlen_new.max(seqlen_q) >= (1i64 << 31) {
        return Err(unsupported(
            "cache capacity + seqlen_new must be < 2^31 (positions are 32-bit)",
        ));
    }
    Ok(AppendProblem {
        batch,
        seqlen_new,
        seqlen_q,
        nheads,
        cache,
        rotary_dim,
        seqlen_ro,
    })
}

/// Checks and launches the append (k_new / v_new into the cache, rotary, q -> q_rot).
pub fn append(a: &AppendArgs, stream: StreamChoice) -> Result<()> {
    let p = check_append(a)?;
    let chunks = p.cache.head_dim / 8;
    let kv_items = p.batch * p.seqlen_new * p.cache.nheads_k * chunks;
    let q_items = p.batch * p.seqlen_q * p.nheads * chunks;
    let items = kv_items.max(q_items);
    if items == 0 {
        return Ok(());
    }
    let device = common_cuda_device(&[
        ("k_new", a.k_new),
        ("v_new", a.v_new),
        ("k_cache", Some(a.k_cache)),
        ("v_cache", Some(a.v_cache)),
        ("cache_seqlens", Some(a.cache_seqlens)),
        ("cache_batch_idx", a.cache_batch_idx),
        ("cache_leftpad", a.cache_leftpad),
        ("block_table", a.block_table),
        ("rotary_cos", a.rotary_cos),
        ("rotary_sin", a.rotary_sin),
        ("q", a.q),
        ("q_rot", a.q_rot),
    ])?;
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    // The device's context stays current for the whole call (loads, scratch, launches, frees)
    // and the caller's is current again when this returns.
    let _bound = dev.bind()?;
    let arch_num = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let kernel = dev.kernel(&aux_spec(a.k_cache.dtype, arch_num, ENTRY_APPEND)?)?;
    let mut strides = [0i64; 18];
    for (i, t) in [
        a.k_new,
        a.v_new,
        Some(a.k_cache),
        Some(a.v_cache),
        a.q,
        a.q_rot,
    ]
    .iter()
    .enumerate()
    {
        if let Some(t) = t {
            strides[3 * i..3 * i + 3].copy_from_slice(&t.strides[..3]);
        }
    }
    let g = &p.cache;
    let params = KvAppendParams {
        k_new: a.k_new.map_or(0, |t| t.ptr),
        v_new: a.v_new.map_or(0, |t| t.ptr),
        k_cache: a.k_cache.ptr,
        v_cache: a.v_cache.ptr,
        cache_seqlens: a.cache_seqlens.ptr,
        cache_batch_idx: a.cache_batch_idx.map_or(0, |t| t.ptr),
        cache_leftpad: a.cache_leftpad.map_or(0, |t| t.ptr),
        block_table: a.block_table.map_or(0, |t| t.ptr),
        rotary_cos: a.rotary_cos.map_or(0, |t| t.ptr),
        rotary_sin: a.rotary_sin.map_or(0, |t| t.ptr),
        q: a.q.map_or(0, |t| t.ptr),
        q_rot: a.q_rot.map_or(0, |t| t.ptr),
        strides,
        block_table_stride: a.block_table.map_or(0, |t| t.strides[0]),
        cos_row_stride: a.rotary_cos.map_or(0, |t| t.strides[0]),
        sin_row_stride: a.rotary_sin.map_or(0, |t| t.strides[0]),
        batch: i32_of("batch", p.batch)?,
        seqlen_new: i32_of("seqlen_new", p.seqlen_new)?,
        nheads_k: i32_of("nheads_k", g.nheads_k)?,
        seqlen_q: i32_of("seqlen_q", p.seqlen_q)?,
        nheads: i32_of("nheads", p.nheads)?,
        head_dim: i32_of("headdim", g.head_dim)?,
        cache_rows: i32_of("k_cache.shape[0]", g.cache_rows)?,
        capacity: i32_of("cache capacity", g.capacity)?,
        block_size: i32_of("block_size", g.block_size)?,
        max_blocks: i32_of("max_blocks_per_seq", g.max_blocks)?,
        rotary_dim: i32_of("rotary_dim", p.rotary_dim)?,
        seqlen_ro: i32_of("seqlen_ro", p.seqlen_ro)?,
        interleaved: a.rotary_interleaved as i32,
        cs_f32: a.rotary_cos.is_some_and(|t| t.dtype == DType::F32) as i32,
    };
    let grid = (
        u32::try_from(cdiv(items, AUX_THREADS as i64))
            .map_err(|_| unsupported("too many rows for kvcache_append"))?,
        2,
        1,
    );
    let s = dev.stream(stream)?;
    // SAFETY: params mirrors the kernel's struct; every tensor was checked above (shape, dtype,
    // strides, alignment, device); device index values are validated in-kernel.
    unsafe { dev.launch(&kernel, grid, (AUX_THREADS, 1, 1), 0, s, &params)? };
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

    fn append_views() -> Vec<TensorView> {
        vec![
            view(&[2, 3, 2, 64], 0x1000_0000, DType::F16), // k_new
            view(&[2, 3, 2, 64], 0x1100_0000, DType::F16), // v_new
            view(&[4, 100, 2, 64], 0x2000_0000, DType::F16), // k_cache
            view(&[4, 100, 2, 64], 0x3000_0000, DType::F16), // v_cache
            view(&[2], 0x4000_0000, DType::I32),           // cache_seqlens
            view(&[500, 16], 0x5000_0000, DType::F32),     // cos
            view(&[500, 16], 0x5100_0000, DType::F32),     // sin
            view(&[2, 1, 8, 64], 0x6000_0000, DType::F16), // q
            view(&[2, 1, 8, 64], 0x7000_0000, DType::F16), // q_rot
        ]
    }

    fn append_args(v: &[TensorView]) -> AppendArgs<'_> {
        AppendArgs {
            k_new: Some(&v[0]),
            v_new: Some(&v[1]),
            k_cache: &v[2],
            v_cache: &v[3],
            cache_seqlens: &v[4],
            cache_batch_idx: None,
            cache_leftpad: None,
            block_table: None,
            rotary_cos: Some(&v[5]),
            rotary_sin: Some(&v[6]),
            rotary_interleaved: true,
            q: Some(&v[7]),
            q_rot: Some(&v[8]),
        }
    }

    #[test]
    fn append_checks() {
        let v = append_views();
        let p = check_append(&append_args(&v)).expect("valid");
        assert_eq!(
            (p.batch, p.seqlen_new, p.rotary_dim, p.seqlen_ro),
            (2, 3, 32, 500)
        );
        // k_new without v_new
        let mut a = append_args(&v);
        a.v_new = None;
        assert!(check_append(&a)
            .unwrap_err()
            .to_string()
            .contains("k_new and v_new"));
        // rotary wider than the head
        let mut w = append_views();
        w[5].shape = vec![500, 40];
        w[6].shape = vec![500, 40];
        w[5].strides = vec![40, 1];
        w[6].strides = vec![40, 1];
        assert!(check_append(&append_args(&w))
            .unwrap_err()
            .to_string()
            .contains("rotary_dim"));
        // cos in a third dtype
        let mut w = append_views();
        w[5].dtype = DType::BF16;
        w[6].dtype = DType::BF16;
        assert!(check_append(&append_args(&w))
            .unwrap_err()
            .to_string()
            .contains("rotary_cos"));
        // q_rot aliasing the cache
        let mut w = append_views();
        w[8].ptr = w[2].ptr;
        assert!(check_append(&append_args(&w))
            .unwrap_err()
            .to_string()
            .contains("overlaps"));
        // k_cache / v_cache as interleaved views of one (.., 2, ...) tensor are accepted
        let mut w = append_views();
        w[3].ptr = w[2].ptr + 2 * 64 * 2;
        w[2].strides = vec![100 * 2 * 2 * 64, 2 * 2 * 64, 64, 1];
        w[3].strides = w[2].strides.clone();
        assert!(check_append(&append_args(&w)).is_ok());
        // read-only cache
        let mut w = append_views();
        w[2].readonly = true;
        assert!(check_append(&append_args(&w))
            .unwrap_err()
            .to_string()
            .contains("k_cache"));
    }
}
