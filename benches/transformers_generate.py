#!/usr/bin/env python3
"""transformers models on flashscan, end to end: greedy `generate` tokens/s and prefill
tokens/s of random-weight models (no downloads) with attn_implementation = flashscan's
("fscan"), "sdpa" and "eager"; and MambaForCausalLM with `use_flashscan_kernels` against
transformers' torch path (and mamba_ssm when it is installed: it is what transformers binds
then), in one run on this GPU.

    python benches/transformers_generate.py [--quick] [--out DIR]

Each row is checked before it is timed: the greedy tokens of every implementation must equal
those of the first one of its model ("eager", or Mamba's torch path) over the first 16 new
tokens (bf16: a later near-tie may flip a token legitimately; the check prints how many of all
new tokens agree), else the row prints FAILED. Times: wall clock of the whole `generate` call
after a warm-up call (CUDA synchronised), median of 3; tokens/s counts new tokens of all rows.
"""

from __future__ import annotations

import argparse
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
CHECK_TOKENS = 16


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


def generate(model: Any, ids: Any, new: int) -> Any:
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )


def prefill(model: Any, ids: Any) -> Any:
    with torch.no_grad():
        return model(input_ids=ids, logits_to_keep=1).logits


def run_model(
    name: str,
    model: Any,
    impls: list[tuple[str, Callable[[], None]]],
    batch: int,
    prompt: int,
    new: int,
) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (batch, prompt), generator=g).to(model.device)
    rows, first = [], None
    for impl, switch in impls:
        switch()
        try:
            t_gen, out = timed(lambda: generate(model, ids, new))
            t_pre, _ = timed(lambda: prefill(model, ids))
        except Exception as e:  # a peer that cannot run this shape: say so, go on
            rows.append({"model": name, "impl": impl, "error": f"{type(e).__name__}: {e}"})
            print(f"{name:34s} {impl:10s} ERROR {type(e).__name__}: {e}", flush=True)
            continue
        new_tokens = out[:, prompt:]
        if first is None:
            first = new_tokens
        same = int((new_tokens == first).sum())
        ok = torch.equal(new_tokens[:, :CHECK_TOKENS], first[:, :CHECK_TOKENS])
        row = {
            "model": name,
            "impl": impl,
            "batch": batch,
            "prompt": prompt,
            "new": new,
            "generate_s": t_gen,
            "decode_tok_s": batch * new / t_gen,
            "prefill_tok_s": batch * prompt / t_pre,
            "tokens_agree": f"{same}/{new_tokens.numel()}",
            "check": "ok" if ok else "FAILED",
        }
        rows.append(row)
        print(
            f"{name:34s} {impl:10s} generate {row['decode_tok_s']:9.1f} tok/s  "
            f"prefill {row['prefill_tok_s']:11.1f} tok/s  agree {row['tokens_agree']:>9s}  "
            f"{row['check']}",
            flush=True,
        )
    return rows


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
    ]
    rows: list[dict[str, Any]] = []
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, flashscan {flashscan.__version__}, transformers {transformers.__version__}")
    for label, factory, shapes in cases:
        model = factory().to(device="cuda", dtype=torch.bfloat16).eval()
        impls = mamba_impls(model) if label.startswith("mamba") else attention_impls(model)
        for batch, prompt in shapes:
            n = new if not args.quick else min(new, 32)
            rows += run_model(f"{label} b{batch} p{prompt}", model, impls, batch, prompt, n)
        del model
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
