//! One native call per hot torch call: `ScanServer.serve` takes `selective_scan_fn`'s
//! arguments as they come from Python, reads the torch tensors through torch's DLPack C
//! exchange table (`torch_exchange`), finds the signature's replay plan in a Rust map,
//! allocates the output through torch, and launches on torch's current stream. The Python
//! layer's signature key (a `.shape`, `.stride()`, `.dtype`, `.device` read a tensor), its
//! pointer reads and the plan lookup were ~10 us of a 24 us real-time call on the H100 host.
//!
//! Safety of serving without checks: a signature is only planned when the Python layer asks
//! (`learn=True`), which it does from its hot path, i.e. for a signature its general path
//! checked and served on a usable device; planning runs every native check again
//! (`ops::scan::forward_replay`). A call is served only when every tensor's exact type is
//! one a planned call had (torch.Tensor, nn.Parameter: no subclass with its own dispatch),
//! its dtype / device / shape / strides and the flags equal a planned signature's, and no
//! input needs autograd. Anything else returns None and the Python layer takes the call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::ops;
use crate::runtime::StreamChoice;
use crate::tensor::{DeviceKind, TensorView};
use crate::torch_exchange::{TorchExchange, TorchTensor};

/// Signatures kept (the map is emptied when full: a workload whose shapes never repeat
/// re-plans, it does not grow without bound).
const MAX_PLANS: usize = 256;

/// A planned signature: the replay and the shapes of what a call allocates.
struct Served {
    replay: ops::scan::FwdReplay,
    out_shape: Py<PyTuple>,
    last_shape: Option<Py<PyTuple>>,
}

#[derive(Default)]
struct Plans {
    /// exact types of planned calls' tensors (type objects are immortal enough: kept)
    types: Vec<Py<PyAny>>,
    /// signature -> plan; None: refused (the Python layer serves it)
    map: HashMap<Vec<i64>, Option<Arc<Served>>>,
}

/// The native server of `selective_scan_fn`'s planned torch signatures (no autograd).
#[pyclass(module = "flashscan._native", frozen)]
pub(crate) struct ScanServer {
    /// torch's exchange table (None: this torch has none; every call is refused)
    exchange: Option<TorchExchange>,
    /// `torch.is_grad_enabled`
    grad_enabled: Py<PyAny>,
    /// `{"dtype": torch.float32}`: the last state's allocation
    f32_kw: Py<PyDict>,
    plans: Mutex<Plans>,
}

/// The nine inputs in `selective_scan_fwd`'s order.
const INPUTS: usize = 9;

fn is_bool(obj: &Bound<'_, PyAny>) -> Option<bool> {
    // SAFETY: Py_True / Py_False are the interpreter's singletons.
    unsafe {
        if obj.as_ptr() == ffi::Py_True() {
            Some(true)
        } else if obj.as_ptr() == ffi::Py_False() {
            Some(false)
        } else {
            None
        }
    }
}

impl ScanServer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Plans> {
        // a panic while holding it cannot leave the map half-written (single inserts)
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Plans the call of `t` (every native check), allocating its outputs for real; None
    /// when the native layer refuses it or it is not one launch.
    #[allow(clippy::too_many_arguments)]
    fn plan<'py>(
        &self,
        py: Python<'py>,
        u: &Bound<'py, PyAny>,
        t: &[Option<TorchTensor>; INPUTS],
        softplus: bool,
        return_last: bool,
    ) -> Option<(Served, Bound<'py, PyAny>, Option<Bound<'py, PyAny>>)> {
        let views: Vec<Option<TensorView>> = t
            .iter()
            .map(|x| x.as_ref().and_then(TorchTensor::view))
            .collect();
        if t.iter()
            .zip(&views)
            .any(|(x, v)| x.is_some() != v.is_some())
        {
            return None;
        }
        let (vu, va) = (views[0].as_ref()?, views[2].as_ref()?);
        if vu.rank() != 3 || va.rank() != 2 || vu.device != DeviceKind::Cuda {
            return None;
        }
        let out_shape = PyTuple::new(py, &vu.shape).ok()?;
        let last_shape = PyTuple::new(py, [vu.shape[0], vu.shape[1], va.shape[1]]).ok()?;
        let ex = self.exchange?;
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
            Served {
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
        let kw = PyDict::new(tensor.py());
        kw.set_item("dtype", float32)?;
        Ok(ScanServer {
            exchange: TorchExchange::of_class(tensor),
            grad_enabled,
            f32_kw: kw.unbind(),
            plans: Mutex::new(Plans::default()),
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
        let Some(ex) = self.exchange else {
            return Ok(None);
        };
        // only tensors of types planned calls had (a short lock: no Python runs under it)
        {
            let p = self.lock();
            if !learn {
                for (i, o) in objs.iter().enumerate() {
                    if i >= 5 && o.is_none() {
                        continue;
                    }
                    let tp = o.get_type_ptr() as *mut ffi::PyObject;
                    if !p.types.iter().any(|t| t.as_ptr() == tp) {
                        return Ok(None);
                    }
                }
            }
        }
        let mut t: [Option<TorchTensor>; INPUTS] = Default::default();
        let mut key = Vec::with_capacity(96);
        for (i, o) in objs.iter().enumerate() {
            if i >= 5 && o.is_none() {
                key.push(-1);
                continue;
            }
            let Some(x) = ex.read(o) else {
                return Ok(None);
            };
            x.push_signature(&mut key);
            t[i] = Some(x);
        }
        key.push(softplus as i64 | (return_last as i64) << 1);
        // autograd calls belong to flashscan.torch (every object is a torch tensor now)
        if self.grad_enabled.bind(py).call0()?.is_truthy()? {
            for o in objs {
                if !o.is_none() && o.getattr(intern!(py, "requires_grad"))?.is_truthy()? {
                    return Ok(None);
                }
            }
        }

        let found = self.lock().map.get(&key).cloned();
        let (served, out, last) = match found {
            Some(Some(s)) => (s, None, None),
            Some(None) => return Ok(None),
            None if !learn => return Ok(None),
            None => match self.plan(py, u, &t, softplus, return_last) {
                None => {
                    let mut p = self.lock();
                    if p.map.len() >= MAX_PLANS {
                        p.map.clear();
                    }
                    p.map.insert(key, None);
                    return Ok(None);
                }
                Some((s, out, last)) => {
                    let s = Arc::new(s);
                    let mut p = self.lock();
                    if p.map.len() >= MAX_PLANS {
                        p.map.clear();
                    }
                    p.map.insert(key, Some(s.clone()));
                    for o in objs.iter().filter(|o| !o.is_none()) {
                        let tp = o.get_type();
                        if !p.types.iter().any(|t| t.as_ptr() == tp.as_ptr()) {
                            p.types.push(tp.into_any().unbind());
                        }
                    }
                    (s, Some(out), last)
                }
            },
        };
        let out = match out {
            Some(o) => o,
            None => u.call_method1(intern!(py, "new_empty"), (served.out_shape.bind(py),))?,
        };
        let last = match (&served.last_shape, last) {
            (_, Some(l)) => Some(l),
            (Some(shape), None) => Some(u.call_method(
                intern!(py, "new_empty"),
                (shape.bind(py),),
                Some(self.f32_kw.bind(py)),
            )?),
            (None, None) => None,
        };
        let ptr = |x: &Option<TorchTensor>| x.as_ref().map_or(0, |x| x.ptr);
        let read_ptr = |o: &Bound<'py, PyAny>| -> PyResult<u64> {
            match ex.read(o) {
                Some(x) => Ok(x.ptr),
                None => Ok(o.call_method0(intern!(py, "data_ptr"))?.extract()?),
            }
        };
        let ptrs = ops::scan::FwdPtrs {
            u: ptr(&t[0]),
            delta: ptr(&t[1]),
            a: ptr(&t[2]),
            b: ptr(&t[3]),
            c: ptr(&t[4]),
            d: ptr(&t[5]),
            z: ptr(&t[6]),
            delta_bias: ptr(&t[7]),
            initial_state: ptr(&t[8]),
            out: read_ptr(&out)?,
            last_state: match &last {
                Some(l) => read_ptr(l)?,
                None => 0,
            },
            saved_states: 0,
        };
        let device_id = t[0].as_ref().map_or(0, |x| x.device_id);
        let Some(stream) = ex.cuda_stream(device_id) else {
            return Ok(None);
        };
        served.replay.launch(&ptrs, StreamChoice::Caller(stream))?;
        Ok(Some(match last {
            Some(l) => PyTuple::new(py, [out, l])?.into_any().unbind(),
            None => out.unbind(),
        }))
    }

    /// How many signatures it holds, refused ones included (for tests; not `__len__`: the
    /// Python layer tests the server's truth).
    fn plan_count(&self) -> usize {
        self.lock().map.len()
    }
}

/// `read` of one torch tensor through the exchange table, as (pointer, shape, strides,
/// dtype code / bits / lanes, device type, device id); None where torch has no table. The
/// tests compare it with torch's own accessors (the table's struct layout is ours to get
/// right).
type ExchangeRead = (u64, Vec<i64>, Vec<i64>, (i64, i64, i64), i32, i32);

#[pyfunction]
pub(crate) fn torch_exchange_read(t: &Bound<'_, PyAny>) -> Option<ExchangeRead> {
    let ex = TorchExchange::of_class(&t.get_type())?;
    let x = ex.read(t)?;
    Some((
        x.ptr,
        x.shape().to_vec(),
        x.strides().to_vec(),
        (x.dtype & 0xff, x.dtype >> 8 & 0xff, x.dtype >> 16),
        x.device_type,
        x.device_id,
    ))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ScanServer>()?;
    m.add_function(wrap_pyfunction!(torch_exchange_read, m)?)?;
    Ok(())
}
