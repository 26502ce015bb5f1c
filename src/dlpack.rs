//! DLPack: the C structs of the DLPack standard (v0.8 legacy and v1.x versioned capsules),
//! importing any framework's tensor as a `TensorView`, and exporting a flashscan-owned CUDA
//! buffer as a capsule any framework can adopt.
//!
//! Import borrows: we read the capsule and keep it (and so the producer's memory) alive for
//! the call; we never rename it "used_dltensor", so the capsule's own destructor runs the
//! producer's deleter as usual.

use std::ffi::{c_char, c_void, CStr};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::error::{type_err, value_err, Error, Result};
use crate::tensor::{DType, DeviceKind, TensorView};

#[repr(C)]
#[derive(Clone, Copy)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

#[repr(C)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

pub const DL_CPU: i32 = 1;
pub const DL_CUDA: i32 = 2;
const DL_INT: u8 = 0;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
/// DLPack 1.1's kDLFloat8_e4m3fn (torch.float8_e4m3fn).
const DL_FLOAT8_E4M3FN: u8 = 10;
const FLAG_READ_ONLY: u64 = 1;
const FLAG_IS_COPIED: u64 = 2;

const NAME_LEGACY: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";
const NAME_USED: &CStr = c"used_dltensor";
const NAME_USED_VERSIONED: &CStr = c"used_dltensor_versioned";

/// A tensor brought in for one call, holding whatever keeps its memory alive.
pub struct Imported<'py> {
    pub view: TensorView,
    _keep: Option<Bound<'py, PyAny>>,
}

pub(crate) fn dtype_of(dt: DLDataType, arg: &str) -> Result<DType> {
    match (dt.code, dt.bits, dt.lanes) {
        (DL_FLOAT, 16, 1) => Ok(DType::F16),
        (DL_FLOAT, 32, 1) => Ok(DType::F32),
        (DL_FLOAT, 64, 1) => Ok(DType::F64),
        (DL_BFLOAT, 16, 1) => Ok(DType::BF16),
        (DL_INT, 32, 1) => Ok(DType::I32),
        (DL_FLOAT8_E4M3FN, 8, 1) => Ok(DType::F8E4M3),
        (code, bits, lanes) => Err(type_err(format!(
            "{arg} has an unsupported DLPack dtype (code {code}, {bits} bits, {lanes} lanes); \
             allowed: float16, bfloat16, float32 (int32 for index tensors)"
        ))),
    }
}

pub(crate) fn device_of(device_type: i32) -> DeviceKind {
    match device_type {
        DL_CPU => DeviceKind::Cpu,
        DL_CUDA => DeviceKind::Cuda,
        other => DeviceKind::Other(other),
    }
}

/// Reads a DLTensor into a view.
///
/// # Safety
/// `t` must point to a valid DLTensor whose shape/strides arrays hold `ndim` entries.
pub unsafe fn view_of(t: &DLTensor, readonly: bool, arg: &str) -> Result<TensorView> {
    if t.ndim < 0 || t.ndim > 16 {
        return Err(value_err(format!("{arg} has an invalid rank {}", t.ndim)));
    }
    let n = t.ndim as usize;
    let shape: Vec<i64> = if n == 0 {
        vec![]
    } else {
        std::slice::from_raw_parts(t.shape, n).to_vec()
    };
    let strides = if t.strides.is_null() || n == 0 {
        compact_strides(&shape)
    } else {
        std::slice::from_raw_parts(t.strides, n).to_vec()
    };
    if shape.iter().any(|&d| d < 0) {
        return Err(value_err(format!(
            "{arg} has a negative dimension {shape:?}"
        )));
    }
    Ok(TensorView {
        ptr: (t.data as u64).wrapping_add(t.byte_offset),
        shape,
        strides,
        dtype: dtype_of(t.dtype, arg)?,
        device: device_of(t.device.device_type),
        device_id: t.device.device_id,
        readonly,
    })
}

pub fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

fn capsule_name(obj: &Bound<'_, PyAny>) -> Option<&'static CStr> {
    // SAFETY: obj is a live capsule (checked by the caller); the name pointer is owned by it
    // and we only compare it against our constants.
    unsafe {
        let p = ffi::PyCapsule_GetName(obj.as_ptr());
        if p.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        let name = CStr::from_ptr(p);
        [NAME_LEGACY, NAME_VERSIONED, NAME_USED, NAME_USED_VERSIONED]
            .into_iter()
            .find(|known| *known == name)
    }
}

/// Parses a DLPack capsule (kept alive by the returned `Imported`).
fn from_capsule<'py>(cap: Bound<'py, PyAny>, arg: &str) -> Result<Imported<'py>> {
    let name = capsule_name(&cap);
    // SAFETY: the capsule's name says which struct its pointer holds; the producer keeps
    // that struct valid until its deleter runs, which cannot happen while we hold `cap`.
    let view = unsafe {
        match name {
            Some(n) if n == NAME_VERSIONED => {
                let p = ffi::PyCapsule_GetPointer(cap.as_ptr(), n.as_ptr())
                    as *const DLManagedTensorVersioned;
                if p.is_null() {
                    ffi::PyErr_Clear();
                    return Err(value_err(format!("{arg}: empty DLPack capsule")));
                }
                let m = &*p;
                if m.version.major > 1 {
                    return Err(Error::Unsupported(format!(
                        "{arg}: DLPack version {}.{} is newer than this build understands (1.x)",
                        m.version.major, m.version.minor
                    )));
                }
                let mut v = view_of(&m.dl_tensor, m.flags & FLAG_READ_ONLY != 0, arg)?;
                // A copy made by the producer would take our writes with it: never write there.
                if m.flags & FLAG_IS_COPIED != 0 {
                    v.readonly = true;
                }
                v
            }
            Some(n) if n == NAME_LEGACY => {
                let p =
                    ffi::PyCapsule_GetPointer(cap.as_ptr(), n.as_ptr()) as *const DLManagedTensor;
                if p.is_null() {
                    ffi::PyErr_Clear();
                    return Err(value_err(format!("{arg}: empty DLPack capsule")));
                }
                view_of(&(*p).dl_tensor, false, arg)?
            }
            Some(_) => {
                return Err(value_err(format!(
                    "{arg} is a DLPack capsule that was already consumed"
                )))
            }
            None => {
                return Err(type_err(format!(
                    "{arg} is a capsule but not a DLPack tensor"
                )))
            }
        }
    };
    Ok(Imported {
        view,
        _keep: Some(cap),
    })
}

/// Ints of a shape or strides sequence. torch.Size and stride() are tuples: read them
/// item by item (no intermediate list); anything else goes through generic extraction.
fn int_seq(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    match obj.downcast::<PyTuple>() {
        Ok(t) => t.iter().map(|x| x.extract::<i64>()).collect(),
        Err(_) => obj.extract(),
    }
}

/// dtype names as the Python layer sends them; compared by identity first (the layer passes
/// the same interned strings every call), by value otherwise.
fn dtype_of_name(obj: &Bound<'_, PyAny>) -> Option<DType> {
    let py = obj.py();
    for (name, dt) in [
        (intern!(py, "bfloat16"), DType::BF16),
        (intern!(py, "float16"), DType::F16),
        (intern!(py, "float32"), DType::F32),
        (intern!(py, "float64"), DType::F64),
        (intern!(py, "int32"), DType::I32),
        (intern!(py, "float8_e4m3fn"), DType::F8E4M3),
    ] {
        if obj.is(name) {
            return Some(dt);
        }
    }
    obj.extract::<String>()
        .ok()
        .and_then(|s| DType::from_name(&s))
}

/// The descriptor-tuple fast path: (ptr, shape, strides, dtype, device_type, device_id).
fn from_descriptor(t: &Bound<'_, PyTuple>, arg: &str) -> Result<TensorView> {
    let bad = || {
        type_err(format!(
            "{arg}: a descriptor tuple must be (data_ptr, shape, strides, dtype, device_type, device_id)"
        ))
    };
    if t.len() != 6 {
        return Err(bad());
    }
    let item = |i: usize| t.get_item(i).map_err(|_| bad());
    let ptr: u64 = item(0)?.extract().map_err(|_| bad())?;
    let shape = int_seq(&item(1)?).map_err(|_| bad())?;
    let strides = int_seq(&item(2)?).map_err(|_| bad())?;
    let dtype_obj = item(3)?;
    let device_type: i32 = item(4)?.extract().map_err(|_| bad())?;
    let device_id: i32 = item(5)?.extract().map_err(|_| bad())?;
    if shape.len() != strides.len() {
        return Err(value_err(format!(
            "{arg}: shape and strides differ in length"
        )));
    }
    let dtype = dtype_of_name(&dtype_obj)
        .ok_or_else(|| type_err(format!("{arg} has unsupported dtype {dtype_obj}")))?;
    Ok(TensorView {
        ptr,
        shape,
        strides,
        dtype,
        device: device_of(device_type),
        device_id,
        readonly: false,
    })
}

/// Imports a tensor argument. `stream_for(device_id)` gives the stream our kernels will run on
/// for a CUDA tensor, so the producer can order its pending work before ours (DLPack's
/// `stream=` contract: 1 stands for the legacy default stream, 0 is not allowed).
pub fn import<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    stream_for: &dyn Fn(i32) -> Result<u64>,
) -> Result<Imported<'py>> {
    let py = obj.py();
    if let Ok(t) = obj.downcast::<PyTuple>() {
        return Ok(Imported {
            view: from_descriptor(t, arg)?,
            _keep: None,
        });
    }
    // SAFETY: type check on a live object.
    if unsafe { ffi::PyCapsule_CheckExact(obj.as_ptr()) } == 1 {
        return from_capsule(obj.clone(), arg);
    }
    let Ok(dlpack) = obj.getattr(intern!(py, "__dlpack__")) else {
        return Err(type_err(format!(
            "{arg} must be a tensor that supports DLPack (torch, cupy, jax, numpy...), got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into())
        )));
    };
    let (device_type, device_id): (i32, i32) = obj
        .call_method0(intern!(py, "__dlpack_device__"))
        .and_then(|d| d.extract())
        .map_err(|e| type_err(format!("{arg}.__dlpack_device__() failed: {e}")))?;
    let stream: Option<u64> = if device_type == DL_CUDA {
        let s = stream_for(device_id)?;
        Some(if s == 0 { 1 } else { s })
    } else {
        None
    };
    let call = |versioned: bool| -> PyResult<Bound<'py, PyAny>> {
        let kwargs = PyDict::new(py);
        if let Some(s) = stream {
            kwargs.set_item(intern!(py, "stream"), s)?;
        }
        if versioned {
            kwargs.set_item(intern!(py, "max_version"), (1, 0))?;
        }
        dlpack.call((), Some(&kwargs))
    };
    let cap = match call(true) {
        Ok(c) => c,
        // Producers older than DLPack 1.0 reject max_version with a TypeError.
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            call(false).map_err(|e| value_err(format!("{arg}.__dlpack__() failed: {e}")))?
        }
        Err(e) => {
            let msg = e.to_string();
            // numpy refuses legacy export of read-only arrays with BufferError.
            return Err(value_err(format!("{arg}.__dlpack__() failed: {msg}")));
        }
    };
    from_capsule(cap, arg)
}

/// A CUDA allocation made by flashscan for a framework that has no allocator we can call
/// (jax). Shared: the Python buffer object and every capsule exported from it hold one
/// reference; the memory is freed when the last goes.
pub struct DeviceAllocation {
    pub ptr: u64,
    pub device_id: i32,
}

impl Drop for DeviceAllocation {
    fn drop(&mut self) {
        free_device(self.device_id, self.ptr);
    }
}

/// What an exported capsule owns: its shape/strides arrays and a reference to the memory.
struct ExportCtx {
    shape: Vec<i64>,
    strides: Vec<i64>,
    _alloc: std::sync::Arc<DeviceAllocation>,
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    let m = Box::from_raw(m);
    drop(Box::from_raw(m.manager_ctx as *mut ExportCtx));
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    let m = Box::from_raw(m);
    drop(Box::from_raw(m.manager_ctx as *mut ExportCtx));
}

/// Frees a flashscan allocation; errors at this point have nowhere to go and are dropped.
fn free_device(device_id: i32, ptr: u64) {
    if let Ok(rt) = crate::runtime::runtime() {
        if let Ok(dev) = rt.device(device_id) {
            if let Ok(_bound) = dev.bind() {
                // SAFETY: ptr came from runtime::driver::alloc and is freed exactly once, when
                // the last reference to its DeviceAllocation drops.
                unsafe {
                    let _ = crate::runtime::driver::free(ptr);
                }
            }
        }
    }
}

/// Capsule destructor: an unconsumed capsule still owns its tensor and must run the deleter.
unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    if ffi::PyCapsule_IsValid(cap, NAME_VERSIONED.as_ptr()) == 1 {
        let p = ffi::PyCapsule_GetPointer(cap, NAME_VERSIONED.as_ptr())
            as *mut DLManagedTensorVersioned;
        if let Some(d) = p.as_ref().and_then(|m| m.deleter) {
            d(p);
        }
    } else if ffi::PyCapsule_IsValid(cap, NAME_LEGACY.as_ptr()) == 1 {
        let p = ffi::PyCapsule_GetPointer(cap, NAME_LEGACY.as_ptr()) as *mut DLManagedTensor;
        if let Some(d) = p.as_ref().and_then(|m| m.deleter) {
            d(p);
        }
    }
}

/// Builds a capsule sharing `alloc` (viewed as a compact tensor) with the consumer.
pub fn export_capsule(
    py: Python<'_>,
    alloc: std::sync::Arc<DeviceAllocation>,
    shape: Vec<i64>,
    dtype: DType,
    versioned: bool,
) -> PyResult<PyObject> {
    let strides = compact_strides(&shape);
    let (ptr, device_id) = (alloc.ptr, alloc.device_id);
    let ctx = Box::into_raw(Box::new(ExportCtx {
        shape,
        strides,
        _alloc: alloc,
    }));
    // SAFETY: ctx lives until the deleter; its shape/strides vectors are never resized, so
    // the pointers stored in the DLTensor stay valid for the tensor's whole life.
    unsafe {
        let c = &mut *ctx;
        let t = DLTensor {
            data: ptr as usize as *mut c_void,
            device: DLDevice {
                device_type: DL_CUDA,
                device_id,
            },
            ndim: c.shape.len() as i32,
            dtype: match dtype {
                DType::BF16 => DLDataType {
                    code: DL_BFLOAT,
                    bits: 16,
                    lanes: 1,
                },
                DType::I32 => DLDataType {
                    code: DL_INT,
                    bits: 32,
                    lanes: 1,
                },
                DType::F8E4M3 => DLDataType {
                    code: DL_FLOAT8_E4M3FN,
                    bits: 8,
                    lanes: 1,
                },
                other => DLDataType {
                    code: DL_FLOAT,
                    bits: (other.size() * 8) as u8,
                    lanes: 1,
                },
            },
            shape: c.shape.as_mut_ptr(),
            strides: c.strides.as_mut_ptr(),
            byte_offset: 0,
        };
        let (raw, name): (*mut c_void, *const c_char) = if versioned {
            let m = Box::new(DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: ctx.cast(),
                deleter: Some(delete_versioned),
                flags: 0,
                dl_tensor: t,
            });
            (Box::into_raw(m).cast(), NAME_VERSIONED.as_ptr())
        } else {
            let m = Box::new(DLManagedTensor {
                dl_tensor: t,
                manager_ctx: ctx.cast(),
                deleter: Some(delete_legacy),
            });
            (Box::into_raw(m).cast(), NAME_LEGACY.as_ptr())
        };
        let cap = ffi::PyCapsule_New(raw, name, Some(capsule_destructor));
        if cap.is_null() {
            // Run the deleter ourselves: nobody else will.
            if versioned {
                delete_versioned(raw.cast());
            } else {
                delete_legacy(raw.cast());
            }
            return Err(PyErr::fetch(py));
        }
        Ok(PyObject::from_owned_ptr(py, cap))
    }
}
