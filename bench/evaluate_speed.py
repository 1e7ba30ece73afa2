#!/usr/bin/env python3
"""The evaluate stage's fast method timed beside the verifier's own batched greedy decoding of the
same prompts, in one run: evaluate's floor is that decoding (it decodes, then makes one verifier
forward and one draft forward per prompt), so the ratio says what evaluate costs above it.

    python bench/evaluate_speed.py [--verifier DIR --draft CKPT --data chat.jsonl] \
        [--prompts 64] [--max-new-tokens 96] [--repeats 2] [--chain] [--record]

Each side runs --repeats times over all the prompts, after one warm-up batch of each, the two
interleaved batch by batch (which goes first alternates): load from other processes that comes
and goes over minutes falls on both. Wall and process CPU seconds are both kept: on a shared CPU
the latter move less with the load. Evaluate is `measure_fast` as the stage calls it (its batch
size, the verifier's dtype by the stages' rule, the stage's default torch threads, the draft in
bf16 with sdpa); the decoding is plain transformers `generate` of the same prompts in the same
batches, left-padded, to --max-new-tokens or the verifier's end of turn (the replies evaluate
measures). Printed: every run's seconds and the load average around it, the ratio evaluate /
decoding (of the means, and its spread: the slowest evaluate over the fastest decoding, the
fastest over the slowest), evaluate's time split into the verifier's decodes, its forwards (one
per prompt, `settle`), the draft's passes and the rest, tau of every evaluate run (they must
agree), and on how many prompts the decoding's reply equals evaluate's.
`--chain` also times the round-by-round reference (`--method chain`) once and checks that every
prompt's rounds and acceptances equal the fast method's (slow: minutes for 8 SmolLM2 prompts).

Without --verifier/--draft/--data it builds the tests' tiny verifier and a draft trained for 20
steps in --workdir (a few minutes on 2 cores; reused on the next run). The device is cuda where
torch sees a GPU, else cpu (--device overrides). --record puts a dated section under
"## bench/evaluate_speed.py" in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "remote_scripts"
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(ROOT))

import evaluate as ev  # noqa: E402
from common.conversations import load_prompts  # noqa: E402
from bench.results_file import record  # noqa: E402


def _script(name: str, *args) -> None:
    subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], check=True, stdout=subprocess.DEVNULL)


def build_tiny(work: Path) -> tuple[Path, Path, Path]:
    """The tests' tiny verifier (make_tiny_verifier defaults) and a draft trained for 20 steps."""
    verifier, data, draft = work / "verifier", work / "chat.jsonl", work / "checkpoints"
    if not (draft / "best.json").is_file():
        print(f"building the tiny verifier and a draft in {work} ...", file=sys.stderr, flush=True)
        _script("make_tiny_verifier.py", "--output", verifier, "--data-out", data, "--events", work / "e1.jsonl")
        _script("prepare_data.py", "--verifier", verifier, "--data", data, "--output", work / "prepared", "--max-seq-len", 256, "--events", work / "e2.jsonl")
        _script("extract_hidden_states.py", "--verifier", verifier, "--prepared", work / "prepared", "--output", work / "hidden", "--batch-size", 8, "--events", work / "e3.jsonl")
        _script("train_draft.py", "--verifier", verifier, "--prepared", work / "prepared", "--hidden-states", work / "hidden", "--output", draft,
                "--epochs", 1, "--max-steps", 20, "--total-seq-len", 256, "--lr", "5e-3", "--events", work / "e4.jsonl")
    return verifier, data, draft


class Split:
    """Seconds spent inside the methods wrapped by `wrap`, by part. A call made inside another
    timed call counts for the outer one only (forward_many calls forward on a CPU). On a GPU each
    timed call waits for its kernels, so the time lands on the part that launched them."""

    def __init__(self, device):
        import torch

        self.seconds: dict[str, float] = {}
        self.depth = 0
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def wrap(self, obj, method: str, part: str) -> None:
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            if self.depth:
                return inner(*args, **kwargs)
            self.depth += 1
            started = time.perf_counter()
            try:
                out = inner(*args, **kwargs)
                self.sync()
                return out
            finally:
                self.depth -= 1
                self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - started
        setattr(obj, method, timed)  # on the instance: the class and other instances are untouched


def decode(model, prompts: list[list[int]], max_new_tokens: int, eos: set[int], pad: int, batch_size: int) -> list[list[int]]:
    """The verifier's own batched greedy decoding: plain `generate`, left-padded batches of
    `batch_size` prompts in order, each reply cut after its first end of turn."""
    import torch

    device = next(model.parameters()).device
    replies = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        # evaluate's attention backends (without cuDNN's: its replies differ from run to run), so
        # that "replies equal" compares like with like; the two cost the same on an H100
        # (bench/gpu/decode_kernels.py)
        with torch.no_grad():
            out = ev.without_cudnn_attention(model.generate)(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                                             eos_token_id=sorted(eos) or None, pad_token_id=pad)
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            replies.append(row[:cut])
    return replies


def main() -> int:
    stage_defaults = ev.build_parser()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier")
    p.add_argument("--draft")
    p.add_argument("--data")
    p.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "harness-evaluate-speed"))
    p.add_argument("--prompts", type=int, default=stage_defaults.get_default("max_prompts"))
    p.add_argument("--max-new-tokens", type=int, default=stage_defaults.get_default("max_new_tokens"))
    p.add_argument("-k", "--speculative-tokens", type=int, default=stage_defaults.get_default("speculative_tokens"))
    p.add_argument("--batch-size", type=int, default=0, help="both sides' (0: the fast method's default)")
    p.add_argument("--dtype", default=None, help="the verifier's dtype (default: the stages' rule, fp32 on CPU)")
    p.add_argument("--device", default=None, help="default: cuda where torch sees a GPU, else cpu")
    p.add_argument("--threads", type=int, default=stage_defaults.get_default("threads"), help="torch threads (default: the evaluate stage's; 0: torch's own)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs of each side, interleaved")
    p.add_argument("--chain", action="store_true", help="also the round-by-round reference, once, checked against the fast method")
    p.add_argument("--record", action="store_true")
    args = p.parse_args()

    import torch
    from transformers import AutoTokenizer

    from common.checkpoints import resolve_draft
    from common.verifier import load_verifier, locate_decoder

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.verifier:
        verifier_dir, data, draft_dir = Path(args.verifier), Path(args.data), Path(args.draft)
    else:
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
        verifier_dir, data, draft_dir = build_tiny(work)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_verifier(str(verifier_dir.resolve()), device=device, dtype=args.dtype)
    draft = ev.load_draft(resolve_draft(draft_dir)[0], str(verifier_dir.resolve()), "sdpa").to(device)
    verifier = ev.HFVerifier(model, ev.draft_layers(draft, locate_decoder(model).num_layers), torch.bfloat16)
    proposer = ev.Eagle3Proposer(draft)
    tokenizer = AutoTokenizer.from_pretrained(str(verifier_dir.resolve()))
    prompts = load_prompts(tokenizer, data, "heldout", args.prompts)
    eos = ev._eos_ids(tokenizer, model)
    k, max_new = args.speculative_tokens, args.max_new_tokens
    batch = args.batch_size or verifier.batch_size(prompts, max_new + k + 1)
    pad = verifier._pad_id(eos)

    split = Split(verifier.device)
    for method in ("greedy", "greedy_batch"):
        split.wrap(verifier, method, "verifier decode")
    for method in ("forward", "forward_many"):
        split.wrap(verifier, method, "verifier forward")
    split.wrap(proposer, "run", "draft")

    def timed(fn, *a):
        wall, cpu = time.perf_counter(), time.process_time()
        out = fn(*a)
        return out, time.perf_counter() - wall, time.process_time() - cpu

    # Warm-up: the first calls allocate and pick kernels.
    ev.measure_fast(verifier, proposer, prompts[:batch], k, max_new, eos, batch)
    decode(model, prompts[:batch], max_new, eos, pad, batch)
    parts = ["verifier decode", "verifier forward", "draft"]
    runs, run_lines = [], []
    for i in range(1, max(1, args.repeats) + 1):
        # Batch by batch, the two sides alternate (and which goes first): a load that comes and
        # goes over minutes falls on both. measure_fast treats its batches independently, so its
        # results are those of one call over all the prompts.
        split.seconds.clear()
        run = {"evaluate": [0.0, 0.0], "decoding": [0.0, 0.0], "results": [], "replies": [], "load": []}
        for b, first in enumerate(range(0, len(prompts), batch)):
            chunk = prompts[first : first + batch]
            for side in (("evaluate", "decoding") if (b + i) % 2 else ("decoding", "evaluate")):
                if side == "evaluate":
                    out, wall, cpu = timed(ev.measure_fast, verifier, proposer, chunk, k, max_new, eos, batch)
                    run["results"] += out
                else:
                    out, wall, cpu = timed(decode, model, chunk, max_new, eos, pad, batch)
                    run["replies"] += out
                run[side][0] += wall
                run[side][1] += cpu
            run["load"].append(os.getloadavg()[0])
        run["split"] = dict(split.seconds)
        runs.append(run)
        (e, e_cpu), (d, d_cpu), sp = run["evaluate"], run["decoding"], run["split"]
        rest = e - sum(sp.get(x, 0.0) for x in parts)
        split_text = ", ".join(f"{x} {sp.get(x, 0.0):.2f}" for x in parts) + f", rest {rest:.2f}"
        run_lines.append(f"run {i} (load {min(run['load']):.1f}-{max(run['load']):.1f}): evaluate {e:7.2f} s (cpu {e_cpu:7.2f} s; {split_text})   "
                         f"decoding {d:7.2f} s (cpu {d_cpu:7.2f} s)   ratio {e / d:.3f}x (cpu {e_cpu / d_cpu:.3f}x)")
        print(run_lines[-1], file=sys.stderr, flush=True)  # as it comes: a run takes minutes on a CPU

    ev_s = [r["evaluate"][0] for r in runs]
    dec_s = [r["decoding"][0] for r in runs]
    ev_cpu = [r["evaluate"][1] for r in runs]
    dec_cpu = [r["decoding"][1] for r in runs]
    taus = [ev.summarize(r["results"], k).tau for r in runs]
    fast = runs[0]["results"]
    same_reply = sum(r.generated == d for r, d in zip(fast, runs[0]["replies"]))
    tokens = sum(len(r.generated) for r in fast)
    ratio = statistics.mean(ev_s) / statistics.mean(dec_s)
    lo, hi = min(ev_s) / max(dec_s), max(ev_s) / min(dec_s)
    lines = [
        f"verifier {verifier_dir.name} ({model.config.model_type}, {locate_decoder(model).num_layers} layers, {next(model.parameters()).dtype}) on {verifier.device}, "
        f"{len(prompts)} prompts, k={k}, max_new_tokens={max_new}, batch {batch}, torch threads {torch.get_num_threads()}, {tokens} tokens measured",
    ]
    lines += run_lines
    lines.append(f"evaluate / decoding: {ratio:.3f}x of the mean wall times (spread {lo:.3f}-{hi:.3f}x), "
                 f"{statistics.mean(ev_cpu) / statistics.mean(dec_cpu):.3f}x of the process CPU times (spread {min(ev_cpu) / max(dec_cpu):.3f}-{max(ev_cpu) / min(dec_cpu):.3f}x)")
    lines.append(f"tau {', '.join(f'{t:.4f}' for t in taus)}; "
                 f"decoding's reply equals evaluate's on {same_reply}/{len(prompts)} prompts; greedy checks {sum(bool(r.greedy_match) for r in fast)}/{len(fast)}; "
                 f"replies cut where the decode and the check parted: {sum(r.cut_at is not None for r in fast)} (at {[r.cut_at for r in fast if r.cut_at is not None]})")
    ok = len(set(taus)) == 1
    if args.chain:
        started = time.perf_counter()
        chain = ev.measure_chain(verifier, proposer, prompts, k, max_new, eos)
        chain_s = time.perf_counter() - started
        same = sum((f.generated, f.rounds, f.accepted, f.trials) == (c.generated, c.rounds, c.accepted, c.trials) for f, c in zip(fast, chain))
        lines.append(f"chain (reference): {chain_s:.2f} s, tau {ev.summarize(chain, k).tau:.4f}, {chain_s / statistics.mean(ev_s):.1f}x the fast method; "
                     f"identical rounds and acceptances on {same}/{len(prompts)} prompts")
        ok = ok and same == len(prompts)
    print("\n".join(lines))
    if args.record:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        cmd = " ".join(["python bench/evaluate_speed.py", *sys.argv[1:]])
        record("## bench/evaluate_speed.py", f"### {stamp}: `{cmd}` ({platform.machine()})\n\n```\n" + "\n".join(lines) + "\n```")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
