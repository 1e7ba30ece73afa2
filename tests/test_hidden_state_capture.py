"""The draft trains on what extract stores and is measured on what evaluate feeds it: both come
from common/hidden_state_capture.py, and here the two are the same tensors, row by row."""

from __future__ import annotations

import json
import sys

import pytest

from tests.fixtures.pipeline_data import SCRIPTS_DIR

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(SCRIPTS_DIR))


def test_evaluate_feeds_the_draft_what_extract_stored_for_training(tiny_verifier, prepared_data, hidden_states):
    import torch
    from datasets import load_from_disk
    from safetensors.torch import load_file

    import evaluate
    from common.hidden_state_files import hs_path
    from common.verifier import load_verifier

    layers = json.loads((hidden_states / "extract_meta.json").read_text())["target_layer_ids"]
    verifier = evaluate.HFVerifier(load_verifier(str(tiny_verifier.verifier), device="cpu"), layers, torch.bfloat16)
    rows = load_from_disk(str(prepared_data))
    checked = 0
    for i in range(min(6, len(rows))):
        tokens = list(rows[i]["input_ids"])
        stored = load_file(str(hs_path(hidden_states, i)))["hidden_states"]  # [T, k+1, H], extract batched 8 rows
        _, view = verifier.forward(tokens)  # [1, T, k*H], evaluate: one row alone
        assert view.dtype == stored.dtype == torch.bfloat16
        expected = stored[:, : len(layers), :].reshape(len(tokens), -1)
        # Equal up to one bf16 step: extract's batch is padded, evaluate's row is alone, and
        # fp32 sums in another order may round to a neighbouring bf16 value.
        torch.testing.assert_close(view[0].float(), expected.float(), rtol=2 ** -7, atol=1e-3)
        checked += 1
    assert checked >= 2


def test_the_hooks_keep_nothing_outside_a_capture(tiny_verifier):
    import torch

    from common.hidden_state_capture import HiddenStateCapture
    from common.verifier import load_verifier, locate_decoder

    model = load_verifier(str(tiny_verifier.verifier), device="cpu")
    parts = locate_decoder(model)
    capture = HiddenStateCapture(parts, [0, parts.num_layers])
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        stacked = capture.run(ids, torch.ones_like(ids))
        model(input_ids=ids[:, :2])  # outside a capture (generate's steps): nothing kept
    assert torch.equal(capture.stacked(), stacked)
    assert stacked.shape == (1, 4, 3, parts.embed_tokens.weight.shape[1])
    assert torch.equal(stacked[:, :, 1], stacked[:, :, 2])  # id N is the last layer's pre-norm output
    capture.close()
    assert not parts.layers[0]._forward_pre_hooks and not parts.layers[-1]._forward_hooks


def test_batched_forwards_equal_one_at_a_time(tiny_verifier, prepared_data):
    """HFVerifier.forward_many's GPU path (forced here on the CPU): right-padded rows of different
    lengths give each row the greedy tokens and draft views of its own forward."""
    import torch
    from datasets import load_from_disk

    import evaluate
    from common.verifier import load_verifier

    verifier = evaluate.HFVerifier(load_verifier(str(tiny_verifier.verifier), device="cpu"), [0, 1, 2], torch.bfloat16)
    rows = load_from_disk(str(prepared_data))
    sequences = [list(rows[i]["input_ids"]) for i in range(min(5, len(rows)))]
    assert len({len(s) for s in sequences}) > 1  # padding is exercised
    for (greedy, view), seq in zip(verifier.forward_many(sequences, batched=True), sequences):
        alone_greedy, alone_view = verifier.forward(seq)
        assert greedy == alone_greedy and view.shape == alone_view.shape == (1, len(seq), alone_view.shape[-1])
        torch.testing.assert_close(view.float(), alone_view.float(), rtol=2 ** -7, atol=1e-3)


def test_a_forward_keeping_the_reply_logits_gives_the_same_choices_and_view(tiny_verifier, prepared_data):
    """evaluate's forwards keep the logits from the prompt's last position on (`keep_from`): those
    choices equal the full forward's, bit for bit (tau depends on them), earlier ones are None,
    and the draft's view is the whole sequence's; alone and batched (the GPU path, forced)."""
    import torch
    from datasets import load_from_disk

    import evaluate
    from common.verifier import load_verifier

    verifier = evaluate.HFVerifier(load_verifier(str(tiny_verifier.verifier), device="cpu"), [0, 1, 2], torch.bfloat16)
    rows = load_from_disk(str(prepared_data))
    sequences = [list(rows[i]["input_ids"]) for i in range(min(5, len(rows)))]
    keep_from = [len(s) // 2 + i for i, s in enumerate(sequences)]
    full = [verifier.forward(seq) for seq in sequences]
    for batched in (False, True):
        kept = verifier.forward_many(sequences, batched=batched, keep_from=keep_from)
        for (greedy, view), (all_greedy, all_view), start, seq in zip(kept, full, keep_from, sequences):
            first = min(keep_from) if batched else start  # a batch keeps from its earliest
            assert greedy[first:] == all_greedy[first:] and greedy[:first] == [None] * first
            assert view.shape == (1, len(seq), all_view.shape[-1])
            if not batched:
                assert torch.equal(view, all_view)
