//! torch tensors read without a Python call: the DLPack C exchange API that torch (2.10 and
//! later) publishes as the class attribute `torch.Tensor.__dlpack_c_exchange_api__` (a
//! PyCapsule named "dlpack_exchange_api" holding a `DLPackExchangeAPI` table, DLPack 1.3).
//! Its `dltensor_from_py_object_no_sync` fills a caller-owned `DLTensor` (pointer, shape,
//! strides, dtype, device) in tens of nanoseconds, where the Python route (`.shape`,
//! `.stride()`, `.dtype`, `.device`, `.data_ptr()`) costs about a microsecond a tensor;
//! `current_work_stream` is torch's current stream of a device. What the torch hot paths
//! (`serve`) build on. Nothing here owns memory or changes a tensor.

use std::ffi::{c_int, c_void, CStr};

use pyo3::ffi;
use pyo3::prelude::*;

use crate::dlpack::{
    device_of, dtype_of, DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion, DLTensor,
    DL_CUDA,
};
use crate::tensor::TensorView;

const CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

#[repr(C)]
struct ExchangeHeader {
    version: DLPackVersion,
    prev_api: *mut ExchangeHeader,
}

type SetError = unsafe extern "C" fn(*mut c_void, *const i8, *const i8);

/// DLPack 1.3's `DLPackExchangeAPI` (dlpack.h): the stable header, then five producer entry
/// points in this order. We call two of them; the others are declared for the layout.
#[repr(C)]
struct ExchangeTable {
    header: ExchangeHeader,
    managed_tensor_allocator: Option<
        unsafe extern "C" fn(
            *mut DLTensor,
            *mut *mut DLManagedTensorVersioned,
            *mut c_void,
            Option<SetError>,
        ) -> c_int,
    >,
    managed_tensor_from_py_object_no_sync:
        Option<unsafe extern "C" fn(*mut c_void, *mut *mut DLManagedTensorVersioned) -> c_int>,
    managed_tensor_to_py_object_no_sync:
        Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned, *mut *mut c_void) -> c_int>,
    dltensor_from_py_object_no_sync:
        Option<unsafe extern "C" fn(*mut c_void, *mut DLTensor) -> c_int>,
    current_work_stream: Option<unsafe extern "C" fn(c_int, i32, *mut *mut c_void) -> c_int>,
}

type ReadFn = unsafe extern "C" fn(*mut c_void, *mut DLTensor) -> c_int;
type StreamFn = unsafe extern "C" fn(c_int, i32, *mut *mut c_void) -> c_int;

/// The two entry points of a torch build's exchange table we use. The table is a static of
/// torch's library (the capsule is a class attribute, alive for the process).
#[derive(Clone, Copy)]
pub(crate) struct TorchExchange {
    read: ReadFn,
    stream: StreamFn,
}

/// What a read gives: the tensor's own metadata, copied out (the producer's shape and
/// strides arrays are only borrowed for the duration of the read).
pub(crate) struct TorchTensor {
    /// the first element's address (DLPack data + byte_offset)
    pub ptr: u64,
    /// (code, bits, lanes) of the DLPack dtype packed as code | bits << 8 | lanes << 16
    pub dtype: i64,
    pub device_type: i32,
    pub device_id: i32,
    pub ndim: usize,
    /// shape then strides (elements), `ndim` each; at most 8 dims are read
    pub dims: [i64; 16],
}

impl TorchTensor {
    pub fn shape(&self) -> &[i64] {
        &self.dims[..self.ndim]
    }
    pub fn strides(&self) -> &[i64] {
        &self.dims[8..8 + self.ndim]
    }
}

impl TorchExchange {
    /// The exchange table of `cls` (torch.Tensor or a subclass), or None where this torch
    /// has none (older than 2.10), publishes another major version, or lacks an entry.
    pub fn of_class(cls: &Bound<'_, PyAny>) -> Option<TorchExchange> {
        let cap = cls.getattr("__dlpack_c_exchange_api__").ok()?;
        // SAFETY: PyCapsule_GetPointer checks the capsule's type and name (NULL + an error
        // otherwise, cleared here); a capsule of that name holds a DLPackExchangeAPI whose
        // storage the producer keeps for the process.
        unsafe {
            let p = ffi::PyCapsule_GetPointer(cap.as_ptr(), CAPSULE_NAME.as_ptr())
                as *const ExchangeTable;
            if p.is_null() {
                ffi::PyErr_Clear();
                return None;
            }
            let t = &*p;
            if t.header.version.major != 1 {
                return None;
            }
            Some(TorchExchange {
                read: t.dltensor_from_py_object_no_sync?,
                stream: t.current_work_stream?,
            })
        }
    }

    /// `obj`'s pointer, dtype, device, shape and strides; None (no Python error left set)
    /// when torch cannot describe it or it has more than 8 dims. `obj` must be an instance
    /// of the class the table came from (the caller checks its type first).
    pub fn read(&self, obj: &Bound<'_, PyAny>) -> Option<TorchTensor> {
        let mut t = DLTensor {
            data: std::ptr::null_mut(),
            device: DLDevice {
                device_type: 0,
                device_id: 0,
            },
            ndim: 0,
            dtype: DLDataType {
                code: 0,
                bits: 0,
                lanes: 0,
            },
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        // SAFETY: obj is a live torch tensor (the caller checked its type) and `t` a local
        // the producer fills; its shape / strides arrays belong to the tensor, which `obj`
        // keeps alive while we copy them below (the GIL is held throughout).
        unsafe {
            if (self.read)(obj.as_ptr() as *mut c_void, &mut t) != 0 {
                ffi::PyErr_Clear();
                return None;
            }
            let n = usize::try_from(t.ndim).ok().filter(|&n| n <= 8)?;
            let mut dims = [0i64; 16];
            if n > 0 {
                if t.shape.is_null() {
                    return None;
                }
                dims[..n].copy_from_slice(std::slice::from_raw_parts(t.shape, n));
                if t.strides.is_null() {
                    let mut s = 1i64;
                    for i in (0..n).rev() {
                        dims[8 + i] = s;
                        s *= dims[i].max(1);
                    }
                } else {
                    dims[8..8 + n].copy_from_slice(std::slice::from_raw_parts(t.strides, n));
                }
            }
            Some(TorchTensor {
                ptr: (t.data as u64).wrapping_add(t.byte_offset),
                dtype: t.dtype.code as i64
                    | (t.dtype.bits as i64) << 8
                    | (t.dtype.lanes as i64) << 16,
                device_type: t.device.device_type,
                device_id: t.device.device_id,
                ndim: n,
                dims,
            })
        }
    }

    /// torch's current stream on CUDA device `device_id` (what `torch.cuda.current_stream`
    /// gives, a capture stream inside graph capture); None with no Python error left set when
    /// torch cannot say.
    pub fn cuda_stream(&self, device_id: i32) -> Option<u64> {
        let mut s: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the GIL is held (torch may set an error).
        unsafe {
            if (self.stream)(DL_CUDA, device_id, &mut s) != 0 {
                ffi::PyErr_Clear();
                return None;
            }
        }
        Some(s as u64)
    }
}

impl TorchTensor {
    /// The view a kernel launcher checks and plans with (None for a dtype flashscan has no
    /// name for).
    pub fn view(&self) -> Option<TensorView> {
        let dt = DLDataType {
            code: (self.dtype & 0xff) as u8,
            bits: (self.dtype >> 8 & 0xff) as u8,
            lanes: (self.dtype >> 16 & 0xffff) as u16,
        };
        Some(TensorView {
            ptr: self.ptr,
            shape: self.shape().to_vec(),
            strides: self.strides().to_vec(),
            dtype: dtype_of(dt, "").ok()?,
            device: device_of(self.device_type),
            device_id: self.device_id,
            readonly: false,
        })
    }

    /// Appends what a plan depends on (dtype, device, rank, shape, strides) to a key.
    pub fn push_signature(&self, key: &mut Vec<i64>) {
        key.push(self.dtype);
        key.push((self.device_type as i64) << 32 | self.device_id as u32 as i64);
        key.push(self.ndim as i64);
        key.extend_from_slice(self.shape());
        key.extend_from_slice(self.strides());
    }
}
