//! One module per operation: argument checks, variant choice, launch. Ops see `TensorView`s
//! only (never Python objects or DLPack capsules).

pub mod attention;
pub mod flash_tiles;
pub mod scan;
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
        let main = s
            .defines
            .iter()
            .any(|&(k, v)| k == "FS_HEAD_DIM" && (v == 64 || v == 128))
            && s.defines.iter().any(|&(k, v)| k == "FS_DTYPE" && v != 2);
        out.push((s, main));
    }
    for s in scan::all_specs(arch_num) {
        let main = s.defines.iter().any(|&(k, v)| k == "FS_DSTATE" && v == 16);
        out.push((s, main));
    }
    for s in state_update::all_specs(arch_num) {
        let main = s.defines.iter().any(|&(k, v)| k == "FS_DSTATE" && v == 16);
        out.push((s, main));
    }
    out
}
