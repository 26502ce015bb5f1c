//! Bindings of the causal conv1d ops (`ops::conv1d`): bindings only, as in `lib.rs`, kept in
//! their own file so the family's additions to the module stay in one place.

use pyo3::prelude::*;

use crate::{import, import_opt, ops, stream_choice, view_of};

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (x, weight, bias, initial_states, seq_idx, out, final_states, silu, stream))]
fn causal_conv1d_fwd(
    x: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    initial_states: Option<&Bound<'_, PyAny>>,
    seq_idx: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    final_states: Option<&Bound<'_, PyAny>>,
    silu: bool,
    stream: Option<u64>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let x = import(x, "x", ch)?;
    let weight = import(weight, "weight", ch)?;
    let bias = import_opt(bias, "bias", ch)?;
    let init = import_opt(initial_states, "initial_states", ch)?;
    let seq = import_opt(seq_idx, "seq_idx", ch)?;
    let out = import(out, "out", ch)?;
    let fin = import_opt(final_states, "final_states_out", ch)?;
    let args = ops::conv1d::Conv1dFwdArgs {
        x: &x.view,
        weight: &weight.view,
        bias: view_of(&bias),
        initial_states: view_of(&init),
        seq_idx: view_of(&seq),
        out: &out.view,
        final_states: view_of(&fin),
        silu,
    };
    Ok(ops::conv1d::forward(&args, ch)?)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (x, weight, bias, initial_states, seq_idx, dout, dfinal_states, dx, dweight, dbias, dinitial_states, silu, stream))]
fn causal_conv1d_bwd(
    x: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    initial_states: Option<&Bound<'_, PyAny>>,
    seq_idx: Option<&Bound<'_, PyAny>>,
    dout: &Bound<'_, PyAny>,
    dfinal_states: Option<&Bound<'_, PyAny>>,
    dx: &Bound<'_, PyAny>,
    dweight: &Bound<'_, PyAny>,
    dbias: Option<&Bound<'_, PyAny>>,
    dinitial_states: Option<&Bound<'_, PyAny>>,
    silu: bool,
    stream: Option<u64>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let x = import(x, "x", ch)?;
    let weight = import(weight, "weight", ch)?;
    let bias = import_opt(bias, "bias", ch)?;
    let init = import_opt(initial_states, "initial_states", ch)?;
    let seq = import_opt(seq_idx, "seq_idx", ch)?;
    let dout = import(dout, "dout", ch)?;
    let dfin = import_opt(dfinal_states, "dfinal_states", ch)?;
    let dx = import(dx, "dx", ch)?;
    let dweight = import(dweight, "dweight", ch)?;
    let dbias = import_opt(dbias, "dbias", ch)?;
    let dinit = import_opt(dinitial_states, "dinitial_states", ch)?;
    let args = ops::conv1d::Conv1dBwdArgs {
        x: &x.view,
        weight: &weight.view,
        bias: view_of(&bias),
        initial_states: view_of(&init),
        seq_idx: view_of(&seq),
        dout: &dout.view,
        dfinal_states: view_of(&dfin),
        dx: &dx.view,
        dweight: &dweight.view,
        dbias: view_of(&dbias),
        dinitial_states: view_of(&dinit),
        silu,
    };
    Ok(ops::conv1d::backward(&args, ch)?)
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (x, conv_state, weight, bias, cache_seqlens, out, silu, stream))]
fn causal_conv1d_update(
    x: &Bound<'_, PyAny>,
    conv_state: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    cache_seqlens: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    silu: bool,
    stream: Option<u64>,
) -> PyResult<()> {
    let ch = stream_choice(stream);
    let x = import(x, "x", ch)?;
    let state = import(conv_state, "conv_state", ch)?;
    let weight = import(weight, "weight", ch)?;
    let bias = import_opt(bias, "bias", ch)?;
    let lens = import_opt(cache_seqlens, "cache_seqlens", ch)?;
    let out = import(out, "out", ch)?;
    let args = ops::conv1d::Conv1dUpdateArgs {
        x: &x.view,
        conv_state: &state.view,
        weight: &weight.view,
        bias: view_of(&bias),
        cache_seqlens: view_of(&lens),
        out: &out.view,
        silu,
    };
    Ok(ops::conv1d::update(&args, ch)?)
}

/// Adds this file's functions to the `_native` module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(causal_conv1d_fwd, m)?)?;
    m.add_function(wrap_pyfunction!(causal_conv1d_bwd, m)?)?;
    m.add_function(wrap_pyfunction!(causal_conv1d_update, m)?)?;
    Ok(())
}
