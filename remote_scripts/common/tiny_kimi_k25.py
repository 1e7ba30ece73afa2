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
    kv_lora_rank: int = 32  # as trained; kv_lora_rank and the nope/v head dims are saved widened (SERVED_MLA)
    rope_head_dim: int = 64  # the real model's
    nope_head_dim: int = 16  # and v_head_dim
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
        # What transformers' DeepSeek-V3 router computes; vLLM reads both (its defaults are softmax and no bias).
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
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


# The real model's MLA dimensions, the only ones vLLM serves: a latent cache (kv_lora_rank +
# qk_rope_head_dim) of 576 (vllm_compat.mla_latent_sizes; the only size of its CPU kernel), and on
# Hopper a prefill that takes (qk_nope_head_dim, qk_rope_head_dim, v_head_dim) = (128, 64, 128) among
# a few others. The toy learns its language far slower at those (80 steps: held-out accuracy 0.13
# with a latent of 512, 0.13 with head dims of 128, 0.95 at KimiSpec's), so it trains at KimiSpec's
# and is saved widened to these, computing the same function (widen_attention).
SERVED_MLA = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "v_head_dim": 128}


def widen_attention(model, served: dict[str, int] = SERVED_MLA):
    """The same model with MLA dimensions `served`: every new dimension is zero (kv_a_proj's rows,
    kv_b_proj's and q_b_proj's per-head rows, kv_b_proj's and o_proj's columns); kv_a_layernorm's
    weight is scaled by sqrt(rank / new rank), as the norm now divides by the RMS over more
    dimensions, and q_b_proj's by sqrt(new qk head dim / qk head dim), as the attention's scale
    shrinks with it. Checked: the same logits."""
    import copy
    import math

    import torch

    text = model.config.text_config
    rank, nope, v, rope = text.kv_lora_rank, text.qk_nope_head_dim, text.v_head_dim, text.qk_rope_head_dim
    rank2, nope2, v2 = served["kv_lora_rank"], served["qk_nope_head_dim"], served["v_head_dim"]
    if (rank, nope, v) == (rank2, nope2, v2):
        return model
    if min(rank2 - rank, nope2 - nope, v2 - v) < 0 or text.q_lora_rank is None:
        raise ValueError(f"widen_attention: cannot widen (kv_lora_rank, qk_nope_head_dim, v_head_dim) {(rank, nope, v)} to {(rank2, nope2, v2)}")
    config = copy.deepcopy(model.config)
    wide_text = config.text_config
    wide_text.kv_lora_rank, wide_text.qk_nope_head_dim, wide_text.v_head_dim = rank2, nope2, v2
    wide_text.qk_head_dim = nope2 + rope
    wide = type(model)(config)
    heads = text.num_attention_heads

    def per_head(w, sizes: list[int], wide_sizes: list[int], scale: float = 1.0):
        """Rows of `w`, heads x parts of `sizes`, each part padded with zero rows to `wide_sizes`."""
        parts = w.reshape(heads, sum(sizes), -1).split(sizes, dim=1)
        padded = [torch.cat([p, p.new_zeros(heads, n - p.shape[1], p.shape[2])], dim=1) for p, n in zip(parts, wide_sizes)]
        return torch.cat(padded, dim=1).reshape(heads * sum(wide_sizes), -1) * scale

    trained = model.state_dict()
    state = {}
    for name, target in wide.state_dict().items():
        w = trained[name]
        if name.endswith("kv_a_proj_with_mqa.weight"):  # [latent + rope, hidden]
            w = torch.cat([w[:rank], w.new_zeros(rank2 - rank, w.shape[1]), w[rank:]])
        elif name.endswith("kv_a_layernorm.weight"):
            w = torch.cat([w * math.sqrt(rank / rank2), w.new_zeros(rank2 - rank)])
        elif name.endswith("kv_b_proj.weight"):  # [heads * (nope + v), latent]
            w = per_head(w, [nope, v], [nope2, v2])
            w = torch.cat([w, w.new_zeros(w.shape[0], rank2 - rank)], dim=1)
        elif name.endswith("q_b_proj.weight"):  # [heads * (nope + rope), q latent]
            w = per_head(w, [nope, rope], [nope2, rope], scale=math.sqrt((nope2 + rope) / (nope + rope)))
        elif name.endswith("self_attn.o_proj.weight"):  # [hidden, heads * v]
            w = per_head(w.T, [v], [v2]).T
        if w.shape != target.shape:
            raise RuntimeError(f"widen_attention: {name} is {tuple(w.shape)}, the wide model's {tuple(target.shape)}")
        state[name] = w.contiguous()
    wide.load_state_dict(state)
    ids = torch.arange(1, 17)[None]
    model.eval(), wide.eval()
    with torch.no_grad():
        narrow_logits, wide_logits = model(input_ids=ids).logits, wide(input_ids=ids).logits
    # The norm's epsilon now weighs rank2 / rank times as much: a last-digit difference, nothing more.
    if not torch.allclose(narrow_logits, wide_logits, atol=1e-4, rtol=1e-4):
        raise RuntimeError(f"widen_attention changed the logits (max difference {(narrow_logits - wide_logits).abs().max():.3g})")
    return wide


def save(model, out: Path, layout: str) -> None:
    """Write `model` to `out` in `layout`, its attention widened to what vLLM serves; the released
    layout is checked to load back as the widened model."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} (layouts: {', '.join(LAYOUTS)})")
    model = widen_attention(model)
    model.save_pretrained(out)
    write_media_config(out)
    if layout == "released":
        to_released_layout(out)
        check_same_model(model, out)


# The released model's image preprocessing (its preprocessor_config.json): vLLM builds the image
# processor of a Kimi-K2.5 from it even when serving text only.
MEDIA_PROC_CFG = {
    "in_patch_limit": 16384, "patch_size": 14, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "merge_kernel_size": 2, "fixed_output_tokens": None, "patch_limit_on_one_side": 512,
    "in_patch_limit_each_frame": 4096, "in_patch_limit_video": None, "sample_fps": 2.0,
    "max_num_frames_each_video": None, "temporal_merge_kernel_size": 4, "timestamp_mode": "hh:mm:ss.fff",
    "config_type": "media_proc",
}


def write_media_config(out: Path) -> None:
    (out / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": MEDIA_PROC_CFG}, indent=2))


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
    # The released config's name for the image placeholder (transformers' is image_token_id):
    # vLLM's EAGLE-3 proposer reads it from a Kimi-K2.5 verifier.
    cfg["media_placeholder_token_id"] = cfg["image_token_id"]
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
