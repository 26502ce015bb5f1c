//! `cargo bench`: the CPU-side costs every call pays (DLPack parsing, argument checks, variant
//! lookup), the cold and warm costs of getting a kernel (NVRTC compile vs disk-cache load), and,
//! when a GPU is usable, launch overhead and kernel time at the real-time attention shape.
//! Without a GPU the GPU group prints why and is skipped; without NVRTC the compile group too.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};

use flashscan::dlpack::{view_of, DLDataType, DLDevice, DLTensor};
use flashscan::ops::attention::{self, FlashFwdArgs};
use flashscan::runtime::{self, cache, StreamChoice};
use flashscan::tensor::{DType, DeviceKind, TensorView};

fn view(shape: &[i64], dtype: DType) -> TensorView {
    TensorView {
        ptr: 0x7000_0000,
        shape: shape.to_vec(),
        strides: flashscan::dlpack::compact_strides(shape),
        dtype,
        device: DeviceKind::Cuda,
        device_id: 0,
        readonly: false,
    }
}

/// Lets NVRTC be found in the pip wheels of the python3 on PATH, as the Python module does.
fn python_paths() {
    if let Ok(out) = std::process::Command::new("python3")
        .args(["-c", "import sys; print('\\n'.join(sys.path))"])
        .output()
    {
        let paths = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect();
        runtime::set_python_paths(paths);
    }
}

fn cpu_side(c: &mut Criterion) {
    let mut g = c.benchmark_group("per_call_cpu");
    let mut shape = [32i64, 60, 8, 64];
    let mut strides = [30720i64, 512, 64, 1];
    let t = DLTensor {
        data: 0x7000_0000 as *mut _,
        device: DLDevice {
            device_type: 2,
            device_id: 0,
        },
        ndim: 4,
        dtype: DLDataType {
            code: 4,
            bits: 16,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    };
    // SAFETY: t points at live shape/strides arrays of ndim entries.
    g.bench_function("dlpack_parse_dltensor", |b| {
        b.iter(|| unsafe { view_of(black_box(&t), false, "q") })
    });
    let q = view(&[32, 60, 8, 64], DType::BF16);
    let mut o = q.clone();
    o.ptr += 1 << 30;
    let lse = view(&[32, 8, 60], DType::F32);
    let args = FlashFwdArgs {
        q: &q,
        k: &q,
        v: &q,
        out: &o,
        lse: Some(&lse),
        softmax_scale: 0.125,
        window_left: -1,
        window_right: 0,
        softcap: 0.0,
    };
    g.bench_function("attention_checks", |b| {
        b.iter(|| attention::check(black_box(&args)))
    });
    g.bench_function("attention_variant_spec", |b| {
        b.iter(|| attention::spec(black_box(64), DType::BF16, true, false, 90, 60, false))
    });
    g.finish();
}

fn kernel_cold_warm(c: &mut Criterion) {
    python_paths();
    let nv = match runtime::nvrtc() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("skipping compile benches: {e}");
            return;
        }
    };
    let (spec, _, _) =
        attention::spec(64, DType::BF16, true, false, 90, 4096, false).expect("spec");
    let tu = spec.translation_unit().expect("translation unit");
    let opts = runtime::nvrtc_options("sm_90a");
    let dir = std::env::temp_dir().join(format!("flashscan-bench-{}", std::process::id()));
    let disk = cache::DiskCache::new(dir.clone());
    let key = cache::key(&tu, &opts, nv.version, "sm_90a");
    let mut g = c.benchmark_group("kernel_cold_warm");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("nvrtc_compile_flash_fwd_hd64_sm90a", |b| {
        b.iter(|| {
            let cubin = nv
                .compile_cubin("flash_fwd.cu", &tu, &opts)
                .expect("compile");
            disk.store("bench", &key, &cubin);
        })
    });
    g.finish();
    let mut g = c.benchmark_group("kernel_cold_warm");
    g.bench_function("cache_key_sha256", |b| {
        b.iter(|| cache::key(black_box(&tu), &opts, nv.version, "sm_90a"))
    });
    g.bench_function("disk_cache_load", |b| {
        b.iter(|| disk.load("bench", &key).expect("cached"))
    });
    g.finish();
    let _ = std::fs::remove_dir_all(dir);
}

fn gpu(c: &mut Criterion) {
    let rt = match runtime::runtime() {
        Ok(rt) => rt,
        Err(reason) => {
            eprintln!("skipping GPU benches: {reason}");
            return;
        }
    };
    let dev = rt.device(0).expect("device 0");
    // The bench thread keeps device 0 current for its allocations (the guard lives to the end).
    let _bound = dev.bind().expect("context");
    let mut g = c.benchmark_group("gpu_realtime_attention");
    for batch in [1i64, 32] {
        let shape = [batch, 60, 8, 64];
        let bytes = (shape.iter().product::<i64>() * 2) as usize;
        let mut bufs = Vec::new();
        for _ in 0..4 {
            bufs.push(runtime::driver::alloc(bytes).expect("alloc"));
        }
        let lse_buf = runtime::driver::alloc((batch * 8 * 60 * 4) as usize).expect("alloc");
        let mk = |ptr: u64| {
            let mut t = view(&shape, DType::BF16);
            t.ptr = ptr;
            t
        };
        let (q, k, v, o) = (mk(bufs[0]), mk(bufs[1]), mk(bufs[2]), mk(bufs[3]));
        let mut lse = view(&[batch, 8, 60], DType::F32);
        lse.ptr = lse_buf;
        let args = FlashFwdArgs {
            q: &q,
            k: &k,
            v: &v,
            out: &o,
            lse: Some(&lse),
            softmax_scale: 0.125,
            window_left: -1,
            window_right: 0,
            softcap: 0.0,
        };
        let own = StreamChoice::OwnThenSync;
        attention::forward(&args, own).expect("warm-up launch");
        // Launch + synchronise: what a caller waiting for the result sees from Rust.
        g.bench_function(format!("launch_and_sync_b{batch}_s60_h8_d64"), |b| {
            b.iter(|| attention::forward(&args, own).expect("launch"))
        });
        // Launch only (queued on our stream): the CPU cost per call.
        let s = dev.stream(own).expect("stream");
        let caller = StreamChoice::Caller(s.0 as usize as u64);
        g.bench_function(format!("launch_only_b{batch}_s60_h8_d64"), |b| {
            b.iter(|| attention::forward(&args, caller).expect("launch"))
        });
        s.synchronize().expect("sync");
        for p in bufs.into_iter().chain([lse_buf]) {
            // SAFETY: allocated above, freed once, after the stream drained.
            unsafe { runtime::driver::free(p).expect("free") };
        }
    }
    g.finish();
}

criterion_group!(benches, cpu_side, kernel_cold_warm, gpu);
criterion_main!(benches);
