"""A package the dev set-up installs that does not import: a failure under CI, a skip elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

NEEDS_A_MISSING_MODULE = '''
from tests.fixtures.requires import require_module

def test_needs_it():
    require_module("harness_no_such_module")
'''


@pytest.mark.parametrize("ci, code, outcome", [("true", 1, "1 failed"), (None, 0, "1 skipped")], ids=["under-ci", "elsewhere"])
def test_a_missing_module_fails_under_ci_and_skips_elsewhere(tmp_path, ci, code, outcome):
    (tmp_path / "test_missing.py").write_text(NEEDS_A_MISSING_MODULE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rfs", str(tmp_path)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == code, r.stdout
    assert outcome in r.stdout and "harness_no_such_module does not import" in r.stdout
