"""evaluate.py: the speculation loop (exact tau for known drafts), the EAGLE-3 proposer's fidelity
to speculators' forward, and the stage end to end on a briefly trained draft."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))

from tests.fixtures.requires import require_module  # noqa: E402
torch = require_module("torch")
require_module("speculators")

import evaluate as ev  # noqa: E402
from common.conversations import load_prompts  # noqa: E402

from tests.fixtures.pipeline_data import read_events, run_script, tiny_eagle3_draft  # noqa: E402

# ---------------------------------------------------------------------------------------------
# The loop, on a toy verifier whose greedy choice is a fixed successor map


EOS = 0


class RandomProposer:
    """Uniform random tokens: a draft that knows nothing (tau ~ 1)."""

    def __init__(self, vocab_size: int, seed: int = 0):
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)

    def propose(self, tokens, verifier_view, k):
        return [self.rng.randrange(self.vocab_size) for _ in range(k)]


class GreedyOracleProposer:
    """The verifier itself, decoding greedily: a draft identical to the verifier (tau = k+1 but for
    the end of each reply)."""

    def __init__(self, verifier):
        self.verifier = verifier

    def propose(self, tokens, verifier_view, k):
        seq, out = list(tokens), []
        for _ in range(k):
            greedy, _ = self.verifier.forward(seq)
            out.append(greedy[-1])
            seq.append(greedy[-1])
        return out



class ChainVerifier:
    """Greedy next token = successor[token]; each token's chain ends in EOS."""

    def __init__(self, vocab: int = 50, seed: int = 0):
        rng = random.Random(seed)
        words = list(range(1, vocab))
        rng.shuffle(words)
        self.successor = {}
        for i, w in enumerate(words):
            self.successor[w] = words[i + 1] if (i + 1) % 12 and i + 1 < len(words) else EOS
        self.successor[EOS] = EOS
        self.calls = 0

    def forward(self, tokens):
        self.calls += 1
        return [self.successor[t] for t in tokens], None


def _prompts(v: ChainVerifier, n: int = 20):
    rng = random.Random(1)
    starts = [w for w in v.successor if w != EOS and v.successor[w] != EOS]
    return [[rng.randrange(1, 50), rng.choice(starts)] for _ in range(n)]


def _reply_length(v: ChainVerifier, prompt):
    n, t = 0, prompt[-1]
    while True:
        t = v.successor[t]
        n += 1
        if t == EOS:
            return n


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_draft_identical_to_the_verifier_is_always_accepted(k):
    v = ChainVerifier()
    prompts = _prompts(v)
    results = [ev.speculate(v, GreedyOracleProposer(v), p, k, 100, {EOS}) for p in prompts]
    report = ev.summarize(results, k)
    assert report.acceptance_per_position == [1.0] * k
    # Every round yields k+1 tokens but the last of each reply: tau is exactly computable.
    lengths = [_reply_length(v, p) - 1 for p in prompts]  # tokens after the prefill one
    expected_rounds = sum(math.ceil(n / (k + 1)) for n in lengths)
    assert report.rounds == expected_rounds
    assert report.tau == pytest.approx(sum(lengths) / expected_rounds)
    for p, r in zip(prompts, results):
        assert r.generated == ev.greedy_decode(v, p, 100, {EOS})


def test_a_random_draft_gets_about_one_token_per_round():
    v = ChainVerifier(vocab=50)
    results = [ev.speculate(v, RandomProposer(50, seed=3), p, 3, 100, {EOS}) for p in _prompts(v)]
    report = ev.summarize(results, 3)
    assert 1.0 <= report.tau < 1.15
    assert report.acceptance_per_position[0] < 0.15


class HalfRightProposer:
    """Right for the first proposal, wrong after: tau is exactly 2 but for reply ends."""

    def __init__(self, v):
        self.v = v

    def propose(self, tokens, view, k):
        first = self.v.successor[tokens[-1]]
        return [first] + [(first + 7) % 50 or 1] * (k - 1)


def test_partial_acceptance_and_output_equals_greedy():
    v = ChainVerifier()
    prompts = _prompts(v)
    results = [ev.speculate(v, HalfRightProposer(v), p, 3, 100, {EOS}) for p in prompts]
    report = ev.summarize(results, 3)
    assert report.acceptance_per_position[0] == 1.0
    assert report.acceptance_per_position[1] < 0.2
    assert 1.8 < report.tau <= 2.0
    for p, r in zip(prompts, results):
        assert r.generated == ev.greedy_decode(v, p, 100, {EOS})


def test_the_token_budget_stops_generation():
    v = ChainVerifier()
    r = ev.speculate(v, GreedyOracleProposer(v), [5, 7], 3, 4, set())  # no eos: budget only
    assert len(r.generated) == 4


class LineVerifier:
    """Greedy next token = the next one along a fixed line of tokens (EOS, or past the line: EOS)."""

    def __init__(self, line):
        self.successor = {a: b for a, b in zip(line, line[1:])}

    def forward(self, tokens):
        return [self.successor.get(t, EOS) for t in tokens], None


class ScriptedProposer:
    """The proposals of each round, in order, as written by the test."""

    def __init__(self, rounds):
        self.rounds = list(rounds)

    def propose(self, tokens, view, k):
        return self.rounds.pop(0)


# (line the verifier follows, proposals per round, budget, eos) -> (generated, accepted, trials).
# Proposals past the stop (end of turn or the budget) were never needed: they count neither as
# accepted nor as tried, even where the verifier agrees with them.
STOP_CASES = {
    "an accepted proposal ends the turn": (
        [5, 6, 7, EOS], [[7, EOS, EOS]], 100, {EOS}, ([6, 7, EOS], [2], [2])),
    "the verifier's own token ends the turn": (
        [5, 6, 7, EOS], [[7, 9, 9]], 100, {EOS}, ([6, 7, EOS], [1], [2])),
    "the first proposal ends the turn": (
        [5, 6, EOS], [[EOS, EOS, EOS]], 100, {EOS}, ([6, EOS], [1], [1])),
    "the budget ends the reply inside the proposals": (
        [5, 6, 7, 8, 9, 10, 11], [[7, 8, 9]], 3, set(), ([6, 7, 8], [2], [2])),
    "a full round, then a stop two proposals in": (
        [5, 6, 7, 8, 9, 10, 11, EOS], [[7, 8, 9], [11, EOS, EOS]], 100, {EOS}, ([6, 7, 8, 9, 10, 11, EOS], [3, 2], [3, 2])),
}


@pytest.mark.parametrize("case", STOP_CASES)
@pytest.mark.parametrize("method", ["chain", "fast"])
def test_proposals_past_a_stop_count_neither_accepted_nor_tried(case, method):
    line, proposals, budget, eos, (generated, accepted, trials) = STOP_CASES[case]
    v, k = LineVerifier(line), 3
    prompt = [1, line[0]]
    if method == "chain":
        r = ev.speculate(v, ScriptedProposer(proposals), prompt, k, budget, eos)
    else:
        reference = ev.greedy_decode(v, prompt, budget + k + 1, eos)
        r = ev.replay(ScriptedProposer(proposals), prompt, reference, None, k, budget, eos)
    assert (r.generated, r.rounds, r.accepted, r.trials) == (generated, len(proposals), accepted, trials)
    # The report's figures, counted here by hand from the same rounds: position i is tried in the
    # rounds with trials >= i, accepted in those with accepted >= i.
    report = ev.summarize([r], k)
    tried = [sum(t >= i for t in trials) for i in (1, 2, 3)]
    hits = [sum(a >= i for a in accepted) for i in (1, 2, 3)]
    assert report.acceptance_per_position == [round(h / n, 4) if n else 0.0 for h, n in zip(hits, tried)]
    assert report.tau == (len(generated) - 1) / len(proposals)


class MisdecodingVerifier(ChainVerifier):
    """A ChainVerifier whose batched cached decode breaks a tie the other way at the first token
    of `wrong` prompts (what bf16 numerics do on a GPU); its forward stays the truth."""

    def __init__(self, wrong: set[int], at: int = 0):
        super().__init__()
        self.wrong, self.at, self.decodes = wrong, at, 0

    def _decode(self, prompt, n, eos, slip):
        out, t = [], prompt[-1]
        while len(out) < n:
            t = self.successor[t] if not (slip and len(out) == self.at) else (self.successor[t] % 49) + 1
            out.append(t)
            if t in eos:
                break
        return out

    def greedy(self, prompt, n, eos):
        self.decodes += 1
        return self._decode(prompt, n, eos, False)

    def greedy_batch(self, prompts, n, eos):
        self.decodes += 1
        return [self._decode(p, n, eos, tuple(p) in self.wrong) for p in prompts]


def test_settle_ends_a_reply_where_the_decode_parts_from_the_forward():
    """Where the batch decode's token is not the forward's (nor tied with it), the reply ends
    there with the forward's token: no second decode (on a GPU one costs a whole decode, however
    few prompts it is for); the other replies stand as decoded."""
    v0 = ChainVerifier()
    prompts = _prompts(v0, 8)
    v = MisdecodingVerifier({tuple(p) for p in prompts[:5]})
    budget = 30
    references = v.greedy_batch(prompts, budget, {EOS})
    settled = ev.settle(v, prompts, references)
    assert v.decodes == 1  # the batch's own only
    for i, (prompt, (reference, _view, cut_at)) in enumerate(zip(prompts, settled)):
        truth = v._decode(prompt, budget, {EOS}, False)
        if i < 5:  # misdecoded at its first token: the reply is the forward's first token alone
            assert (reference, cut_at) == (truth[:1], 0) and references[i][0] != truth[0]
        else:
            assert (reference, cut_at) == (references[i], None) and reference == truth


def test_a_cut_reply_measures_what_speculation_does_on_a_reply_of_its_length():
    """measure_fast replays a cut reply with its length as the budget: its rounds, acceptances
    and trials are the chain's on the same prompt with that budget, and the report counts it."""
    import torch

    class Viewing(MisdecodingVerifier):  # a view tensor, as the draft's table needs one
        def forward(self, tokens):
            return super().forward(tokens)[0], torch.zeros(1, len(tokens), 1)

    class TwoRight:  # the verifier's next two tokens, then a wrong one: the chain and the table agree
        def __init__(self, v):
            self.v = v

        def chain(self, t):
            return [self.v.successor[t], self.v.successor[self.v.successor[t]], 0]

        def propose(self, tokens, view, k):
            return self.chain(tokens[-1])

        def run(self, view, ids, k, teacher_forcing=False, documents=None):
            chains = [self.chain(t) for t in ids[0].tolist()]
            return [torch.tensor([[c[j] for c in chains]]) for j in range(k)]

    v0 = ChainVerifier()
    prompts = [p for p in _prompts(v0) if _reply_length(v0, p) >= 8][:4]
    v = Viewing({tuple(prompts[0])}, at=5)  # its decode slips at the 6th token: cut there
    draft = TwoRight(v)
    fast = ev.measure_fast(v, draft, prompts, 3, 30, {EOS}, 4)
    assert [r.cut_at for r in fast] == [5, None, None, None] and len(fast[0].generated) == 6 and fast[0].rounds >= 2
    for prompt, r in zip(prompts, fast):
        chain = ev.speculate(v, draft, prompt, 3, len(r.generated) if r.cut_at is not None else 30, {EOS})
        assert (r.generated, r.rounds, r.accepted, r.trials) == (chain.generated, chain.rounds, chain.accepted, chain.trials)
    assert ev.summarize(fast, 3).cut_replies == 1


def test_settle_keeps_a_decode_that_took_a_tied_runner_up():
    """Where the forward's choice ties with the decode's (Choice.ties: within the verifier's
    precision), the decode stands: no second decode, the reply unchanged, greedy_match True."""
    v0 = ChainVerifier()
    prompts = _prompts(v0, 6)

    class TiedVerifier(MisdecodingVerifier):
        def forward(self, tokens):
            greedy, view = super().forward(tokens)
            # the runner-up at each position is what the misdecode takes there
            return [ev.Choice.tied(g, (self.successor[t] % 49) + 1) for g, t in zip(greedy, tokens)], view

    v = TiedVerifier({tuple(p) for p in prompts[:3]})
    references = v.greedy_batch(prompts, 30, {EOS})
    settled = ev.settle(v, prompts, references)
    assert v.decodes == 1
    assert [s[0] for s in settled] == references and all(s[2] is None for s in settled)
    assert references[0] != v._decode(prompts[0], 30, {EOS}, False)  # the tie did change that reply


def test_greedy_choices_mark_a_runner_up_within_the_dtype_precision():
    """bf16: a runner-up one ulp below the top ties with it; one well below does not. fp32: the
    same gap of one bf16 ulp is 65,536 of its own: no tie."""
    import torch

    logits = torch.tensor([[[16.0, 15.875, 0.0], [16.0, 10.0, 0.0]]])  # 15.875: one bf16 ulp below 16
    choices = ev.greedy_choices(logits.to(torch.bfloat16))
    assert choices == [[0, 0]]
    assert choices[0][0].ties == {1} and getattr(choices[0][1], "ties", frozenset()) == frozenset()
    assert all(not getattr(c, "ties", None) for c in ev.greedy_choices(logits)[0])
    assert ev._first_disagreement(choices[0], [7], [1, 0]) is None  # the tied runner-up is no disagreement
    assert ev._first_disagreement(choices[0], [7], [0, 1]) == 1


@pytest.mark.parametrize("method", ["fast", "chain"])
def test_the_measurements_run_without_cudnn_attention(method):
    """cuDNN's SDPA plans a graph per new shape (every decode step): the measurements turn it off,
    keep the other kernels, and leave the caller's settings as they were."""
    import torch

    seen = []

    class Watching(MisdecodingVerifier):
        def forward(self, tokens):
            seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
            return super().forward(tokens)

    v = Watching(set())
    before = torch.backends.cuda.cudnn_sdp_enabled()
    prompts = _prompts(v, 2)
    if method == "chain":
        class Ones:
            def propose(self, tokens, view, k):
                return [1] * k

        ev.measure_chain(v, Ones(), prompts, 3, 20, {EOS})
    else:
        with pytest.raises(AttributeError):  # the toy has no draft: the verifier's forwards before the table are what is checked
            ev.measure_fast(v, object(), prompts, 3, 20, {EOS}, 2)
    assert seen and set(seen) == {(False, True, True)}
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    ev.settle(v, prompts, [v.greedy(p, 24, {EOS}) for p in prompts])
    assert seen[-1][0] == before  # outside a measurement: the caller's choice


def test_a_proposer_returning_the_wrong_count_is_an_error():
    v = ChainVerifier()

    class Short:
        def propose(self, tokens, view, k):
            return [1]

    with pytest.raises(ev.EvalError, match="returned 1 tokens, expected 3"):
        ev.speculate(v, Short(), _prompts(v)[0], 3, 50, {EOS})


def test_no_round_is_no_tau_and_a_tau_below_one_is_a_bug():
    """tau is tokens per round, at least 1: where no round was measured there is none to give
    (not a 0.0 written as if measured), and a tau outside [1, k+1] is a bug."""
    with pytest.raises(ev.EvalError, match="no prompt was measured"):
        ev.summarize([], 3)
    at_once = [ev.PromptResult(5, [EOS], 0, [], []) for _ in range(4)]  # each reply: the prefill's eos
    with pytest.raises(ev.EvalError, match="every reply ended at its first token .4 prompts.*no draft round was measured.*--ignore-eos"):
        ev.summarize(at_once, 3)
    one_round = ev.PromptResult(5, [1, 2, EOS], 1, [1], [2])
    assert ev.summarize([*at_once, one_round], 3).tau == 2.0  # a prompt with a round is a measurement
    broken = ev.PromptResult(5, [1], 2, [0, 0], [3, 3])  # 2 rounds that produced nothing: impossible
    with pytest.raises(ev.EvalError, match=r"bug: tau 0.0 outside \[1, 4\]"):
        ev.summarize([broken], 3)
    looping_only = ev.PromptResult(5, [1] * 9, 4, [1] * 4, [3] * 4, looping=True)
    assert ev.summarize([*at_once, looping_only], 3).tau_without_loops is None  # the others had no round: no figure
    by_category = ev.tau_by_category([*at_once[:2], one_round], ["code", "code", "chat"], 3)
    assert by_category == {"chat": {"tau": 2.0, "prompts": 1}, "code": {"tau": None, "prompts": 2}}  # no round in code: no tau


def test_loops_are_replies_that_repeat_a_span_to_the_budget():
    eos = {EOS}
    prose = list(range(1, 60))  # no repetition
    assert not ev.is_looping(prose, eos)
    assert ev.is_looping(prose[:20] + [7, 8] * 20, eos)  # "1.1.1.1." : period 2
    assert ev.is_looping(prose[:10] + list(range(30, 45)) * 3, eos)  # a 15-token sentence again and again
    # A numbered list whose items repeat but for the number: 4 of 5 tokens match at period 5.
    numbered = [t for n in range(100, 112) for t in (n, 1, 2, 3, 4)]
    assert ev.is_looping(numbered, eos)
    assert not ev.is_looping(prose[:20] + [7, 8] * 20 + [EOS], eos)  # it ended its turn: no loop
    assert not ev.is_looping([7, 8] * 10, eos)  # too short to tell
    assert not ev.is_looping(prose[:20] + list(range(60, 80)) * 2, eos)  # a 20-token span twice: period above 16


def test_the_summary_counts_loops_and_gives_tau_without_them():
    def result(rounds, tokens, looping):
        return ev.PromptResult(5, [1] * (tokens + 1), rounds, [1] * rounds, [3] * rounds, looping=looping)

    report = ev.summarize([result(10, 20, False), result(10, 40, True)], 3)
    assert report.tau == pytest.approx(60 / 20) and report.looping_prompts == 1
    assert report.tau_without_loops == pytest.approx(20 / 10)
    clean = ev.summarize([result(10, 20, False)], 3)
    assert clean.looping_prompts == 0 and clean.tau_without_loops is None


# ---------------------------------------------------------------------------------------------
# The EAGLE-3 proposer mirrors speculators' forward


def _tiny_draft(draft_vocab: int | None = None):
    torch.manual_seed(0)
    vocab = 40
    draft = tiny_eagle3_draft("sdpa", vocab=vocab, draft_vocab=draft_vocab, norm_before_fc=True, norm_output=True)
    with torch.no_grad():  # the vocab weights normally come from the verifier (NaN until then)
        draft.embed_tokens.weight.normal_()
        draft.lm_head.weight.normal_()
    if draft_vocab:
        keep = torch.tensor(sorted(random.Random(0).sample(range(vocab), draft_vocab)))
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[keep] = True
        draft.load_vocab_mappings(t2d, keep - torch.arange(draft_vocab))
    return draft.eval()


@pytest.mark.parametrize("draft_vocab", [None, 24])
def test_teacher_forced_chain_equals_speculators_forward(draft_vocab):
    draft = _tiny_draft(draft_vocab)
    T = 10
    aux = torch.randn(1, T, 3 * 16)
    ids = torch.randint(0, 40, (1, T))
    with torch.no_grad():
        reference = draft(hidden_states=aux, input_ids=ids, document_ids=torch.zeros(1, T, dtype=torch.long), ttt_steps=3)
    mine = ev.Eagle3Proposer(draft).run(aux, ids, 3, teacher_forcing=True)
    for step, (ref, got) in enumerate(zip(reference, mine)):
        ref_target = ev.Eagle3Proposer(draft).to_target(ref)
        assert torch.equal(ref_target, got), f"TTT step {step}"


def test_free_running_chain_feeds_its_own_tokens():
    draft = _tiny_draft()
    T = 6
    aux, ids = torch.randn(1, T, 48), torch.randint(0, 40, (1, T))
    proposer = ev.Eagle3Proposer(draft)
    steps = proposer.run(aux, ids, 3, teacher_forcing=False)
    # Step 1 sees only verified inputs: identical either way.
    assert torch.equal(steps[0], proposer.run(aux, ids, 1, teacher_forcing=True)[0])
    # The proposal is the last position's chain; the view passed in covers tokens[:-1].
    tokens = [3] + ids[0].tolist()
    assert proposer.propose(tokens, aux, 3) == [int(s[0, -1]) for s in steps]


def test_draft_tokens_map_to_verifier_ids():
    draft = _tiny_draft(24)
    p = ev.Eagle3Proposer(draft)
    ids = torch.arange(24).unsqueeze(0)
    mapped = p.to_target(ids)
    assert torch.equal(mapped[0], torch.nonzero(draft.t2d).squeeze(1))


# ---------------------------------------------------------------------------------------------
# The stage on the real tiny models


@pytest.fixture(scope="module")
def briefly_trained_draft(tiny_verifier, prepared_data, hidden_states, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_draft") / "checkpoints"
    run_script(
        "train_draft.py", "--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--hidden-states", hidden_states,
        "--output", out, "--epochs", "1", "--max-steps", "20", "--total-seq-len", "256",
        "--lr", "5e-3",  # 20 steps: a rate far above the full runs' default, so that they already move the draft
        "--events", out.parent / "events.jsonl",
    )
    return out


@pytest.fixture(scope="session")
def random_draft(tiny_verifier, prepared_data, hidden_states, tmp_path_factory):
    """The same draft and checkpoint format, never trained: one optimizer step at lr 0 keeps the
    initial (random) weights."""
    out = tmp_path_factory.mktemp("eval_random_draft") / "checkpoints"
    run_script(
        "train_draft.py", "--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--hidden-states", hidden_states,
        "--output", out, "--epochs", "1", "--max-steps", "1", "--lr", "0", "--total-seq-len", "256",
        "--events", out.parent / "events.jsonl",
    )
    return out


def test_identity_draft_on_the_real_verifier(tiny_verifier):
    from transformers import AutoTokenizer

    from common.verifier import load_verifier

    model = load_verifier(str(tiny_verifier.verifier), device="cpu", dtype=torch.float32)
    verifier = ev.HFVerifier(model, [2, 4, 5], torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_verifier.verifier))
    prompts = load_prompts(tokenizer, tiny_verifier.data, "heldout", 4)
    eos = {tokenizer.eos_token_id}
    results = [ev.speculate(verifier, GreedyOracleProposer(verifier), p, 3, 40, eos) for p in prompts]
    report = ev.summarize(results, 3)
    assert report.acceptance_per_position == [1.0, 1.0, 1.0]
    # Every round yields k+1 = 4 tokens but the last of each reply: rounds and tau exactly.
    lengths = [len(r.generated) - 1 for r in results]  # tokens after the prefill one
    assert report.rounds == sum(math.ceil(n / 4) for n in lengths)
    assert report.tau == pytest.approx(sum(lengths) / report.rounds)
    for p, r in zip(prompts, results):
        assert r.generated == verifier.greedy(p, 40, eos)


def test_evaluate_stage_end_to_end(tiny_verifier, briefly_trained_draft, tmp_path):
    out = tmp_path / "eval"
    events_path = tmp_path / "events.jsonl"
    run_script(
        "evaluate.py", "--verifier", tiny_verifier.verifier, "--draft", briefly_trained_draft, "--data", tiny_verifier.data,
        "--output", out, "--speculative-tokens", "3", "--max-prompts", "8", "--events", events_path,
    )
    report = json.loads((out / "report.json").read_text())
    # tau from the report's own counts: the tokens after each prompt's prefill token per round
    assert report["tau"] == pytest.approx((report["generated_tokens"] - report["prompts"]) / report["rounds"], abs=1e-4)
    assert len(report["acceptance_per_position"]) == 3
    assert report["acceptance_per_position"] == sorted(report["acceptance_per_position"], reverse=True)
    assert report["greedy_match"] == 1.0  # speculation never changes the verifier's output
    assert report["prompts"] == 8
    assert report["extra"]["method"] == "fast" and report["extra"]["batch_size"] == 8
    assert report["looping_prompts"] == len(report["extra"]["looping"])
    for png in ("acceptance.png", "training.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finished = read_events(events_path)[-1]
    assert finished["status"] == "ok" and finished["tau"] == pytest.approx(report["tau"], abs=1e-3)
    # The checkpoint train's best.json names, with both figures.
    best = json.loads((briefly_trained_draft / "best.json").read_text())
    chosen = report["extra"]["checkpoint"]
    assert report["extra"]["draft"] == str((briefly_trained_draft / best["checkpoint"]).resolve())
    assert chosen == {"name": best["checkpoint"], "chosen_by": "best.json", "step": best["step"], "training_tau": best["tau"], "tau": round(report["tau"], 4)}
    assert {"step": best["step"], "tau": best["tau"]} in report["extra"]["training_tau"]


def test_evaluate_without_heldout_rows_fails_with_one_line(tiny_verifier, briefly_trained_draft, tmp_path):
    proc = run_script(
        "evaluate.py", "--verifier", tiny_verifier.verifier, "--draft", briefly_trained_draft, "--data", tiny_verifier.data,
        "--output", tmp_path / "eval", "--split", "nosuch", "--events", tmp_path / "e.jsonl", check=False,
    )
    assert proc.returncode != 0
    finished = read_events(tmp_path / "e.jsonl")[-1]
    assert finished["status"] == "failed" and "no rows with split='nosuch'" in finished["error"]
    assert not (tmp_path / "eval" / "report.json").exists()


def _fake_checkpoint(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")


def test_the_draft_is_the_checkpoint_best_json_names_else_the_latest(tmp_path):
    from common.checkpoints import resolve_draft, write_best

    for epoch in ("0", "1", "2"):
        _fake_checkpoint(tmp_path / epoch)
    (tmp_path / "checkpoint_best").symlink_to("0")  # speculators' own alias (by val loss) is not ours
    assert resolve_draft(tmp_path) == (tmp_path / "2", None)  # no best.json: the latest
    write_best(tmp_path, "1", 200, 3.41)
    assert resolve_draft(tmp_path) == (tmp_path / "1", {"checkpoint": "1", "step": 200, "tau": 3.41})
    assert resolve_draft(tmp_path / "0") == (tmp_path / "0", None)  # a checkpoint given directly
    for bad in ('{"checkpoint": "7", "step": 1, "tau": 2.0}', '{"checkpoint": "../x", "step": 1, "tau": 2.0}', "not json"):
        (tmp_path / "best.json").write_text(bad)  # names nothing usable: the latest, not an error
        assert resolve_draft(tmp_path) == (tmp_path / "2", None)


def test_a_moved_checkpoint_loads_the_verifier_it_is_given(tiny_verifier, briefly_trained_draft, tmp_path):
    """A checkpoint pulled to the laptop or carried to another box records the verifier path of its
    training; speculators reads the verifier's lm_head and final norm from that path. evaluate
    takes them from --verifier: a recorded path that is gone does not fail it, and one that holds
    another model is not read."""
    import shutil

    from safetensors.torch import load_file, save_file

    from common.checkpoints import resolve_draft

    given = shutil.copytree(tiny_verifier.verifier, tmp_path / "verifier-here")
    [weights_file] = given.glob("*.safetensors")
    weights = load_file(str(weights_file))
    norm = next(name for name in weights if name.endswith("norm.weight") and "layers" not in name)
    ckpt = shutil.copytree(resolve_draft(briefly_trained_draft)[0], tmp_path / "moved")
    config = json.loads((ckpt / "config.json").read_text())
    for recorded in (tmp_path / "where-it-was-trained", tmp_path / "another-model"):
        if recorded.name == "another-model":  # there, and different: its final norm doubled
            shutil.copytree(given, recorded)
            save_file({**weights, norm: weights[norm] * 2}, str(recorded / weights_file.name))
        config["speculators_config"]["verifier"]["name_or_path"] = str(recorded)
        (ckpt / "config.json").write_text(json.dumps(config))
        draft = ev.load_draft(ckpt, str(given), "sdpa")
        assert torch.equal(draft.verifier_norm.weight, weights[norm].to(draft.verifier_norm.weight.dtype)), recorded.name


def test_evaluate_without_a_checkpoint_fails_with_one_line(tiny_verifier, tmp_path):
    proc = run_script(
        "evaluate.py", "--verifier", tiny_verifier.verifier, "--draft", tmp_path, "--data", tiny_verifier.data,
        "--output", tmp_path / "eval", "--events", tmp_path / "e.jsonl", check=False,
    )
    assert proc.returncode != 0
    assert "no checkpoint" in read_events(tmp_path / "e.jsonl")[-1]["error"]


def test_a_trained_draft_beats_a_random_one_on_the_same_prompts(tiny_verifier, briefly_trained_draft, random_draft, tmp_path):
    """tau measures the draft: 20 training steps must already be accepted more often than the
    same architecture with its initial weights (`1 <= tau <= k+1` alone holds for any draft)."""
    reports = {}
    for name, draft in (("trained", briefly_trained_draft), ("random", random_draft)):
        out = tmp_path / name
        run_script(
            "evaluate.py", "--verifier", tiny_verifier.verifier, "--draft", draft, "--data", tiny_verifier.data,
            "--output", out, "--speculative-tokens", "3", "--max-prompts", "8", "--events", tmp_path / f"{name}.jsonl",
        )
        reports[name] = json.loads((out / "report.json").read_text())
    trained, random_ = reports["trained"], reports["random"]
    print(f"tau: trained {trained['tau']:.3f}, random {random_['tau']:.3f}")
    assert trained["prompts"] == random_["prompts"] == 8
    assert trained["tau"] > random_["tau"] + 0.05, (trained["tau"], random_["tau"])  # measured here: 1.146 against 1.000
    assert trained["acceptance_per_position"][0] > random_["acceptance_per_position"][0]


@pytest.mark.parametrize("batch_size,packed", [(1, None), (4, None), (4, True)])
def test_the_fast_measurement_equals_the_chain_on_the_real_models(tiny_verifier, briefly_trained_draft, batch_size, packed):
    """--method fast (batched cached decoding, one verifier and one draft forward per prompt, or
    per pack of prompts as on a GPU: `packed`) against the reference round-by-round chain: the
    same rounds, acceptances and outputs, prompt by prompt, with the briefly trained draft (it
    accepts some proposals and rejects others)."""
    from transformers import AutoTokenizer

    from common.checkpoints import resolve_draft
    from common.verifier import load_verifier, locate_decoder

    model = load_verifier(str(tiny_verifier.verifier), device="cpu")
    draft = ev.load_draft(resolve_draft(briefly_trained_draft)[0], str(tiny_verifier.verifier), "sdpa")
    verifier = ev.HFVerifier(model, ev.draft_layers(draft, locate_decoder(model).num_layers), torch.bfloat16)
    proposer = ev.Eagle3Proposer(draft)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_verifier.verifier))
    prompts = load_prompts(tokenizer, tiny_verifier.data, "heldout", 8)
    eos = ev._eos_ids(tokenizer, model)
    k, max_new = 3, 48
    runs = []
    if packed:  # every pack's draft run is one call: count them
        original = proposer.run
        proposer.run = lambda *a, **kw: runs.append(kw.get("documents")) or original(*a, **kw)
    fast = ev.measure_fast(verifier, proposer, prompts, k, max_new, eos, batch_size, packed=packed)
    if packed:
        proposer.run = original
        assert [len(d) for d in runs] == [4, 4]  # a pack per batch of 4 prompts (short ones: one pack holds them)
    chain = [ev.speculate(verifier, proposer, p, k, max_new, eos) for p in prompts]
    for i, (f, c) in enumerate(zip(fast, chain)):
        assert (f.generated, f.rounds, f.accepted, f.trials) == (c.generated, c.rounds, c.accepted, c.trials), f"prompt {i}"
        assert f.greedy_match is True
    assert sum(sum(c.accepted) for c in chain) > 0 and any(a < k for c in chain for a in c.accepted)  # both verdicts occur
    assert ev.summarize(fast, k).tau == ev.summarize(chain, k).tau
