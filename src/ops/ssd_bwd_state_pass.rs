//! The SSD backward's L_c and reverse state passing in one sm_90a kernel (`ssd_bwd_dstate_pass`
//! in cuda/ssd_bwd.cu): one CTA per (batch, head, 64 x 128 tile) walks the head's chunks from the
//! last to the first with dS in its wgmma accumulator, fed by TMA, where `ssd_bwd` otherwise runs
//! `ssd_bwd_chunk_dstate16` (L_c in fp32 to a workspace) and `ssd_bwd_state_passing` (reads it
//! back). This module holds its applicability rule, its three tensor maps and parameter block,
//! and its launch.

use super::ssd::{rows16, s3, Problem};
use super::ssd_bwd::SsdBwdParams;
use super::ssd_scan_ws::rows_map;
use crate::error::Result;
use crate::runtime::driver::encode_tensor_map_4d;
use crate::runtime::{DeviceCtx, KernelSpec, Stream};
use crate::tensor::TensorView;

pub const ENTRY: &str = "ssd_bwd_dstate_pass";
/// Positions a step (the dout / C boxes' rows); mirrors kSpPos in cuda/ssd_bwd.cu.
const POS: u32 = 32;
/// Threads a CTA (one warpgroup); mirrors kThreads.
const THREADS: u32 = 128;
/// Warps a CTA: each leaves one df_c partial per chunk (`SsdBwdParams::npass_tiles` counts
/// `tiles * WARPS` partials a (batch, head)).
pub const WARPS: i64 = 4;

/// Mirrors `struct SsdBwdSpParams` in cuda/ssd_bwd.cu: three tensor maps (64-byte aligned), then
/// the backward's parameter block.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct SsdBwdSpParams {
    pub tm_g: [u64; 16],
    pub tm_c: [u64; 16],
    pub tm_h: [u64; 16],
    pub q: SsdBwdParams,
}

const _: () = assert!(std::mem::offset_of!(SsdBwdSpParams, q) == 384);
const _: () = assert!(std::mem::size_of::<SsdBwdSpParams>() == 1472);

/// The default since 2026-12-05 (H200, b8 L2048 80 x 64, state 128): 140.5-141.3 us against
/// ssd_bwd_chunk_dstate16 + ssd_bwd_state_passing's 120.8-121.4 + 93.4-93.6, the SSD step
/// 1829-1835 against 1907-1915 us, the full SSD GPU suite and memcheck / racecheck / synccheck
/// passing (benches/results/2026-12-05-h200-ssd-pending/, 2026-12-05-h200-ssd-bwd-state-pass/).
/// `FLASHSCAN_SSD_BWD_STATE_PASS=0` runs the pair. Read on every call, so one process can run
/// both forms.
fn on() -> bool {
    std::env::var("FLASHSCAN_SSD_BWD_STATE_PASS").as_deref() != Ok("0")
}

/// What the rule looks at: a 16-bit call's backward with the forward's kept H_c.
pub struct Call<'a> {
    pub arch: i64,
    pub bf16: bool,
    pub has_seq: bool,
    /// L_c's hi / lo split asked for (FLASHSCAN_SSD_DSTATE_HILO=1): the pair's form only
    pub hilo: bool,
    pub dout: &'a TensorView,
    pub c: &'a TensorView,
    /// the forward's kept 16-bit H_c, (batch, nchunks, nheads, headdim, dstate), contiguous
    pub kept: &'a TensorView,
}

/// CTAs a (batch, head): 64 x 128 tiles of (headdim, dstate), as ssd2_chunk_state_pass's.
pub fn tiles(p: &Problem) -> i64 {
    ((p.headdim + 63) / 64) * ((p.dstate + 127) / 128)
}

/// Whether the kernel can take the call: sm_90a (its product is the wgmma one), no seq_idx (e_l
/// and f_c without resets), the one-rounding L_c, and dout, C and the kept H_c in rows TMA can
/// address (16-byte aligned starts and strides; H_c rows of dstate values: dstate % 8 == 0).
fn applies(c: &Call, p: &Problem) -> bool {
    c.arch == 90
        && !c.has_seq
        && !c.hilo
        && rows16(c.dout, p.headdim) == 1
        && rows16(c.c, p.dstate) == 1
        && p.dstate % 8 == 0
        && c.kept.ptr % 16 == 0
}

/// The three tensor maps: dout (headdim, nheads, seqlen, batch) and C (dstate, ngroups, seqlen,
/// batch) in boxes of 64 x 1 x POS x 1; the kept H_c (dstate, headdim, nheads, batch * nchunks)
/// in boxes of 64 x 64.
fn maps(c: &Call, p: &Problem) -> Result<[[u64; 16]; 3]> {
    let (hd, nh, l, b) = (p.headdim, p.nheads, p.seqlen, p.batch);
    let (ds, ng) = (p.dstate, p.ngroups);
    let tm_g = rows_map(c.dout.ptr, c.bf16, s3(c.dout), hd, nh, l, b, POS)?;
    let tm_c = rows_map(c.c.ptr, c.bf16, s3(c.c), ds, ng, l, b, POS)?;
    let slot = (hd * ds * 2) as u64;
    let tm_h = encode_tensor_map_4d(
        c.kept.ptr,
        c.bf16,
        [ds as u64, hd as u64, nh as u64, (b * p.nchunks) as u64],
        [(ds * 2) as u64, slot, slot * nh as u64],
        [64, 64, 1, 1],
    )?;
    Ok([tm_g, tm_c, tm_h])
}

/// The kernel's tensor maps where the call takes it (`on`, `applies`) and they encode; None
/// otherwise (the pair runs). Decided before the backward lays out its workspace: the kernel
/// leaves `tiles * WARPS` df partials a (batch, head) and needs no fp32 L_c.
pub fn plan(c: &Call, p: &Problem) -> Option<[[u64; 16]; 3]> {
    if !on() || !applies(c, p) {
        return None;
    }
    // the driver refuses a map whose strides or base are off: the pair covers those
    maps(c, p).ok()
}

/// Launches ssd_bwd_dstate_pass with `plan`'s maps: grid (batch * nheads, tiles).
///
/// # Safety
/// `q` must describe checked tensors and workspaces of the sizes `p` gives, on `dev`, with
/// `q.npass_tiles == tiles(p) * WARPS`, the prologue records (`q.pcum`) and the kept H_c / f_c
/// written earlier on `st`.
pub unsafe fn launch(
    dev: &DeviceCtx,
    spec: &KernelSpec,
    q: &SsdBwdParams,
    maps: &[[u64; 16]; 3],
    grid: (u32, u32),
    st: Stream,
) -> Result<()> {
    let [tm_g, tm_c, tm_h] = *maps;
    let params = SsdBwdSpParams {
        tm_g,
        tm_c,
        tm_h,
        q: *q,
    };
    let k = dev.kernel(spec)?;
    // SAFETY: as the caller's; the kernel reads dout, C, H_c, f_c and the records inside the
    // sizes `p` gives and writes dS_c, the df partials and dinitial_states of its (batch, head,
    // tile).
    unsafe { dev.launch(&k, (grid.0, grid.1, 1), (THREADS, 1, 1), 0, st, &params) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    fn view(shape: &[i64], ptr: u64) -> TensorView {
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len() - 1).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        crate::tensor::cuda_view(shape, &strides, DType::BF16, ptr)
    }

    #[test]
    fn applies_to_tma_rows_without_seq_idx_on_sm90_only() {
        let p = super::super::ssd::LAYER_2K;
        let dout = view(&[p.batch, p.seqlen, p.nheads, p.headdim], 1 << 20);
        let c = view(&[p.batch, p.seqlen, p.ngroups, p.dstate], 1 << 21);
        let kept = view(
            &[p.batch, p.nchunks, p.nheads, p.headdim, p.dstate],
            1 << 22,
        );
        let call = |arch, has_seq, hilo, kept: &TensorView| {
            applies(
                &Call {
                    arch,
                    bf16: true,
                    has_seq,
                    hilo,
                    dout: &dout,
                    c: &c,
                    kept,
                },
                &p,
            )
        };
        assert!(call(90, false, false, &kept));
        assert!(!call(80, false, false, &kept));
        assert!(!call(100, false, false, &kept));
        assert!(!call(90, true, false, &kept));
        assert!(!call(90, false, true, &kept));
        let off = view(
            &[p.batch, p.nchunks, p.nheads, p.headdim, p.dstate],
            (1 << 22) + 8,
        );
        assert!(!call(90, false, false, &off));
        let mut q = p;
        q.dstate = 20; // rows of 40 bytes: no TMA stride
        assert!(!applies(
            &Call {
                arch: 90,
                bf16: true,
                has_seq: false,
                hilo: false,
                dout: &dout,
                c: &c,
                kept: &kept,
            },
            &q,
        ));
    }

    #[test]
    fn tiles_cover_headdim_by_64_and_dstate_by_128() {
        let mut p = super::super::ssd::LAYER_2K; // 64 x 128
        assert_eq!(tiles(&p), 1);
        p.headdim = 136;
        p.dstate = 200;
        assert_eq!(tiles(&p), 3 * 2);
    }
}
