//! Replayable launch plans of the scan (`ops::scan::FwdReplay`, `ops::scan_bwd::BwdReplay`)
//! as Python objects: `selective_scan_fwd(..., replay=True)` / `selective_scan_bwd(...,
//! replay=True)` check and plan a call without launching it and return one of these, whose
//! `launch` replays the call on new raw pointers. flashscan.torch's lean path keeps them per
//! signature, so a hot call skips the descriptors' import, the checks, the plan and the kernel
//! lookups. The caller guarantees that the pointers are tensors of the planned signature.

use pyo3::prelude::*;

use crate::{ops, stream_choice};

/// A checked one-launch scan forward of one signature, replayed on new pointers.
#[pyclass(module = "flashscan._native", frozen)]
pub(crate) struct ScanFwdReplay(pub(crate) ops::scan::FwdReplay);

#[pymethods]
impl ScanFwdReplay {
    /// The planned call on these pointers (0 for an absent optional; present exactly as in
    /// the planned call).
    #[pyo3(signature = (u, delta, A, B, C, D, z, delta_bias, initial_state, out, last_state, saved_states, stream))]
    #[allow(clippy::too_many_arguments, non_snake_case)]
    fn launch(
        &self,
        u: u64,
        delta: u64,
        A: u64,
        B: u64,
        C: u64,
        D: u64,
        z: u64,
        delta_bias: u64,
        initial_state: u64,
        out: u64,
        last_state: u64,
        saved_states: u64,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let ptrs = ops::scan::FwdPtrs {
            u,
            delta,
            a: A,
            b: B,
            c: C,
            d: D,
            z,
            delta_bias,
            initial_state,
            out,
            last_state,
            saved_states,
        };
        Ok(self.0.launch(&ptrs, stream_choice(stream))?)
    }
}

/// A checked scan backward of one signature, replayed on new pointers.
#[pyclass(module = "flashscan._native", frozen)]
pub(crate) struct ScanBwdReplay(pub(crate) ops::scan_bwd::BwdReplay);

#[pymethods]
impl ScanBwdReplay {
    /// The planned call on these pointers, in `selective_scan_bwd`'s order (0 for an absent
    /// optional; present exactly as in the planned call).
    #[pyo3(signature = (u, delta, A, B, C, D, z, delta_bias, initial_state, dout, saved_states, dlast_state, du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dinitial_state, stream))]
    #[allow(clippy::too_many_arguments, non_snake_case)]
    fn launch(
        &self,
        u: u64,
        delta: u64,
        A: u64,
        B: u64,
        C: u64,
        D: u64,
        z: u64,
        delta_bias: u64,
        initial_state: u64,
        dout: u64,
        saved_states: u64,
        dlast_state: u64,
        du: u64,
        ddelta: u64,
        dA: u64,
        dB: u64,
        dC: u64,
        dD: u64,
        dz: u64,
        ddelta_bias: u64,
        dinitial_state: u64,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let ptrs = ops::scan_bwd::BwdPtrs {
            inputs: [
                u,
                delta,
                A,
                B,
                C,
                D,
                z,
                delta_bias,
                initial_state,
                dout,
                saved_states,
                dlast_state,
            ],
            outputs: [du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dinitial_state],
        };
        Ok(self.0.launch(&ptrs, stream_choice(stream))?)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ScanFwdReplay>()?;
    m.add_class::<ScanBwdReplay>()?;
    Ok(())
}
