//! Reading one XLA FFI call: the metadata stage, buffers as `TensorView`s, scalar attributes by
//! name, the CUDA stream, and turning our `Error` into an `XLA_FFI_Error`. All raw-pointer
//! reading of the call frame lives here; the handlers above it see safe values only.

use std::ffi::{c_int, CStr, CString};

use super::abi;
use crate::error::{type_err, value_err, Error, Result};
use crate::runtime::driver;
use crate::tensor::{DType, DeviceKind, TensorView};

/// Answers the metadata query (XLA calls every handler once at registration with a metadata
/// extension, to learn the FFI version it was built for). Returns true when it was one.
///
/// # Safety
/// `frame` must be a call frame from XLA.
unsafe fn answer_metadata(frame: &abi::CallFrame) -> bool {
    let mut ext = frame.extension_start;
    while !ext.is_null() {
        let base = &*ext;
        if base.struct_size < abi::EXTENSION_BASE_SIZE {
            return false;
        }
        if base.ext_type == abi::EXTENSION_METADATA {
            if base.struct_size >= abi::METADATA_EXTENSION_SIZE {
                let md = (*ext.cast::<abi::MetadataExtension>()).metadata;
                if !md.is_null() && (*md).struct_size >= abi::METADATA_SIZE {
                    // Only the fields of version 0.1: newer fields keep XLA's defaults.
                    (*md).api_version.major_version = abi::API_MAJOR;
                    (*md).api_version.minor_version = abi::API_MINOR;
                    (*md).traits = 0;
                }
            }
            return true;
        }
        ext = base.next;
    }
    false
}

/// One call, checked: the frame and the API table are large enough for what we read.
pub struct Frame<'a> {
    raw: &'a abi::CallFrame,
    api: &'a abi::Api,
    target: &'static str,
}

/// What `Frame::open` found.
pub enum Opened<'a> {
    /// The metadata stage, answered: nothing to run.
    Metadata,
    /// A stage other than execute: nothing to do (we register an execute handler only).
    OtherStage,
    Execute(Frame<'a>),
}

impl<'a> Frame<'a> {
    /// # Safety
    /// `frame` must be null or a call frame from XLA, valid for 'a.
    pub unsafe fn open(
        frame: *mut abi::CallFrame,
        target: &'static str,
    ) -> std::result::Result<Opened<'a>, *mut abi::Error> {
        // Without a frame or an API table no error can be created: nothing to report through.
        let Some(raw) = frame.as_ref() else {
            return Err(std::ptr::null_mut());
        };
        let Some(api) = raw.api.as_ref() else {
            return Err(std::ptr::null_mut());
        };
        if api.struct_size < abi::API_SIZE || api.error_create.is_none() {
            return Err(raw_error(
                api,
                abi::code::UNIMPLEMENTED,
                &format!(
                    "flashscan {target}: the XLA FFI API table is {} bytes, older than the {} \
                     flashscan needs (XLA FFI API {}.{})",
                    api.struct_size,
                    abi::API_SIZE,
                    abi::API_MAJOR,
                    abi::API_MINOR
                ),
            ));
        }
        if raw.struct_size < abi::CALL_FRAME_SIZE {
            return Err(raw_error(
                api,
                abi::code::INVALID_ARGUMENT,
                &format!(
                    "flashscan {target}: XLA FFI call frame of {} bytes, expected at least {}",
                    raw.struct_size,
                    abi::CALL_FRAME_SIZE
                ),
            ));
        }
        if answer_metadata(raw) {
            return Ok(Opened::Metadata);
        }
        if raw.stage != abi::STAGE_EXECUTE {
            return Ok(Opened::OtherStage);
        }
        Ok(Opened::Execute(Frame { raw, api, target }))
    }

    pub fn target(&self) -> &'static str {
        self.target
    }

    pub fn arg_count(&self) -> usize {
        self.raw.args.size.max(0) as usize
    }

    pub fn ret_count(&self) -> usize {
        self.raw.rets.size.max(0) as usize
    }

    /// Fails unless the call has exactly `args` operands and `rets` results.
    pub fn expect_arity(&self, args: usize, rets: usize) -> Result<()> {
        if self.arg_count() != args || self.ret_count() != rets {
            return Err(value_err(format!(
                "flashscan {}: called with {} operands and {} results, expected {args} and \
                 {rets} (the jax adapter and the native module disagree: reinstall flashscan)",
                self.target,
                self.arg_count(),
                self.ret_count()
            )));
        }
        Ok(())
    }

    /// Operand `i` as a read-only view.
    pub fn arg(&self, i: usize, name: &str) -> Result<TensorView> {
        let a = &self.raw.args;
        if i >= self.arg_count() || a.struct_size < abi::ARGS_SIZE {
            return Err(value_err(format!(
                "flashscan {}: no operand {name}",
                self.target
            )));
        }
        // SAFETY: i < size; XLA gives `size` types and pointers.
        let (kind, ptr) = unsafe { (*a.types.add(i), *a.args.add(i)) };
        buffer_view(kind, ptr.cast(), name, true)
    }

    /// Result `i` as a writable view.
    pub fn ret(&self, i: usize, name: &str) -> Result<TensorView> {
        let r = &self.raw.rets;
        if i >= self.ret_count() || r.struct_size < abi::RETS_SIZE {
            return Err(value_err(format!(
                "flashscan {}: no result {name}",
                self.target
            )));
        }
        // SAFETY: i < size; XLA gives `size` types and pointers.
        let (kind, ptr) = unsafe { (*r.types.add(i), *r.rets.add(i)) };
        buffer_view(kind, ptr.cast(), name, false)
    }

    /// A scalar attribute as f64 (any integer, float or bool scalar), or None if absent.
    fn scalar(&self, name: &str) -> Result<Option<f64>> {
        let at = &self.raw.attrs;
        if at.struct_size < abi::ATTRS_SIZE {
            return Ok(None);
        }
        for i in 0..at.size.max(0) as usize {
            // SAFETY: i < size; names are byte spans valid for the call.
            let (kind, span, value) =
                unsafe { (*at.types.add(i), &**at.names.add(i), *at.attrs.add(i)) };
            // SAFETY: a span of `len` bytes.
            let key = unsafe { std::slice::from_raw_parts(span.ptr.cast::<u8>(), span.len) };
            if key != name.as_bytes() {
                continue;
            }
            if kind != abi::ATTR_SCALAR {
                return Err(type_err(format!(
                    "flashscan {}: attribute {name} must be a scalar",
                    self.target
                )));
            }
            // SAFETY: a scalar attribute points at an XLA_FFI_Scalar whose value has its dtype.
            let s = unsafe { &*value.cast::<abi::Scalar>() };
            let v = unsafe { read_scalar(s) }.ok_or_else(|| {
                type_err(format!(
                    "flashscan {}: attribute {name} has unsupported dtype code {}",
                    self.target, s.dtype
                ))
            })?;
            return Ok(Some(v));
        }
        Ok(None)
    }

    fn required(&self, name: &str) -> Result<f64> {
        self.scalar(name)?.ok_or_else(|| {
            value_err(format!(
                "flashscan {}: attribute {name} is missing",
                self.target
            ))
        })
    }

    pub fn attr_f32(&self, name: &str) -> Result<f32> {
        Ok(self.required(name)? as f32)
    }

    pub fn attr_i64(&self, name: &str) -> Result<i64> {
        Ok(self.required(name)? as i64)
    }

    pub fn attr_bool(&self, name: &str) -> Result<bool> {
        Ok(self.required(name)? != 0.0)
    }

    /// XLA's CUDA stream for this call (`XLA_FFI_Stream_Get`); an error on a platform
    /// without one (XLA:CPU).
    pub fn stream(&self) -> Result<u64> {
        let get = self.api.stream_get.ok_or_else(|| {
            Error::Unavailable("the XLA FFI API table has no XLA_FFI_Stream_Get".into())
        })?;
        let mut args = abi::StreamGetArgs {
            struct_size: abi::STREAM_GET_ARGS_SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: self.raw.ctx,
            stream: std::ptr::null_mut(),
        };
        // SAFETY: a valid args struct; ctx is the call's execution context.
        let err = unsafe { get(&mut args) };
        if !err.is_null() {
            let why = self.take_message(err);
            return Err(Error::Unavailable(format!(
                "XLA gave flashscan {} no CUDA stream: {why} (on CPU, flashscan.jax runs the \
                 NumPy references instead of this target)",
                self.target
            )));
        }
        Ok(args.stream as usize as u64)
    }

    /// Reads and destroys an error XLA returned to us.
    fn take_message(&self, err: *mut abi::Error) -> String {
        let mut text = String::from("(no message)");
        if let Some(get) = self.api.error_get_message {
            let mut a = abi::ErrorGetMessageArgs {
                struct_size: abi::ERROR_GET_MESSAGE_ARGS_SIZE,
                extension_start: std::ptr::null_mut(),
                error: err,
                message: std::ptr::null(),
            };
            // SAFETY: err came from XLA; the message lives until the error is destroyed.
            unsafe { get(&mut a) };
            if !a.message.is_null() {
                // SAFETY: XLA returns a NUL-terminated string.
                text = unsafe { CStr::from_ptr(a.message) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        if let Some(destroy) = self.api.error_destroy {
            let mut a = abi::ErrorDestroyArgs {
                struct_size: abi::ERROR_DESTROY_ARGS_SIZE,
                extension_start: std::ptr::null_mut(),
                error: err,
            };
            // SAFETY: ownership of err is ours; destroyed once.
            unsafe { destroy(&mut a) };
        }
        text
    }

    /// Our error as an `XLA_FFI_Error` (ownership passes to XLA).
    pub fn error(&self, e: &Error) -> *mut abi::Error {
        let code = match e {
            Error::Type(_) | Error::Value(_) => abi::code::INVALID_ARGUMENT,
            Error::Unsupported(_) => abi::code::UNIMPLEMENTED,
            Error::Unavailable(_) => abi::code::UNAVAILABLE,
            Error::Compile { .. } | Error::Cuda { .. } | Error::Internal(_) => abi::code::INTERNAL,
        };
        raw_error(self.api, code, &format!("flashscan {}: {e}", self.target))
    }
}

/// Creates an `XLA_FFI_Error` through the API table (which copies the message).
fn raw_error(api: &abi::Api, code: c_int, msg: &str) -> *mut abi::Error {
    let Some(create) = api.error_create else {
        return std::ptr::null_mut();
    };
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let mut args = abi::ErrorCreateArgs {
        struct_size: abi::ERROR_CREATE_ARGS_SIZE,
        extension_start: std::ptr::null_mut(),
        message: text.as_ptr(),
        errc: code,
    };
    // SAFETY: a valid args struct; XLA copies the message before returning.
    unsafe { create(&mut args) }
}

/// # Safety
/// `s.value` must point at a value of `s.dtype`.
unsafe fn read_scalar(s: &abi::Scalar) -> Option<f64> {
    use abi::dtype::*;
    let p = s.value;
    if p.is_null() {
        return None;
    }
    Some(match s.dtype {
        PRED => (*p.cast::<u8>() != 0) as i64 as f64,
        S8 => *p.cast::<i8>() as f64,
        S16 => *p.cast::<i16>() as f64,
        S32 => *p.cast::<i32>() as f64,
        S64 => *p.cast::<i64>() as f64,
        U8 => *p.cast::<u8>() as f64,
        U16 => *p.cast::<u16>() as f64,
        U32 => *p.cast::<u32>() as f64,
        U64 => *p.cast::<u64>() as f64,
        F32 => *p.cast::<f32>() as f64,
        F64 => *p.cast::<f64>(),
        _ => return None,
    })
}

fn dtype_of(code: c_int) -> Option<DType> {
    use abi::dtype::*;
    match code {
        F16 => Some(DType::F16),
        BF16 => Some(DType::BF16),
        F32 => Some(DType::F32),
        F64 => Some(DType::F64),
        S32 => Some(DType::I32),
        _ => None,
    }
}

/// A buffer as a row-major view (ffi_call's default layout). The device ordinal is filled in
/// by `place_on` once the call knows it runs on a GPU.
fn buffer_view(
    kind: c_int,
    buf: *const abi::Buffer,
    name: &str,
    readonly: bool,
) -> Result<TensorView> {
    if kind != abi::BUFFER || buf.is_null() {
        return Err(type_err(format!("{name}: expected an array operand")));
    }
    // SAFETY: XLA passes a valid XLA_FFI_Buffer for a buffer argument.
    let b = unsafe { &*buf };
    if b.struct_size < abi::BUFFER_SIZE {
        return Err(value_err(format!(
            "{name}: XLA FFI buffer struct of {} bytes, expected {}",
            b.struct_size,
            abi::BUFFER_SIZE
        )));
    }
    let dtype = dtype_of(b.dtype).ok_or_else(|| {
        type_err(format!(
            "{name}: XLA dtype code {} is not supported (float16, bfloat16, float32)",
            b.dtype
        ))
    })?;
    let rank = b.rank.max(0) as usize;
    let shape: Vec<i64> = if rank == 0 {
        Vec::new()
    } else {
        // SAFETY: `rank` dims.
        unsafe { std::slice::from_raw_parts(b.dims, rank) }.to_vec()
    };
    let mut strides = vec![1i64; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1);
    }
    Ok(TensorView {
        ptr: b.data as usize as u64,
        shape,
        strides,
        dtype,
        device: DeviceKind::Cuda,
        device_id: 0,
        readonly,
    })
}

/// The device a GPU call runs on, read off its first non-empty buffer (XLA's buffers carry no
/// device; all of one call's buffers live on one). Reads data pointers only: no view is built.
pub fn call_device(f: &Frame) -> Result<i32> {
    crate::runtime::runtime().map_err(Error::Unavailable)?;
    let lists = [
        (f.raw.args.size, f.raw.args.types, f.raw.args.args),
        (f.raw.rets.size, f.raw.rets.types, f.raw.rets.rets),
    ];
    for (size, types, ptrs) in lists {
        for i in 0..size.max(0) as usize {
            // SAFETY: i < size; a buffer entry points at an XLA_FFI_Buffer of `rank` dims.
            let ptr = unsafe {
                let buf = (*ptrs.add(i)).cast::<abi::Buffer>();
                if *types.add(i) != abi::BUFFER || buf.is_null() || (*buf).data.is_null() {
                    continue;
                }
                let b = &*buf;
                if b.rank > 0 && std::slice::from_raw_parts(b.dims, b.rank as usize).contains(&0) {
                    continue;
                }
                b.data as usize as u64
            };
            return driver::pointer_device(ptr);
        }
    }
    Ok(0)
}
