"""Online training's pure parts (remote_scripts/common/online.py, the pipeline's online chain);
tests/test_speculators_compat.py checks its shim (online-measure), tests/test_vllm_online.py drives
it against a real vLLM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))

from common import online  # noqa: E402
from common.online import Placement, PlacementError, place_gpus  # noqa: E402
from common.speculators_compat import MeasuredTransfer  # noqa: E402

from harness.config import PipelineConfig  # noqa: E402
from harness.pipeline import resolve_chain, stage_argv  # noqa: E402

# ---------------------------------------------------------------------------------------------
# GPU placement on one box


def test_the_default_placement_splits_the_box_and_shares_one_gpu():
    eight = [str(i) for i in range(8)]
    assert place_gpus(eight, None, None, None) == Placement(("0", "1", "2", "3"), ("4", "5", "6", "7"), None)
    assert place_gpus(["0", "1", "2"], None, None, None) == Placement(("0",), ("1", "2"), None)
    shared = place_gpus(["0"], None, None, None)
    assert shared.shared == ("0",) and shared.gpu_memory_utilization == online.SHARED_UTILIZATION
    assert place_gpus([], None, None, 0.9) == Placement((), (), 0.9)  # CPU: nothing to place


def test_placement_maps_indices_through_cuda_visible_devices_and_fills_the_other_set():
    visible = online.visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 4)
    assert visible == ["4", "5", "6", "7"]
    assert place_gpus(visible, [0, 1, 2], None, None) == Placement(("4", "5", "6"), ("7",), None)
    assert place_gpus(visible, None, [3], None) == Placement(("4", "5", "6"), ("7",), None)
    assert online.visible_gpus({}, 2) == ["0", "1"]


def test_overlapping_sets_that_cannot_fit_are_one_line():
    eight = [str(i) for i in range(8)]
    # Kimi-K2.5 on all eight GPUs, the draft beside it: fits when vLLM leaves enough
    fits = place_gpus(eight, list(range(8)), list(range(8)), 0.75)
    assert fits.shared == tuple(eight) and fits.gpu_memory_utilization == 0.75
    with pytest.raises(PlacementError) as refused:
        place_gpus(eight, list(range(8)), [6, 7], 0.9)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("GPU 6,7 would serve the verifier and train the draft, but vLLM takes 0.9")
    assert "gpu_memory_utilization <= 0.8" in message
    for verifier, train, why in (([8], [0], "no GPU 8 on this host"), ([0, 0], [1], "names a GPU twice"), ([], [1], "verifier_gpus is empty")):
        with pytest.raises(PlacementError, match=why):
            place_gpus(eight, verifier, train, None)
    with pytest.raises(PlacementError, match="no GPU visible"):
        place_gpus([], [0], None, None)


# ---------------------------------------------------------------------------------------------
# The disk bound and its measurement


def test_the_bound_is_files_in_flight_times_the_longest_row():
    row = online.sample_bytes(2048, 4, 7168)
    assert row == 2048 * (4 * 7168 * 2 + 8) + online.FILE_OVERHEAD  # bf16 states, int64 ids, header and lock
    assert online.staging_bound(8, 4, 2048, 4, 7168) == 8 * 2 * 4 * row  # ranks x 2 loaders x workers
    assert online.staging_bound(1, 0, 2048, 4, 7168) == 2 * row  # no workers: the rank itself


class _Files:
    """A transfer over real files: what speculators' FileTransfer does (load, then unlink)."""

    def setup(self):
        pass

    def get_cached(self, index):
        return None

    def get_generated(self, params):
        return Path(params["hidden_states_path"]).read_bytes()

    def delete(self, handle):
        Path(handle).unlink()


def test_measured_transfer_records_the_peak_while_each_file_is_present(tmp_path):
    import pickle

    staging = tmp_path / "staging"
    online.clear_staging(staging)
    transfer = pickle.loads(pickle.dumps(MeasuredTransfer(_Files(), str(staging))))  # spawned workers get a copy
    sizes = [300, 1200, 500]
    (staging / "straggler.safetensors").write_bytes(b"x" * 100)  # another loader's file, present meanwhile
    for i, size in enumerate(sizes):
        path = staging / f"req-{i}.safetensors"
        path.write_bytes(b"x" * size)
        assert len(transfer.get_generated({"hidden_states_path": str(path)})) == size
        transfer.delete(str(path))
    assert online.measured_peak(staging) == 1200 + 100
    # the validation loader measures in the same process: its smaller high does not hide the other's
    validation = MeasuredTransfer(_Files(), str(staging))
    small = staging / "val.safetensors"
    small.write_bytes(b"x" * 10)
    validation.get_generated({"hidden_states_path": str(small)})
    validation.delete(str(small))
    assert online.measured_peak(staging) == 1200 + 100
    assert online.staging_bytes(staging) == 100 and online.staged_files(staging) == ["straggler.safetensors"]
    assert online.clear_staging(staging) == 3 and online.staged_files(staging) == [] and online.measured_peak(staging) == 0  # the straggler, two records


# ---------------------------------------------------------------------------------------------
# The pipeline: one option


def test_online_drops_extract_from_the_chains_and_hidden_states_from_train():
    offline = PipelineConfig()
    on = PipelineConfig(target_layer_ids=[1, 3], stages={"train": {"online": True, "verifier_gpus": [0, 1], "train_gpus": [2, 3]}})
    assert "extract" in resolve_chain(["all"], offline) and "extract" in resolve_chain(["all"])
    assert resolve_chain(["all"], on) == ["regenerate", "prepare", "train", "evaluate", "export", "serve_check"]
    assert resolve_chain(["demo"], on) == ["verifier", "regenerate", "prepare", "train", "evaluate", "export"]
    assert resolve_chain(["extract", "train"], on) == ["extract", "train"]  # asked for by name: kept
    argv = stage_argv("train", on)
    assert "--hidden-states" not in argv and "--online" in argv
    assert argv[argv.index("--verifier-gpus") + 1: argv.index("--verifier-gpus") + 3] == ["0", "1"]
    assert argv[argv.index("--layers") + 1: argv.index("--layers") + 3] == ["1", "3"]  # what vLLM saves
    assert "--hidden-states" in stage_argv("train", offline)


def test_online_train_is_not_wrapped_in_torchrun(tmp_path):
    from harness.config import Config
    from harness.jobs import stage_command

    on = Config(path=tmp_path / "harness.toml", hosts={}, pipeline=PipelineConfig(stages={"train": {"online": True}}))
    off = Config(path=tmp_path / "harness.toml", hosts={})
    assert stage_command("train", on, "python3", "e.jsonl", 8)[:2] == ["python3", "remote_scripts/train_draft.py"]
    assert stage_command("train", off, "python3", "e.jsonl", 8)[:3] == ["python3", "-m", "torch.distributed.run"]
    assert stage_command("evaluate", on, "python3", "e.jsonl", 8)[:2] == ["python3", "remote_scripts/evaluate.py"]
