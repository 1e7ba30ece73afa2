"""bench/RESULTS.md: one heading per bench, its dated sections newest first under it."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().with_name("RESULTS.md")


def record(heading: str, section: str, results: Path = RESULTS) -> None:
    """Put `section` first under `heading` (added at the end when missing); other benches'
    sections stay as they are."""
    if not results.exists():
        results.write_text("# Benchmark results\n\nEach bench records a dated section under its own heading.\n")
    text = results.read_text()
    if heading not in text:
        text = text.rstrip("\n") + f"\n\n{heading}\n"
    head, _, rest = text.partition(heading)
    results.write_text(head + heading + "\n\n" + section.strip("\n") + "\n\n" + rest.lstrip("\n"))
