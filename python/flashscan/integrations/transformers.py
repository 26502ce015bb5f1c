"""Run Hugging Face transformers models on flashscan's kernels: one line per model.

    from flashscan.integrations.transformers import ATTN_IMPLEMENTATION, use_flashscan_kernels

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=ATTN_IMPLEMENTATION)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)     # or switch a loaded model
    use_flashscan_kernels(mamba_model)                      # Mamba: selective scan / state update

Attention: importing this module registers flashscan's attention with transformers'
`AttentionInterface` and a matching mask function with `AttentionMaskInterface`, under the
name `ATTN_IMPLEMENTATION` ("fscan": transformers routes any name containing "flash" to its own
flash-attention / hub-kernel loader). Causal masking and sliding windows come from the
attention module's own arguments; padding goes through flashscan's varlen attention when this
flashscan has `flash_attn_varlen_func`, else one kernel call per sequence; decode steps run the
split-KV decode kernel. Masks beyond causal / window / padding (packed sequences in one row,
chunked attention, custom mask functions, a 4D mask passed in) run a plain torch attention,
with one warning: never a silently different result. Softcap (Gemma-2), GQA / MQA, custom
scaling and MLA-style smaller value head dims are served; dropout must be 0.

Mamba: `use_flashscan_kernels(model)` points the kernel entry points of the model's modeling
module at flashscan (see `_hf_mamba` for where transformers takes them):
MambaForCausalLM's selective scan and decode state update, Mamba2ForCausalLM's decode state
update. The causal conv1d (both) and Mamba-2's SSD chunk scan stay on what transformers
picked (causal-conv1d / mamba_ssm when installed, else its torch code) until flashscan ships
them, at which point the hook takes them with no change here.

CPU tensors run through flashscan's NumPy references (slow, exact): the same code runs in CI.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from . import _hf_mamba
from ._hf_attention import attention_forward, mask_function

__all__ = [
    "ATTN_IMPLEMENTATION",
    "attention_forward",
    "mask_function",
    "register",
    "use_flashscan_kernels",
]

ATTN_IMPLEMENTATION = "fscan"


def register(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register flashscan's attention and mask functions with transformers under `name`
    (done at import for ATTN_IMPLEMENTATION); returns the name."""
    if "flash" in name:
        raise ValueError(
            f"name={name!r}: transformers sends names containing 'flash' to its own "
            "flash-attention loader; choose another"
        )
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_function)
    return name


register()

# the model classes whose mixers call module-level kernel entry points, and that module
_MAMBA_MODULES = {
    "MambaMixer": "transformers.models.mamba.modeling_mamba",
    "Mamba2Mixer": "transformers.models.mamba2.modeling_mamba2",
}


def use_flashscan_kernels(model: torch.nn.Module, enable: bool = True) -> dict[str, bool]:
    """Make the model's Mamba mixers run on flashscan's kernels (enable=False puts
    transformers' own functions back). Acts on the modeling module, so on every model of the
    same class in the process. Returns {"<module>.<function>": served by flashscan?}.
    Raises ValueError for a model with no mixer this hook knows."""
    found = {
        _MAMBA_MODULES[type(m).__name__]
        for m in model.modules()
        if type(m).__name__ in _MAMBA_MODULES
        and type(m).__module__ == _MAMBA_MODULES[type(m).__name__]
    }
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no Mamba mixer flashscan knows "
            f"({', '.join(sorted(_MAMBA_MODULES))}); for attention models use "
            f"model.set_attn_implementation({ATTN_IMPLEMENTATION!r})"
        )
    report: dict[str, Any] = {}
    for module_name in sorted(found):
        if enable:
            served = _hf_mamba.install(module_name)
        else:
            _hf_mamba.uninstall(module_name)
            served = _hf_mamba.installed(module_name)
        short = module_name.rsplit(".", 1)[-1]
        report.update({f"{short}.{fn}": ok for fn, ok in served.items()})
    return report
