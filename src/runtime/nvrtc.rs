//! NVRTC, loaded at run time from wherever the user has it, and the one call we need:
//! CUDA C++ source -> CUBIN for one arch.
//!
//! We bind the handful of NVRTC entry points ourselves over `libloading` rather than through
//! cudarc's NVRTC module: cudarc looks NVRTC up by fixed library names and panics when none
//! loads, while we must search pip wheels and toolkits by path and report "not found" calmly.

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, Symbol, RTLD_GLOBAL, RTLD_NOW};

use crate::error::{Error, Result};

type Program = *mut c_void;
type CreateProgram = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileProgram = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type DestroyProgram = unsafe extern "C" fn(*mut Program) -> c_int;
type GetSize = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type GetBytes = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// A loaded NVRTC library with its entry points resolved once.
pub struct Nvrtc {
    pub path: PathBuf,
    pub version: (i32, i32),
    create: Symbol<CreateProgram>,
    compile: Symbol<CompileProgram>,
    destroy: Symbol<DestroyProgram>,
    log_size: Symbol<GetSize>,
    log: Symbol<GetBytes>,
    cubin_size: Symbol<GetSize>,
    cubin: Symbol<GetBytes>,
    error_string: Symbol<ErrorString>,
    // Keeps the library mapped for as long as the symbols above live.
    _lib: Library,
}

// SAFETY: NVRTC's API is thread-safe (each call works on its own program object) and the
// symbols are plain function pointers into a library that stays loaded.
unsafe impl Send for Nvrtc {}
unsafe impl Sync for Nvrtc {}

/// Library file names NVRTC ships under, newest first.
const SONAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Where to look, in order: `FLASHSCAN_NVRTC` (a file or a folder), the `nvidia-cuda-nvrtc`
/// wheels under each Python path entry, `CUDA_HOME`/`CUDA_PATH`, /usr/local/cuda, then the
/// system loader path (bare names).
pub fn candidates(python_paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let push_dir = |out: &mut Vec<PathBuf>, dir: &Path| {
        for name in SONAMES {
            out.push(dir.join(name));
        }
    };
    if let Some(p) = std::env::var_os("FLASHSCAN_NVRTC") {
        let p = PathBuf::from(p);
        if p.is_dir() {
            push_dir(&mut out, &p);
        } else {
            out.push(p);
        }
    }
    for sp in python_paths {
        for sub in [
            "nvidia/cu13/lib",
            "nvidia/cuda_nvrtc/lib",
            "nvidia/cu12/lib",
        ] {
            push_dir(&mut out, &sp.join(sub));
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            push_dir(&mut out, &Path::new(&root).join("lib64"));
            push_dir(&mut out, &Path::new(&root).join("lib"));
        }
    }
    push_dir(&mut out, Path::new("/usr/local/cuda/lib64"));
    for name in SONAMES {
        out.push(PathBuf::from(name));
    }
    out
}

impl Nvrtc {
    /// Loads the first candidate that opens and has the entry points; the error lists
    /// everything tried.
    pub fn find(python_paths: &[PathBuf]) -> std::result::Result<Nvrtc, String> {
        let mut tried = Vec::new();
        for cand in candidates(python_paths) {
            let bare = cand.components().count() == 1;
            if !bare && !cand.exists() {
                continue;
            }
            match Nvrtc::open(&cand) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(format!("{} ({e})", cand.display())),
            }
        }
        Err(format!(
            "NVRTC not found: install it with `pip install nvidia-cuda-nvrtc`, or point \
             FLASHSCAN_NVRTC at libnvrtc.so. Tried: {}",
            if tried.is_empty() {
                "no candidate existed".to_string()
            } else {
                tried.join("; ")
            }
        ))
    }

    pub fn open(path: &Path) -> std::result::Result<Nvrtc, String> {
        // SAFETY: loading NVRTC runs only its (trivial) initialisers; symbols are checked below.
        let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
            .map_err(|e| e.to_string())?;
        // SAFETY: each symbol is looked up with the signature of the NVRTC C API.
        unsafe {
            let version: Symbol<Version> = lib.get(b"nvrtcVersion\0").map_err(|e| e.to_string())?;
            let (mut major, mut minor) = (0, 0);
            if version(&mut major, &mut minor) != 0 {
                return Err("nvrtcVersion failed".into());
            }
            let n = Nvrtc {
                path: resolved_path(path, &lib),
                version: (major, minor),
                create: lib
                    .get(b"nvrtcCreateProgram\0")
                    .map_err(|e| e.to_string())?,
                compile: lib
                    .get(b"nvrtcCompileProgram\0")
                    .map_err(|e| e.to_string())?,
                destroy: lib
                    .get(b"nvrtcDestroyProgram\0")
                    .map_err(|e| e.to_string())?,
                log_size: lib
                    .get(b"nvrtcGetProgramLogSize\0")
                    .map_err(|e| e.to_string())?,
                log: lib
                    .get(b"nvrtcGetProgramLog\0")
                    .map_err(|e| e.to_string())?,
                cubin_size: lib.get(b"nvrtcGetCUBINSize\0").map_err(|e| e.to_string())?,
                cubin: lib.get(b"nvrtcGetCUBIN\0").map_err(|e| e.to_string())?,
                error_string: lib
                    .get(b"nvrtcGetErrorString\0")
                    .map_err(|e| e.to_string())?,
                _lib: lib,
            };
            Ok(n)
        }
    }

    fn err_name(&self, code: c_int) -> String {
        // SAFETY: nvrtcGetErrorString returns a static C string for any code.
        unsafe {
            let p = (self.error_string)(code);
            if p.is_null() {
                format!("NVRTC error {code}")
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    /// Compiles `source` to a CUBIN with the given options (which must name the arch).
    pub fn compile_cubin(&self, name: &str, source: &str, options: &[String]) -> Result<Vec<u8>> {
        let internal = |what: &str| Error::Internal(format!("{what} contains a NUL byte"));
        let src = CString::new(source).map_err(|_| internal("kernel source"))?;
        let cname = CString::new(name).map_err(|_| internal("kernel name"))?;
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).map_err(|_| internal("an NVRTC option")))
            .collect::<Result<_>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: all pointers are valid C strings for the duration of the calls; the program
        // is destroyed on every path below.
        unsafe {
            let rc = (self.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if rc != 0 {
                return Err(Error::Compile {
                    what: name.into(),
                    log: format!("nvrtcCreateProgram: {}", self.err_name(rc)),
                });
            }
            let rc = (self.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
            let log = self.program_log(prog);
            let result = if rc != 0 {
                Err(Error::Compile {
                    what: name.into(),
                    log: format!("{}\n{log}", self.err_name(rc)),
                })
            } else {
                self.program_cubin(prog).map_err(|e| Error::Compile {
                    what: name.into(),
                    log: e,
                })
            };
            (self.destroy)(&mut prog);
            result
        }
    }

    unsafe fn program_log(&self, prog: Program) -> String {
        let mut size = 0usize;
        if (self.log_size)(prog, &mut size) != 0 || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        if (self.log)(prog, buf.as_mut_ptr().cast()) != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_string()
    }

    unsafe fn program_cubin(&self, prog: Program) -> std::result::Result<Vec<u8>, String> {
        let mut size = 0usize;
        let rc = (self.cubin_size)(prog, &mut size);
        if rc != 0 || size == 0 {
            return Err(format!(
                "nvrtcGetCUBINSize: {} (was a real sm_XX arch given?)",
                self.err_name(rc)
            ));
        }
        let mut buf = vec![0u8; size];
        let rc = (self.cubin)(prog, buf.as_mut_ptr().cast());
        if rc != 0 {
            return Err(format!("nvrtcGetCUBIN: {}", self.err_name(rc)));
        }
        Ok(buf)
    }
}

/// The file the loader actually mapped (so `info()` shows a real path even for bare names).
fn resolved_path(asked: &Path, _lib: &Library) -> PathBuf {
    if asked.components().count() > 1 {
        return asked.to_path_buf();
    }
    // Bare soname: find it in /proc/self/maps.
    let name = asked.to_string_lossy();
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for line in maps.lines() {
            if let Some(path) = line.split_whitespace().nth(5) {
                if path.contains("libnvrtc.so")
                    && path.contains(
                        name.trim_start_matches("lib")
                            .split(".so")
                            .next()
                            .unwrap_or("nvrtc"),
                    )
                {
                    return PathBuf::from(path);
                }
            }
        }
    }
    asked.to_path_buf()
}
