//! One native call per hot torch call: `ScanServer.serve` takes `selective_scan_fn`'s
//! arguments as they come from Python (`StateUpdateServer.serve` `selective_state_update`'s,
//! `ConvUpdateServer.serve` `causal_conv1d_update`'s),
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
//! again (`ops::scan::forward_replay`), the decode updates run them on every call. A call is
//! served only when every tensor's exact type is one a planned call had (torch.Tensor,
//! nn.Parameter: no subclass with its own dispatch), its dtype / device / shape / strides and
//! flags equal a planned signature's, and (the scan) no input needs autograd. Anything else
//! returns None and the Python layer takes the call.

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

/// What both servers share: the exchange table, the accepted types and the plan map.
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

    /// Reads a call's tensors (at most `INPUTS`; the first `required` must be tensors, the
    /// others tensors or None) and keys it with `flags`; None when it cannot be served: no exchange table, a
    /// type no planned call had (unless learning), or a tensor torch cannot describe.
    fn read(
        &self,
        objs: &[&Bound<'_, PyAny>],
        required: usize,
        flags: i64,
        learn: bool,
    ) -> Option<(TorchExchange, Call)> {
        let ex = self.exchange?;
        if objs.len() > INPUTS {
            return None;
        }
        if !learn {
            // a short lock: no Python runs under it
            let p = self.lock();
            for (i, o) in objs.iter().enumerate() {
                if i >= required && o.is_none() {
                    continue;
                }
                let tp = o.get_type_ptr() as *mut ffi::PyObject;
                if !p.types.iter().any(|t| t.as_ptr() == tp) {
                    return None;
                }
            }
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

    fn plan_count(&self) -> usize {
        self.lock().map.len()
    }
}

/// A pointer of a tensor made for the call (read through the table, `data_ptr()` otherwise).
fn ptr_of(ex: &TorchExchange, o: &Bound<'_, PyAny>) -> PyResult<u64> {
    match ex.read(o) {
        Some(x) => Ok(x.ptr),
        None => o.call_method0(intern!(o.py(), "data_ptr"))?.extract(),
    }
}

// ---------------------------------------------------------------- the scan forward

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
        let kw = PyDict::new(tensor.py());
        kw.set_item("dtype", float32)?;
        Ok(ScanServer {
            core: Core::new(tensor),
            grad_enabled,
            f32_kw: kw.unbind(),
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
        let Some((ex, call)) = self.core.read(&objs, 5, flags, learn) else {
            return Ok(None);
        };
        // autograd calls belong to flashscan.torch (every object is a torch tensor now)
        if self.grad_enabled.bind(py).call0()?.is_truthy()? {
            for o in objs {
                if !o.is_none() && o.getattr(intern!(py, "requires_grad"))?.is_truthy()? {
                    return Ok(None);
                }
            }
        }
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

// ---------------------------------------------------------------- the state update

/// A planned state-update signature: what a call allocates (out, like x). Every call runs
/// the op's checks again (`ops::state_update::update`: the state is written in place, so
/// whether it overlaps an input depends on the pointers, not only on the signature).
struct UpdatePlan {
    out_shape: Py<PyTuple>,
}

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
        let Some((ex, call)) = self.core.read(&objs, 6, softplus as i64, learn) else {
            return Ok(None);
        };
        let Some(views) = call.views() else {
            return Ok(None);
        };
        let plan = match self.core.find(&call.key) {
            Some(Some(p)) => p,
            Some(None) => return Ok(None),
            None if !learn => return Ok(None),
            None => {
                let vx = views[1].as_ref();
                let ok = vx.is_some_and(|v| v.device == DeviceKind::Cuda);
                let plan = match (ok, vx) {
                    (true, Some(v)) => PyTuple::new(py, &v.shape).ok().map(|t| {
                        Arc::new(UpdatePlan {
                            out_shape: t.unbind(),
                        })
                    }),
                    _ => None,
                };
                self.core.keep(call.key.clone(), plan.clone(), &objs);
                match plan {
                    Some(p) => p,
                    None => return Ok(None),
                }
            }
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

// ---------------------------------------------------------------- the conv1d decode update

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
        let Some((ex, call)) = self.core.read(&objs, 3, silu as i64, learn) else {
            return Ok(None);
        };
        let Some(views) = call.views() else {
            return Ok(None);
        };
        let plan = match self.core.find(&call.key) {
            Some(Some(p)) => p,
            Some(None) => return Ok(None),
            None if !learn => return Ok(None),
            None => {
                let vx = views[0].as_ref().filter(|v| v.device == DeviceKind::Cuda);
                let plan = vx.and_then(|v| {
                    PyTuple::new(py, &v.shape).ok().map(|t| {
                        Arc::new(UpdatePlan {
                            out_shape: t.unbind(),
                        })
                    })
                });
                self.core.keep(call.key.clone(), plan.clone(), &objs);
                match plan {
                    Some(p) => p,
                    None => return Ok(None),
                }
            }
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

// ---------------------------------------------------------------- the SSD forward (Mamba-2)

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
        let kw = PyDict::new(tensor.py());
        kw.set_item("dtype", float32)?;
        Ok(SsdServer {
            core: Core::new(tensor),
            grad_enabled,
            f32_kw: kw.unbind(),
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
        let Some((ex, mut call)) = self.core.read(&objs, 5, flags, learn) else {
            return Ok(None);
        };
        call.key.push(lo.to_bits() as i64);
        call.key.push(hi.to_bits() as i64);
        if self.grad_enabled.bind(py).call0()?.is_truthy()? {
            for o in objs {
                if !o.is_none() && o.getattr(intern!(py, "requires_grad"))?.is_truthy()? {
                    return Ok(None);
                }
            }
        }
        let Some(views) = call.views() else {
            return Ok(None);
        };
        let plan = match self.core.find(&call.key) {
            Some(Some(p)) => p,
            Some(None) => return Ok(None),
            None if !learn => return Ok(None),
            None => {
                let fwd2 = !first_path
                    && views[0].as_ref().is_some_and(|v| {
                        matches!(
                            v.dtype,
                            crate::tensor::DType::F16 | crate::tensor::DType::BF16
                        )
                    });
                let plan = Self::plan(py, &views, chunk, return_final, fwd2).map(Arc::new);
                self.core.keep(call.key.clone(), plan.clone(), &objs);
                match plan {
                    Some(p) => p,
                    None => return Ok(None),
                }
            }
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
    m.add_class::<StateUpdateServer>()?;
    m.add_class::<ConvUpdateServer>()?;
    m.add_class::<SsdServer>()?;
    m.add_function(wrap_pyfunction!(torch_exchange_read, m)?)?;
    Ok(())
}
