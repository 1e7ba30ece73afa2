"""The speculators shims: they fit the installed speculators, they do what they say on CPU, and
they fail loudly, naming themselves, when the code they patch changes."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))

from tests.fixtures.requires import platform_skip, require_module  # noqa: E402
torch = require_module("torch")
require_module("speculators")

from common import speculators_compat as compat  # noqa: E402


def check_every_shim() -> None:
    """Each shim's check against the installed code (raises ShimOutdated for the first that no longer fits)."""
    for check in compat.CHECKS.values():
        check()


def test_every_shim_fits_the_installed_speculators():
    check_every_shim()


def test_checks_still_pass_after_the_shims_are_applied():
    # Checks read the originals behind our patches, so applying twice is fine.
    compat.apply_cpu_shims()
    check_every_shim()
    assert compat.apply_cpu_shims() == ([] if torch.accelerator.is_available() else ["trainer-device", "step-timer-sync", "resume-device"])


def test_cpu_shims_make_the_trainer_pieces_work_without_an_accelerator():
    if torch.accelerator.is_available():
        platform_skip("the CPU shims apply only without an accelerator (with one, test_checks_still_pass_after_the_shims_are_applied asserts none applies)")
    compat.apply_cpu_shims()
    from speculators.train import checkpointer, trainer

    timer = trainer._StepTimer(enabled=True)
    timer.mark("start")  # the original synchronizes an accelerator and raises here
    assert timer.now() is not None
    assert checkpointer.get_current_device() == "cpu"


def _changed(monkeypatch, owner, name: str):
    """Replace owner.name by a function whose source no longer has what the shim relies on."""

    def rewritten(self, *args, **kwargs):  # speculators "changed" beneath us
        return None

    monkeypatch.setattr(owner, name, rewritten)


@pytest.mark.parametrize(
    ("shim", "where"),
    [
        ("trainer-device", ("speculators.train.trainer", "Trainer", "setup_model")),
        ("step-timer-sync", ("speculators.train.trainer", "_StepTimer", "mark")),
        ("metrics-bridge", ("speculators.train.trainer", "Trainer", "val_epoch")),
        ("resume-device", ("speculators.train.checkpointer", "SingleGPUCheckpointer", "load_model_state_dict")),
        ("tau-probe", ("speculators.train.trainer", "Trainer", "run_training")),
        ("early-stop", ("speculators.train.trainer", "Trainer", "run_training")),
        ("early-stop", ("speculators.train.trainer", "Trainer", "train_epoch")),  # the max-steps stop
        ("every-position", ("speculators.train.data", "ArrowDataset", "_get_raw_data")),
        ("round-walk", ("speculators.models.eagle3.core", "Eagle3DraftModel", "forward")),
        ("online-measure", ("speculators.train.data", "ArrowDataset", "_generate_hidden_states_once")),
        ("endpoint", ("speculators.train.data", "ArrowDataset", "_setup_client")),
    ],
)
def test_a_changed_speculators_fails_loudly_naming_the_shim(monkeypatch, shim, where):
    import importlib

    module, cls, method = where
    owner = getattr(importlib.import_module(module), cls)
    owner = getattr(owner, "_speculators_compat_original", owner)
    _changed(monkeypatch, owner, method)
    with pytest.raises(compat.ShimOutdated, match=f"shim '{shim}'") as info:
        compat.CHECKS[shim]()
    assert info.value.shim == shim
    assert "speculators_compat.py" in str(info.value)


def test_a_changed_main_fails_the_trainer_hook(monkeypatch):
    from speculators.train import cli

    def main(cfg):  # a main that builds its trainer some other way
        return cfg

    monkeypatch.setattr(cli, "main", main)
    with pytest.raises(compat.ShimOutdated, match="shim 'trainer-hook'"):
        compat.hook_main(lambda *a: None)


def test_flex_kernel_options_reach_torch_flex_attention(monkeypatch):
    from speculators.models import attention

    seen = {}

    def fake_flex(*args, **kwargs):
        seen.update(kwargs)
        return args[0]

    monkeypatch.setattr(attention, "flex_attention", fake_flex)
    compat.set_flex_kernel_options({"BLOCK_M": 32, "BLOCK_N": 32})
    q = torch.zeros(1, 2, 4, 8)
    attention.flex_attention_forward(None, q, q, q, attention_mask=None)
    assert seen["kernel_options"] == {"BLOCK_M": 32, "BLOCK_N": 32}
    compat.set_flex_kernel_options(None)  # back to torch's defaults
    seen.clear()
    attention.flex_attention_forward(None, q, q, q, attention_mask=None)
    assert "kernel_options" not in seen


def test_metrics_bridge_routes_train_and_val_records():
    train, val = [], []
    bridge = compat.MetricsBridge(lambda step, rec: train.append((step, rec)), lambda epoch, step, rec: val.append((epoch, step, rec))).attach()
    try:
        log = logging.getLogger("speculators.metrics")
        log.info({"train": {"loss": 1.0}, "profile": None, "epoch": 0, "lr": 0.1, "global_step": 7}, extra={"step": 7})
        log.info({"val": {"loss_epoch": 0.5}, "epoch": 2}, extra={"step": 9})
        log.info("a plain message is ignored")
    finally:
        bridge.detach()
    assert [s for s, _ in train] == [7] and train[0][1]["train"]["loss"] == 1.0
    assert val == [(2, 9, {"val": {"loss_epoch": 0.5}, "epoch": 2})]


# --- mask-token: train hands speculators an id, so it never loads the verifier's processor ------


def test_mask_token_check_fails_loudly_when_speculators_changes(monkeypatch):
    from speculators.train import utils

    def resolve_mask_token_id(verifier_name_or_path, vocab_size, mask_token_id=None, **kw):  # now ignores an explicit id
        return 0

    monkeypatch.setattr(utils, "resolve_mask_token_id", resolve_mask_token_id)
    with pytest.raises(compat.ShimOutdated, match="shim 'mask-token'"):
        compat.mask_token_id("unused", 10)


def _demo_tokenizer_dir(path: Path, extra_vocab: int, with_tokenizer: bool = True) -> Path:
    """A verifier directory with the demo's tokenizer and a config of `len(tokenizer) + extra_vocab` rows (no weights)."""
    import make_tiny_verifier as tiny
    from transformers import LlamaConfig

    tokenizer = tiny.build_tokenizer(["bago", "dami", "kelo"])
    LlamaConfig(vocab_size=len(tokenizer) + extra_vocab, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id).save_pretrained(path)
    if with_tokenizer:
        tokenizer.save_pretrained(path)
    return path


def test_mask_token_follows_speculators_order_without_the_processor(tmp_path):
    from speculators.train.utils import resolve_mask_token_id

    # No processor can load from these directories (no preprocessor config): speculators' own
    # resolution would fail where ours, through the tokenizer, gives the id it would have given.
    for extra, expected in ((0, "pad_token_id"), (4, "<|MASK|>")):
        verifier = _demo_tokenizer_dir(tmp_path / f"v{extra}", extra)
        vocab = 10 + extra  # 7 special tokens + 3 words
        token_id, source = compat.mask_token_id(str(verifier), vocab)
        assert expected in source
        assert token_id == resolve_mask_token_id(str(verifier), vocab)  # the demo tokenizer loads as a processor too
    assert compat.mask_token_id(str(tmp_path / "v4"), 14)[0] == 10  # the first unused row


def test_mask_token_without_a_tokenizer_is_harmless_and_said(tmp_path):
    verifier = _demo_tokenizer_dir(tmp_path / "v", 0, with_tokenizer=False)
    token_id, source = compat.mask_token_id(str(verifier), 10)
    assert token_id == 0 and "pad_token_id" in source and "no loadable tokenizer" in source
    cfg = json.loads((verifier / "config.json").read_text())
    cfg.update(pad_token_id=None, eos_token_id=None)  # (absent, LlamaConfig would default eos to 2)
    (verifier / "config.json").write_text(json.dumps(cfg))
    token_id, source = compat.mask_token_id(str(verifier), 10)
    assert token_id == compat.HARMLESS_MASK_TOKEN_ID and "EAGLE-3 never reads it" in source


def test_every_position_widens_the_training_rows_mask_only(prepared_data, hidden_states):
    """train's default --loss-on all: the training split's rows count at every position; their
    hidden states and the validation split's replies-only mask are unchanged."""
    from speculators.train.data import ArrowDataset, FileTransfer

    def split(name):
        return ArrowDataset(max_len=512, datapath=str(prepared_data), transfer=FileTransfer(hidden_states), on_missing="raise", train_ratio=0.75, split=name)

    train, val = split("train"), split("val")
    before = [train[i] for i in range(len(train))]
    val_before = [val[i]["loss_mask"].sum().item() for i in range(len(val))]
    compat.supervise_every_position(train)
    after = [train[i] for i in range(len(train))]
    assert all(0 < b["loss_mask"].sum() < len(b["loss_mask"]) for b in before)  # replies only: some, not all
    assert all(a["loss_mask"].dtype == b["loss_mask"].dtype and a["loss_mask"].tolist() == [1] * len(b["loss_mask"]) for a, b in zip(after, before))
    assert all(torch.equal(a["hidden_states"], b["hidden_states"]) and torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(after, before))
    assert [val[i]["loss_mask"].sum().item() for i in range(len(val))] == val_before
    # DataLoader workers started by spawn get a pickled copy: it must keep every position
    import pickle

    copy = pickle.loads(pickle.dumps(train))
    assert all(copy[i]["loss_mask"].tolist() == a["loss_mask"].tolist() for i, a in enumerate(after))


def test_round_walk_counts_the_rounds_speculators_own_correctness_flags_imply():
    """The shim walks rounds over the flags speculators' compute_metrics leaves in prev_correct:
    fed draft logits whose argmax is right at chosen (position, step) pairs, the walked tokens and
    rounds equal a walk over the accepted chain lengths computed here by hand."""
    compat.walk_rounds_in_validation()
    compat.walk_rounds_in_validation()  # idempotent: wraps speculators' function once
    from speculators.losses import eager
    from speculators.models.eagle3 import core

    from common.acceptance import walk_rounds

    vocab, length, steps = 5, 10, 3
    right = {0: {0, 1, 2, 4, 5, 6, 7}, 1: {0, 1, 4, 5, 6}, 2: {0, 4, 5}}  # step -> draft starts it gets right
    loss_mask = torch.tensor([[False] + [True] * 8 + [False]])
    targets = torch.nn.functional.one_hot(torch.arange(length) % vocab, vocab).float()[None]
    prev_correct = loss_mask.clone()
    metrics = {}
    with torch.no_grad():
        for step in range(steps):
            # logits[p] is step `step`'s proposal from start p, scored against targets[p + step]
            logits = torch.zeros(1, length, vocab)
            for p in range(length - step):
                want = (p + step) % vocab
                logits[0, p, want if p in right[step] else (want + 1) % vocab] = 1.0
            _, m = core.compute_metrics(logits, targets, loss_mask, prev_correct, step, 1.0, loss_config={"kl_div": (eager.kl_div_loss, 1.0)})
            metrics.update(m)
    accepted = [0] * length
    for p in range(length):
        while accepted[p] < steps and p in right[accepted[p]] and loss_mask[0, p]:
            accepted[p] += 1
    tokens, rounds = walk_rounds(accepted, loss_mask[0].tolist())
    assert (metrics["round_tau_sum"].item(), metrics["round_tau_total"].item()) == (tokens, rounds)
    assert (tokens, rounds) == (8, 3)  # by hand: rounds start at 1 (a = 2), 4 (a = 3), 8 (a = 0)
