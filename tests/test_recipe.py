"""The training recipe sized to the data (remote_scripts/common/recipe.py) and the acceptance
estimate and guard read from training metrics (common/acceptance.py): pure functions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))

from common.acceptance import EarlyStop, estimate_tau, per_position_tau, still_learning, still_learning_warning, walk_rounds  # noqa: E402
from common.recipe import DEFAULT_TOKENS_PER_STEP, MAX_EPOCHS, MIN_STEPS, TARGET_STEPS, DataSize, size_recipe  # noqa: E402

TINY = DataSize(train_tokens=3_000, longest_row=120)
SMALL = DataSize(train_tokens=57_000, longest_row=256)  # the demo: ~1000 short conversations
MEDIUM = DataSize(train_tokens=2_000_000, longest_row=1024)
LARGE = DataSize(train_tokens=200_000_000, longest_row=4096)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("processes", [1, 8])
def test_large_data_keeps_the_device_default(device, processes):
    r = size_recipe(LARGE, processes, device)
    assert r.tokens_per_step == DEFAULT_TOKENS_PER_STEP[device] and r.epochs == 3 and r.sized == ()
    assert r.total_steps >= MIN_STEPS and r.warning is None
    assert r.tau_every is not None  # epochs of many thousand steps: tau is also estimated inside them


@pytest.mark.parametrize("processes", [1, 8])
def test_small_data_gets_the_same_pack_on_cpu_and_gpu_and_the_gpu_more_steps(processes):
    cpu, gpu = size_recipe(SMALL, processes, "cpu"), size_recipe(SMALL, processes, "cuda")
    assert (cpu.tokens_per_step, cpu.steps_per_epoch) == (gpu.tokens_per_step, gpu.steps_per_epoch)
    assert cpu.epochs == min(MAX_EPOCHS, -(-TARGET_STEPS["cpu"] // cpu.steps_per_epoch))
    assert gpu.epochs == min(MAX_EPOCHS, -(-TARGET_STEPS["cuda"] // gpu.steps_per_epoch)) >= cpu.epochs  # GPU steps are cheap
    assert gpu.tokens_per_step < DEFAULT_TOKENS_PER_STEP["cuda"] and "tokens_per_step" in gpu.sized
    assert gpu.total_steps >= MIN_STEPS and gpu.warning is None
    assert gpu.tau_every is None  # short epochs: one estimate per epoch


def test_small_data_on_one_gpu_packs_like_the_cpu_default():
    r = size_recipe(SMALL, 1, "cuda")
    assert r.tokens_per_step == DEFAULT_TOKENS_PER_STEP["cpu"]  # 3 epochs of it reach MIN_STEPS: no smaller pack
    assert r.steps_per_epoch == -(-SMALL.train_tokens // 512)
    # ... and the epochs are raised towards the GPU's TARGET_STEPS (small data learns from more passes)
    assert r.epochs == min(MAX_EPOCHS, -(-TARGET_STEPS["cuda"] // r.steps_per_epoch)) > 3 and r.sized == ("tokens_per_step", "epochs")
    assert size_recipe(SMALL, 1, "cuda", epochs=3).epochs == 3  # a user's epochs are kept


def test_the_gpu_size_of_the_smollm2_bench_gets_its_measured_steps():
    # bench/quality's gpu size on SmolLM2 (bench/RESULTS.md 2026-12-02): ~2.33M training tokens on
    # one H200 got 4 epochs (1,144 steps, tau 2.71) under the old target; 16 epochs gave 2.93.
    r = size_recipe(DataSize(train_tokens=2_330_000, longest_row=700), 1, "cuda")
    assert r.tokens_per_step == 8192 and r.steps_per_epoch == 285 and r.epochs == MAX_EPOCHS and r.total_steps >= 5700


def test_eight_processes_on_small_data_need_more_epochs_too():
    data = DataSize(train_tokens=4_000_000, longest_row=1024)  # one process stays below MAX_EPOCHS
    one, eight = size_recipe(data, 1, "cuda"), size_recipe(data, 8, "cuda")
    assert eight.tokens_per_step <= one.tokens_per_step
    assert eight.tokens_per_step >= data.longest_row  # never below a row: speculators would truncate it
    assert eight.epochs > one.epochs and "epochs" in eight.sized and eight.total_steps >= MIN_STEPS


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("processes", [1, 8])
def test_tiny_data_cannot_reach_the_minimum_and_says_so(device, processes):
    r = size_recipe(TINY, processes, device)
    assert r.epochs == MAX_EPOCHS and r.total_steps < MIN_STEPS
    assert r.warning is not None and "\n" not in r.warning
    assert f"{r.total_steps} optimizer steps" in r.warning and f"fewer than the {MIN_STEPS}" in r.warning
    assert "training tokens of data" in r.warning  # the fix: more data (or epochs)


def test_a_user_value_wins_and_a_starved_run_is_named_with_the_fix():
    r = size_recipe(SMALL, 1, "cuda", tokens_per_step=8192, epochs=3)
    assert (r.tokens_per_step, r.epochs, r.sized) == (8192, 3, ())
    assert r.total_steps == 3 * -(-SMALL.train_tokens // 8192) < MIN_STEPS
    assert "this run gets 21 optimizer steps" in r.warning and "8192 tokens per step" in r.warning
    assert "--total-seq-len 512" in r.warning  # what the rule would pick for these 3 epochs
    fixed = size_recipe(SMALL, 1, "cuda", tokens_per_step=512, epochs=3)
    assert fixed.warning is None and fixed.total_steps >= MIN_STEPS


def test_a_user_token_count_still_gets_sized_epochs():
    r = size_recipe(SMALL, 1, "cuda", tokens_per_step=2048)
    assert r.tokens_per_step == 2048 and r.epochs > 3 and r.sized == ("epochs",) and r.warning is None


def test_max_steps_caps_the_run_and_is_named():
    r = size_recipe(SMALL, 1, "cpu", max_steps=5)
    assert r.total_steps == 5 and "--max-steps" in r.warning


def test_processes_must_be_positive():
    with pytest.raises(ValueError):
        size_recipe(SMALL, 0, "cpu")


def test_tau_estimate_from_validation_accuracies():
    assert estimate_tau({"full_acc_0": 0.9, "full_acc_1": 0.8, "full_acc_2": 0.5, "loss": 1.0, "cond_acc_1": 0.9}) == pytest.approx(3.2)
    assert estimate_tau({"loss": 1.0}) is None


def test_the_guard_names_a_run_that_was_still_learning():
    assert still_learning([2.0, 1.0], [1.2, 1.6], k=3) is not None
    assert "validation loss still fell 50%" in still_learning([2.0, 1.0], [], k=3)
    assert "estimated tau still rose 1.20 -> 1.60" in still_learning([], [1.2, 1.6], k=3)
    assert still_learning([1.00, 0.99], [3.60, 3.62], k=3) is None  # levelled off
    assert still_learning([1.0], [3.0], k=3) is None  # one measurement says nothing about a trend
    # The CPU demo's last epoch: the loss fell 21%, over the threshold, but tau was flat near its
    # ceiling of k + 1: the draft was done.
    assert still_learning([0.1533, 0.04421, 0.03497], [3.7873, 3.7957, 3.8019], k=3) is None
    assert still_learning([0.1, 0.05], [3.79, 3.80], k=3) is None  # halved, but at 95% of the ceiling
    assert still_learning([0.1, 0.05], [2.40, 2.41], k=3) is not None  # halved, far below it
    assert still_learning([8.0, 6.5], [1.00, 1.01], k=3) is not None  # learned nothing yet, loss still falling
    warning = still_learning_warning([2.0, 1.0], [1.2, 1.6], k=3, epochs=3, steps=21)
    assert "\n" not in warning and "after 21 optimizer steps in 3 epochs" in warning and "--epochs 6" in warning


def test_walking_rounds_reads_what_speculation_delivers_not_the_per_position_mean():
    # Half the reply accepts every proposal (k = 3), half none: per position 1 + 1.5 = 2.5 tokens,
    # but the easy half takes 2 rounds of 4 tokens and the hard half 8 rounds of 1: 16 / 10 = 1.6.
    accepted, in_reply = [3] * 8 + [0] * 8, [True] * 16
    assert walk_rounds(accepted, in_reply) == (16, 10)
    assert per_position_tau({"full_acc_0": 0.5, "full_acc_1": 0.5, "full_acc_2": 0.5}) == 2.5
    # Prompt positions separate replies, and no round runs past its reply's end.
    assert walk_rounds([3, 3, 3, 3, 3, 3], [False, True, True, False, True, True]) == (4, 2)
    assert walk_rounds([], []) == (0, 0)


def test_the_estimate_prefers_the_walked_rounds():
    assert estimate_tau({"round_tau": 1.6, "full_acc_0": 0.5}) == 1.6
    assert estimate_tau({"full_acc_0": 0.5, "full_acc_1": 0.25}) == 1.75  # older runs: the per-position sum
    assert estimate_tau({}) is None
    assert estimate_tau({"round_tau": 0.0, "full_acc_0": 0.0}) is None  # no round walked: no estimate, not 1.0


def test_the_early_stop_waits_for_no_rise_at_all_over_its_patience():
    flat = EarlyStop(patience=3, k=3)
    # the CPU demo's estimates: flat from epoch 1
    verdicts = [flat.update(e, tau, loss) for e, (tau, loss) in enumerate([(2.6018, 4.8), (3.7021, 0.63), (3.7021, 0.125), (3.7021, 0.081), (3.7021, 0.063)])]
    assert verdicts[:4] == [None] * 4 and "stood flat at 3.7021 (epoch 1) for 3 validations: stopped after epoch 4" in verdicts[4]
    # Any rise is a new best, however small: a slowly learning run is never stopped.
    slow = EarlyStop(patience=2, k=3)
    assert all(slow.update(e, 2.0 + e * 1e-4, 1.0) is None for e in range(20))
    # An estimate that moves below the best is no sign the run is done (SmolLM2's small validation
    # set: 1.61, 1.57, 1.57, 1.55, and the last epochs still raised the held-out tau): never a stop.
    noisy = EarlyStop(patience=2, k=3)
    assert all(v is None for v in [noisy.update(e, tau, 1.0) for e, tau in enumerate([1.31, 1.61, 1.57, 1.57, 1.55, 1.59])])
    # Flat means within 0.5% below the best: the count goes on there, a larger dip starts it over.
    flatish = EarlyStop(patience=2, k=3)
    assert [flatish.update(e, tau, 1.0) for e, tau in enumerate([2.5, 2.495, 2.3, 2.5, 2.49])][-1] is not None
    assert flatish.stale == 2 and flatish.best_epoch == 0
    # The estimate flat but the validation loss still falling fast below the ceiling: still learning.
    learning = EarlyStop(patience=1, k=3)
    assert learning.update(0, 2.0, 1.0) is None and learning.update(1, 2.0, 0.8) is None  # loss -20%
    assert learning.update(2, 2.0, 0.79) is not None  # loss -1%: levelled off
    # patience 0 never stops; an epoch without an estimate is no evidence either way.
    never = EarlyStop(patience=0, k=3)
    assert all(never.update(e, 2.0, 1.0) is None for e in range(5))
    blind = EarlyStop(patience=1, k=3)
    assert blind.update(0, 2.0, 1.0) is None and blind.update(1, None, 1.0) is None and blind.update(2, 2.0, 1.0) is not None
