//! The SSD forward's chunk states and state passing in one sm_90a kernel
//! (`ssd2_chunk_state_pass` in cuda/ssd_fwd2.cu): one CTA per (batch, head, 64 x 128 tile) walks
//! the head's chunks with H in its wgmma accumulator, fed by TMA. This module holds its
//! applicability rule, its two tensor maps and parameter block, and its launch;
//! `ssd::Launch2::states` keeps `ssd2_chunk_state` + `ssd2_state_passing` wherever `plan` declines.

use super::ssd::{spec2, Problem, Ssd2Params, ENTRY2_STATE_PASS};
use super::ssd_scan_ws::rows_map;
use crate::error::Result;
use crate::runtime::{DeviceCtx, Stream};

/// Positions a step (the boxes' rows); mirrors kSpPos.
const POS: u32 = 32;
/// Threads a CTA (one warpgroup); mirrors kThreads.
const THREADS: u32 = 128;

/// Mirrors `struct Ssd2SpParams` in cuda/ssd_fwd2.cu: two tensor maps (64-byte aligned), then
/// the second path's parameter block.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct Ssd2SpParams {
    pub tm_x: [u64; 16],
    pub tm_b: [u64; 16],
    pub q: Ssd2Params,
}

const _: () = assert!(std::mem::offset_of!(Ssd2SpParams, q) == 256);
const _: () = assert!(std::mem::size_of::<Ssd2SpParams>() == 896);

/// `FLASHSCAN_SSD_STATE_PASS=0` keeps ssd2_chunk_state + ssd2_state_passing everywhere (A/B
/// runs). Read on every call, so one process can run both forms.
fn on() -> bool {
    std::env::var("FLASHSCAN_SSD_STATE_PASS").as_deref() != Ok("0")
}

/// Whether a call's chunk states can take the kernel: sm_90a (its product is the wgmma one), no
/// seq_idx (no resets), x and B in rows TMA can address (16-byte aligned, 16-byte strides:
/// `vec_x`, `vec_bc`) and the prep records 16-byte aligned (bulk copies). It leaves H_c as the
/// pair does (fp32 under `states_f32`, 16-bit in place or in `h16`), so the backward's recompute
/// takes it as well and its H_c round to the forward's kept ones bit for bit.
fn applies(q: &Ssd2Params, arch: i64) -> bool {
    arch == 90 && q.p.has_seq == 0 && q.vec_x == 1 && q.vec_bc == 1 && q.prep % 16 == 0
}

/// The two tensor maps: x (headdim, nheads, seqlen, batch) and B (dstate, ngroups, seqlen,
/// batch), boxes of 64 x 1 x POS x 1.
fn maps(q: &Ssd2Params, p: &Problem, bf16: bool) -> Result<[[u64; 16]; 2]> {
    let s = &q.p;
    let (hd, nh, l, b) = (p.headdim, p.nheads, p.seqlen, p.batch);
    let (ds, ng) = (p.dstate, p.ngroups);
    let tm_x = rows_map(s.x, bf16, s.x_s, hd, nh, l, b, POS)?;
    let tm_b = rows_map(s.b, bf16, s.b_s, ds, ng, l, b, POS)?;
    Ok([tm_x, tm_b])
}

/// The kernel's tensor maps where the call takes it (`on`, `applies`) and they encode; None
/// otherwise (the pair runs).
pub fn plan(q: &Ssd2Params, p: &Problem, dtype: i64, arch: i64) -> Option<[[u64; 16]; 2]> {
    if !on() || !applies(q, arch) {
        return None;
    }
    // the driver refuses a map whose strides or base are off: the pair covers those
    maps(q, p, dtype == 1).ok()
}

/// Launches ssd2_chunk_state_pass with `plan`'s maps: grid (batch * nheads, tiles).
///
/// # Safety
/// `q` must describe checked tensors and workspaces of the sizes its problem gives, on `dev`,
/// with the prep records written earlier on `st`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    dev: &DeviceCtx,
    q: &Ssd2Params,
    maps: &[[u64; 16]; 2],
    grid: (u32, u32),
    dtype: i64,
    chunk: i64,
    arch: i64,
    st: Stream,
) -> Result<()> {
    let [tm_x, tm_b] = *maps;
    let params = Ssd2SpParams { tm_x, tm_b, q: *q };
    let k = dev.kernel(&spec2(ENTRY2_STATE_PASS, dtype, chunk, arch))?;
    // SAFETY: as the caller's; the kernel reads x, B and the records inside the problem's sizes
    // and writes H_c, the decays and the final states of its (batch, head, tile).
    unsafe { dev.launch(&k, (grid.0, grid.1, 1), (THREADS, 1, 1), 0, st, &params) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_without_seq_idx_to_tma_rows_on_sm90_only() {
        let q = Ssd2Params {
            vec_x: 1,
            vec_bc: 1,
            prep: 0x2000,
            ..Default::default()
        };
        assert!(applies(&q, 90));
        assert!(!applies(&q, 80));
        let mut seq = q;
        seq.p.has_seq = 1;
        assert!(!applies(&seq, 90));
        let mut odd = q;
        odd.vec_bc = 0; // B rows not 16-byte multiples: no tensor map
        assert!(!applies(&odd, 90));
        let mut prep = q;
        prep.prep = 0x2008;
        assert!(!applies(&prep, 90));
        let mut f32_states = q; // the backward's recompute takes it too
        f32_states.states_f32 = 1;
        assert!(applies(&f32_states, 90));
    }
}
