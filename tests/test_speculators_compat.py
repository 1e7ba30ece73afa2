"""The speculators shims: they fit the installed speculators, they do what they say on CPU, and
they fail loudly, naming themselves, when the code they patch changes."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))

torch = pytest.importorskip("torch")
pytest.importorskip("speculators")

from common import speculators_compat as compat  # noqa: E402


def test_every_shim_fits_the_installed_speculators():
    compat.check_all()


def test_checks_still_pass_after_the_shims_are_applied():
    # Checks read the originals behind our patches, so applying twice is fine.
    compat.apply_cpu_shims()
    compat.check_all()
    assert compat.apply_cpu_shims() == ([] if torch.accelerator.is_available() else ["trainer-device", "step-timer-sync", "resume-device"])


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the CPU shims only apply without an accelerator")
def test_cpu_shims_make_the_trainer_pieces_work_without_an_accelerator():
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
