//! One module per operation: argument checks, variant choice, launch. Ops see `TensorView`s
//! only (never Python objects or DLPack capsules).

pub mod attention;
pub mod attention_bwd;
pub mod attention_decode;
pub mod attention_fp8;
pub mod attention_tma;
pub mod attention_varlen;
pub mod conv1d;
pub mod flash_tiles;
pub mod kvcache_append;
pub mod scan;
pub mod scan_bwd;
pub mod ssd;
pub mod ssd_bwd;
pub mod ssd_bwd_state_pass;
pub mod ssd_scan_ws;
pub mod ssd_state_pass;
pub mod state_update;

use crate::runtime::KernelSpec;

/// Smallest power of two >= n (1 for n <= 1).
pub(crate) fn next_pow2(n: i64) -> i64 {
    let mut p = 1;
    while p < n {
        p *= 2;
    }
    p
}

/// Every kernel variant the package can emit for `arch_num` (compute capability * 10), with
/// whether it is a "main" variant (one that must show no local-memory spills).
pub fn all_variants(arch_num: i64) -> Vec<(KernelSpec, bool)> {
    let mut out = Vec::new();
    for s in attention::all_specs(arch_num) {
        // (every TMA variant, head dim 256's too: it is the default there)
        let main = s.defines.iter().any(|&(k, v)| {
            k == "FS_HEAD_DIM"
                && (v == 64 || v == 128 || (v == 256 && s.family == attention_tma::FAMILY))
        }) && s.defines.iter().any(|&(k, v)| k == "FS_DTYPE" && v != 2);
        out.push((s, main));
    }
    // The FP8 forward (sm_90 only) and its Vt pre-pass: main
    for s in attention_fp8::all_specs(arch_num) {
        out.push((s, true));
    }
    // Backward kernels: none is "main" (some 16-bit attention variants sit at 255 registers
    // with a few spilled bytes); test_kernels_compile bounds their spills separately.
    for s in attention_bwd::all_specs(arch_num) {
        out.push((s, false));
    }
    // The sm_90a wgmma backward (the default on sm_90a) is main: it must stay spill-free.
    for s in attention_bwd::sm90_specs(arch_num) {
        out.push((s, true));
    }
    for s in attention_bwd::sm90_aux_specs(arch_num) {
        out.push((s, true));
    }
    // Varlen: the packed-sequence builds of the attention kernels. None is "main": the 255-register
    // tiles spill a little in some (sm_90a bf16 hd64 128x128 masked forward: 32 B, measured
    // 2026-11-23); test_kernels_compile bounds their spills with the training variants.
    // The TMA forward's packed-sequence builds are main (spill-free, like its dense ones).
    for s in attention_varlen::all_specs(arch_num) {
        let main = s.family == attention_tma::FAMILY;
        out.push((s, main));
    }
    // Decode: the hd64 / hd128 attention tiles and the combine / append kernels are main.
    out.extend(attention_decode::all_specs(arch_num));
    for s in scan::all_specs(arch_num) {
        // the state-saving forward (training only) is bounded with the backward kernels
        let saving = s
            .defines
            .iter()
            .any(|&(k, v)| k == "FS_SAVE_STATES" && v == 1);
        let main = !saving && s.defines.iter().any(|&(k, v)| k == "FS_DSTATE" && v == 16);
        out.push((s, main));
    }
    for s in scan_bwd::all_specs(arch_num) {
        out.push((s, false));
    }
    // SSD (Mamba-2): the 16-bit chunk-256 kernels are main
    for s in ssd::all_specs(arch_num) {
        let main = s.defines.iter().any(|&(k, v)| k == "FS_CHUNK" && v == 256)
            && s.defines.iter().any(|&(k, v)| k == "FS_DTYPE" && v != 2);
        out.push((s, main));
    }
    // SSD forward, second path (the 16-bit default; test_kernels_compile bounds its spills to 0)
    for s in ssd::all_specs2(arch_num) {
        out.push((s, false));
    }
    // SSD backward: one translation unit per (dtype, chunk) holding all eight kernels; bounded
    // with the training variants (NVRTC 13.2, 2026-11-23: sm_80 spill-free; sm_90a an 8-16 B
    // stack frame in ssd_bwd_chunk_dc at chunk 64, no local spills)
    for s in ssd_bwd::all_specs(arch_num) {
        out.push((s, false));
    }
    for s in state_update::all_specs(arch_num) {
        let main = s.defines.iter().any(|&(k, v)| k == "FS_DSTATE" && v == 16);
        out.push((s, main));
    }
    out.extend(conv1d::all_specs(arch_num));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_are_unique() {
        for arch in [80, 90] {
            let v = all_variants(arch);
            let names: std::collections::HashSet<String> =
                v.iter().map(|(s, _)| s.name()).collect();
            assert_eq!(
                names.len(),
                v.len(),
                "duplicate variant names for sm_{arch}"
            );
        }
    }
}
