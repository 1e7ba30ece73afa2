"""bench/gpu/backends.py's ensure_verifier (bench/gpu/backends.py and bench/online.py take
--verifier and --gguf): a verifier directory is reused only when it was imported from the same
GGUF file in bf16 (its imported_from.json, written by remote_scripts/import_verifier.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.fixtures.pipeline_data import REPO_ROOT


def test_a_bench_reuses_an_imported_verifier_only_for_the_same_source(tmp_path):
    """bench/gpu/backends.py's ensure_verifier: a directory imported from this GGUF in bf16 is kept;
    one from another file, at another dtype or of unknown origin is refused in one line, not reused."""
    spec = importlib.util.spec_from_file_location("gpu_backends_bench", REPO_ROOT / "bench" / "gpu" / "backends.py")
    backends = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backends)  # by path: bench/gpu's module names stay off sys.path
    ensure_verifier = backends.ensure_verifier

    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    (verifier / "config.json").write_text("{}")
    imports = []
    run = lambda name, argv, log: imports.append(argv) or 1.0  # noqa: E731
    for made_from in (None, {"source": "other.gguf", "source_bytes": 64, "dtype": "bfloat16"}, {"source": gguf.name, "source_bytes": 64, "dtype": "float32"}):
        if made_from:
            (verifier / "imported_from.json").write_text(json.dumps(made_from))
        with pytest.raises(SystemExit, match="was not imported from --gguf"):
            ensure_verifier(str(verifier), str(gguf), run, tmp_path / "log")
    (verifier / "imported_from.json").write_text("{not json")
    with pytest.raises(SystemExit, match="was not imported from --gguf"):
        ensure_verifier(str(verifier), str(gguf), run, tmp_path / "log")
    with pytest.raises(SystemExit, match="no such file"):
        ensure_verifier(str(verifier), str(tmp_path / "missing.gguf"), run, tmp_path / "log")
    (verifier / "imported_from.json").write_text(json.dumps({"source": gguf.name, "source_bytes": 64, "dtype": "bfloat16"}))
    ensure_verifier(str(verifier), str(gguf), run, tmp_path / "log")
    ensure_verifier(str(verifier), None, run, tmp_path / "log")  # no --gguf: the directory as given
    assert imports == []
    ensure_verifier(str(tmp_path / "new"), str(gguf), run, tmp_path / "log")  # none yet: imported
    assert len(imports) == 1 and str(gguf) in map(str, imports[0])
