"""Served acceptance and the k to deploy: the exported draft as vLLM serves it, at each k and load.

    python remote_scripts/serve_check.py --export EXPORT_DIR --data chat.jsonl --output OUT_DIR \
        [--evaluation EVAL_DIR] [--k K...] [--concurrency C...] [--repeats N] [--target-concurrency C] \
        [--no-baseline] [--no-baseline-again] [--events FILE] [vllm serve flags: --max-model-len, --vllm-arg ...]

evaluate measures tau with our own speculation loop; what a user gets is the draft as vLLM serves
it, and a speedup that depends on both k and the load. This stage serves the verifier alone (the
baseline), then the export at each k, then the verifier alone again (two starts of one server differed by a third once
on an H200: the speedup's spread must hold that, not only the rounds of one start) (one server each; common/vllm_server.py, on a private
unix socket), and at each concurrency sends evaluate's held-out prompts in rounds (every prompt
once, that many in flight), each cell repeated: output tokens/s, and vLLM's spec-decode counters
before and after each round (common/spec_metrics.py). common/served_table.py reads the table: the
fastest k at each concurrency whose speedup stands above 1 by more than its spread (or no draft),
and the `--speculative-config` to paste; where the installed vLLM takes a batch-size schedule of k,
that schedule, served once more to check it. It writes OUT_DIR/served.json, acceptance.png
(evaluate's bars, from EVAL_DIR/report.json, beside vLLM's at the export's k) and speedup.png;
where vLLM is missing or cannot serve this verifier it says so in one line and ends ok, so the
chain goes on. Step by step: docs/pipeline.md, "Served acceptance and the k to deploy".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.conversations import NoPrompts, load_prompts  # noqa: E402
from common.draft_serving import SCHEDULE_FIELD, Export, ServeCheckError, cannot_serve, complete, read_export, schedule_unsupported  # noqa: E402
from common.events import EventLog, run_stage  # noqa: E402
from common.served_table import Table, recommend, schedule_holds  # noqa: E402
from common.spec_metrics import SpecCounters, read_counters  # noqa: E402
from common.vllm_server import ManagedServer, ServeOptions, add_serve_arguments, private_socket, sigterm_raises, vllm_arg_value  # noqa: E402

STAGE = "serve_check"
REPORT = "report.json"
SERVED = "served.json"
# evaluate.py's defaults, used when its report.json is not there to say what it measured
DEFAULT_SPLIT, DEFAULT_PROMPTS, DEFAULT_NEW_TOKENS = "heldout", 64, 96
DEFAULT_CONCURRENCY = [1, 4, 16, 64]  # requests in flight: memory-bound at 1, the verifier's batch filling by 64


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", required=True, help="the export stage's directory (speculators format, absolute verifier path)")
    p.add_argument("--data", required=True, help="chat JSONL with held-out rows (evaluate's --data)")
    p.add_argument("--output", required=True, help="where served.json and acceptance.png are written")
    p.add_argument("--evaluation", default=None, help="evaluate's output directory: its report.json says what it measured (default: --output)")
    p.add_argument("--k", type=int, nargs="+", default=None, help="the k (num_speculative_tokens) to serve, one server each (default: 1 to the export's k + 2)")
    p.add_argument("--concurrency", type=int, nargs="+", default=DEFAULT_CONCURRENCY, help="requests in flight, each a column of the table "
                   "(a level above the prompts is dropped, and the table says so)")
    p.add_argument("--repeats", type=int, default=2, help="rounds of every prompt per cell: the speedup's spread")
    p.add_argument("--target-concurrency", type=int, default=None, help="the concurrency the one recommended k is for (default: the lowest measured)")
    p.add_argument("--split", default=None, help=f"default: evaluate's (report.json), else {DEFAULT_SPLIT}")
    p.add_argument("--max-prompts", type=int, default=None, help=f"default: as many as evaluate measured, else {DEFAULT_PROMPTS}")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"default: evaluate's, else {DEFAULT_NEW_TOKENS}")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True, help="also serve the verifier alone: tokens/s without the draft "
                   "(no speedup, no recommendation without it), replies compared")
    p.add_argument("--baseline-again", action=argparse.BooleanOptionalAction, default=True,
                   help="serve the verifier alone once more after the drafts: the speedup's spread holds the difference between two starts")
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


@dataclass
class Sent:
    """One round: every prompt sent once, `concurrency` in flight."""

    tokens_per_s: float
    seconds: float
    completion_tokens: int
    counters: SpecCounters | None  # the spec-decode counters' growth over the round (a draft server)
    replies: list[list[int]]


@dataclass
class Served:
    """One server's rounds: level -> each repeat's round."""

    what: str
    start_s: float
    log: Path
    rounds: dict[int, list[Sent]] = field(default_factory=dict)

    @property
    def sending_s(self) -> float:
        return sum(r.seconds for rounds in self.rounds.values() for r in rounds)

    def first(self, level: int) -> Sent:
        return self.rounds[level][0]


def concurrency_levels(asked: list[int], prompts: int) -> tuple[list[int], dict[str, str]]:
    """The levels to measure (ascending, each at most the prompts: a round sends each prompt once)
    and why any asked for was dropped."""
    levels = sorted({c for c in asked if 1 <= c <= prompts})
    dropped = {f"{c}": f"only {prompts} prompts: at most {prompts} requests in flight" for c in sorted(set(asked)) if c > prompts}
    dropped.update({f"{c}": "not a concurrency" for c in sorted(set(asked)) if c < 1})
    if not levels:
        levels = [min(max(asked), prompts)] if asked and max(asked) >= 1 else [1]
    return levels, dropped


def serve_rounds(args: argparse.Namespace, events: EventLog, export: Export, speculative: dict | None, prompts: list[list[int]], max_tokens: int,
                 levels: list[int], log: Path) -> Served:
    """One server (with the draft at `speculative`, or the verifier alone), each level's rounds. It
    listens on a unix socket in a 0700 directory of this stage's, which no other uid reaches."""
    with private_socket() as uds:
        extra = [*(["--speculative-config", json.dumps(speculative)] if speculative else []), *(["--trust-remote-code"] if args.trust_remote_code else []),
                 *(["--enforce-eager"] if args.enforce_eager else []), *args.vllm_arg]
        opts = ServeOptions(model=export.verifier, uds=uds, tensor_parallel_size=args.tensor_parallel_size,
                            max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
                            vllm_command=args.vllm_command, extra_args=extra, text_only=True)
        what = describe(speculative)
        with ManagedServer(opts, log, stop_grace=args.stop_grace) as server:
            start_s = server.wait_healthy(args.health_timeout)
            events.message(f"vllm serve {what} healthy after {start_s:.0f} s ({opts.where}, its workers in {server.network}; log {log})")
            complete(opts, opts.model, prompts[0], 2, args.request_timeout)  # warm-up, before the counters are read
            served = Served(what, start_s, log)
            total, done = len(levels) * args.repeats, 0
            for level in levels:
                for _ in range(args.repeats):
                    served.rounds.setdefault(level, []).append(send_round(opts, prompts, max_tokens, level, args.request_timeout, speculative is not None))
                    done += 1
                    events.progress(done, total, unit=f"rounds of {len(prompts)} prompts {what}")
    return served


def describe(speculative: dict | None) -> str:
    if speculative is None:
        return "without the draft"
    if speculative.get(SCHEDULE_FIELD):
        return "with the draft on a schedule of k"
    return f"with the draft at k={speculative['num_speculative_tokens']}"


def send_round(opts: ServeOptions, prompts: list[list[int]], max_tokens: int, concurrency: int, timeout: float, draft: bool) -> Sent:
    """Every prompt once, `concurrency` in flight; output tokens/s over the round's wall time."""
    before = read_counters(opts) if draft else None
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        answers = list(pool.map(lambda prompt: complete(opts, opts.model, prompt, max_tokens, timeout), prompts))
    seconds = time.monotonic() - started
    tokens = sum(a["completion_tokens"] for a in answers)
    counters = settled_counters(opts, before, tokens) if before is not None else None
    return Sent(tokens / seconds if seconds > 0 else 0.0, seconds, tokens, counters, [a["token_ids"] for a in answers])


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


def again_words(first: Served, again: Served, level: int) -> str:
    mean = lambda served: statistics.mean(r.tokens_per_s for r in served.rounds[level])  # noqa: E731
    return f"{mean(again):.1f} tokens/s at {level} ({mean(again) / mean(first) - 1:+.0%} against its first start)"


def fill(table: Table, k: int | None, served: Served) -> None:
    """The server's rounds into the table: the baseline's (k None: each start's rounds added) or k's cells."""
    for level, rounds in served.rounds.items():
        if k is None:
            table.baseline.setdefault(level, []).extend(r.tokens_per_s for r in rounds)
        else:
            cell = table.cell(k, level)
            cell.tokens_per_s = [r.tokens_per_s for r in rounds]
            cell.served_tau = [r.counters.tau if r.counters else None for r in rounds]


def headline_figures(served: Served, level: int, requests: int) -> dict[str, Any]:
    """The export's k at the lowest concurrency, its first round: served tau and tokens/s as
    before the table (evaluate sends its prompts one at a time)."""
    first = served.first(level)
    figures = {"tokens_per_s": round(first.tokens_per_s, 2), "seconds": round(first.seconds, 2), "completion_tokens": first.completion_tokens,
               "engine_start_s": round(served.start_s, 1), "concurrency": level, "log": str(served.log)}
    if first.counters is not None:
        if not first.counters.speculating:
            raise ServeCheckError(f"vLLM served the verifier without speculative decoding (no spec_decode counters in /metrics); log {served.log}")
        check_drafted(first.counters, requests, first.completion_tokens)
        figures.update(first.counters.summary(requests=requests))
    return figures


def cost_line(servers: int, levels: list[int], repeats: int, prompts: int, baseline: Served | None) -> str:
    """What the table costs: server starts and rounds; once the verifier alone has served, in time."""
    rounds = servers * len(levels) * repeats
    line = f"the table costs {servers} server starts and {rounds} rounds of {prompts} prompts"
    if baseline is not None:
        rest = (servers - 1) * (baseline.start_s + baseline.sending_s)
        line += f"; the verifier alone took {baseline.start_s:.0f} s to start and {baseline.sending_s:.0f} s to serve its rounds: about {rest / 60:.1f} min more"
    return line


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
    if args.repeats < 1 or (args.k and min(args.k) < 1):
        raise ServeCheckError("--repeats and every --k must be at least 1")

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    report_path = Path(args.evaluation or args.output) / REPORT
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    split, count, max_tokens = measured_settings(args, report)
    prompts = held_out_prompts(export.verifier, Path(args.data), split, count, args.trust_remote_code)
    ks = sorted(set(args.k)) if args.k else list(range(1, export.speculative_tokens + 3))
    levels, dropped = concurrency_levels(args.concurrency, len(prompts))
    head_k = export.speculative_tokens if export.speculative_tokens in ks else ks[0]
    table = Table(ks, levels, args.repeats, dropped)
    events.message(f"serving {export.directory} as the eagle3 draft of {export.verifier}: k {', '.join(map(str, ks))} at concurrency "
                   f"{', '.join(map(str, levels))}" + (f" ({', '.join(f'{c} dropped: {w}' for c, w in dropped.items())})" if dropped else "")
                   + f"; {len(prompts)} {split} prompts, up to {max_tokens} tokens each, {args.repeats} rounds a cell")
    starts = (2 if args.baseline_again else 1) if args.baseline else 0  # the verifier alone's
    servers = len(ks) + starts
    events.message(cost_line(servers, levels, args.repeats, len(prompts), None) + " (and one more for a schedule of k, where one is recommended)")

    logs = Path(args.events).resolve().parent if args.events else out
    with sigterm_raises():
        baseline = serve_rounds(args, events, export, None, prompts, max_tokens, levels, logs / "vllm-verifier.log") if args.baseline else None
        if baseline:
            fill(table, None, baseline)
            events.message(cost_line(servers, levels, args.repeats, len(prompts), baseline))
        by_k: dict[int, Served] = {}
        for k in ks:
            by_k[k] = served = serve_rounds(args, events, export, export.speculative_config(k), prompts, max_tokens, levels, logs / f"vllm-draft-k{k}.log")
            fill(table, k, served)
            if k == head_k:
                headline_figures(served, levels[0], len(prompts))  # no draft round: the line says why, before the other k
            events.message(f"k={k}: " + ", ".join(cell_words(table, k, c) for c in levels))
        if baseline and args.baseline_again:
            again = serve_rounds(args, events, export, None, prompts, max_tokens, levels, logs / "vllm-verifier-again.log")
            events.message("the verifier alone again: " + ", ".join(again_words(baseline, again, c) for c in levels))
            fill(table, None, again)
        recommendation = None
        if baseline:
            data_parallel = int(vllm_arg_value(args.vllm_arg, "--data-parallel-size") or 1)
            target = args.target_concurrency or levels[0]
            recommendation = recommend(table, {"method": "eagle3", "model": export.directory}, target, schedule_unsupported(data_parallel))
            if recommendation.schedule:
                on_schedule = serve_rounds(args, events, export, recommendation.speculative_config, prompts, max_tokens, levels, logs / "vllm-draft-schedule.log")
                scheduled = {level: [r.tokens_per_s for r in rounds] for level, rounds in on_schedule.rounds.items()}
                holds, said = schedule_holds(table, scheduled, recommendation.choices)
                recommendation = recommendation.checked(scheduled, holds, said)

    head = by_k[head_k]
    figures = headline_figures(head, levels[0], len(prompts))
    base_figures = headline_figures(baseline, levels[0], len(prompts)) if baseline else None
    ours = evaluate_figures(report)
    equal = sum(a == b for a, b in zip(head.first(levels[0]).replies, baseline.first(levels[0]).replies)) / len(prompts) if baseline else None
    result: dict[str, Any] = {
        "served": figures,
        "baseline": base_figures,
        "speedup": round(figures["tokens_per_s"] / base_figures["tokens_per_s"], 3) if base_figures and base_figures["tokens_per_s"] else None,
        "replies_equal": equal,
        "evaluate": ours,
        "k": head_k, "prompts": len(prompts), "split": split, "max_new_tokens": max_tokens,
        "table": table.to_json(),
        "recommendation": recommendation.to_json() if recommendation else None,
        "export": export.directory, "verifier": export.verifier,
        "vllm": f"{installed[0]} {installed[1]}" if installed else args.vllm_command,
    }
    tmp = out / (SERVED + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out / SERVED)
    events.metric(0, served_tau=figures["tau"], **{f"served_acceptance_{i + 1}": a for i, a in enumerate(figures["acceptance_per_position"])})
    line = f"served tau {figures['tau']:.2f} at k={head_k} (vLLM: 1 + {figures['accepted_tokens']} accepted / {figures['drafts']} drafts)"
    if ours:
        line += f"; evaluate's {ours['tau_per_draft']:.2f} on that definition (its tau {ours['tau']:.2f})"
    if base_figures:
        line += f"; {figures['tokens_per_s']:.1f} tokens/s with the draft, {base_figures['tokens_per_s']:.1f} without at concurrency {levels[0]}; replies equal {equal:.0%}"
    events.message(line)
    if equal is not None and equal < 1.0:
        events.warning(f"served replies with the draft differ from the verifier's own on {1 - equal:.0%} of prompts (greedy speculation should not change them)")
    for name, plot in (("acceptance.png", plot_served), ("speedup.png", plot_speedup)):
        if plot(result, out / name):
            events.artifact(str(out / name), kind="plot")
    events.artifact(str(out / SERVED), kind="report")
    events.message(recommendation.line if recommendation else "no recommendation: the verifier alone was not served (--no-baseline), so no speedup")
    summary = {"served_tau": figures["tau"], "delivered_tau": figures["delivered_tau"], "served_acceptance_per_position": figures["acceptance_per_position"],
               "evaluate_tau": ours["tau"] if ours else None, "tokens_per_s": figures["tokens_per_s"],
               "tokens_per_s_without_draft": base_figures["tokens_per_s"] if base_figures else None,
               "speedup": {f"{k}": {f"{c}": (round(s[0], 3) if (s := table.speedup(k, c)) else None) for c in levels} for k in ks},
               "report": str((out / SERVED).resolve())}
    if recommendation:
        summary.update(recommendation.summary())
    return summary


def cell_words(table: Table, k: int, level: int) -> str:
    taus = [t for t in table.cell(k, level).served_tau if t is not None]
    tau = f"tau {statistics.mean(taus):.2f}" if taus else "no tau"
    speedup = table.speedup(k, level)
    return f"{speedup[0]:.2f}x ±{speedup[1]:.2f} at {level} ({tau})" if speedup else f"{statistics.mean(table.cell(k, level).tokens_per_s):.1f} tokens/s at {level} ({tau})"


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
    save_figure(fig, path)
    return True


def save_figure(fig, path: Path) -> None:
    """Under a temporary name, then renamed: no half-written picture at its final path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def plot_speedup(result: dict, path: Path) -> bool:
    """Speedup against concurrency: one line per k (its spread as bars), the schedule's where it was
    served, the verifier alone at 1.0."""
    table = result["table"]
    if not table.get("baseline"):
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    levels = table["concurrency"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.axhline(1.0, color="#444444", linestyle="--", linewidth=1, label="verifier alone")
    for k in table["k"]:
        points = [(c, s) for c in levels if (s := table["speedup"][f"{k}"][f"{c}"])]
        if points:
            ax.errorbar([c for c, _ in points], [s["mean"] for _, s in points], yerr=[s["spread"] for _, s in points], marker="o", capsize=3, label=f"k = {k}")
    scheduled = (result.get("recommendation") or {}).get("scheduled_tokens_per_s") or {}
    if scheduled:
        base = {c: statistics.mean(v["tokens_per_s"]) for c, v in table["baseline"].items()}
        points = [(int(c), statistics.mean(ts) / base[c]) for c, ts in scheduled.items() if base.get(c)]
        ax.plot([c for c, _ in points], [s for _, s in points], color="black", marker="s", linewidth=2, label="schedule of k")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels)
    ax.set_xticklabels([str(c) for c in levels])
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("output tokens/s over the verifier alone")
    ax.set_title(f"served speedup ({result['prompts']} prompts, up to {result['max_new_tokens']} tokens, {table['repeats']} rounds a point)")
    ax.legend(loc="best", fontsize=8)
    save_figure(fig, path)
    return True


if __name__ == "__main__":
    sys.exit(main())
