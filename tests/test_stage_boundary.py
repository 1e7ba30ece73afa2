"""A stage script never imports another stage script: what two stages share lives in
remote_scripts/common/, one module per concept. The stage scripts are the
.py files directly in remote_scripts/ (each one a command line); common/ may not import them
either. A check over the source (every import statement, also those inside functions), failing
with the file and line of each offence; the checker itself is tested on planted offences, so it
cannot pass by matching nothing."""

from __future__ import annotations

import ast
from pathlib import Path

REMOTE_SCRIPTS = Path(__file__).resolve().parent.parent / "remote_scripts"


def stage_names(root: Path) -> set[str]:
    return {p.stem for p in root.glob("*.py")}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level module name) of every import in `tree` (relative imports excepted)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def offences(root: Path) -> list[str]:
    """'file:line: imports stage X' for each import of a stage script by a stage script or by common/."""
    stages = stage_names(root)
    found = []
    for path in sorted([*root.glob("*.py"), *root.glob("common/**/*.py")]):
        own = path.stem if path.parent == root else None
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in imported_modules(tree):
            if module in stages and module != own:
                found.append(f"{path.relative_to(root.parent)}:{line}: imports stage script {module}.py (move what it shares into remote_scripts/common/)")
    return found


def test_no_stage_script_imports_another():
    assert stage_names(REMOTE_SCRIPTS) >= {"extract_hidden_states", "regenerate", "prepare_data", "train_draft"}
    found = offences(REMOTE_SCRIPTS)
    assert not found, "a stage script imports another:\n" + "\n".join(found)


def test_the_check_finds_every_form_of_import(tmp_path):
    root = tmp_path / "remote_scripts"
    (root / "common").mkdir(parents=True)
    (root / "alpha.py").write_text("import os\nfrom common.events import EventLog\n")
    (root / "beta.py").write_text(
        "import alpha\n"  # 1
        "from alpha import x\n"  # 2
        "def f():\n"
        "    import alpha as a\n"  # 4
        "from common import alpha_like\n"  # a common module named like no stage: fine
    )
    (root / "common" / "events.py").write_text("class EventLog: ...\n")
    (root / "common" / "shared.py").write_text("from beta import y\n")  # 1
    assert offences(root) == [
        "remote_scripts/beta.py:1: imports stage script alpha.py (move what it shares into remote_scripts/common/)",
        "remote_scripts/beta.py:2: imports stage script alpha.py (move what it shares into remote_scripts/common/)",
        "remote_scripts/beta.py:4: imports stage script alpha.py (move what it shares into remote_scripts/common/)",
        "remote_scripts/common/shared.py:1: imports stage script beta.py (move what it shares into remote_scripts/common/)",
    ]
