"""Served acceptance: the exported draft as vLLM serves it, measured by vLLM's own counters.

    python remote_scripts/serve_check.py --export EXPORT_DIR --data chat.jsonl --output OUT_DIR \
        [--evaluation EVAL_DIR] [--no-baseline] [--events FILE] [vllm serve flags: --max-model-len, --vllm-arg ...]

evaluate measures tau with our own speculation loop; what a user gets is the draft as vLLM serves
it. This stage serves the export with its verifier (common/vllm_server.py, on a private unix
socket), sends evaluate's held-out prompts, reads vLLM's spec-decode counters before and after
(common/spec_metrics.py) and, with --baseline (the default), serves the verifier alone for
tokens/s without the draft. It writes OUT_DIR/served.json and acceptance.png (evaluate's bars,
from EVAL_DIR/report.json, beside vLLM's); where vLLM is missing or cannot serve this verifier
it says so in one line and ends ok, so the chain goes on.
Step by step: docs/pipeline.md, "Served acceptance".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.conversations import NoPrompts, load_prompts  # noqa: E402
from common.draft_serving import Export, ServeCheckError, cannot_serve, complete, read_export  # noqa: E402
from common.events import EventLog, run_stage  # noqa: E402
from common.spec_metrics import SpecCounters, read_counters  # noqa: E402
from common.vllm_server import ManagedServer, ServeOptions, add_serve_arguments, private_socket, sigterm_raises  # noqa: E402

STAGE = "serve_check"
REPORT = "report.json"
SERVED = "served.json"
# evaluate.py's defaults, used when its report.json is not there to say what it measured
DEFAULT_SPLIT, DEFAULT_PROMPTS, DEFAULT_NEW_TOKENS = "heldout", 64, 96


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", required=True, help="the export stage's directory (speculators format, absolute verifier path)")
    p.add_argument("--data", required=True, help="chat JSONL with held-out rows (evaluate's --data)")
    p.add_argument("--output", required=True, help="where served.json and acceptance.png are written")
    p.add_argument("--evaluation", default=None, help="evaluate's output directory: its report.json says what it measured (default: --output)")
    p.add_argument("--speculative-tokens", type=int, default=None, help="K (default: the export's)")
    p.add_argument("--split", default=None, help=f"default: evaluate's (report.json), else {DEFAULT_SPLIT}")
    p.add_argument("--max-prompts", type=int, default=None, help=f"default: as many as evaluate measured, else {DEFAULT_PROMPTS}")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"default: evaluate's, else {DEFAULT_NEW_TOKENS}")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True, help="also serve the verifier alone: tokens/s without the draft, replies compared")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile or CUDA graphs: a faster start, slower tokens (tests, quick checks)")
    p.add_argument("--trust-remote-code", action="store_true", help="the tokenizer's and vLLM's (auto_map)")
    serve = p.add_argument_group("vllm serve")
    add_serve_arguments(serve, tcp=False)
    serve.set_defaults(health_timeout=1800.0)
    p.add_argument("--events", default=None)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, parse_args(argv), run, self_explaining=(ServeCheckError,))


def evaluate_figures(report: dict | None) -> dict | None:
    """evaluate's tau on both definitions (common/spec_metrics.py): its own (tokens per round,
    rounds a reply's end cut short included) and vLLM's (1 + accepted per draft: 1 + the sum of
    its acceptance per position)."""
    if not report:
        return None
    per_position = [float(a) for a in report.get("acceptance_per_position") or []]
    return {"tau": report.get("tau"), "tau_per_draft": round(1 + sum(per_position), 4), "acceptance_per_position": per_position,
            "prompts": report.get("prompts"), "k": report.get("k")}


def measured_settings(args: argparse.Namespace, report: dict | None) -> tuple[str, int, int]:
    extra = (report or {}).get("extra") or {}
    split = args.split or extra.get("split") or DEFAULT_SPLIT
    prompts = args.max_prompts or (report or {}).get("prompts") or DEFAULT_PROMPTS
    new_tokens = args.max_new_tokens or extra.get("max_new_tokens") or DEFAULT_NEW_TOKENS
    return split, int(prompts), int(new_tokens)


def serve_and_send(args: argparse.Namespace, events: EventLog, export: Export, prompts: list[list[int]], max_tokens: int, draft: bool, log: Path) -> dict[str, Any]:
    """One server (with the draft or without), the prompts sent one at a time; its figures. It
    listens on a unix socket in a 0700 directory of this stage's, which no other uid reaches."""
    with private_socket() as uds:
        return _serve_and_send(args, events, export, prompts, max_tokens, draft, log, uds)


def _serve_and_send(args: argparse.Namespace, events: EventLog, export: Export, prompts: list[list[int]], max_tokens: int, draft: bool, log: Path,
                    uds: str) -> dict[str, Any]:
    extra = [*(export.serve_args(args.speculative_tokens) if draft else []), *(["--trust-remote-code"] if args.trust_remote_code else []),
             *(["--enforce-eager"] if args.enforce_eager else []), *args.vllm_arg]
    opts = ServeOptions(model=export.verifier, uds=uds, tensor_parallel_size=args.tensor_parallel_size,
                        max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
                        vllm_command=args.vllm_command, extra_args=extra)
    what = "with the draft" if draft else "without the draft"
    with ManagedServer(opts, log, stop_grace=args.stop_grace) as server:
        start_s = server.wait_healthy(args.health_timeout)
        events.message(f"vllm serve {what} healthy after {start_s:.0f} s ({opts.where}, its workers in {server.network}; log {log})")
        complete(opts, opts.model, prompts[0], 2, args.request_timeout)  # warm-up, before the counters are read
        before = read_counters(opts)
        replies, completion_tokens = [], 0
        started = time.monotonic()
        for i, prompt in enumerate(prompts, 1):
            answer = complete(opts, opts.model, prompt, max_tokens, args.request_timeout)
            replies.append(answer["token_ids"])
            completion_tokens += answer["completion_tokens"]
            events.progress(i, len(prompts), unit=f"prompts {what}")
        seconds = time.monotonic() - started
        counters = settled_counters(opts, before, completion_tokens)
    figures = {"tokens_per_s": round(completion_tokens / seconds, 2) if seconds > 0 else None, "seconds": round(seconds, 2),
               "completion_tokens": completion_tokens, "engine_start_s": round(start_s, 1), "log": str(log)}
    if draft:
        if not counters.speculating:
            raise ServeCheckError(f"vLLM served {export.verifier} without speculative decoding (no spec_decode counters in /metrics); log {log}")
        check_drafted(counters, len(prompts), completion_tokens)
        figures.update(counters.summary(requests=len(prompts)))
    return {"figures": figures, "replies": replies}


def check_drafted(counters: SpecCounters, requests: int, completion_tokens: int) -> None:
    """No draft round over the requests is no served tau: one line that says why (as evaluate)."""
    if counters.drafts > 0:
        return
    if completion_tokens <= requests:
        raise ServeCheckError(f"every reply ended at its first token ({requests} prompts, {completion_tokens} tokens): vLLM ran no draft round, so no served tau; "
                              "check the verifier and the held-out prompts")
    raise ServeCheckError(f"vLLM ran no draft round over {requests} prompts ({completion_tokens} tokens returned): no served tau; see its log")


def settled_counters(server: ServeOptions, before: SpecCounters, completion_tokens: int, timeout: float = 30.0) -> SpecCounters:
    """The counters' growth over the requests, once /metrics has every returned token (vLLM
    records a step's stats as it hands the step's output on: a last step may be a moment late)."""
    deadline = time.monotonic() + timeout
    while True:
        delta = read_counters(server).minus(before)
        if delta.generation_tokens >= completion_tokens or time.monotonic() > deadline:
            return delta
        time.sleep(0.2)


def run(args: argparse.Namespace, events: EventLog) -> dict[str, Any]:
    from common.vllm_compat import default_vllm_command, installed_distribution

    export = read_export(args.export)
    installed = installed_distribution()
    if args.vllm_command == default_vllm_command() and installed is None:
        events.warning("vLLM is not installed where the stages run: served acceptance not measured (install vllm there; the ML image has it)")
        return {"skipped": "vllm is not installed"}
    why = cannot_serve(export, installed[0] if installed else None)
    if why:
        events.warning(f"vLLM cannot serve this verifier here: {why}; served acceptance not measured")
        return {"skipped": why}

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    report_path = Path(args.evaluation or args.output) / REPORT
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    split, count, max_tokens = measured_settings(args, report)
    prompts = held_out_prompts(export.verifier, Path(args.data), split, count, args.trust_remote_code)
    k = args.speculative_tokens or export.speculative_tokens
    events.message(f"serving {export.directory} as the eagle3 draft of {export.verifier} (k={k}); {len(prompts)} {split} prompts, up to {max_tokens} tokens each")

    logs = Path(args.events).resolve().parent if args.events else out
    with sigterm_raises():
        served = serve_and_send(args, events, export, prompts, max_tokens, True, logs / "vllm-draft.log")
        baseline = serve_and_send(args, events, export, prompts, max_tokens, False, logs / "vllm-verifier.log") if args.baseline else None

    figures = served["figures"]
    ours = evaluate_figures(report)
    result: dict[str, Any] = {
        "served": figures,
        "baseline": baseline["figures"] if baseline else None,
        "speedup": round(figures["tokens_per_s"] / baseline["figures"]["tokens_per_s"], 3) if baseline and baseline["figures"]["tokens_per_s"] else None,
        "replies_equal": (sum(a == b for a, b in zip(served["replies"], baseline["replies"])) / len(prompts)) if baseline else None,
        "evaluate": ours,
        "k": k, "prompts": len(prompts), "split": split, "max_new_tokens": max_tokens,
        "export": export.directory, "verifier": export.verifier,
        "vllm": f"{installed[0]} {installed[1]}" if installed else args.vllm_command,
    }
    tmp = out / (SERVED + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out / SERVED)
    events.metric(0, served_tau=figures["tau"], **{f"served_acceptance_{i + 1}": a for i, a in enumerate(figures["acceptance_per_position"])})
    line = f"served tau {figures['tau']:.2f} (vLLM: 1 + {figures['accepted_tokens']} accepted / {figures['drafts']} drafts)"
    if ours:
        line += f"; evaluate's {ours['tau_per_draft']:.2f} on that definition (its tau {ours['tau']:.2f})"
    if baseline:
        line += f"; {figures['tokens_per_s']:.1f} tokens/s with the draft, {baseline['figures']['tokens_per_s']:.1f} without; replies equal {result['replies_equal']:.0%}"
    events.message(line)
    if baseline and result["replies_equal"] < 1.0:
        events.warning(f"served replies with the draft differ from the verifier's own on {1 - result['replies_equal']:.0%} of prompts (greedy speculation should not change them)")
    if plot_served(result, out / "acceptance.png"):
        events.artifact(str(out / "acceptance.png"), kind="plot")
    events.artifact(str(out / SERVED), kind="report")
    summary = {"served_tau": figures["tau"], "delivered_tau": figures["delivered_tau"], "served_acceptance_per_position": figures["acceptance_per_position"],
               "evaluate_tau": ours["tau"] if ours else None, "tokens_per_s": figures["tokens_per_s"],
               "tokens_per_s_without_draft": baseline["figures"]["tokens_per_s"] if baseline else None, "report": str((out / SERVED).resolve())}
    return summary


def held_out_prompts(verifier: str, data: Path, split: str, count: int, trust_remote_code: bool) -> list[list[int]]:
    """evaluate's prompts: the same rows, chat template and token ids (conversations.load_prompts)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(verifier, trust_remote_code=trust_remote_code)
    try:
        prompts = load_prompts(tokenizer, data, split, count)
    except NoPrompts as e:
        raise ServeCheckError(str(e)) from None
    if not prompts:
        raise ServeCheckError(f"{data}: no {split} prompts")
    return prompts


def plot_served(result: dict, path: Path) -> bool:
    """Acceptance per position: evaluate's bars (when its report is there) beside vLLM's."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    served = result["served"]["acceptance_per_position"]
    ours = (result.get("evaluate") or {}).get("acceptance_per_position") or []
    positions = list(range(1, len(served) + 1))
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.4 if ours else 0.8
    if ours:
        ax.bar([p - width / 2 for p in positions[: len(ours)]], ours[: len(served)], width, color="#4c72b0", label=f"evaluate (tau {result['evaluate']['tau']:.2f})")
    ax.bar([p + (width / 2 if ours else 0) for p in positions], served, width, color="#55a868", label=f"served by vLLM (tau {result['served']['tau']:.2f})")
    ax.set_xticks(positions)
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted fraction")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"acceptance per position (k = {result['k']}, {result['prompts']} prompts)")
    ax.legend(loc="lower left")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return True


if __name__ == "__main__":
    sys.exit(main())
