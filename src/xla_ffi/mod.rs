//! XLA typed-FFI handlers, so that `flashscan.jax` runs our kernels inside `jax.jit` on XLA's
//! stream. Written against the C ABI of `xla/ffi/api/c_api.h` with our own `#[repr(C)]` types
//! (`abi.rs`): no XLA/JAX header, no C++ toolchain, nothing new linked.
//!
//! - `abi.rs`: the mirrored structs and constants (API version 0.1), with size checks.
//! - `frame.rs`: reading one call (metadata stage, buffers, attributes, stream, errors).
//! - `handlers.rs`: one handler per target, each calling an `ops::*` entry.
//!
//! To add a target (Mamba-2 SSD, varlen attention, ...): write its body in `handlers.rs` on
//! the pattern of the others (operands in the op's argument order, optional ones behind bits of
//! the `optional` attribute), export it with `handler!`, list it in `TARGETS`, and wrap it in
//! `python/flashscan/jax.py`.

pub mod abi;
mod frame;
pub mod handlers;
#[cfg(test)]
mod tests;

/// (target name suffix, handler): `flashscan.jax` registers each as `flashscan_<name>` for the
/// CUDA platform.
pub const TARGETS: &[(&str, abi::Handler)] = &[
    ("flash_attn_fwd", handlers::flash_attn_fwd),
    ("flash_attn_bwd", handlers::flash_attn_bwd),
    ("selective_scan_fwd", handlers::selective_scan_fwd),
    ("selective_scan_bwd", handlers::selective_scan_bwd),
    ("selective_state_update", handlers::selective_state_update),
];
