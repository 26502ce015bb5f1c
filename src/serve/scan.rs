//! `ScanServer`: `selective_scan_fn`'s planned torch signatures (no autograd) through their
//! replay plans (`ops::scan::FwdReplay`).

use std::sync::Arc;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::{f32_kw, is_bool, needs_grad, ptr_of, Call, Core};
use crate::ops;
use crate::runtime::StreamChoice;
use crate::tensor::DeviceKind;
use crate::torch_exchange::TorchExchange;

/// A planned scan signature: the replay and the shapes of what a call allocates.
struct ScanPlan {
    replay: ops::scan::FwdReplay,
    out_shape: Py<PyTuple>,
    last_shape: Option<Py<PyTuple>>,
}

/// The native server of `selective_scan_fn`'s planned torch signatures (no autograd).
#[pyclass(module = "flashscan._native", frozen)]
pub(crate) struct ScanServer {
    core: Core<ScanPlan>,
    /// `torch.is_grad_enabled`
    grad_enabled: Py<PyAny>,
    /// `{"dtype": torch.float32}`: the last state's allocation
    f32_kw: Py<PyDict>,
}

impl ScanServer {
    /// Plans the call (every native check), allocating its outputs for real; None when the
    /// native layer refuses it or it is not one launch.
    fn plan<'py>(
        &self,
        u: &Bound<'py, PyAny>,
        ex: &TorchExchange,
        call: &Call,
        softplus: bool,
        return_last: bool,
    ) -> Option<(ScanPlan, Bound<'py, PyAny>, Option<Bound<'py, PyAny>>)> {
        let py = u.py();
        let views = call.views()?;
        let (vu, va) = (views[0].as_ref()?, views[2].as_ref()?);
        if vu.rank() != 3 || va.rank() != 2 || vu.device != DeviceKind::Cuda {
            return None;
        }
        let out_shape = PyTuple::new(py, &vu.shape).ok()?;
        let last_shape = PyTuple::new(py, [vu.shape[0], vu.shape[1], va.shape[1]]).ok()?;
        let out = u
            .call_method1(intern!(py, "new_empty"), (&out_shape,))
            .ok()?;
        let last = if return_last {
            let kw = self.f32_kw.bind(py);
            Some(
                u.call_method(intern!(py, "new_empty"), (&last_shape,), Some(kw))
                    .ok()?,
            )
        } else {
            None
        };
        let vo = ex.read(&out)?.view()?;
        let vl = match &last {
            Some(l) => Some(ex.read(l)?.view()?),
            None => None,
        };
        let args = ops::scan::ScanArgs {
            u: vu,
            delta: views[1].as_ref()?,
            a: va,
            b: views[3].as_ref()?,
            c: views[4].as_ref()?,
            d: views[5].as_ref(),
            z: views[6].as_ref(),
            delta_bias: views[7].as_ref(),
            initial_state: views[8].as_ref(),
            out: &vo,
            last_state: vl.as_ref(),
            saved_states: None,
            delta_softplus: softplus,
        };
        let replay = ops::scan::forward_replay(&args).ok()??;
        Some((
            ScanPlan {
                replay,
                out_shape: out_shape.unbind(),
                last_shape: return_last.then(|| last_shape.unbind()),
            },
            out,
            last,
        ))
    }
}

#[pymethods]
impl ScanServer {
    /// `tensor`: torch.Tensor (whose class attribute holds the exchange table); the server
    /// refuses every call where it holds none.
    #[new]
    fn new(
        tensor: &Bound<'_, PyAny>,
        grad_enabled: Py<PyAny>,
        float32: Py<PyAny>,
    ) -> PyResult<Self> {
        Ok(ScanServer {
            core: Core::new(tensor),
            grad_enabled,
            f32_kw: f32_kw(tensor.py(), float32)?,
        })
    }

    /// `selective_scan_fn`'s call on torch tensors, served natively when its signature is
    /// planned (with `learn`: planned now if the native checks pass); returns out, or (out,
    /// last_state) with return_last_state, or None when it does not serve the call (the
    /// Python layer does). Optionals are None when absent; the flags must be bools.
    #[pyo3(signature = (u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, return_last_state, learn))]
    #[allow(clippy::too_many_arguments, non_snake_case)]
    fn serve<'py>(
        &self,
        py: Python<'py>,
        u: &Bound<'py, PyAny>,
        delta: &Bound<'py, PyAny>,
        A: &Bound<'py, PyAny>,
        B: &Bound<'py, PyAny>,
        C: &Bound<'py, PyAny>,
        D: &Bound<'py, PyAny>,
        z: &Bound<'py, PyAny>,
        delta_bias: &Bound<'py, PyAny>,
        initial_state: &Bound<'py, PyAny>,
        delta_softplus: &Bound<'py, PyAny>,
        return_last_state: &Bound<'py, PyAny>,
        learn: bool,
    ) -> PyResult<Option<PyObject>> {
        let (Some(softplus), Some(return_last)) =
            (is_bool(delta_softplus), is_bool(return_last_state))
        else {
            return Ok(None);
        };
        let objs = [u, delta, A, B, C, D, z, delta_bias, initial_state];
        let flags = softplus as i64 | (return_last as i64) << 1;
        // only tensors of planned types; autograd calls belong to flashscan.torch
        if (!learn && !self.core.accepts(&objs, 5))
            || needs_grad(self.grad_enabled.bind(py), &objs)?
        {
            return Ok(None);
        }
        let Some((ex, call)) = self.core.read(&objs, 5, flags) else {
            return Ok(None);
        };
        let (plan, out, last) = match self.core.find(&call.key) {
            Some(Some(s)) => (s, None, None),
            Some(None) => return Ok(None),
            None if !learn => return Ok(None),
            None => match self.plan(u, &ex, &call, softplus, return_last) {
                None => {
                    self.core.keep(call.key, None, &objs);
                    return Ok(None);
                }
                Some((s, out, last)) => {
                    let s = Arc::new(s);
                    self.core.keep(call.key.clone(), Some(s.clone()), &objs);
                    (s, Some(out), last)
                }
            },
        };
        let out = match out {
            Some(o) => o,
            None => u.call_method1(intern!(py, "new_empty"), (plan.out_shape.bind(py),))?,
        };
        let last = match (&plan.last_shape, last) {
            (_, Some(l)) => Some(l),
            (Some(shape), None) => Some(u.call_method(
                intern!(py, "new_empty"),
                (shape.bind(py),),
                Some(self.f32_kw.bind(py)),
            )?),
            (None, None) => None,
        };
        let ptrs = ops::scan::FwdPtrs {
            u: call.ptr(0),
            delta: call.ptr(1),
            a: call.ptr(2),
            b: call.ptr(3),
            c: call.ptr(4),
            d: call.ptr(5),
            z: call.ptr(6),
            delta_bias: call.ptr(7),
            initial_state: call.ptr(8),
            out: ptr_of(&ex, &out)?,
            last_state: match &last {
                Some(l) => ptr_of(&ex, l)?,
                None => 0,
            },
            saved_states: 0,
        };
        let device_id = call.t[0].as_ref().map_or(0, |x| x.device_id);
        let Some(stream) = ex.cuda_stream(device_id) else {
            return Ok(None);
        };
        plan.replay.launch(&ptrs, StreamChoice::Caller(stream))?;
        Ok(Some(match last {
            Some(l) => PyTuple::new(py, [out, l])?.into_any().unbind(),
            None => out.unbind(),
        }))
    }

    /// How many signatures it holds, refused ones included (for tests; not `__len__`: the
    /// Python layer tests the server's truth).
    fn plan_count(&self) -> usize {
        self.core.plan_count()
    }
}
