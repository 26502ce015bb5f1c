"""flashscan.integrations.transformers: tiny random-weight models (no downloads) built from
configs, run once with transformers' eager path and once on flashscan.

Correctness rule: the float64 eager model is the reference; flashscan's logits must be within
2x the error of the same-precision eager model (+ slack), over the positions of real tokens
(padded positions differ by design: eager attends uniformly there, flashscan writes 0).
Greedy `generate` must give the same tokens. CPU runs use flashscan's NumPy references; the
same tests run on CUDA (`gpu` marker) on the kernels, in bfloat16 for logits and float32 for
generate (where bf16 near-ties could flip a token between any two implementations).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashscan  # noqa: E402
from flashscan.integrations import _hf_attention  # noqa: E402
from flashscan.integrations import transformers as fst  # noqa: E402

VOCAB = 101
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def llama() -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA 2:1
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(cfg)


def mistral() -> Any:
    cfg = transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,  # MQA
        head_dim=16,
        sliding_window=5,  # shorter than every sequence below
        max_position_embeddings=128,
    )
    return transformers.MistralForCausalLM(cfg)


def gemma2() -> Any:
    cfg = transformers.Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,  # one sliding, one global layer
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=6,
        attn_logit_softcapping=2.0,  # small: the cap bites on random weights
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=24,  # scaling != 1/sqrt(head_dim)
        max_position_embeddings=128,
    )
    return transformers.Gemma2ForCausalLM(cfg)


def mamba() -> Any:
    cfg = transformers.MambaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        state_size=8,
        num_hidden_layers=2,
        expand=2,
        conv_kernel=4,
        time_step_rank=4,
    )
    return transformers.MambaForCausalLM(cfg)


ATTENTION_MODELS = {"llama": llama, "mistral": mistral, "gemma2": gemma2}


def build(factory: Any, device: str, dtype: Any) -> Any:
    torch.manual_seed(1234)
    model = factory().eval()
    model.set_attn_implementation("eager") if hasattr(model, "set_attn_implementation") else None
    return model.to(device=device, dtype=dtype)


def inputs(device: str, batch: int = 3, seqlen: int = 13, pad: str | None = None) -> Any:
    """Token ids and a 0/1 attention mask: rows of different lengths, padded on `pad`'s side
    (row 0 is full length, the others lose 3 and 6 tokens)."""
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(1, VOCAB, (batch, seqlen), generator=g)
    mask = torch.ones(batch, seqlen, dtype=torch.long)
    if pad is not None:
        for b in range(1, batch):
            n = 3 * b
            if pad == "left":
                mask[b, :n] = 0
            else:
                mask[b, seqlen - n :] = 0
        ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


def logits(model: Any, impl: str | None, ids: Any, mask: Any) -> Any:
    if impl is not None:
        model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def reference(model: Any, ids: Any, mask: Any) -> Any:
    """float64 eager logits, each row run alone on its real tokens (at their positions in the
    padded row): eager's padded batch in float64 turns the fully masked rows of left padding
    into NaN, which then leak into real tokens through 0 * NaN."""
    ref_model = copy.deepcopy(model).to(torch.float64)
    ref_model.set_attn_implementation("eager")
    out = torch.full((*ids.shape, VOCAB), float("nan"), dtype=torch.float64, device=ids.device)
    with torch.no_grad():
        for b in range(ids.shape[0]):
            keep = mask[b].bool().nonzero().squeeze(1)
            kw = {} if "Mamba" in type(model).__name__ else {"position_ids": keep[None]}
            out[b, keep] = ref_model(input_ids=ids[b, keep][None], **kw).logits[0].double()
    return out


def assert_rule(got: Any, ref: Any, base: Any, mask: Any, slack: float) -> None:
    """The correctness rule over the real tokens' logits."""
    keep = mask.bool()
    g, r, b = (x[keep].double().cpu() for x in (got, ref, base))
    assert not torch.isnan(g).any()
    err, base_err = (g - r).abs().max().item(), (b - r).abs().max().item()
    assert err <= 2 * base_err + slack, f"max error {err:.3e}, eager's {base_err:.3e}"


def half_dtype(device: str) -> Any:
    return torch.float32 if device == "cpu" else torch.bfloat16


# ---------------------------------------------------------------------------------------------
# Attention models: logits and generate
# ---------------------------------------------------------------------------------------------


def test_the_name_avoids_transformers_flash_routing() -> None:
    assert "flash" not in fst.ATTN_IMPLEMENTATION
    assert fst.ATTN_IMPLEMENTATION in transformers.AttentionInterface()
    with pytest.raises(ValueError, match="flash"):
        fst.register("my_flash_thing")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad", [None, "left", "right"])
@pytest.mark.parametrize("name", sorted(ATTENTION_MODELS))
def test_logits_match_eager(name: str, pad: str | None, device: str) -> None:
    dtype = half_dtype(device)
    model = build(ATTENTION_MODELS[name], device, dtype)
    ids, mask = inputs(device, pad=pad)
    ref = reference(model, ids, mask)
    base = logits(model, None, ids, mask)
    got = logits(model, fst.ATTN_IMPLEMENTATION, ids, mask)
    assert_rule(got, ref, base, mask, slack=1e-5 if dtype == torch.float32 else 1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("pad", [None, "left"])
@pytest.mark.parametrize("name", sorted(ATTENTION_MODELS))
def test_generate_matches_eager(name: str, pad: str | None, cache: str, device: str) -> None:
    """Greedy decoding past the sliding window, with transformers' DynamicCache (k/v grow
    each step) and StaticCache (k/v are the whole preallocated buffer, mostly empty slots:
    generate passes no mask when nothing is padded, the mask function must say which slots
    are filled)."""
    model = build(ATTENTION_MODELS[name], device, torch.float32)
    ids, mask = inputs(device, seqlen=7, pad=pad)
    kw = dict(
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
        cache_implementation=cache,
    )
    with torch.no_grad():
        model.set_attn_implementation("eager")
        want = model.generate(ids, **kw)
        model.set_attn_implementation(fst.ATTN_IMPLEMENTATION)
        got = model.generate(ids, **kw)
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------------
# The routes inside the attention function
# ---------------------------------------------------------------------------------------------


def fake_varlen(calls: list[Any]) -> Any:
    """A stand-in for flash_attn_varlen_func (flash-attn's signature) computed sequence by
    sequence with flash_attn_func: checks the packing the integration hands it."""

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False, **kw):
        calls.append((cu_q.tolist(), cu_k.tolist(), max_q, max_k))
        assert cu_q.dtype == cu_k.dtype == torch.int32
        out = torch.full_like(q, float("nan"))
        for b in range(len(cu_q) - 1):
            qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
            out[qs:qe] = flashscan.flash_attn_func(
                q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], softmax_scale, causal, **kw
            )[0]
        return out

    return varlen


@pytest.mark.parametrize("pad", ["left", "right"])
def test_padding_goes_through_varlen_when_flashscan_has_it(monkeypatch: Any, pad: str) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(flashscan, "flash_attn_varlen_func", fake_varlen(calls), raising=False)
    model = build(mistral, "cpu", torch.float32)
    ids, mask = inputs("cpu", pad=pad)
    base = logits(model, None, ids, mask)
    got = logits(model, fst.ATTN_IMPLEMENTATION, ids, mask)
    assert calls, "varlen was not called for a padded batch"
    assert calls[0][0] == [0, 13, 23, 30] and calls[0][2] == 13
    keep = mask.bool()
    torch.testing.assert_close(got[keep], base[keep], atol=1e-5, rtol=1e-5)


def test_decode_with_left_padding_uses_the_kvcache_kernel(monkeypatch: Any) -> None:
    seen: list[Any] = []
    real = flashscan.flash_attn_with_kvcache

    def spy(*a: Any, **kw: Any) -> Any:
        seen.append(kw.get("cache_leftpad"))
        return real(*a, **kw)

    monkeypatch.setattr(flashscan, "flash_attn_with_kvcache", spy)
    model = build(llama, "cpu", torch.float32)
    ids, mask = inputs("cpu", seqlen=7, pad="left")
    model.set_attn_implementation(fst.ATTN_IMPLEMENTATION)
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
    pads = [p for p in seen if p is not None]
    assert pads and pads[0].tolist() == [0, 3, 6]


def test_packed_sequences_fall_back_to_the_masked_path() -> None:
    """One row holding two sequences (position_ids restart, no attention mask): transformers
    builds a block-diagonal mask that the kernels cannot express; the result must still
    equal eager's (with a warning), never attend across the boundary."""
    model = build(llama, "cpu", torch.float32)
    ids = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        model.set_attn_implementation("eager")
        want = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        model.set_attn_implementation(fst.ATTN_IMPLEMENTATION)
        _hf_attention._warned_math = False
        with pytest.warns(UserWarning, match="plain torch attention"):
            got = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # and the boundary matters: one causal row differs
        model.set_attn_implementation("eager")
        plain = model(input_ids=ids, position_ids=pos, use_cache=True).logits  # not packed
    assert not torch.allclose(plain[0, 5:], want[0, 5:], atol=1e-3)


def test_dropout_is_refused() -> None:
    model = build(llama, "cpu", torch.float32)
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    model.train()
    model.set_attn_implementation(fst.ATTN_IMPLEMENTATION)
    ids, mask = inputs("cpu")
    with pytest.raises(flashscan.UnsupportedError, match="dropout"):
        model(input_ids=ids, attention_mask=mask)


def test_bad_head_dim_gets_the_core_error() -> None:
    q = torch.randn(1, 2, 5, 12)  # head dim 12: not a multiple of 8
    module = torch.nn.Module()
    module.is_causal = True  # type: ignore[attr-defined]
    with pytest.raises((ValueError, flashscan.UnsupportedError), match="head"):
        _hf_attention.attention_forward(module, q, q, q, None)


# ---------------------------------------------------------------------------------------------
# Mamba
# ---------------------------------------------------------------------------------------------


MAMBA = "transformers.models.mamba.modeling_mamba"


@pytest.fixture
def flashscan_mamba() -> Any:
    """use_flashscan_kernels on a Mamba model, undone after the test (it rebinds module
    globals); counts the calls into flashscan's scan ops."""
    calls = {"scan": 0, "step": 0}
    real_scan, real_step = flashscan.selective_scan_fn, flashscan.selective_state_update

    def scan(*a: Any, **kw: Any) -> Any:
        calls["scan"] += 1
        return real_scan(*a, **kw)

    def step(*a: Any, **kw: Any) -> Any:
        calls["step"] += 1
        return real_step(*a, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(flashscan, "selective_scan_fn", scan)
    mp.setattr(flashscan, "selective_state_update", step)
    yield calls
    mp.undo()
    fst._hf_mamba.uninstall(MAMBA)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad", [None, "left"])
def test_mamba_logits_match_torch_path(flashscan_mamba: Any, pad: str | None, device: str) -> None:
    dtype = half_dtype(device)
    model = build(mamba, device, dtype)
    ids, mask = inputs(device, pad=pad)
    ref = reference(model, ids, mask)
    base = logits(model, None, ids, mask)
    served = fst.use_flashscan_kernels(model)
    assert served["modeling_mamba.mamba_selective_scan"]
    assert served["modeling_mamba.mamba_selective_state_update"]
    got = logits(model, None, ids, mask)
    assert flashscan_mamba["scan"] == 2  # one per layer
    assert_rule(got, ref, base, mask, slack=1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad", [None, "left"])
def test_mamba_generate_matches_torch_path(
    flashscan_mamba: Any, pad: str | None, device: str
) -> None:
    model = build(mamba, device, torch.float32)
    ids, mask = inputs(device, seqlen=9, pad=pad)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = model.generate(ids, **kw)
        fst.use_flashscan_kernels(model)
        got = model.generate(ids, **kw)
    assert flashscan_mamba["scan"] > 0 and flashscan_mamba["step"] > 0
    assert torch.equal(got, want)


def test_use_flashscan_kernels_undo_and_errors(flashscan_mamba: Any) -> None:
    import importlib

    mod = importlib.import_module(MAMBA)
    original = mod.mamba_selective_scan
    model = build(mamba, "cpu", torch.float32)
    fst.use_flashscan_kernels(model)
    assert mod.mamba_selective_scan is not original
    fst.use_flashscan_kernels(model)  # idempotent: the original stays remembered
    report = fst.use_flashscan_kernels(model, enable=False)
    assert mod.mamba_selective_scan is original
    assert not any(report.values())
    with pytest.raises(ValueError, match="set_attn_implementation"):
        fst.use_flashscan_kernels(build(llama, "cpu", torch.float32))


MAMBA2 = "transformers.models.mamba2.modeling_mamba2"


def mamba2(chunk_size: int = 8) -> Any:
    cfg = transformers.Mamba2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        state_size=8,
        num_hidden_layers=2,
        expand=2,
        head_dim=16,
        num_heads=4,
        n_groups=2,
        conv_kernel=4,
        chunk_size=chunk_size,
    )
    return transformers.Mamba2ForCausalLM(cfg)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [8, 64])
def test_mamba2_on_flashscan(flashscan_mamba: Any, device: str, chunk: int) -> None:
    """Mamba-2: the SSD prefill is flashscan's `mamba_chunk_scan_combined` (on CUDA for the
    chunk sizes its kernels cover, 64 here; chunk 8 there goes to transformers' own code per
    call; on the CPU the reference takes any), the decode state update flashscan's
    (multi-head state, stride-0 A / D / dt_bias as the mixer passes them). Greedy tokens equal
    transformers' own; the prefill's logits follow the correctness rule."""
    calls = {"ssd": 0}
    real_ssd = flashscan.mamba_chunk_scan_combined

    def ssd(*a: Any, **kw: Any) -> Any:
        calls["ssd"] += 1
        return real_ssd(*a, **kw)

    model = build(lambda: mamba2(chunk), device, torch.float32)
    ids, mask = inputs(device, seqlen=9)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    mp = pytest.MonkeyPatch()
    mp.setattr(flashscan, "mamba_chunk_scan_combined", ssd)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = model.generate(ids, **kw)
            want_logits = model(ids, attention_mask=mask).logits
            served = fst.use_flashscan_kernels(model)
            got = model.generate(ids, **kw)
            got_logits = model(ids, attention_mask=mask).logits
    finally:
        fst._hf_mamba.uninstall(MAMBA2)
        mp.undo()
    assert served["modeling_mamba2.mamba2_selective_state_update"]
    assert served["modeling_mamba2.mamba2_chunk_scan"]
    on_kernels = device == "cpu" or chunk == 64
    # two layers, a prefill in generate and one plain forward
    assert calls["ssd"] == (2 * 2 if on_kernels else 0)
    assert flashscan_mamba["step"] == 2 * 5  # layers x decode steps after the prefill
    assert torch.equal(got, want)
    err = (got_logits - want_logits).abs().max().item()
    assert err <= 1e-4 * max(1.0, want_logits.abs().max().item()), err


def test_state_update_adapter_keeps_a_low_precision_cache_in_step() -> None:
    """A cache state that is not float32 is stepped through a float32 copy and written back."""
    import importlib

    mod = importlib.import_module(MAMBA)
    torch.manual_seed(3)
    b, d, n = 2, 8, 4
    state = torch.randn(b, d, n, dtype=torch.float64).to(torch.bfloat16)
    args = (
        torch.randn(b, d),
        torch.randn(b, d),
        -torch.rand(d, n) - 0.5,
        torch.randn(b, n),
        torch.randn(b, n),
        torch.randn(d),
    )
    want_state = state.clone()
    want = mod.mamba_selective_state_update(want_state, *args, dt_softplus=True)
    ours = fst._hf_mamba.KERNELS[MAMBA]["mamba_selective_state_update"]()
    got_state = state.clone()
    got = ours(got_state, *args, dt_softplus=True)
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got_state, want_state, atol=1e-2, rtol=1e-2)
    assert not torch.equal(got_state, state)


def test_a_padding_mask_is_read_once_per_forward_not_per_layer(monkeypatch: Any) -> None:
    """Each host read of the mask is a GPU synchronisation: the layers of one forward share
    one plan; a mask changed in place gets a new one."""
    made: list[Any] = []
    real = _hf_attention._PaddingPlan

    def counting(*a: Any) -> Any:
        made.append(a)
        return real(*a)

    monkeypatch.setattr(_hf_attention, "_PaddingPlan", counting)
    model = build(llama, "cpu", torch.float32)  # two layers
    ids, mask = inputs("cpu", pad="right")
    logits(model, fst.ATTN_IMPLEMENTATION, ids, mask)
    assert len(made) == 1
    m = made[0][0]
    q = torch.randn(3, 13, 4, 16)
    kv = torch.randn(3, 13, 2, 16)
    a = _hf_attention._padded(q, kv, kv, m, 0.25, True, (-1, -1), 0.0)
    m[1, :] = True  # in place: row 1 is no longer padded
    b = _hf_attention._padded(q, kv, kv, m, 0.25, True, (-1, -1), 0.0)
    assert len(made) == 2  # the forward's plan served `a`; the changed mask got its own
    assert torch.equal(a[0], b[0]) and not torch.equal(a[1], b[1])


@pytest.mark.parametrize("pad", [None, "right"])
def test_training_gradients_match_eager(pad: str | None) -> None:
    """A training step (dropout 0): the loss's gradients through flashscan's attention (its
    backward through flashscan.torch, the padding gather / scatter through torch) equal
    eager's."""
    model = build(llama, "cpu", torch.float32)
    model.train()
    ids, mask = inputs("cpu", pad=pad)
    labels = ids.masked_fill(mask == 0, -100)
    grads = {}
    for impl in ("eager", fst.ATTN_IMPLEMENTATION):
        model.zero_grad()
        model.set_attn_implementation(impl)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads[impl] = [p.grad.clone() for p in model.parameters()]
    for got, want in zip(grads[fst.ATTN_IMPLEMENTATION], grads["eager"]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_an_op_flashscan_gains_later_joins_the_hook(monkeypatch: Any) -> None:
    """The conv1d / SSD entries take flashscan's op as soon as the package has it (here a
    stand-in with causal-conv1d's signature), passing only the keyword arguments it takes."""
    import importlib

    seen: list[Any] = []

    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, activation=None):  # noqa: ANN001
        seen.append(activation)
        return original(x, weight, bias, activation=activation)

    mod = importlib.import_module(MAMBA)
    original = mod.causal_conv1d_fn
    monkeypatch.setattr(flashscan, "causal_conv1d_fn", causal_conv1d_fn, raising=False)
    model = build(mamba, "cpu", torch.float32)
    ids, mask = inputs("cpu")
    want = logits(model, None, ids, mask)
    try:
        served = fst.use_flashscan_kernels(model)
        assert served["modeling_mamba.causal_conv1d_fn"]
        with torch.no_grad():  # an extra keyword the op does not take is dropped
            got = model(input_ids=ids, attention_mask=mask, unused_kwarg=1).logits
    finally:
        fst._hf_mamba.uninstall(MAMBA)
    assert seen == ["silu", "silu"]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
