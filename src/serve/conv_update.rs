//! `ConvUpdateServer`: `causal_conv1d_update`'s torch signatures; the op's checks on every call
//! (conv_state is written in place).

use pyo3::intern;
use pyo3::prelude::*;

use super::{Core, UpdatePlan};
use crate::ops;
use crate::runtime::StreamChoice;

/// The native server of `causal_conv1d_update`'s planned torch signatures (conv_state updated
/// in place: as the state update, the op's checks run on every call).
#[pyclass(module = "flashscan._native", frozen)]
pub(crate) struct ConvUpdateServer {
    core: Core<UpdatePlan>,
}

/// causal-conv1d's activation argument: None -> no SiLU, "silu" / "swish" -> SiLU; None for
/// anything else (the Python layer says what is wrong).
fn silu_of(activation: &Bound<'_, PyAny>) -> Option<bool> {
    if activation.is_none() {
        return Some(false);
    }
    match activation.extract::<String>().ok()?.as_str() {
        "silu" | "swish" => Some(true),
        _ => None,
    }
}

#[pymethods]
impl ConvUpdateServer {
    /// `tensor`: torch.Tensor (see `ScanServer`).
    #[new]
    fn new(tensor: &Bound<'_, PyAny>) -> Self {
        ConvUpdateServer {
            core: Core::new(tensor),
        }
    }

    /// `causal_conv1d_update`'s call on torch tensors (conv_state updated in place), served
    /// natively when its signature is planned (with `learn`: planned now); returns out, or
    /// None when it does not serve the call.
    #[pyo3(signature = (x, conv_state, weight, bias, cache_seqlens, activation, learn))]
    #[allow(clippy::too_many_arguments)]
    fn serve<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        conv_state: &Bound<'py, PyAny>,
        weight: &Bound<'py, PyAny>,
        bias: &Bound<'py, PyAny>,
        cache_seqlens: &Bound<'py, PyAny>,
        activation: &Bound<'py, PyAny>,
        learn: bool,
    ) -> PyResult<Option<PyObject>> {
        let Some(silu) = silu_of(activation) else {
            return Ok(None);
        };
        let objs = [x, conv_state, weight, bias, cache_seqlens];
        if !learn && !self.core.accepts(&objs, 3) {
            return Ok(None);
        }
        let Some((ex, call)) = self.core.read(&objs, 3, silu as i64) else {
            return Ok(None);
        };
        let Some(views) = call.views() else {
            return Ok(None);
        };
        let Some(plan) = self.core.find_or_learn(&call.key, learn, &objs, || {
            UpdatePlan::like(py, views[0].as_ref())
        }) else {
            return Ok(None);
        };
        let out = x.call_method1(intern!(py, "new_empty"), (plan.out_shape.bind(py),))?;
        let Some(vo) = ex.read(&out).and_then(|t| t.view()) else {
            return Ok(None);
        };
        let (Some(vx), Some(vs), Some(vw)) =
            (views[0].as_ref(), views[1].as_ref(), views[2].as_ref())
        else {
            return Ok(None);
        };
        let args = ops::conv1d::Conv1dUpdateArgs {
            x: vx,
            conv_state: vs,
            weight: vw,
            bias: views[3].as_ref(),
            cache_seqlens: views[4].as_ref(),
            out: &vo,
            silu,
        };
        let Some(stream) = ex.cuda_stream(vx.device_id) else {
            return Ok(None);
        };
        ops::conv1d::update(&args, StreamChoice::Caller(stream))?;
        Ok(Some(out.unbind()))
    }

    /// Signatures held, refused ones included (tests).
    fn plan_count(&self) -> usize {
        self.core.plan_count()
    }
}
