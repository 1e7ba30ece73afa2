#!/usr/bin/env python3
"""Why evaluate's verifier decodes took 2x the bench's own decoding on an H100 (issue 59): the
attention kernels, or settle's second decode? One device call, nothing carried (torch and
transformers of the device's image; no speculators, no weights):

    python bench/gpu/decode_kernels.py [--quick] [--json OUT.json]

A SmolLM2-135M-shaped Llama (30 layers, hidden 576, vocabulary 49,152) with random weights in
bf16, its final norm scaled so that the top logit is ~20 as SmolLM2's is (ties then as rare as a
trained model's, roughly), decodes 64 random prompts of 30-150 tokens to 256 new tokens (no end
of turn), batched and left-padded as evaluate does, each side twice, interleaved:

- "default": plain `generate`, torch's SDPA backends as they come (cuDNN first on Hopper): the
  decoding bench/evaluate_speed.py compares evaluate with;
- "without cuDNN": the same inside evaluate's `without_cudnn_attention` (flash, efficient, math),
  as `measure_fast` decodes.

Then evaluate's check, `HFVerifier.forward_many` over prompt + reply, under both, and `settle`
under evaluate's setting: how many generate calls it adds, and what they cost. Printed and in
--json: seconds per side and their ratio, replies equal between the sides, settle's decodes.
(Its one run so far, 2026-12-06 on an H100, was of the settle that decoded on from each fix:
one generate call, as long as the decode itself; settle now cuts the reply there instead.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "remote_scripts"))

import evaluate as ev  # noqa: E402

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               vocab_size=49152, max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=100000.0)
QUICK = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
             vocab_size=512, max_position_embeddings=512, tie_word_embeddings=True)


def build(quick: bool, device: str, seed: int):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(**(QUICK if quick else SMOLLM2))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).to(device).eval()
    with torch.no_grad():  # random logits have a std of ~0.5; a trained model's top is ~20
        model.model.norm.weight.mul_(10.0)
    if model.config._attn_implementation != "sdpa":
        raise SystemExit(f"attention is {model.config._attn_implementation}, not sdpa")
    return model


def decode(verifier: "ev.HFVerifier", prompts: list[list[int]], new: int, cudnn: bool) -> list[list[int]]:
    run = (lambda: verifier.greedy_batch(prompts, new, set())) if cudnn else ev.without_cudnn_attention(lambda: verifier.greedy_batch(prompts, new, set()))
    return run()


def timed(fn, sync):
    started = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a toy model and 4 prompts: the mechanics, on a CPU")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    args = p.parse_args()

    import random

    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    n_prompts, new = (4, 16) if args.quick else (args.prompts, args.new_tokens)
    model = build(args.quick, device, args.seed)
    vocab = model.config.vocab_size
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(30, 150 if not args.quick else 40))] for _ in range(n_prompts)]
    n = model.config.num_hidden_layers
    verifier = ev.HFVerifier(model, [2, n // 2, n - 3], torch.bfloat16)
    sides = {"default": True, "without cuDNN": False}
    out: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
                 "transformers": transformers.__version__, "prompts": n_prompts, "new_tokens": new, "seconds": {s: [] for s in sides}}
    replies = {}
    for side, cudnn in sides.items():  # warm-up: kernels chosen, memory allocated
        replies[side] = decode(verifier, prompts, new, cudnn)
    for i in range(args.repeats):
        for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            got, s = timed(lambda: decode(verifier, prompts, new, sides[side]), sync)
            out["seconds"][side].append(round(s, 3))
            if got != replies[side]:
                out.setdefault("not_repeatable", []).append(side)
            print(f"decode {side}: {s:.2f} s ({1000 * s / new:.1f} ms a step at batch {n_prompts})", flush=True)
    mean = {s: statistics.mean(v) for s, v in out["seconds"].items()}
    out["ratio_without_cudnn_over_default"] = round(mean["without cuDNN"] / mean["default"], 3)
    out["ratio_spread"] = [round(min(out["seconds"]["without cuDNN"]) / max(out["seconds"]["default"]), 3),
                           round(max(out["seconds"]["without cuDNN"]) / min(out["seconds"]["default"]), 3)]
    out["replies_equal"] = sum(a == b for a, b in zip(replies["default"], replies["without cuDNN"]))

    # evaluate's check of its own decode, and settle's fix-ups, as measure_fast runs them
    references = replies["without cuDNN"]
    sequences = [pr + r for pr, r in zip(prompts, references)]
    keep = [len(pr) - 1 for pr in prompts]
    def check():
        return verifier.forward_many(sequences, keep_from=keep)

    for side, cudnn in sides.items():
        _, s = timed(check if cudnn else ev.without_cudnn_attention(check), sync)
        out[f"forward_many_s ({side})"] = round(s, 3)
    forwards = ev.without_cudnn_attention(lambda: verifier.forward_many(sequences, keep_from=keep))()
    firsts = [ev._first_disagreement(g, pr, r) for pr, r, (g, _view) in zip(prompts, references, forwards)]
    out["check_disagrees_beyond_ties"] = sum(f is not None for f in firsts)
    out["first_disagreements"] = [f for f in firsts if f is not None]
    # How far beyond a tie each disagreement is (the forward's top logit over the decode's
    # token, in units of the verifier's precision at that logit, TIE_EPS of which tie), and
    # whether the prompt decoded alone, unpadded, agrees with the forward there.
    out["disagreements"] = []
    for j, f in enumerate(firsts):
        if f is None:
            continue
        seq, at = sequences[j], len(prompts[j]) - 1 + f
        with torch.no_grad():
            logits = ev.without_cudnn_attention(model)(input_ids=torch.tensor([seq[: at + 1]], device=device), use_cache=False).logits[0, -1].float()
        top = int(logits.argmax())
        ulp = torch.finfo(torch.bfloat16).eps * abs(float(logits[top]))
        alone = ev.without_cudnn_attention(lambda: verifier.greedy(prompts[j] + references[j][:f], 1, set()))()
        out["disagreements"].append({"prompt": j, "position": f, "top_logit": round(float(logits[top]), 3),
                                     "gap_in_precision_units": round(float(logits[top] - logits[references[j][f]]) / ulp, 2),
                                     "alone_decode_agrees_with_forward": alone[:1] == [top], "batched_decode_token": references[j][f], "forward_token": top})
    verifier.decodes = 0
    settled, s = timed(ev.without_cudnn_attention(lambda: ev.settle(verifier, prompts, references)), sync)
    out["settle_s"] = round(s, 3)
    out["settle_generate_calls"] = verifier.decodes
    out["settle_cut_replies"] = sum(cut is not None for _r, _v, cut in settled)
    print(json.dumps(out, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
