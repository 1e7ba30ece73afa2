"""Load a verifier and find the parts the EAGLE-3 stages need, for plain and nested (multimodal) models.

Used by extract_hidden_states.py (hooks on the decoder layers) and meant for train/evaluate too:

    from common.verifier import load_verifier, locate_decoder, text_config, default_target_layers

    model = load_verifier(path, device="cuda:0")         # dtype aligned: bf16 on GPU, fp32 on CPU
    parts = locate_decoder(model)                        # works for Llama and for text_config nesting
    parts.layers[i], parts.norm, parts.text_model, parts.embed_tokens, parts.lm_head
    layers = default_target_layers(parts.num_layers)     # [2, N//2, N-3], speculators' default

Why these guards exist (nested text models, the final norm, one dtype rule for every stage):
docs/architecture/common-modules.md, common/verifier.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# Where decoder stacks live, most common first. Each entry is the text model that owns `.layers`
# and the final norm. Anything else is found by `_search_decoder`.
TEXT_MODEL_PATHS = [
    "model",  # LlamaForCausalLM, Qwen2/3, Mistral, DeepSeek (model.layers)
    "model.language_model",  # Qwen2/2.5/3-VL in transformers >= 4.52, Llama4, Gemma3 (model.language_model.layers)
    "language_model.model",  # older VL wrappers, Kimi-K2.5 style (language_model.model.layers)
    "model.language_model.model",
    "language_model",
    "model.text_model",
    "transformer",  # GPT-2 / Falcon style (h instead of layers is handled by LAYER_NAMES)
]
LAYER_NAMES = ["layers", "h", "blocks"]
NORM_NAMES = ["norm", "final_layernorm", "ln_f", "final_norm"]


@dataclass
class DecoderParts:
    """The verifier's text decoder: what hooks and the draft need."""

    text_model: nn.Module  # the module whose forward runs embeddings -> layers -> norm
    layers: nn.ModuleList
    norm: nn.Module  # the final norm; its INPUT is the pre-norm last hidden state
    embed_tokens: nn.Module
    lm_head: nn.Module | None
    path: str  # dotted path of text_model inside the loaded model, for messages

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def text_config(config: Any) -> Any:
    """The language model's config: `config.text_config` when the model nests one, else `config`."""
    nested = getattr(config, "text_config", None)
    return nested if nested is not None else config


def load_text_config(path: str, trust_remote_code: bool = False) -> Any:
    """The verifier's language-model config, read without its weights."""
    from transformers import AutoConfig

    return text_config(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))


def num_hidden_layers(config: Any) -> int:
    return int(text_config(config).num_hidden_layers)


def hidden_size(config: Any) -> int:
    return int(text_config(config).hidden_size)


def default_target_layers(num_layers: int) -> list[int]:
    """speculators' default auxiliary layers (speculators.models.utils.resolve_target_layer_ids)."""
    return [2, num_layers // 2, num_layers - 3]


def check_target_layers(layer_ids: list[int], num_layers: int) -> list[int]:
    """Distinct ids in [0, N]; id i means "the input of decoder layer i" (N: the pre-norm output of the last)."""
    if not layer_ids or len(set(layer_ids)) != len(layer_ids) or min(layer_ids) < 0 or max(layer_ids) > num_layers:
        raise ValueError(f"target layers {layer_ids} must be distinct and within [0, {num_layers}] for a verifier with {num_layers} layers")
    if num_layers < 7 and layer_ids == default_target_layers(num_layers):
        raise ValueError(f"the default target layers need a verifier with at least 7 layers (this one has {num_layers}); pass --layers")
    return list(layer_ids)


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 kernels (oneDNN's: AVX512 or AMX). Without them bf16 is emulated:
    a draft's training step 30-45x slower than fp32 on an AVX2-only CPU (bench/cpu_train_dtype.py)."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(probe and probe())


def verifier_dtype(device: str | torch.device, requested: str | torch.dtype | None = None) -> torch.dtype:
    """bf16 on accelerators (hidden states are stored bf16 anyway), fp32 on CPU, unless `requested`."""
    if requested not in (None, "auto"):
        return requested if isinstance(requested, torch.dtype) else getattr(torch, str(requested))
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def load_verifier(path: str, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None, attn_implementation: str = "sdpa", trust_remote_code: bool = False) -> nn.Module:
    """The verifier in eval mode on `device`, in `verifier_dtype(device, dtype)`.

    Tries AutoModelForCausalLM, then the image-text-to-text and bare AutoModel classes (nested VL
    verifiers are not always registered as causal LMs). `attn_implementation` is set explicitly
    (sdpa by default: exact, and it takes padding masks).
    """
    import transformers

    from common.quantization import loading_kwargs, read_config

    torch_dtype = verifier_dtype(device, dtype)
    kwargs = {"dtype": torch_dtype, "attn_implementation": attn_implementation, "trust_remote_code": trust_remote_code}
    kwargs.update(loading_kwargs(read_config(path, trust_remote_code)))  # a quantized verifier's (common/quantization.py)
    errors = []
    for cls_name in ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModel"):
        cls = getattr(transformers, cls_name, None)
        if cls is None:
            continue
        try:
            model = cls.from_pretrained(path, **kwargs)
            break
        except ValueError as e:  # "Unrecognized configuration class ..." for this auto class
            errors.append(f"{cls_name}: {e}")
    else:
        raise ValueError(f"cannot load verifier {path}: " + " | ".join(errors))
    return model.to(device).eval()


def locate_decoder(model: nn.Module) -> DecoderParts:
    """Find the text decoder's layers, final norm and embeddings, nested or not."""
    n_expected = None
    config = getattr(model, "config", None)
    if config is not None:
        try:
            n_expected = num_hidden_layers(config)
        except AttributeError:
            pass
    for path in TEXT_MODEL_PATHS:
        owner = _get(model, path)
        parts = _parts_of(owner, path, model) if owner is not None else None
        if parts is not None and (n_expected is None or parts.num_layers == n_expected):
            return parts
    parts = _search_decoder(model, n_expected)
    if parts is None:
        raise ValueError(f"cannot find the decoder layers and final norm in {type(model).__name__} (expected {n_expected} layers)")
    return parts


def _get(root: nn.Module, dotted: str) -> nn.Module | None:
    obj: Any = root
    for name in dotted.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj if isinstance(obj, nn.Module) else None


def _parts_of(owner: nn.Module, path: str, model: nn.Module) -> DecoderParts | None:
    layers = next((getattr(owner, n) for n in LAYER_NAMES if isinstance(getattr(owner, n, None), nn.ModuleList)), None)
    norm = next((getattr(owner, n) for n in NORM_NAMES if isinstance(getattr(owner, n, None), nn.Module)), None)
    if layers is None or norm is None or len(layers) == 0:
        return None
    embed = owner.get_input_embeddings() if hasattr(owner, "get_input_embeddings") else getattr(owner, "embed_tokens", None)
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return DecoderParts(text_model=owner, layers=layers, norm=norm, embed_tokens=embed, lm_head=lm_head, path=path)


def _search_decoder(model: nn.Module, n_expected: int | None) -> DecoderParts | None:
    """Fallback: the shortest-path module owning a ModuleList of the expected length and a norm,
    outside vision/audio towers."""
    candidates = []
    for name, module in model.named_modules():
        if any(t in name for t in ("vision", "visual", "audio", "image")):
            continue
        parts = _parts_of(module, name, model)
        if parts is not None and (n_expected is None or parts.num_layers == n_expected):
            candidates.append(parts)
    return min(candidates, key=lambda p: p.path.count(".")) if candidates else None
