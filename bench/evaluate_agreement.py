#!/usr/bin/env python3
"""Where evaluate's two views of the verifier part: its batched cached decode (left-padded, as
`HFVerifier.greedy_batch` runs it) against the uncached forward it checks the decode with
(`forward_many`: batched and right-padded on a GPU, one row at a time on a CPU), each set beside
its one-row form, on the same prompts. On an H100 in bf16 the first two parted on ~50 of 64
prompts, beyond any near tie (bench/RESULTS.md, 2026-12-06); on 2 CPU cores on 1 of 24. This
says which of the four is the odd one out.

    python bench/evaluate_agreement.py --verifier DIR --data chat.jsonl [--prompts 64] [--max-new-tokens 256] [--dtype bfloat16]

For every prompt: the batched decode's reply (B), each reply decoded alone without padding (A),
then the uncached forward over prompt + B, batched (F) and one row at a time (f). Printed: on how
many prompts each pair agrees (a decode against a decode: the whole reply; a forward against a
decode: the forward's greedy choice at every position of the reply, ties within the verifier's
precision counted as agreement as evaluate's settle counts them), and at the first disagreement
the logit gap and the row's left padding. With --json, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "remote_scripts"))
sys.path.insert(0, str(REPO / "bench"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--verifier", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--dtype", default=None, help="the verifier's dtype (default: the stages' rule, fp32 on CPU)")
    p.add_argument("--device", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import torch
    from transformers import AutoTokenizer

    import evaluate as ev
    from common.verifier import default_target_layers, load_verifier, locate_decoder
    from evaluate_speed import load_prompts

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_verifier(str(Path(args.verifier).resolve()), device=device, dtype=args.dtype)
    verifier = ev.HFVerifier(model, default_target_layers(locate_decoder(model).num_layers), torch.bfloat16)  # the view is not read here
    tokenizer = AutoTokenizer.from_pretrained(str(Path(args.verifier).resolve()))
    prompts = load_prompts(tokenizer, Path(args.data), "heldout", args.prompts)
    eos = ev._eos_ids(tokenizer, model)
    width = max(len(q) for q in prompts)

    batched = verifier.greedy_batch(prompts, args.max_new_tokens, eos)
    alone = [verifier.greedy(q, args.max_new_tokens, eos) for q in prompts]
    keep = [len(q) - 1 for q in prompts]
    sequences = [q + r for q, r in zip(prompts, batched)]
    forward_batched = [g for g, _ in verifier.forward_many(sequences, batched=True, keep_from=keep)]
    forward_alone = [g for g, _ in verifier.forward_many(sequences, batched=False, keep_from=keep)]

    def gap(sequence: list[int], position: int, token: int) -> float:
        with torch.no_grad():
            row = model(input_ids=torch.tensor([sequence], device=model.device), use_cache=False).logits[0, position].float()
        return round(float(row.max() - row[token]), 4)

    pairs = {}
    for name, others, decoded in (("batched decode vs alone", alone, True), ("forward batched vs batched decode", forward_batched, False),
                                  ("forward alone vs batched decode", forward_alone, False)):
        firsts = []
        for i, (prompt, reply, other) in enumerate(zip(prompts, batched, others)):
            if decoded:  # a reply against a reply
                first = next((j for j, (a, b) in enumerate(zip(reply, other)) if a != b), None if len(reply) == len(other) else min(len(reply), len(other)))
            else:
                first = ev._first_disagreement(other, prompt, reply)
            if first is not None:
                firsts.append({"prompt": i, "position": first, "left_padding": width - len(prompt),
                               "gap": gap(prompt + reply, len(prompt) - 1 + first, reply[first]) if first < len(reply) else None})
        pairs[name] = {"agree": len(prompts) - len(firsts), "prompts": len(prompts), "first_disagreements": firsts}
    forwards = sum(a[k:] == b[k:] for a, b, k in zip(forward_batched, forward_alone, keep))  # from each prompt's last token on
    result = {"device": str(model.device), "dtype": str(model.dtype), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "pairs": pairs, "forward batched == forward alone (every choice)": forwards}
    if args.json:
        print(json.dumps(result))
        return
    print(f"verifier {Path(args.verifier).name} ({model.dtype}) on {model.device}, {len(prompts)} prompts, up to {args.max_new_tokens} new tokens")
    for name, pair in pairs.items():
        firsts = pair["first_disagreements"]
        gaps = [f["gap"] for f in firsts if f["gap"] is not None]
        pads = [f["left_padding"] for f in firsts]
        print(f"{name}: agree on {pair['agree']}/{pair['prompts']}"
              + (f"; at the first disagreement: median position {statistics.median(f['position'] for f in firsts)}, "
                 f"logit gap median {statistics.median(gaps) if gaps else None} (max {max(gaps) if gaps else None}), left padding median {statistics.median(pads)}" if firsts else ""))
    print(f"the forward batched and alone give the same choices on {forwards}/{len(prompts)} prompts")


if __name__ == "__main__":
    main()
