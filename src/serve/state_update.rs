//! `StateUpdateServer`: `selective_state_update`'s torch signatures; the op's checks on every
//! call (the state is written in place).

use pyo3::intern;
use pyo3::prelude::*;

use super::{is_bool, Core, UpdatePlan};
use crate::ops;
use crate::runtime::StreamChoice;
use crate::tensor::TensorView;

/// The native server of `selective_state_update`'s planned torch signatures.
#[pyclass(module = "flashscan._native", frozen)]
pub(crate) struct StateUpdateServer {
    core: Core<UpdatePlan>,
}

fn update_args<'a>(
    v: &'a [Option<TensorView>],
    out: &'a TensorView,
    softplus: bool,
) -> Option<ops::state_update::StateUpdateArgs<'a>> {
    Some(ops::state_update::StateUpdateArgs {
        state: v[0].as_ref()?,
        x: v[1].as_ref()?,
        dt: v[2].as_ref()?,
        a: v[3].as_ref()?,
        b: v[4].as_ref()?,
        c: v[5].as_ref()?,
        d: v[6].as_ref(),
        z: v[7].as_ref(),
        dt_bias: v[8].as_ref(),
        out,
        dt_softplus: softplus,
    })
}

#[pymethods]
impl StateUpdateServer {
    /// `tensor`: torch.Tensor (see `ScanServer`).
    #[new]
    fn new(tensor: &Bound<'_, PyAny>) -> Self {
        StateUpdateServer {
            core: Core::new(tensor),
        }
    }

    /// `selective_state_update`'s call on torch tensors (state updated in place), served
    /// natively when its signature is planned (with `learn`: planned now if the native
    /// checks pass); returns out, or None when it does not serve the call.
    #[pyo3(signature = (state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, learn))]
    #[allow(clippy::too_many_arguments, non_snake_case)]
    fn serve<'py>(
        &self,
        py: Python<'py>,
        state: &Bound<'py, PyAny>,
        x: &Bound<'py, PyAny>,
        dt: &Bound<'py, PyAny>,
        A: &Bound<'py, PyAny>,
        B: &Bound<'py, PyAny>,
        C: &Bound<'py, PyAny>,
        D: &Bound<'py, PyAny>,
        z: &Bound<'py, PyAny>,
        dt_bias: &Bound<'py, PyAny>,
        dt_softplus: &Bound<'py, PyAny>,
        learn: bool,
    ) -> PyResult<Option<PyObject>> {
        let Some(softplus) = is_bool(dt_softplus) else {
            return Ok(None);
        };
        let objs = [state, x, dt, A, B, C, D, z, dt_bias];
        if !learn && !self.core.accepts(&objs, 6) {
            return Ok(None);
        }
        let Some((ex, call)) = self.core.read(&objs, 6, softplus as i64) else {
            return Ok(None);
        };
        let Some(views) = call.views() else {
            return Ok(None);
        };
        let Some(plan) = self.core.find_or_learn(&call.key, learn, &objs, || {
            UpdatePlan::like(py, views[1].as_ref())
        }) else {
            return Ok(None);
        };
        let out = x.call_method1(intern!(py, "new_empty"), (plan.out_shape.bind(py),))?;
        let Some(vo) = ex.read(&out).and_then(|t| t.view()) else {
            return Ok(None);
        };
        let Some(args) = update_args(&views, &vo, softplus) else {
            return Ok(None);
        };
        let device_id = call.t[1].as_ref().map_or(0, |t| t.device_id);
        let Some(stream) = ex.cuda_stream(device_id) else {
            return Ok(None);
        };
        ops::state_update::update(&args, StreamChoice::Caller(stream))?;
        Ok(Some(out.unbind()))
    }

    /// Signatures held, refused ones included (tests).
    fn plan_count(&self) -> usize {
        self.core.plan_count()
    }
}
