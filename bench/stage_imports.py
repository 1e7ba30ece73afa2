"""The CPU a stage process spends on its imports, under two Pythons side by side (e.g. two
virtualenvs that differ by one package), alternated, the ratio printed:

    python bench/stage_imports.py --python A/.venv/bin/python --python B/.venv/bin/python [-n 5] [--record]

Each start imports MODULEs (default: the train stage's script and the speculators modules it
imports, what every torch stage process pays before its first line) in a fresh interpreter and
counts its user + system CPU seconds (getrusage of the child), with which of scikit-learn and
scipy it loaded (transformers imports both when they are installed). Half the suite's stage
processes spend most of their CPU here (bench/RESULTS.md, .ci/run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from results_file import record

REMOTE_SCRIPTS = Path(__file__).resolve().parents[1] / "remote_scripts"

PROBE = ("import importlib, json, sys; [importlib.import_module(m) for m in sys.argv[1:]]; "
         "print(json.dumps(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules)))")


def one_start(python: str, modules: list[str]) -> tuple[float, list[str]]:
    """(CPU seconds of one interpreter that imports `modules`, the optional packages it loaded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([python, "-c", PROBE, *modules], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REMOTE_SCRIPTS)}).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), json.loads(out.splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", action="append", required=True, help="an interpreter (twice: the first is the baseline)")
    p.add_argument("-n", type=int, default=5, help="starts per interpreter, alternated")
    p.add_argument("--module", action="append", default=None, help="imported in each start (default: the train stage's)")
    p.add_argument("--record", action="store_true", help="add a dated section to bench/RESULTS.md")
    a = p.parse_args()
    modules = a.module or ["train_draft", "speculators.train.trainer", "speculators.train.cli", "speculators.train.data"]
    one_start(a.python[0], modules)  # warm the page cache for both
    one_start(a.python[-1], modules)
    cpu: dict[str, list[float]] = {python: [] for python in a.python}
    loaded: dict[str, list[str]] = {}
    for _ in range(a.n):
        for python in a.python:
            seconds, loaded[python] = one_start(python, modules)
            cpu[python].append(seconds)
    rows = [f"| `{python}` | {statistics.median(cpu[python]):.2f} | {min(cpu[python]):.2f}-{max(cpu[python]):.2f} | {', '.join(loaded[python]) or 'neither'} |"
            for python in a.python]
    base, other = (statistics.median(cpu[python]) for python in (a.python[0], a.python[-1]))
    table = "\n".join(["| interpreter | CPU s (median) | range | scikit-learn, scipy loaded |", "| --- | ---: | --- | --- |", *rows])
    print(table)
    print(f"ratio (second / first): {other / base:.3f}; {base - other:+.2f} CPU s a stage process")
    if a.record:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        record("## bench/stage_imports.py", f"### {stamp}: `python bench/stage_imports.py {' '.join(sys.argv[1:])}` (imports: {', '.join(modules)}; {a.n} starts each, alternated)\n\n"
               f"{table}\n\nratio (second / first): **{other / base:.3f}** ({base - other:+.2f} CPU s a stage process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
