//! The SSD forward's chunk outputs on sm_90a, warp-specialised (`ssd2_chunk_scan_ws` in
//! cuda/ssd_fwd2.cu): producer warps stream x, C, H_c and the 16-bit C B^T blocks by TMA and the
//! prep records by bulk copies into one shared-memory ring per consumer warpgroup (three), one
//! persistent CTA an SM. This module holds its applicability rule, its tensor maps and parameter block, and its
//! launch; `ssd::Launch2::scan` falls back to `ssd2_chunk_scan` wherever `launch` declines.

use super::ssd::{spec2, Problem, Ssd2Params};
use crate::error::{value_err, Result};
use crate::runtime::driver::encode_tensor_map_4d;
use crate::runtime::{DeviceCtx, Stream};

pub const ENTRY: &str = "ssd2_chunk_scan_ws";
/// The same kernel with W x software-pipelined (opt-in, `FLASHSCAN_SSD_SCAN_WS_PIPE=1`: written
/// 2026-12-05 in a session lent no device; predicted 200-220 us against 248 at b8 L2048 on the
/// H200, not yet run on a GPU).
pub const ENTRY_PIPE: &str = "ssd2_chunk_scan_ws_pipe";
/// The chunk size the kernel is built for (its warpgroups take the row tiles {3, 0} and {2, 1}).
pub const CHUNK: i64 = 256;
/// Consumer warpgroups (and one producer warpgroup); mirrors kWsConsumers.
const CONSUMERS: usize = 3;
const THREADS: u32 = (CONSUMERS as u32 + 1) * 128;
/// Ring stages a consumer and their bytes: the x (or C) tile, then the C B^T block (or the H
/// tile), 64 x 64 16-bit each; mirrors kWsStages / kWsStageBytes.
const STAGES: usize = 4;
const STAGE_BYTES: usize = 2 * 64 * 64 * 2;
/// Dynamic shared memory (cuda/ssd_fwd2.cu kWsSmemBytes): 1024 bytes of alignment slack, the
/// rings, two prep records (lw, cum) a consumer, s_f (chunk floats) and s_d (64 floats) a
/// consumer, a zero seg row (chunk ints), (2 stages + 4) mbarriers a consumer.
pub const SMEM_BYTES: u32 = (1024
    + CONSUMERS * STAGES * STAGE_BYTES
    + CONSUMERS * 2 * (2 * CHUNK as usize * 4)
    + CONSUMERS * CHUNK as usize * 4
    + CONSUMERS * 64 * 4
    + CHUNK as usize * 4
    + 8 * CONSUMERS * (2 * STAGES + 4)) as u32;

/// Mirrors `struct Ssd2WsParams` in cuda/ssd_fwd2.cu: four tensor maps (64-byte aligned), the
/// second path's parameter block, the unit count.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct Ssd2WsParams {
    pub tm_x: [u64; 16],
    pub tm_c: [u64; 16],
    pub tm_h: [u64; 16],
    pub tm_cb: [u64; 16],
    pub q: Ssd2Params,
    pub nunits: i32,
}

const _: () = assert!(std::mem::offset_of!(Ssd2WsParams, q) == 512);
const _: () = assert!(std::mem::size_of::<Ssd2WsParams>() == 1152);

/// `FLASHSCAN_SSD_SCAN_WS=0` keeps `ssd2_chunk_scan` everywhere (A/B runs); the kernel is the
/// default where `plan` takes it: on the H200 (2026-12-04, b8 L2048 80 x 64, state 128, bf16, no
/// z) the chunk outputs 252.9 / 252.8 us against 320.1 / 320.6, the forward 452 against 518;
/// L8192 951.8 (ssd2_chunk_scan ~1271). Read on every call, not once, so that one process (the
/// GPU tests, the sanitizer cases) can run both kernels.
fn ws_on() -> bool {
    std::env::var("FLASHSCAN_SSD_SCAN_WS").as_deref() != Ok("0")
}

/// The entry a call launches: `ENTRY_PIPE` under `FLASHSCAN_SSD_SCAN_WS_PIPE=1`, else `ENTRY`.
/// Read on every call, as `ws_on`, so one process can time and test both.
fn entry() -> &'static str {
    if std::env::var("FLASHSCAN_SSD_SCAN_WS_PIPE").as_deref() == Ok("1") {
        ENTRY_PIPE
    } else {
        ENTRY
    }
}

/// Whether a call's chunk outputs can take the kernel: sm_90a, chunk 256, no z and no seq_idx
/// (the Mamba-2 layer's call), 16-byte aligned rows of x, C and the states (what TMA and the bulk
/// copies need), and the workspaces 16-byte aligned.
fn applies(q: &Ssd2Params, p: &Problem, chunk: i64, arch: i64) -> bool {
    arch == 90
        && chunk == CHUNK
        && q.p.has_z == 0
        && q.p.has_seq == 0
        && q.vec_x == 1
        && q.vec_bc == 1
        && q.vec_states == 1
        && p.dstate % 8 == 0
        && q.cb % 16 == 0
        && q.prep % 16 == 0
        && units(p).is_some()
}

/// The kernel's units: (batch, chunk, head, 64-channel tile), when their count fits an int.
fn units(p: &Problem) -> Option<i32> {
    let n = p.batch * p.nchunks * p.nheads * ((p.headdim + 63) / 64);
    i32::try_from(n).ok()
}

/// CTAs to launch: one an SM at most, and no more than the units' CONSUMERS-wide rows need (a
/// CTA's consumers take units CONSUMERS apart; a grid past that would only start idle CTAs).
fn grid_ctas(nunits: i32, sm_count: i32) -> u32 {
    let rows = (nunits.max(1) as u32).div_ceil(CONSUMERS as u32);
    rows.min(sm_count.max(1) as u32)
}

/// A byte stride for a tensor map: a size-1 dimension is never stepped over, so any multiple of
/// 16 will do there (the layer's views can carry odd strides on such dimensions).
pub(crate) fn map_stride(size: i64, stride_elems: i64, elem_bytes: i64, inner_bytes: u64) -> u64 {
    if size == 1 {
        inner_bytes.max(16)
    } else {
        (stride_elems * elem_bytes) as u64
    }
}

/// The tensor map of a 16-bit (batch, seqlen, heads, inner) tensor at `ptr` with element strides
/// `s` (batch, seqlen, head): dimensions (inner, heads, seqlen, batch), boxes of 64 x 1 x `rows`
/// x 1 (x over its heads, B or C over its groups). Shared with `ssd_state_pass`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows_map(
    ptr: u64,
    bf16: bool,
    s: [i64; 3],
    inner: i64,
    heads: i64,
    seqlen: i64,
    batch: i64,
    rows: u32,
) -> Result<[u64; 16]> {
    let s1 = map_stride(heads, s[2], 2, (inner * 2) as u64);
    let s2 = map_stride(seqlen, s[1], 2, s1 * heads as u64);
    let s3 = map_stride(batch, s[0], 2, s2 * seqlen as u64);
    let dims = [inner as u64, heads as u64, seqlen as u64, batch as u64];
    encode_tensor_map_4d(ptr, bf16, dims, [s1, s2, s3], [64, 1, rows, 1])
}

/// The four tensor maps: x (headdim, nheads, seqlen, batch), C (dstate, ngroups, seqlen, batch),
/// the 16-bit H_c (dstate, headdim, nheads, batch * nchunks): the kept compact tensor (`h16`), or
/// packed in place over each fp32 slot of the states workspace (rows of dstate 16-bit values,
/// slots headdim x dstate floats apart), and C B^T in x's dtype (`cb16`) over the workspace's
/// first half as rows of CHUNK values (batch * nchunks * ngroups * CHUNK of them), all in boxes
/// of 64 x 64.
fn maps(q: &Ssd2Params, p: &Problem) -> Result<[[u64; 16]; 4]> {
    let s = &q.p;
    let (hd, nh, l, b) = (p.headdim, p.nheads, p.seqlen, p.batch);
    let (ds, ng) = (p.dstate, p.ngroups);
    let bf16 = true; // (bf16 only: `plan`)
    let tm_x = rows_map(s.x, bf16, s.x_s, hd, nh, l, b, 64)?;
    let tm_c = rows_map(s.c, bf16, s.c_s, ds, ng, l, b, 64)?;
    // a slot's 16-bit values: compact (h16) or in place over fp32 slots twice their size
    let (h_ptr, slot) = if q.h16 != 0 {
        (q.h16, (hd * ds * 2) as u64)
    } else {
        (s.states, (hd * ds * 4) as u64)
    };
    let tm_h = encode_tensor_map_4d(
        h_ptr,
        bf16,
        [ds as u64, hd as u64, nh as u64, (b * p.nchunks) as u64],
        [(ds * 2) as u64, slot, slot * nh as u64],
        [64, 64, 1, 1],
    )?;
    let rows = (b * p.nchunks * ng * CHUNK) as u64;
    let row = (CHUNK * 2) as u64;
    let tm_cb = encode_tensor_map_4d(
        q.cb,
        true,
        [CHUNK as u64, rows, 1, 1],
        [row, row * rows, row * rows],
        [64, 64, 1, 1],
    )?;
    Ok([tm_x, tm_c, tm_h, tm_cb])
}

/// The kernel's tensor maps where the call takes it (`ws_on`, `applies`, bf16:
/// C B^T then comes in x's dtype, which fp16 could overflow where fp32 does not) and they encode;
/// None otherwise. Decided before ssd2_chunk_cb runs, which writes C B^T in 16 bits for it
/// (`Ssd2Params::cb16`).
pub fn plan(
    q: &Ssd2Params,
    p: &Problem,
    dtype: i64,
    chunk: i64,
    arch: i64,
) -> Option<[[u64; 16]; 4]> {
    if !ws_on() || dtype != 1 || !applies(q, p, chunk, arch) {
        return None;
    }
    // the driver refuses a map whose strides or base are off: the plain kernel covers those
    maps(q, p).ok()
}

/// Launches the chunk outputs on `ssd2_chunk_scan_ws` with `plan`'s maps.
///
/// # Safety
/// `q` must describe checked tensors and workspaces of the sizes `p` gives, on `dev`, with the
/// prep records, H_c and the 16-bit C B^T (`q.cb16`) written earlier on `st`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    dev: &DeviceCtx,
    q: &Ssd2Params,
    p: &Problem,
    maps: &[[u64; 16]; 4],
    dtype: i64,
    chunk: i64,
    arch: i64,
    st: Stream,
) -> Result<()> {
    let nunits = units(p).ok_or_else(|| value_err("ssd2_chunk_scan_ws: too many units"))?;
    let [tm_x, tm_c, tm_h, tm_cb] = *maps;
    let params = Ssd2WsParams {
        tm_x,
        tm_c,
        tm_h,
        tm_cb,
        q: *q,
        nunits,
    };
    let k = dev.kernel(&spec2(entry(), dtype, chunk, arch))?;
    let grid = (grid_ctas(nunits, dev.props.sm_count), 1, 1);
    // SAFETY: as the caller's; the kernel reads the maps' tensors, the C B^T workspace and the
    // records inside the sizes `p` gives and writes `out` rows of the units it walks.
    unsafe { dev.launch(&k, grid, (THREADS, 1, 1), SMEM_BYTES, st, &params) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smem_bytes_fit_one_cta_an_sm() {
        // the kernel's kWsSmemBytes for chunk 256: 1024 + 213760 + 288
        assert_eq!(SMEM_BYTES, 215_072);
        const { assert!(SMEM_BYTES <= 227 * 1024) };
    }

    #[test]
    fn applies_to_the_layer_call_on_sm90_at_chunk_256_only() {
        let p = super::super::ssd::LAYER_2K;
        let q = Ssd2Params {
            vec_x: 1,
            vec_bc: 1,
            vec_states: 1,
            cb: 0x1000,
            prep: 0x2000,
            ..Default::default()
        };
        assert!(applies(&q, &p, 256, 90));
        assert!(!applies(&q, &p, 128, 90));
        assert!(!applies(&q, &p, 256, 80));
        let mut z = q;
        z.p.has_z = 1;
        assert!(!applies(&z, &p, 256, 90));
        let mut seq = q;
        seq.p.has_seq = 1;
        assert!(!applies(&seq, &p, 256, 90));
        let mut odd = q;
        odd.vec_x = 0; // rows not 16-byte multiples: no tensor map
        assert!(!applies(&odd, &p, 256, 90));
        let mut prep = q;
        prep.prep = 0x2008;
        assert!(!applies(&prep, &p, 256, 90));
    }

    #[test]
    fn the_grid_starts_no_idle_ctas() {
        assert_eq!(grid_ctas(5120, 132), 132); // b8 L2048 80 heads: one CTA an SM
        assert_eq!(grid_ctas(8, 132), 3); // 8 units: 3 CTAs of three consumers
        assert_eq!(grid_ctas(396, 132), 132);
        assert_eq!(grid_ctas(397, 132), 132);
        assert_eq!(grid_ctas(1, 132), 1);
    }

    #[test]
    fn size_one_dims_get_a_valid_stride() {
        assert_eq!(map_stride(1, 3, 2, 128), 128);
        assert_eq!(map_stride(4, 5376, 2, 128), 10752);
        assert_eq!(map_stride(1, 0, 2, 0), 16);
    }
}
