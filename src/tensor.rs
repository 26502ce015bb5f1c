//! `TensorView`: what a kernel launcher needs to know of a caller's tensor (pointer, shape,
//! strides in elements, dtype, device), whichever framework it came from, and the checks
//! every op runs on it. Nothing here owns memory.

use crate::error::{type_err, value_err, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    BF16,
    F32,
    F64,
    /// Index tensors only (cache_seqlens, block_table, ...): never a kernel's data dtype.
    I32,
    /// float8 e4m3 (torch.float8_e4m3fn): the FP8 attention forward's q / k / v only.
    F8E4M3,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I32 => "int32",
            DType::F8E4M3 => "float8_e4m3fn",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        match name {
            "float16" | "half" => Some(DType::F16),
            "bfloat16" => Some(DType::BF16),
            "float32" | "float" => Some(DType::F32),
            "float64" | "double" => Some(DType::F64),
            "int32" => Some(DType::I32),
            "float8_e4m3fn" => Some(DType::F8E4M3),
            _ => None,
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 => 8,
            DType::F8E4M3 => 1,
        }
    }

    /// The code kernels receive as `FS_*DTYPE`: 0 = fp16, 1 = bf16, 2 = fp32.
    pub fn kernel_code(self) -> Result<i64> {
        match self {
            DType::F16 => Ok(0),
            DType::BF16 => Ok(1),
            DType::F32 => Ok(2),
            DType::F64 => Err(type_err(
                "float64 tensors are not supported on the GPU (use float32, float16 or bfloat16)",
            )),
            DType::I32 => Err(type_err(
                "int32 tensors are index tensors, not data (use float32, float16 or bfloat16)",
            )),
            DType::F8E4M3 => Err(type_err(
                "float8_e4m3fn tensors are taken by flash_attn_func's FP8 forward only (use \
                 float32, float16 or bfloat16)",
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda,
    Other(i32),
}

#[derive(Clone, Debug)]
pub struct TensorView {
    pub ptr: u64,
    pub shape: Vec<i64>,
    /// Strides in elements (never bytes).
    pub strides: Vec<i64>,
    pub dtype: DType,
    pub device: DeviceKind,
    pub device_id: i32,
    pub readonly: bool,
}

impl TensorView {
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The largest element offset the view reaches (the sum of (size - 1) * stride), None with a
    /// negative stride or where the sum overflows i64: what a kernel indexing in 32 bits checks.
    pub fn max_offset(&self) -> Option<i64> {
        let mut last: i64 = 0;
        for (&n, &s) in self.shape.iter().zip(self.strides.iter()) {
            if s < 0 {
                return None;
            }
            last = (n.max(1) - 1)
                .checked_mul(s)
                .and_then(|v| last.checked_add(v))?;
        }
        Some(last)
    }

    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }

    /// Checks rank and returns the shape, naming the argument and the expected layout.
    pub fn expect_rank(&self, arg: &str, layout: &str) -> Result<&[i64]> {
        let want = layout.split(',').count();
        if self.rank() != want {
            return Err(value_err(format!(
                "{arg} must have shape ({layout}), got {} dims {:?}",
                self.rank(),
                self.shape
            )));
        }
        Ok(&self.shape)
    }

    pub fn expect_dtype(&self, arg: &str, allowed: &[DType]) -> Result<()> {
        if allowed.contains(&self.dtype) {
            return Ok(());
        }
        let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
        Err(type_err(format!(
            "{arg} has dtype {}, allowed: {}",
            self.dtype.name(),
            names.join(", ")
        )))
    }

    pub fn expect_same_dtype(&self, arg: &str, other: &TensorView, other_arg: &str) -> Result<()> {
        if self.dtype != other.dtype {
            return Err(type_err(format!(
                "{arg} has dtype {} but {other_arg} has dtype {}: they must match",
                self.dtype.name(),
                other.dtype.name()
            )));
        }
        Ok(())
    }

    pub fn expect_shape(&self, arg: &str, want: &[i64]) -> Result<()> {
        if self.shape != want {
            return Err(value_err(format!(
                "{arg} must have shape {want:?}, got {:?}",
                self.shape
            )));
        }
        Ok(())
    }

    /// The given dim must have stride 1 (unless its size is 1, where the stride is moot).
    pub fn expect_unit_stride(&self, arg: &str, dim: usize, dim_name: &str) -> Result<()> {
        if self.shape[dim] > 1 && self.strides[dim] != 1 {
            return Err(value_err(format!(
                "{arg} must be contiguous in its {dim_name} dimension (stride 1), got strides {:?}; call .contiguous() first",
                self.strides
            )));
        }
        Ok(())
    }

    /// Row-major contiguous (what kernels assume for small side tensors such as A, D, lse).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1i64;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n;
        }
        true
    }

    pub fn expect_contiguous(&self, arg: &str) -> Result<()> {
        if !self.is_contiguous() {
            return Err(value_err(format!(
                "{arg} must be contiguous, got shape {:?} strides {:?}",
                self.shape, self.strides
            )));
        }
        Ok(())
    }

    pub fn expect_writable(&self, arg: &str) -> Result<()> {
        if self.readonly {
            return Err(value_err(format!(
                "{arg} is a read-only DLPack tensor and cannot be written to"
            )));
        }
        Ok(())
    }

    /// Elements from the first to one past the last addressable element (for bounds checks).
    pub fn extent_elems(&self) -> i64 {
        if self.shape.contains(&0) {
            return 0;
        }
        1 + self
            .shape
            .iter()
            .zip(&self.strides)
            .map(|(&n, &s)| (n - 1) * s.abs())
            .sum::<i64>()
    }

    /// Whether the memory spans of two tensors overlap (an output must not alias an input).
    pub fn overlaps(&self, other: &TensorView) -> bool {
        if self.numel() == 0 || other.numel() == 0 {
            return false;
        }
        let a0 = self.ptr;
        let a1 = a0 + (self.extent_elems() as u64) * self.dtype.size() as u64;
        let b0 = other.ptr;
        let b1 = b0 + (other.extent_elems() as u64) * other.dtype.size() as u64;
        a0 < b1 && b0 < a1
    }
}

/// All CUDA tensors of one call (absent optional ones are None) must live on one device;
/// returns it.
pub fn common_cuda_device(args: &[(&str, Option<&TensorView>)]) -> Result<i32> {
    let mut dev: Option<(&str, i32)> = None;
    for (name, t) in args.iter().filter_map(|(n, t)| t.map(|t| (n, t))) {
        if t.device != DeviceKind::Cuda {
            return Err(value_err(format!(
                "{name} is not a CUDA tensor (device {:?}); all tensors of a call must be on one CUDA device",
                t.device
            )));
        }
        match dev {
            None => dev = Some((name, t.device_id)),
            Some((first, id)) if id != t.device_id => {
                return Err(value_err(format!(
                    "{name} is on cuda:{} but {first} is on cuda:{id}: all tensors must be on one device",
                    t.device_id
                )))
            }
            _ => {}
        }
    }
    dev.map(|(_, id)| id)
        .ok_or_else(|| value_err("no tensor given"))
}

/// Outputs may share memory with no input and with no other output (absent ones are None).
pub fn expect_no_overlap(
    outputs: &[(&str, Option<&TensorView>)],
    inputs: &[(&str, Option<&TensorView>)],
) -> Result<()> {
    for (i, (oname, o)) in outputs.iter().enumerate() {
        let Some(o) = o else { continue };
        let others = inputs.iter().chain(&outputs[i + 1..]);
        for (name, t) in others {
            if t.is_some_and(|t| o.overlaps(t)) {
                return Err(value_err(format!("{oname} overlaps {name} in memory")));
            }
        }
    }
    Ok(())
}

/// Whether every byte offset of every tensor (the largest: the sum of (size - 1) * stride,
/// times the element size) is below 2^31 with no negative stride: then a kernel may index
/// them, in bytes or elements, in 32-bit arithmetic.
pub(crate) fn byte_offsets_fit_i32(ts: &[Option<&TensorView>]) -> bool {
    ts.iter().flatten().all(|t| {
        t.max_offset()
            .and_then(|last| last.checked_add(1))
            .and_then(|v| v.checked_mul(t.dtype.size() as i64))
            .is_some_and(|v| v <= i32::MAX as i64)
    })
}

/// A writable cuda:0 view for the ops' unit tests (nothing is dereferenced).
#[cfg(test)]
pub(crate) fn cuda_view(shape: &[i64], strides: &[i64], dtype: DType, ptr: u64) -> TensorView {
    TensorView {
        ptr,
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        dtype,
        device: DeviceKind::Cuda,
        device_id: 0,
        readonly: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(shape: &[i64], strides: &[i64]) -> TensorView {
        TensorView {
            ptr: 0x1000,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            dtype: DType::F16,
            device: DeviceKind::Cuda,
            device_id: 0,
            readonly: false,
        }
    }

    #[test]
    fn byte_offsets_fit_i32_counts_bytes() {
        // 2^30 bf16 elements: 2^31 bytes, one byte past what fits
        let edge = cuda_view(&[1 << 30], &[1], DType::BF16, 0x1000);
        let under = cuda_view(&[(1 << 30) - 1], &[1], DType::BF16, 0x1000);
        // 2^30 f32 elements: their element offsets fit, their byte offsets do not
        let f32s = cuda_view(&[8, 1 << 27], &[1 << 27, 1], DType::F32, 0x1000);
        let neg = cuda_view(&[4], &[-1], DType::F32, 0x1000);
        assert!(byte_offsets_fit_i32(&[Some(&under), None]));
        assert!(!byte_offsets_fit_i32(&[Some(&under), Some(&edge)]));
        assert!(!byte_offsets_fit_i32(&[Some(&f32s)]));
        assert!(!byte_offsets_fit_i32(&[Some(&neg)]));
    }

    #[test]
    fn contiguity_and_extent() {
        let t = view(&[2, 3, 4], &[12, 4, 1]);
        assert!(t.is_contiguous());
        assert_eq!(t.extent_elems(), 24);
        let t = view(&[2, 3, 4], &[24, 8, 1]);
        assert!(!t.is_contiguous());
        assert_eq!(t.extent_elems(), 44);
        let t = view(&[0, 3], &[3, 1]);
        assert_eq!(t.extent_elems(), 0);
    }

    #[test]
    fn overlap_detection() {
        let a = view(&[4], &[1]);
        let mut b = view(&[4], &[1]);
        b.ptr = a.ptr + 8;
        assert!(!a.overlaps(&b));
        b.ptr = a.ptr + 6;
        assert!(a.overlaps(&b));
    }

    #[test]
    fn overlap_between_outputs_and_inputs_is_named() {
        let x = view(&[4], &[1]);
        let mut out = view(&[4], &[1]);
        out.ptr = x.ptr + 64;
        let mut last = view(&[4], &[1]);
        last.ptr = out.ptr + 4;
        let ok = expect_no_overlap(&[("out", Some(&out))], &[("x", Some(&x)), ("D", None)]);
        assert!(ok.is_ok());
        let err = expect_no_overlap(
            &[("out", Some(&out)), ("last", Some(&last))],
            &[("x", Some(&x))],
        );
        assert_eq!(err.unwrap_err().to_string(), "out overlaps last in memory");
        let err = expect_no_overlap(&[("out", Some(&x))], &[("x", Some(&x))]);
        assert_eq!(err.unwrap_err().to_string(), "out overlaps x in memory");
    }

    #[test]
    fn device_mismatch_is_named() {
        let a = view(&[1], &[1]);
        let mut b = view(&[1], &[1]);
        b.device_id = 1;
        let err = common_cuda_device(&[("q", Some(&a)), ("k", Some(&b))]).unwrap_err();
        assert!(err.to_string().contains("k is on cuda:1"));
    }
}
