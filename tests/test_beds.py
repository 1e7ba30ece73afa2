"""A real test bed that cannot start: a failure naming the bed under CI, a loud skip elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

BROKEN_BED = '''
import pytest
from tests.fixtures.beds import bed_unavailable

@pytest.fixture
def broken_bed():
    bed_unavailable("sshd", "sshd exited with 255: no host key")

def test_needs_the_bed(broken_bed):
    pass
'''


def run_pytest(tmp_path: Path, ci: str | None, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "test_broken.py").write_text(BROKEN_BED)
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401 (the summary block)\n")
    # not the outer run's CI, nor its beds file: the inner run's broken bed is not the outer run's
    env = {**{k: v for k, v in os.environ.items() if k not in ("CI", "HARNESS_BEDS_NOT_STARTED")}, **(env or {})}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    # Seconds here (2-23 on a 2-core machine at load 7); the limit is for a stall, not a measure.
    # Once, on CI's busy machine, the xdist run printed its test's result and then nothing for
    # 120 s: should it hang again, every process of it prints where it stands (faulthandler, on
    # SIGABRT) into the failure.
    env["PYTHONFAULTHANDLER"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *args, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the inner pytest ran past 300 s; its output:\n{out}\nwhere its processes stood:\n{err[-20000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_under_ci_a_bed_that_cannot_start_fails_with_its_reason(tmp_path):
    r = run_pytest(tmp_path, "true")
    assert r.returncode == 1, r.stdout
    assert "1 error" in r.stdout and "test bed 'sshd' cannot start: sshd exited with 255: no host key" in r.stdout


def test_outside_ci_it_is_a_skip_said_loudly(tmp_path):
    r = run_pytest(tmp_path, None)
    assert r.returncode == 0, r.stdout
    assert "1 skipped" in r.stdout
    assert "TEST BEDS THAT DID NOT START" in r.stdout and "test bed 'sshd' cannot start" in r.stdout.split("TEST BEDS")[1]


def test_under_xdist_the_controller_says_it_too(tmp_path):
    """scripts/test.sh runs pytest-xdist lanes: the skip happens in a worker, the block is the
    controller's; and the lines go to the file scripts/test.sh repeats after pytest's output. One
    worker: its one test leaves no second worker idle (the hang above came with two)."""
    beds = tmp_path / "beds.txt"
    r = run_pytest(tmp_path, None, "-p", "xdist", "-n", "1", env={"HARNESS_BEDS_NOT_STARTED": str(beds)})
    assert r.returncode == 0, r.stdout
    assert "1 skipped" in r.stdout
    assert "TEST BEDS THAT DID NOT START" in r.stdout and "test bed 'sshd' cannot start" in r.stdout.split("TEST BEDS")[1]
    assert beds.read_text() == "test bed 'sshd' cannot start: sshd exited with 255: no host key\n"
