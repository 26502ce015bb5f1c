//! Per-process CUDA runtime: the driver, NVRTC, one context per device (the primary context,
//! shared with torch/cupy/jax), kernel modules cached in memory and CUBINs cached on disk.
//! Everything is initialised lazily on first use and never torn down.

pub mod cache;
pub mod counters;
pub mod driver;
pub mod kernel_source;
pub mod nvrtc;
pub mod scratch;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{unsupported, Error, Result};
pub use driver::{Kernel, Stream};
pub use scratch::StreamScratch;

/// One kernel variant: a family's source, the entry point, and the compile-time constants
/// the generated prelude defines before the source.
#[derive(Clone, Debug)]
pub struct KernelSpec {
    /// Family name, e.g. "flash_fwd"; also the file name shown in NVRTC diagnostics.
    pub family: &'static str,
    pub source: &'static str,
    pub entry: &'static str,
    pub defines: Vec<(&'static str, i64)>,
}

// Identity is family + entry + defines: hashing the source text on every call would cost
// microseconds, and a family names exactly one source.
impl PartialEq for KernelSpec {
    fn eq(&self, o: &Self) -> bool {
        self.family == o.family && self.entry == o.entry && self.defines == o.defines
    }
}
impl Eq for KernelSpec {}
impl std::hash::Hash for KernelSpec {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.family.hash(h);
        self.entry.hash(h);
        self.defines.hash(h);
    }
}

impl KernelSpec {
    /// The full translation unit: `#define`s, then the family source with its `common/*.cuh`
    /// headers inlined (`kernel_source::expand`). Errors only on an include of a header that is
    /// not embedded.
    pub fn translation_unit(&self) -> Result<String> {
        let file = format!("{}.cu", self.family);
        let body = kernel_source::expand(&file, self.source, kernel_source::HEADERS)?;
        let mut tu = String::with_capacity(body.len() + 64 * self.defines.len());
        for (k, v) in &self.defines {
            tu.push_str(&format!("#define {k} {v}\n"));
        }
        tu.push_str(&body);
        Ok(tu)
    }

    /// A readable, unique variant name: `family.entry[defines]`, e.g.
    /// `flash_fwd.flash_fwd_kernel[FS_HEAD_DIM=128,FS_DTYPE=1]` (one family's entries can share
    /// their defines, so the entry is part of the name).
    pub fn name(&self) -> String {
        let d: Vec<String> = self
            .defines
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("{}.{}[{}]", self.family, self.entry, d.join(","))
    }
}

/// The arch we compile for: the device's own, with the `a` suffix on Hopper so wgmma/setmaxnreg
/// are usable. Below sm_80 is unsupported (no bf16 mma, no cp.async).
pub fn arch_for(cc: (i32, i32)) -> Result<String> {
    match cc {
        (major, _) if major < 8 => Err(unsupported(format!(
            "compute capability {}.{} is below 8.0: flashscan needs an Ampere or newer GPU",
            cc.0, cc.1
        ))),
        (9, 0) => Ok("sm_90a".into()),
        (major, minor) => Ok(format!("sm_{major}{minor}")),
    }
}

pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--device-as-default-execution-space".into(),
        "-lineinfo".into(),
    ]
}

/// What names a variant's disk-cache entry for `arch` under NVRTC `version`: its translation
/// unit and options (what NVRTC compiles), the file label and the key. One function for the
/// runtime's loads (`DeviceCtx::kernel_with_origin`) and for `precompile_offline`, so an entry
/// written on a machine without a GPU is the one a GPU process looks up.
pub struct CacheEntry {
    pub tu: String,
    pub options: Vec<String>,
    pub label: String,
    pub key: String,
}

pub fn cache_entry(spec: &KernelSpec, arch: &str, version: (i32, i32)) -> Result<CacheEntry> {
    let tu = spec.translation_unit()?;
    let options = nvrtc_options(arch);
    let key = cache::key(&tu, &options, version, arch);
    let label = format!("{}-{}", spec.family, arch);
    Ok(CacheEntry {
        tu,
        options,
        label,
        key,
    })
}

/// Compiles `spec` for `arch` with NVRTC alone into `cache`, unless an intact entry is there
/// already; true when it compiled. No GPU needed: `python -m flashscan precompile --arch`
/// (a container image built on a machine without one). The entry is found at run time only
/// under the same NVRTC major.minor (part of the key); otherwise that process compiles again.
/// Unlike the runtime's (never fatal), a store that fails here is an error: it is the job.
pub fn precompile_offline(cache: &cache::DiskCache, spec: &KernelSpec, arch: &str) -> Result<bool> {
    let nv = nvrtc().map_err(Error::Unavailable)?;
    let e = cache_entry(spec, arch, nv.version)?;
    if cache.load(&e.label, &e.key).is_some() {
        return Ok(false);
    }
    let cubin = nv.compile_cubin(&format!("{}.cu", spec.family), &e.tu, &e.options)?;
    if !cache.store(&e.label, &e.key, &cubin) {
        return Err(Error::Value(format!(
            "cannot write the kernel cache in {}: set FLASHSCAN_CACHE_DIR to a writable directory",
            cache.dir.display()
        )));
    }
    Ok(true)
}

/// NVRTC on its own (no GPU needed): what `compile_variant` and the CPU tests use.
pub fn nvrtc() -> std::result::Result<&'static nvrtc::Nvrtc, String> {
    static NVRTC: OnceLock<std::result::Result<nvrtc::Nvrtc, String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| nvrtc::Nvrtc::find(&python_paths()))
        .as_ref()
        .map_err(|e| e.clone())
}

static PYTHON_PATHS: OnceLock<Vec<PathBuf>> = OnceLock::new();

/// The Python module calls this once at import with `sys.path`, so NVRTC wheels are found.
pub fn set_python_paths(paths: Vec<PathBuf>) {
    let _ = PYTHON_PATHS.set(paths);
}

fn python_paths() -> Vec<PathBuf> {
    PYTHON_PATHS.get().cloned().unwrap_or_default()
}

/// Compiles one variant to CUBIN for `arch` with NVRTC only (used by tests and precompile).
pub fn compile(spec: &KernelSpec, arch: &str) -> Result<Vec<u8>> {
    let nv = nvrtc().map_err(Error::Unavailable)?;
    nv.compile_cubin(
        &format!("{}.cu", spec.family),
        &spec.translation_unit()?,
        &nvrtc_options(arch),
    )
}

pub struct Runtime {
    pub driver_version: i32,
    pub nvrtc: &'static nvrtc::Nvrtc,
    pub devices: Vec<driver::DeviceProps>,
    pub cache: cache::DiskCache,
    contexts: Vec<OnceLock<std::result::Result<Arc<DeviceCtx>, Error>>>,
}

static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// The process-wide runtime, or why the CUDA backend is unusable here.
pub fn runtime() -> std::result::Result<&'static Runtime, String> {
    RUNTIME
        .get_or_init(Runtime::init)
        .as_ref()
        .map_err(|e| e.clone())
}

impl Runtime {
    fn init() -> std::result::Result<Runtime, String> {
        let driver_version = driver::init()?;
        let count = driver::device_count().map_err(|e| e.to_string())?;
        if count == 0 {
            return Err("the CUDA driver sees no GPU".into());
        }
        let devices = (0..count)
            .map(driver::device_props)
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        if devices.iter().all(|d| arch_for(d.cc).is_err()) {
            return Err(format!(
                "no GPU with compute capability >= 8.0 (found {})",
                devices
                    .iter()
                    .map(|d| format!("{} sm_{}{}", d.name, d.cc.0, d.cc.1))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let nvrtc = nvrtc()?;
        Ok(Runtime {
            driver_version,
            nvrtc,
            devices,
            cache: cache::DiskCache::new(cache::default_dir()),
            contexts: (0..count).map(|_| OnceLock::new()).collect(),
        })
    }

    /// The context for device `ordinal`, created on first use.
    pub fn device(&self, ordinal: i32) -> Result<&Arc<DeviceCtx>> {
        let slot = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.contexts.get(i))
            .ok_or_else(|| {
                Error::Value(format!(
                    "cuda:{ordinal} does not exist ({} devices)",
                    self.contexts.len()
                ))
            })?;
        slot.get_or_init(|| DeviceCtx::new(&self.devices[ordinal as usize]).map(Arc::new))
            .as_ref()
            .map_err(|e| e.clone())
    }
}

/// FNV-1a: the kernel map is looked up on every call with small keys (a family name, an entry
/// name and about ten integers); SipHash's DoS resistance buys nothing here and costs time.
#[derive(Default)]
pub struct Fnv64(u64);

impl std::hash::Hasher for Fnv64 {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type KernelMap = HashMap<KernelSpec, Arc<LoadedKernel>, std::hash::BuildHasherDefault<Fnv64>>;

/// Per-device state: its primary context, arch, kernel modules and a stream of our own.
pub struct DeviceCtx {
    pub props: driver::DeviceProps,
    pub arch: String,
    ctx: driver::Context,
    kernels: Mutex<KernelMap>,
    own_stream: OnceLock<std::result::Result<Stream, Error>>,
    scratch_pool: OnceLock<std::result::Result<Option<driver::ScratchPool>, Error>>,
    counters: counters::StreamCounters,
}

pub struct LoadedKernel {
    pub kernel: Kernel,
    smem_limit: Mutex<u32>,
}

/// How a call's work is ordered: on the caller's stream (no sync), or on our own stream
/// followed by a synchronisation (frameworks with no stream notion).
#[derive(Clone, Copy, Debug)]
pub enum StreamChoice {
    Caller(u64),
    OwnThenSync,
}

impl DeviceCtx {
    fn new(props: &driver::DeviceProps) -> Result<DeviceCtx> {
        let arch = arch_for(props.cc)?;
        let ctx = driver::Context::primary(props.ordinal)?;
        Ok(DeviceCtx {
            props: props.clone(),
            arch,
            ctx,
            kernels: Mutex::new(KernelMap::default()),
            own_stream: OnceLock::new(),
            scratch_pool: OnceLock::new(),
            counters: counters::StreamCounters::default(),
        })
    }

    /// Binds this device's context to the calling thread until the guard drops, then binds
    /// the caller's previous one again (`driver::Context::bind`): every op holds one for its
    /// whole call (kernel loads, stream-ordered allocations, launches), so the caller's current
    /// device is the same after a call on another device's tensors.
    pub fn bind(&self) -> Result<driver::CurrentGuard> {
        self.ctx.bind()
    }

    pub fn stream(&self, choice: StreamChoice) -> Result<Stream> {
        match choice {
            StreamChoice::Caller(h) => Ok(Stream::from_raw(h)),
            StreamChoice::OwnThenSync => self
                .own_stream
                .get_or_init(|| {
                    let _bound = self.ctx.bind()?;
                    Stream::create_non_blocking()
                })
                .clone(),
        }
    }

    /// The scratch buffers of one call on `stream` (a stream of this device), from this
    /// device's scratch pool (made on first use; see `driver::ScratchPool::create`).
    pub fn scratch(&self, stream: Stream) -> Result<StreamScratch> {
        // Not made under stream capture: torch's (global-mode) capture refuses cuMemPoolCreate
        // (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), and captured allocations come from the
        // default pool anyway (`driver::alloc_async`). A process whose first scratch use is
        // captured (a warm-up on a path without scratch, then the planned call) makes it later.
        if self.scratch_pool.get().is_none() && driver::is_capturing(stream).unwrap_or(true) {
            return Ok(StreamScratch::new(stream, None));
        }
        let pool = self
            .scratch_pool
            .get_or_init(|| driver::ScratchPool::create(self.props.ordinal))
            .clone()?;
        Ok(StreamScratch::new(stream, pool))
    }

    /// A zeroed pair of i32 work counters for a persistent kernel launched next on `stream`
    /// that leaves them zeroed (`counters::StreamCounters`); None where the call must zero
    /// scratch of its own instead (under capture, the per-thread default stream).
    pub fn stream_counters(&self, stream: Stream) -> Result<Option<u64>> {
        self.counters.get(stream)
    }

    /// Ends a call: synchronises our own stream when the caller has none to order on.
    pub fn finish(&self, choice: StreamChoice) -> Result<()> {
        match choice {
            StreamChoice::Caller(_) => Ok(()),
            StreamChoice::OwnThenSync => self.stream(choice)?.synchronize(),
        }
    }

    /// The kernel for `spec`, from memory, else the disk cache, else NVRTC.
    /// Returns whether it had to be compiled (for `precompile`).
    pub fn kernel(&self, spec: &KernelSpec) -> Result<Arc<LoadedKernel>> {
        self.kernel_with_origin(spec).map(|(k, _)| k)
    }

    pub fn kernel_with_origin(&self, spec: &KernelSpec) -> Result<(Arc<LoadedKernel>, bool)> {
        if let Some(k) = self.lock_kernels()?.get(spec) {
            return Ok((k.clone(), false));
        }
        let rt = runtime().map_err(Error::Unavailable)?;
        let _bound = self.bind()?;
        let CacheEntry {
            tu,
            options,
            label,
            key,
        } = cache_entry(spec, &self.arch, rt.nvrtc.version)?;
        let mut compiled = false;
        let kernel = match rt
            .cache
            .load(&label, &key)
            .and_then(|c| Kernel::load(&c, spec.entry).ok())
        {
            Some(k) => k,
            None => {
                let cubin =
                    rt.nvrtc
                        .compile_cubin(&format!("{}.cu", spec.family), &tu, &options)?;
                compiled = true;
                rt.cache.store(&label, &key, &cubin);
                Kernel::load(&cubin, spec.entry)?
            }
        };
        let loaded = Arc::new(LoadedKernel {
            kernel,
            smem_limit: Mutex::new(48 * 1024),
        });
        // Another thread may have raced us here; either copy is fine, keep the first.
        let mut map = self.lock_kernels()?;
        let entry = map.entry(spec.clone()).or_insert(loaded);
        Ok((entry.clone(), compiled))
    }

    fn lock_kernels(&self) -> Result<std::sync::MutexGuard<'_, KernelMap>> {
        self.kernels
            .lock()
            .map_err(|_| Error::Internal("kernel cache lock poisoned".into()))
    }

    /// Launches one kernel with one by-value params struct.
    ///
    /// # Safety
    /// As `Kernel::launch`: `P` matches the kernel's parameter and its pointers are valid.
    pub unsafe fn launch<P: Copy>(
        &self,
        k: &LoadedKernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        stream: Stream,
        params: &P,
    ) -> Result<()> {
        let _bound = self.bind()?;
        if smem > 48 * 1024 {
            if smem > self.props.max_smem_optin as u32 {
                return Err(unsupported(format!(
                    "kernel needs {smem} bytes of shared memory, {} allows {}",
                    self.props.name, self.props.max_smem_optin
                )));
            }
            let mut limit = k
                .smem_limit
                .lock()
                .map_err(|_| Error::Internal("smem lock poisoned".into()))?;
            if smem > *limit {
                k.kernel.set_max_dynamic_smem(smem)?;
                *limit = smem;
            }
        }
        k.kernel.launch(grid, block, smem, stream, params)
    }
}
