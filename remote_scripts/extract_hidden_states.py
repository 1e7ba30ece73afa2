"""Verifier hidden states -> speculators' offline files `hs_<i>.safetensors`, one per prepared row.

Each file holds `hidden_states` bf16 [T, k+1, H] (the inputs of the k auxiliary decoder layers,
then the last layer's output BEFORE the final norm, as vLLM's extract_hidden_states returns it)
and `token_ids` [T], row i's input_ids; OUTPUT/extract_meta.json records the layers, hidden size
and verifier path, for train to check. Two backends: transformers (forward hooks on the
verifier, batched, writing overlapped with compute, resumable) and vllm (`vllm serve` with
hidden-state extraction, then speculators' `generate-offline-data`; common/vllm_server.py).
Sharded by `--rank/--world-size` (or torchrun's environment); every rank ends by verifying that
each of its samples has exactly one valid file (`--verify-only`: just that check).
The file format and the backends for users: docs/pipeline.md, "Extract"; how the transformers
backend overlaps its work: docs/architecture/stage-scripts.md, "The stage scripts".
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.events import EventLog  # noqa: E402
from common.hidden_state_capture import HiddenStateCapture  # noqa: E402
from common.hidden_state_files import META_FILE, check_file, hs_path  # noqa: E402
from common.sharding import plan_batches, run_sharded_stage, shard_range  # noqa: E402
from common.vllm_server import ServerFailed, StageCancelled, add_connector_argument, add_serve_arguments  # noqa: E402

STAGE = "extract"


# ---------------------------------------------------------------------------------------------
# Validation of a shard's files (common/hidden_state_files.py holds the layout)


def verify_shard(output: Path, dataset, indices: range, num_layers: int | None, hidden: int | None) -> dict[int, str]:
    """{index: problem} for every sample in `indices` without exactly one valid file."""
    problems = {}
    for i in indices:
        why = check_file(hs_path(output, i), dataset[i]["input_ids"].tolist(), num_layers, hidden)
        if why:
            problems[i] = why
    return problems


def describe_gaps(problems: dict[int, str], limit: int = 5) -> str:
    shown = ", ".join(f"hs_{i} ({why})" for i, why in sorted(problems.items())[:limit])
    more = f" and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"{len(problems)} sample(s) without a valid file: {shown}{more}"


# ---------------------------------------------------------------------------------------------
# The transformers backend


@dataclass
class CaptureSpec:
    layer_ids: list[int]  # id i: the input of decoder layer i; id N: the pre-norm output of the last layer
    num_layers: int
    hidden: int


class AsyncWriter:
    """Saves hidden-state files on a thread pool while the next batch computes.

    One task per file, so the rows of one batch are written in parallel (the last batch's files,
    which no later compute hides, take a thread each). Each file goes to
    `hs_<i>.safetensors.tmp-<pid>` and is renamed into place, so a crash never leaves a truncated
    file under the final name. At most `max_pending` batches are in flight (bounds host memory).
    On CUDA, `submit` gets a host tensor whose copy may still be running and the event that marks
    its end, and `done` (the pinned ring's give-back), called once all of the batch's files are
    written.
    """

    def __init__(self, output: Path, threads: int, max_pending: int = 4):
        self.output = output
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hs-writer")
        self.pending: "queue.Queue[list[Future]]" = queue.Queue()
        self.max_pending = max_pending
        self.written = 0
        self._lock = threading.Lock()

    def submit(self, host_batch, lengths: list[int], indices: list[int], token_ids: list, ready_event=None, done=None) -> None:
        while self.pending.qsize() >= self.max_pending:
            self._wait(self.pending.get())
        remaining = [len(indices)]

        def file_finished() -> None:
            with self._lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last and done is not None:
                done()

        self.pending.put([
            self.pool.submit(self._write_file, host_batch, row, n, index, ids, ready_event, file_finished)
            for row, (n, index, ids) in enumerate(zip(lengths, indices, token_ids))
        ])

    def _write_file(self, host_batch, row: int, n: int, index: int, ids, ready_event, finished) -> None:
        from safetensors.torch import save_file

        try:
            if ready_event is not None:
                ready_event.synchronize()  # the side-stream device->host copy has landed
            final = hs_path(self.output, index)
            tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
            try:
                save_file({"hidden_states": host_batch[row, :n].contiguous(), "token_ids": ids}, str(tmp))
                os.replace(tmp, final)
            except BaseException:
                tmp.unlink(missing_ok=True)  # a disk-full half file must not pile up beside the others
                raise
            with self._lock:
                self.written += 1
        finally:
            finished()

    @staticmethod
    def _wait(futures: "list[Future]") -> None:
        for f in futures:
            f.result()

    def drain(self) -> None:
        while not self.pending.empty():
            self._wait(self.pending.get())

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self.pool.shutdown(wait=True)


class PinnedRing:
    """Page-locked host buffers for the device->host copies, allocated once and reused.

    Pinning memory (cudaHostAlloc) is slow, hundreds of milliseconds per GiB, and a fresh pinned
    tensor per batch paid that on the compute thread for every batch until torch's host cache
    warmed up. The ring pins `slots` buffers of the largest batch before the first batch; the
    writer gives each back once its files are written, and the compute loop waits for a free one
    (the back-pressure that bounds host memory).
    """

    def __init__(self, slots: int, nbytes: int, pin: bool = True):
        import torch

        self.free: "queue.Queue" = queue.Queue()
        for _ in range(slots):
            self.free.put(torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin))  # pin=False: tests on CPU

    def take(self, shape, dtype):
        """A free buffer viewed as `shape`/`dtype`, and the callback that gives it back."""
        import math

        import torch

        buf = self.free.get()
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return buf[:nbytes].view(dtype).view(shape), lambda: self.free.put(buf)


def default_writer_threads(cpu_count: int, local_processes: int) -> int:
    """Saving is a copy into the page cache; an 8B verifier on an H200 produces ~4 GiB/s of it (32
    KiB per token). On 2 x H200 (bench/gpu/gpu_bench.py) 2 threads fell behind and 8 were no
    faster than 4. Half of this process's share of the CPUs, 1 to 4."""
    return max(1, min(4, cpu_count // (2 * max(1, local_processes))))


def extract_transformers(args: argparse.Namespace, events: EventLog, dataset, indices: range, rank: int, local_rank: int) -> dict:
    import torch

    from common.verifier import check_target_layers, default_target_layers, load_verifier, locate_decoder

    device = args.device or (f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    elif args.threads:
        torch.set_num_threads(args.threads)
    model = load_verifier(args.verifier, device=device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    parts = locate_decoder(model)
    layer_ids = check_target_layers(args.layers or default_target_layers(parts.num_layers), parts.num_layers)
    hidden = int(parts.embed_tokens.weight.shape[1])
    spec = CaptureSpec(layer_ids, parts.num_layers, hidden)
    output = Path(args.output)
    if rank == 0:
        write_meta(output, args, spec, backend="transformers")
    events.message(f"rank {rank}: verifier {parts.path} ({parts.num_layers} layers, hidden {hidden}, {next(model.parameters()).dtype}) on {device}; layers {layer_ids} + pre-norm last; samples {indices.start}..{indices.stop - 1}")

    # Resume: skip valid files; anything else (missing, truncated, stale) is (re)generated.
    todo: dict[int, int] = {}
    regenerate = 0
    for i in indices:
        ids = dataset[i]["input_ids"]
        why = check_file(hs_path(output, i), ids.tolist(), len(layer_ids) + 1, hidden)
        if why is None:
            continue
        if why != "missing":
            regenerate += 1
            events.message(f"hs_{i}.safetensors is invalid ({why}); regenerating")
        todo[i] = int(ids.shape[0])
    skipped = len(indices) - len(todo)
    if skipped:
        events.message(f"rank {rank}: {skipped} valid file(s) kept, {len(todo)} to compute")

    capture = HiddenStateCapture(parts, layer_ids)
    batches = plan_batches(todo, args.batch_size, args.max_batch_tokens, args.tail_rows)
    on_cuda = device.startswith("cuda")
    ring = None
    if on_cuda and batches:
        # Pinned buffers and the first kernels' set-up (cuBLAS handles, kernel choice) are paid
        # once, here, not inside the first batches: tokens_per_s is the loop's steady rate.
        t0 = time.monotonic()
        largest = max(len(b) * max(todo[i] for i in b) for b in batches)
        slot_bytes = largest * (len(layer_ids) + 1) * hidden * 2  # bf16 [B, S, k+1, H]
        ring = PinnedRing(args.host_buffers, slot_bytes)
        with torch.inference_mode():
            warm = torch.zeros((1, min(128, largest)), dtype=torch.long, device=device)
            capture.run(warm, torch.ones_like(warm))
        torch.cuda.synchronize()
        events.message(f"rank {rank}: pinned {args.host_buffers} x {slot_bytes / 2**30:.2f} GiB host buffers and warmed up in {time.monotonic() - t0:.1f} s")
    writer = AsyncWriter(output, threads=args.writer_threads, max_pending=args.host_buffers)
    copy_stream = torch.cuda.Stream() if on_cuda else None
    pad_id = 0
    done = 0
    started = time.monotonic()
    tokens = 0
    waited_for_writer = 0.0  # the compute loop blocked on a free host buffer: writing is the bound
    try:
        with torch.inference_mode():
            for batch in batches:
                rows = [dataset[i]["input_ids"] for i in batch]
                lengths = [int(r.shape[0]) for r in rows]
                width = max(lengths)
                input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
                attention = torch.zeros((len(rows), width), dtype=torch.long)
                for r, ids in enumerate(rows):
                    input_ids[r, : lengths[r]] = ids
                    attention[r, : lengths[r]] = 1
                states = capture.run(input_ids.to(device), attention.to(device)).to(torch.bfloat16)
                t_wait = time.monotonic()
                host, ready, give_back = _to_host(states, copy_stream, ring)
                writer.submit(host, lengths, batch, [r.to(torch.long) for r in rows], ready, give_back)
                waited_for_writer += time.monotonic() - t_wait
                done += len(batch)
                tokens += sum(lengths)
                if local_rank == 0:  # one progress stream per host
                    events.progress(done, len(todo), unit="samples")
        t_drain = time.monotonic()
        writer.drain()
        drain = time.monotonic() - t_drain
    finally:
        capture.close()
        writer.close()
    seconds = time.monotonic() - started
    return {
        "computed": done,
        "loop_seconds": round(seconds, 3),
        "waited_for_writer_s": round(waited_for_writer, 3),
        "final_drain_s": round(drain, 3),
        "writer_threads": args.writer_threads,
        "skipped_valid": skipped,
        "regenerated": regenerate,
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 and tokens else 0.0,
        "layers": layer_ids,
        "num_layers": len(layer_ids) + 1,
        "hidden": hidden,
    }


def _to_host(states, copy_stream, ring: PinnedRing | None):
    """Device -> host. On CUDA: into a pinned ring buffer on a side stream, returning the event
    the writer waits for (so the compute stream moves on to the next batch at once) and the
    buffer's give-back."""
    import torch

    if copy_stream is None:
        return states.contiguous(), None, None
    host, give_back = ring.take(states.shape, states.dtype)
    copy_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(copy_stream):
        host.copy_(states, non_blocking=True)
        states.record_stream(copy_stream)  # keep the device buffer alive until the copy is done
        ready = torch.cuda.Event()
        ready.record(copy_stream)
    return host, ready, give_back


def extract_vllm(args: argparse.Namespace, events: EventLog, dataset, indices: range, rank: int, world: int, local_rank: int) -> dict:
    """Start vllm serve (one per process, on a socket of its own; one GPU each when tensor parallel is 1),
    run speculators' generate-offline-data for this shard, and always stop the server."""
    import shlex

    from transformers import AutoConfig

    from common.verifier import check_target_layers, default_target_layers, hidden_size, num_hidden_layers
    from common.vllm_server import ManagedServer, hidden_state_server, log_tail, offline_data_argv, private_socket, rank_env, refuse_before_serving, run_supervised, sigterm_raises

    config = AutoConfig.from_pretrained(args.verifier, trust_remote_code=args.trust_remote_code)
    connector = refuse_before_serving(args, config, what="extract --backend vllm writes bf16 files (what train reads)")
    n, hidden = num_hidden_layers(config), hidden_size(config)
    layer_ids = check_target_layers(args.layers or default_target_layers(n), n)
    output = Path(args.output)
    staging = str(Path(args.staging_dir or output / ".staging") / f"rank{rank}")
    if rank == 0:
        write_meta(output, args, CaptureSpec(layer_ids, n, hidden), backend="vllm")

    # generate-offline-data skips any readable file; one for another row (stale) must go first.
    stale = 0
    for i in indices:
        path = hs_path(output, i)
        if path.exists() and check_file(path, dataset[i]["input_ids"].tolist(), len(layer_ids) + 1, hidden):
            path.unlink()
            stale += 1
    if stale:
        events.message(f"rank {rank}: removed {stale} invalid file(s) for regeneration")

    env = rank_env(local_rank, args.tensor_parallel_size)
    server_log = Path(args.server_log or output / f"vllm_server.rank{rank}.log")
    client_log = output / f"generate_offline_data.rank{rank}.log"
    launcher = shlex.split(args.offline_command) if args.offline_command else [sys.executable, str(Path(__file__).resolve().parent / "common" / "speculators_compat.py"), "generate-offline-data"]

    def progress() -> None:
        if local_rank == 0:
            events.progress(sum(hs_path(output, i).exists() for i in indices), len(indices), unit="samples")

    started = time.monotonic()
    # a unix socket in a 0700 directory of this rank's: no other uid of the box reaches it
    with sigterm_raises(), private_socket() as uds:
        opts = hidden_state_server(args, layer_ids, n, staging, uds, connector)
        client_argv = offline_data_argv(launcher, opts, args.prepared, str(output), rank, world, args.concurrency)
        with ManagedServer(opts, server_log, stop_grace=args.stop_grace, env=env) as server:
            events.message(f"rank {rank}: vllm serve on {opts.where} (its workers in {server.network}), layers {layer_ids}, hidden-states connector {connector}; log {server_log}")
            waited = server.wait_healthy(args.health_timeout)
            events.message(f"rank {rank}: vllm serve healthy after {waited:.0f} s; running generate-offline-data (log {client_log})")
            # generate-offline-data skips a sample whose request failed after its retries; a second
            # pass (it resumes: only missing files) catches transient failures. Gaps left after the
            # last pass fail the stage in the final verification.
            for attempt in range(1, args.offline_passes + 1):
                code = run_supervised(client_argv, client_log, server=server, on_tick=progress)
                if code != 0:
                    raise RuntimeError(f"generate-offline-data exited with status {code}; log {client_log}: {log_tail(client_log, 5)}")
                missing = sum(not hs_path(output, i).exists() for i in indices)
                if not missing:
                    break
                events.message(f"rank {rank}: pass {attempt}: {missing} sample(s) still missing" + ("; retrying" if attempt < args.offline_passes else ""))
    progress()
    return {
        "removed_invalid": stale,
        "layers": layer_ids,
        "num_layers": len(layer_ids) + 1,
        "hidden": hidden,
        "server_log": str(server_log.resolve()),
        "vllm_seconds": round(time.monotonic() - started, 1),
    }


def write_meta(output: Path, args: argparse.Namespace, spec: CaptureSpec, backend: str) -> None:
    output.mkdir(parents=True, exist_ok=True)
    meta = {
        "backend": backend,
        "verifier": os.path.abspath(args.verifier),
        "prepared": os.path.abspath(args.prepared),
        "target_layer_ids": spec.layer_ids,
        "verifier_num_layers": spec.num_layers,
        "hidden_size": spec.hidden,
        "hidden_states": "bf16 [T, len(target_layer_ids) + 1, hidden]: aux layer inputs, then the pre-norm last layer output",
    }
    tmp = output / f".{META_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, output / META_FILE)


# ---------------------------------------------------------------------------------------------
# Entry point


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier", required=True, help="verifier directory (or hub id on the GPU host)")
    p.add_argument("--prepared", required=True, help="prepared dataset (prepare_data.py / speculators prepare-data)")
    p.add_argument("--output", required=True, help="directory for hs_<i>.safetensors")
    p.add_argument("--backend", choices=["transformers", "vllm"], default="transformers")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="auxiliary layer ids (default [2, N//2, N-3]); id i = input of layer i")
    p.add_argument("--rank", type=int, default=None, help="this shard (default: $RANK or 0)")
    p.add_argument("--world-size", type=int, default=None, help="number of shards (default: $WORLD_SIZE or 1)")
    p.add_argument("--verify-only", action="store_true", help="only check that every sample of the shard has one valid file")
    p.add_argument("--events", default=None, help="events.jsonl to append to")
    t = p.add_argument_group("transformers backend")
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--max-batch-tokens", type=int, default=32768, help="cap on padded tokens per batch")
    t.add_argument("--writer-threads", type=int, default=None, help="threads saving files (default: half this process's share of the CPUs, 1 to 4)")
    t.add_argument("--tail-rows", type=int, default=1, help="split the last batch into batches of this many rows, so its files are written while the rest of it computes (0: keep it whole)")
    t.add_argument("--host-buffers", type=int, default=3, help="batches in flight between the GPU and the files (pinned host buffers of the largest batch each, on CUDA)")
    t.add_argument("--device", default=None, help="default: cuda:$LOCAL_RANK when CUDA is available, else cpu")
    t.add_argument("--dtype", default="auto", help="verifier compute dtype (auto: bf16 on GPU, float32 on CPU); files are bf16 regardless")
    t.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 avoids spinning against other processes on a small box)")
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers (and vllm serve) run the verifier's own code (auto_map)")
    v = p.add_argument_group("vllm backend")
    add_serve_arguments(v, tcp=False)
    add_connector_argument(v)
    v.add_argument("--staging-dir", default=None, help="where vLLM's connector writes before files are moved (default OUTPUT/.staging)")
    v.add_argument("--concurrency", type=int, default=32, help="generate-offline-data --concurrency")
    v.add_argument("--server-log", default=None, help="vllm serve log (default OUTPUT/vllm_server.log)")
    v.add_argument("--offline-command", default=None, help="generate-offline-data launcher (default: speculators' own, through common/speculators_compat.py, which sends the server's key)")
    v.add_argument("--offline-passes", type=int, default=2, help="generate-offline-data runs while samples are missing (each resumes)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.writer_threads is None:
        args.writer_threads = default_writer_threads(os.cpu_count() or 1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if args.batch_size < 1 or args.writer_threads < 1 or args.host_buffers < 1:
        p.error("--batch-size, --writer-threads and --host-buffers must be at least 1")
    if args.tail_rows < 0:
        p.error("--tail-rows must be 0 (off) or more")
    return args


def main(argv: list[str] | None = None) -> int:
    def shard(args: argparse.Namespace, events: EventLog, rank: int, world: int, local_rank: int) -> dict:
        started = time.monotonic()
        summary = run(args, events, rank, world, local_rank)
        events.artifact(args.output, kind="hidden_states")
        return {"seconds": round(time.monotonic() - started, 1), **summary}

    return run_sharded_stage(STAGE, parse_args(argv), shard, self_explaining=(ValueError, FileNotFoundError, ShardIncomplete, ServerFailed, StageCancelled))


class ShardIncomplete(RuntimeError):
    pass


def run(args: argparse.Namespace, events: EventLog, rank: int, world: int, local_rank: int) -> dict:
    from datasets import load_from_disk

    if args.backend == "transformers" and not args.verify_only:
        check_quantization(args, events, local_rank)  # from the config, before anything loads
    if not Path(args.prepared).exists():
        raise FileNotFoundError(f"prepared dataset {args.prepared} does not exist (run prepare first)")
    dataset = load_from_disk(args.prepared)
    dataset.set_format("torch")
    indices = shard_range(len(dataset), rank, world)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    summary: dict = {"rank": rank, "world_size": world, "samples": len(indices)}

    if not args.verify_only:
        if args.backend == "transformers":
            summary.update(extract_transformers(args, events, dataset, indices, rank, local_rank))
        else:
            summary.update(extract_vllm(args, events, dataset, indices, rank, world, local_rank))

    num_layers, hidden = summary.get("num_layers"), summary.get("hidden")
    if num_layers is None:
        num_layers, hidden = _expected_shape(output)
    problems = verify_shard(output, dataset, indices, num_layers, hidden)
    if problems:
        raise ShardIncomplete(f"rank {rank}: " + describe_gaps(problems))
    events.message(f"rank {rank}: verified {len(indices)} file(s) (samples {indices.start}..{indices.stop - 1})")
    return summary


def check_quantization(args: argparse.Namespace, events: EventLog, local_rank: int) -> None:
    """Before the verifier loads: a quantization the transformers backend cannot run here is one
    line naming the vLLM backend; one it can run is said in the log."""
    import torch

    from common.quantization import read_config, transformers_verdict

    device = args.device or (f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    verdict = transformers_verdict(read_config(args.verifier, args.trust_remote_code), device)
    if verdict is None:
        return
    if not verdict.runs:
        raise ValueError(verdict.line())
    events.message(verdict.line())


def _expected_shape(output: Path) -> tuple[int | None, int | None]:
    meta_path = output / META_FILE
    if not meta_path.exists():
        return None, None
    meta = json.loads(meta_path.read_text())
    return len(meta["target_layer_ids"]) + 1, meta["hidden_size"]


if __name__ == "__main__":
    sys.exit(main())
