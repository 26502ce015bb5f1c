//! FlashAttention over packed variable-length sequences (`flash_attn_varlen_func`): checks and
//! launches of the `FS_VARLEN` builds of `cuda/flash_fwd.cu` and `cuda/flash_bwd.cu`.
//!
//! q / out / dout / dq are (total_q, nheads, headdim) and k / v / dk / dv (total_k, nheads_k,
//! headdim); sequence b owns rows [cu_seqlens[b], cu_seqlens[b + 1]) of each; lse is
//! (nheads, total_q). Every tensor check of the dense op is reused on the batch-1 view of the
//! packed arrays; the kernels see the dense parameters with batch strides 0, the longest
//! sequences' lengths as seqlen_q / seqlen_k, and the cu_seqlens arrays, whose values they clamp
//! into [0, total] (the values live on the device: the host cannot validate them here without a
//! synchronisation; the Python layer does where they are host-visible).

use crate::error::{unsupported, value_err, Result};
use crate::ops::attention::{self, FlashFwdArgs, FlashFwdParams, Problem};
use crate::ops::attention_bwd::{self, expect_aligned_rows, BwdRun, FlashBwdArgs};
use crate::runtime::{KernelSpec, StreamChoice};
use crate::tensor::{common_cuda_device, expect_no_overlap, DType, TensorView};

pub struct VarlenFwdArgs<'a> {
    pub q: &'a TensorView,
    pub k: &'a TensorView,
    pub v: &'a TensorView,
    pub out: &'a TensorView,
    pub lse: Option<&'a TensorView>,
    pub cu_seqlens_q: &'a TensorView,
    pub cu_seqlens_k: &'a TensorView,
    pub max_seqlen_q: i64,
    pub max_seqlen_k: i64,
    pub softmax_scale: f32,
    pub window_left: i64,
    pub window_right: i64,
    pub softcap: f32,
}

pub struct VarlenBwdArgs<'a> {
    pub dout: &'a TensorView,
    pub q: &'a TensorView,
    pub k: &'a TensorView,
    pub v: &'a TensorView,
    /// The forward's output and (nheads, total_q) lse.
    pub out: &'a TensorView,
    pub lse: &'a TensorView,
    pub dq: &'a TensorView,
    pub dk: &'a TensorView,
    pub dv: &'a TensorView,
    pub cu_seqlens_q: &'a TensorView,
    pub cu_seqlens_k: &'a TensorView,
    pub max_seqlen_q: i64,
    pub max_seqlen_k: i64,
    pub softmax_scale: f32,
    pub window_left: i64,
    pub window_right: i64,
    pub softcap: f32,
    pub deterministic: bool,
}

/// What the checks resolve: the dense problem of the longest sequences and the packed sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VarlenProblem {
    /// batch = sequences; seqlen_q / seqlen_k = max_seqlen_q / max_seqlen_k; the window
    /// normalised for them.
    pub p: Problem,
    pub total_q: i64,
    pub total_k: i64,
}

/// A packed (total, heads, headdim) array as the dense (1, total, heads, headdim) array it is,
/// so that the dense op's checks (dtype, head dim, strides, alignment, overlap) apply as they are.
fn batch1(name: &str, t: &TensorView, layout: &str) -> Result<TensorView> {
    let s = t.expect_rank(name, layout)?;
    let mut v = t.clone();
    v.shape = vec![1, s[0], s[1], s[2]];
    v.strides = vec![
        t.strides[0] * s[0].max(1),
        t.strides[0],
        t.strides[1],
        t.strides[2],
    ];
    Ok(v)
}

fn expect_cu_seqlens(name: &str, t: &TensorView) -> Result<i64> {
    t.expect_dtype(name, &[DType::I32])?;
    let n = t.expect_rank(name, "batch + 1")?[0];
    if n < 1 {
        return Err(value_err(format!(
            "{name} must have batch + 1 >= 1 entries (0, then each sequence's end), got 0"
        )));
    }
    t.expect_contiguous(name)?;
    if t.ptr % 4 != 0 {
        return Err(value_err(format!(
            "{name} must be 4-byte aligned, got pointer {:#x}",
            t.ptr
        )));
    }
    Ok(n - 1)
}

/// The batch (sequences) and both maxima, checked.
fn check_lengths(
    cu_q: &TensorView,
    cu_k: &TensorView,
    max_seqlen_q: i64,
    max_seqlen_k: i64,
) -> Result<i64> {
    let batch = expect_cu_seqlens("cu_seqlens_q", cu_q)?;
    let batch_k = expect_cu_seqlens("cu_seqlens_k", cu_k)?;
    if batch_k != batch {
        return Err(value_err(format!(
            "cu_seqlens_k has {} entries but cu_seqlens_q has {}: both are batch + 1",
            batch_k + 1,
            batch + 1
        )));
    }
    for (name, m) in [
        ("max_seqlen_q", max_seqlen_q),
        ("max_seqlen_k", max_seqlen_k),
    ] {
        if !(0..(1i64 << 31)).contains(&m) {
            return Err(value_err(format!("{name} = {m} must be >= 0 and < 2^31")));
        }
    }
    if batch > 65535 {
        return Err(unsupported(format!(
            "batch = {batch} sequences > 65535 is not supported"
        )));
    }
    Ok(batch)
}

/// Drops window bounds that hide no key of any sequence no longer than the maxima (as the dense
/// check does for its one length pair: left >= seqlen_k - 1, right >= seqlen_q - 1).
fn normalise_window(p: &mut Problem, left: i64, right: i64) {
    p.window_left = if left >= p.seqlen_k - 1 { -1 } else { left };
    p.window_right = if right >= p.seqlen_q - 1 { -1 } else { right };
}

/// Every check of the forward; pure (no GPU), so it is unit-tested on the CPU.
pub fn check(a: &VarlenFwdArgs) -> Result<VarlenProblem> {
    let q = batch1("q", a.q, "total_q, nheads, headdim")?;
    let k = batch1("k", a.k, "total_k, nheads_k, headdim")?;
    let v = batch1("v", a.v, "total_k, nheads_k, headdim")?;
    let out = batch1("out", a.out, "total_q, nheads, headdim")?;
    let dense = attention::check(&FlashFwdArgs {
        q: &q,
        k: &k,
        v: &v,
        out: &out,
        lse: None,
        softmax_scale: a.softmax_scale,
        window_left: a.window_left,
        window_right: a.window_right,
        softcap: a.softcap,
    })?;
    let (total_q, total_k) = (dense.seqlen_q, dense.seqlen_k);
    if let Some(lse) = a.lse {
        lse.expect_dtype("lse", &[DType::F32])?;
        lse.expect_shape("lse", &[dense.nheads, total_q])?;
        lse.expect_contiguous("lse")?;
        lse.expect_writable("lse")?;
    }
    let batch = check_lengths(
        a.cu_seqlens_q,
        a.cu_seqlens_k,
        a.max_seqlen_q,
        a.max_seqlen_k,
    )?;
    let inputs = [
        ("q", Some(a.q)),
        ("k", Some(a.k)),
        ("v", Some(a.v)),
        ("cu_seqlens_q", Some(a.cu_seqlens_q)),
        ("cu_seqlens_k", Some(a.cu_seqlens_k)),
    ];
    expect_no_overlap(&[("out", Some(a.out)), ("lse", a.lse)], &inputs)?;
    let mut p = Problem {
        batch,
        seqlen_q: a.max_seqlen_q,
        seqlen_k: a.max_seqlen_k,
        ..dense
    };
    normalise_window(&mut p, a.window_left, a.window_right);
    Ok(VarlenProblem {
        p,
        total_q,
        total_k,
    })
}

/// The packed strides as the kernels' (batch stride 0, row stride = the total dimension's).
fn rows(t: &TensorView) -> (i64, i64) {
    (t.strides[0], t.strides[1])
}

/// Checks and launches the forward. Returns without work when there is none.
pub fn forward(a: &VarlenFwdArgs, stream: StreamChoice) -> Result<()> {
    let vp = check(a)?;
    let p = vp.p;
    if p.batch == 0 || p.seqlen_q == 0 || vp.total_q == 0 || p.nheads == 0 {
        return Ok(());
    }
    let device = common_cuda_device(&[
        ("q", Some(a.q)),
        ("k", Some(a.k)),
        ("v", Some(a.v)),
        ("out", Some(a.out)),
        ("lse", a.lse),
        ("cu_seqlens_q", Some(a.cu_seqlens_q)),
        ("cu_seqlens_k", Some(a.cu_seqlens_k)),
    ])?;
    let (qr, qh) = rows(a.q);
    let (kr, kh) = rows(a.k);
    let (vr, vh) = rows(a.v);
    let (or, oh) = rows(a.out);
    let params = FlashFwdParams {
        q: a.q.ptr,
        k: a.k.ptr,
        v: a.v.ptr,
        o: a.out.ptr,
        lse: a.lse.map_or(0, |l| l.ptr),
        q_row_stride: qr,
        q_head_stride: qh,
        k_row_stride: kr,
        k_head_stride: kh,
        v_row_stride: vr,
        v_head_stride: vh,
        o_row_stride: or,
        o_head_stride: oh,
        cu_seqlens_q: a.cu_seqlens_q.ptr,
        cu_seqlens_k: a.cu_seqlens_k.ptr,
        total_q: attention::fits_i32("total_q", vp.total_q)?,
        total_k: attention::fits_i32("total_k", vp.total_k)?,
        ..Default::default()
    };
    attention::launch(
        &p,
        params,
        a.q.dtype,
        a.softmax_scale,
        a.softcap,
        true,
        device,
        stream,
    )
}

/// Every check of the backward; pure (no GPU), so it is unit-tested on the CPU.
pub fn check_bwd(a: &VarlenBwdArgs) -> Result<VarlenProblem> {
    // out and lse are inputs here: they need not be writable.
    let mut out = a.out.clone();
    out.readonly = false;
    let mut lse = a.lse.clone();
    lse.readonly = false;
    let vp = check(&VarlenFwdArgs {
        q: a.q,
        k: a.k,
        v: a.v,
        out: &out,
        lse: Some(&lse),
        cu_seqlens_q: a.cu_seqlens_q,
        cu_seqlens_k: a.cu_seqlens_k,
        max_seqlen_q: a.max_seqlen_q,
        max_seqlen_k: a.max_seqlen_k,
        softmax_scale: a.softmax_scale,
        window_left: a.window_left,
        window_right: a.window_right,
        softcap: a.softcap,
    })?;
    for (name, t, like) in [
        ("dout", a.dout, a.q),
        ("dq", a.dq, a.q),
        ("dk", a.dk, a.k),
        ("dv", a.dv, a.v),
    ] {
        t.expect_rank(name, "total, heads, headdim")?;
        t.expect_same_dtype(name, a.q, "q")?;
        t.expect_shape(name, &like.shape)?;
        t.expect_unit_stride(name, 2, "headdim")?;
        expect_aligned_rows(name, &batch1(name, t, "total, heads, headdim")?)?;
    }
    for (name, t) in [("dq", a.dq), ("dk", a.dk), ("dv", a.dv)] {
        t.expect_writable(name)?;
    }
    expect_no_overlap(
        &[("dq", Some(a.dq)), ("dk", Some(a.dk)), ("dv", Some(a.dv))],
        &[
            ("dout", Some(a.dout)),
            ("q", Some(a.q)),
            ("k", Some(a.k)),
            ("v", Some(a.v)),
            ("out", Some(a.out)),
            ("lse", Some(a.lse)),
            ("cu_seqlens_q", Some(a.cu_seqlens_q)),
            ("cu_seqlens_k", Some(a.cu_seqlens_k)),
        ],
    )?;
    if vp.p.nheads > 65535 || vp.p.nheads_k * 4 > 65535 {
        return Err(unsupported(format!(
            "nheads = {} is not supported by the backward (at most 65535 q heads, 16383 kv heads)",
            vp.p.nheads
        )));
    }
    Ok(vp)
}

/// Checks and launches the backward (preprocess, main, convert). dq, dk, dv are written in
/// full for every row some sequence owns.
pub fn backward(a: &VarlenBwdArgs, stream: StreamChoice) -> Result<()> {
    let vp = check_bwd(a)?;
    let p = vp.p;
    if p.batch == 0 || p.nheads == 0 || vp.total_k == 0 || p.seqlen_k == 0 {
        return Ok(());
    }
    // the dense backward's tensors, device check and params; each tensor's (batch, row,
    // head) strides with batch 0
    let dense = FlashBwdArgs {
        dout: a.dout,
        q: a.q,
        k: a.k,
        v: a.v,
        out: a.out,
        lse: a.lse,
        dq: a.dq,
        dk: a.dk,
        dv: a.dv,
        softmax_scale: a.softmax_scale,
        window_left: a.window_left,
        window_right: a.window_right,
        softcap: a.softcap,
        deterministic: a.deterministic,
    };
    let (device, mut params) = attention_bwd::device_and_params(
        &dense,
        &[
            ("cu_seqlens_q", Some(a.cu_seqlens_q)),
            ("cu_seqlens_k", Some(a.cu_seqlens_k)),
        ],
        |t| {
            let (r, h) = rows(t);
            [0, r, h]
        },
    )?;
    params.cu_seqlens_q = a.cu_seqlens_q.ptr;
    params.cu_seqlens_k = a.cu_seqlens_k.ptr;
    params.total_q = attention::fits_i32("total_q", vp.total_q)?;
    params.total_k = attention::fits_i32("total_k", vp.total_k)?;
    attention_bwd::launch(&p, params, &BwdRun::of(&dense, true), device, stream)
}

/// Every varlen variant (forward and backward) for one arch.
pub fn all_specs(arch_num: i64) -> Vec<KernelSpec> {
    let mut out = attention::specs_of(arch_num, true);
    out.extend(attention_bwd::specs_of(arch_num, true));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::attention_tma;
    use crate::tensor::DeviceKind;

    fn view(shape: &[i64], ptr: u64, dtype: DType) -> TensorView {
        TensorView {
            ptr,
            shape: shape.to_vec(),
            strides: crate::dlpack::compact_strides(shape),
            dtype,
            device: DeviceKind::Cuda,
            device_id: 0,
            readonly: false,
        }
    }

    struct Views {
        q: TensorView,
        k: TensorView,
        v: TensorView,
        o: TensorView,
        lse: TensorView,
        cq: TensorView,
        ck: TensorView,
    }

    fn views(tq: i64, tk: i64, batch: i64) -> Views {
        Views {
            q: view(&[tq, 8, 64], 0x1000_0000, DType::BF16),
            k: view(&[tk, 2, 64], 0x2000_0000, DType::BF16),
            v: view(&[tk, 2, 64], 0x3000_0000, DType::BF16),
            o: view(&[tq, 8, 64], 0x4000_0000, DType::BF16),
            lse: view(&[8, tq], 0x5000_0000, DType::F32),
            cq: view(&[batch + 1], 0x6000_0000, DType::I32),
            ck: view(&[batch + 1], 0x7000_0000, DType::I32),
        }
    }

    fn args(v: &Views, mq: i64, mk: i64, left: i64, right: i64) -> VarlenFwdArgs<'_> {
        VarlenFwdArgs {
            q: &v.q,
            k: &v.k,
            v: &v.v,
            out: &v.o,
            lse: Some(&v.lse),
            cu_seqlens_q: &v.cq,
            cu_seqlens_k: &v.ck,
            max_seqlen_q: mq,
            max_seqlen_k: mk,
            softmax_scale: 0.125,
            window_left: left,
            window_right: right,
            softcap: 0.0,
        }
    }

    #[test]
    fn valid_problem_uses_the_maxima() {
        let v = views(300, 500, 3);
        let vp = check(&args(&v, 200, 250, -1, 0)).expect("valid");
        assert_eq!((vp.total_q, vp.total_k), (300, 500));
        assert_eq!((vp.p.batch, vp.p.seqlen_q, vp.p.seqlen_k), (3, 200, 250));
        assert_eq!((vp.p.window_left, vp.p.window_right), (-1, 0));
        // one query per sequence: causal hides nothing
        let vp = check(&args(&v, 1, 250, -1, 0)).expect("valid");
        assert_eq!(vp.p.window_right, -1);
        // a left window as long as the longest key sequence hides nothing
        assert_eq!(
            check(&args(&v, 200, 250, 249, -1))
                .expect("valid")
                .p
                .window_left,
            -1
        );
        assert_eq!(
            check(&args(&v, 200, 250, 248, -1))
                .expect("valid")
                .p
                .window_left,
            248
        );
    }

    #[test]
    fn bad_cu_seqlens_and_shapes_are_rejected() {
        let mut v = views(300, 500, 3);
        v.cq.dtype = DType::F32;
        assert!(check(&args(&v, 200, 250, -1, -1)).is_err());
        let mut v = views(300, 500, 3);
        v.ck = view(&[3], 0x7000_0000, DType::I32); // batch 2 vs 3
        assert!(check(&args(&v, 200, 250, -1, -1)).is_err());
        let mut v = views(300, 500, 3);
        v.cq.strides = vec![2]; // not contiguous
        assert!(check(&args(&v, 200, 250, -1, -1)).is_err());
        let v = views(300, 500, 3);
        assert!(check(&args(&v, -1, 250, -1, -1)).is_err());
        let mut v = views(300, 500, 3);
        v.lse = view(&[300, 8], 0x5000_0000, DType::F32); // flash-attn's lse is (nheads, total_q)
        assert!(check(&args(&v, 200, 250, -1, -1)).is_err());
        let mut v = views(300, 500, 3);
        v.q = view(&[1, 300, 8, 64], 0x1000_0000, DType::BF16); // the dense layout
        assert!(check(&args(&v, 200, 250, -1, -1)).is_err());
        let mut v = views(300, 500, 3);
        v.o.ptr = v.cq.ptr; // out over cu_seqlens_q
        assert!(check(&args(&v, 200, 250, -1, -1)).is_err());
    }

    #[test]
    fn backward_checks_the_gradients() {
        let v = views(300, 500, 3);
        let dout = view(&[300, 8, 64], 0x8000_0000, DType::BF16);
        let dq = view(&[300, 8, 64], 0x9000_0000, DType::BF16);
        let dk = view(&[500, 2, 64], 0xa000_0000, DType::BF16);
        let mut dv = view(&[500, 2, 64], 0xb000_0000, DType::BF16);
        let mk = |dv: &TensorView| {
            check_bwd(&VarlenBwdArgs {
                dout: &dout,
                q: &v.q,
                k: &v.k,
                v: &v.v,
                out: &v.o,
                lse: &v.lse,
                dq: &dq,
                dk: &dk,
                dv,
                cu_seqlens_q: &v.cq,
                cu_seqlens_k: &v.ck,
                max_seqlen_q: 200,
                max_seqlen_k: 250,
                softmax_scale: 0.125,
                window_left: -1,
                window_right: 0,
                softcap: 0.0,
                deterministic: false,
            })
        };
        assert!(mk(&dv).is_ok());
        dv.shape = vec![500, 8, 64];
        dv.strides = crate::dlpack::compact_strides(&dv.shape);
        assert!(mk(&dv).is_err());
        let dv2 = view(&[500, 2, 64], dk.ptr, DType::BF16); // aliases dk
        assert!(mk(&dv2).is_err());
    }

    #[test]
    fn variants_carry_the_varlen_flag_and_differ_from_dense() {
        let specs = all_specs(90);
        assert!(specs.iter().all(|s| s.defines.contains(&("FS_VARLEN", 1))));
        let dense = attention::all_specs(90);
        assert!(dense
            .iter()
            .all(|s| s.defines.iter().all(|&(k, _)| k != "FS_VARLEN")));
        // the cp.async wgmma kernel serves dense problems only; the TMA kernel packed ones in
        // its default schedules (one CTA a tile): head dims 64 / 128 / 256 x fp16 / bf16 x mask x
        // softcap
        let mma_sync = dense
            .iter()
            .filter(|s| s.family != attention::FAMILY_SM90 && s.family != attention_tma::FAMILY)
            .count();
        assert!(mma_sync < dense.len(), "sm_90 lists the wgmma variants");
        let varlen = attention::specs_of(90, true);
        let tma = varlen.iter().filter(|s| s.family == attention_tma::FAMILY);
        assert_eq!(tma.clone().count(), 3 * 2 * 2 * 2);
        assert!(tma
            .clone()
            .all(|s| !s.defines.iter().any(|(k, _)| *k == "FS_SM90_PERSIST")));
        assert_eq!(
            varlen.len() - tma.count(),
            mma_sync,
            "one varlen variant per dense mma.sync one"
        );
        assert!(attention::specs_of(80, true)
            .iter()
            .all(|s| s.family != attention_tma::FAMILY));
    }
}
