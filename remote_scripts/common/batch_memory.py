"""How many sequences a greedy/sampled `generate` on a GPU takes at once, from its free memory.

Used by evaluate (--method fast) and regenerate (transformers backend) when no batch size is
given. Per sequence: its KV cache over prompt + new tokens (2 x layers x KV heads x head dim x
length, in the model's dtype), the prefill's activations (length x hidden x 4) and two rows of
fp32 logits; the batch takes at most `fraction` of the free memory (the rest: the prefill's
transients, the allocator's slack), at most `cap` sequences (past ~64, a decode step of a model
this size is no longer launch-bound: more rows only add latency).
"""

from __future__ import annotations


def per_sequence_bytes(config, length: int, element_size: int) -> int:
    from common.verifier import text_config

    cfg = text_config(config)
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * heads * head_dim * length * element_size
    activations = length * cfg.hidden_size * 4 * element_size
    logits = 2 * cfg.vocab_size * 4
    return kv + activations + logits


def gpu_batch_size(model, device, length: int, sequences: int, fraction: float = 1 / 3, cap: int = 64) -> int:
    """Sequences of `length` tokens that fit in `fraction` of `device`'s free memory (1..cap, at most `sequences`)."""
    import torch

    element = next(model.parameters()).element_size()
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return max(1, min(cap, sequences, int(free * fraction) // per_sequence_bytes(model.config, length, element)))
