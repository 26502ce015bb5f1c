//! `SsdServer`: `mamba_chunk_scan_combined`'s planned torch signatures (no autograd, no varlen
//! states); workspaces from the device's stream-ordered pool, the op's checks on every call.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::{f32_kw, is_bool, needs_grad, Core};
use crate::ops;
use crate::runtime::StreamChoice;
use crate::tensor::{DeviceKind, TensorView};

/// A planned SSD signature: what a call allocates through torch (out like x, the final
/// states) and the workspaces it takes from the device's stream-ordered scratch pool.
struct SsdPlan {
    out_shape: Py<PyTuple>,
    final_shape: Option<Py<PyTuple>>,
    /// (batch, nchunks, nheads, headdim, dstate), (batch, nheads, nchunks), and with the second
    /// forward path (batch, nchunks, ngroups, chunk, chunk), all float32
    states: [i64; 5],
    decay: [i64; 3],
    cb: Option<[i64; 5]>,
}

/// The native server of `mamba_chunk_scan_combined`'s planned torch signatures (no autograd,
/// no varlen states). The op's checks run on every call.
#[pyclass(module = "flashscan._native", frozen)]
pub(crate) struct SsdServer {
    core: Core<SsdPlan>,
    grad_enabled: Py<PyAny>,
    f32_kw: Py<PyDict>,
}

/// A contiguous float32 view of scratch memory.
fn f32_view(ptr: u64, shape: &[i64], device_id: i32) -> TensorView {
    TensorView {
        ptr,
        shape: shape.to_vec(),
        strides: crate::dlpack::compact_strides(shape),
        dtype: crate::tensor::DType::F32,
        device: DeviceKind::Cuda,
        device_id,
        readonly: false,
    }
}

impl SsdServer {
    /// The plan of a call whose views are `v` (x, dt, A, B, C, ...); None when it is not a
    /// CUDA call of the shapes the op takes (the Python layer then serves and checks it).
    fn plan(
        py: Python<'_>,
        v: &[Option<TensorView>],
        chunk: i64,
        return_final: bool,
        fwd2: bool,
    ) -> Option<SsdPlan> {
        let (vx, vb) = (v[0].as_ref()?, v[3].as_ref()?);
        if vx.device != DeviceKind::Cuda || vx.rank() != 4 || vb.rank() != 4 || chunk < 1 {
            return None;
        }
        let (batch, seqlen, nheads, headdim) = (vx.shape[0], vx.shape[1], vx.shape[2], vx.shape[3]);
        let (ngroups, dstate) = (vb.shape[2], vb.shape[3]);
        let nchunks = (seqlen + chunk - 1) / chunk;
        Some(SsdPlan {
            out_shape: PyTuple::new(py, &vx.shape).ok()?.unbind(),
            final_shape: if return_final {
                Some(
                    PyTuple::new(py, [batch, nheads, headdim, dstate])
                        .ok()?
                        .unbind(),
                )
            } else {
                None
            },
            states: [batch, nchunks, nheads, headdim, dstate],
            decay: [batch, nheads, nchunks],
            cb: fwd2.then_some([batch, nchunks, ngroups, chunk, chunk]),
        })
    }
}

#[pymethods]
impl SsdServer {
    /// `tensor`, `grad_enabled`, `float32`: as `ScanServer`'s.
    #[new]
    fn new(
        tensor: &Bound<'_, PyAny>,
        grad_enabled: Py<PyAny>,
        float32: Py<PyAny>,
    ) -> PyResult<Self> {
        Ok(SsdServer {
            core: Core::new(tensor),
            grad_enabled,
            f32_kw: f32_kw(tensor.py(), float32)?,
        })
    }

    /// `mamba_chunk_scan_combined`'s call on torch tensors, served natively when its
    /// signature is planned (with `learn`: planned now); returns out or (out, final_states),
    /// or None when it does not serve the call (varlen, an input needing autograd, a flag
    /// that is not a plain bool / int / pair of floats...).
    #[pyo3(signature = (x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit, return_final_states, return_varlen_states, learn))]
    #[allow(clippy::too_many_arguments, non_snake_case)]
    fn serve<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        dt: &Bound<'py, PyAny>,
        A: &Bound<'py, PyAny>,
        B: &Bound<'py, PyAny>,
        C: &Bound<'py, PyAny>,
        chunk_size: &Bound<'py, PyAny>,
        D: &Bound<'py, PyAny>,
        z: &Bound<'py, PyAny>,
        dt_bias: &Bound<'py, PyAny>,
        initial_states: &Bound<'py, PyAny>,
        seq_idx: &Bound<'py, PyAny>,
        cu_seqlens: &Bound<'py, PyAny>,
        dt_softplus: &Bound<'py, PyAny>,
        dt_limit: &Bound<'py, PyAny>,
        return_final_states: &Bound<'py, PyAny>,
        return_varlen_states: &Bound<'py, PyAny>,
        learn: bool,
    ) -> PyResult<Option<PyObject>> {
        let (Some(softplus), Some(return_final), Some(false)) = (
            is_bool(dt_softplus),
            is_bool(return_final_states),
            is_bool(return_varlen_states),
        ) else {
            return Ok(None);
        };
        if !cu_seqlens.is_none() || chunk_size.is_instance_of::<pyo3::types::PyBool>() {
            return Ok(None);
        }
        let Ok(chunk) = chunk_size.extract::<i64>() else {
            return Ok(None);
        };
        let Ok((lo, hi)) = dt_limit
            .downcast::<PyTuple>()
            .map_err(PyErr::from)
            .and_then(|t| t.extract::<(f64, f64)>())
        else {
            return Ok(None);
        };
        // the second forward path unless FLASHSCAN_SSD_FWD=1 (read per call, as the Python
        // layer does; only 16-bit x takes it)
        let first_path = std::env::var("FLASHSCAN_SSD_FWD").is_ok_and(|v| v == "1");
        let objs = [x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx];
        let mut flags = chunk << 3 | (softplus as i64) | (return_final as i64) << 1;
        flags |= (first_path as i64) << 2;
        // only tensors of planned types; autograd calls belong to flashscan.torch
        if (!learn && !self.core.accepts(&objs, 5))
            || needs_grad(self.grad_enabled.bind(py), &objs)?
        {
            return Ok(None);
        }
        let Some((ex, mut call)) = self.core.read(&objs, 5, flags) else {
            return Ok(None);
        };
        call.key.push(lo.to_bits() as i64);
        call.key.push(hi.to_bits() as i64);
        let Some(views) = call.views() else {
            return Ok(None);
        };
        let Some(plan) = self.core.find_or_learn(&call.key, learn, &objs, || {
            // the second forward path for 16-bit x unless FLASHSCAN_SSD_FWD=1 (in the key)
            let fwd2 = !first_path
                && views[0].as_ref().is_some_and(|v| {
                    matches!(
                        v.dtype,
                        crate::tensor::DType::F16 | crate::tensor::DType::BF16
                    )
                });
            Self::plan(py, &views, chunk, return_final, fwd2)
        }) else {
            return Ok(None);
        };
        let out = x.call_method1(intern!(py, "new_empty"), (plan.out_shape.bind(py),))?;
        let fin = match &plan.final_shape {
            Some(shape) => Some(x.call_method(
                intern!(py, "new_empty"),
                (shape.bind(py),),
                Some(self.f32_kw.bind(py)),
            )?),
            None => None,
        };
        let Some(vo) = ex.read(&out).and_then(|t| t.view()) else {
            return Ok(None);
        };
        let vf = match &fin {
            Some(f) => match ex.read(f).and_then(|t| t.view()) {
                Some(v) => Some(v),
                None => return Ok(None),
            },
            None => None,
        };
        let Some(vx) = views[0].as_ref() else {
            return Ok(None);
        };
        let Some(stream) = ex.cuda_stream(vx.device_id) else {
            return Ok(None);
        };
        // the workspaces from the device's stream-ordered pool, freed after the launches
        let rt = crate::runtime::runtime().map_err(crate::error::Error::Unavailable)?;
        let dev = rt.device(vx.device_id)?;
        let _bound = dev.bind()?;
        let mut scratch = dev.scratch(crate::runtime::Stream::from_raw(stream))?;
        let bytes = |s: &[i64]| s.iter().product::<i64>().max(1) as usize * 4;
        let vs = f32_view(
            scratch.alloc(bytes(&plan.states))?,
            &plan.states,
            vx.device_id,
        );
        let vd = f32_view(
            scratch.alloc(bytes(&plan.decay))?,
            &plan.decay,
            vx.device_id,
        );
        let vcb = match &plan.cb {
            Some(s) => Some(f32_view(scratch.alloc(bytes(s))?, s, vx.device_id)),
            None => None,
        };
        let (Some(vdt), Some(va), Some(vb), Some(vc)) = (
            views[1].as_ref(),
            views[2].as_ref(),
            views[3].as_ref(),
            views[4].as_ref(),
        ) else {
            return Ok(None);
        };
        let args = ops::ssd::SsdArgs {
            inputs: ops::ssd::SsdInputs {
                x: vx,
                dt: vdt,
                a: va,
                b: vb,
                c: vc,
                d: views[5].as_ref(),
                z: views[6].as_ref(),
                dt_bias: views[7].as_ref(),
                initial_states: views[8].as_ref(),
                seq_idx: views[9].as_ref(),
                chunk_size: chunk,
                dt_softplus: softplus,
                dt_limit: (lo, hi),
            },
            out: &vo,
            final_states: vf.as_ref(),
            states: &vs,
            decay: &vd,
            cb: vcb.as_ref(),
            states16: None,
            varlen: None,
        };
        ops::ssd::forward(&args, StreamChoice::Caller(stream))?;
        scratch.free()?;
        Ok(Some(match fin {
            Some(f) => PyTuple::new(py, [out, f])?.into_any().unbind(),
            None => out.unbind(),
        }))
    }

    /// Signatures held, refused ones included (tests).
    fn plan_count(&self) -> usize {
        self.core.plan_count()
    }
}
