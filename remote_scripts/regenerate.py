"""The verifier writes the assistant replies of the chat data itself (EAGLE-3 trains on the verifier's own outputs).

    python remote_scripts/regenerate.py --verifier DIR --data chat.jsonl --output regenerated.jsonl \
        [--backend transformers|vllm] [--max-new-tokens 256] [--temperature 0] [--replace] [--events FILE] \
        [--replies-per-prompt 0] [--sample-temperature 1.0] [--loops keep|drop|trim] [--turns last|all]

Rows of `--split` that end with a user turn (every row of it with `--replace`) get the verifier's
reply, greedy by default; every other row is copied as it is, so data that already has replies
passes through without loading the model. The output is the input in OpenAI `messages` form
plus OUTPUT.meta.json (the input's SHA-256 and the settings: prepare reads OUTPUT in place of the
data only when that hash matches). Backends: transformers (batched `generate`) or vllm (`vllm
serve`, or a server already running: `--endpoint`). Resumable and sharded (`--rank/--world-size`).
Several replies per prompt (the greedy one first), every user turn answered after the verifier's
own replies (--turns all) and replies stuck in a loop (counted per category; kept, dropped or
trimmed): docs/pipeline.md, "The data levers". Which rows, the output,
the backends, resume and malformed rows: docs/pipeline.md, "Regenerate".
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.conversations import MAX_REPORTED_LINES, MalformedRow, parse_conversation  # noqa: E402
from common.loops import loop_period, trimmed_length  # noqa: E402
from common.events import EventLog  # noqa: E402
from common.vllm_server import ServerFailed, StageCancelled, add_serve_arguments  # noqa: E402
from common.regenerated_data import file_sha256, meta_file  # noqa: E402
from common.sharding import plan_batches, run_sharded_stage, shard_range  # noqa: E402

STAGE = "regenerate"
CPU_BATCH_SIZE = 16  # --batch-size 0: transformers on CPU, and the vllm backend's progress step
CPU_MAX_BATCH_TOKENS = 16384  # --max-batch-tokens 0, transformers on CPU


@dataclass
class Item:
    """One reply to write: row `line` of the input, its prompt messages (ending with a user turn)."""

    index: int  # position among the items (what the shards split)
    line: int
    prompt: list[dict[str, str]]
    reply: int = 0  # which of the prompt's replies: 0 at --temperature (greedy by default), others sampled
    category: str | None = None  # the row's "category" (the loop share is reported per category)
    chain: int = -1  # the output row it belongs to (-1: its own, index); --turns all: one per (prompt, reply)
    turn: int | None = None  # --turns all: which user turn it answers (0 the first); None: the last, after the data's history

    def __post_init__(self):
        if self.chain < 0:
            self.chain = self.index


@dataclass(frozen=True)
class Sampling:
    """How one reply is decoded: temperature 0 is greedy."""

    temperature: float
    top_p: float
    seed: int


@dataclass
class Plan:
    rows: list[tuple[int, dict, list[dict[str, str]]]]  # (line, original row, normalized messages) of valid rows
    items: list[Item]
    malformed: int = 0
    malformed_lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Reply:
    text: str
    tokens: int
    finish: str  # "stop" (end of turn) or "length"
    looping: bool = False  # ran to the budget stuck in a repetition loop (common/loops.py)
    trimmed: str | None = None  # a looping reply's text up to its loop and one period of it (--loops trim)


# Replies per prompt when --replies-per-prompt is 0 (auto): on a GPU, enough for about
# AUTO_TARGET_REPLIES replies in all, at most AUTO_MAX_PER_PROMPT per prompt (more only where the
# prompts are few); on a CPU (the demo, CI) one, as its decoding is what the user waits for.
# harness/data_cost.py holds the same rule for `harness run --dry-run` (held to it by tests/test_data_cost.py).
AUTO_TARGET_REPLIES = 8000
AUTO_MAX_PER_PROMPT = 4


def replies_per_prompt(given: int, prompts: int, on_gpu: bool) -> int:
    """--replies-per-prompt resolved: the value given, else the auto rule above."""
    if given > 0:
        return given
    if not on_gpu or prompts <= 0:
        return 1
    return max(1, min(AUTO_MAX_PER_PROMPT, -(-AUTO_TARGET_REPLIES // prompts)))


def with_replies(items: list[Item], n: int, turns: str = "last") -> list[Item]:
    """Each prompt's item repeated for its n replies (prompt by prompt), indexes renumbered; with
    turns "all", each reply's chain an item per user turn (a chain's items together)."""
    out: list[Item] = []
    chain = 0
    for item in items:
        for r in range(n):
            users = sum(m["role"] == "user" for m in item.prompt) if turns == "all" else 0
            for t in range(users) if users else [None]:
                out.append(Item(len(out), item.line, item.prompt, r, item.category, chain, t))
            chain += 1
    return out


def reply_text(reply: Reply, loops: str) -> str:
    """The text a reply is written with: trimmed where it loops and `loops` is trim."""
    return reply.trimmed if reply.looping and loops == "trim" and reply.trimmed is not None else reply.text


def conversation(item: Item, answers: list[str]) -> list[dict[str, str]]:
    """The messages the verifier answers for `item`: with turns "last" (turn None) its prompt as the
    data has it; with turns "all" the data's turns up to user turn `item.turn`, the data's
    assistant turns left out and the verifier's own answers (`answers`, one per earlier user turn
    of the chain) after their user turns. Given an answer for every user turn, the whole chain."""
    if item.turn is None:
        return list(item.prompt)
    out: list[dict[str, str]] = []
    seen = 0
    for m in item.prompt:
        if m["role"] == "assistant":
            continue
        out.append(m)
        if m["role"] == "user":
            if seen < len(answers):
                out.append({"role": "assistant", "content": answers[seen]})
            if seen == item.turn:
                break
            seen += 1
    return out


def sampling_of(item: Item, args: argparse.Namespace) -> Sampling:
    """The first reply at --temperature and --seed (greedy by default); reply r >= 1 at
    --sample-temperature with seed --seed + r."""
    if item.reply == 0:
        return Sampling(args.temperature, args.top_p, args.seed)
    return Sampling(args.sample_temperature, args.top_p, args.seed + item.reply)


def make_reply(tokenizer, kept: list[int], tokens: int, finish: str) -> Reply:
    """A reply from its tokens (without the end of turn): its text, and where it ran to the
    budget in a loop, that and its trimmed text."""
    text = tokenizer.decode(kept, skip_special_tokens=True)
    period = loop_period(kept) if finish == "length" else None
    if period is None:
        return Reply(text, tokens, finish)
    return Reply(text, tokens, finish, True, tokenizer.decode(kept[: trimmed_length(kept, period)], skip_special_tokens=True))


# ---------------------------------------------------------------------------------------------
# Planning (pure logic: unit-tested without a model)


def plan(data: Path, split: str, replace: bool, strict: bool, events: EventLog | None = None) -> Plan:
    """Read the data and decide which rows the verifier answers."""
    result = Plan(rows=[], items=[])
    with open(data, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                messages, row_split = parse_conversation(line)
            except MalformedRow as e:
                where = f"{data}:{lineno}: {e}"
                if strict:
                    raise MalformedRow(where) from None
                result.malformed += 1
                if len(result.malformed_lines) < MAX_REPORTED_LINES:
                    result.malformed_lines.append(where)
                if events:
                    events.message(f"skipping malformed row, {where}")
                continue
            result.rows.append((lineno, json.loads(line), messages))
            if split != "all" and (row_split or "train") != split:
                continue
            last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
            if last_user is None:
                continue
            if last_user == len(messages) - 1 or replace:
                category = result.rows[-1][1].get("category")
                result.items.append(Item(len(result.items), lineno, messages[: last_user + 1], category=category if isinstance(category, str) else None))
    return result


def fingerprint(data: Path, settings: dict) -> str:
    h = hashlib.sha256()
    with open(data, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()


class PartFile:
    """One rank's replies: a header line with the run's fingerprint, then {"item", "text", ...} lines.

    Appended after every batch (flushed and fsynced); a torn last line (a kill mid-write) is cut
    off on open; a file with another fingerprint is stale and starts over."""

    def __init__(self, path: Path, fp: str):
        self.path = path
        found = self.read(path, fp)
        if found is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"fingerprint": fp}) + "\n")
            self.done: dict[int, Reply] = {}
        else:
            self.done, complete_bytes = found
            if complete_bytes < path.stat().st_size:
                with open(path, "r+b") as f:
                    f.truncate(complete_bytes)  # our own file: no other process appends to it

    @staticmethod
    def read(path: Path, fp: str) -> tuple[dict[int, Reply], int] | None:
        """(replies, bytes of complete lines), or None when missing, unreadable or stale. Read
        only: another rank may be appending to it."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        lines = data.split(b"\n")
        complete = lines[:-1]  # the part after the last newline is torn (or empty)
        done = {}
        try:
            if json.loads(complete[0]).get("fingerprint") != fp:
                return None
            for raw in complete[1:]:
                rec = json.loads(raw)
                done[int(rec["item"])] = Reply(rec["text"], int(rec["tokens"]), rec["finish"], bool(rec.get("looping")), rec.get("trimmed"))
        except (IndexError, ValueError, KeyError, TypeError):
            return None
        return done, len(data) - len(lines[-1])

    def append(self, replies: dict[int, Reply]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            for index, r in sorted(replies.items()):
                f.write(json.dumps({"item": index, **asdict(r)}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done.update(replies)


def parts_dir(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def part_path(output: Path, rank: int, world: int) -> Path:
    return parts_dir(output) / f"rank{rank}-of-{world}.jsonl"


def collect_parts(output: Path, world: int, fp: str, total: int) -> dict[int, Reply] | None:
    """Every rank's replies, or None while some range is unfinished."""
    replies: dict[int, Reply] = {}
    for r in range(world):
        found = PartFile.read(part_path(output, r, world), fp)
        if found is None:
            return None
        replies.update(found[0])
    return replies if all(i in replies for i in range(total)) else None


LOOPS = ("keep", "drop", "trim")


def merged_rows(p: Plan, replies: dict[int, Reply], loops: str = "keep") -> list[dict]:
    """The output rows: an answered row gives one row per reply (its prompt + the reply, in reply
    order: the first is the greedy one), a looping reply kept, dropped or trimmed (`loops`);
    other rows are copied."""
    by_line: dict[int, dict[int, list[Item]]] = {}
    for item in p.items:
        by_line.setdefault(item.line, {}).setdefault(item.chain, []).append(item)
    out = []
    for line, row, messages in p.rows:
        row = {k: v for k, v in row.items() if k != "conversations"}
        chains = by_line.get(line)
        if chains is None:
            out.append({**row, "messages": messages})
            continue
        for items in chains.values():  # a chain: one reply, or with --turns all one per user turn
            answered = [replies[i.index] for i in items]
            looping = any(r.looping for r in answered)
            if looping and loops == "drop":
                continue
            texts = [reply_text(r, loops) for r in answered]
            if items[0].turn is None:
                chat = [*items[0].prompt, {"role": "assistant", "content": texts[0]}]
            else:
                chat = conversation(Item(0, line, items[0].prompt, turn=len(items) - 1), texts)
            regenerated = {"tokens": sum(r.tokens for r in answered), "finish": answered[-1].finish, "reply": items[0].reply, "looping": looping,
                           "trimmed": any(t is not r.text for t, r in zip(texts, answered))}
            if items[0].turn is not None:
                regenerated["turns"] = len(items)
            out.append({**row, "messages": chat, "regenerated": regenerated})
    return out


def loop_report(items: list[Item], replies: dict[int, Reply]) -> dict:
    """The share of looping replies, overall and per row category (rows without one: "other";
    no by_category when no row has one)."""
    def share(group: list[Item]) -> dict:
        looping = sum(replies[i.index].looping for i in group)
        return {"replies": len(group), "looping": looping, "share": round(looping / max(1, len(group)), 4)}

    report = share(items)
    if any(i.category for i in items):
        groups: dict[str, list[Item]] = {}
        for i in items:
            groups.setdefault(i.category or "other", []).append(i)
        report["by_category"] = {c: share(g) for c, g in sorted(groups.items())}
    return report


def write_output(output: Path, rows: list[dict], meta: dict) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    meta_path = meta_file(output)
    meta_tmp = meta_path.with_name(f".{meta_path.name}.tmp-{os.getpid()}")
    meta_tmp.write_text(json.dumps(meta, indent=1) + "\n")
    meta_path.unlink(missing_ok=True)  # never a meta that vouches for an older output
    os.replace(tmp, output)
    os.replace(meta_tmp, meta_path)


def _recorded_fingerprint(output: Path) -> str | None:
    try:
        return json.loads(meta_file(output).read_text()).get("fingerprint")
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# Backends


class TransformersBackend:
    def __init__(self, args: argparse.Namespace, local_rank: int):
        import torch
        from transformers import AutoTokenizer

        from common.verifier import load_verifier

        self.torch = torch
        self.device = args.device or (f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
        if not self.device.startswith("cuda") and args.threads:
            torch.set_num_threads(args.threads)
        self.tokenizer = AutoTokenizer.from_pretrained(args.verifier)
        self.model = load_verifier(args.verifier, device=self.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
        self.args = args
        self.eos = eos_ids(self.tokenizer, self.model)

    def describe(self) -> str:
        return f"transformers on {self.device}"

    def generate(self, prompts: dict[int, list[int]], sampling: dict[int, Sampling], on_batch) -> None:
        """Batches of replies decoded alike (one Sampling), each batch seeded by its first item."""
        groups: dict[Sampling, dict[int, list[int]]] = {}
        for i in sorted(prompts):
            groups.setdefault(sampling[i], {})[i] = prompts[i]
        for how, group in groups.items():
            self._generate(group, how, on_batch)

    def _generate(self, prompts: dict[int, list[int]], how: Sampling, on_batch) -> None:
        torch, args = self.torch, self.args
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else sorted(self.eos)[0]
        for batch in plan_batches({i: len(p) for i, p in prompts.items()}, self.batch_size(prompts), self.max_batch_tokens()):
            width = max(len(prompts[i]) for i in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for r, i in enumerate(batch):  # left padding: every row's next token is at the end
                ids[r, width - len(prompts[i]) :] = torch.tensor(prompts[i])
                attention[r, width - len(prompts[i]) :] = 1
            sampling = {"do_sample": True, "temperature": how.temperature, "top_p": how.top_p} if how.temperature > 0 else {"do_sample": False}
            if how.temperature > 0:
                torch.manual_seed(how.seed + batch[0])
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=ids.to(self.device), attention_mask=attention.to(self.device), max_new_tokens=args.max_new_tokens,
                    eos_token_id=sorted(self.eos), pad_token_id=pad, **sampling, **({"cache_implementation": "static"} if args.cache == "static" else {}),
                )
            replies = {}
            for r, i in enumerate(batch):
                tokens = out[r, width:].tolist()
                stop = next((n for n, t in enumerate(tokens) if t in self.eos), None)
                kept = tokens[:stop] if stop is not None else tokens
                replies[i] = make_reply(self.tokenizer, kept, len(kept) + (stop is not None), "stop" if stop is not None else "length")
            on_batch(replies)

    def max_batch_tokens(self) -> int:
        """--max-batch-tokens, else CPU_MAX_BATCH_TOKENS on CPU; on a GPU `batch_size` alone
        bounds a batch: a decode step of a small model there is launch-bound, so rows are nearly
        free, and the CPU's cap would hold prompts of ~200 tokens to ~80 rows a batch
        (bench/gpu/speed.py measures both)."""
        if self.args.max_batch_tokens:
            return self.args.max_batch_tokens
        return CPU_MAX_BATCH_TOKENS if not self.device.startswith("cuda") else 1 << 40

    def batch_size(self, prompts: dict[int, list[int]]) -> int:
        """--batch-size, else 16 on CPU and, on a GPU, what a third of its free memory holds
        (common/batch_memory.py) for the longest prompt plus --max-new-tokens."""
        if self.args.batch_size:
            return self.args.batch_size
        if not self.device.startswith("cuda") or not prompts:
            return CPU_BATCH_SIZE
        from common.batch_memory import gpu_batch_size

        return gpu_batch_size(self.model, self.device, max(map(len, prompts.values())) + self.args.max_new_tokens, len(prompts), cap=256)

    def close(self) -> None:
        pass


class VllmBackend:
    """`vllm serve` for this rank, and completions requests against it (token-id prompts)."""

    def __init__(self, args: argparse.Namespace, rank: int, local_rank: int):
        from transformers import AutoConfig, AutoTokenizer

        from common.vllm_server import ManagedServer, ServeOptions, endpoint_options, private_socket, rank_env, refuse_unservable, sigterm_raises

        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(args.verifier)
        self.eos = eos_ids(self.tokenizer, None)
        self.server = None
        self.model_name = args.verifier  # what `vllm serve VERIFIER` serves it as
        self._cleanup = contextlib.ExitStack()
        if args.endpoint:
            self.opts = endpoint_options(args.endpoint)
            self.waited = 0.0
            self.model_name = self._served_model()
            return
        refuse_unservable(AutoConfig.from_pretrained(args.verifier, trust_remote_code=args.trust_remote_code), args.vllm_command)
        output = Path(args.output)
        self.log = Path(args.server_log or output.with_name(f"{output.name}.vllm_server.rank{rank}.log"))
        try:
            self._cleanup.enter_context(sigterm_raises())
            # a unix socket in a 0700 directory of this rank's: no other uid of the box reaches it
            self.opts = ServeOptions(
                model=args.verifier, uds=self._cleanup.enter_context(private_socket()), tensor_parallel_size=args.tensor_parallel_size,
                max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
                vllm_command=args.vllm_command, text_only=True,
                extra_args=list(args.vllm_arg) + (["--trust-remote-code"] if args.trust_remote_code and "--trust-remote-code" not in args.vllm_arg else []),
            )
            self.server = ManagedServer(self.opts, self.log, stop_grace=args.stop_grace, env=rank_env(local_rank, args.tensor_parallel_size))
            self._cleanup.callback(self.server.stop)
            self.server.start()
            self.waited = self.server.wait_healthy(args.health_timeout)
        except BaseException:
            self.close()
            raise

    def describe(self) -> str:
        if self.server is None:
            return f"the vLLM server at {self.opts.where}"
        return f"vllm serve on {self.opts.where} (its workers in {self.server.network}; healthy after {self.waited:.0f} s; log {self.log})"

    def _request(self, method: str, path: str, body: dict | None, timeout: float) -> dict:
        """One JSON request to the server; OSError for no answer or a status other than 200."""
        from common.vllm_server import auth_headers, http_request

        headers = {"Content-Type": "application/json", **auth_headers()}
        status, reply = http_request(self.opts, method, path, headers, json.dumps(body).encode() if body is not None else None, timeout)
        if status != 200:
            raise OSError(f"HTTP {status} from {path}: {reply[:200]!r}")
        return json.loads(reply)

    def _served_model(self) -> str:
        """The id the running server serves (GET /v1/models), which the requests must name."""
        from common.vllm_server import ServerFailed

        try:
            return self._request("GET", "/v1/models", None, 30)["data"][0]["id"]
        except (OSError, ValueError, KeyError, IndexError) as e:
            raise ServerFailed(f"--endpoint {self.args.endpoint}: no vLLM server answers GET /v1/models ({type(e).__name__}: {e})") from None

    def alive(self) -> bool:
        return self.server is None or self.server.alive()

    def where(self) -> str:
        return f"server {self.opts.where}" if self.server is None else f"log {self.log}"

    def _complete(self, prompt: list[int], how: Sampling) -> Reply:
        from common.vllm_server import ServerFailed

        args = self.args
        # return_token_ids: the reply is decoded here from its tokens alone, as the transformers
        # backend does (vLLM's text is decoded in the prompt's context: a leading space).
        body = {"model": self.model_name, "prompt": prompt, "max_tokens": args.max_new_tokens, "temperature": how.temperature, "top_p": how.top_p, "seed": how.seed,
                "skip_special_tokens": True, "return_token_ids": True}
        last_error = None
        for attempt in range(3):
            try:
                answer = self._request("POST", "/v1/completions", body, args.request_timeout)
                choice = answer["choices"][0]
                token_ids = choice.get("token_ids")
                if token_ids is None:  # a server without return_token_ids
                    token_ids = self.tokenizer(choice["text"], add_special_tokens=False)["input_ids"]
                kept = [t for t in token_ids if t not in self.eos]
                tokens = int((answer.get("usage") or {}).get("completion_tokens") or len(token_ids))
                return make_reply(self.tokenizer, kept, tokens, "stop" if choice.get("finish_reason") == "stop" else "length")
            except (OSError, ValueError, KeyError, IndexError) as e:
                last_error = e
                if not self.alive():
                    break
                time.sleep(1 + attempt)
        raise ServerFailed(f"completion request failed ({type(last_error).__name__}: {last_error}); {self.where()}")

    def generate(self, prompts: dict[int, list[int]], sampling: dict[int, Sampling], on_batch) -> None:
        from common.vllm_server import ServerFailed

        order = sorted(prompts)
        with ThreadPoolExecutor(max_workers=self.args.concurrency) as pool:
            step = self.args.batch_size or CPU_BATCH_SIZE
            for start in range(0, len(order), step):
                chunk = order[start : start + step]
                if not self.alive():
                    raise ServerFailed(f"vllm serve died; {self.where()}")
                on_batch(dict(zip(chunk, pool.map(lambda i: self._complete(prompts[i], sampling[i]), chunk))))

    def close(self) -> None:
        """Stop our server, remove its socket's directory, restore SIGTERM (in that order)."""
        self._cleanup.close()


def on_gpu(args: argparse.Namespace) -> bool:
    """Whether the replies are decoded on a GPU (what the auto --replies-per-prompt goes by)."""
    if args.device:
        return args.device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


def eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    for value in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return ids


# ---------------------------------------------------------------------------------------------
# Main


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier", required=True, help="verifier directory (its tokenizer and chat template render the prompts)")
    p.add_argument("--data", required=True, help="chat JSONL (messages or ShareGPT conversations)")
    p.add_argument("--output", required=True, help="chat JSONL to write, with the verifier's replies")
    p.add_argument("--backend", choices=["transformers", "vllm"], default="transformers")
    p.add_argument("--split", default="train", help="answer rows whose 'split' is this (rows without one count as train); 'all': every row")
    p.add_argument("--replace", action="store_true", help="also answer rows that already have a reply (cut after their last user turn)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="the first reply's (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    # 1 by default until the data levers' study (bench/quality) shows more replies pay for their GPU time
    p.add_argument("--replies-per-prompt", type=int, default=1,
                   help=f"replies written per prompt, the first at --temperature (greedy by default), the others sampled at --sample-temperature "
                        f"(0: auto, 1 on a CPU; on a GPU enough for ~{AUTO_TARGET_REPLIES} replies in all, at most {AUTO_MAX_PER_PROMPT} per prompt)")
    p.add_argument("--sample-temperature", type=float, default=1.0, help="the extra replies' temperature (reply r seeded --seed + r)")
    p.add_argument("--turns", choices=["last", "all"], default="last",
                   help="last: answer a row's last user turn after the data's history; all: answer every user turn in order, the verifier's own replies as the history (multi-turn data)")
    p.add_argument("--loops", choices=list(LOOPS), default="keep",
                   help="replies stuck in a repetition loop (common/loops.py): keep them, drop them, or trim them to where the loop began plus one period")
    p.add_argument("--batch-size", type=int, default=0, help=f"prompts per generate call (vllm: per progress step; 0: {CPU_BATCH_SIZE}, and for transformers on a GPU what a third of its free memory holds)")
    p.add_argument("--max-batch-tokens", type=int, default=0, help=f"padded prompt tokens per generate call (0: {CPU_MAX_BATCH_TOKENS} on CPU; on a GPU the memory-sized --batch-size alone)")
    p.add_argument("--cache", choices=["dynamic", "static"], default="dynamic", help="transformers' KV cache in generate (static: preallocated, and on a GPU transformers compiles the decode step)")
    p.add_argument("--strict", action="store_true", help="a malformed row is fatal")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--device", default=None, help="default: cuda:$LOCAL_RANK when CUDA is available, else cpu")
    p.add_argument("--dtype", default="auto", help="verifier compute dtype (auto: bf16 on GPU, float32 on CPU)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    p.add_argument("--trust-remote-code", action="store_true")
    v = p.add_argument_group("vllm backend")
    add_serve_arguments(v, tcp=False)
    v.add_argument("--endpoint", default=None, help="a vLLM server already serving the verifier (http://HOST:PORT): none is started or stopped")
    v.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    v.add_argument("--request-timeout", type=float, default=600.0, help="seconds per completion request")
    v.add_argument("--server-log", default=None, help="vllm serve log (default OUTPUT.vllm_server.rank<r>.log)")
    p.add_argument("--events", default=None)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.max_new_tokens < 1 or args.batch_size < 0 or args.concurrency < 1:
        p.error("--max-new-tokens and --concurrency must be at least 1, --batch-size at least 0")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        p.error("--temperature must be >= 0 and --top-p in (0, 1]")
    if args.replies_per_prompt < 0 or args.sample_temperature <= 0:
        p.error("--replies-per-prompt must be at least 0 (0: auto) and --sample-temperature above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_sharded_stage(STAGE, parse_args(argv), run, self_explaining=(MalformedRow, ValueError, FileNotFoundError, ServerFailed, StageCancelled),
                             verifier_first=False)  # rows that have their replies pass through without it


def run(args: argparse.Namespace, events: EventLog, rank: int, world: int, local_rank: int) -> dict:
    started = time.monotonic()
    data, output = Path(args.data), Path(args.output)
    if not data.is_file():
        raise FileNotFoundError(f"--data {data}: no such file")
    p = plan(data, args.split, args.replace, args.strict, events)
    if not p.rows:
        raise ValueError(f"no usable rows in {data} (malformed {p.malformed})")
    prompts = len(p.items)
    per_prompt = replies_per_prompt(args.replies_per_prompt, prompts, on_gpu(args)) if p.items else 1
    p.items = with_replies(p.items, per_prompt, args.turns)
    settings = {k: getattr(args, k) for k in ("split", "replace", "max_new_tokens", "temperature", "top_p", "seed", "sample_temperature", "loops", "turns")}
    settings["replies_per_prompt"] = per_prompt
    settings["verifier"] = os.path.abspath(args.verifier)
    fp = fingerprint(data, settings)
    meta = {"source": os.path.abspath(data), "source_sha256": file_sha256(data), "fingerprint": fp, "settings": settings, "answered": len(p.items)}
    summary = {"rows": len(p.rows), "malformed": p.malformed, "prompts": prompts, "replies_per_prompt": per_prompt, "to_answer": len(p.items),
               "rank": rank, "world_size": world}
    if per_prompt > 1:
        events.message(f"{prompts} prompts x {per_prompt} replies = {prompts * per_prompt} replies (the first greedy"
                       + ("" if args.temperature == 0 else f" at temperature {args.temperature}") + f", the others sampled at temperature {args.sample_temperature})")
    if output.is_file() and _recorded_fingerprint(output) == fp:
        events.message(f"{output} already holds the replies for this data and these settings")
        return {**summary, "already_done": True, "seconds": round(time.monotonic() - started, 1)}
    if not p.items:
        events.message(f"every row of split {args.split!r} has a reply (--replace answers them anyway): copying the data")
        write_output(output, merged_rows(p, {}), meta)
        events.artifact(str(output), kind="data")
        return {**summary, "seconds": round(time.monotonic() - started, 1)}

    # a rank takes whole chains (a multi-turn chain's later turns need its earlier replies)
    chains = shard_range(p.items[-1].chain + 1, rank, world)
    shard = [i.index for i in p.items if i.chain in chains]
    part = PartFile(part_path(output, rank, world), fp)
    kept = sum(i in part.done for i in shard)
    todo = [p.items[i] for i in shard if i not in part.done]
    events.message(f"rank {rank}: {len(shard)} replies" + (f" in items {shard[0]}..{shard[-1]}" if shard else "") + (f"; {kept} kept from an interrupted run" if kept else ""))
    generated_tokens = 0
    if todo:
        from common.verifier_path import check as check_verifier

        check_verifier(args.verifier)  # a missing path: one line, not the hub's
        backend = VllmBackend(args, rank, local_rank) if args.backend == "vllm" else TransformersBackend(args, local_rank)
        try:
            events.message(f"rank {rank}: {backend.describe()}")
            tokenizer = backend.tokenizer
            rendered: dict[tuple[int, int], list[int]] = {}  # by (line, turn): a prompt's first replies share its tokens
            earlier: dict[int, list[int]] = {}  # chain -> its items' indexes, turn by turn
            for item in p.items:
                earlier.setdefault(item.chain, []).append(item.index)

            def tokens_of(item: Item) -> list[int]:
                answers = [reply_text(part.done[i], args.loops) for i in earlier[item.chain][: item.turn or 0]]
                key = (item.line, item.turn or 0)
                if answers or key not in rendered:
                    text = tokenizer.apply_chat_template(conversation(item, answers), tokenize=False, add_generation_prompt=True)
                    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                    if answers:
                        return ids
                    rendered[key] = ids
                return rendered[key]

            def on_batch(replies: dict[int, Reply]) -> None:
                nonlocal generated_tokens
                part.append(replies)
                generated_tokens += sum(r.tokens for r in replies.values())
                if local_rank == 0:
                    events.progress(sum(i in part.done for i in shard), len(shard), unit="replies")

            t0 = time.monotonic()
            for turn in sorted({item.turn or 0 for item in todo}):  # turn by turn: a turn's prompt holds the replies before it
                now = [item for item in todo if (item.turn or 0) == turn]
                backend.generate({item.index: tokens_of(item) for item in now}, {item.index: sampling_of(item, args) for item in now}, on_batch)
            summary["generate_seconds"] = round(time.monotonic() - t0, 1)
            summary["tokens_per_s"] = round(generated_tokens / max(1e-9, time.monotonic() - t0), 1)
        finally:
            backend.close()
    summary.update(kept_from_before=kept, generated_tokens=generated_tokens)
    mine = [part.done[i] for i in shard]
    summary["stopped_at_end_of_turn"] = round(sum(r.finish == "stop" for r in mine) / max(1, len(mine)), 4)

    replies = collect_parts(output, world, fp, len(p.items))
    if replies is None:
        events.message(f"rank {rank}: done; the rank that finishes last writes {output}")
        return {**summary, "seconds": round(time.monotonic() - started, 1)}
    rows = merged_rows(p, replies, args.loops)
    loops = loop_report(p.items, replies)
    summary["loops"] = loops
    summary["rows_written"] = len(rows)
    if loops["looping"]:
        events.message(f"{loops['looping']} of {loops['replies']} replies loop (a repeated span to the token budget; --loops {args.loops}: "
                       + {"keep": "kept as they are", "drop": "dropped", "trim": "trimmed to where the loop began"}[args.loops] + ")"
                       + ("; by category: " + ", ".join(f"{c} {v['looping']}/{v['replies']}" for c, v in loops["by_category"].items()) if "by_category" in loops else ""))
    write_output(output, rows, meta)
    shutil.rmtree(parts_dir(output), ignore_errors=True)
    events.artifact(str(output), kind="data")
    return {**summary, "seconds": round(time.monotonic() - started, 1)}


if __name__ == "__main__":
    sys.exit(main())
