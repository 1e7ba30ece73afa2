"""Acceptance length (tau) of the trained EAGLE-3 draft against its verifier, on held-out prompts.

    python remote_scripts/evaluate.py --verifier DIR --draft CHECKPOINTS --data chat.jsonl \
        --output EVAL_DIR [--speculative-tokens 3] [--events FILE]

Greedy chain speculation with the real models, as a serving engine does it: each round the draft
proposes k tokens, the verifier accepts the longest prefix equal to its own greedy choices plus
one token of its own; tau = generated tokens / verifier rounds (between 1 and k+1), and the
output must equal plain greedy decoding. `--method fast` (the default) gets every round's outcome
from a few batched forwards per prompt; `--method chain` runs the rounds one by one, the
reference it is tested against. The draft is the checkpoint best.json names, else the latest.
Writes report.json (tau overall and per category, looping replies counted), acceptance.png and
training.png. The round, the methods and why: docs/architecture/stage-scripts.md (evaluate.py); the held-out
prompts, loops, categories and outputs: docs/pipeline.md, "Evaluate".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

# torch's OpenMP threads busy-wait by default: on a shared few-core box that makes every op crawl.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.checkpoints import resolve_draft  # noqa: E402
from common.conversations import load_categorized_prompts  # noqa: E402
from common.loops import is_looping  # noqa: E402
from common.events import EventLog, read_events, run_stage  # noqa: E402

STAGE = "evaluate"


class EvalError(RuntimeError):
    """A problem with the inputs, reported as one line."""


# ---------------------------------------------------------------------------------------------
# The speculation loop (model-agnostic: a Verifier and a Proposer)


class Verifier(Protocol):
    def forward(self, tokens: list[int]) -> tuple[list[int], Any]:
        """Greedy next token after every position of `tokens`, and the draft's view of each
        position (aux hidden states), indexable by position."""
        ...


class Proposer(Protocol):
    def propose(self, tokens: list[int], verifier_view: Any, k: int) -> list[int]:
        """k draft tokens continuing `tokens`, given the verifier's view of tokens[:-1]."""
        ...


@dataclass
class PromptResult:
    prompt_tokens: int
    generated: list[int]
    rounds: int
    accepted: list[int]  # accepted draft tokens per round (0..k)
    trials: list[int]  # draft positions whose verdict mattered per round (k, fewer when the reply ended)
    greedy_match: bool | None = None
    looping: bool | None = None  # the reply is stuck in a repetition loop (`is_looping`)
    cut_at: int | None = None  # --method fast: the reply ends here, where the decode and the check parted (`settle`)


@dataclass
class Report:
    tau: float
    k: int
    acceptance_per_position: list[float]  # P(i-th proposal accepted), per round
    conditional_acceptance: list[float]  # P(i-th accepted | i-1 accepted)
    prompts: int
    rounds: int
    generated_tokens: int
    greedy_match: float | None
    # Replies stuck in a repetition loop (`is_looping`) are speculated on as a server would,
    # so they stay in tau; they inflate it (a loop is easy to predict), hence their count and
    # tau over the other prompts next to it.
    looping_prompts: int = 0
    tau_without_loops: float | None = None
    # Replies the fast method measured only up to where its batched decode and its check parted
    # beyond a tie (`settle`): their tokens after that point are not in tau.
    cut_replies: int = 0
    seconds: float = 0.0
    # tau over each category's prompts ({category: {"tau", "prompts"}}; the rows' "category", empty
    # when none has one): the figures the field reports (Spec-Bench's categories).
    by_category: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def speculate(verifier: Verifier, proposer: Proposer, prompt: list[int], k: int, max_new_tokens: int, eos: set[int]) -> PromptResult:
    """Greedy chain speculation on one prompt, round by round (docs/architecture/stage-scripts.md, evaluate.py)."""
    greedy, view = verifier.forward(prompt)
    seq = prompt + [greedy[-1]]  # prefill token
    generated = [greedy[-1]]
    rounds, accepted_per_round, trials_per_round = 0, [], []
    while generated[-1] not in eos and len(generated) < max_new_tokens:
        proposal = proposer.propose(seq, view, k)
        if len(proposal) != k:
            raise EvalError(f"the proposer returned {len(proposal)} tokens, expected {k}")
        base = len(seq)
        greedy, view = verifier.forward(seq + proposal)
        choices = greedy[base - 1 : base + k]  # the verifier's token after seq, after seq+d1, ...
        a = 0
        while a < k and proposal[a] == choices[a]:
            a += 1
        new, trials = _cut_at_stop(proposal[:a] + [choices[a]], len(generated), k, max_new_tokens, eos)
        rounds += 1
        accepted_per_round.append(min(a, len(new)))
        trials_per_round.append(trials)
        seq += new
        generated += new
    return PromptResult(len(prompt), generated, rounds, accepted_per_round, trials_per_round)


def _cut_at_stop(new: list[int], generated: int, k: int, max_new_tokens: int, eos: set[int]) -> tuple[list[int], int]:
    """A round's tokens cut at end of turn or at the budget, like a server would, and the number
    of proposals whose verdict mattered: those past the stop were never needed, they count
    neither as accepted nor as rejected."""
    for i, t in enumerate(new):
        if t in eos or generated + i + 1 >= max_new_tokens:
            return new[: i + 1], min(k, i + 1)
    return new, k


def greedy_decode(verifier: Verifier, prompt: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    """Plain greedy decoding (the reference speculation must reproduce)."""
    if hasattr(verifier, "greedy"):
        return verifier.greedy(prompt, max_new_tokens, eos)
    seq, out = list(prompt), []
    while len(out) < max_new_tokens:
        greedy, _ = verifier.forward(seq)
        out.append(greedy[-1])
        seq.append(greedy[-1])
        if out[-1] in eos:
            break
    return out


def replay(proposer: Proposer, prompt: list[int], reference: list[int], view: Any, k: int, max_new_tokens: int, eos: set[int]) -> PromptResult:
    """`speculate`'s result without a verifier call per round, for greedy decoding.

    Under greedy verification the output is the verifier's greedy continuation whatever the
    draft proposes, and the verifier's choice after context + d_1..d_i, with d_1..d_i accepted,
    is the continuation's next token. So one greedy decode (`reference`: max_new_tokens tokens, or
    up to its eos: a round's tokens and verdicts past max_new_tokens are cut by `_cut_at_stop`)
    and one forward over prompt + reference (`view`: the draft's inputs at every position, as
    causal attention gives them to any prefix) replace a verifier forward per round. The rounds,
    acceptances and trials equal `speculate`'s (tests check it).
    """
    seq = prompt + reference[:1]
    generated = reference[:1]
    rounds, accepted_per_round, trials_per_round = 0, [], []
    while generated[-1] not in eos and len(generated) < max_new_tokens:
        proposal = proposer.propose(seq, view, k)
        if len(proposal) != k:
            raise EvalError(f"the proposer returned {len(proposal)} tokens, expected {k}")
        j = len(generated)
        if j >= len(reference):
            raise EvalError(f"bug: the reference ends at {len(reference)} tokens, before end of turn and the budget of {max_new_tokens}")
        a = 0
        while a < k and j + a < len(reference) and proposal[a] == reference[j + a]:
            a += 1
        # the accepted proposals, then the verifier's own token
        new, trials = _cut_at_stop(reference[j : j + a + 1], len(generated), k, max_new_tokens, eos)
        rounds += 1
        accepted_per_round.append(min(a, len(new)))
        trials_per_round.append(trials)
        seq += new
        generated += new
    return PromptResult(len(prompt), generated, rounds, accepted_per_round, trials_per_round)  # greedy by construction: nothing to check


def summarize(results: list[PromptResult], k: int) -> Report:
    """The report over `results`; an EvalError where no round was measured (there is no tau to
    give) or where tau left [1, k+1] (a bug: a round yields 1 to k+1 tokens)."""
    report = _summarize(results, k)
    if report.rounds == 0:
        raise EvalError(no_rounds_reason(results))
    if not 1.0 <= report.tau <= k + 1:
        raise EvalError(f"bug: tau {report.tau} outside [1, {k + 1}] ({report.generated_tokens} tokens, {report.rounds} rounds): a round yields 1 to k+1 tokens")
    loops = [r for r in results if r.looping]
    report.looping_prompts = len(loops)
    others = _summarize([r for r in results if not r.looping], k)
    if loops and others.rounds:
        report.tau_without_loops = round(others.tau, 4)
    return report


def tau_by_category(results: list[PromptResult], categories: list[str | None], k: int) -> dict[str, dict[str, Any]]:
    """{category: {"tau", "prompts"}} over the prompts of each category (rows without one: "other");
    {} when no prompt has a category."""
    if not any(categories):
        return {}
    groups: dict[str, list[PromptResult]] = {}
    for r, c in zip(results, categories):
        groups.setdefault(c or "other", []).append(r)
    summaries = {c: _summarize(rs, k) for c, rs in sorted(groups.items())}
    # A category whose every reply ended at its first token measured no round: no tau (None), not 0.
    return {c: {"tau": round(s.tau, 4) if s.rounds else None, "prompts": len(groups[c])} for c, s in summaries.items()}


def no_rounds_reason(results: list[PromptResult]) -> str:
    """Why no draft round was measured, in one line with what to do."""
    if not results:
        return "no prompt was measured: no draft round, so no tau"
    if all(len(r.generated) <= 1 for r in results):
        return (f"every reply ended at its first token ({len(results)} prompts: the verifier's first token ends its turn, or "
                "--max-new-tokens is 1): no draft round was measured, so no tau; check the verifier and the held-out prompts, "
                "or measure on replies of --max-new-tokens tokens with --ignore-eos")
    return f"no draft round was measured over {len(results)} prompts, so no tau"


def _tau_text(tau: float | None) -> str:
    return f"{tau:.2f}" if tau is not None else "no round"


def _summarize(results: list[PromptResult], k: int) -> Report:
    rounds = sum(r.rounds for r in results)
    # Tokens after the prefill token, i.e. those the rounds produced.
    produced = sum(len(r.generated) - 1 for r in results)
    verdicts = [(a, t) for r in results for a, t in zip(r.accepted, r.trials)]
    per_position, conditional = [], []
    for i in range(1, k + 1):
        tried = [a for a, t in verdicts if t >= i]  # rounds in which proposal i mattered
        accepted = sum(a >= i for a in tried)
        reached = sum(a >= i - 1 for a in tried)  # ... and every proposal before it was accepted
        per_position.append(accepted / len(tried) if tried else 0.0)
        conditional.append(accepted / reached if reached else 0.0)
    checked = [r.greedy_match for r in results if r.greedy_match is not None]
    return Report(
        tau=produced / rounds if rounds else float("nan"),  # no rounds: no tau (summarize refuses it)
        k=k,
        acceptance_per_position=[round(x, 4) for x in per_position],
        conditional_acceptance=[round(x, 4) for x in conditional],
        prompts=len(results),
        rounds=rounds,
        generated_tokens=sum(len(r.generated) for r in results),
        greedy_match=(sum(checked) / len(checked)) if checked else None,
        cut_replies=sum(r.cut_at is not None for r in results),
    )


# ---------------------------------------------------------------------------------------------
# The fast measurement: every round's outcome from a few forwards per prompt


class TableProposer:
    """Proposals looked up in a table computed beforehand: `table[i]` is the draft's chain for a
    round whose last verified token is sequence[i + 1] (what `propose` would return for
    sequence[: i + 2]). `sequence` is the prompt + the verifier's greedy continuation."""

    def __init__(self, sequence: list[int], table: list[list[int]]):
        self.sequence, self.table = sequence, table

    def propose(self, tokens, verifier_view, k):
        n = len(tokens)
        if tokens[-1] != self.sequence[n - 1] or len(self.table[n - 2]) < k:
            raise EvalError("the table proposer was asked about a sequence it was not built for")
        return self.table[n - 2][:k]


def chain_table(proposer: "Eagle3Proposer", sequence: list[int], view, k: int) -> list[list[int]]:
    """The draft's k-token chain at every position of `sequence`, in ONE draft forward.

    A free-running TTT chain (`Eagle3Proposer.run(..., teacher_forcing=False)`) computes, for
    every position i, exactly what `propose` computes for the last position of sequence[: i + 2]:
    step 1 attends causally to the verified positions 0..i, and steps 2..k attend to those and
    to position i's own earlier steps only (speculators' draft-token masks). So one run over the
    whole sequence answers every round that replay can ask about."""
    return _packed_tables(proposer, [sequence], [view], k)[0]


# A packed draft run's positions at most: with sdpa its dense masks grow to (k + 1) times this
# squared (400 MB of fp32 at k = 5).
PACK_POSITIONS = 4096


def chain_tables(proposer: "Eagle3Proposer", sequences: list[list[int]], views: list, k: int, packed: bool | None = None) -> list[list[list[int]]]:
    """`chain_table` of each sequence (`views`: each one's verifier view). On a GPU several
    sequences share one draft run, packed as speculators packs training rows (a document each:
    attention never crosses documents, positions restart): a draft forward there is
    launch-bound, so a pack of prompts costs about what one prompt does. On a CPU one at a time:
    there a pack's attention costs compute (`packed` overrides the choice)."""
    if not sequences:
        return []
    limit = PACK_POSITIONS if (views[0].device.type == "cuda" if packed is None else packed) else 0
    tables: list[list[list[int]]] = []
    start = 0
    while start < len(sequences):
        end, positions = start + 1, len(sequences[start]) - 1  # a sequence longer than a pack gets one of its own
        while end < len(sequences) and positions + len(sequences[end]) - 1 <= limit:
            positions += len(sequences[end]) - 1
            end += 1
        tables += _packed_tables(proposer, sequences[start:end], views[start:end], k)
        start = end
    return tables


def _packed_tables(proposer: "Eagle3Proposer", sequences: list[list[int]], views: list, k: int) -> list[list[list[int]]]:
    """`chain_table` of each sequence, from one draft run over all of them packed (a document each)."""
    import itertools

    import torch

    lengths = [len(seq) - 1 for seq in sequences]
    ids = torch.tensor([[t for seq in sequences for t in seq[1:]]], device=views[0].device)
    aux = torch.cat([view[:, :n] for view, n in zip(views, lengths)], dim=1)
    steps = proposer.run(aux, ids, k, teacher_forcing=False, documents=lengths)
    table = torch.stack([s[0] for s in steps], dim=1).tolist()  # [sum(lengths), k]
    ends = list(itertools.accumulate(lengths))
    return [table[end - n : end] for end, n in zip(ends, lengths)]


def without_cudnn_attention(measure):
    """Runs `measure` with cuDNN's attention off (flash, memory-efficient and math stay on).
    cuDNN's SDPA, torch's first choice on Hopper, plans a graph for each new shape, and a decode's
    key length is new every step: on an H200 those plans held most of this launch-bound
    measurement's CPU time (bench/gpu/speed.sh --evaluate-profile). On a CPU nothing changes:
    cuDNN is never chosen there."""
    import functools

    @functools.wraps(measure)
    def wrapped(*args, **kwargs):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            return measure(*args, **kwargs)
    return wrapped


@without_cudnn_attention
def measure_fast(verifier: "HFVerifier", proposer: "Eagle3Proposer", prompts: list[list[int]], k: int, max_new_tokens: int, eos: set[int], batch_size: int, progress=None,
                 packed: bool | None = None) -> list[PromptResult]:
    """`speculate` + the greedy check on every prompt, with a handful of forwards per prompt
    instead of two per round (the round-by-round algorithm stays as `--method chain`; tests hold
    the two to identical results):

    1. greedy continuations (max_new_tokens tokens, or to eos) for `batch_size` prompts at once,
       with a KV cache (`HFVerifier.greedy_batch`): the rounds never look past max_new_tokens
       (`_cut_at_stop`), so tokens beyond it would be decoded for nothing;
    2. per prompt, one verifier forward over prompt + continuation, without a cache like
       `speculate`'s (batched on a GPU: `HFVerifier.forward_many`): it gives the draft's view of
       every position and the verifier's own greedy choices. Where they disagree with the
       cached decode beyond a tie (the batch's other numerics), `settle` ends the reply there,
       with the forward's choice: what is measured is greedy under the forward throughout;
    3. one draft forward gives its chain at every position (`chain_table`; on a GPU one for a
       pack of prompts: `chain_tables`), and `replay` plays
       the rounds against the continuation: under greedy verification the rounds and their
       acceptances are a function of the continuation and the proposals alone.
    """
    results: list[PromptResult] = []
    for start in range(0, len(prompts), max(1, batch_size)):
        batch = prompts[start : start + max(1, batch_size)]
        settled = greedy_replies(verifier, batch, max_new_tokens, eos)
        for r in replay_settled(proposer, batch, settled, [k], max_new_tokens, eos, packed)[k]:
            results.append(r)
            if progress:
                progress(len(results))
    return results


def greedy_replies(verifier: "HFVerifier", prompts: list[list[int]], max_new_tokens: int, eos: set[int]) -> list[tuple[list[int], Any, int | None]]:
    """measure_fast's steps 1 and 2 for one batch of prompts: each one's greedy reply, settled
    against the verifier's forward, with that forward's view ((reference, view, cut_at): `settle`)."""
    references = verifier.greedy_batch(prompts, max_new_tokens, eos) if len(prompts) > 1 else [verifier.greedy(prompts[0], max_new_tokens, eos)]
    return settle(verifier, prompts, references)


def replay_settled(proposer: Proposer, prompts: list[list[int]], settled: list[tuple[list[int], Any, int | None]], ks: list[int], max_new_tokens: int, eos: set[int],
                   packed: bool | None = None) -> dict[int, list[PromptResult]]:
    """measure_fast's step 3 for one batch, at each k of `ks`: an EAGLE-3 draft's chains at every
    position from one draft run (at the largest k: a shorter chain is its prefix), any other
    proposer (n-gram lookup: the tokens alone) as it is; then `replay` against the settled replies."""
    sequences = [prompt + reference for prompt, (reference, _, _) in zip(prompts, settled)]
    if isinstance(proposer, Eagle3Proposer):
        tables = chain_tables(proposer, sequences, [view for _, view, _ in settled], max(ks), packed)
        proposers: list[Proposer] = [TableProposer(sequence, table) for sequence, table in zip(sequences, tables)]
    else:
        proposers = [proposer] * len(prompts)
    results: dict[int, list[PromptResult]] = {k: [] for k in ks}
    for prompt, (reference, view, cut_at), each in zip(prompts, settled, proposers):
        for k in ks:
            # a cut reply is measured as a reply of its length: its last round stops there
            r = replay(each, prompt, reference, view, k, max_new_tokens if cut_at is None else len(reference), eos)
            r.greedy_match, r.cut_at = True, cut_at  # settle made the reply agree with the forward
            results[k].append(r)
    return results


def settle(verifier: "HFVerifier", prompts: list[list[int]], references: list[list[int]]) -> list[tuple[list[int], Any, int | None]]:
    """Each prompt's continuation checked against the verifier's forward over prompt +
    continuation (what `speculate` verifies with), with that forward's view: (reference, view,
    cut_at).

    A batched cached decode and a forward without a cache break a near tie differently now and
    then. A choice the forward calls tied with the decode's (Choice.ties: within the verifier's
    precision) is no disagreement: both are greedy. Where the forward first disagrees beyond
    that, at position i, the reply ends there with the forward's own choice (cut_at = i): it is
    the verifier's greedy reply as far as it goes, and its rounds are measured to there.
    Decoding on from the fix instead cost a whole second decode for a handful of prompts (a
    decode is launch-bound on a GPU: 3 prompts take as long as 64), which made evaluate take 2x
    the verifier's own decoding on an H100 (bench/gpu/decode_kernels.py, bench/RESULTS.md)."""
    sequences = [prompt + reference for prompt, reference in zip(prompts, references)]
    # HFVerifier batches these on a GPU, with logits only where a choice is read (from the
    # prompt's last position on); a test's verifier has `forward` alone.
    if hasattr(verifier, "forward_many"):
        forwards = verifier.forward_many(sequences, keep_from=[len(p) - 1 for p in prompts])
    else:
        forwards = [verifier.forward(seq) for seq in sequences]
    settled = []
    for prompt, reference, (greedy, view) in zip(prompts, references, forwards):
        first = _first_disagreement(greedy, prompt, reference)
        if first is None:
            settled.append((reference, view, None))
        else:
            settled.append((reference[:first] + [int(greedy[len(prompt) - 1 + first])], view, first))
    return settled


@without_cudnn_attention
def measure_chain(verifier: "HFVerifier", proposer: "Eagle3Proposer", prompts: list[list[int]], k: int, max_new_tokens: int, eos: set[int], check_greedy: bool = True, progress=None) -> list[PromptResult]:
    """The reference (`--method chain`): `speculate` round by round on every prompt, and, with
    `check_greedy`, plain greedy decoding beside it (`greedy_match`)."""
    results: list[PromptResult] = []
    for prompt in prompts:
        r = speculate(verifier, proposer, prompt, k, max_new_tokens, eos)
        if check_greedy:
            r.greedy_match = greedy_decode(verifier, prompt, max_new_tokens, eos) == r.generated
        results.append(r)
        if progress:
            progress(len(results))
    return results


def _first_disagreement(greedy: list[int], prompt: list[int], reference: list[int]) -> int | None:
    """The first i where the verifier's own choice after prompt + reference[:i] is not
    reference[i] nor tied with it (Choice; None: it is, for every i)."""
    own = greedy[len(prompt) - 1 : len(prompt) - 1 + len(reference)]
    return next((i for i, (a, b) in enumerate(zip(own, reference)) if a != b and b not in getattr(a, "ties", ())), None)


# ---------------------------------------------------------------------------------------------
# The real models


FORWARD_LOGITS_BYTES = 1 << 31  # HFVerifier.forward_many's batches: 2 GiB of fp32 logits at most
# A runner-up within this many units of the verifier's precision (its dtype's eps, scaled by the top
# logit) ties with the top choice: a cached, batched decode and an uncached forward round their sums
# differently, and in bf16 on SmolLM2 they parted at gaps of 0 to 2 ulps (bench/evaluate_agreement.py).
TIE_EPS = 2.0


class Choice(int):
    """A greedy choice whose runner-up ties with it within the verifier's precision (`ties`): a
    decode that took the runner-up is as greedy as the forward (settle accepts it). Plain ints
    elsewhere: the chain compares choices as ints."""

    ties: frozenset[int] = frozenset()

    @classmethod
    def tied(cls, top: int, runner_up: int) -> "Choice":
        choice = cls(top)
        choice.ties = frozenset((runner_up,))
        return choice


def greedy_choices(logits) -> list:
    """Each row's argmax over the last dimension as a list (nested like `logits`' leading
    dimensions), a Choice where the runner-up is within TIE_EPS of the verifier's precision."""
    import torch

    values, ids = logits.topk(2, dim=-1)
    top, second = values.float().unbind(-1)
    near = (top - second) <= TIE_EPS * torch.finfo(logits.dtype).eps * top.abs()

    def rows(first, runner_up, tie):
        if isinstance(first, list):
            return [rows(a, b, c) for a, b, c in zip(first, runner_up, tie)]
        return Choice.tied(first, runner_up) if tie else first

    return rows(ids[..., 0].tolist(), ids[..., 1].tolist(), near.tolist())


class HFVerifier:
    """A transformers causal LM: greedy tokens, and the draft's view of each position (the
    extract stage's capture, common/hidden_state_capture.py) in the dtype the draft was trained on."""

    def __init__(self, model, layers: list[int], hidden_dtype):
        import inspect

        from common.hidden_state_capture import HiddenStateCapture
        from common.verifier import locate_decoder

        self.model = model
        self.parts = locate_decoder(model)
        self.hidden_dtype = hidden_dtype
        self.decodes = 0  # generate calls (bench/gpu/speed.py reports them)
        self.capture = HiddenStateCapture(self.parts, layers)
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    def forward(self, tokens: list[int], keep_from: int = 0):
        """(greedy choice after each position, the draft's view of every position). With
        `keep_from`, positions before it get no logits and None for a choice: evaluate reads
        no choice inside a prompt, and the vocabulary projection is a fifth of a small model's
        multiply-adds (SmolLM2-135M: 28M of 135M weights; bench/evaluate_speed.py)."""
        import torch

        with torch.no_grad(), self.capture.capturing():
            logits = self.model(input_ids=torch.tensor([tokens], device=self.device), use_cache=False, **self._logits_from(len(tokens), keep_from)).logits
        aux = self.capture.draft_input().to(self.hidden_dtype)  # [1, T, n*H]
        return self._choices(greedy_choices(logits[0]), len(tokens)), aux

    def _logits_from(self, width: int, keep_from: int) -> dict[str, int]:
        """The forward's argument that keeps the logits of positions keep_from..width-1 (two at
        least: a one-row projection takes another kernel, whose sums differ in the last bits),
        where the model takes `logits_to_keep` (transformers' own models do); else none: all."""
        keep = width - keep_from
        if keep_from <= 0 or keep < 2 or not self.keeps_logits:
            return {}
        return {"logits_to_keep": keep}

    @staticmethod
    def _choices(kept: list[int], width: int) -> list[int | None]:
        """The kept rows' choices as a list over all `width` positions (None where no logits)."""
        return [None] * (width - len(kept)) + kept

    def forward_many(self, sequences: list[list[int]], batched: bool | None = None, keep_from: list[int] | None = None) -> list[tuple[list[int | None], Any]]:
        """`forward` of each sequence (`keep_from`: each one's). On a GPU batched, longest first,
        right-padded (causal attention: a row's first T positions are its own), at most
        FORWARD_LOGITS_BYTES of logits a batch: a forward there is launch-bound, so 64 rows cost
        about what one does. On a CPU one at a time: there padding costs compute (`batched`
        overrides the choice)."""
        keep_from = keep_from or [0] * len(sequences)
        if not (self.device.type == "cuda" if batched is None else batched) or len(sequences) < 2:
            return [self.forward(seq, keep) for seq, keep in zip(sequences, keep_from)]
        import torch

        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        order = sorted(range(len(sequences)), key=lambda j: -len(sequences[j]))
        results: list[Any] = [None] * len(sequences)
        start = 0
        while start < len(order):
            width = len(sequences[order[start]])
            batch = order[start : start + max(1, FORWARD_LOGITS_BYTES // (width * vocab * 4))]
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for r, j in enumerate(batch):
                ids[r, : len(sequences[j])] = torch.tensor(sequences[j])
                mask[r, : len(sequences[j])] = 1
            keep = self._logits_from(width, min(keep_from[j] for j in batch))
            with torch.no_grad(), self.capture.capturing():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False, **keep).logits
            greedy = greedy_choices(logits)
            view = self.capture.draft_input().to(self.hidden_dtype)  # [B, width, n*H]
            for r, j in enumerate(batch):
                results[j] = (self._choices(greedy[r], width)[: len(sequences[j])], view[r : r + 1, : len(sequences[j])])
            start += len(batch)
        return results

    @property
    def device(self):
        return self.parts.embed_tokens.weight.device

    def greedy(self, prompt: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
        """Greedy decoding with a KV cache (transformers' generate), cut after the first eos."""
        import torch

        pad = self.model.config.pad_token_id if getattr(self.model.config, "pad_token_id", None) is not None else 0
        self.decodes += 1
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt], device=self.device), attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=self.device),
                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(eos) or None, pad_token_id=pad,
            )
        return _cut_after_eos(out[0, len(prompt):].tolist(), eos)

    def greedy_batch(self, prompts: list[list[int]], max_new_tokens: int, eos: set[int]) -> list[list[int]]:
        """`greedy` for several prompts in one generate call (left-padded, masked)."""
        import torch

        pad = self._pad_id(eos)
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        self.decodes += 1
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(eos) or None, pad_token_id=pad)
        return [_cut_after_eos(row[width:].tolist(), eos) for row in out]

    def _pad_id(self, eos: set[int]) -> int:
        pad = getattr(self.model.config, "pad_token_id", None)
        return pad if isinstance(pad, int) else (min(eos) if eos else 0)

    def batch_size(self, prompts: list[list[int]], max_new_tokens: int) -> int:
        """Prompts decoded at once by default: on CPU 8 (a decode step of one sequence is
        mostly per-step overhead: bench/evaluate_speed.py measured 2.6 s for 16 prompts alone,
        1.3 s by 8); on a GPU as many as a third of its free memory holds
        (common/batch_memory.py)."""
        if not prompts:
            return 1
        if self.device.type != "cuda":
            return min(8, len(prompts))
        from common.batch_memory import gpu_batch_size

        return gpu_batch_size(self.model, self.device, max(len(p) for p in prompts) + max_new_tokens, len(prompts))


def _cut_after_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


class Eagle3Proposer:
    """speculators' Eagle3DraftModel run as an inference-time chain (mirrors its forward, with the
    draft's own tokens where training feeds the ground truth)."""

    def __init__(self, draft, autocast_dtype=None):
        self.draft = draft
        self.autocast_dtype = autocast_dtype

    def propose(self, tokens: list[int], verifier_view, k: int) -> list[int]:
        import torch

        n = len(tokens) - 1  # verified positions 0..n-1 have hidden states; tokens[n] is the newest
        aux = verifier_view[:, :n]
        ids = torch.tensor([tokens[1 : n + 1]], device=aux.device)
        steps = self.run(aux, ids, k, teacher_forcing=False)
        return [int(s[0, -1]) for s in steps]

    def run(self, aux, input_ids, steps: int, teacher_forcing: bool, documents: list[int] | None = None):
        """Target-vocabulary predictions [1, T] for each of `steps` TTT steps.

        teacher_forcing=True reproduces Eagle3DraftModel.forward (step t reads the ground-truth
        token t positions ahead); False feeds each position's own prediction back (inference).
        `documents`: the lengths of the sequences packed into the T positions (one when None),
        masked and positioned apart as speculators' training packs its rows."""
        import contextlib

        import torch
        from speculators.models.eagle3.attention import extend_dense_mask_for_draft_tokens, extend_mask_for_draft_tokens
        from transformers import DynamicCache

        d = self.draft
        device = aux.device
        T = aux.shape[1]
        autocast = torch.autocast(device.type, dtype=self.autocast_dtype) if self.autocast_dtype else contextlib.nullcontext()
        with torch.no_grad(), autocast:
            documents = documents or [T]
            if sum(documents) != T or (teacher_forcing and len(documents) > 1):
                raise ValueError(f"documents {documents} do not pack {T} positions without teacher forcing")
            doc_ids = torch.repeat_interleave(torch.arange(len(documents), device=device), torch.tensor(documents, device=device))
            position_ids = 1 + torch.cat([torch.arange(n, dtype=torch.long, device=device) for n in documents]).unsqueeze(0)
            full = d._build_attn_mask(doc_ids, T, device) if d.uses_full_attn else None
            window = d._build_attn_mask(doc_ids, T, device, d.sliding_window) if d.uses_sliding_window_attn else None
            hidden = aux
            if d.input_norm is not None:
                hidden = d.input_norm(hidden)
            if d.fc_norm is not None:
                chunks = hidden.chunk(len(d.fc_norm), dim=-1)
                hidden = torch.cat([norm(c) for norm, c in zip(d.fc_norm, chunks)], dim=-1)
            hidden = d.fc(hidden)
            cache = DynamicCache()
            original = input_ids
            out = []
            for step in range(steps):
                embeds = d.embed_tokens(input_ids)
                cache_position = torch.arange(step * T, (step + 1) * T, dtype=torch.long, device=device)
                hidden = torch.cat([embeds, hidden], dim=-1)
                position_embeddings = d.rotary_emb(hidden, position_ids)
                for i, layer in enumerate(d.layers):
                    mask = window if i in d.sliding_window_indices else full
                    hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, past_key_values=cache, cache_position=cache_position, position_embeddings=position_embeddings)
                if d.config.norm_output:
                    hidden = d.norm(hidden)
                    logits = d.lm_head(hidden)
                else:
                    logits = d.lm_head(d.norm(hidden))
                predicted = self.to_target(logits.argmax(-1))
                out.append(predicted)
                if teacher_forcing:
                    input_ids = torch.cat([original[:, 1 + step :], original.new_zeros(1, 1 + step)], dim=-1)
                else:
                    input_ids = predicted
                if d._attn_impl == "simple_flex_attention":
                    full = extend_mask_for_draft_tokens(full) if full is not None else None
                    window = extend_mask_for_draft_tokens(window) if window is not None else None
                else:
                    full = extend_dense_mask_for_draft_tokens(full, T) if full is not None else None
                    window = extend_dense_mask_for_draft_tokens(window, T) if window is not None else None
                position_ids = position_ids + 1
        return out

    def to_target(self, draft_ids):
        """Draft-vocabulary ids -> verifier ids (speculators stores d2t as offsets)."""
        d = self.draft
        if getattr(d, "use_draft_vocab", False):
            return draft_ids + d.d2t[draft_ids]
        return draft_ids


class NgramProposer:
    """vLLM's `ngram` method (prompt lookup decoding), the baseline that needs no training: the
    last n tokens, n from `max_n` down to `min_n`, are looked up in the context so far; the first
    earlier occurrence of the longest suffix that has one proposes the k tokens that followed it.
    No match (or fewer than k tokens after it): the rest of the k are -1, which the verifier never
    accepts (a round without proposals yields its one token, as in vLLM)."""

    def __init__(self, min_n: int = 1, max_n: int = 4):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, tokens, verifier_view, k):
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n):  # occurrences that end before the suffix itself
                if tokens[start : start + n] == suffix:
                    follow = tokens[start + n : start + n + k]
                    return follow + [-1] * (k - len(follow))
        return [-1] * k


# ---------------------------------------------------------------------------------------------
# Loading


def load_draft(ckpt: Path, verifier: str, attn_impl: str):
    """speculators' Eagle3 draft from a checkpoint, its attention implementation set explicitly."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    from common.draft_attention import check_draft_attention

    import torch

    config = Eagle3SpeculatorConfig.from_pretrained(str(ckpt))
    config.transformer_layer_config._attn_implementation = attn_impl
    # speculators reads the verifier's lm_head and final norm (and any embeddings the checkpoint
    # lacks) from the path the config recorded at training time, not from `verifier=`: a checkpoint
    # pulled or moved to another path would fail, or read another model's, without this.
    config.speculators_config.verifier.name_or_path = verifier
    # bf16 weights and bf16 hidden states: what the checkpoint holds and what a server runs.
    draft = Eagle3DraftModel.from_pretrained(str(ckpt), config=config, verifier=verifier, dtype=torch.bfloat16)
    draft.eval()
    check_draft_attention(draft, "cpu" if attn_impl in ("sdpa", "eager") else "cuda")
    return draft


def draft_layers(draft, num_verifier_layers: int) -> list[int]:
    layers = list(draft.config.eagle_aux_hidden_state_layer_ids or [])
    if not layers:
        n = num_verifier_layers
        layers = [2, n // 2, n - 3]
    if min(layers) < 0 or max(layers) > num_verifier_layers:
        raise EvalError(f"draft target layers {layers} do not fit a verifier with {num_verifier_layers} layers")
    return layers


# ---------------------------------------------------------------------------------------------
# Curves and plots


def training_curves(paths: list[Path]) -> list[dict]:
    """Metric events (step, metrics) from the first of `paths` that has any: the train stage's
    metrics.jsonl next to its checkpoints, or its events.jsonl."""
    for p in paths:
        if p.is_file():
            records = [e for e in read_events(str(p)) if e.get("event") == "metric" and e.get("stage", "train") == "train"]
            if records:
                return records
    return []


def short_of_k_plus_one(report: Report) -> str | None:
    """Why tau is below k + 1 though every position is accepted (nearly) always, or None: a
    reply's last round stops at its end (end of turn, or the token budget), so a round averages
    fewer than k + 1 tokens even when no proposal is refused."""
    ceiling = report.k + 1
    if not report.acceptance_per_position or min(report.acceptance_per_position) < 0.99 or report.tau >= ceiling - 0.05:
        return None
    per_reply = report.generated_tokens / report.prompts if report.prompts else 0
    return (f"tau {report.tau:.2f} is below k + 1 = {ceiling} with every position accepted: each reply's last round stops at "
            f"its end (end of turn or the token budget; {per_reply:.0f} tokens a reply here), so rounds average fewer than {ceiling} tokens")


def plot_acceptance(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    positions = list(range(1, report.k + 1))
    ax.bar(positions, report.acceptance_per_position, color="#4c72b0", label="accepted")
    ax.plot(positions, report.conditional_acceptance, "o--", color="#dd8452", label="accepted | previous accepted")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(positions)
    ax.set_title(f"tau = {report.tau:.2f} (k = {report.k}, {report.prompts} prompts)")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    _save_fig(fig, path)


def training_taus(records: list[dict]) -> list[dict]:
    """The train stage's tau estimates, in order: [{"step": N, "tau": X}, ...]."""
    return [{"step": int(e["step"]), "tau": float(e["metrics"]["tau"])} for e in records if "tau" in e.get("metrics", {})]


def plot_training(records: list[dict], path: Path, evaluated: tuple[int, float] | None = None, speculative_tokens: int | None = None) -> bool:
    """Loss, per-step accuracy and (when the train stage estimated it) tau against the step, on
    1..speculative_tokens+1; `evaluated` (step, tau): the evaluate stage's tau of the chosen checkpoint, marked on the last."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(e["step"], e["metrics"]) for e in records if "loss" in e.get("metrics", {})]
    val = [(e["step"], e["metrics"]) for e in records if any(k.startswith("val_") for k in e.get("metrics", {}))]
    if not train:
        return False
    taus = training_taus(records)
    fig, axes = plt.subplots(1, 3 if taus else 2, figsize=(13.5 if taus else 9, 3.2))
    ax_loss, ax_acc = axes[0], axes[1]
    steps = [s for s, _ in train]
    ax_loss.plot(steps, [m["loss"] for _, m in train], lw=1, label="train loss")
    if val:
        ax_loss.plot([s for s, _ in val], [m.get("val_loss", float("nan")) for _, m in val], "o-", label="val loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_yscale("log")
    ax_loss.legend(fontsize=8)
    ttt = sorted({int(k.rsplit("_", 1)[1]) for _, m in train for k in m if k.startswith("full_acc_")})
    for t in ttt:
        color = f"C{t}"  # a position's train line and its validation points in one colour
        ax_acc.plot(steps, [m.get(f"full_acc_{t}", float("nan")) for _, m in train], lw=1, color=color, label=f"position {t + 1} (train)")
        if val:
            ax_acc.plot([s for s, _ in val], [m.get(f"val_full_acc_{t}", float("nan")) for _, m in val], "o", ms=3, color=color,
                        label=f"position {t + 1} (validation)")
    ax_acc.set_xlabel("optimizer step")
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_ylim(0, 1.02)
    ax_acc.legend(fontsize=7, ncol=2)
    if taus:
        ax_tau = axes[2]
        ax_tau.plot([t["step"] for t in taus], [t["tau"] for t in taus], "o-", label="estimated while training")
        if evaluated is not None:
            ax_tau.plot([evaluated[0]], [evaluated[1]], "*", ms=12, color="#c44e52", label="evaluate, chosen checkpoint")
        ax_tau.set_xlabel("step")
        ax_tau.set_ylabel("tau (acceptance length)")
        ax_tau.set_ylim(1.0, speculative_tokens + 1.05 if speculative_tokens else None)
        ax_tau.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    _save_fig(fig, path)
    return True


def _save_fig(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Main


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description="Acceptance length of an EAGLE-3 draft against its verifier.")
    p.add_argument("--verifier", required=True)
    p.add_argument("--draft", required=True, help="a checkpoint directory, or the train stage's output (the checkpoint its best.json names, else the latest epoch)")
    p.add_argument("--data", required=True, help="chat JSONL with held-out rows (split=heldout)")
    p.add_argument("--output", required=True)
    p.add_argument("--speculative-tokens", type=int, default=3, help="k: tokens the draft proposes per round")
    p.add_argument("--split", default="heldout", help="which rows' prompts to use ('all' for every row)")
    p.add_argument("--max-prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--ignore-eos", action="store_true", help="every reply runs to --max-new-tokens, past the verifier's end of turn (vLLM's ignore_eos): a measurement on a verifier that would end its turn at once")
    p.add_argument("--attn-impl", choices=["auto", "simple_flex_attention", "sdpa", "eager"], default="auto", help="draft attention (auto: sdpa; inference needs no flex)")
    p.add_argument("--check-greedy", action=argparse.BooleanOptionalAction, default=True, help="--method chain: also decode each prompt greedily and check the speculative output equals it (--method fast always checks)")
    p.add_argument("--method", choices=["fast", "chain"], default="fast", help="fast: a few forwards per prompt (batched greedy decoding with a KV cache, one verifier and one draft forward); chain: the reference, two forwards per round without a cache (same results, many times slower)")
    p.add_argument("--batch-size", type=int, default=0, help="--method fast: prompts decoded at once (0: 8 on CPU, sized to free memory on a GPU)")
    p.add_argument("--train-metrics", default=None, help="train metrics/events JSONL for the curves (default: DRAFT/metrics.jsonl, then the train stage's events.jsonl)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default); the tiny models gain nothing from more")
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers run the verifier's own code (auto_map)")
    p.add_argument("--events", default=None)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    def evaluate(args: argparse.Namespace, events: EventLog) -> dict[str, Any]:
        return stage_summary(run(args, events), args.split)

    return run_stage(STAGE, parse_args(argv), evaluate)


def stage_summary(report: Report, split: str) -> dict[str, Any]:
    """The finished event's summary (docs/events.json "summaries.evaluate": harness sweep reads tau
    and tau_by_category)."""
    return {"tau": round(report.tau, 4), "split": split, "tau_by_category": report.by_category, "acceptance_per_position": report.acceptance_per_position,
            "looping_prompts": report.looping_prompts, "tau_without_loops": report.tau_without_loops, "cut_replies": report.cut_replies, "prompts": report.prompts, "seconds": report.seconds,
            "report": report.extra.get("report")}


def run(args: argparse.Namespace, events: EventLog) -> Report:
    import torch
    from transformers import AutoTokenizer

    from common.verifier import load_verifier, locate_decoder

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.speculative_tokens < 1:
        raise EvalError("--speculative-tokens must be at least 1")
    if args.max_new_tokens < 2:
        raise EvalError("--max-new-tokens must be at least 2: the first token comes from the prompt's forward, the draft's rounds after it")
    started = time.monotonic()
    verifier_dir = Path(args.verifier)
    if not (verifier_dir / "config.json").is_file():
        raise EvalError(f"--verifier {verifier_dir}: no config.json")
    verifier_path = str(verifier_dir.resolve())
    ckpt, best = resolve_draft(Path(args.draft))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = AutoTokenizer.from_pretrained(verifier_path, trust_remote_code=args.trust_remote_code)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # The verifier in the stages' common dtype (fp32 on CPU, bf16 on GPU), the draft in bf16.
    model = load_verifier(verifier_path, device=device, trust_remote_code=args.trust_remote_code)
    attn_impl = "sdpa" if args.attn_impl == "auto" else args.attn_impl
    draft = load_draft(ckpt, verifier_path, attn_impl).to(device)
    layers = draft_layers(draft, locate_decoder(model).num_layers)
    verifier = HFVerifier(model, layers, torch.bfloat16)
    proposer = Eagle3Proposer(draft, autocast_dtype=None)
    eos = set() if args.ignore_eos else _eos_ids(tokenizer, model)
    prompts, categories = load_categorized_prompts(tokenizer, Path(args.data), args.split, args.max_prompts)
    chosen = f", the best while training (estimated tau {best['tau']:.2f} at step {best['step']})" if best else ""
    events.message(f"draft {ckpt}{chosen} ({draft.config.draft_vocab_size} draft tokens, target layers {layers}); {len(prompts)} held-out prompts; k={args.speculative_tokens}")

    batch_size = 0
    if args.method == "chain":
        results = measure_chain(verifier, proposer, prompts, args.speculative_tokens, args.max_new_tokens, eos, args.check_greedy,
                                progress=lambda i: events.progress(i, len(prompts), unit="prompts"))
    else:
        batch_size = args.batch_size or verifier.batch_size(prompts, args.max_new_tokens + args.speculative_tokens + 1)
        results = measure_fast(verifier, proposer, prompts, args.speculative_tokens, args.max_new_tokens, eos, batch_size, progress=lambda i: events.progress(i, len(prompts), unit="prompts"))
    for r in results:
        r.looping = is_looping(r.generated, eos)
    report = summarize(results, args.speculative_tokens)
    report.by_category = tau_by_category(results, categories, args.speculative_tokens)
    report.seconds = round(time.monotonic() - started, 1)
    if report.greedy_match is not None and report.greedy_match < 1.0:
        events.message(f"warning: speculative output differs from greedy decoding on {1 - report.greedy_match:.0%} of prompts")
    if report.looping_prompts:
        events.message(f"{report.looping_prompts} of {report.prompts} replies loop (a repeated span to the token budget): tau {report.tau:.2f} counts them, {report.tau_without_loops:.2f} without them")
    if report.cut_replies:
        cuts = ", ".join(str(r.cut_at) for r in results if r.cut_at is not None)
        events.message(f"{report.cut_replies} of {report.prompts} replies are measured up to where the batched decode and the verifier's own forward "
                       f"parted beyond a tie (at reply token {cuts}; numerics, as bf16 on a GPU does): tau counts their tokens to there")
    events.metric(0, tau=round(report.tau, 4), **{f"acceptance_{i + 1}": a for i, a in enumerate(report.acceptance_per_position)})
    why = short_of_k_plus_one(report)
    if why:
        events.message(why)
    if report.by_category:
        events.message(f"tau on {args.split} by category: " + ", ".join(f"{c} {_tau_text(v['tau'])} ({v['prompts']} prompts)" for c, v in report.by_category.items()))

    plot_acceptance(report, out / "acceptance.png")
    curves_from = [Path(args.train_metrics)] if args.train_metrics else [ckpt.parent / "metrics.jsonl", ckpt / "metrics.jsonl"]
    if args.events and not args.train_metrics:
        curves_from.append(Path(args.events).resolve().parent.parent / "train" / "events.jsonl")
    curves = training_curves(curves_from)
    has_curves = plot_training(curves, out / "training.png", evaluated=(best["step"], report.tau) if best else None, speculative_tokens=args.speculative_tokens)
    report.extra = {
        "draft": str(ckpt.resolve()),
        # Which checkpoint, why, and both figures: tau estimated while training, and measured here.
        "checkpoint": {
            "name": ckpt.name,
            "chosen_by": "best.json" if best else ("latest epoch" if ckpt != Path(args.draft) else "given"),
            "step": best["step"] if best else None,
            "training_tau": best["tau"] if best else None,
            "tau": round(report.tau, 4),
        },
        "training_tau": training_taus(curves),
        "verifier": verifier_path,
        "target_layers": layers,
        "split": args.split,
        "max_new_tokens": args.max_new_tokens,
        "ignore_eos": args.ignore_eos,
        "method": args.method,
        **({"batch_size": batch_size} if args.method == "fast" else {}),
        "looping": [i for i, r in enumerate(results) if r.looping],  # which prompts (in --data order)
        "cut": {str(i): r.cut_at for i, r in enumerate(results) if r.cut_at is not None},  # prompt -> the reply token it ends at
        "plots": {"acceptance": str((out / "acceptance.png").resolve()), **({"training": str((out / "training.png").resolve())} if has_curves else {})},
        "report": str((out / "report.json").resolve()),
    }
    write_json_atomic(out / "report.json", asdict(report))
    for name in ("report.json", "acceptance.png", *(["training.png"] if has_curves else [])):
        events.artifact(str(out / name), kind="report" if name.endswith(".json") else "plot")
    return report


def _eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return ids


if __name__ == "__main__":
    sys.exit(main())
