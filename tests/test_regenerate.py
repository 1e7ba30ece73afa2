"""regenerate.py: the verifier writes the replies (batched transformers, resume, shards, vllm stand-in)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.pipeline_data import SCRIPTS_DIR, offline_env, read_events, run_script

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(SCRIPTS_DIR))
import regenerate  # noqa: E402
from common.conversations import MalformedRow  # noqa: E402
from common.regenerated_data import file_sha256, meta_file  # noqa: E402

STAND_IN = Path(__file__).resolve().parent / "fixtures" / "vllm_stand_in.py"
MAX_NEW = 12


def _prompt_rows(tiny_verifier, n: int) -> list[dict]:
    """The first n training conversations cut after their first user turn (no reply yet)."""
    rows = [json.loads(line) for line in tiny_verifier.data.read_text().splitlines()]
    return [{"id": r["id"], "split": "train", "messages": r["messages"][:1]} for r in rows if r["split"] == "train"][:n]


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _greedy_replies(verifier: Path, rows: list[dict]) -> list[str]:
    """Each prompt decoded alone (no batching, no padding): what the batched stage must reproduce."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(verifier)
    model = AutoModelForCausalLM.from_pretrained(verifier).eval()
    out = []
    for r in rows:
        ids = tok(tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True), add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
        if tok.eos_token_id in gen:
            gen = gen[: gen.index(tok.eos_token_id)]
        out.append(tok.decode(gen, skip_special_tokens=True))
    return out


def _args(tiny_verifier, data, out, *extra):
    return ["--verifier", tiny_verifier.verifier, "--data", data, "--output", out, "--max-new-tokens", MAX_NEW, "--threads", 1, *extra]


# ---------------------------------------------------------------------------------------------
# Planning (no model)


def test_plan_answers_rows_without_a_reply_and_reports_malformed_lines(tmp_path):
    data = _write(tmp_path / "chat.jsonl", [
        {"messages": [{"role": "user", "content": "a"}]},
        {"messages": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "B"}]},
        "{not json",
        {"conversations": [{"from": "human", "value": "c"}]},
        {"split": "heldout", "messages": [{"role": "user", "content": "d"}]},
        {"messages": [{"role": "robot", "content": "e"}]},
    ])
    p = regenerate.plan(data, "train", replace=False, strict=False)
    assert [i.line for i in p.items] == [1, 4]
    assert len(p.rows) == 4 and p.malformed == 2
    assert p.malformed_lines[0].startswith(f"{data}:3: invalid JSON") and p.malformed_lines[1].startswith(f"{data}:6: turn 0 has unknown role")
    replaced = regenerate.plan(data, "train", replace=True, strict=False)
    assert [i.line for i in replaced.items] == [1, 2, 4]
    assert replaced.items[1].prompt == [{"role": "user", "content": "b"}]  # cut after the last user turn
    assert [i.line for i in regenerate.plan(data, "all", replace=False, strict=False).items] == [1, 4, 5]
    with pytest.raises(MalformedRow, match=":3: invalid JSON"):
        regenerate.plan(data, "train", replace=False, strict=True)


def test_data_with_replies_passes_through_without_the_model(tmp_path):
    rows = [{"id": "x", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    data = _write(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "out.jsonl"
    # No verifier exists at this path: the pass-through must not load one.
    assert regenerate.main(["--verifier", str(tmp_path / "none"), "--data", str(data), "--output", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert json.loads(meta_file(out).read_text())["source_sha256"] == file_sha256(data)


# ---------------------------------------------------------------------------------------------
# The transformers backend


def test_batched_greedy_replies_equal_one_by_one_decoding(tiny_verifier, tmp_path):
    rows = _prompt_rows(tiny_verifier, 10)
    data = _write(tmp_path / "chat.jsonl", [*rows[:4], "[1, 2]", *rows[4:]])
    out = tmp_path / "regenerated.jsonl"
    events = tmp_path / "events.jsonl"
    run_script("regenerate.py", *_args(tiny_verifier, data, out, "--batch-size", 4, "--events", events))
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in written] == [r["id"] for r in rows]
    assert [r["messages"][-1]["content"] for r in written] == _greedy_replies(tiny_verifier.verifier, rows)
    assert all(r["messages"][:-1] == rows[i]["messages"] and r["regenerated"]["tokens"] >= 1 for i, r in enumerate(written))
    log = read_events(events)
    assert any(f"{data}:5: expected a JSON object" in e.get("text", "") for e in log)
    assert log[-1]["status"] == "ok" and log[-1]["malformed"] == 1 and log[-1]["to_answer"] == 10
    assert not regenerate.parts_dir(out).exists()
    run_script("regenerate.py", *_args(tiny_verifier, data, out, "--batch-size", 4, "--events", events))
    assert read_events(events)[-1]["already_done"] is True  # a rerun on the same data and settings does nothing



def test_sampling_follows_the_seed_and_top_p(tiny_verifier, tmp_path):
    """--temperature > 0 samples: the same seed gives the same replies, another seed others, and a
    top-p that keeps only the likeliest token gives the greedy replies back. (--temperature 0,
    the default, is greedy: test_batched_greedy_replies_equal_one_by_one_decoding.)"""
    rows = _prompt_rows(tiny_verifier, 6)
    data = _write(tmp_path / "chat.jsonl", rows)

    def replies(name: str, *flags) -> list[str]:
        out = tmp_path / f"{name}.jsonl"
        run_script("regenerate.py", *_args(tiny_verifier, data, out, "--batch-size", 3, *flags))
        return [json.loads(line)["messages"][-1]["content"] for line in out.read_text().splitlines()]

    seed1 = replies("seed1", "--temperature", 2.0, "--seed", 1)
    assert replies("seed1-again", "--temperature", 2.0, "--seed", 1) == seed1
    assert replies("seed2", "--temperature", 2.0, "--seed", 2) != seed1
    greedy = _greedy_replies(tiny_verifier.verifier, rows)
    assert seed1 != greedy  # it sampled
    assert replies("top-p", "--temperature", 2.0, "--top-p", 1e-6, "--seed", 1) == greedy

def test_killed_regenerate_resumes_and_shards_merge(tiny_verifier, tmp_path):
    rows = _prompt_rows(tiny_verifier, 12)
    data = _write(tmp_path / "chat.jsonl", rows)
    whole = tmp_path / "whole.jsonl"
    run_script("regenerate.py", *_args(tiny_verifier, data, whole, "--batch-size", 3))

    out = tmp_path / "sharded.jsonl"
    part = regenerate.part_path(out, 0, 2)
    argv = [sys.executable, str(SCRIPTS_DIR / "regenerate.py"), *map(str, _args(tiny_verifier, data, out, "--batch-size", 1, "--rank", 0, "--world-size", 2))]
    proc = subprocess.Popen(argv, env=offline_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if part.exists() and len(part.read_text().splitlines()) >= 3:  # header + 2 replies
            break
        time.sleep(0.2)
    assert proc.poll() is None, "rank 0 finished before it could be interrupted"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with open(part, "a") as f:
        f.write('{"item": 5, "te')  # a torn last line, as a kill mid-write leaves it
    assert not out.exists()

    events = tmp_path / "rank0.jsonl"
    run_script("regenerate.py", *_args(tiny_verifier, data, out, "--batch-size", 1, "--rank", 0, "--world-size", 2, "--events", events))
    finished = read_events(events)[-1]
    assert finished["kept_from_before"] >= 2 and finished["kept_from_before"] + len(_generated(events)) == 6
    assert not out.exists()  # rank 1's range is still missing
    run_script("regenerate.py", *_args(tiny_verifier, data, out, "--batch-size", 4, "--rank", 1, "--world-size", 2))
    assert out.read_text() == whole.read_text()


def _generated(events: Path) -> list[dict]:
    return [e for e in read_events(events) if e["event"] == "progress"]


def test_other_settings_start_over(tiny_verifier, tmp_path):
    rows = _prompt_rows(tiny_verifier, 4)
    data = _write(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "out.jsonl"
    part = regenerate.part_path(out, 0, 2)
    run_script("regenerate.py", *_args(tiny_verifier, data, out, "--rank", 0, "--world-size", 2))
    events = tmp_path / "events.jsonl"
    run_script("regenerate.py", *_args(tiny_verifier, data, out, "--rank", 0, "--world-size", 2, "--max-new-tokens", 5, "--events", events))
    assert read_events(events)[-1]["kept_from_before"] == 0
    assert json.loads(part.read_text().splitlines()[1])["tokens"] <= 5


def test_prepare_reads_the_regenerated_file_only_when_it_matches_the_data(tiny_verifier, tmp_path):
    import prepare_data

    rows = _prompt_rows(tiny_verifier, 6)
    data = _write(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "regenerated.jsonl"
    run_script("regenerate.py", *_args(tiny_verifier, data, out))
    prepared = tmp_path / "prepared"
    assert prepare_data.main(["--verifier", str(tiny_verifier.verifier), "--data", str(data), "--regenerated", str(out), "--output", str(prepared)]) == 0
    assert json.loads((prepared / "prepare_report.json").read_text())["rows_kept"] == 6
    _write(data, rows[:3])  # the data changed: the regenerated file is stale
    assert prepare_data.main(["--verifier", str(tiny_verifier.verifier), "--data", str(data), "--regenerated", str(out), "--output", str(prepared), "--events", str(tmp_path / "e.jsonl")]) == 1
    assert "ignoring" in " ".join(e.get("text", "") for e in read_events(tmp_path / "e.jsonl"))  # and no reply in the data: nothing to train on


# ---------------------------------------------------------------------------------------------
# The vllm backend, around a stand-in server


def test_vllm_backend_serves_the_verifier_and_stops_it(tiny_verifier, tmp_path):
    rows = _prompt_rows(tiny_verifier, 5)
    data = _write(tmp_path / "chat.jsonl", rows)
    out, record = tmp_path / "out.jsonl", tmp_path / "record.json"
    run_script("regenerate.py", *_args(
        tiny_verifier, data, out, "--backend", "vllm", "--concurrency", 2, "--batch-size", 2,
        "--vllm-command", f"{sys.executable} {STAND_IN} --record {record}", "--health-timeout", 300, "--stop-grace", 5,
    ))
    seen = json.loads(record.read_text())
    serve = seen["argv"].index("serve")
    assert seen["argv"][serve + 1] == str(tiny_verifier.verifier)
    assert "--speculative-config" not in seen["argv"] and "--kv-transfer-config" not in seen["argv"]
    # no TCP port: a unix socket in a directory of the stage's own, gone with the server
    assert "--port" not in seen["argv"] and "--host" not in seen["argv"]
    socket_dir = Path(seen["argv"][seen["argv"].index("--uds") + 1]).parent
    assert socket_dir.parent == Path("/tmp") and socket_dir.name.startswith("harness-vllm-") and not socket_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(seen["pgid"], 0)  # the server's whole process group is gone
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["messages"][-1]["content"] for r in written] == _greedy_replies(tiny_verifier.verifier, rows)


def test_vllm_server_that_dies_fails_with_its_log(tiny_verifier, tmp_path):
    data = _write(tmp_path / "chat.jsonl", _prompt_rows(tiny_verifier, 2))
    out = tmp_path / "out.jsonl"
    events = tmp_path / "events.jsonl"
    proc = run_script("regenerate.py", *_args(
        tiny_verifier, data, out, "--backend", "vllm",
        "--vllm-command", f"{sys.executable} {STAND_IN} --mode die", "--health-timeout", 300, "--events", events,
    ), check=False)
    assert proc.returncode == 1
    error = read_events(events)[-1]["error"]
    assert error.startswith("ServerFailed: vllm serve exited with status 3") and "CUDA out of memory (simulated)" in error
    assert not out.exists()


@pytest.mark.parametrize(("device", "given", "expected"), [("cpu", 0, regenerate.CPU_MAX_BATCH_TOKENS), ("cuda:0", 0, None), ("cuda:0", 4096, 4096), ("cpu", 512, 512)])
def test_the_prompt_token_cap_of_a_batch_applies_on_cpu_or_when_given(device, given, expected):
    """On a GPU the memory-sized batch alone bounds a generate call (a decode step of a small model
    there is launch-bound: rows are nearly free); on CPU, or when --max-batch-tokens is given, the
    cap holds."""
    import argparse

    backend = object.__new__(regenerate.TransformersBackend)
    backend.device, backend.args = device, argparse.Namespace(max_batch_tokens=given)
    cap = backend.max_batch_tokens()
    assert cap == expected if expected is not None else cap >= 1 << 30
    assert regenerate.parse_args(["--verifier", "v", "--data", "d", "--output", "o"]).max_batch_tokens == 0


# ---------------------------------------------------------------------------------------------
# The data levers: several replies per prompt, loops kept, dropped or trimmed


@pytest.mark.parametrize(("given", "prompts", "on_gpu", "expected"), [
    (0, 50, False, 1), (0, 50, True, regenerate.AUTO_MAX_PER_PROMPT),
    (0, regenerate.AUTO_TARGET_REPLIES // 3 + 1, True, 3), (0, regenerate.AUTO_TARGET_REPLIES, True, 1), (0, 10 * regenerate.AUTO_TARGET_REPLIES, True, 1),
    (2, 10 * regenerate.AUTO_TARGET_REPLIES, True, 2), (5, 3, False, 5),
])
def test_replies_per_prompt_auto_adds_replies_only_on_a_gpu_where_the_prompts_are_few(given, prompts, on_gpu, expected):
    assert regenerate.replies_per_prompt(given, prompts, on_gpu) == expected


def test_several_replies_per_prompt_the_greedy_one_first_and_seeded(tiny_verifier, tmp_path):
    """--replies-per-prompt 3: each prompt's rows together, the first its greedy reply (what
    one-by-one greedy decoding gives), the two others sampled; the same seed writes the same file."""
    rows = _prompt_rows(tiny_verifier, 5)
    data = _write(tmp_path / "chat.jsonl", rows)

    def written(name: str, *flags) -> tuple[list[dict], dict]:
        out, events = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.events.jsonl"
        run_script("regenerate.py", *_args(tiny_verifier, data, out, "--batch-size", 4, "--replies-per-prompt", 3, "--sample-temperature", 2.0,
                                           "--events", events, *flags))
        return [json.loads(line) for line in out.read_text().splitlines()], read_events(events)[-1]

    first, summary = written("seed1", "--seed", 1)
    assert summary["prompts"] == 5 and summary["replies_per_prompt"] == 3 and summary["to_answer"] == 15 and summary["loops"]["replies"] == 15
    assert [r["id"] for r in first] == [r["id"] for r in rows for _ in range(3)]
    assert [r["regenerated"]["reply"] for r in first] == [0, 1, 2] * 5
    assert all(r["messages"][:-1] == rows[i // 3]["messages"] for i, r in enumerate(first))
    greedy = [r["messages"][-1]["content"] for r in first[::3]]
    assert greedy == _greedy_replies(tiny_verifier.verifier, rows)
    sampled = [r["messages"][-1]["content"] for i, r in enumerate(first) if i % 3]
    assert sampled != [g for g in greedy for _ in range(2)]  # it sampled

    again, _ = written("seed1-again", "--seed", 1)
    assert again == first
    # (the default, auto, is one reply per prompt on this CPU: every other test here)


def test_loops_are_counted_per_category_and_trimmed(tiny_verifier, tmp_path):
    """Whatever the tiny verifier loops on: the report counts every reply, per category, and
    trim writes every reply with the looping ones cut short (drop: the merge's test below)."""
    rows = [{**r, "category": "odd" if i % 2 else "even"} for i, r in enumerate(_prompt_rows(tiny_verifier, 6))]
    data = _write(tmp_path / "chat.jsonl", rows)
    found = {}
    for loops in ("keep", "trim"):
        out, events = tmp_path / f"{loops}.jsonl", tmp_path / f"{loops}.events.jsonl"
        run_script("regenerate.py", *_args(tiny_verifier, data, out, "--max-new-tokens", 48, "--loops", loops, "--events", events))
        found[loops] = ([json.loads(line) for line in out.read_text().splitlines()], read_events(events)[-1])
    kept, report = found["keep"][0], found["keep"][1]["loops"]
    looping = [r["regenerated"]["looping"] for r in kept]
    assert report["replies"] == 6 and report["looping"] == sum(looping)
    assert report["by_category"] == {c: {"replies": 3, "looping": n, "share": round(n / 3, 4)}
                                     for c, n in (("even", sum(looping[0::2])), ("odd", sum(looping[1::2])))}
    trimmed = found["trim"][0]
    assert len(trimmed) == 6 and [r["regenerated"]["trimmed"] for r in trimmed] == looping
    for a, b, loop in zip(kept, trimmed, looping):
        assert (len(b["messages"][-1]["content"]) < len(a["messages"][-1]["content"])) if loop else b == a


def test_a_looping_reply_is_trimmed_to_where_its_loop_began():
    from common.loops import LOOP_WINDOW, is_looping, loop_period, trimmed_length

    prose = list(range(100, 160))
    sentence = list(range(30, 45))
    reply = prose[:20] + sentence * 3
    assert is_looping(reply, {2}) and loop_period(reply) == len(sentence)
    assert trimmed_length(reply, len(sentence)) == 20 + len(sentence)  # up to the loop, and the sentence once
    ones = prose[:20] + [7, 8] * 20
    assert trimmed_length(ones, loop_period(ones)) == 22
    assert loop_period(prose[:LOOP_WINDOW + 8]) is None

    def reply_of(text, looping):
        return regenerate.Reply(text, 10, "length" if looping else "stop", looping, text[:3] if looping else None)

    p = regenerate.Plan(rows=[(1, {"id": "a", "category": "x"}, [{"role": "user", "content": "q"}]), (2, {"id": "b"}, [{"role": "user", "content": "r"}])], items=[])
    p.items = regenerate.with_replies([regenerate.Item(0, 1, [{"role": "user", "content": "q"}], category="x"), regenerate.Item(1, 2, [{"role": "user", "content": "r"}])], 2)
    replies = {0: reply_of("greedy a", False), 1: reply_of("looping a", True), 2: reply_of("looping b", True), 3: reply_of("sampled b", False)}
    assert [r["messages"][-1]["content"] for r in regenerate.merged_rows(p, replies, "keep")] == ["greedy a", "looping a", "looping b", "sampled b"]
    assert [r["messages"][-1]["content"] for r in regenerate.merged_rows(p, replies, "drop")] == ["greedy a", "sampled b"]
    assert [r["messages"][-1]["content"] for r in regenerate.merged_rows(p, replies, "trim")] == ["greedy a", "loo", "loo", "sampled b"]
    assert regenerate.loop_report(p.items, replies) == {"replies": 4, "looping": 2, "share": 0.5, "by_category": {
        "other": {"replies": 2, "looping": 1, "share": 0.5}, "x": {"replies": 2, "looping": 1, "share": 0.5}}}


def test_every_user_turn_answered_in_order_with_the_verifiers_own_history(tiny_verifier, tmp_path):
    """--turns all (with --replace: the data's replies are the user's history no more): the
    verifier answers each user turn after its own earlier replies; each reply is the greedy
    continuation of exactly that history (one-by-one decoding), one row per conversation."""
    users = [r["messages"][0] for r in _prompt_rows(tiny_verifier, 6)]
    rows = [{"id": f"c{i}", "messages": [users[2 * i], {"role": "assistant", "content": "the data's reply"}, users[2 * i + 1]]} for i in range(3)]
    data = _write(tmp_path / "chat.jsonl", rows)
    out, events = tmp_path / "turns.jsonl", tmp_path / "events.jsonl"
    run_script("regenerate.py", *_args(tiny_verifier, data, out, "--turns", "all", "--replace", "--events", events))
    assert read_events(events)[-1]["to_answer"] == 6
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in written] == ["c0", "c1", "c2"] and all(r["regenerated"]["turns"] == 2 for r in written)
    assert [[m["role"] for m in r["messages"]] for r in written] == [["user", "assistant", "user", "assistant"]] * 3
    assert [r["messages"][0] for r in written] == users[0::2] and [r["messages"][2] for r in written] == users[1::2]
    first = _greedy_replies(tiny_verifier.verifier, [{"messages": [users[2 * i]]} for i in range(3)])
    assert [r["messages"][1]["content"] for r in written] == first  # not "the data's reply"
    second = _greedy_replies(tiny_verifier.verifier, [{"messages": r["messages"][:3]} for r in written])
    assert [r["messages"][3]["content"] for r in written] == second
