//! Mamba single-step decode: `selective_state_update`, state updated in place. Argument checks
//! and launch of `cuda/state_update.cu`. Both layouts (with and without a head axis) are
//! viewed as (batch, nheads, dim, dstate), the no-head one with nheads = 1 and head strides 0.

use crate::error::{unsupported, value_err, Error, Result};
use crate::ops::next_pow2;
use crate::runtime::{runtime, KernelSpec, StreamChoice};
use crate::tensor::{common_cuda_device, expect_no_overlap, DType, TensorView};

pub const SOURCE: &str = include_str!("../../cuda/state_update.cu");
pub const FAMILY: &str = "state_update";
pub const ENTRY: &str = "selective_state_update";
const THREADS: i64 = 128;
pub const MAX_DSTATE: i64 = 256;

/// Mirrors `struct StateUpdateParams` in cuda/state_update.cu (376 bytes). Strides in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StateUpdateParams {
    pub state: u64,
    pub x: u64,
    pub dt: u64,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub z: u64,
    pub dt_bias: u64,
    pub out: u64,
    pub batch: i64,
    pub nheads: i64,
    pub dim: i64,
    pub dstate: i64,
    pub ngroups: i64,
    pub state_s: [i64; 4],
    pub x_s: [i64; 3],
    pub dt_s: [i64; 3],
    pub z_s: [i64; 3],
    pub out_s: [i64; 3],
    pub a_s: [i64; 3],
    pub b_s: [i64; 3],
    pub c_s: [i64; 3],
    pub d_s: [i64; 2],
    pub dt_bias_s: [i64; 2],
    pub has_d: i32,
    pub has_z: i32,
    pub has_dt_bias: i32,
    pub softplus: i32,
    pub vec4: i32,
    pub pad_: i32,
}

const _: () = assert!(std::mem::size_of::<StateUpdateParams>() == 376);

pub struct StateUpdateArgs<'a> {
    pub state: &'a TensorView,
    pub x: &'a TensorView,
    pub dt: &'a TensorView,
    pub a: &'a TensorView,
    pub b: &'a TensorView,
    pub c: &'a TensorView,
    pub d: Option<&'a TensorView>,
    pub z: Option<&'a TensorView>,
    pub dt_bias: Option<&'a TensorView>,
    pub out: &'a TensorView,
    pub dt_softplus: bool,
}

impl StateUpdateArgs<'_> {
    /// Every input by name (absent optional ones are None); `state` is in/out, not listed.
    fn inputs(&self) -> [(&'static str, Option<&TensorView>); 8] {
        [
            ("x", Some(self.x)),
            ("dt", Some(self.dt)),
            ("A", Some(self.a)),
            ("B", Some(self.b)),
            ("C", Some(self.c)),
            ("D", self.d),
            ("z", self.z),
            ("dt_bias", self.dt_bias),
        ]
    }
}

/// Sizes and every tensor's strides in the (batch, nheads, dim, dstate) view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub batch: i64,
    pub nheads: i64,
    pub dim: i64,
    pub dstate: i64,
    pub ngroups: i64,
    pub params: StateUpdateStrides,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateUpdateStrides {
    pub state: [i64; 4],
    pub x: [i64; 3],
    pub dt: [i64; 3],
    pub z: [i64; 3],
    pub out: [i64; 3],
    pub a: [i64; 3],
    pub b: [i64; 3],
    pub c: [i64; 3],
    pub d: [i64; 2],
    pub dt_bias: [i64; 2],
}

/// (batch, [nheads,] dim) -> strides with a head axis (0 when absent).
fn per_channel(t: &TensorView, arg: &str, want: &[i64], heads: bool) -> Result<[i64; 3]> {
    t.expect_shape(arg, want)?;
    let s = &t.strides;
    Ok(if heads {
        [s[0], s[1], s[2]]
    } else {
        [s[0], 0, s[1]]
    })
}

pub fn check(a: &StateUpdateArgs) -> Result<Problem> {
    let heads = match a.state.rank() {
        3 => false,
        4 => true,
        r => {
            return Err(value_err(format!(
                "state must have shape (batch, dim, dstate) or (batch, nheads, dim, dstate), got {r} dims {:?}",
                a.state.shape
            )))
        }
    };
    let ss = &a.state.shape;
    let (batch, nheads, dim, dstate) = if heads {
        (ss[0], ss[1], ss[2], ss[3])
    } else {
        (ss[0], 1, ss[1], ss[2])
    };
    a.state.expect_dtype("state", &[DType::F32])?;
    a.state.expect_writable("state")?;
    if !(1..=MAX_DSTATE).contains(&dstate) {
        return Err(unsupported(format!(
            "dstate = {dstate} is not supported: 1..={MAX_DSTATE}"
        )));
    }
    let xshape: Vec<i64> = if heads {
        vec![batch, nheads, dim]
    } else {
        vec![batch, dim]
    };
    a.x.expect_dtype("x", &[DType::F16, DType::BF16, DType::F32])?;
    let mut st = StateUpdateStrides {
        state: if heads {
            [
                a.state.strides[0],
                a.state.strides[1],
                a.state.strides[2],
                a.state.strides[3],
            ]
        } else {
            [
                a.state.strides[0],
                0,
                a.state.strides[1],
                a.state.strides[2],
            ]
        },
        x: per_channel(a.x, "x", &xshape, heads)?,
        ..Default::default()
    };
    a.dt.expect_same_dtype("dt", a.x, "x")?;
    st.dt = per_channel(a.dt, "dt", &xshape, heads)?;
    a.out.expect_same_dtype("out", a.x, "x")?;
    st.out = per_channel(a.out, "out", &xshape, heads)?;
    a.out.expect_writable("out")?;
    if let Some(z) = a.z {
        z.expect_same_dtype("z", a.x, "x")?;
        st.z = per_channel(z, "z", &xshape, heads)?;
    }
    a.a.expect_dtype("A", &[DType::F32])?;
    if heads {
        a.a.expect_shape("A", &[nheads, dim, dstate])?;
        st.a = [a.a.strides[0], a.a.strides[1], a.a.strides[2]];
    } else {
        a.a.expect_shape("A", &[dim, dstate])?;
        st.a = [0, a.a.strides[0], a.a.strides[1]];
    }
    a.b.expect_dtype("B", &[a.x.dtype, DType::F32])?;
    a.c.expect_same_dtype("C", a.b, "B")?;
    let mut ngroups = 1;
    for (name, t) in [("B", a.b), ("C", a.c)] {
        let s = match t.rank() {
            2 => {
                t.expect_shape(name, &[batch, dstate])?;
                [t.strides[0], 0, t.strides[1]]
            }
            3 if heads => {
                let g = t.shape[1];
                t.expect_shape(name, &[batch, g, dstate])?;
                if g == 0 || nheads % g != 0 {
                    return Err(value_err(format!(
                        "{name} has ngroups = {g}, which must divide nheads = {nheads}"
                    )));
                }
                if name == "C" && g != ngroups {
                    return Err(value_err(format!("B has {ngroups} groups but C has {g}")));
                }
                ngroups = g;
                [t.strides[0], t.strides[1], t.strides[2]]
            }
            _ => {
                return Err(value_err(format!(
                    "{name} must have shape (batch, dstate){}, got {:?}",
                    if heads {
                        " or (batch, ngroups, dstate)"
                    } else {
                        ""
                    },
                    t.shape
                )))
            }
        };
        if name == "B" {
            st.b = s;
        } else {
            st.c = s;
        }
    }
    for (name, t, slot) in [
        ("D", a.d, &mut st.d),
        ("dt_bias", a.dt_bias, &mut st.dt_bias),
    ] {
        if let Some(t) = t {
            t.expect_dtype(name, &[DType::F32])?;
            if heads {
                t.expect_shape(name, &[nheads, dim])?;
                *slot = [t.strides[0], t.strides[1]];
            } else {
                t.expect_shape(name, &[dim])?;
                *slot = [0, t.strides[0]];
            }
        }
    }
    expect_no_overlap(
        &[("out", Some(a.out)), ("state", Some(a.state))],
        &a.inputs(),
    )?;
    if batch > 65535 || nheads > 65535 {
        return Err(unsupported("batch and nheads must each be <= 65535"));
    }
    check_offsets_fit_i32(&st, nheads, dim, dstate, ngroups)?;
    Ok(Problem {
        batch,
        nheads,
        dim,
        dstate,
        ngroups,
        params: st,
    })
}

/// Largest element offset of an index range: sum over axes of (size - 1) * |stride|.
fn max_offset(axes: &[(i64, i64)]) -> i64 {
    axes.iter()
        .map(|&(n, s)| (n - 1).max(0).saturating_mul(s.saturating_abs()))
        .fold(0i64, i64::saturating_add)
}

/// The kernel computes offsets inside one batch row (and over all of A, D, dt_bias) in 32 bits, to
/// keep its integer work small; only the batch row's base is 64-bit.
fn check_offsets_fit_i32(
    st: &StateUpdateStrides,
    nheads: i64,
    dim: i64,
    dstate: i64,
    ngroups: i64,
) -> Result<()> {
    let chan = |s: &[i64; 3]| max_offset(&[(nheads, s[1]), (dim, s[2])]);
    let worst = [
        max_offset(&[
            (nheads, st.state[1]),
            (dim, st.state[2]),
            (dstate, st.state[3]),
        ]),
        chan(&st.x),
        chan(&st.dt),
        chan(&st.z),
        chan(&st.out),
        max_offset(&[(nheads, st.a[0]), (dim, st.a[1]), (dstate, st.a[2])]),
        max_offset(&[(ngroups, st.b[1]), (dstate, st.b[2])]),
        max_offset(&[(ngroups, st.c[1]), (dstate, st.c[2])]),
        max_offset(&[(nheads, st.d[0]), (dim, st.d[1])]),
        max_offset(&[(nheads, st.dt_bias[0]), (dim, st.dt_bias[1])]),
    ];
    // + 4: the vectorised path reads 4 elements past a row offset
    if worst.iter().any(|&m| m + 4 > i32::MAX as i64) {
        return Err(unsupported(
            "selective_state_update: one batch row of a tensor (or A, D, dt_bias) spans more than \
             2^31 elements",
        ));
    }
    Ok(())
}

/// Batch rows per thread (the kernel's FS_BPT): 2 when that still leaves >= BPT_BLOCKS_PER_SM blocks
/// per SM, else 1. Measured on the H100 (2026-11-22), bpt 1/2/4: b64 d5120 n16 bf16 23.9/22.6/26.9 us,
/// b64 h80 d64 n128 166/150/181 us, b32 d512 2.9/3.4/4.6 us.
const BPT_BLOCKS_PER_SM: i64 = 3;

pub fn rows_per_thread(batch: i64, nheads: i64, dim: i64, dstate: i64, sm_count: i64) -> i64 {
    let lanes = (next_pow2(dstate.max(4)) / 4).min(32);
    let chans = THREADS / lanes;
    let blocks2 = (dim + chans - 1) / chans * nheads * ((batch + 1) / 2);
    if blocks2 >= BPT_BLOCKS_PER_SM * sm_count {
        2
    } else {
        1
    }
}

pub fn spec(
    dstate: i64,
    in_dtype: DType,
    bc_dtype: DType,
    bpt: i64,
    arch: i64,
) -> Result<KernelSpec> {
    let defines = vec![
        ("FS_IN_DTYPE", in_dtype.kernel_code()?),
        ("FS_BC_DTYPE", bc_dtype.kernel_code()?),
        ("FS_DSTATE", next_pow2(dstate.max(4))),
        ("FS_THREADS", THREADS),
        ("FS_BPT", bpt),
        ("FS_ARCH", arch),
    ];
    Ok(KernelSpec {
        family: FAMILY,
        source: SOURCE,
        entry: ENTRY,
        defines,
    })
}

pub fn all_specs(arch: i64) -> Vec<KernelSpec> {
    let mut out = Vec::new();
    for dstate in [4, 8, 16, 32, 64, 128, 256] {
        for in_dt in [DType::F16, DType::BF16, DType::F32] {
            let bcs: &[DType] = if in_dt == DType::F32 {
                &[DType::F32]
            } else {
                &[in_dt, DType::F32]
            };
            for &bc in bcs {
                for bpt in [1, 2] {
                    if let Ok(s) = spec(dstate, in_dt, bc, bpt, arch) {
                        out.push(s);
                    }
                }
            }
        }
    }
    out
}

/// The float4 path: every state row 16-byte aligned and dstate-contiguous (see the kernel).
fn vec4_ok(a: &StateUpdateArgs, p: &Problem) -> bool {
    let s = &p.params;
    let es_bc = a.b.dtype.size() as i64;
    let aligned = |ptr: u64, strides: &[i64], es: i64, to: i64| {
        ptr % to as u64 == 0 && strides.iter().all(|&v| (v * es) % to == 0)
    };
    p.dstate % 4 == 0
        && [s.state[3], s.a[2], s.b[2], s.c[2]].iter().all(|&v| v == 1)
        && aligned(a.state.ptr, &s.state[..3], 4, 16)
        && aligned(a.a.ptr, &s.a[..2], 4, 16)
        && aligned(a.b.ptr, &s.b[..2], es_bc, 4 * es_bc)
        && aligned(a.c.ptr, &s.c[..2], es_bc, 4 * es_bc)
}

pub fn update(a: &StateUpdateArgs, stream: StreamChoice) -> Result<()> {
    let p = check(a)?;
    if p.batch == 0 || p.nheads == 0 || p.dim == 0 {
        return Ok(());
    }
    let mut named = a.inputs().to_vec();
    named.extend([("state", Some(a.state)), ("out", Some(a.out))]);
    let device = common_cuda_device(&named)?;
    let rt = runtime().map_err(Error::Unavailable)?;
    let dev = rt.device(device)?;
    // The device's context stays current for the whole call (loads, scratch, launches, frees)
    // and the caller's is current again when this returns.
    let _bound = dev.bind()?;
    let arch = (dev.props.cc.0 * 10 + dev.props.cc.1) as i64;
    let bpt = rows_per_thread(
        p.batch,
        p.nheads,
        p.dim,
        p.dstate,
        dev.props.sm_count as i64,
    );
    let k = dev.kernel(&spec(p.dstate, a.x.dtype, a.b.dtype, bpt, arch)?)?;
    let lanes = (next_pow2(p.dstate.max(4)) / 4).min(32);
    let chans = THREADS / lanes;
    let s = &p.params;
    let params = StateUpdateParams {
        state: a.state.ptr,
        x: a.x.ptr,
        dt: a.dt.ptr,
        a: a.a.ptr,
        b: a.b.ptr,
        c: a.c.ptr,
        d: a.d.map_or(0, |t| t.ptr),
        z: a.z.map_or(0, |t| t.ptr),
        dt_bias: a.dt_bias.map_or(0, |t| t.ptr),
        out: a.out.ptr,
        batch: p.batch,
        nheads: p.nheads,
        dim: p.dim,
        dstate: p.dstate,
        ngroups: p.ngroups,
        state_s: s.state,
        x_s: s.x,
        dt_s: s.dt,
        z_s: s.z,
        out_s: s.out,
        a_s: s.a,
        b_s: s.b,
        c_s: s.c,
        d_s: s.d,
        dt_bias_s: s.dt_bias,
        has_d: a.d.is_some() as i32,
        has_z: a.z.is_some() as i32,
        has_dt_bias: a.dt_bias.is_some() as i32,
        softplus: a.dt_softplus as i32,
        vec4: vec4_ok(a, &p) as i32,
        pad_: 0,
    };
    let grid_x =
        u32::try_from((p.dim + chans - 1) / chans).map_err(|_| unsupported("dim too large"))?;
    let st = dev.stream(stream)?;
    // SAFETY: params mirrors StateUpdateParams; shapes, dtypes, devices and strides were checked.
    unsafe {
        dev.launch(
            &k,
            (grid_x, p.nheads as u32, ((p.batch + bpt - 1) / bpt) as u32),
            (THREADS as u32, 1, 1),
            0,
            st,
            &params,
        )?;
    }
    dev.finish(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contiguous(nheads: i64, dim: i64, dstate: i64) -> StateUpdateStrides {
        StateUpdateStrides {
            state: [nheads * dim * dstate, dim * dstate, dstate, 1],
            x: [nheads * dim, dim, 1],
            dt: [nheads * dim, dim, 1],
            z: [nheads * dim, dim, 1],
            out: [nheads * dim, dim, 1],
            a: [dim * dstate, dstate, 1],
            b: [dstate, dstate, 1],
            c: [dstate, dstate, 1],
            d: [dim, 1],
            dt_bias: [dim, 1],
        }
    }

    #[test]
    fn offsets_inside_a_row_must_fit_i32() {
        // a large but ordinary decode problem: 80 heads x 64 x 128 state per row
        assert!(check_offsets_fit_i32(&contiguous(80, 64, 128), 80, 64, 128, 1).is_ok());
        // the batch stride is free to be huge: only within-row offsets are 32-bit
        let mut st = contiguous(80, 64, 128);
        st.state[0] = 1 << 40;
        assert!(check_offsets_fit_i32(&st, 80, 64, 128, 1).is_ok());
        // a head stride that puts the last head past 2^31 elements is refused
        st.state[1] = 1 << 30;
        assert!(check_offsets_fit_i32(&st, 80, 64, 128, 1).is_err());
        let mut st = contiguous(4, 64, 16);
        st.x[2] = -(1 << 28); // negative strides count by magnitude
        assert!(check_offsets_fit_i32(&st, 4, 64, 16, 1).is_err());
    }
}
