"""A script edit's rebuild after another build of the same Dockerfile, timed: before (the builder's
own cache: the newest image with an identical step) and after (`--cache-from` the last image built
from the same container/, harness.runtime.image), each twice, in one run on this machine's engine.

    python bench/rebuild_cache.py [--packages "numpy pandas"] [--repeat 2] [--record]

The project's container/Dockerfile on the test base image (scripts/make-test-base-image.sh) with
INSTALL_ML=0 and EXTRA_PIP_PACKAGES (from PyPI, through the pinned constraints): the pip layer
the edit should not re-run. One round: build A (untimed), then B (the same Dockerfile, other args,
--force: as the suite's other builds do), then edit a stage script and time A's rebuild through
`harness.runtime.image.build`. "before" is the same code with no cache named (what `build` did
before). Needs the Docker engine and PyPI; removes the images it made. --record appends the
figures to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_file import record  # noqa: E402
from harness.config import load_config  # noqa: E402
from harness.runtime import image  # noqa: E402
from harness.transport.local import LocalTransport  # noqa: E402
from tests.fixtures.docker_engine import BASE_IMAGE, container_table, ensure_base_image  # noqa: E402
from tests.fixtures.job_project import FAKE_STAGE, write_build_context, write_project  # noqa: E402

HOST_CA = "/etc/ssl/certs/ca-certificates.crt"  # pip in the image trusts what the host trusts (as tests/test_container_ml.py)
NO_CACHE_NAMED = 'if id=$(docker image inspect --format "{{.Id}}" "$1" 2>/dev/null) && docker tag "$1" "$2"; then echo "found $id"; exit 0; fi; echo cache'


def project(root: Path, tag: str, packages: str) -> Path:
    write_build_context(root)
    # a COPY layer of this run's own, so images of earlier runs are no cache
    (root / "container" / "requirements.txt").write_text((ROOT / "container" / "requirements.txt").read_text() + f"# bench {tag}\n")
    extra = {"ca_bundle": HOST_CA} if Path(HOST_CA).is_file() else {}
    return write_project(root, root / "work", {}, host_table={"runtime": "docker"},
                         container=container_table(BASE_IMAGE, image=f"harness-bench-rebuild-{tag}", build_args={"INSTALL_ML": "0", "EXTRA_PIP_PACKAGES": packages}, **extra))


def one_round(a: Path, b: Path, made: list[str]) -> float:
    transport = LocalTransport()
    ca, cb = load_config(a), load_config(b)
    scripts = a.parent / "remote_scripts" / "evaluate.py"
    scripts.write_text(FAKE_STAGE + f"# {os.urandom(4).hex()}\n")
    made.append(image.build(transport, ca, ca.host("box"), output=lambda _: None).image_id)
    made.append(image.build(transport, cb, cb.host("box"), output=lambda _: None, force=True).image_id)
    scripts.write_text(FAKE_STAGE + f"# edited {os.urandom(4).hex()}\n")
    t0 = time.monotonic()
    result = image.build(transport, ca, ca.host("box"), output=lambda _: None)
    seconds = time.monotonic() - t0
    assert result.built
    made.append(result.image_id)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", default="numpy pandas", help="EXTRA_PIP_PACKAGES of the pip layer")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    ensure_base_image()
    tag = os.urandom(4).hex()
    made: list[str] = []
    times: dict[str, list[float]] = {"before": [], "after": []}
    real = image._FIND_OR_CACHE
    try:
        with tempfile.TemporaryDirectory() as tmp:
            a = project(Path(tmp) / "a", tag, args.packages)
            b = project(Path(tmp) / "b", tag, "")
            for _ in range(args.repeat):
                for mode in ("before", "after"):
                    image._FIND_OR_CACHE = NO_CACHE_NAMED if mode == "before" else real
                    times[mode].append(one_round(a, b, made))
                    print(f"{mode}: {times[mode][-1]:.1f} s", flush=True)
    finally:
        image._FIND_OR_CACHE = real
        subprocess.run(["docker", "rmi", "-f", *dict.fromkeys(made)], capture_output=True, timeout=600)
    summary = ", ".join(f"{m} {' / '.join(f'{t:.1f}' for t in ts)} s (median {statistics.median(ts):.1f})" for m, ts in times.items())
    print(summary)
    if args.record:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        cpu = os.cpu_count()
        record("## bench/rebuild_cache.py (a script edit's rebuild after another build of the Dockerfile; issue 54)",
               f"### {when}: `python bench/rebuild_cache.py --packages \"{args.packages}\" --repeat {args.repeat} --record` ({cpu} cores, dockerd 20.10 classic builder)\n\n"
               f"- A script edit's rebuild of the image (INSTALL_ML=0, EXTRA_PIP_PACKAGES=\"{args.packages}\") after a --force build of the same "
               f"Dockerfile with other args: **{summary}**. before: the builder took the newer twin of the steps before the args "
               "differ and re-ran pip; after: `--cache-from` the last image built from the same container/, pip's layer reused.")


if __name__ == "__main__":
    main()
