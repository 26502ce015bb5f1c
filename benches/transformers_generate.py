#!/usr/bin/env python3
"""transformers models on flashscan, end to end: greedy `generate` tokens/s and prefill
tokens/s of random-weight models (no downloads) with attn_implementation = flashscan's
("fscan"), "sdpa" and "eager"; and MambaForCausalLM / Mamba2ForCausalLM with
`use_flashscan_kernels` against transformers' torch path (and mamba_ssm when it is installed:
it is what transformers binds then), in one run on this GPU.

    python benches/transformers_generate.py [--quick] [--out DIR]

Each row is checked before its times count, by the correctness rule at model scale: a float32
copy of the model (eager attention; Mamba's torch path) is run teacher-forced over the tokens the
row generated, and the row's per-step logits (the prefill's last position, then every decode step
through the KV cache / SSM state) must lie within 2x the error of the plain bf16 implementation
("eager", or Mamba's torch path, checked the same way over its own tokens) plus 1e-3 of the largest
reference logit; else the row prints FAILED. Greedy tokens of random-weight models hit near-ties
that flip under any bf16 rounding, so token agreement with the baseline is printed as information
only. Times: wall clock of the whole `generate` call after a warm-up call (CUDA synchronised),
median of 3; tokens/s counts new tokens of all rows.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch
import transformers

import flashscan
from flashscan.integrations import transformers as fst

VOCAB = 32000


def llama(hidden: int, layers: int, heads: int, kv_heads: int, window: int | None) -> Any:
    cls, cfg_cls = (
        (transformers.MistralForCausalLM, transformers.MistralConfig)
        if window
        else (transformers.LlamaForCausalLM, transformers.LlamaConfig)
    )
    kw = {"sliding_window": window} if window else {}
    cfg = cfg_cls(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=16384,
        **kw,
    )
    return cls(cfg)


def mamba(hidden: int, layers: int) -> Any:
    cfg = transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=hidden, state_size=16, num_hidden_layers=layers
    )
    return transformers.MambaForCausalLM(cfg)


def mamba2(hidden: int, layers: int) -> Any:
    cfg = transformers.Mamba2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        state_size=128,
        num_hidden_layers=layers,
        expand=2,
        head_dim=64,
        num_heads=2 * hidden // 64,
        n_groups=1,
        chunk_size=256,
    )
    return transformers.Mamba2ForCausalLM(cfg)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], reps: int = 3) -> tuple[float, Any]:
    out = fn()  # warm-up: kernel compiles, allocator
    times = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def generate(model: Any, ids: Any, new: int, logits: bool = False) -> Any:
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
            output_logits=logits,
            return_dict_in_generate=logits,
        )


def prefill(model: Any, ids: Any) -> Any:
    with torch.no_grad():
        return model(input_ids=ids, logits_to_keep=1).logits


def logits_error(reference: Any, out: Any, prompt: int) -> tuple[float, float]:
    """Max |step logits - float32 reference| over every generated step, and the reference's
    max |logit|: the reference reads the row's own tokens (teacher forcing), so a row is judged
    on the positions it produced even after its tokens part from another row's."""
    steps = torch.stack([t.float() for t in out.logits], dim=1)  # (batch, new, vocab)
    seq = out.sequences
    with torch.no_grad():
        ref = reference(
            input_ids=seq[:, :-1],
            attention_mask=torch.ones_like(seq[:, :-1]),
            logits_to_keep=seq.shape[1] - prompt,
        ).logits.float()
    return float((steps - ref).abs().max()), float(ref.abs().max())


def run_model(
    name: str,
    model: Any,
    reference: Any,
    impls: list[tuple[str, Callable[[], None]]],
    batch: int,
    prompt: int,
    new: int,
) -> list[dict[str, Any]]:
    """The first impl is the plain bf16 baseline of the correctness rule."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (batch, prompt), generator=g).to(model.device)
    rows: list[dict[str, Any]] = []
    first, base_err = None, None
    for impl, switch in impls:
        switch()
        try:
            checked = generate(model, ids, new, logits=True)
            err, scale = logits_error(reference, checked, prompt)
            switch()  # the reference may have switched the Mamba hook off
            t_gen, out = timed(lambda: generate(model, ids, new))
            t_pre, _ = timed(lambda: prefill(model, ids))
        except Exception as e:  # a peer that cannot run this shape: say so, go on
            rows.append({"model": name, "impl": impl, "error": f"{type(e).__name__}: {e}"})
            print(f"{name:34s} {impl:10s} ERROR {type(e).__name__}: {e}", flush=True)
            continue
        new_tokens = out[:, prompt:]
        if first is None:
            first, base_err = new_tokens, err
        bound = 2.0 * base_err + 1e-3 * scale
        ok = bool(torch.isfinite(torch.tensor(err))) and err <= bound
        same = int((new_tokens == first).sum())
        row = {
            "model": name,
            "impl": impl,
            "batch": batch,
            "prompt": prompt,
            "new": new,
            "generate_s": t_gen,
            "decode_tok_s": batch * new / t_gen,
            "prefill_tok_s": batch * prompt / t_pre,
            "logits_max_err": err,
            "logits_bound": bound,
            "tokens_agree": f"{same}/{new_tokens.numel()}",
            "check": "ok" if ok else "FAILED",
        }
        rows.append(row)
        print(
            f"{name:34s} {impl:10s} generate {row['decode_tok_s']:9.1f} tok/s  "
            f"prefill {row['prefill_tok_s']:11.1f} tok/s  logits err {err:.2e} "
            f"(bound {bound:.2e})  tokens as baseline {row['tokens_agree']:>9s}  {row['check']}",
            flush=True,
        )
    return rows


class Float32Reference:
    """A float32 copy of the model run with eager attention, or Mamba's torch path (the Mamba
    hook acts on the modeling module, so it is switched off around each reference call and the
    row's own setting put back after)."""

    def __init__(self, model: Any, mamba_model: bool) -> None:
        self.model = copy.deepcopy(model).float()
        self.mamba = mamba_model
        if not mamba_model:
            self.model.set_attn_implementation("eager")

    def __call__(self, **kw: Any) -> Any:
        if self.mamba:
            fst.use_flashscan_kernels(self.model, enable=False)
        return self.model(**kw)


def attention_impls(model: Any) -> list[tuple[str, Callable[[], None]]]:
    return [
        (impl, lambda impl=impl: model.set_attn_implementation(impl))
        for impl in ("eager", "sdpa", fst.ATTN_IMPLEMENTATION)
    ]


def mamba_impls(model: Any) -> list[tuple[str, Callable[[], None]]]:
    def torch_path() -> None:
        fst.use_flashscan_kernels(model, enable=False)

    def ours() -> None:
        fst.use_flashscan_kernels(model)

    return [("torch", torch_path), ("flashscan", ours)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes, fewer tokens")
    ap.add_argument("--out", help="write results.json here")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not flashscan.available():
        sys.exit(f"needs a GPU flashscan can use: {flashscan.info()['reason']}")
    torch.manual_seed(0)
    new = 32 if args.quick else 128
    # (label, factory, [(batch, prompt)])
    cases: list[tuple[str, Callable[[], Any], list[tuple[int, int]]]] = [
        (
            "llama 24x1024 h16 kv8",
            lambda: llama(1024, 24, 16, 8, None),
            [(1, 512), (8, 2048)] if not args.quick else [(1, 512)],
        ),
        (
            "mistral 24x1024 h16 kv8 window 1024",
            lambda: llama(1024, 24, 16, 8, 1024),
            [(4, 4096)] if not args.quick else [(2, 2048)],
        ),
        # transformers' torch scan is a Python loop over time steps: prompts kept moderate
        (
            "mamba 24x768",
            lambda: mamba(768, 24),
            [(1, 512), (8, 1024)] if not args.quick else [(1, 512)],
        ),
        (
            "mamba2 24x768",
            lambda: mamba2(768, 24),
            [(1, 512), (8, 1024)] if not args.quick else [(1, 512)],
        ),
    ]
    rows: list[dict[str, Any]] = []
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, flashscan {flashscan.__version__}, transformers {transformers.__version__}")
    for label, factory, shapes in cases:
        is_mamba = label.startswith("mamba")
        model = factory().to(device="cuda", dtype=torch.bfloat16).eval()
        reference = Float32Reference(model, is_mamba)
        impls = mamba_impls(model) if is_mamba else attention_impls(model)
        for batch, prompt in shapes:
            n = new if not args.quick else min(new, 32)
            label_b = f"{label} b{batch} p{prompt}"
            rows += run_model(label_b, model, reference, impls, batch, prompt, n)
        del model, reference
        torch.cuda.empty_cache()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        meta = {
            "device": dev,
            "commit": os.environ.get("FLASHSCAN_COMMIT", "unknown"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
