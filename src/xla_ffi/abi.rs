//! The C ABI of XLA's typed FFI, mirrored with our own `#[repr(C)]` types so that the wheel
//! needs no XLA or JAX header and no C++ toolchain, and links nothing new.
//!
//! Mirrors `xla/ffi/api/c_api.h` at API version 0.1 (`XLA_FFI_API_MAJOR` 0, `XLA_FFI_API_MINOR`
//! 1), the oldest version XLA still accepts; every newer XLA keeps these layouts (a layout change
//! bumps the major version) and only appends fields. Each struct carries `struct_size`: we check
//! that what XLA hands us is at least as large as the prefix we read (`*_SIZE` below, computed as
//! the header's `XLA_FFI_STRUCT_SIZE(struct, last_field)`), and stamp our own size on what we
//! hand XLA.

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

/// The FFI version these handlers are written against (answered at the metadata stage).
pub const API_MAJOR: c_int = 0;
pub const API_MINOR: c_int = 1;

/// `XLA_FFI_Extension_Type`.
pub const EXTENSION_METADATA: c_int = 1;
/// `XLA_FFI_ExecutionStage_EXECUTE`.
pub const STAGE_EXECUTE: c_int = 3;
/// `XLA_FFI_ArgType_BUFFER` / `XLA_FFI_RetType_BUFFER`.
pub const BUFFER: c_int = 1;
/// `XLA_FFI_AttrType_SCALAR`.
pub const ATTR_SCALAR: c_int = 3;

/// `XLA_FFI_DataType` values we read (the numbers of `xla::PrimitiveType`).
pub mod dtype {
    use std::ffi::c_int;
    pub const PRED: c_int = 1;
    pub const S8: c_int = 2;
    pub const S16: c_int = 3;
    pub const S32: c_int = 4;
    pub const S64: c_int = 5;
    pub const U8: c_int = 6;
    pub const U16: c_int = 7;
    pub const U32: c_int = 8;
    pub const U64: c_int = 9;
    pub const F16: c_int = 10;
    pub const F32: c_int = 11;
    pub const F64: c_int = 12;
    pub const BF16: c_int = 16;
}

/// `XLA_FFI_Error_Code` values we return.
pub mod code {
    use std::ffi::c_int;
    pub const INVALID_ARGUMENT: c_int = 3;
    pub const UNIMPLEMENTED: c_int = 12;
    pub const INTERNAL: c_int = 13;
    pub const UNAVAILABLE: c_int = 14;
}

#[repr(C)]
pub struct ExtensionBase {
    pub struct_size: usize,
    pub ext_type: c_int,
    pub next: *mut ExtensionBase,
}
pub const EXTENSION_BASE_SIZE: usize = size_of::<ExtensionBase>();

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub major_version: c_int,
    pub minor_version: c_int,
}
pub const API_VERSION_SIZE: usize = offset_of!(ApiVersion, minor_version) + size_of::<c_int>();

/// An opaque `XLA_FFI_Error` (owned by XLA once returned).
#[repr(C)]
pub struct Error {
    _opaque: [u8; 0],
}

#[repr(C)]
pub struct ErrorCreateArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub message: *const c_char,
    pub errc: c_int,
}
pub const ERROR_CREATE_ARGS_SIZE: usize = offset_of!(ErrorCreateArgs, errc) + size_of::<c_int>();

#[repr(C)]
pub struct ErrorGetMessageArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub error: *mut Error,
    pub message: *const c_char,
}
pub const ERROR_GET_MESSAGE_ARGS_SIZE: usize = size_of::<ErrorGetMessageArgs>();

#[repr(C)]
pub struct ErrorDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub error: *mut Error,
}
pub const ERROR_DESTROY_ARGS_SIZE: usize = size_of::<ErrorDestroyArgs>();

#[repr(C)]
pub struct Buffer {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub dtype: c_int,
    pub data: *mut c_void,
    pub rank: i64,
    /// `rank` dimensions, row-major (ffi_call's default layout).
    pub dims: *const i64,
}
pub const BUFFER_SIZE: usize = size_of::<Buffer>();

#[repr(C)]
pub struct ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
pub struct Scalar {
    pub dtype: c_int,
    pub value: *const c_void,
}

#[repr(C)]
pub struct Args {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *const c_int,
    pub args: *const *mut c_void,
}

#[repr(C)]
pub struct Rets {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *const c_int,
    pub rets: *const *mut c_void,
}

/// Attributes, sorted by name.
#[repr(C)]
pub struct Attrs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub size: i64,
    pub types: *const c_int,
    pub names: *const *const ByteSpan,
    pub attrs: *const *const c_void,
}
pub const ARGS_SIZE: usize = size_of::<Args>();
pub const RETS_SIZE: usize = size_of::<Rets>();
pub const ATTRS_SIZE: usize = size_of::<Attrs>();

#[repr(C)]
pub struct CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api: *const Api,
    pub ctx: *mut c_void,
    pub stage: c_int,
    pub args: Args,
    pub rets: Rets,
    pub attrs: Attrs,
    /// Out: asynchronous completion (unused: our work is stream-ordered).
    pub future: *mut c_void,
}
/// The header's size stops at `attrs` (`future` came later).
pub const CALL_FRAME_SIZE: usize = offset_of!(CallFrame, attrs) + size_of::<Attrs>();

#[repr(C)]
pub struct StreamGetArgs {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub ctx: *mut c_void,
    /// Out: the `CUstream` for the CUDA platform.
    pub stream: *mut c_void,
}
pub const STREAM_GET_ARGS_SIZE: usize = size_of::<StreamGetArgs>();

#[repr(C)]
pub struct Metadata {
    pub struct_size: usize,
    pub api_version: ApiVersion,
    pub traits: u32,
}
pub const METADATA_SIZE: usize = offset_of!(Metadata, traits) + size_of::<u32>();

#[repr(C)]
pub struct MetadataExtension {
    pub extension_base: ExtensionBase,
    pub metadata: *mut Metadata,
}
pub const METADATA_EXTENSION_SIZE: usize = size_of::<MetadataExtension>();

pub type ErrorCreateFn = unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut Error;
pub type ErrorGetMessageFn = unsafe extern "C" fn(*mut ErrorGetMessageArgs);
pub type ErrorDestroyFn = unsafe extern "C" fn(*mut ErrorDestroyArgs);
pub type StreamGetFn = unsafe extern "C" fn(*mut StreamGetArgs) -> *mut Error;

/// The head of `XLA_FFI_Api`, up to the last entry we call (`XLA_FFI_Stream_Get`); newer XLAs
/// append entries after it.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub api_version: ApiVersion,
    pub internal_api: *mut c_void,
    pub error_create: Option<ErrorCreateFn>,
    pub error_get_message: Option<ErrorGetMessageFn>,
    pub error_destroy: Option<ErrorDestroyFn>,
    pub handler_register: *const c_void,
    pub stream_get: Option<StreamGetFn>,
}
pub const API_SIZE: usize = size_of::<Api>();

/// `XLA_FFI_Handler`: what `jax.ffi.register_ffi_target(..., api_version=1)` takes.
pub type Handler = unsafe extern "C" fn(*mut CallFrame) -> *mut Error;

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte sizes `c_api.h` gives these structs on a 64-bit target (its
    /// `XLA_FFI_*_STRUCT_SIZE` constants), so a field slip fails here and not inside XLA.
    #[test]
    fn struct_sizes_match_the_header() {
        assert_eq!(EXTENSION_BASE_SIZE, 24);
        assert_eq!(API_VERSION_SIZE, 24);
        assert_eq!(ERROR_CREATE_ARGS_SIZE, 28);
        assert_eq!(BUFFER_SIZE, 48);
        assert_eq!(ARGS_SIZE, 40);
        assert_eq!(ATTRS_SIZE, 48);
        // 8 (size) + 8 (ext) + 8 (api) + 8 (ctx) + 4 (stage) + 4 (pad) + 40 + 40 + 48.
        assert_eq!(CALL_FRAME_SIZE, 168);
        assert_eq!(offset_of!(CallFrame, args), 40);
        assert_eq!(STREAM_GET_ARGS_SIZE, 32);
        assert_eq!(METADATA_SIZE, 36);
        assert_eq!(METADATA_EXTENSION_SIZE, 32);
        // struct_size, extension_start, api_version (24), internal_api, then 5 entries.
        assert_eq!(offset_of!(Api, error_create), 48);
        assert_eq!(offset_of!(Api, stream_get), 80);
        assert_eq!(API_SIZE, 88);
    }
}
