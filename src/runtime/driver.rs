//! The CUDA driver, through cudarc's dynamically loaded bindings. This is the only module
//! that touches raw driver handles; everything above it uses the safe types here.

use std::ffi::{c_void, CString};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use crate::error::{Error, Result};

fn cuda_err(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| {
        let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
        let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
        Error::Cuda {
            call,
            detail: format!(
                "{} ({})",
                name.unwrap_or_else(|_| format!("{:?}", e.0)),
                text.unwrap_or_default()
            ),
        }
    }
}

/// Loads libcuda and initialises it; returns the driver version (e.g. 13000).
/// cudarc panics when the library or a symbol is missing, so that is caught here and turned
/// into the reason `available()` reports.
pub fn init() -> std::result::Result<i32, String> {
    let attempt = std::panic::catch_unwind(|| {
        // SAFETY: probing for the library only dlopens it.
        if !unsafe { sys::is_culib_present() } {
            return Err("the CUDA driver library (libcuda.so.1) was not found: no NVIDIA driver is installed or visible".to_string());
        }
        result::init().map_err(|e| format!("cuInit failed: {}", describe(&e)))?;
        let mut v = 0;
        // SAFETY: out-pointer to a local.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(|e| format!("cuDriverGetVersion failed: {}", describe(&e)))?;
        Ok(v)
    });
    attempt
        .unwrap_or_else(|_| Err("loading the CUDA driver library failed (missing symbol)".into()))
}

fn describe(e: &DriverError) -> String {
    e.error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0))
}

pub fn device_count() -> Result<i32> {
    result::device::get_count().map_err(cuda_err("cuDeviceGetCount"))
}

/// What we read off a device once.
#[derive(Clone, Debug)]
pub struct DeviceProps {
    pub ordinal: i32,
    pub name: String,
    pub cc: (i32, i32),
    pub sm_count: i32,
    pub max_smem_optin: i32,
}

pub fn device_props(ordinal: i32) -> Result<DeviceProps> {
    let dev = result::device::get(ordinal).map_err(cuda_err("cuDeviceGet"))?;
    let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
        // SAFETY: dev is a valid device handle from cuDeviceGet.
        unsafe { result::device::get_attribute(dev, a) }.map_err(cuda_err("cuDeviceGetAttribute"))
    };
    use sys::CUdevice_attribute::*;
    Ok(DeviceProps {
        ordinal,
        name: result::device::get_name(dev).map_err(cuda_err("cuDeviceGetName"))?,
        cc: (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        sm_count: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        max_smem_optin: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
    })
}

/// The device's primary context: the one torch, cupy and jax use, so their pointers are valid
/// in it. Retained once per process and never released (it lives as long as the process).
pub struct Context {
    raw: sys::CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread (cuCtxSetCurrent binds it per thread).
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    pub fn primary(ordinal: i32) -> Result<Context> {
        let dev = result::device::get(ordinal).map_err(cuda_err("cuDeviceGet"))?;
        // SAFETY: dev is valid; the retained context is never released (process lifetime).
        let raw = unsafe { result::primary_ctx::retain(dev) }
            .map_err(cuda_err("cuDevicePrimaryCtxRetain"))?;
        Ok(Context { raw })
    }

    /// Binds this context to the calling thread until the guard drops; the context that was
    /// current before (another device's, or none) is bound again then. torch, cupy and jax read
    /// their current device from the thread's current context (the runtime API picks up a
    /// context set through the driver API), so a call on cuda:1 tensors must not leave cuda:1
    /// current for a caller whose current device is cuda:0. Binding the context that is
    /// already current costs one cuCtxGetCurrent and restores nothing.
    pub fn bind(&self) -> Result<CurrentGuard> {
        let mut cur: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let rc = unsafe { sys::cuCtxGetCurrent(&mut cur) };
        if rc == sys::CUresult::CUDA_SUCCESS && cur == self.raw {
            return Ok(CurrentGuard { previous: None });
        }
        // SAFETY: raw is a retained primary context.
        unsafe { result::ctx::set_current(self.raw) }.map_err(cuda_err("cuCtxSetCurrent"))?;
        let previous = if rc == sys::CUresult::CUDA_SUCCESS {
            cur
        } else {
            std::ptr::null_mut()
        };
        Ok(CurrentGuard {
            previous: Some(previous),
        })
    }
}

/// Restores the thread's previous current context when dropped (see `Context::bind`).
/// Not Send: it belongs to the thread whose binding it changed.
pub struct CurrentGuard {
    /// None: nothing was changed. Some(ctx): ctx (possibly null, i.e. none) was current.
    previous: Option<sys::CUcontext>,
}

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.previous {
            // SAFETY: prev was the thread's current context (a live context, or null for none)
            // when the guard was made; errors here have nowhere to go and leave ours bound.
            unsafe {
                let _ = sys::cuCtxSetCurrent(prev);
            }
        }
    }
}

/// A loaded CUBIN and one kernel entry in it. The module stays loaded for the process.
pub struct Kernel {
    module: sys::CUmodule,
    func: sys::CUfunction,
}

// SAFETY: module and function handles are context-wide, usable from any thread that has the
// context current (every launch path binds it first with `Context::bind`).
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

impl Kernel {
    /// Loads a CUBIN (context must be current) and looks up `entry`.
    pub fn load(cubin: &[u8], entry: &str) -> Result<Kernel> {
        // The driver reads the image through a pointer; give it an 8-byte aligned copy.
        let mut image: Vec<u64> = vec![0; cubin.len().div_ceil(8)];
        // SAFETY: image has at least cubin.len() bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                cubin.as_ptr(),
                image.as_mut_ptr().cast::<u8>(),
                cubin.len(),
            )
        };
        // SAFETY: image is a complete CUBIN (checked by the driver) alive during the call.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map_err(cuda_err("cuModuleLoadData"))?;
        let name = CString::new(entry).map_err(|_| Error::Internal("entry name has NUL".into()))?;
        // SAFETY: module was just loaded; name is a valid C string.
        let func = match unsafe { result::module::get_function(module, name) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: unloading the module we just loaded and own.
                unsafe {
                    let _ = result::module::unload(module);
                }
                return Err(cuda_err("cuModuleGetFunction")(e));
            }
        };
        Ok(Kernel { module, func })
    }

    /// Allows `bytes` of dynamic shared memory (needed above 48 KB).
    pub fn set_max_dynamic_smem(&self, bytes: u32) -> Result<()> {
        // SAFETY: func is a valid function handle.
        unsafe {
            result::function::set_function_attribute(
                self.func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(cuda_err("cuFuncSetAttribute"))
    }

    /// Launches with ONE by-value parameter (every flashscan kernel takes one params struct).
    ///
    /// # Safety
    /// `P` must be `#[repr(C)]` with exactly the layout of the kernel's parameter, every
    /// pointer in it must be valid for what the kernel reads and writes, and the stream must
    /// belong to the current context.
    pub unsafe fn launch<P: Copy>(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        stream: Stream,
        params: &P,
    ) -> Result<()> {
        let mut args: [*mut c_void; 1] = [params as *const P as *mut c_void];
        result::launch_kernel(self.func, grid, block, smem, stream.0, &mut args)
            .map_err(cuda_err("cuLaunchKernel"))
    }

    pub fn module_handle(&self) -> usize {
        self.module as usize
    }
}

/// A raw stream handle: the caller's (torch/cupy current stream) or one of ours.
#[derive(Clone, Copy, Debug)]
pub struct Stream(pub sys::CUstream);

// SAFETY: a stream handle is an opaque token usable from any thread of its context.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    pub fn from_raw(handle: u64) -> Stream {
        Stream(handle as usize as sys::CUstream)
    }

    /// A new non-blocking stream in the current context (never synchronises with stream 0).
    pub fn create_non_blocking() -> Result<Stream> {
        result::stream::create(result::stream::StreamKind::NonBlocking)
            .map(Stream)
            .map_err(cuda_err("cuStreamCreate"))
    }

    pub fn synchronize(self) -> Result<()> {
        // SAFETY: the handle came from the caller or from create_non_blocking.
        unsafe { result::stream::synchronize(self.0) }.map_err(cuda_err("cuStreamSynchronize"))
    }
}

/// Bytes our scratch pool keeps reserved across synchronisations (see `ScratchPool::create`).
const SCRATCH_KEEP_BYTES: u64 = 256 << 20;

/// A stream-ordered memory pool of our own on one device (never destroyed: process lifetime;
/// `DeviceCtx` holds one per device, see `ScratchPool::create`).
#[derive(Clone, Copy, Debug)]
pub struct ScratchPool(sys::CUmemoryPool);

// SAFETY: a CUmemoryPool handle may be used from any thread.
unsafe impl Send for ScratchPool {}
unsafe impl Sync for ScratchPool {}

impl ScratchPool {
    /// The scratch pool of device `ordinal`; None where the device has no memory pools (then
    /// the default pool serves). Why not the default pool: its release threshold is 0, so
    /// every host synchronisation (a `.item()`, a pageable copy, the end of a generate step)
    /// hands its memory back to the OS and the next cuMemAllocAsync maps fresh pages, ~140 us
    /// on the H100 — paid by the first op of every real-time frame. Our pool keeps up to
    /// SCRATCH_KEEP_BYTES; setting the default pool's threshold instead would change it for
    /// every library in the process.
    pub fn create(ordinal: i32) -> Result<Option<ScratchPool>> {
        let dev = result::device::get(ordinal).map_err(cuda_err("cuDeviceGet"))?;
        let supported = {
            // SAFETY: dev is a valid device handle.
            unsafe {
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                )
            }
            .map_err(cuda_err("cuDeviceGetAttribute"))?
        };
        if supported == 0 {
            return Ok(None);
        }
        // SAFETY: an all-zero CUmemPoolProps is the documented default (no handle types, no
        // max size); the fields that matter are set below.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev;
        let mut raw: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; props is fully initialised.
        unsafe { sys::cuMemPoolCreate(&mut raw, &props) }
            .result()
            .map_err(cuda_err("cuMemPoolCreate"))?;
        let mut keep: u64 = SCRATCH_KEEP_BYTES;
        // SAFETY: raw is the pool just created; the attribute takes a pointer to a u64.
        unsafe {
            sys::cuMemPoolSetAttribute(
                raw,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        }
        .result()
        .map_err(cuda_err("cuMemPoolSetAttribute"))?;
        Ok(Some(ScratchPool(raw)))
    }
}

/// Stream-ordered allocation (graph-capturable) from `pool` (the stream's device's scratch
/// pool; None: the default pool): usable by work queued on `stream` after this. The current
/// context must be the stream's device's. Under stream capture the default pool serves (the
/// graph owns what it allocates; no release threshold is involved there).
pub fn alloc_async(bytes: usize, stream: Stream, pool: Option<ScratchPool>) -> Result<u64> {
    // a failed query (the legacy stream while another thread captures) keeps the default pool
    let pool = if is_capturing(stream).unwrap_or(true) {
        None
    } else {
        pool
    };
    let Some(pool) = pool else {
        // SAFETY: returns a fresh allocation ordered on a stream of the current context.
        return unsafe { result::malloc_async(stream.0, bytes.max(1)) }
            .map_err(cuda_err("cuMemAllocAsync"));
    };
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: out-pointer to a local; pool belongs to the current context's device.
    unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes.max(1), pool.0, stream.0) }
        .result()
        .map_err(cuda_err("cuMemAllocFromPoolAsync"))?;
    Ok(ptr)
}

/// Whether `stream` is being captured into a CUDA graph.
pub fn is_capturing(stream: Stream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: out-pointer to a local; the handle came from the caller (0: the legacy stream).
    unsafe { sys::cuStreamIsCapturing(stream.0, &mut status) }
        .result()
        .map_err(cuda_err("cuStreamIsCapturing"))?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Stream-ordered free: the memory is released once the work queued before it on `stream` ends.
///
/// # Safety
/// `ptr` must come from `alloc_async` and not be freed twice; only work on `stream` (or ordered
/// before this point) may use it.
pub unsafe fn free_async(ptr: u64, stream: Stream) -> Result<()> {
    result::free_async(ptr, stream.0).map_err(cuda_err("cuMemFreeAsync"))
}

/// Stream-ordered zeroing of `bytes` bytes at `ptr`.
///
/// # Safety
/// `ptr` must be a device allocation of at least `bytes` bytes, valid until the memset has run
/// on `stream`.
pub unsafe fn zero_async(ptr: u64, bytes: usize, stream: Stream) -> Result<()> {
    result::memset_d8_async(ptr, 0, bytes, stream.0).map_err(cuda_err("cuMemsetD8Async"))
}

/// Plain device allocation (context must be current).
pub fn alloc(bytes: usize) -> Result<u64> {
    // SAFETY: returns a fresh device allocation or an error.
    unsafe { result::malloc_sync(bytes.max(1)) }.map_err(cuda_err("cuMemAlloc"))
}

/// Frees an allocation made by `alloc` (context must be current).
///
/// # Safety
/// `ptr` must come from `alloc` and not be freed twice, and no queued work may still use it.
pub unsafe fn free(ptr: u64) -> Result<()> {
    result::free_sync(ptr).map_err(cuda_err("cuMemFree"))
}

/// The ordinal of the device a device pointer lives on (for callers that hand us bare pointers
/// with no device, as XLA's FFI buffers).
pub fn pointer_device(ptr: u64) -> Result<i32> {
    let mut ordinal: i32 = -1;
    // SAFETY: out-pointer to a local i32, the size CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL writes.
    unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast::<c_void>(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr as sys::CUdeviceptr,
        )
    }
    .result()
    .map_err(cuda_err("cuPointerGetAttribute"))?;
    Ok(ordinal)
}

/// Stream-ordered device-to-device copy of `bytes` bytes.
///
/// # Safety
/// `dst` and `src` must be device allocations of at least `bytes` bytes, valid until the copy
/// has run on `stream`.
pub unsafe fn copy_async(dst: u64, src: u64, bytes: usize, stream: Stream) -> Result<()> {
    result::memcpy_dtod_async(dst, src, bytes, stream.0).map_err(cuda_err("cuMemcpyDtoDAsync"))
}

/// A rank-4 tiled TMA tensor map of 16-bit elements (`bf16` selects bfloat16, else float16) with
/// the 128-byte swizzle, zero fill out of bounds: `dims` innermost first (elements), `strides`
/// of dims 1..3 in bytes, `box_dims` in elements. Returns the encoded 128 bytes; the driver
/// checks alignment and ranges and answers CUDA_ERROR_INVALID_VALUE when one is off.
pub fn encode_tensor_map_4d(
    ptr: u64,
    bf16: bool,
    dims: [u64; 4],
    strides: [u64; 3],
    box_dims: [u32; 4],
) -> Result<[u64; 16]> {
    let elem = if bf16 { MapElem::BF16 } else { MapElem::F16 };
    encode_tensor_map_4d_of(ptr, elem, dims, strides, box_dims)
}

/// The element type of a tensor map (TMA only moves bytes: the type sets the element size
/// and the out-of-bounds fill).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapElem {
    F16,
    BF16,
    /// one byte (the FP8 forward's e4m3 operands)
    U8,
    /// four bytes (the SSD chunk outputs' fp32 C B^T blocks)
    F32,
}

/// `encode_tensor_map_4d` for any `MapElem`.
pub fn encode_tensor_map_4d_of(
    ptr: u64,
    elem: MapElem,
    dims: [u64; 4],
    strides: [u64; 3],
    box_dims: [u32; 4],
) -> Result<[u64; 16]> {
    use sys::{
        CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
        CUtensorMapL2promotion, CUtensorMapSwizzle,
    };
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    let elem_strides = [1u32; 4];
    let dtype = match elem {
        MapElem::BF16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        MapElem::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        MapElem::U8 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        MapElem::F32 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    };
    // SAFETY: every array outlives the call and has the rank's length (strides rank - 1); the
    // driver only reads them and writes the map. A missing symbol (a driver older than 12.0)
    // panics inside cudarc's loader and is caught here.
    let out = map.as_mut_ptr();
    let rc = std::panic::catch_unwind(|| unsafe {
        sys::cuTensorMapEncodeTiled(
            out,
            dtype,
            4,
            ptr as usize as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            box_dims.as_ptr(),
            elem_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    })
    .map_err(|_| Error::Cuda {
        call: "cuTensorMapEncodeTiled",
        detail: "the driver has no cuTensorMapEncodeTiled".into(),
    })?;
    rc.result().map_err(cuda_err("cuTensorMapEncodeTiled"))?;
    // SAFETY: the driver wrote the map (success above); zeroed before in any case.
    let map = unsafe { map.assume_init() };
    Ok(map.opaque)
}
