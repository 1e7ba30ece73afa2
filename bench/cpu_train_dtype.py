#!/usr/bin/env python3
"""The draft's training compute on a CPU: fp32 against bf16 autocast (what speculators trains under),
one forward and backward of an EAGLE-3-shaped draft (fc 3H -> H, one Llama decoder layer, lm_head
H -> V) on the same batch, taking turns; prints the CPU's bf16 support and the ratio.

    python bench/cpu_train_dtype.py [--threads 2] [--hidden 576] [--vocab 49152] [--tokens 256] [--repeat 5]

(The defaults are SmolLM2-135M's shapes and the CPU recipe's 256 tokens a step: test_smollm2's draft.)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding


def cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "?"
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return " ".join(f for f in wanted if f in flags) or "none of " + ",".join(wanted)


class Draft(torch.nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 4, num_attention_heads=9, num_key_value_heads=3, vocab_size=vocab)
        config._attn_implementation = "sdpa"  # what train_draft picks on CPU
        self.fc = torch.nn.Linear(3 * hidden, hidden, bias=False)
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(config)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        x = self.fc(states)
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        out = self.layer(x, position_embeddings=self.rotary(x, positions), position_ids=positions)
        x = out[0] if isinstance(out, tuple) else out
        return self.head(x).float().log_softmax(-1).mean()


def step_seconds(model: Draft, states: torch.Tensor, bf16: bool) -> float:
    context = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    start = time.perf_counter()
    with context:
        loss = model(states)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Draft(args.hidden, args.vocab)
    states = torch.randn(1, args.tokens, 3 * args.hidden).to(torch.bfloat16).float()  # stored bf16, as extract writes
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    print(f"cpu: {platform.processor() or platform.machine()}; flags: {cpu_flags()}; mkldnn bf16 native: {native}; torch {torch.__version__}; {args.threads} threads")
    times: dict[str, list[float]] = {"fp32": [], "bf16 autocast": []}
    for name, bf16 in (("fp32", False), ("bf16 autocast", True)):
        step_seconds(model, states, bf16)  # warm-up: kernels chosen, memory allocated
    for _ in range(args.repeat):
        for name, bf16 in (("fp32", False), ("bf16 autocast", True)):
            times[name].append(step_seconds(model, states, bf16))
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:>14}: median {medians[name] * 1000:7.1f} ms a step (min {min(t) * 1000:.1f}, max {max(t) * 1000:.1f}; {args.repeat} steps)")
    print(f"ratio bf16 autocast / fp32: {medians['bf16 autocast'] / medians['fp32']:.2f} (above 1: fp32 is faster)")


if __name__ == "__main__":
    main()
