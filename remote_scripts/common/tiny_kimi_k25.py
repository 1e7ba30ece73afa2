"""A toy Kimi-K2.5 for make_tiny_verifier.py (`--arch kimi-k2.5`): the architecture our users train
drafts for, at a size that trains on 2 CPU cores.

transformers' Kimi_K25ForConditionalGeneration: a minimal vision tower and projector (the
pipeline is text-only) around a small DeepSeek-V3 MoE text model under `text_config`. Two
checkpoint layouts (`--layout`): `save_pretrained`, what transformers writes, and `released`,
the released model's on-disk names and config; the builder loads either back and checks that
it is the same model before reporting success. The model's shape and the layouts' names:
docs/architecture/common-modules.md, common/tiny_kimi_k25.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

ARCH = "kimi-k2.5"
LAYOUTS = ("save_pretrained", "released")
# Token ids past the tokenizer for the media placeholders (image, video, vision start/end): no text
# token may equal them, or the model looks for image features.
MEDIA_TOKENS = 4


@dataclass(frozen=True)
class KimiSpec:
    hidden_size: int = 128
    num_layers: int = 8
    num_heads: int = 4
    intermediate_size: int = 256  # the dense first layer
    moe_intermediate_size: int = 64
    routed_experts: int = 4
    shared_experts: int = 1
    experts_per_token: int = 2
    q_lora_rank: int = 48
    kv_lora_rank: int = 32
    rope_head_dim: int = 16
    nope_head_dim: int = 16
    max_positions: int = 512


def text_config_dict(spec: KimiSpec, tokenizer) -> dict:
    vocab = len(tokenizer) + MEDIA_TOKENS
    return {
        "model_type": "deepseek_v3",
        "vocab_size": vocab,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_heads,
        "n_routed_experts": spec.routed_experts,
        "n_shared_experts": spec.shared_experts,
        "num_experts_per_tok": spec.experts_per_token,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_rope_head_dim": spec.rope_head_dim,
        "qk_nope_head_dim": spec.nope_head_dim,
        "v_head_dim": spec.nope_head_dim,
        "max_position_embeddings": spec.max_positions,
        # YaRN as Kimi-K2 ships it (scaled down): the released config says it with rope_scaling.
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": spec.max_positions // 4, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        "rope_theta": 50000.0,
        "rms_norm_eps": 1e-6,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,  # speculators loads lm_head.weight from the checkpoint
    }


def build_model(spec: KimiSpec, tokenizer, seed: int):
    import torch
    from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    torch.manual_seed(seed)
    text = text_config_dict(spec, tokenizer)
    media = list(range(len(tokenizer), text["vocab_size"]))
    config = Kimi_K25Config(
        text_config=text,
        # The smallest vision tower the class builds: present so the layout is the real one.
        vision_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64, "pos_emb_height": 4, "pos_emb_width": 4, "pos_emb_time": 1},
        projection_hidden_size=32,
        image_token_id=media[0],
        video_token_id=media[1],
        vision_start_token_id=media[2],
        vision_end_token_id=media[3],
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    config._attn_implementation = "sdpa"
    model = Kimi_K25ForConditionalGeneration(config)
    model.config.pad_token_id = tokenizer.pad_token_id  # make_tiny_verifier's training pads with it
    return model


def save(model, out: Path, layout: str) -> None:
    """Write `model` to `out` in `layout`; the released layout is checked to load back as `model`."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} (layouts: {', '.join(LAYOUTS)})")
    model.save_pretrained(out)
    if layout == "released":
        to_released_layout(out)
        check_same_model(model, out)


def to_released_layout(out: Path) -> None:
    """Rewrite a save_pretrained directory in place with the released checkpoint's names."""
    from safetensors.torch import load_file, save_file

    weights = out / "model.safetensors"
    tensors = load_file(str(weights))
    renamed = {released_key(k): v for k, v in tensors.items()}
    if len(renamed) != len(tensors):
        raise RuntimeError("two weights map to one released name")
    tmp = out / "model.safetensors.tmp"
    save_file(renamed, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, weights)

    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = ["KimiK25ForConditionalGeneration"]
    text = cfg["text_config"]
    text["model_type"] = "kimi_k2"
    text["architectures"] = ["DeepseekV3ForCausalLM"]
    rope = text.pop("rope_parameters", None) or {}
    text["rope_theta"] = rope.pop("rope_theta", 50000.0)
    if rope.get("rope_type") == "yarn":
        rope.pop("rope_type")
        text["rope_scaling"] = {"type": "yarn", **rope}
    tmp = cfg_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(cfg, indent=2))
    os.replace(tmp, cfg_path)


def released_key(key: str) -> str:
    """transformers 5.19's save name -> the released checkpoint's name (text layers are `layers`)."""
    key = key.replace("language_model.model.blocks.", "language_model.model.layers.")
    if key.startswith("model.mm_projector."):
        key = key.removeprefix("model.")
    return key


def check_same_model(model, out: Path) -> None:
    """The released layout must load (through the verifier loader every stage uses) to the very
    weights and logits of `model`: a renamed key that transformers does not map back would load
    as a fresh random tensor with only a warning."""
    import torch

    from common.verifier import load_verifier

    loaded = load_verifier(str(out), device="cpu", dtype=torch.float32)
    if type(loaded.config.text_config).__name__ != "DeepseekV3Config":
        raise RuntimeError(f"released layout: text_config loaded as {type(loaded.config.text_config).__name__}")
    mine, theirs = model.state_dict(), loaded.state_dict()
    differing = [k for k, v in mine.items() if k not in theirs or not torch.equal(v, theirs[k])]
    if differing:
        raise RuntimeError(f"released layout loads other weights for {len(differing)} tensors, e.g. {differing[:3]}")
    ids = torch.arange(1, 17)[None]
    model.eval()
    with torch.no_grad():
        if not torch.allclose(model(input_ids=ids).logits, loaded(input_ids=ids).logits, atol=1e-5):
            raise RuntimeError("released layout: same weights, other logits (config converted wrongly?)")
