//! The FP8 (e4m3) attention forward on Hopper: flash-attn 3's `flash_attn_func` with float8 q / k
//! / v and `q_descale` / `k_descale` / `v_descale`, bf16 out. One launch on the call's stream: the
//! FP8 build of the TMA forward (`cuda/flash_fwd_sm90_tma.cu`, `FS_DTYPE=3`), whose producer warps
//! transpose each V tile in shared memory (an 8-bit wgmma takes V K-major). Where each V row
//! serves many query rows (`prepass_for`) two launches instead: `cuda/flash_fp8_vt.cu` writes V
//! transposed (and key-permuted inside each 16-key group) into stream-ordered scratch, then the
//! `FS_FP8_TRANSPOSE=0` build runs on Q, K and that Vt.
//!
//! Covered: sm_90, head dims 16 .. 128 in steps of 16 (the 128 tile; the maps zero-fill the
//! columns past the head dim), masks and windows, GQA / MQA, seqlen_q != seqlen_k, LSE, out=.
//! Not here (the Python layer dequantises and runs the 16-bit kernels instead): other GPUs,
//! head dims above 128 or not multiples of 16, softcap, packed sequences.

use crate::error::{unsupported, value_err, Error, Result};
use crate::ops::attention::{self, fits_i32, FlashFwdArgs, Problem};
use crate::ops::attention_tma::{self, FlashFwdTmaParams, Schedule, TileOrder};
use crate::runtime::driver::{encode_tensor_map_4d_of, MapElem};
use crate::runtime::{runtime, KernelSpec, StreamChoice};
use crate::tensor::{common_cuda_device, DType, TensorView};

pub const VT_SOURCE: &str = include_str!("../../cuda/flash_fp8_vt.cu");
pub const VT_FAMILY: &str = "flash_fp8_vt";
pub const VT_ENTRY: &str = "flash_fp8_vt_kernel";
/// Threads of a Vt CTA (128 keys of one (batch, kv head)).
const VT_THREADS: u32 = 256;
/// Keys of a Vt block, and the multiple Vt's rows are padded to (every K / V tile is whole).
const VT_KEYS: i64 = 128;
/// The FP8 kernel's tile: head dim 128, 128 query rows (two consumer warpgroups, ping-pong),
/// 128-key K and Vt tiles (16 KB each).
pub const TILE_HEAD_DIM: i64 = 128;
const BLOCK_M: i64 = 128;
const TILE_BYTES: u32 = 128 * 128;

/// K / V ring depth: 4 by default (Q 16 KB + O 32 KB + 4 x 32 KB + 2 raw V tiles of 16 KB);
/// FLASHSCAN_SM90_FP8_STAGES (2-4, 5 with the pre-pass; read on every FP8 call, for tuning)
/// overrides it.
pub fn kv_stages(prepass: bool) -> i64 {
    let max = if prepass { 5 } else { 4 };
    std::env::var("FLASHSCAN_SM90_FP8_STAGES")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|n| (2..=max).contains(n))
        .unwrap_or(4)
}

/// Above this many visible query rows per K / V row (seqlen_q x nheads / nheads_k x the part of
/// the keys a query sees: a half under a causal mask) V is transposed by the pre-pass: the
/// in-kernel transpose is redone for every (query block, q head) that reads a tile and made the
/// kernel 5-10% slower at every length (H200 2026-12-03, torch.profiler kernel times, calls 2-3 of
/// benches/results/2026-12-03-h200-attention-fp8-transpose/), while the pre-pass costs ~18 us per
/// 16k keys x 16 kv heads: the in-kernel form ahead by 8% / ~0 at 512 / 1024 unmasked and by 10% /
/// 3-4% at 1024 / 2048 causal, the pre-pass ahead from 2048 unmasked (3-7%) and 4096 causal.
pub const PREPASS_MIN_REUSE: i64 = 1024;

/// Whether V goes through the pre-pass for this problem: FLASHSCAN_SM90_FP8_VT=prepass or =kernel
/// (read on every FP8 call) forces either; else the rule of `PREPASS_MIN_REUSE`.
pub fn prepass_for(p: &Problem) -> bool {
    match std::env::var("FLASHSCAN_SM90_FP8_VT").as_deref() {
        Ok("prepass") => true,
        Ok("kernel") => false,
        _ => reuse_wants_prepass(p),
    }
}

/// The default rule: visible query rows per K / V row above `PREPASS_MIN_REUSE`.
pub fn reuse_wants_prepass(p: &Problem) -> bool {
    let group = p.nheads / p.nheads_k.max(1);
    let sk = p.seqlen_k.max(1);
    // keys a query row sees (windows; -1: unbounded on that side), as a fraction of seqlen_k
    let reach = |w: i64| if w < 0 { sk } else { w.min(sk) };
    let visible = if p.window_left < 0 && p.window_right == 0 {
        sk / 2 // causal: half on average
    } else {
        (reach(p.window_left) + reach(p.window_right) + 1).min(sk)
    };
    p.seqlen_q * group * visible > PREPASS_MIN_REUSE * sk
}

/// FLASHSCAN_SM90_FP8_TRANSPOSE_WARPS=1 or 2 (measurement; read on every FP8 call): how many
/// producer warps transpose V (default 3). None: the default.
pub fn transpose_warps() -> Option<i64> {
    std::env::var("FLASHSCAN_SM90_FP8_TRANSPOSE_WARPS")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|&n| n == 1 || n == 2)
}

/// Dynamic shared memory of the FP8 kernel: Q (16 KB), `stages` K / Vt pairs, the bf16 O
/// staging buffer (32 KB), 1 KB of alignment, the mbarriers; without the pre-pass also the two
/// raw V tiles, and every barrier slot the persistent forms and the transpose use (+ 2 flags).
pub fn smem_bytes(stages: i64, prepass: bool) -> u32 {
    let s = stages as u32;
    if prepass {
        TILE_BYTES + 2 * s * TILE_BYTES + 2 * TILE_BYTES + 1024 + 8 * (1 + 4 * s)
    } else {
        TILE_BYTES + 2 * s * TILE_BYTES + 2 * TILE_BYTES + 2 * TILE_BYTES + 1024 + 8 * (12 + 4 * s)
    }
}

/// The FP8 kernel's consumer schedule: ping-pong by default; FLASHSCAN_SM90_FP8_SCHEDULE=pipe or
/// plain (read on every FP8 call, for A/B runs; the CPU suite compiles the default only).
pub fn schedule() -> Schedule {
    match std::env::var("FLASHSCAN_SM90_FP8_SCHEDULE").as_deref() {
        Ok("pipe") => Schedule::Pipe,
        Ok("plain") => Schedule::Plain,
        _ => Schedule::PingPong,
    }
}

/// FLASHSCAN_SM90_FP8_RESCALE (measurement; read on every FP8 call): how the kernel moves a row's
/// exponent base (`FS_FP8_RESCALE`): 0 every tile, 1 (default) whenever a row's maximum grows (the
/// warp skips O's rescale on tiles where none did), 2 the 16-bit kernel's 2^8 margin (P up to 256:
/// its largest value rounded, 2-3.5x the error, see the kernel). None: the default.
pub fn rescale_mode() -> Option<i64> {
    std::env::var("FLASHSCAN_SM90_FP8_RESCALE")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|&m| m == 0 || m == 2)
}

/// The FP8 forward's variant (ping-pong, one CTA a tile, V transposed in the kernel) and its
/// dynamic shared memory; None off sm_90.
pub fn spec(has_mask: bool, arch_num: i64, stages: i64) -> Option<(KernelSpec, u32)> {
    spec_with(has_mask, arch_num, stages, Schedule::PingPong, None, false)
}

/// `spec` with a given consumer schedule, one CTA a tile (`order` None) or persistent as the
/// 16-bit kernel's (`attention_tma::persistent_spec`: a static stride for unmasked problems, the
/// tile queue for any), whose O buffer the FP8 build has anyway: + the q_empty barrier, and the
/// queue's barriers and slots (without the pre-pass: counted in `smem_bytes`). `prepass`: the
/// `FS_FP8_TRANSPOSE=0` build, which reads Vt from the pre-pass's scratch.
pub fn spec_with(
    has_mask: bool,
    arch_num: i64,
    stages: i64,
    schedule: Schedule,
    order: Option<TileOrder>,
    prepass: bool,
) -> Option<(KernelSpec, u32)> {
    if arch_num != 90 || (has_mask && order == Some(TileOrder::Stride)) {
        return None;
    }
    let mut defines = vec![
        ("FS_HEAD_DIM", TILE_HEAD_DIM),
        ("FS_DTYPE", 3),
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
    if let Some(m) = rescale_mode() {
        defines.push(("FS_FP8_RESCALE", m));
    }
    if let Some(n) = attention_tma::exp_poly() {
        defines.push(("FS_EXP_POLY", n));
    }
    if prepass {
        defines.push(("FS_FP8_TRANSPOSE", 0));
    } else {
        if let Some(n) = transpose_warps() {
            defines.push(("FS_FP8_TRANSPOSE_WARPS", n));
        }
        // (measurement: conflict-free stmatrix rows for 4 SEL a unit; two units' loads in flight)
        if std::env::var("FLASHSCAN_SM90_FP8_TRANSPOSE_SEL").as_deref() == Ok("1") {
            defines.push(("FS_FP8_TRANSPOSE_SEL", 1));
        }
        if std::env::var("FLASHSCAN_SM90_FP8_TRANSPOSE_DEPTH").as_deref() == Ok("2") {
            defines.push(("FS_FP8_TRANSPOSE_DEPTH", 2));
        }
    }
    let extra = match order {
        None => 0,
        Some(TileOrder::Stride) => {
            defines.push(("FS_SM90_PERSIST", 1));
            8
        }
        Some(TileOrder::Queue) => {
            defines.push(("FS_SM90_PERSIST", 2));
            8 + 40
        }
    };
    let extra = if prepass { extra } else { 0 };
    Some((
        KernelSpec {
            family: attention_tma::FAMILY,
            source: attention_tma::SOURCE,
            entry: attention_tma::ENTRY,
            defines,
        },
        smem_bytes(stages, prepass) + extra,
    ))
}

/// The Vt pre-pass's variant (one for every problem; `prepass_for`).
pub fn vt_spec(arch_num: i64) -> KernelSpec {
    KernelSpec {
        family: VT_FAMILY,
        source: VT_SOURCE,
        entry: VT_ENTRY,
        defines: vec![("FS_ARCH", arch_num)],
    }
}

/// Every FP8 variant for `arch_num` (none off sm_90): the in-kernel transpose's, then the Vt
/// pre-pass and the builds that read its Vt (the same forms); all "main".
pub fn all_specs(arch_num: i64) -> Vec<KernelSpec> {
    if arch_num != 90 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for prepass in [false, true] {
        if prepass {
            out.push(vt_spec(arch_num));
        }
        for mask in [false, true] {
            for order in [None, Some(TileOrder::Stride), Some(TileOrder::Queue)] {
                let stages = kv_stages(prepass);
                let s = spec_with(mask, arch_num, stages, Schedule::PingPong, order, prepass);
                out.extend(s.map(|(s, _)| s));
            }
        }
    }
    out
}

/// Mirrors `struct Fp8Descale` in cuda/flash_fwd_sm90_tma.cu: a descale tensor's pointer (0:
/// none, 1.0) and its element strides over (batch, kv head) (0 broadcasts).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8Descale {
    pub ptr: u64,
    pub batch_stride: i64,
    pub head_stride: i64,
}

/// Mirrors the FP8 build's `FlashFwdTmaParams`: the 16-bit form's fields, then the q / k / v
/// descales at byte 640.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct FlashFwdFp8Params {
    pub tma: FlashFwdTmaParams,
    pub q_descale: Fp8Descale,
    pub k_descale: Fp8Descale,
    pub v_descale: Fp8Descale,
}

const _: () = assert!(std::mem::offset_of!(FlashFwdFp8Params, q_descale) == 640);
const _: () = assert!(std::mem::offset_of!(FlashFwdFp8Params, v_descale) == 688);

/// Mirrors `struct Fp8VtParams` in cuda/flash_fp8_vt.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp8VtParams {
    pub v: u64,
    pub vt: u64,
    pub v_batch_stride: i64,
    pub v_row_stride: i64,
    pub v_head_stride: i64,
    pub seqlen_k: i32,
    pub head_dim: i32,
    pub seqlen_k_pad: i32,
    pub nheads_k: i32,
}

const _: () = assert!(std::mem::size_of::<Fp8VtParams>() == 56);

/// The FP8 forward's arguments: `base` as for the 16-bit forward (q / k / v e4m3, out bf16;
/// softcap must be 0), and the optional descales.
pub struct FlashFwdFp8Args<'a> {
    pub base: FlashFwdArgs<'a>,
    pub q_descale: Option<&'a TensorView>,
    pub k_descale: Option<&'a TensorView>,
    pub v_descale: Option<&'a TensorView>,
}

/// Seqlen_k rounded up to whole 128-key Vt blocks.
pub fn seqlen_k_pad(seqlen_k: i64) -> i64 {
    (seqlen_k + VT_KEYS - 1) / VT_KEYS * VT_KEYS
}

/// A descale tensor's (batch, kv head) strides: float32 of shape (batch, nheads_k) (flash-attn
/// 3's), or any shape of that rank or less whose sizes are 1 or those (size 1 broadcasts).
fn descale_of(name: &str, t: Option<&TensorView>, batch: i64, nheads_k: i64) -> Result<Fp8Descale> {
    let Some(t) = t else {
        return Ok(Fp8Descale::default());
    };
    t.expect_dtype(name, &[DType::F32])?;
    if t.shape.len() > 2 {
        return Err(value_err(format!(
            "{name} has shape {:?}: expected (batch, nheads_k) = ({batch}, {nheads_k}), or a \
             broadcastable shape",
            t.shape
        )));
    }
    // right-aligned against (batch, nheads_k)
    let want = [batch, nheads_k];
    let mut strides = [0i64; 2];
    let off = 2 - t.shape.len();
    for (i, (&n, &s)) in t.shape.iter().zip(&t.strides).enumerate() {
        let w = want[off + i];
        if n != 1 && n != w {
            return Err(value_err(format!(
                "{name} has shape {:?}: expected (batch, nheads_k) = ({batch}, {nheads_k}), or a \
                 broadcastable shape",
                t.shape
            )));
        }
        strides[off + i] = if n == 1 { 0 } else { s };
    }
    Ok(Fp8Descale {
        ptr: t.ptr,
        batch_stride: strides[0],
        head_stride: strides[1],
    })
}

/// Every check of the FP8 forward (pure: unit-tested on the CPU): the 16-bit forward's on e4m3
/// inputs and a bf16 out, then what the FP8 kernel covers, then the descales.
pub fn check(a: &FlashFwdFp8Args) -> Result<(Problem, [Fp8Descale; 3])> {
    let p = attention::check_with(&a.base, &[DType::F8E4M3], Some(DType::BF16))?;
    if p.head_dim % 16 != 0 || p.head_dim > TILE_HEAD_DIM {
        return Err(unsupported(format!(
            "FP8 attention: headdim = {} is not supported on the GPU (multiples of 16 up to 128)",
            p.head_dim
        )));
    }
    if a.base.softcap != 0.0 {
        return Err(unsupported("FP8 attention: softcap is not supported"));
    }
    let d = [
        descale_of("q_descale", a.q_descale, p.batch, p.nheads_k)?,
        descale_of("k_descale", a.k_descale, p.batch, p.nheads_k)?,
        descale_of("v_descale", a.v_descale, p.batch, p.nheads_k)?,
    ];
    Ok((p, d))
}

/// The map arguments of Vt (batch, nheads_k, head_dim, seqlen_k_pad) contiguous bytes: dims
/// innermost first (keys, head-dim rows, kv heads, batch), box 128 keys x 128 rows.
pub fn vt_map_args(
    batch: i64,
    nheads_k: i64,
    head_dim: i64,
    sk_pad: i64,
) -> attention_tma::MapArgs {
    attention_tma::MapArgs {
        dims: [
            sk_pad as u64,
            head_dim as u64,
            nheads_k as u64,
            batch as u64,
        ],
        strides: [
            sk_pad as u64,
            (head_dim * sk_pad) as u64,
            (nheads_k * head_dim * sk_pad) as u64,
        ],
        box_dims: [VT_KEYS as u32, TILE_HEAD_DIM as u32, 1, 1],
    }
}

fn encode_u8(ptr: u64, a: Option<attention_tma::MapArgs>) -> Result<[u64; 16]> {
    let a = a.ok_or_else(|| unsupported("FP8 attention: a stride TMA cannot address"))?;
    encode_tensor_map_4d_of(ptr, MapElem::U8, a.dims, a.strides, a.box_dims)
}

/// Checks and launches the FP8 forward on the call's stream (with the pre-pass: transposes V
/// into scratch first).
pub fn forward(a: &FlashFwdFp8Args, stream: StreamChoice) -> Result<()> {
    let (p, descales) = check(a)?;
    if p.batch == 0 || p.seqlen_q == 0 || p.nheads == 0 {
        return Ok(());
    }
    let b = &a.base;
    let device = common_cuda_device(&[
        ("q", Some(b.q)),
        ("k", Some(b.k)),
        ("v", Some(b.v)),
        ("out", Some(b.out)),
        ("lse", b.lse),
        ("q_descale", a.q_descale),
        ("k_descale", a.k_descale),
        ("v_descale", a.v_descale),
    ])?;
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    let _bound = dev.bind()?;
    let arch_num = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let has_mask = p.window_left >= 0 || p.window_right >= 0;
    let prepass = prepass_for(&p);
    let stages = kv_stages(prepass);
    // persistent where the 16-bit kernel is (FLASHSCAN_SM90_PERSIST alike)
    let order = attention::sm90_persist(&p, has_mask);
    let (spec, smem) = spec_with(has_mask, arch_num, stages, schedule(), order, prepass)
        .ok_or_else(|| {
            unsupported(format!(
                "FP8 attention runs on sm_90 (Hopper) only; this device is sm_{arch_num}"
            ))
        })?;
    let mut params = attention::dense_params(b);
    attention::fill_sizes(&mut params, &p, b.softmax_scale, 0.0)?;
    let q_map = attention_tma::map_args_of(
        1,
        BLOCK_M as u32,
        p.head_dim,
        p.seqlen_q,
        p.nheads,
        p.batch,
        params.q_row_stride,
        params.q_head_stride,
        params.q_batch_stride,
    );
    let kv_map = |row, head, batch| {
        attention_tma::map_args_of(
            1,
            VT_KEYS as u32,
            p.head_dim,
            p.seqlen_k,
            p.nheads_k,
            p.batch,
            row,
            head,
            batch,
        )
    };
    let k_map = kv_map(
        params.k_row_stride,
        params.k_head_stride,
        params.k_batch_stride,
    );
    let s = dev.stream(stream)?;
    let mut scratch = dev.scratch(s)?;
    // the V map: V as stored (the kernel transposes it), or the pre-pass's Vt
    let sk_pad = seqlen_k_pad(p.seqlen_k);
    let (v_ptr, v_map) = if prepass {
        let vt_bytes = p.batch * p.nheads_k * p.head_dim * sk_pad;
        let vt = scratch.alloc(vt_bytes as usize)?;
        (
            vt,
            Some(vt_map_args(p.batch, p.nheads_k, p.head_dim, sk_pad)),
        )
    } else {
        (
            params.v,
            kv_map(
                params.v_row_stride,
                params.v_head_stride,
                params.v_batch_stride,
            ),
        )
    };
    let mut tp = FlashFwdFp8Params {
        tma: FlashFwdTmaParams {
            tm_q: encode_u8(params.q, q_map)?,
            tm_k: encode_u8(params.k, k_map)?,
            tm_v: encode_u8(v_ptr, v_map)?,
            tile_counter: 0,
            section_heads: 0,
            pad: 0,
            base: params,
        },
        q_descale: descales[0],
        k_descale: descales[1],
        v_descale: descales[2],
    };
    let kernel = dev.kernel(&spec)?;
    let grid = (
        u32::try_from((p.seqlen_q + BLOCK_M - 1) / BLOCK_M)
            .map_err(|_| unsupported("seqlen_q too large"))?,
        p.nheads as u32,
        p.batch as u32,
    );
    let grid = attention::tma_grid(grid, order, dev.props.sm_count as i64);
    // (the queue's sections: its K and V are 1-byte, so a head's bytes are half the 16-bit ones)
    let queue_scratch = if order == Some(TileOrder::Queue) {
        let section =
            attention_tma::section_heads(p.seqlen_k, (p.head_dim + 1) / 2, p.nheads, p.nheads_k);
        attention::queue_counters(dev, s, &mut tp.tma, section)?
    } else {
        None
    };
    let mut launched = Ok(());
    if prepass {
        let vp = Fp8VtParams {
            v: b.v.ptr,
            vt: v_ptr,
            v_batch_stride: b.v.strides[0],
            v_row_stride: b.v.strides[1],
            v_head_stride: b.v.strides[2],
            seqlen_k: params.seqlen_k,
            head_dim: params.head_dim,
            seqlen_k_pad: fits_i32("seqlen_k", sk_pad)?,
            nheads_k: params.nheads_k,
        };
        let vt_grid = (
            u32::try_from(sk_pad / VT_KEYS).map_err(|_| unsupported("seqlen_k too large"))?,
            p.nheads_k as u32,
            p.batch as u32,
        );
        let vt_kernel = dev.kernel(&vt_spec(arch_num))?;
        // SAFETY: vp mirrors Fp8VtParams; v is the checked e4m3 tensor on this device (rows
        // 16-byte aligned), vt a live scratch buffer of batch x nheads_k x head_dim x sk_pad
        // bytes, freed on this stream after the launches.
        launched = unsafe { dev.launch(&vt_kernel, vt_grid, (VT_THREADS, 1, 1), 0, s, &vp) };
    }
    if launched.is_ok() {
        // SAFETY: tp mirrors the FP8 kernel's parameter: its maps address q, k (checked) and v
        // (checked) or the live Vt scratch, every pointer in params and the descales is on this
        // device; the stream orders the launches and the scratch's free after them.
        launched = unsafe {
            dev.launch(
                &kernel,
                grid,
                (attention_tma::threads(BLOCK_M), 1, 1),
                smem,
                s,
                &tp,
            )
        };
    }
    scratch.free()?;
    if let Some(sc) = queue_scratch {
        sc.free()?;
    }
    launched?;
    dev.finish(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DeviceKind;

    fn view(shape: &[i64], dtype: DType) -> TensorView {
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        // (each view its own memory: the checks refuse an out overlapping an input)
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let ptr = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 32;
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

    fn args<'a>(
        q: &'a TensorView,
        k: &'a TensorView,
        v: &'a TensorView,
        out: &'a TensorView,
    ) -> FlashFwdArgs<'a> {
        FlashFwdArgs {
            q,
            k,
            v,
            out,
            lse: None,
            softmax_scale: 0.1,
            window_left: -1,
            window_right: -1,
            softcap: 0.0,
        }
    }

    #[test]
    fn checks_take_e4m3_inputs_a_bf16_out_and_the_128_tile() {
        let q = view(&[2, 100, 8, 128], DType::F8E4M3);
        let k = view(&[2, 300, 2, 128], DType::F8E4M3);
        let out = view(&[2, 100, 8, 128], DType::BF16);
        let ds = view(&[2, 2], DType::F32);
        let a = FlashFwdFp8Args {
            base: args(&q, &k, &k, &out),
            q_descale: Some(&ds),
            k_descale: None,
            v_descale: None,
        };
        let (p, d) = check(&a).expect("covered");
        assert_eq!((p.nheads, p.nheads_k, p.seqlen_k), (8, 2, 300));
        assert_eq!(d[0].batch_stride, 2);
        assert_eq!(d[0].head_stride, 1);
        assert_eq!(d[1], Fp8Descale::default());
        // bf16 inputs, an fp8 out, a head dim the tile does not hold: refused
        let qb = view(&[2, 100, 8, 128], DType::BF16);
        assert!(check(&FlashFwdFp8Args {
            base: args(&qb, &k, &k, &out),
            q_descale: None,
            k_descale: None,
            v_descale: None,
        })
        .is_err());
        assert!(check(&FlashFwdFp8Args {
            base: args(&q, &k, &k, &q),
            q_descale: None,
            k_descale: None,
            v_descale: None,
        })
        .is_err());
        let q2 = view(&[2, 100, 8, 136], DType::F8E4M3);
        let k2 = view(&[2, 300, 2, 136], DType::F8E4M3);
        let o2 = view(&[2, 100, 8, 136], DType::BF16);
        assert!(check(&FlashFwdFp8Args {
            base: args(&q2, &k2, &k2, &o2),
            q_descale: None,
            k_descale: None,
            v_descale: None,
        })
        .is_err());
        // head dim 72: not a multiple of 16
        let q3 = view(&[1, 4, 1, 72], DType::F8E4M3);
        let o3 = view(&[1, 4, 1, 72], DType::BF16);
        assert!(check(&FlashFwdFp8Args {
            base: args(&q3, &q3, &q3, &o3),
            q_descale: None,
            k_descale: None,
            v_descale: None,
        })
        .is_err());
    }

    #[test]
    fn descales_broadcast_and_refuse_other_shapes() {
        let one = view(&[1], DType::F32);
        let d = descale_of("q_descale", Some(&one), 4, 2).expect("a scalar broadcasts");
        assert_eq!((d.batch_stride, d.head_stride), (0, 0));
        let per_head = view(&[1, 2], DType::F32);
        let d = descale_of("q_descale", Some(&per_head), 4, 2).expect("broadcast over batch");
        assert_eq!((d.batch_stride, d.head_stride), (0, 1));
        assert!(descale_of("q_descale", Some(&view(&[4, 3], DType::F32)), 4, 2).is_err());
        assert!(descale_of("q_descale", Some(&view(&[4, 2], DType::BF16)), 4, 2).is_err());
        assert!(descale_of("q_descale", Some(&view(&[1, 4, 2], DType::F32)), 4, 2).is_err());
    }

    #[test]
    fn vt_is_padded_to_whole_tiles_and_its_map_steps_in_bytes() {
        assert_eq!(
            (seqlen_k_pad(1), seqlen_k_pad(128), seqlen_k_pad(129)),
            (128, 128, 256)
        );
        let m = vt_map_args(2, 4, 96, 256);
        assert_eq!(m.dims, [256, 96, 4, 2]);
        assert_eq!(m.strides, [256, 96 * 256, 4 * 96 * 256]);
        assert_eq!(m.box_dims, [128, 128, 1, 1]);
        // e4m3 Q / K: 128-element boxes of 128-byte rows
        let q = attention_tma::map_args_of(1, 128, 128, 1000, 8, 2, 8 * 128, 128, 1000 * 8 * 128)
            .expect("addressable");
        assert_eq!(q.box_dims, [128, 128, 1, 1]);
        assert_eq!(q.strides, [1024, 128, 1000 * 1024]);
        assert!(attention_tma::map_args_of(1, 128, 72, 10, 1, 1, 72, 72, 720).is_none());
    }

    #[test]
    fn v_is_transposed_in_the_kernel_unless_each_v_row_serves_many_query_rows() {
        let prob = |sq: i64, sk: i64, h: i64, hk: i64, wl: i64, wr: i64| Problem {
            batch: 1,
            seqlen_q: sq,
            seqlen_k: sk,
            nheads: h,
            nheads_k: hk,
            head_dim: 128,
            window_left: wl,
            window_right: wr,
        };
        assert!(!reuse_wants_prepass(&prob(1024, 1024, 16, 16, -1, -1)));
        assert!(reuse_wants_prepass(&prob(2048, 2048, 16, 16, -1, -1)));
        // causal: half the keys a row
        assert!(!reuse_wants_prepass(&prob(2048, 2048, 16, 16, -1, 0)));
        assert!(reuse_wants_prepass(&prob(4096, 4096, 16, 16, -1, 0)));
        // GQA: each K / V row serves every q head of its group
        assert!(reuse_wants_prepass(&prob(256, 256, 32, 4, -1, -1)));
        // a short window sees few keys of a long sequence
        assert!(!reuse_wants_prepass(&prob(8192, 8192, 16, 16, 255, 0)));
        assert!(!reuse_wants_prepass(&prob(1, 4096, 8, 1, -1, -1)));
    }

    #[test]
    fn variants_are_sm90_ping_pong_on_the_128_tile() {
        assert!(spec(false, 80, 4).is_none() && all_specs(80).is_empty());
        let (k, smem) = spec(true, 90, 4).expect("sm_90");
        assert!(k.defines.contains(&("FS_DTYPE", 3)) && k.defines.contains(&("FS_HAS_MASK", 1)));
        assert!(!k.defines.iter().any(|d| d.0 == "FS_FP8_TRANSPOSE"));
        // Q, 4 K / Vt stages, O, 2 raw V tiles, alignment, 28 barrier slots
        assert_eq!(smem, 16384 + 8 * 16384 + 32768 + 32768 + 1024 + 8 * 28);
        assert!(smem_bytes(4, false) <= 232_448 && smem_bytes(5, false) > 232_448);
        assert!(smem_bytes(5, true) + 48 <= 232_448);
        // one CTA a tile, masked or not; persistent: a static stride unmasked, the queue either;
        // then the pre-pass and the same five forms on its Vt
        let all = all_specs(90);
        assert_eq!(all.len(), 5 + 1 + 5);
        assert_eq!(all[5].family, VT_FAMILY);
        assert!(all[6..]
            .iter()
            .all(|k| k.defines.contains(&("FS_FP8_TRANSPOSE", 0))));
        let none = |o| spec_with(true, 90, 4, Schedule::PingPong, o, false);
        assert!(none(Some(TileOrder::Stride)).is_none());
        let (q, smem_q) = none(Some(TileOrder::Queue)).expect("queue");
        assert!(q.defines.contains(&("FS_SM90_PERSIST", 2)));
        assert_eq!(smem_q, smem_bytes(4, false));
        let (_, smem_p) = spec_with(
            true,
            90,
            4,
            Schedule::PingPong,
            Some(TileOrder::Queue),
            true,
        )
        .expect("queue, pre-pass");
        assert_eq!(smem_p, smem_bytes(4, true) + 48);
    }
}
