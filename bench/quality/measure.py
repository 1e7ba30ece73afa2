#!/usr/bin/env python3
"""tau of several proposers on the same held-out prompts, with the same verifier, greedy decoding.

    python bench/quality/measure.py --verifier DIR --data chat.jsonl --draft ours=CKPT \
        --draft speculators=CKPT --ks 3 5 --output taus.json

Run in the stage environment (torch, transformers, speculators). For each held-out prompt the
verifier decodes greedily once and reads prompt + continuation once, a batch of prompts at a
time (evaluate's fast method: evaluate.greedy_replies); every proposer (vLLM's ngram lookup, and
each EAGLE-3 draft) is then replayed against that continuation (evaluate.replay: the same rounds
and acceptances as the evaluate stage's chain speculation, without a verifier forward per round;
an EAGLE-3 draft's proposals for every round come from one draft run, evaluate.replay_settled).
Each report counts the replies stuck in a repetition loop (`looping_prompts`,
evaluate.is_looping) and gives tau without them (`tau_without_loops`).
Prints and writes {"prompts", "max_new_tokens", "taus": {name: {k: report}}}; a report's by_category:
tau per row category (evaluate.tau_by_category; {} when the rows have none).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "remote_scripts"))

import evaluate  # noqa: E402
from common.conversations import load_categorized_prompts  # noqa: E402
from common.checkpoints import resolve_draft  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--draft", action="append", default=[], metavar="NAME=CHECKPOINT", help="an EAGLE-3 draft (a checkpoint or a training output: its latest epoch)")
    p.add_argument("--ks", type=int, nargs="+", default=[3, 5])
    p.add_argument("--max-prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--split", default="heldout")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="auto", help="the verifier's compute dtype (auto: bf16 on GPU, float32 on CPU; the extract stage's, for the same hidden states)")
    p.add_argument("--max-seconds", type=float, default=0.0, help="stop measuring after the batch of prompts that passes this long (from the models' loading; at least one batch: up to 8 prompts on a CPU, 64 on a GPU; 0: every prompt); the output says how many were measured")
    p.add_argument("--output", required=True)
    args = p.parse_args()

    import torch
    from transformers import AutoTokenizer

    from common.verifier import load_verifier, locate_decoder

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.monotonic()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    verifier_path = str(Path(args.verifier).resolve())
    tokenizer = AutoTokenizer.from_pretrained(verifier_path)
    model = load_verifier(verifier_path, device=device, dtype=args.dtype)
    num_layers = locate_decoder(model).num_layers
    eos = evaluate._eos_ids(tokenizer, model)
    prompts, categories = load_categorized_prompts(tokenizer, Path(args.data), args.split, args.max_prompts)

    proposers: dict[str, tuple[object, list[int] | None]] = {"ngram": (evaluate.NgramProposer(1, 4), None)}
    for spec in args.draft:
        name, _, path = spec.partition("=")
        draft = evaluate.load_draft(resolve_draft(Path(path))[0], verifier_path, "sdpa").to(device)
        proposers[name] = (evaluate.Eagle3Proposer(draft), evaluate.draft_layers(draft, num_layers))
    layer_sets = {tuple(layers) for _, layers in proposers.values() if layers}
    verifiers = {layers: evaluate.HFVerifier(model, list(layers), torch.bfloat16) for layers in layer_sets}
    any_verifier = next(iter(verifiers.values())) if verifiers else evaluate.HFVerifier(model, [2, num_layers // 2, num_layers - 3], torch.bfloat16)

    results: dict[str, dict[int, list]] = {name: {k: [] for k in args.ks} for name in proposers}
    batch_size = any_verifier.batch_size(prompts, args.max_new_tokens)
    measured, loop_started = 0, time.monotonic()  # the models are loaded: the time limit counts from here
    while measured < len(prompts):
        if measured and args.max_seconds and time.monotonic() - loop_started > args.max_seconds:
            print(f"stopping after {measured} of {len(prompts)} prompts: --max-seconds {args.max_seconds:g} passed", file=sys.stderr, flush=True)
            break
        batch = prompts[measured : measured + batch_size]
        measure_batch(batch, any_verifier, verifiers, proposers, args.ks, args.max_new_tokens, eos, results)
        measured += len(batch)
        print(f"prompt {measured}/{len(prompts)}", file=sys.stderr, flush=True)

    taus = {name: {str(k): {**asdict(evaluate.summarize(rs, k)), "by_category": evaluate.tau_by_category(rs, categories, k)} for k, rs in by_k.items()} for name, by_k in results.items()}
    out = {"prompts": measured, "max_new_tokens": args.max_new_tokens, "device": device, "seconds": round(time.monotonic() - started, 1), "taus": taus}
    Path(args.output).write_text(json.dumps(out, indent=1))
    print(json.dumps({name: {k: round(r["tau"], 3) for k, r in by_k.items()} for name, by_k in taus.items()}))
    loops = {name: by_k[str(args.ks[0])]["looping_prompts"] for name, by_k in taus.items()}
    print(f"replies stuck in a loop (of {measured}): {loops[next(iter(loops))]}" if len(set(loops.values())) == 1 else f"replies stuck in a loop: {loops}")


@evaluate.without_cudnn_attention
def measure_batch(batch: list[list[int]], any_verifier, verifiers: dict, proposers: dict, ks: list[int], max_new_tokens: int, eos: set[int], results: dict) -> None:
    """Every proposer on one batch of prompts, against the same greedy replies (evaluate's fast
    method, as the evaluate stage measures: one batched decode, one forward per prompt, one draft
    run per draft)."""
    settled = evaluate.greedy_replies(any_verifier, batch, max_new_tokens, eos)
    views = {}
    for layers, v in verifiers.items():  # drafts reading other layers get their own view
        views[layers] = [view for _, view, _ in settled] if v is any_verifier else [view for _, view in v.forward_many([p + r for p, (r, _, _) in zip(batch, settled)])]
    for name, (proposer, layers) in proposers.items():
        # vLLM's ngram lookup reads only the tokens: any view will do
        replies = settled if not layers else [(r, view, cut) for (r, _, cut), view in zip(settled, views[tuple(layers)])]
        by_k = evaluate.replay_settled(proposer, batch, replies, ks, max_new_tokens, eos)
        for k, rs in by_k.items():
            for r in rs:
                r.looping = evaluate.is_looping(r.generated, eos)
            results[name][k] += rs


if __name__ == "__main__":
    main()
