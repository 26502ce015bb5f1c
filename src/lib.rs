//! The `flashscan._native` Python module: bindings only. Each function converts its Python
//! arguments (DLPack import), calls into `ops`, and maps `Error` to a Python exception.

mod conv_bindings;
pub mod dlpack;
pub mod error;
pub mod ops;
mod replay_bindings;
pub mod runtime;
mod serve;
pub mod tensor;
mod torch_exchange;
pub mod xla_ffi;

use std::path::PathBuf;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::dlpack::Imported;
use crate::error::Error;
use crate::runtime::{runtime, StreamChoice};
use crate::tensor::DType;

create_exception!(
    _native,
    FlashscanError,
    PyException,
    "Base class of every flashscan error."
);
create_exception!(
    _native,
    UnsupportedError,
    FlashscanError,
    "A valid request this build or GPU cannot serve."
);
create_exception!(
    _native,
    CompileError,
    FlashscanError,
    "NVRTC rejected a kernel; the message holds its log."
);
create_exception!(
    _native,
    CudaError,
    FlashscanError,
    "A CUDA driver call failed."
);

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let msg = e.to_string();
        match e {
            Error::Type(_) => PyTypeError::new_err(msg),
            Error::Value(_) => PyValueError::new_err(msg),
            Error::Unsupported(_) => UnsupportedError::new_err(msg),
            Error::Unavailable(_) => FlashscanError::new_err(msg),
            Error::Compile { log, .. } => CompileError::new_err((msg, log)),
            Error::Cuda { .. } => CudaError::new_err(msg),
            Error::Internal(_) => PyRuntimeError::new_err(msg),
        }
    }
}

fn stream_choice(stream: Option<u64>) -> StreamChoice {
    match stream {
        Some(h) => StreamChoice::Caller(h),
        None => StreamChoice::OwnThenSync,
    }
}

/// The stream a CUDA tensor's producer must order its work before (DLPack `stream=`).
fn stream_handle(choice: StreamChoice, device_id: i32) -> error::Result<u64> {
    match choice {
        StreamChoice::Caller(h) => Ok(h),
        StreamChoice::OwnThenSync => {
            let rt = runtime().map_err(Error::Unavailable)?;
            Ok(rt.device(device_id)?.stream(choice)?.0 as usize as u64)
        }
    }
}

fn import<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    choice: StreamChoice,
) -> PyResult<Imported<'py>> {
    Ok(dlpack::import(obj, arg, &|d| stream_handle(choice, d))?)
}

fn import_opt<'py>(
    obj: Option<&Bound<'py, PyAny>>,
    arg: &str,
    choice: StreamChoice,
) -> PyResult<Option<Imported<'py>>> {
    obj.filter(|o| !o.is_none())
        .map(|o| import(o, arg, choice))
        .transpose()
}

fn view_of<'a>(t: &'a Option<Imported<'_>>) -> Option<&'a tensor::TensorView> {
    t.as_ref().map(|t| &t.view)
}

#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pyfunction]
fn cache_dir() -> String {
    runtime::cache::default_dir().display().to_string()
}

#[pyfunction]
fn backend_status(py: Python<'_>) -> PyResult<PyObject> {
    let d = PyDict::new(py);
    d.set_item("cache_dir", cache_dir())?;
    let nv = runtime::nvrtc();
    d.set_item("nvrtc_version", nv.as_ref().ok().map(|n| n.version))?;
    d.set_item(
        "nvrtc_path",
        nv.as_ref().ok().map(|n| n.path.display().to_string()),
    )?;
    match py.allow_threads(runtime) {
        Ok(rt) => {
            d.set_item("available", true)?;
            d.set_item("reason", py.None())?;
            d.set_item("driver_version", rt.driver_version)?;
            let devs = PyList::empty(py);
            for p in &rt.devices {
                let e = PyDict::new(py);
                e.set_item("index", p.ordinal)?;
                e.set_item("name", &p.name)?;
                e.set_item("compute_capability", p.cc)?;
                let arch = runtime::arch_for(p.cc);
                e.set_item("supported", arch.is_ok())?;
                e.set_item("arch", arch.ok())?;
                e.set_item("sm_count", p.sm_count)?;
                devs.append(e)?;
            }
            d.set_item("devices", devs)?;
        }
        Err(reason) => {
            d.set_item("available", false)?;
            d.set_item("reason", reason)?;
            d.set_item("driver_version", py.None())?;
            d.set_item("devices", PyList::empty(py))?;
        }
    }
    Ok(d.into_any().unbind())
}

#[pyfunction]
fn describe(py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<PyObject> {
    let t = import(x, "x", StreamChoice::Caller(0))?;
    let v = &t.view;
    let d = PyDict::new(py);
    let (kind, id) = match v.device {
        tensor::DeviceKind::Cpu => (dlpack::DL_CPU, v.device_id),
        tensor::DeviceKind::Cuda => (dlpack::DL_CUDA, v.device_id),
        tensor::DeviceKind::Other(k) => (k, v.device_id),
    };
    d.set_item("device_type", kind)?;
    d.set_item("device_id", id)?;
    d.set_item("dtype", v.dtype.name())?;
    d.set_item("shape", pyo3::types::PyTuple::new(py, &v.shape)?)?;
    d.set_item("strides", pyo3::types::PyTuple::new(py, &v.strides)?)?;
    d.set_item("data_ptr", v.ptr)?;
    d.set_item("readonly", v.readonly)?;
    Ok(d.into_any().unbind())
}

/// A CUDA buffer owned by flashscan until a framework adopts it through DLPack.
/// A CUDA buffer owned by flashscan, shared with any framework through DLPack (each export
/// holds a reference; the memory is freed when the buffer and every capsule are gone).
#[pyclass(module = "flashscan._native", frozen)]
struct DeviceBuffer {
    alloc: std::sync::Arc<dlpack::DeviceAllocation>,
    shape: Vec<i64>,
    dtype: DType,
}

#[pymethods]
impl DeviceBuffer {
    #[pyo3(signature = (stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        // Our work on this buffer is finished before `empty` returns to Python (own stream,
        // synchronised), so there is nothing for the consumer's stream to wait on.
        let _ = (stream, dl_device);
        if copy == Some(true) {
            return Err(PyValueError::new_err(
                "DeviceBuffer cannot be exported as a copy",
            ));
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        dlpack::export_capsule(
            py,
            self.alloc.clone(),
            self.shape.clone(),
            self.dtype,
            versioned,
        )
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::DL_CUDA, self.alloc.device_id)
    }
}

#[pyfunction]
#[pyo3(signature = (shape, dtype, device_id, stream=None))]
fn empty(
    shape: Vec<i64>,
    dtype: &str,
    device_id: i32,
    stream: Option<u64>,
) -> PyResult<DeviceBuffer> {
    let _ = stream;
    let dt = DType::from_name(dtype)
        .ok_or_else(|| PyTypeError::new_err(format!("dtype {dtype:?} is not supported")))?;
    if shape.iter().any(|&d| d < 0) {
        return Err(PyValueError::new_err(format!(
            "shape {shape:?} has a negative dimension"
        )));
    }
    let bytes = shape.iter().product::<i64>() as usize * dt.size();
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device_id)?;
    let _bound = dev.bind()?;
    let ptr = runtime::driver::alloc(bytes)?;
    let alloc = std::sync::Arc::new(dlpack::DeviceAllocation { ptr, device_id });
    Ok(DeviceBuffer {
        alloc,
        shape,
        dtype: dt,
    })
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (q, k, v, out, lse, softmax_scale, window_left, window_right, softcap, stream))]
fn flash_attn_fwd(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: Option<&Bound<'_, PyAny>>,
    softmax_scale: f32,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    stream: Option<u64>,
) -> PyResult<()> {
    let choice = stream_choice(stream);
    let q = import(q, "q", choice)?;
    let k = import(k, "k", choice)?;
    let v = import(v, "v", choice)?;
    let out = import(out, "out", choice)?;
    let lse = import_opt(lse, "lse", choice)?;
    let args = ops::attention::FlashFwdArgs {
        q: &q.view,
        k: &k.view,
        v: &v.view,
        out: &out.view,
        lse: view_of(&lse),
        softmax_scale,
        window_left,
        window_right,
        softcap,
    };
    Ok(ops::attention::forward(&args, choice)?)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (q, k, v, out, lse, q_descale, k_descale, v_descale, softmax_scale, window_left, window_right, stream))]
fn flash_attn_fwd_fp8(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: Option<&Bound<'_, PyAny>>,
    q_descale: Option<&Bound<'_, PyAny>>,
    k_descale: Option<&Bound<'_, PyAny>>,
    v_descale: Option<&Bound<'_, PyAny>>,
    softmax_scale: f32,
    window_left: i64,
    window_right: i64,
    stream: Option<u64>,
) -> PyResult<()> {
    let choice = stream_choice(stream);
    let q = import(q, "q", choice)?;
    let k = import(k, "k", choice)?;
    let v = import(v, "v", choice)?;
    let out = import(out, "out", choice)?;
    let lse = import_opt(lse, "lse", choice)?;
    let qd = import_opt(q_descale, "q_descale", choice)?;
    let kd = import_opt(k_descale, "k_descale", choice)?;
    let vd = import_opt(v_descale, "v_descale", choice)?;
    let args = ops::attention_fp8::FlashFwdFp8Args {
        base: ops::attention::FlashFwdArgs {
            q: &q.view,
            k: &k.view,
            v: &v.view,
            out: &out.view,
            lse: view_of(&lse),
            softmax_scale,
            window_left,
            window_right,
            softcap: 0.0,
        },
        q_descale: view_of(&qd),
        k_descale: view_of(&kd),
        v_descale: view_of(&vd),
    };
    Ok(ops::attention_fp8::forward(&args, choice)?)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (k_new, v_new, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin, rotary_interleaved, q, q_rot, stream))]
fn kvcache_append(
    k_new: Option<&Bound<'_, PyAny>>,
    v_new: Option<&Bound<'_, PyAny>>,
    k_cache: &Bound<'_, PyAny>,
    v_cache: &Bound<'_, PyAny>,
    cache_seqlens: &Bound<'_, PyAny>,
    cache_batch_idx: Option<&Bound<'_, PyAny>>,
    cache_leftpad: Option<&Bound<'_, PyAny>>,
    block_table: Option<&Bound<'_, PyAny>>,
    rotary_cos: Option<&Bound<'_, PyAny>>,
    rotary_sin: Option<&Bound<'_, PyAny>>,
    rotary_interleaved: bool,
    q: Option<&Bound<'_, PyAny>>,
    q_rot: Option<&Bound<'_, PyAny>>,
    stream: Option<u64>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let k_new = import_opt(k_new, "k_new", ch)?;
    let v_new = import_opt(v_new, "v_new", ch)?;
    let k_cache = import(k_cache, "k_cache", ch)?;
    let v_cache = import(v_cache, "v_cache", ch)?;
    let cache_seqlens = import(cache_seqlens, "cache_seqlens", ch)?;
    let cache_batch_idx = import_opt(cache_batch_idx, "cache_batch_idx", ch)?;
    let cache_leftpad = import_opt(cache_leftpad, "cache_leftpad", ch)?;
    let block_table = import_opt(block_table, "block_table", ch)?;
    let rotary_cos = import_opt(rotary_cos, "rotary_cos", ch)?;
    let rotary_sin = import_opt(rotary_sin, "rotary_sin", ch)?;
    let q = import_opt(q, "q", ch)?;
    let q_rot = import_opt(q_rot, "q_rot", ch)?;
    let args = ops::kvcache_append::AppendArgs {
        k_new: view_of(&k_new),
        v_new: view_of(&v_new),
        k_cache: &k_cache.view,
        v_cache: &v_cache.view,
        cache_seqlens: &cache_seqlens.view,
        cache_batch_idx: view_of(&cache_batch_idx),
        cache_leftpad: view_of(&cache_leftpad),
        block_table: view_of(&block_table),
        rotary_cos: view_of(&rotary_cos),
        rotary_sin: view_of(&rotary_sin),
        rotary_interleaved,
        q: view_of(&q),
        q_rot: view_of(&q_rot),
    };
    Ok(ops::kvcache_append::append(&args, ch)?)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (q, k_cache, v_cache, out, lse, seqlens_k, cache_batch_idx, cache_leftpad, block_table, softmax_scale, window_left, window_right, softcap, num_splits, stream, seqlens_k_add=0))]
fn flash_attn_kvcache(
    q: &Bound<'_, PyAny>,
    k_cache: &Bound<'_, PyAny>,
    v_cache: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: Option<&Bound<'_, PyAny>>,
    seqlens_k: &Bound<'_, PyAny>,
    cache_batch_idx: Option<&Bound<'_, PyAny>>,
    cache_leftpad: Option<&Bound<'_, PyAny>>,
    block_table: Option<&Bound<'_, PyAny>>,
    softmax_scale: f32,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    num_splits: i64,
    stream: Option<u64>,
    seqlens_k_add: i64,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let q = import(q, "q", ch)?;
    let k_cache = import(k_cache, "k_cache", ch)?;
    let v_cache = import(v_cache, "v_cache", ch)?;
    let out = import(out, "out", ch)?;
    let lse = import_opt(lse, "lse", ch)?;
    let seqlens_k = import(seqlens_k, "seqlens_k", ch)?;
    let cache_batch_idx = import_opt(cache_batch_idx, "cache_batch_idx", ch)?;
    let cache_leftpad = import_opt(cache_leftpad, "cache_leftpad", ch)?;
    let block_table = import_opt(block_table, "block_table", ch)?;
    let args = ops::attention_decode::KvcacheArgs {
        q: &q.view,
        k_cache: &k_cache.view,
        v_cache: &v_cache.view,
        out: &out.view,
        lse: view_of(&lse),
        seqlens_k: &seqlens_k.view,
        seqlens_k_add,
        cache_batch_idx: view_of(&cache_batch_idx),
        cache_leftpad: view_of(&cache_leftpad),
        block_table: view_of(&block_table),
        softmax_scale,
        window_left,
        window_right,
        softcap,
        num_splits,
    };
    Ok(ops::attention_decode::attention(&args, ch)?)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (u, delta, A, B, C, D, z, delta_bias, initial_state, out, last_state, delta_softplus, stream, saved_states=None, replay=false))]
#[allow(non_snake_case)]
fn selective_scan_fwd(
    u: &Bound<'_, PyAny>,
    delta: &Bound<'_, PyAny>,
    A: &Bound<'_, PyAny>,
    B: &Bound<'_, PyAny>,
    C: &Bound<'_, PyAny>,
    D: Option<&Bound<'_, PyAny>>,
    z: Option<&Bound<'_, PyAny>>,
    delta_bias: Option<&Bound<'_, PyAny>>,
    initial_state: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    last_state: Option<&Bound<'_, PyAny>>,
    delta_softplus: bool,
    stream: Option<u64>,
    saved_states: Option<&Bound<'_, PyAny>>,
    replay: bool,
) -> PyResult<Option<replay_bindings::ScanFwdReplay>> {
    let ch = stream_choice(stream);
    let u = import(u, "u", ch)?;
    let delta = import(delta, "delta", ch)?;
    let a = import(A, "A", ch)?;
    let b = import(B, "B", ch)?;
    let c = import(C, "C", ch)?;
    let d = import_opt(D, "D", ch)?;
    let z = import_opt(z, "z", ch)?;
    let delta_bias = import_opt(delta_bias, "delta_bias", ch)?;
    let initial_state = import_opt(initial_state, "initial_state", ch)?;
    let out = import(out, "out", ch)?;
    let last_state = import_opt(last_state, "last_state", ch)?;
    let saved_states = import_opt(saved_states, "saved_states", ch)?;
    let args = ops::scan::ScanArgs {
        u: &u.view,
        delta: &delta.view,
        a: &a.view,
        b: &b.view,
        c: &c.view,
        d: view_of(&d),
        z: view_of(&z),
        delta_bias: view_of(&delta_bias),
        initial_state: view_of(&initial_state),
        out: &out.view,
        last_state: view_of(&last_state),
        saved_states: view_of(&saved_states),
        delta_softplus,
    };
    if replay {
        // checked and planned, not launched (None: not one launch)
        let r = ops::scan::forward_replay(&args)?;
        return Ok(r.map(replay_bindings::ScanFwdReplay));
    }
    ops::scan::forward(&args, ch)?;
    Ok(None)
}

/// How many chunk-boundary states `selective_scan_fwd(saved_states=...)` keeps for seqlen.
#[pyfunction]
fn scan_saved_state_count(seqlen: i64) -> i64 {
    ops::scan::saved_state_count(seqlen)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right, softcap, stream))]
fn flash_attn_varlen_fwd(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    cu_seqlens_q: &Bound<'_, PyAny>,
    cu_seqlens_k: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: Option<&Bound<'_, PyAny>>,
    max_seqlen_q: i64,
    max_seqlen_k: i64,
    softmax_scale: f32,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    stream: Option<u64>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let q = import(q, "q", ch)?;
    let k = import(k, "k", ch)?;
    let v = import(v, "v", ch)?;
    let cu_q = import(cu_seqlens_q, "cu_seqlens_q", ch)?;
    let cu_k = import(cu_seqlens_k, "cu_seqlens_k", ch)?;
    let out = import(out, "out", ch)?;
    let lse = import_opt(lse, "lse", ch)?;
    let args = ops::attention_varlen::VarlenFwdArgs {
        q: &q.view,
        k: &k.view,
        v: &v.view,
        out: &out.view,
        lse: view_of(&lse),
        cu_seqlens_q: &cu_q.view,
        cu_seqlens_k: &cu_k.view,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_left,
        window_right,
        softcap,
    };
    Ok(ops::attention_varlen::forward(&args, ch)?)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right, softcap, deterministic, stream))]
fn flash_attn_varlen_bwd(
    dout: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    dq: &Bound<'_, PyAny>,
    dk: &Bound<'_, PyAny>,
    dv: &Bound<'_, PyAny>,
    cu_seqlens_q: &Bound<'_, PyAny>,
    cu_seqlens_k: &Bound<'_, PyAny>,
    max_seqlen_q: i64,
    max_seqlen_k: i64,
    softmax_scale: f32,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    deterministic: bool,
    stream: Option<u64>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let dout = import(dout, "dout", ch)?;
    let q = import(q, "q", ch)?;
    let k = import(k, "k", ch)?;
    let v = import(v, "v", ch)?;
    let out = import(out, "out", ch)?;
    let lse = import(lse, "lse", ch)?;
    let dq = import(dq, "dq", ch)?;
    let dk = import(dk, "dk", ch)?;
    let dv = import(dv, "dv", ch)?;
    let cu_q = import(cu_seqlens_q, "cu_seqlens_q", ch)?;
    let cu_k = import(cu_seqlens_k, "cu_seqlens_k", ch)?;
    let args = ops::attention_varlen::VarlenBwdArgs {
        dout: &dout.view,
        q: &q.view,
        k: &k.view,
        v: &v.view,
        out: &out.view,
        lse: &lse.view,
        dq: &dq.view,
        dk: &dk.view,
        dv: &dv.view,
        cu_seqlens_q: &cu_q.view,
        cu_seqlens_k: &cu_k.view,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_left,
        window_right,
        softcap,
        deterministic,
    };
    Ok(ops::attention_varlen::backward(&args, ch)?)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, window_left, window_right, softcap, deterministic, stream))]
fn flash_attn_bwd(
    dout: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    dq: &Bound<'_, PyAny>,
    dk: &Bound<'_, PyAny>,
    dv: &Bound<'_, PyAny>,
    softmax_scale: f32,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    deterministic: bool,
    stream: Option<u64>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let dout = import(dout, "dout", ch)?;
    let q = import(q, "q", ch)?;
    let k = import(k, "k", ch)?;
    let v = import(v, "v", ch)?;
    let out = import(out, "out", ch)?;
    let lse = import(lse, "lse", ch)?;
    let dq = import(dq, "dq", ch)?;
    let dk = import(dk, "dk", ch)?;
    let dv = import(dv, "dv", ch)?;
    let args = ops::attention_bwd::FlashBwdArgs {
        dout: &dout.view,
        q: &q.view,
        k: &k.view,
        v: &v.view,
        out: &out.view,
        lse: &lse.view,
        dq: &dq.view,
        dk: &dk.view,
        dv: &dv.view,
        softmax_scale,
        window_left,
        window_right,
        softcap,
        deterministic,
    };
    Ok(ops::attention_bwd::backward(&args, ch)?)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (u, delta, A, B, C, D, z, delta_bias, initial_state, dout, saved_states, dlast_state, du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dinitial_state, delta_softplus, stream, replay=false))]
#[allow(non_snake_case)]
fn selective_scan_bwd(
    u: &Bound<'_, PyAny>,
    delta: &Bound<'_, PyAny>,
    A: &Bound<'_, PyAny>,
    B: &Bound<'_, PyAny>,
    C: &Bound<'_, PyAny>,
    D: Option<&Bound<'_, PyAny>>,
    z: Option<&Bound<'_, PyAny>>,
    delta_bias: Option<&Bound<'_, PyAny>>,
    initial_state: Option<&Bound<'_, PyAny>>,
    dout: &Bound<'_, PyAny>,
    saved_states: Option<&Bound<'_, PyAny>>,
    dlast_state: Option<&Bound<'_, PyAny>>,
    du: &Bound<'_, PyAny>,
    ddelta: &Bound<'_, PyAny>,
    dA: &Bound<'_, PyAny>,
    dB: &Bound<'_, PyAny>,
    dC: &Bound<'_, PyAny>,
    dD: Option<&Bound<'_, PyAny>>,
    dz: Option<&Bound<'_, PyAny>>,
    ddelta_bias: Option<&Bound<'_, PyAny>>,
    dinitial_state: Option<&Bound<'_, PyAny>>,
    delta_softplus: bool,
    stream: Option<u64>,
    replay: bool,
) -> PyResult<Option<replay_bindings::ScanBwdReplay>> {
    let ch = stream_choice(stream);
    let u = import(u, "u", ch)?;
    let delta = import(delta, "delta", ch)?;
    let a = import(A, "A", ch)?;
    let b = import(B, "B", ch)?;
    let c = import(C, "C", ch)?;
    let d = import_opt(D, "D", ch)?;
    let z = import_opt(z, "z", ch)?;
    let delta_bias = import_opt(delta_bias, "delta_bias", ch)?;
    let initial_state = import_opt(initial_state, "initial_state", ch)?;
    let dout = import(dout, "dout", ch)?;
    let saved_states = import_opt(saved_states, "saved_states", ch)?;
    let dlast_state = import_opt(dlast_state, "dlast_state", ch)?;
    let du = import(du, "du", ch)?;
    let ddelta = import(ddelta, "ddelta", ch)?;
    let da = import(dA, "dA", ch)?;
    let db = import(dB, "dB", ch)?;
    let dc = import(dC, "dC", ch)?;
    let dd = import_opt(dD, "dD", ch)?;
    let dz = import_opt(dz, "dz", ch)?;
    let ddelta_bias = import_opt(ddelta_bias, "ddelta_bias", ch)?;
    let dinitial_state = import_opt(dinitial_state, "dinitial_state", ch)?;
    let args = ops::scan_bwd::ScanBwdArgs {
        u: &u.view,
        delta: &delta.view,
        a: &a.view,
        b: &b.view,
        c: &c.view,
        d: view_of(&d),
        z: view_of(&z),
        delta_bias: view_of(&delta_bias),
        initial_state: view_of(&initial_state),
        dout: &dout.view,
        saved_states: view_of(&saved_states),
        dlast_state: view_of(&dlast_state),
        du: &du.view,
        ddelta: &ddelta.view,
        da: &da.view,
        db: &db.view,
        dc: &dc.view,
        dd: view_of(&dd),
        dz: view_of(&dz),
        ddelta_bias: view_of(&ddelta_bias),
        dinitial_state: view_of(&dinitial_state),
        delta_softplus,
    };
    if replay {
        // checked and planned, not launched (None: an empty problem)
        let r = ops::scan_bwd::backward_replay(&args)?;
        return Ok(r.map(replay_bindings::ScanBwdReplay));
    }
    ops::scan_bwd::backward(&args, ch)?;
    Ok(None)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (state, x, dt, A, B, C, D, z, dt_bias, out, dt_softplus, stream))]
#[allow(non_snake_case)]
fn selective_state_update(
    state: &Bound<'_, PyAny>,
    x: &Bound<'_, PyAny>,
    dt: &Bound<'_, PyAny>,
    A: &Bound<'_, PyAny>,
    B: &Bound<'_, PyAny>,
    C: &Bound<'_, PyAny>,
    D: Option<&Bound<'_, PyAny>>,
    z: Option<&Bound<'_, PyAny>>,
    dt_bias: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    dt_softplus: bool,
    stream: Option<u64>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let state = import(state, "state", ch)?;
    let x = import(x, "x", ch)?;
    let dt = import(dt, "dt", ch)?;
    let a = import(A, "A", ch)?;
    let b = import(B, "B", ch)?;
    let c = import(C, "C", ch)?;
    let d = import_opt(D, "D", ch)?;
    let z = import_opt(z, "z", ch)?;
    let dt_bias = import_opt(dt_bias, "dt_bias", ch)?;
    let out = import(out, "out", ch)?;
    let args = ops::state_update::StateUpdateArgs {
        state: &state.view,
        x: &x.view,
        dt: &dt.view,
        a: &a.view,
        b: &b.view,
        c: &c.view,
        d: view_of(&d),
        z: view_of(&z),
        dt_bias: view_of(&dt_bias),
        out: &out.view,
        dt_softplus,
    };
    Ok(ops::state_update::update(&args, ch)?)
}

/// Mamba-2 SSD chunked scan forward: out (and final_states) from x, dt, A, B, C and the
/// optional D, z, dt_bias, initial_states, seq_idx; `states` and `decay` are the caller's fp32
/// workspaces (see ops::ssd); `cb` (batch, nchunks, ngroups, chunk, chunk) fp32, when given,
/// selects the second forward path for fp16 / bf16 data (ops::ssd::SOURCE2).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, out, final_states, states, decay, chunk_size, dt_softplus, dt_min, dt_max, stream, cb=None, states16=None, cu_seqlens=None, varlen_states=None))]
#[allow(non_snake_case)]
fn ssd_fwd(
    x: &Bound<'_, PyAny>,
    dt: &Bound<'_, PyAny>,
    A: &Bound<'_, PyAny>,
    B: &Bound<'_, PyAny>,
    C: &Bound<'_, PyAny>,
    D: Option<&Bound<'_, PyAny>>,
    z: Option<&Bound<'_, PyAny>>,
    dt_bias: Option<&Bound<'_, PyAny>>,
    initial_states: Option<&Bound<'_, PyAny>>,
    seq_idx: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    final_states: Option<&Bound<'_, PyAny>>,
    states: &Bound<'_, PyAny>,
    decay: &Bound<'_, PyAny>,
    chunk_size: i64,
    dt_softplus: bool,
    dt_min: f64,
    dt_max: f64,
    stream: Option<u64>,
    cb: Option<&Bound<'_, PyAny>>,
    states16: Option<&Bound<'_, PyAny>>,
    cu_seqlens: Option<&Bound<'_, PyAny>>,
    varlen_states: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let x = import(x, "x", ch)?;
    let dt = import(dt, "dt", ch)?;
    let a = import(A, "A", ch)?;
    let b = import(B, "B", ch)?;
    let c = import(C, "C", ch)?;
    let d = import_opt(D, "D", ch)?;
    let z = import_opt(z, "z", ch)?;
    let dt_bias = import_opt(dt_bias, "dt_bias", ch)?;
    let init = import_opt(initial_states, "initial_states", ch)?;
    let seq_idx = import_opt(seq_idx, "seq_idx", ch)?;
    let out = import(out, "out", ch)?;
    let fin = import_opt(final_states, "final_states", ch)?;
    let states = import(states, "states", ch)?;
    let decay = import(decay, "decay", ch)?;
    let cb = import_opt(cb, "cb", ch)?;
    let states16 = import_opt(states16, "states16", ch)?;
    let cu = import_opt(cu_seqlens, "cu_seqlens", ch)?;
    let vs = import_opt(varlen_states, "varlen_states", ch)?;
    let varlen = match (view_of(&cu), view_of(&vs)) {
        (Some(c), Some(v)) => Some((c, v)),
        (None, None) => None,
        _ => {
            return Err(PyValueError::new_err(
                "ssd_fwd: cu_seqlens and varlen_states go together",
            ))
        }
    };
    let args = ops::ssd::SsdArgs {
        inputs: ops::ssd::SsdInputs {
            x: &x.view,
            dt: &dt.view,
            a: &a.view,
            b: &b.view,
            c: &c.view,
            d: view_of(&d),
            z: view_of(&z),
            dt_bias: view_of(&dt_bias),
            initial_states: view_of(&init),
            seq_idx: view_of(&seq_idx),
            chunk_size,
            dt_softplus,
            dt_limit: (dt_min, dt_max),
        },
        out: &out.view,
        final_states: view_of(&fin),
        states: &states.view,
        decay: &decay.view,
        cb: view_of(&cb),
        states16: view_of(&states16),
        varlen,
    };
    Ok(ops::ssd::forward(&args, ch)?)
}

/// Mamba-2 SSD chunked scan backward: every gradient (dx, ddt, dA, dB, dC and, for the optional
/// inputs given, dD, dz, ddt_bias, dinitial_states) from dout and the optional dfinal_states;
/// the forward is recomputed inside (see ops::ssd_bwd).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, dout, dfinal_states, dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states, chunk_size, dt_softplus, dt_min, dt_max, stream, tf32 = false, kept_states16 = None, kept_decay = None))]
#[allow(non_snake_case)]
fn ssd_bwd(
    x: &Bound<'_, PyAny>,
    dt: &Bound<'_, PyAny>,
    A: &Bound<'_, PyAny>,
    B: &Bound<'_, PyAny>,
    C: &Bound<'_, PyAny>,
    D: Option<&Bound<'_, PyAny>>,
    z: Option<&Bound<'_, PyAny>>,
    dt_bias: Option<&Bound<'_, PyAny>>,
    initial_states: Option<&Bound<'_, PyAny>>,
    seq_idx: Option<&Bound<'_, PyAny>>,
    dout: &Bound<'_, PyAny>,
    dfinal_states: Option<&Bound<'_, PyAny>>,
    dx: &Bound<'_, PyAny>,
    ddt: &Bound<'_, PyAny>,
    dA: &Bound<'_, PyAny>,
    dB: &Bound<'_, PyAny>,
    dC: &Bound<'_, PyAny>,
    dD: Option<&Bound<'_, PyAny>>,
    dz: Option<&Bound<'_, PyAny>>,
    ddt_bias: Option<&Bound<'_, PyAny>>,
    dinitial_states: Option<&Bound<'_, PyAny>>,
    chunk_size: i64,
    dt_softplus: bool,
    dt_min: f64,
    dt_max: f64,
    stream: Option<u64>,
    tf32: bool,
    kept_states16: Option<&Bound<'_, PyAny>>,
    kept_decay: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let x = import(x, "x", ch)?;
    let dt = import(dt, "dt", ch)?;
    let a = import(A, "A", ch)?;
    let b = import(B, "B", ch)?;
    let c = import(C, "C", ch)?;
    let d = import_opt(D, "D", ch)?;
    let z = import_opt(z, "z", ch)?;
    let dt_bias = import_opt(dt_bias, "dt_bias", ch)?;
    let init = import_opt(initial_states, "initial_states", ch)?;
    let seq_idx = import_opt(seq_idx, "seq_idx", ch)?;
    let dout = import(dout, "dout", ch)?;
    let dfin = import_opt(dfinal_states, "dfinal_states", ch)?;
    let dx = import(dx, "dx", ch)?;
    let ddt = import(ddt, "ddt", ch)?;
    let da = import(dA, "dA", ch)?;
    let db = import(dB, "dB", ch)?;
    let dc = import(dC, "dC", ch)?;
    let dd = import_opt(dD, "dD", ch)?;
    let dz = import_opt(dz, "dz", ch)?;
    let dbias = import_opt(ddt_bias, "ddt_bias", ch)?;
    let dinit = import_opt(dinitial_states, "dinitial_states", ch)?;
    let kept16 = import_opt(kept_states16, "kept_states16", ch)?;
    let kept_decay = import_opt(kept_decay, "kept_decay", ch)?;
    let kept = match (view_of(&kept16), view_of(&kept_decay)) {
        (Some(s), Some(d)) => Some((s, d)),
        (None, None) => None,
        _ => {
            return Err(PyValueError::new_err(
                "ssd_bwd: kept_states16 and kept_decay go together",
            ))
        }
    };
    let args = ops::ssd_bwd::SsdBwdArgs {
        inputs: ops::ssd::SsdInputs {
            x: &x.view,
            dt: &dt.view,
            a: &a.view,
            b: &b.view,
            c: &c.view,
            d: view_of(&d),
            z: view_of(&z),
            dt_bias: view_of(&dt_bias),
            initial_states: view_of(&init),
            seq_idx: view_of(&seq_idx),
            chunk_size,
            dt_softplus,
            dt_limit: (dt_min, dt_max),
        },
        dout: &dout.view,
        dfinal_states: view_of(&dfin),
        dx: &dx.view,
        ddt: &ddt.view,
        da: &da.view,
        db: &db.view,
        dc: &dc.view,
        dd: view_of(&dd),
        dz: view_of(&dz),
        ddt_bias: view_of(&dbias),
        dinitial_states: view_of(&dinit),
        tf32,
        kept,
    };
    Ok(ops::ssd_bwd::backward(&args, ch)?)
}

/// Whether `ssd_bwd` takes a 16-bit call's own fp16 / bf16 tensors (its 16-bit kernels: calls
/// without z on the second path, unless FLASHSCAN_SSD_DX16=0), or float32 copies with tf32.
#[pyfunction]
fn ssd_bwd_16bit(has_z: bool) -> bool {
    ops::ssd_bwd::runs_16bit(has_z)
}

/// XLA FFI handlers as PyCapsules of their function pointers, for
/// `jax.ffi.register_ffi_target(name, capsule, platform="CUDA", api_version=1)`.
#[pyfunction]
fn xla_ffi_targets(py: Python<'_>) -> PyResult<PyObject> {
    let d = PyDict::new(py);
    for (name, handler) in xla_ffi::TARGETS {
        let ptr = *handler as usize as *mut std::ffi::c_void;
        // SAFETY: a nameless capsule around a function pointer that lives as long as the
        // module (as `jax.ffi.pycapsule` makes them); no destructor.
        let capsule = unsafe {
            Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyCapsule_New(ptr, std::ptr::null(), None))
        }?;
        d.set_item(*name, capsule)?;
    }
    Ok(d.into_any().unbind())
}

/// The XLA FFI API version the handlers are written against, (major, minor).
#[pyfunction]
fn xla_ffi_api_version() -> (i32, i32) {
    (xla_ffi::abi::API_MAJOR, xla_ffi::abi::API_MINOR)
}

fn arch_num(arch: &str) -> PyResult<i64> {
    arch.trim_start_matches("sm_")
        .trim_end_matches('a')
        .parse()
        .map_err(|_| PyValueError::new_err(format!("arch {arch:?} must look like sm_80 or sm_90a")))
}

#[pyfunction]
#[pyo3(signature = (arch="sm_90a"))]
fn kernel_variants(py: Python<'_>, arch: &str) -> PyResult<PyObject> {
    let list = PyList::empty(py);
    for (spec, main) in ops::all_variants(arch_num(arch)?) {
        let d = PyDict::new(py);
        d.set_item("family", spec.family)?;
        d.set_item("name", spec.name())?;
        d.set_item("entry", spec.entry)?;
        let defs = PyDict::new(py);
        for (k, v) in &spec.defines {
            defs.set_item(k, v)?;
        }
        d.set_item("defines", defs)?;
        d.set_item("main", main)?;
        list.append(d)?;
    }
    Ok(list.into_any().unbind())
}

#[pyfunction]
fn compile_variant(py: Python<'_>, name: &str, arch: &str) -> PyResult<PyObject> {
    let num = arch_num(arch)?;
    let spec = ops::all_variants(num)
        .into_iter()
        .map(|(s, _)| s)
        .find(|s| s.name() == name)
        .ok_or_else(|| PyValueError::new_err(format!("no kernel variant named {name:?}")))?;
    let arch = arch.to_string();
    let cubin = py.allow_threads(move || runtime::compile(&spec, &arch))?;
    Ok(PyBytes::new(py, &cubin).into_any().unbind())
}

/// Runs `build` over `specs` on `workers` threads without the GIL (NVRTC is thread-safe), this
/// thread reporting progress(done, total, name) with the GIL as results arrive; the count of
/// variants `build` says it compiled. The first error stops handing out work.
fn build_variants(
    py: Python<'_>,
    specs: &[runtime::KernelSpec],
    progress: Option<&Bound<'_, PyAny>>,
    workers: Option<usize>,
    build: &(dyn Fn(&runtime::KernelSpec) -> error::Result<bool> + Sync),
) -> PyResult<usize> {
    let total = specs.len();
    let workers = workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, 64);
    let progress: Option<Py<PyAny>> = progress.map(|p| p.clone().unbind());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel::<(usize, error::Result<bool>)>();
    py.allow_threads(|| {
        std::thread::scope(|scope| {
            for _ in 0..workers.min(total.max(1)) {
                let tx = tx.clone();
                let next = &next;
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= specs.len() {
                        break;
                    }
                    if tx.send((i, build(&specs[i]))).is_err() {
                        break;
                    }
                });
            }
            drop(tx);
            let (mut done, mut compiled) = (0usize, 0usize);
            for (i, r) in rx {
                done += 1;
                match r {
                    Ok(fresh) => compiled += fresh as usize,
                    Err(e) => {
                        // Stop handing out work; the threads finish their current variant.
                        next.store(usize::MAX / 2, std::sync::atomic::Ordering::Relaxed);
                        return Err(PyErr::from(e));
                    }
                }
                if let Some(cb) = &progress {
                    Python::with_gil(|py| {
                        cb.bind(py).call1((done, total, specs[i].name())).map(drop)
                    })?;
                }
            }
            Ok(compiled)
        })
    })
}

/// The variants `precompile` builds for arch number `num`: the common ("main") ones unless
/// `all`, only those of `families` when given (an unknown family is an error naming the known),
/// one per translation unit.
fn precompile_specs(
    num: i64,
    all: bool,
    families: Option<&[String]>,
) -> PyResult<Vec<runtime::KernelSpec>> {
    let variants = ops::all_variants(num);
    if let Some(fams) = families {
        let known: std::collections::BTreeSet<&str> =
            variants.iter().map(|(s, _)| s.family).collect();
        if let Some(bad) = fams.iter().find(|f| !known.contains(f.as_str())) {
            let known: Vec<&str> = known.into_iter().collect();
            return Err(PyValueError::new_err(format!(
                "family {bad:?}: unknown; the families are {}",
                known.join(", ")
            )));
        }
    }
    // one spec per translation unit: a family's entries with the same defines share a CUBIN
    // (and a cache entry), which two threads would otherwise both compile
    let mut seen = std::collections::HashSet::new();
    Ok(variants
        .into_iter()
        .filter(|(s, main)| {
            (all || *main) && families.map_or(true, |f| f.iter().any(|n| n == s.family))
        })
        .map(|(s, _)| s)
        .filter(|s| seen.insert((s.family, s.defines.clone())))
        .collect())
}

#[pyfunction]
#[pyo3(signature = (device_id, progress=None, all=false, workers=None))]
fn precompile(
    py: Python<'_>,
    device_id: i32,
    progress: Option<&Bound<'_, PyAny>>,
    all: bool,
    workers: Option<usize>,
) -> PyResult<usize> {
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device_id)?;
    let num = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let specs = precompile_specs(num, all, None)?;
    build_variants(py, &specs, progress, workers, &|s| {
        dev.kernel_with_origin(s).map(|(_, fresh)| fresh)
    })
}

/// `precompile` for an arch named instead of a GPU: NVRTC alone compiles into the disk cache
/// (`cache_dir()`), skipping intact entries; the count compiled.
#[pyfunction]
#[pyo3(signature = (arch, progress=None, all=false, workers=None, families=None))]
fn precompile_arch(
    py: Python<'_>,
    arch: &str,
    progress: Option<&Bound<'_, PyAny>>,
    all: bool,
    workers: Option<usize>,
    families: Option<Vec<String>>,
) -> PyResult<usize> {
    let specs = precompile_specs(arch_num(arch)?, all, families.as_deref())?;
    let cache = runtime::cache::DiskCache::new(runtime::cache::default_dir());
    build_variants(py, &specs, progress, workers, &|s| {
        runtime::precompile_offline(&cache, s, arch)
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // Let NVRTC be found in pip wheels (nvidia-cuda-nvrtc) under any sys.path entry.
    if let Ok(paths) = py
        .import("sys")
        .and_then(|s| s.getattr("path"))
        .and_then(|p| p.extract::<Vec<String>>())
    {
        runtime::set_python_paths(
            paths
                .into_iter()
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .collect(),
        );
    }
    m.add("FlashscanError", py.get_type::<FlashscanError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add("CudaError", py.get_type::<CudaError>())?;
    m.add_class::<DeviceBuffer>()?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(cache_dir, m)?)?;
    m.add_function(wrap_pyfunction!(backend_status, m)?)?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    m.add_function(wrap_pyfunction!(empty, m)?)?;
    m.add_function(wrap_pyfunction!(flash_attn_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(flash_attn_fwd_fp8, m)?)?;
    m.add_function(wrap_pyfunction!(kvcache_append, m)?)?;
    m.add_function(wrap_pyfunction!(flash_attn_kvcache, m)?)?;
    m.add_function(wrap_pyfunction!(selective_scan_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(scan_saved_state_count, m)?)?;
    m.add_function(wrap_pyfunction!(flash_attn_bwd, m)?)?;
    m.add_function(wrap_pyfunction!(flash_attn_varlen_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(flash_attn_varlen_bwd, m)?)?;
    m.add_function(wrap_pyfunction!(selective_scan_bwd, m)?)?;
    m.add_function(wrap_pyfunction!(selective_state_update, m)?)?;
    m.add_function(wrap_pyfunction!(ssd_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(ssd_bwd, m)?)?;
    m.add_function(wrap_pyfunction!(ssd_bwd_16bit, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_variants, m)?)?;
    m.add_function(wrap_pyfunction!(compile_variant, m)?)?;
    m.add_function(wrap_pyfunction!(precompile, m)?)?;
    m.add_function(wrap_pyfunction!(precompile_arch, m)?)?;
    conv_bindings::register(m)?;
    replay_bindings::register(m)?;
    serve::register(m)?;
    m.add_function(wrap_pyfunction!(xla_ffi_targets, m)?)?;
    m.add_function(wrap_pyfunction!(xla_ffi_api_version, m)?)?;
    Ok(())
}
