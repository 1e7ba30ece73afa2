"""train_draft.py: the attention guard, the tile sizes, the other pure decisions, and real training
steps with speculators' trainer on CPU (with a resume from the checkpoint it wrote)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))

from tests.fixtures.requires import platform_skip, require_module  # noqa: E402
torch = require_module("torch")
require_module("speculators")

import train_draft  # noqa: E402
from common import draft_attention as da  # noqa: E402

from tests.fixtures.pipeline_data import read_events, run_script, tiny_eagle3_draft  # noqa: E402

# ---------------------------------------------------------------------------------------------
# The attention guard


def _block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q, kv: q >= kv, B=None, H=None, Q_LEN=128, KV_LEN=128, device="cpu")


def _dense_mask():
    return torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()


def test_sdpa_is_refused_a_block_mask():
    with pytest.raises(da.AttentionMismatch, match="'sdpa' cannot consume a block mask"):
        da.check_mask_compatible("sdpa", _block_mask())
    with pytest.raises(da.AttentionMismatch, match="'eager' cannot consume a block mask"):
        da.check_mask_compatible("eager", _block_mask())


@pytest.mark.parametrize("impl", sorted(da.FLEX_FAMILY))
def test_the_flex_family_takes_a_block_mask_and_refuses_dense(impl):
    da.check_mask_compatible(impl, _block_mask(), device_type="cuda")
    with pytest.raises(da.AttentionMismatch, match="needs a flex BlockMask"):
        da.check_mask_compatible(impl, _dense_mask(), device_type="cuda")


def test_dense_implementations_take_dense_masks():
    da.check_mask_compatible("sdpa", _dense_mask(), device_type="cpu")
    da.check_mask_compatible("eager", torch.zeros(1, 1, 8, 8), device_type="cpu")


def test_unset_or_unknown_implementation_is_refused():
    with pytest.raises(da.AttentionMismatch, match="not set"):
        da.check_mask_compatible(None, _block_mask())
    with pytest.raises(da.AttentionMismatch, match="unknown attention implementation"):
        da.check_mask_compatible("flash_attention_2", _dense_mask())


def test_flex_cannot_train_on_cpu():
    with pytest.raises(da.AttentionMismatch, match="cannot train on CPU"):
        da.check_mask_compatible("simple_flex_attention", _block_mask(), device_type="cpu")


def _tiny_draft(attn_impl):
    return tiny_eagle3_draft(attn_impl)


def test_guard_on_built_drafts():
    assert da.check_draft_attention(_tiny_draft("sdpa"), "cpu") == "sdpa"
    assert da.check_draft_attention(_tiny_draft("eager"), "cpu") == "eager"
    # A hand-made LlamaConfig has _attn_implementation=None: speculators silently picks flex.
    with pytest.raises(da.AttentionMismatch, match="cannot train on CPU"):
        da.check_draft_attention(_tiny_draft(None), "cpu")
    # The model builds a BlockMask (flex) while its layers would run sdpa: refused before a step.
    draft = _tiny_draft("simple_flex_attention")
    for layer in draft.layers:
        layer.self_attn.config._attn_implementation = "sdpa"
    with pytest.raises(da.AttentionMismatch, match="'sdpa' cannot consume a block mask"):
        da.check_draft_attention(draft, "cuda")


# ---------------------------------------------------------------------------------------------
# Tile sizes for flex_attention


def _estimated_shared_memory(opts, head_dim, dtype_size=2):
    """A rough upper estimate of Triton's shared memory for flex fwd/bwd with these tiles."""
    fwd = dtype_size * head_dim * (opts["BLOCK_M"] + 2 * opts["BLOCK_N"]) * max(1, opts["num_stages"])
    bwd1 = dtype_size * head_dim * (opts["BLOCK_N1"] * 2 + opts["BLOCK_M1"] * 3) * max(1, opts["num_stages"])
    bwd2 = dtype_size * head_dim * (opts["BLOCK_M2"] * 2 + opts["BLOCK_N2"] * 3) * max(1, opts["num_stages"])
    return max(fwd, bwd1, bwd2)


@pytest.mark.parametrize("smem", [232448, 167936, 160 * 1024])  # H100/H200 and A100 opt-in limits
def test_data_centre_gpus_keep_torch_defaults(smem):
    assert da.flex_kernel_options(smem) is None


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_small_shared_memory_gets_small_tiles(head_dim):
    limit = 101376  # sm_120 (workstation Blackwell): 'Required 106496, limit 101376'
    opts = da.flex_kernel_options(limit, head_dim)
    assert opts is not None and opts["num_stages"] == 1
    assert max(opts["BLOCK_M"], opts["BLOCK_N"]) <= 64
    assert opts["BLOCK_N1"] % opts["BLOCK_M1"] == 0 and opts["BLOCK_M2"] % opts["BLOCK_N2"] == 0
    assert 128 % opts["BLOCK_N"] == 0  # the BlockMask's 128-token blocks split evenly into kernel tiles
    assert _estimated_shared_memory(opts, head_dim) < limit


def test_larger_heads_get_smaller_tiles():
    small, big = da.flex_kernel_options(101376, 128), da.flex_kernel_options(101376, 256)
    assert big["BLOCK_M"] < small["BLOCK_M"]


def test_shared_memory_must_be_positive():
    with pytest.raises(ValueError):
        da.flex_kernel_options(0)


# ---------------------------------------------------------------------------------------------
# Other pure decisions


@pytest.mark.parametrize(
    ("device", "version", "expected"),
    [("cpu", "2.13.0+cpu", "eager"), ("cuda", "2.11.0+cu128", "eager"), ("cuda", "2.13.0", "fused"), ("cuda", "2.10.1", "fused")],
)
def test_loss_implementation(device, version, expected):
    assert train_draft.choose_loss_implementation(device, version) == expected


@pytest.mark.parametrize(
    ("device", "cpu_bf16", "expected"),
    [("cuda", False, "bfloat16"), ("cpu", True, "bfloat16"), ("cpu", False, "float32")],
)
def test_compute_dtype(device, cpu_bf16, expected):
    """bf16 autocast only where the hardware computes bf16; an AVX2-only CPU trains in fp32."""
    assert train_draft.choose_compute_dtype(device, cpu_bf16) == expected


def test_default_attention_and_workers():
    assert da.default_attn_impl("cpu") == "sdpa"
    assert da.default_attn_impl("cuda") == "simple_flex_attention"
    assert train_draft.default_num_workers("cpu", 2, 1) == 0
    assert train_draft.default_num_workers("cuda", 64, 8) == 7
    assert train_draft.default_nproc(0) == 1 and train_draft.default_nproc(8) == 8


def test_hidden_state_layout_check():
    train_draft.check_hidden_state_layout((10, 4, 64), "BF16", 3, 64)
    with pytest.raises(train_draft.TrainError, match=r"expected \[T, 4, 64\]"):
        train_draft.check_hidden_state_layout((10, 3, 64), "BF16", 3, 64)
    with pytest.raises(train_draft.TrainError, match="expected bfloat16"):
        train_draft.check_hidden_state_layout((10, 4, 64), "F32", 3, 64)


# ---------------------------------------------------------------------------------------------
# Real training on CPU


def _train(verifier, prepared, hidden_states, output, events, *extra, check=True):
    return run_script(
        "train_draft.py",
        "--verifier", verifier, "--prepared", prepared, "--hidden-states", hidden_states, "--output", output,
        "--total-seq-len", "256", "--threads", "1", "--events", events, *extra,
        check=check,
    )


@pytest.mark.slow
def test_trains_on_cpu_and_resumes_from_its_checkpoint(tiny_verifier, prepared_data, hidden_states, tmp_path):
    out = tmp_path / "checkpoints"
    first = tmp_path / "first.jsonl"
    _train(tiny_verifier.verifier, prepared_data, hidden_states, out, first, "--epochs", "1", "--max-steps", "3", "--tau-every", "2")
    events = read_events(first)
    assert events[-1]["event"] == "finished" and events[-1]["status"] == "ok", events[-1]
    steps = [e for e in events if e["event"] == "metric" and "loss" in e["metrics"]]
    assert [e["step"] for e in steps] == [1, 2, 3]
    # tau: mid-epoch after step 2 (a few validation batches), then after the epoch's validation;
    # best.json names the epoch's checkpoint (the mid-epoch estimate has none).
    taus = [(e["step"], e["metrics"]["tau"]) for e in events if e["event"] == "metric" and "tau" in e["metrics"]]
    assert [s for s, _ in taus] == [2, 3], taus
    # The reported tau walks rounds (common/acceptance.py); the per-position figure rides beside it:
    # 1 + the sum of the TTT steps' full accuracies, both as the epoch's validation recorded them.
    val = [e["metrics"] for e in events if e["event"] == "metric" and "val_round_tau" in e["metrics"]]
    assert val and val[-1]["val_round_tau"] == pytest.approx(taus[-1][1], abs=1e-4), val
    full_acc = [v for k, v in val[-1].items() if k.startswith("val_full_acc_")]
    epoch_tau = [e["metrics"] for e in events if e["event"] == "metric" and "tau" in e["metrics"] and "epoch" in e["metrics"]]
    assert len(full_acc) == 3 and epoch_tau[-1]["tau_per_position"] == pytest.approx(1 + sum(full_acc), abs=1e-4), (val, epoch_tau)
    assert json.loads((out / "best.json").read_text()) == {"checkpoint": "0", "step": 3, "tau": taus[-1][1]}
    m = steps[-1]["metrics"]
    assert {"loss_0", "full_acc_0", "loss_2", "full_acc_2", "tokens_per_s"} <= set(m), m  # per TTT step
    assert all(0.0 <= m[f"full_acc_{t}"] <= 1.0 for t in range(3))
    assert any(e["event"] == "artifact" and e["kind"] == "checkpoint" for e in events)
    config = json.loads((out / "0" / "config.json").read_text())
    recorded = config["speculators_config"]["verifier"]["name_or_path"]
    assert recorded == str(Path(tiny_verifier.verifier).resolve()) and Path(recorded).is_absolute()
    assert config["transformer_layer_config"]["vocab_size"] > 0

    second = tmp_path / "second.jsonl"
    _train(tiny_verifier.verifier, prepared_data, hidden_states, out, second, "--epochs", "2", "--max-steps", "5")
    events = read_events(second)
    assert events[-1]["status"] == "ok", events[-1]
    assert any(e["event"] == "message" and "resuming after epoch 0" in e["text"] for e in events)
    steps = [e["step"] for e in events if e["event"] == "metric" and "loss" in e["metrics"]]
    assert steps == [4, 5]  # the global step continues where the first run stopped
    assert (out / "1" / "model.safetensors").is_file()
    # The resumed run kept the first run's best and compared its own epoch with it: the later
    # checkpoint takes its place unless its estimate is more than BEST_TAU_TOLERANCE lower.
    (step2, tau2), = [(e["step"], e["metrics"]["tau"]) for e in events if e["event"] == "metric" and "tau" in e["metrics"]]
    best = json.loads((out / "best.json").read_text())
    later_wins = tau2 >= taus[-1][1] * (1 - train_draft.BEST_TAU_TOLERANCE)
    assert best == ({"checkpoint": "1", "step": step2, "tau": tau2} if later_wins else {"checkpoint": "0", "step": 3, "tau": taus[-1][1]})


@pytest.mark.slow
def test_a_run_whose_estimate_stands_still_stops_early(tiny_verifier, prepared_data, hidden_states, tmp_path):
    # lr 0 keeps the draft's initial weights: every epoch's estimate is the first one's, so the
    # early stop must end the run after epoch `patience` (1 here), whatever the CPU's numerics.
    # 1,024 tokens a step: short epochs of the fixture's rows.
    out, events_path = tmp_path / "checkpoints", tmp_path / "events.jsonl"
    _train(tiny_verifier.verifier, prepared_data, hidden_states, out, events_path, "--epochs", "4", "--lr", "0", "--early-stop-patience", "1",
           "--total-seq-len", "1024")
    events = read_events(events_path)
    finished = events[-1]
    assert finished["status"] == "ok" and finished["stopped_early"] is True and finished["epochs_done"] == 2, finished
    taus = [e["metrics"]["tau"] for e in events if e["event"] == "metric" and "tau" in e["metrics"]]
    assert len(taus) == 2 and taus[1] == taus[0], taus
    stop = [e["text"] for e in events if e["event"] == "message" and e["text"].startswith("early stop:")]
    assert len(stop) == 1 and f"has stood flat at {taus[0]:.4f} (epoch 0) for 1 validations: stopped after epoch 1" in stop[0], stop
    assert sorted(p.name for p in out.iterdir() if p.name.isdigit()) == ["0", "1"]  # no checkpoint past the stop
    assert json.loads((out / "best.json").read_text())["checkpoint"] == "1"  # the latest within the estimate's noise, as without the stop
    assert not any(e["event"] == "warning" and "still learning" in e["text"] for e in events)


@pytest.mark.slow
def test_max_steps_ends_the_run_in_the_epoch_that_takes_them(tiny_verifier, prepared_data, hidden_states, tmp_path):
    # speculators' epoch loop does not look at --max-steps: each epoch left would train one more
    # step and save and validate again. The stage stops after the epoch that took them.
    out, events_path = tmp_path / "checkpoints", tmp_path / "events.jsonl"
    _train(tiny_verifier.verifier, prepared_data, hidden_states, out, events_path, "--epochs", "3", "--max-steps", "2")
    events = read_events(events_path)
    finished = events[-1]
    assert finished["status"] == "ok" and finished["stopped_early"] is False and finished["epochs_done"] == 1 and finished["steps"] == 2, finished
    assert [e["step"] for e in events if e["event"] == "metric" and "loss" in e["metrics"]] == [1, 2]
    assert len([e for e in events if e["event"] == "metric" and "val_loss" in e["metrics"]]) == 1
    assert sorted(p.name for p in out.iterdir() if p.name.isdigit()) == ["0"]
    assert any(e["event"] == "message" and e["text"].startswith("--max-steps 2 taken in epoch 1 of 3") for e in events)
    assert not any(e["event"] == "message" and e["text"].startswith("early stop:") for e in events)


@pytest.mark.slow
def test_a_starved_run_is_named_before_it_starts_and_still_keeps_its_best_checkpoint(tiny_verifier, prepared_data, hidden_states, tmp_path):
    # The fixture's few thousand training tokens under the old GPU default of 8192 tokens per step:
    # a handful of steps per epoch. The user's value wins, and one warning line says so before the
    # first step. One step keeps the test short (an 8192-token step takes a minute on a CPU).
    out, events_path = tmp_path / "checkpoints", tmp_path / "events.jsonl"
    run_script(
        "train_draft.py",
        "--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--hidden-states", hidden_states, "--output", out,
        "--total-seq-len", "8192", "--epochs", "1", "--max-steps", "1", "--threads", "1", "--events", events_path,
    )
    events = read_events(events_path)
    assert events[-1]["event"] == "finished" and events[-1]["status"] == "ok", events[-1]
    warnings = [e["text"] for e in events if e["event"] == "warning"]
    assert len(warnings) == 1, warnings
    assert "\n" not in warnings[0] and "8192 tokens per step" in warnings[0] and "fewer than the 300" in warnings[0]
    assert "--total-seq-len 256" in warnings[0]  # the fix: what the rule picks for this data
    first_step = next(i for i, e in enumerate(events) if e["event"] == "metric" and "loss" in e["metrics"])
    assert events.index(next(e for e in events if e["event"] == "warning")) < first_step  # before it starts
    recipe = next(e["text"] for e in events if e["event"] == "message" and e["text"].startswith("recipe:"))
    assert "8192 tokens per step" in recipe and "1 epoch," in recipe

    # The epoch's validation gave a tau estimate, and best.json names the checkpoint it measured.
    taus = [e for e in events if e["event"] == "metric" and "tau" in e["metrics"]]
    val = [e["metrics"] for e in events if e["event"] == "metric" and "val_round_tau" in e["metrics"]]
    assert len(taus) == 1 and taus[0]["step"] == 1 and taus[0]["metrics"]["tau"] == pytest.approx(val[-1]["val_round_tau"], abs=1e-4), (taus, val)
    best = json.loads((out / "best.json").read_text())
    assert best == {"checkpoint": "0", "step": 1, "tau": taus[0]["metrics"]["tau"]}
    assert events[-1]["best_checkpoint"] == str((out / "0").resolve()) and events[-1]["best_tau"] == best["tau"]


def test_mismatched_hidden_states_fail_with_one_line(tiny_verifier, prepared_data, hidden_states, tmp_path):
    # Claim the files came from 2 layers: the layout check refuses before speculators starts.
    proc = _train(tiny_verifier.verifier, prepared_data, hidden_states, tmp_path / "ck", tmp_path / "e.jsonl", "--layers", "2", "4", check=False)
    assert proc.returncode != 0
    finished = read_events(tmp_path / "e.jsonl")[-1]
    assert finished["status"] == "failed" and "expected [T, 3," in finished["error"]
    assert "\n" not in finished["error"]


def test_missing_inputs_fail_with_one_line(tiny_verifier, prepared_data, tmp_path):
    proc = _train(tiny_verifier.verifier, prepared_data, tmp_path / "nowhere", tmp_path / "ck", tmp_path / "e.jsonl", check=False)
    assert proc.returncode != 0
    finished = read_events(tmp_path / "e.jsonl")[-1]
    assert finished["status"] == "failed" and "no such directory" in finished["error"]


def test_flex_attention_is_refused_on_cpu_before_training(tiny_verifier, prepared_data, hidden_states, tmp_path):
    if torch.cuda.is_available():
        platform_skip("flex_attention is refused on CPU only")
    proc = _train(tiny_verifier.verifier, prepared_data, hidden_states, tmp_path / "ck", tmp_path / "e.jsonl", "--attn-impl", "simple_flex_attention", "--max-steps", "1", check=False)
    assert proc.returncode != 0
    finished = read_events(tmp_path / "e.jsonl")[-1]
    assert "AttentionMismatch" in finished["error"] and "cannot train on CPU" in finished["error"]
    assert not any(e["event"] == "metric" and "loss" in e.get("metrics", {}) for e in read_events(tmp_path / "e.jsonl"))
    shutil.rmtree(tmp_path / "ck", ignore_errors=True)


def test_fsdp_on_one_process_fails_with_one_line(tiny_verifier, prepared_data, hidden_states, tmp_path):
    proc = _train(tiny_verifier.verifier, prepared_data, hidden_states, tmp_path / "ck", tmp_path / "e.jsonl", "--fsdp", check=False)
    assert proc.returncode != 0
    finished = read_events(tmp_path / "e.jsonl")[-1]
    assert finished["status"] == "failed" and "--fsdp shards over several processes" in finished["error"]
    assert not (tmp_path / "ck").exists()


def test_a_resumed_run_s_early_stop_picks_up_the_validations_it_resumes_after(tmp_path):
    from common.acceptance import EarlyStop
    from common.events import EventLog

    curves = EventLog("train", str(tmp_path / "metrics.jsonl"), echo=False)
    for epoch, (tau, loss) in enumerate([(2.0, 1.0), (2.5, 0.5), (2.5, 0.49), (2.5, 0.48)]):
        curves.metric(10 * epoch + 5, loss=1.0, epoch=epoch)  # a training step: no validation
        curves.metric(10 * epoch + 10, val_loss=loss, epoch=epoch)
        curves.metric(10 * epoch + 10, tau=tau, tau_per_position=tau + 0.1, epoch=epoch)
    curves.metric(35, tau=3.0)  # a mid-epoch probe: not an epoch's validation
    stop = EarlyStop(patience=2, k=3)
    train_draft.replay_validations(stop, tmp_path / "metrics.jsonl", last_epoch=2)  # epoch 3's record is past the checkpoint resumed from
    assert (stop.best, stop.best_epoch, stop.stale, stop.val_losses) == (2.5, 1, 1, [1.0, 0.5, 0.49])
    assert stop.update(3, 2.5, 0.48) is not None  # the resumed run's first validation without a rise is the second in a row


@pytest.mark.parametrize("epochs, verdicts", [
    (4, [False, True]),  # flat after epoch 1 of 4: stop, two epochs spared
    (2, [False, False]),  # flat after epoch 1 of 2, the last: the run ends as planned, not "stopped early"
    (1, [False]),
])
def test_the_early_stop_verdict_spares_only_epochs_still_to_come(epochs, verdicts):
    """train's verdict after each epoch's validation (what hook_main's stop_after asks rank 0):
    the estimate stands flat (same walked tau every epoch) with patience 1."""
    stop = train_draft.EarlyStop(patience=1, k=3)
    metrics = {f"{train_draft.ROUND_TAU}_epoch": 2.5, "loss_epoch": 1.0}
    said = [train_draft.early_stop_verdict(stop, epoch, epochs, metrics) for epoch in range(len(verdicts))]
    assert [reason is not None for reason in said] == verdicts, said
    if any(verdicts):
        assert "stood flat at 2.5000 (epoch 0) for 1 validations: stopped after epoch 1" in said[1]


@pytest.mark.parametrize("estimates, chosen", [
    ([3.06, 2.64, 3.03], 2),  # the later checkpoint, 1% lower by the estimate, takes the best's place
    ([3.13, 2.78, 2.90], 0),  # more than 5% lower: the earlier one stays
    ([2.0, 2.5, 2.4, 2.2], 2),  # within 5% of the highest (2.5), not of the best's own 2.4
])
def test_best_json_names_the_latest_checkpoint_within_the_estimates_noise(tmp_path, estimates, chosen):
    from common.events import EventLog

    reporter = train_draft.Reporter(EventLog("train", str(tmp_path / "events.jsonl"), echo=False), 0, tmp_path, len(estimates))
    for epoch, tau in enumerate(estimates):
        (tmp_path / str(epoch)).mkdir()
        (tmp_path / str(epoch) / "config.json").write_text("{}")
        (tmp_path / str(epoch) / "model.safetensors").write_bytes(b"")
        # estimate_tau = 1 + the sum of full_acc_<t> over the TTT steps (each at most 1)
        reporter.on_val(epoch, 10 * (epoch + 1), {"val": {**{f"full_acc_{t}_epoch": (tau - 1.0) / 3 for t in range(3)}, "loss_epoch": 1.0}})
    assert json.loads((tmp_path / "best.json").read_text())["checkpoint"] == str(chosen)
