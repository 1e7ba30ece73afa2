"""The draft-quality benchmark's parts: the replay equals chain speculation, the n-gram baseline
does what vLLM's does, and the standard-library verifier's build (bench/quality/run.py's own
verifier; the bench end to end is tests/test_smollm2.py's, on a real pretrained model)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from tests.fixtures.pipeline_data import SCRIPTS_DIR, run_script

sys.path.insert(0, str(SCRIPTS_DIR))
import evaluate  # noqa: E402

EOS = {0}


class ToyVerifier:
    """Greedy next token = a fixed function of the last two tokens (vocab 1..12, eos 0 after a
    long run): deterministic and repetitive enough for n-gram matches."""

    def _next(self, seq):
        if len(seq) > 60 and seq[-1] == 5:
            return 0
        return (seq[-1] * 3 + seq[-2]) % 11 + 1

    def forward(self, tokens):
        return [self._next(tokens[: i + 1]) if i >= 1 else 1 for i in range(len(tokens))], None


class NoisyProposer:
    """Right for a while, then wrong: exercises every acceptance length."""

    def __init__(self, verifier, seed):
        self.verifier, self.rng = verifier, random.Random(seed)

    def propose(self, tokens, view, k):
        seq, out = list(tokens), []
        for _ in range(k):
            t = self.verifier._next(seq) if self.rng.random() < 0.7 else 99
            out.append(t)
            seq.append(t)
        return out


@pytest.mark.parametrize("k,max_new", [(1, 40), (3, 40), (5, 97)])
def test_replay_equals_chain_speculation(k, max_new):
    verifier = ToyVerifier()
    for seed in range(6):
        prompt = [random.Random(seed).randrange(1, 12) for _ in range(8)]
        reference = evaluate.greedy_decode(verifier, prompt, max_new + k + 1, EOS)
        for make in (lambda: evaluate.NgramProposer(1, 4), lambda: NoisyProposer(verifier, seed)):
            spec = evaluate.speculate(verifier, make(), prompt, k, max_new, EOS)
            rep = evaluate.replay(make(), prompt, reference, None, k, max_new, EOS)
            assert (rep.generated, rep.rounds, rep.accepted, rep.trials) == (spec.generated, spec.rounds, spec.accepted, spec.trials)


def test_ngram_proposes_what_followed_the_longest_earlier_match():
    ngram = evaluate.NgramProposer(1, 4)
    # "7 8 9" occurred before, followed by "1 2"; the 4-gram "6 7 8 9" did not.
    assert ngram.propose([7, 8, 9, 1, 2, 5, 6, 7, 8, 9], None, 3) == [1, 2, 5]
    # The first occurrence of the longest matching suffix wins; past the context's end: -1.
    assert ngram.propose([4, 1, 4, 2, 4], None, 3) == [1, 4, 2]
    assert ngram.propose([3, 5, 3], None, 4) == [5, 3, -1, -1]
    assert ngram.propose([1, 2, 3], None, 2) == [-1, -1]


@pytest.mark.pipeline
def test_a_stdlib_verifier_is_built_with_prompts_from_files_it_did_not_train_on(tmp_path):
    """make_stdlib_verifier.py at a toy size on a few standard-library files: a loadable verifier,
    and prompts whose held-out rows come only from held-out files. (The bench's whole path through
    `harness run`, and the draft measured beside n-gram lookup, is tests/test_smollm2.py's.)"""
    import sysconfig

    from transformers import AutoModelForCausalLM, AutoTokenizer

    stdlib, out, data = tmp_path / "stdlib", tmp_path / "verifier", tmp_path / "chat.jsonl"
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "colorsys.py", "difflib.py", "calendar.py", "string.py", "base64.py", "csv.py"):
        (stdlib / name).parent.mkdir(parents=True, exist_ok=True)
        (stdlib / name).write_text(Path(sysconfig.get_paths()["stdlib"], name).read_text(encoding="utf-8"))
    run_script("make_stdlib_verifier.py", "--output", out, "--data-out", data, "--stdlib", stdlib, "--heldout-percent", "34", "--steps", "3",
               "--vocab-size", "512", "--train-prompts", "8", "--heldout-prompts", "4", "--heldout-chunks", "4", "--threads", "1", "--events", tmp_path / "events.jsonl")
    split = json.loads((out / "stdlib_split.json").read_text())
    assert split["train"] and split["heldout"] and not set(split["train"]) & set(split["heldout"])
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert {r["split"] for r in rows} == {"train", "heldout"}
    for r in rows:  # each prompt's source file is in its own split
        assert r["source"].rsplit(":", 1)[0] in split[r["split"]], r["source"]
    tokenizer, model = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)
    ids = tokenizer.apply_chat_template(rows[0]["messages"], add_generation_prompt=True, return_dict=True, return_tensors="pt")["input_ids"]
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]


# ---------------------------------------------------------------------------------------------
# The stdlib verifier's text and prompts (no model)

SOURCE = '''import os
from typing import Any


def add(a, b):
    """Add two numbers."""
    total = a + b
    return total


class Box:
    """A box."""

    @property
    def size(self) -> int:
        """The size."""
        return 3

    def empty(self):
        """Nothing after the docstring: no prompt."""
'''


def test_function_prompts_are_imports_then_signature_and_docstring():
    import make_stdlib_verifier as msv

    prompts = msv.function_prompts("pkg/mod.py", SOURCE)
    assert [p.source for p in prompts] == ["pkg/mod.py:5", "pkg/mod.py:15"]
    assert prompts[0].prompt == 'import os\nfrom typing import Any\n\n\ndef add(a, b):\n    """Add two numbers."""\n'
    assert prompts[0].body == "    total = a + b\n    return total\n"
    assert prompts[1].prompt.endswith('class Box:\n    @property\n    def size(self) -> int:\n        """The size."""\n')
    assert prompts[1].body == "        return 3\n"


def test_the_split_is_by_path_hash_and_test_directories_are_left_out(tmp_path):
    import make_stdlib_verifier as msv

    for rel in ("a.py", "pkg/b.py", "test/test_a.py", "pkg/tests/t.py", "idlelib/idle_test/x.py", "c.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    assert [p.relative_to(tmp_path).as_posix() for p in msv.stdlib_files(tmp_path)] == ["a.py", "pkg/b.py"]
    paths = [f"m{i}.py" for i in range(2000)]
    held = [p for p in paths if msv.is_heldout(p, 10.0)]
    assert 150 < len(held) < 250  # about 10 %
    assert set(held) <= {p for p in paths if msv.is_heldout(p, 20.0)}  # a larger share keeps these held out
