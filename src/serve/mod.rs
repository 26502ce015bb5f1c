//! One native call per hot torch call: a server's `serve` takes its op's arguments as they
//! come from Python (`scan::ScanServer` `selective_scan_fn`'s, `state_update::StateUpdateServer`
//! `selective_state_update`'s, `conv_update::ConvUpdateServer` `causal_conv1d_update`'s,
//! `ssd::SsdServer` `mamba_chunk_scan_combined`'s; this file: what they share, `Core`),
//! reads the torch tensors through torch's DLPack C exchange table (`torch_exchange`), finds
//! the signature's plan in a Rust map, allocates the output through torch
//! (`Tensor.new_empty`: the caching allocator, so `record_stream` keeps working), and launches
//! on torch's current stream. The Python layer's signature key (a `.shape`, `.stride()`,
//! `.dtype`, `.device` read a tensor), its pointer reads and the plan lookup were ~10 us of a
//! 24 us real-time scan call on the H100 host.
//!
//! Safety of serving without the Python checks: a signature is only planned when the Python
//! layer asks (`learn=True`), which it does from its hot path, i.e. for a signature its general
//! path checked and served on a usable device; the scan's planning runs every native check
//! again (`ops::scan::forward_replay`), the others run them on every call. A call is
//! served only when every tensor's exact type is one a planned call had (torch.Tensor,
//! nn.Parameter: no subclass with its own dispatch), its dtype / device / shape / strides and
//! flags equal a planned signature's, and (the scan, the SSD) no input needs autograd. Anything else
//! returns None and the Python layer takes the call.

mod conv_update;
mod scan;
mod ssd;
mod state_update;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::tensor::{DeviceKind, TensorView};
use crate::torch_exchange::{TorchExchange, TorchTensor};

/// Signatures kept per server (the map is emptied when full: a workload whose shapes never
/// repeat re-plans, it does not grow without bound).
const MAX_PLANS: usize = 256;

/// Tensor arguments of a served call at most, in the native entry's order (the SSD's ten).
const INPUTS: usize = 10;

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

/// One call's tensors as read, and its signature key.
struct Call {
    t: [Option<TorchTensor>; INPUTS],
    key: Vec<i64>,
}

impl Call {
    /// The views a kernel launcher checks (None where a dtype has no flashscan name).
    fn views(&self) -> Option<Vec<Option<TensorView>>> {
        let v: Vec<Option<TensorView>> = self
            .t
            .iter()
            .map(|x| x.as_ref().and_then(TorchTensor::view))
            .collect();
        let same = self
            .t
            .iter()
            .zip(&v)
            .all(|(x, v)| x.is_some() == v.is_some());
        same.then_some(v)
    }

    fn ptr(&self, i: usize) -> u64 {
        self.t[i].as_ref().map_or(0, |x| x.ptr)
    }
}

#[derive(Default)]
struct Plans<P> {
    /// exact types of planned calls' tensors (type objects are immortal enough: kept)
    types: Vec<Py<PyAny>>,
    /// signature -> plan; None: refused (the Python layer serves it)
    map: HashMap<Vec<i64>, Option<Arc<P>>>,
}

/// What the servers share: the exchange table, the accepted types and the plan map.
struct Core<P> {
    /// torch's exchange table (None: this torch has none; every call is refused)
    exchange: Option<TorchExchange>,
    plans: Mutex<Plans<P>>,
}

impl<P> Core<P> {
    fn new(tensor: &Bound<'_, PyAny>) -> Self {
        Core {
            exchange: TorchExchange::of_class(tensor),
            plans: Mutex::new(Plans {
                types: Vec::new(),
                map: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Plans<P>> {
        // a panic while holding it cannot leave the map half-written (single inserts)
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether every tensor of the call (the first `required` objects, and the others that
    /// are not None) has a type a planned call had: the servers' first test when not learning
    /// (learning calls come from the Python layer's hot paths: torch tensors). A short lock, no
    /// Python under it.
    fn accepts(&self, objs: &[&Bound<'_, PyAny>], required: usize) -> bool {
        let p = self.lock();
        objs.iter().enumerate().all(|(i, o)| {
            (i >= required && o.is_none()) || {
                let tp = o.get_type_ptr() as *mut ffi::PyObject;
                p.types.iter().any(|t| t.as_ptr() == tp)
            }
        })
    }

    /// Reads a call's tensors (at most `INPUTS`; the first `required` must be tensors, the
    /// others tensors or None) and keys it with `flags`; None when it cannot be served: no
    /// exchange table, or a tensor torch cannot describe.
    fn read(
        &self,
        objs: &[&Bound<'_, PyAny>],
        required: usize,
        flags: i64,
    ) -> Option<(TorchExchange, Call)> {
        let ex = self.exchange?;
        if objs.len() > INPUTS {
            return None;
        }
        let mut call = Call {
            t: Default::default(),
            key: Vec::with_capacity(96),
        };
        for (i, o) in objs.iter().enumerate() {
            if i >= required && o.is_none() {
                call.key.push(-1);
                continue;
            }
            let x = ex.read(o)?;
            x.push_signature(&mut call.key);
            call.t[i] = Some(x);
        }
        call.key.push(flags);
        Some((ex, call))
    }

    /// The plan of `key`: Some(Some) planned, Some(None) refused, None unknown.
    fn find(&self, key: &[i64]) -> Option<Option<Arc<P>>> {
        self.lock().map.get(key).cloned()
    }

    /// Keeps `plan` (None: refused) for `key`; a plan's tensor types become accepted.
    fn keep(&self, key: Vec<i64>, plan: Option<Arc<P>>, objs: &[&Bound<'_, PyAny>]) {
        let mut p = self.lock();
        if p.map.len() >= MAX_PLANS {
            p.map.clear();
        }
        if plan.is_some() {
            for o in objs.iter().filter(|o| !o.is_none()) {
                let tp = o.get_type();
                if !p.types.iter().any(|t| t.as_ptr() == tp.as_ptr()) {
                    p.types.push(tp.into_any().unbind());
                }
            }
        }
        p.map.insert(key, plan);
    }

    /// The plan of a call keyed `key`: the planned one; when unknown and learning, the one
    /// `make` builds (None: refused), kept either way; None when there is none to serve.
    fn find_or_learn(
        &self,
        key: &[i64],
        learn: bool,
        objs: &[&Bound<'_, PyAny>],
        make: impl FnOnce() -> Option<P>,
    ) -> Option<Arc<P>> {
        match self.find(key) {
            Some(plan) => plan,
            None if !learn => None,
            None => {
                let plan = make().map(Arc::new);
                self.keep(key.to_vec(), plan.clone(), objs);
                plan
            }
        }
    }

    fn plan_count(&self) -> usize {
        self.lock().map.len()
    }
}

/// Whether a call needs autograd (grad mode on and an input requiring grad), which the servers
/// leave to the Python layer; an input whose `requires_grad` cannot be read counts as needing
/// it (the Python layer then says what is wrong). Checked before any tensor is read: a
/// training step's refused call costs the grad mode and a few attribute reads.
fn needs_grad(grad_enabled: &Bound<'_, PyAny>, objs: &[&Bound<'_, PyAny>]) -> PyResult<bool> {
    if !grad_enabled.call0()?.is_truthy()? {
        return Ok(false);
    }
    let py = grad_enabled.py();
    for o in objs.iter().filter(|o| !o.is_none()) {
        let needs = o
            .getattr(intern!(py, "requires_grad"))
            .and_then(|r| r.is_truthy())
            .unwrap_or(true);
        if needs {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A planned signature of an in-place decode update (the state update, the conv1d update):
/// what a call allocates (out, like x). Every call runs the op's checks again (the state is
/// written in place, so whether it overlaps an input depends on the pointers, not only on the
/// signature).
struct UpdatePlan {
    out_shape: Py<PyTuple>,
}

impl UpdatePlan {
    /// The plan of a call whose x is `x`: out like it; None unless x is a CUDA tensor.
    fn like(py: Python<'_>, x: Option<&TensorView>) -> Option<UpdatePlan> {
        let x = x.filter(|v| v.device == DeviceKind::Cuda)?;
        Some(UpdatePlan {
            out_shape: PyTuple::new(py, &x.shape).ok()?.unbind(),
        })
    }
}

/// `{"dtype": float32}`: the keyword of the servers' float32 allocations (`Tensor.new_empty`).
fn f32_kw(py: Python<'_>, float32: Py<PyAny>) -> PyResult<Py<PyDict>> {
    let kw = PyDict::new(py);
    kw.set_item("dtype", float32)?;
    Ok(kw.unbind())
}

/// A pointer of a tensor made for the call (read through the table, `data_ptr()` otherwise).
fn ptr_of(ex: &TorchExchange, o: &Bound<'_, PyAny>) -> PyResult<u64> {
    match ex.read(o) {
        Some(x) => Ok(x.ptr),
        None => o.call_method0(intern!(o.py(), "data_ptr"))?.extract(),
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
    m.add_class::<scan::ScanServer>()?;
    m.add_class::<state_update::StateUpdateServer>()?;
    m.add_class::<conv_update::ConvUpdateServer>()?;
    m.add_class::<ssd::SsdServer>()?;
    m.add_function(wrap_pyfunction!(torch_exchange_read, m)?)?;
    Ok(())
}
