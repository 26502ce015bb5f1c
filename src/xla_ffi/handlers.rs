//! The XLA FFI handlers: one `extern "C"` function per target, each reading its operands,
//! results and attributes off the call frame and calling the same `ops::*` entry the Python
//! bindings call, on XLA's CUDA stream (no host synchronisation).
//!
//! Calling convention (kept in step with `python/flashscan/jax.py`): operands in the order of
//! the op's arguments; optional operands present only when their bit is set in the `optional`
//! attribute (listed per handler); results in order, all row-major.
//!
//! Where XLA has no CUDA stream (a target registered for XLA:CPU, as the CPU tests do), the
//! op's checks still run so bad input gets its own clear error, then the call fails saying
//! there is no stream.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::abi;
use super::frame::{call_device, Frame, Opened};
use crate::error::{Error, Result};
use crate::ops;
use crate::runtime::{driver, StreamChoice};
use crate::tensor::TensorView;

/// Opens the frame, answers the metadata stage, runs `body` with panics contained.
///
/// # Safety
/// `frame` must come from XLA.
unsafe fn serve(
    frame: *mut abi::CallFrame,
    target: &'static str,
    body: fn(&Frame) -> Result<()>,
) -> *mut abi::Error {
    let f = match Frame::open(frame, target) {
        Err(e) => return e,
        Ok(Opened::Metadata | Opened::OtherStage) => return std::ptr::null_mut(),
        Ok(Opened::Execute(f)) => f,
    };
    match catch_unwind(AssertUnwindSafe(|| body(&f))) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => f.error(&e),
        Err(_) => f.error(&Error::Internal(format!(
            "flashscan {}: internal panic (please report)",
            f.target()
        ))),
    }
}

/// The operands and results of one call, taken in order, each stamped with the call's device.
struct Operands<'f, 'a> {
    f: &'f Frame<'a>,
    next_arg: usize,
    next_ret: usize,
    optional: i64,
    device: i32,
}

impl<'f, 'a> Operands<'f, 'a> {
    fn new(f: &'f Frame<'a>, on_gpu: bool) -> Result<Self> {
        let optional = if f.arg_count() > 0 {
            f.attr_i64("optional").unwrap_or(0)
        } else {
            0
        };
        Ok(Operands {
            f,
            next_arg: 0,
            next_ret: 0,
            optional,
            device: if on_gpu { call_device(f)? } else { 0 },
        })
    }

    fn arg(&mut self, name: &str) -> Result<TensorView> {
        let mut v = self.f.arg(self.next_arg, name)?;
        self.next_arg += 1;
        v.device_id = self.device;
        Ok(v)
    }

    /// The next operand if bit `bit` of `optional` is set.
    fn arg_if(&mut self, bit: i64, name: &str) -> Result<Option<TensorView>> {
        if self.optional & bit == 0 {
            return Ok(None);
        }
        self.arg(name).map(Some)
    }

    fn ret(&mut self, name: &str) -> Result<TensorView> {
        let mut v = self.f.ret(self.next_ret, name)?;
        self.next_ret += 1;
        v.device_id = self.device;
        Ok(v)
    }

    fn ret_if(&mut self, present: bool, name: &str) -> Result<Option<TensorView>> {
        if present {
            self.ret(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Every operand and result was taken, and no more were passed.
    fn finish(&self) -> Result<()> {
        self.f.expect_arity(self.next_arg, self.next_ret)
    }
}

/// Launches on XLA's stream, or without one runs the op's checks and reports the missing stream.
fn launch(
    stream: Result<u64>,
    check: impl FnOnce() -> Result<()>,
    op: impl FnOnce(StreamChoice) -> Result<()>,
) -> Result<()> {
    match stream {
        Ok(h) => op(StreamChoice::Caller(h)),
        Err(e) => {
            check()?;
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

/// The attributes both attention handlers take, read in this order.
struct AttnAttrs {
    softmax_scale: f32,
    window_left: i64,
    window_right: i64,
    softcap: f32,
}

impl AttnAttrs {
    fn read(f: &Frame) -> Result<AttnAttrs> {
        Ok(AttnAttrs {
            softmax_scale: f.attr_f32("softmax_scale")?,
            window_left: f.attr_i64("window_left")?,
            window_right: f.attr_i64("window_right")?,
            softcap: f.attr_f32("softcap")?,
        })
    }
}

/// Operands q, k, v; results out, lse (f32 (batch, nheads, seqlen_q)); attributes
/// softmax_scale, window_left, window_right, softcap.
fn attn_fwd(f: &Frame) -> Result<()> {
    let stream = f.stream();
    let mut o = Operands::new(f, stream.is_ok())?;
    let (q, k, v) = (o.arg("q")?, o.arg("k")?, o.arg("v")?);
    let (out, lse) = (o.ret("out")?, o.ret("lse")?);
    o.finish()?;
    let at = AttnAttrs::read(f)?;
    let args = ops::attention::FlashFwdArgs {
        q: &q,
        k: &k,
        v: &v,
        out: &out,
        lse: Some(&lse),
        softmax_scale: at.softmax_scale,
        window_left: at.window_left,
        window_right: at.window_right,
        softcap: at.softcap,
    };
    launch(
        stream,
        || ops::attention::check(&args).map(drop),
        |ch| ops::attention::forward(&args, ch),
    )
}

/// Operands dout, q, k, v, out, lse; results dq, dk, dv; attributes as the forward's plus
/// deterministic.
fn attn_bwd(f: &Frame) -> Result<()> {
    let stream = f.stream();
    let mut o = Operands::new(f, stream.is_ok())?;
    let dout = o.arg("dout")?;
    let (q, k, v) = (o.arg("q")?, o.arg("k")?, o.arg("v")?);
    let (out, lse) = (o.arg("out")?, o.arg("lse")?);
    let (dq, dk, dv) = (o.ret("dq")?, o.ret("dk")?, o.ret("dv")?);
    o.finish()?;
    let at = AttnAttrs::read(f)?;
    let args = ops::attention_bwd::FlashBwdArgs {
        dout: &dout,
        q: &q,
        k: &k,
        v: &v,
        out: &out,
        lse: &lse,
        dq: &dq,
        dk: &dk,
        dv: &dv,
        softmax_scale: at.softmax_scale,
        window_left: at.window_left,
        window_right: at.window_right,
        softcap: at.softcap,
        deterministic: f.attr_bool("deterministic")?,
    };
    launch(
        stream,
        || ops::attention_bwd::check(&args).map(drop),
        |ch| ops::attention_bwd::backward(&args, ch),
    )
}

// ---------------------------------------------------------------------------------------------
// Selective scan
// ---------------------------------------------------------------------------------------------

/// Bits of the scan handlers' `optional` attribute.
pub mod scan_bits {
    pub const D: i64 = 1;
    pub const Z: i64 = 2;
    pub const DELTA_BIAS: i64 = 4;
    pub const INITIAL_STATE: i64 = 8;
    /// Backward only.
    pub const SAVED_STATES: i64 = 16;
    pub const DLAST_STATE: i64 = 32;
}

/// Operands u, delta, A, B, C, then D, z, delta_bias, initial_state per `optional`; results
/// out, last_state (f32 (batch, dim, dstate)) and, when a third result is asked for,
/// saved_states (f32 (batch, dim, nsaved, dstate), for the backward); attribute delta_softplus.
fn scan_fwd(f: &Frame) -> Result<()> {
    use scan_bits::*;
    let stream = f.stream();
    let mut o = Operands::new(f, stream.is_ok())?;
    let (u, delta) = (o.arg("u")?, o.arg("delta")?);
    let (a, b, c) = (o.arg("A")?, o.arg("B")?, o.arg("C")?);
    let d = o.arg_if(D, "D")?;
    let z = o.arg_if(Z, "z")?;
    let delta_bias = o.arg_if(DELTA_BIAS, "delta_bias")?;
    let initial_state = o.arg_if(INITIAL_STATE, "initial_state")?;
    let out = o.ret("out")?;
    let last_state = o.ret("last_state")?;
    let saved_states = o.ret_if(f.ret_count() == 3, "saved_states")?;
    o.finish()?;
    let args = ops::scan::ScanArgs {
        u: &u,
        delta: &delta,
        a: &a,
        b: &b,
        c: &c,
        d: d.as_ref(),
        z: z.as_ref(),
        delta_bias: delta_bias.as_ref(),
        initial_state: initial_state.as_ref(),
        out: &out,
        last_state: Some(&last_state),
        saved_states: saved_states.as_ref(),
        delta_softplus: f.attr_bool("delta_softplus")?,
    };
    launch(
        stream,
        || ops::scan::check(&args).map(drop),
        |ch| ops::scan::forward(&args, ch),
    )
}

/// Operands u, delta, A, B, C, then D, z, delta_bias, initial_state per `optional`, dout, then
/// saved_states, dlast_state per `optional`; results du, ddelta, dA, dB, dC, then dD, dz,
/// ddelta_bias, dinitial_state for the optional inputs present; attribute delta_softplus.
fn scan_bwd(f: &Frame) -> Result<()> {
    use scan_bits::*;
    let stream = f.stream();
    let mut o = Operands::new(f, stream.is_ok())?;
    let (u, delta) = (o.arg("u")?, o.arg("delta")?);
    let (a, b, c) = (o.arg("A")?, o.arg("B")?, o.arg("C")?);
    let d = o.arg_if(D, "D")?;
    let z = o.arg_if(Z, "z")?;
    let delta_bias = o.arg_if(DELTA_BIAS, "delta_bias")?;
    let initial_state = o.arg_if(INITIAL_STATE, "initial_state")?;
    let dout = o.arg("dout")?;
    let saved_states = o.arg_if(SAVED_STATES, "saved_states")?;
    let dlast_state = o.arg_if(DLAST_STATE, "dlast_state")?;
    let (du, ddelta) = (o.ret("du")?, o.ret("ddelta")?);
    let (da, db, dc) = (o.ret("dA")?, o.ret("dB")?, o.ret("dC")?);
    let dd = o.ret_if(d.is_some(), "dD")?;
    let dz = o.ret_if(z.is_some(), "dz")?;
    let ddelta_bias = o.ret_if(delta_bias.is_some(), "ddelta_bias")?;
    let dinitial_state = o.ret_if(initial_state.is_some(), "dinitial_state")?;
    o.finish()?;
    let args = ops::scan_bwd::ScanBwdArgs {
        u: &u,
        delta: &delta,
        a: &a,
        b: &b,
        c: &c,
        d: d.as_ref(),
        z: z.as_ref(),
        delta_bias: delta_bias.as_ref(),
        initial_state: initial_state.as_ref(),
        dout: &dout,
        saved_states: saved_states.as_ref(),
        dlast_state: dlast_state.as_ref(),
        du: &du,
        ddelta: &ddelta,
        da: &da,
        db: &db,
        dc: &dc,
        dd: dd.as_ref(),
        dz: dz.as_ref(),
        ddelta_bias: ddelta_bias.as_ref(),
        dinitial_state: dinitial_state.as_ref(),
        delta_softplus: f.attr_bool("delta_softplus")?,
    };
    launch(
        stream,
        || ops::scan_bwd::check(&args).map(drop),
        |ch| ops::scan_bwd::backward(&args, ch),
    )
}

/// Bits of the state-update handler's `optional` attribute.
pub mod update_bits {
    pub const D: i64 = 1;
    pub const Z: i64 = 2;
    pub const DT_BIAS: i64 = 4;
}

/// Operands state, x, dt, A, B, C, then D, z, dt_bias per `optional`; results out and
/// new_state, which jax.py aliases to the state operand (the update runs in place in it; were
/// XLA to give a separate buffer, the state is first copied there on the stream); attribute
/// dt_softplus.
fn state_update(f: &Frame) -> Result<()> {
    use update_bits::*;
    let stream = f.stream();
    let mut o = Operands::new(f, stream.is_ok())?;
    let state_in = o.arg("state")?;
    let (x, dt) = (o.arg("x")?, o.arg("dt")?);
    let (a, b, c) = (o.arg("A")?, o.arg("B")?, o.arg("C")?);
    let d = o.arg_if(D, "D")?;
    let z = o.arg_if(Z, "z")?;
    let dt_bias = o.arg_if(DT_BIAS, "dt_bias")?;
    let out = o.ret("out")?;
    let state = o.ret("new_state")?;
    o.finish()?;
    if state.shape != state_in.shape || state.dtype != state_in.dtype {
        return Err(crate::error::value_err(format!(
            "new_state: shape {:?} / {} does not match state's {:?} / {}",
            state.shape,
            state.dtype.name(),
            state_in.shape,
            state_in.dtype.name()
        )));
    }
    let args = ops::state_update::StateUpdateArgs {
        state: &state,
        x: &x,
        dt: &dt,
        a: &a,
        b: &b,
        c: &c,
        d: d.as_ref(),
        z: z.as_ref(),
        dt_bias: dt_bias.as_ref(),
        out: &out,
        dt_softplus: f.attr_bool("dt_softplus")?,
    };
    launch(
        stream,
        || ops::state_update::check(&args).map(drop),
        |ch| {
            if state.ptr != state_in.ptr && state.numel() > 0 {
                let StreamChoice::Caller(h) = ch else {
                    return Err(Error::Internal("state copy needs XLA's stream".into()));
                };
                let bytes = state.numel() as usize * state.dtype.size();
                // SAFETY: both are XLA buffers of `bytes` bytes, alive for the call.
                unsafe {
                    driver::copy_async(state.ptr, state_in.ptr, bytes, driver::Stream::from_raw(h))
                }?;
            }
            ops::state_update::update(&args, ch)
        },
    )
}

// ---------------------------------------------------------------------------------------------
// The exported handlers
// ---------------------------------------------------------------------------------------------

macro_rules! handler {
    ($name:ident, $target:literal, $body:ident) => {
        /// XLA FFI handler (`XLA_FFI_Handler`).
        ///
        /// # Safety
        /// Called by XLA with its call frame.
        pub unsafe extern "C" fn $name(frame: *mut abi::CallFrame) -> *mut abi::Error {
            serve(frame, $target, $body)
        }
    };
}

handler!(flash_attn_fwd, "flash_attn_fwd", attn_fwd);
handler!(flash_attn_bwd, "flash_attn_bwd", attn_bwd);
handler!(selective_scan_fwd, "selective_scan_fwd", scan_fwd);
handler!(selective_scan_bwd, "selective_scan_bwd", scan_bwd);
handler!(
    selective_state_update,
    "selective_state_update",
    state_update
);
