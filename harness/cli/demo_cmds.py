"""`harness demo`: the whole pipeline on this machine (the logic lives in harness.demo)."""

from __future__ import annotations

import json
import sys

import click

from harness.demo import DEMO_VERIFIERS


@click.command("demo")
@click.option("--workdir", type=click.Path(file_okay=False), default="demo-output", show_default=True, help="Where the demo writes everything (verifier, data, draft, report, runs).")
@click.option("-k", "--speculative-tokens", type=click.IntRange(1, 8), default=3, show_default=True, help="Tokens the draft proposes per verifier step.")
@click.option("--verifier", type=click.Choice(DEMO_VERIFIERS), default="llama", show_default=True, help="The tiny verifier: a small Llama, or a toy Kimi-K2.5 (multimodal wrapper around a DeepSeek-V3 MoE; slower).")
@click.option("--json", "as_json", is_flag=True, help="Print only the summary, as JSON (keys tau, acceptance_per_position, ...).")
def demo(workdir: str, speculative_tokens: int, verifier: str, as_json: bool) -> None:
    """Run the whole EAGLE-3 pipeline on this machine on a tiny verifier.

    No SSH and no container: the same sync, detached-run and stage code as on a GPU box, through
    the local transport. Stages: build and train a tiny verifier on a learnable chat language,
    regenerate (its data has replies: a copy), prepare, extract hidden states, train the draft,
    evaluate acceptance, export.
    """
    from pathlib import Path

    from harness.cli.render import EventRenderer
    from harness.demo import DemoOptions, run_demo

    options = DemoOptions(workdir=Path(workdir), speculative_tokens=speculative_tokens, verifier=verifier)
    # what a newcomer watches (the stages' own lines, bars, the table), whatever the output is
    renderer = EventRenderer(log_stream=sys.stderr if as_json else sys.stdout, screen=True,
                             whole_logs=f"{Path(workdir) / 'runs'}/RUN/STAGE/log")
    with renderer:
        summary = run_demo(options, renderer.feed)
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=2))
        return
    _print_summary(summary)


def _print_summary(summary) -> None:
    from rich.console import Console
    from rich.table import Table

    from harness.cli.render import plain

    table = Table(title=f"EAGLE-3 demo: run {summary.run_id} ({summary.seconds:.0f} s)", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("acceptance length tau", f"{summary.tau:.2f}  (k = {summary.k}, {summary.prompts} held-out prompts)")
    for i, a in enumerate(summary.acceptance_per_position, 1):
        table.add_row(f"accepted at position {i}", f"{a:.1%}")
    if summary.acceptance_per_position and min(summary.acceptance_per_position) >= 0.99 and summary.tau < summary.k + 1 - 0.05:
        table.add_row(f"why not {summary.k + 1}", "each reply's last round stops at its end (end of turn or the token budget): "
                      f"rounds average fewer than k + 1 = {summary.k + 1} tokens even when every proposal is accepted")
    if summary.training_tau:
        curve = " -> ".join(f"{t['tau']:.2f}" for t in summary.training_tau)
        table.add_row("tau while training", f"{curve}  (estimated at steps {', '.join(str(t['step']) for t in summary.training_tau)})")
    table.add_row("draft checkpoint", plain(summary.draft))
    table.add_row("vLLM export", plain(summary.export))
    table.add_row("report", plain(summary.report))
    for name, path in summary.plots.items():
        table.add_row(plain(f"plot: {name}"), plain(path))
    Console().print(table)
