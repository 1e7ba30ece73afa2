"""Every patch we apply to speculators 0.9.0, in one place, each checked before it is applied.

speculators' trainer is written for CUDA: on a machine without an accelerator (the demo, CI) it
fails in three places (shims trainer-device, step-timer-sync, resume-device: apply_cpu_shims(), a
no-op on the GPU path). The other shims fit train's own additions into it: its metrics, the tau
probe, the early stop, the mask token, the loss on every position, online training's staging
measure, the servers' key and socket. Each shim has a check (CHECKS; each `_check_*` function's docstring
says what the shim relies on and why it exists) that reads the source of the code it relies on:
if speculators changes beneath a shim, the check raises `ShimOutdated` naming it, instead of
the shim silently patching the wrong thing.
"""

from __future__ import annotations

import inspect
import os
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

SPECULATORS_VERSION = "0.9.0"  # the version these shims were written against


class ShimOutdated(RuntimeError):
    """speculators' code no longer matches what a shim patches."""

    def __init__(self, shim: str, detail: str):
        super().__init__(
            f"speculators_compat shim '{shim}' no longer matches the installed speculators "
            f"(written for {SPECULATORS_VERSION}): {detail}. Re-read the installed code and update "
            "remote_scripts/common/speculators_compat.py."
        )
        self.shim = shim


def _source(obj: Any) -> str:
    return inspect.getsource(obj)


def _unwrapped(obj: Any) -> Any:
    """The speculators original behind one of our patches (checks read the original)."""
    return getattr(obj, "_speculators_compat_original", obj)


def _require(shim: str, obj: Any, *snippets: str) -> None:
    obj = _unwrapped(obj)
    src = _source(obj)
    name = getattr(obj, "__qualname__", repr(obj))
    for s in snippets:
        if s not in src:
            raise ShimOutdated(shim, f"{name} no longer contains {s!r}")


def has_accelerator() -> bool:
    import torch

    return torch.accelerator.is_available()


# --- the checks: one per shim; each raises ShimOutdated or returns the objects it patches -----


def _check_trainer_device():
    """trainer-device: Trainer.__init__ sets `local_rank = get_local_rank()` (an int: `.to(0)`
    means cuda:0) and `device_type = ... else "cuda"` (autocast on "cuda" without CUDA). On CPU,
    setup_model first points both at the CPU."""
    from speculators.train import trainer as trainer_mod

    _require("trainer-device", trainer_mod.Trainer.__init__, "self.local_rank = get_local_rank()", 'else "cuda"', "self.setup_model()")
    _require("trainer-device", trainer_mod.Trainer.setup_model, "self.model.to(self.local_rank)")
    _require("trainer-device", trainer_mod.Trainer.train_epoch, "v.to(self.local_rank", "torch.autocast(", "self.device_type")
    return trainer_mod


def _check_step_timer():
    """step-timer-sync: _StepTimer.mark/now call torch.accelerator.synchronize(), which raises
    without an accelerator. On CPU the timer skips the synchronization (nothing to wait for)."""
    from speculators.train import trainer as trainer_mod

    timer = _unwrapped(getattr(trainer_mod, "_StepTimer", None))
    if timer is None:
        raise ShimOutdated("step-timer-sync", "speculators.train.trainer._StepTimer is gone")
    _require("step-timer-sync", timer.mark, "torch.accelerator.synchronize()", "self._marks[name] = time.perf_counter()")
    _require("step-timer-sync", timer.now, "torch.accelerator.synchronize()", "return time.perf_counter()")
    _require("step-timer-sync", trainer_mod.Trainer.train_epoch, "timer = _StepTimer()")
    return trainer_mod


def _check_resume_device():
    """resume-device: the checkpointer loads weights and optimizer state with
    map_location=get_current_device(), which is "cuda:0" without an accelerator. On CPU it
    loads to "cpu"."""
    from speculators.train import checkpointer as ckpt_mod
    from speculators.utils import util

    current = getattr(ckpt_mod, "get_current_device", None)
    if current is None:
        raise ShimOutdated("resume-device", "speculators.train.checkpointer no longer imports get_current_device")
    # Either the original or our replacement (idempotent apply).
    if current is not util.get_current_device and not getattr(current, "_speculators_compat", False):
        raise ShimOutdated("resume-device", "checkpointer.get_current_device is not speculators.utils.util.get_current_device")
    _require("resume-device", util.get_current_device, 'return "cuda:0"')
    _require("resume-device", ckpt_mod.SingleGPUCheckpointer.load_model_state_dict, "device = get_current_device()")
    _require("resume-device", ckpt_mod.SingleGPUCheckpointer.load_optimizer_state_dict, "map_location=device")
    return ckpt_mod


def _check_metrics_bridge():
    """metrics-bridge: Trainer logs per-step metrics as a dict on logger `speculators.metrics`;
    with output that is not a terminal they are only behind tqdm's bar. MetricsBridge is a
    logging handler that hands those dicts to a callback. speculators' main() reconfigures that
    logger (dictConfig drops its handlers), so the bridge is attached right after main's own
    setup_metric_logger call (_check_main_hooks)."""
    from speculators.train import trainer as trainer_mod

    _require("metrics-bridge", trainer_mod.Trainer.train_epoch, "metric_logger.info(", '"train": metrics', '"global_step": self.global_step')
    _require("metrics-bridge", trainer_mod.Trainer.val_epoch, "metric_logger.info(", '{"val": val_metrics, "epoch": epoch}')
    if trainer_mod.metric_logger.name != "speculators.metrics":
        raise ShimOutdated("metrics-bridge", f"metric logger is now {trainer_mod.metric_logger.name!r}")
    return trainer_mod


def _check_main_hooks():
    """trainer-hook: speculators' main() builds the draft, then `Trainer(draft_model, ...)`. Our
    preflight guards (attention/mask, dtypes, verifier path) must see that model before the
    first step: main's Trainer is wrapped to call them first (hook_main)."""
    from speculators.train import cli as cli_mod

    _require("trainer-hook", cli_mod.main, "trainer = Trainer(draft_model, trainer_config, train_loader, val_loader)")
    _require("metrics-bridge", cli_mod.main, "setup_metric_logger(")
    return cli_mod


def _check_flex_kernel_options():
    """flex-kernel-options: speculators' flex_attention_forward calls torch's flex_attention
    without kernel_options; on GPUs with ~100 KiB shared memory the default tiles do not fit.
    set_flex_kernel_options() makes that call pass smaller tiles."""
    from speculators.models import attention as attn_mod

    _require("flex-kernel-options", attn_mod.flex_attention_forward, "flex_attention(", "block_mask=attention_mask")
    if not callable(getattr(attn_mod, "flex_attention", None)):
        raise ShimOutdated("flex-kernel-options", "speculators.models.attention no longer imports flex_attention")
    return attn_mod


def _check_tau_probe():
    """tau-probe: run_training calls `self.train_epoch(epoch)` without a step callback, and
    validates only at epoch ends. On long epochs the wrapped Trainer passes train_epoch a
    callback that, every N steps, runs partial_validation(): the forward of val_epoch over the
    first few validation batches (same autocast, same val_call_kwargs, same cross-rank
    reduction), on every rank."""
    from speculators.train import trainer as trainer_mod

    _require("tau-probe", trainer_mod.Trainer.run_training, "self.train_epoch(epoch)")
    _require("tau-probe", trainer_mod.Trainer.train_epoch, "step_callback: Callable[[], None] | None = None", "step_callback()", "self.global_step += 1")
    _require(
        "tau-probe", trainer_mod.Trainer.val_epoch,
        "self.model.eval()", "torch.autocast(", "self.config.hidden_states_dtype", "**(self.config.val_call_kwargs or {})",
        "_all_reduce_metrics(accumulated)", "normalize_counted_metrics(val_metrics, world_size)",
    )
    return trainer_mod


def _check_early_stop():
    """early-stop: run_training saves each epoch's checkpoint, then `val_metrics =
    self.val_epoch(epoch)` (which logs them: the bridge writes best.json), and
    with_graceful_shutdown catches only TrainingInterruptedError. The wrapped Trainer's val_epoch
    asks train's early stop (common/acceptance.py EarlyStop) on every rank, with the reduced
    metrics every rank has, and raises StopTraining after the epoch's checkpoint and validation;
    train catches it and tears down what speculators' main would have."""
    from speculators.train import graceful_shutdown
    from speculators.train import trainer as trainer_mod

    _require("early-stop", trainer_mod.Trainer.run_training, "self.maybe_save_checkpoint(epoch)", "val_metrics = self.val_epoch(epoch)")
    src = _source(_unwrapped(trainer_mod.Trainer.run_training))
    if src.index("self.maybe_save_checkpoint(epoch)") > src.index("val_metrics = self.val_epoch(epoch)"):
        raise ShimOutdated("early-stop", "Trainer.run_training now validates an epoch before saving its checkpoint")
    _require("early-stop", graceful_shutdown.with_graceful_shutdown, "except TrainingInterruptedError:")
    # the max-steps stop reads what train_epoch stops on
    _require("early-stop", trainer_mod.Trainer.train_epoch, "self.global_step >= self.config.max_steps")
    return trainer_mod


class StopTraining(Exception):
    """Raised on every rank after an epoch's validation when the early stop says so, or when the
    run has taken its --max-steps (`early` False) with epochs left (hook_main)."""

    def __init__(self, epoch: int, reason: str, early: bool = True):
        super().__init__(reason)
        self.epoch, self.reason, self.early = epoch, reason, early


def _check_mask_token():
    """mask-token: build_draft_model() calls resolve_mask_token_id(), which loads the verifier's
    full AutoProcessor unless --mask-token-id is given: for a multimodal verifier (Kimi-K2.5)
    that needs a preprocessor config and torchvision, for an id EAGLE-3 never reads.
    mask_token_id() resolves it the same way from the tokenizer alone (or a harmless id), and
    train passes it explicitly. Not a patch: the check makes sure the explicit id still
    short-cuts the processor and that EAGLE-3 still ignores it (the fallback id is harmless
    only then)."""
    from speculators.models import eagle3
    from speculators.train import cli as cli_mod
    from speculators.train import utils as utils_mod

    _require("mask-token", cli_mod.build_draft_model, "resolve_mask_token_id(", "args.mask_token_id,")
    _require("mask-token", utils_mod.resolve_mask_token_id, "if mask_token_id is not None:", "return mask_token_id", "load_processor(")
    for module in (eagle3.core, eagle3.config):
        if "mask_token" in inspect.getsource(module):
            raise ShimOutdated("mask-token", f"{module.__name__} now reads a mask token: the fallback id may no longer be harmless")
    return utils_mod


def _check_every_position():
    """every-position: ArrowDataset._get_raw_data hands the loss each row's `loss_mask`
    (prepare's: the replies' tokens). supervise_every_position() makes the TRAINING split a
    common/every_position.py dataset, whose rows have a mask of ones: the loss is a KL to the
    verifier's own logits at each position, a target on prompt tokens too; validation keeps the
    replies' mask."""
    from speculators.models.eagle3 import core as eagle3_core
    from speculators.train import data as data_mod

    _require("every-position", data_mod.ArrowDataset._get_raw_data, '"loss_mask": self.data[index]["loss_mask"]')
    _require("every-position", data_mod.ArrowDataset.__init__, "self.data = self.data.select(range(start, stop))")
    _require("every-position", eagle3_core.Eagle3DraftModel.forward, "targets = self.verifier_lm_head(")
    return data_mod


def walk_rounds_in_validation() -> None:
    """Make each validation forward of the EAGLE-3 draft also report `round_tau_sum` /
    `round_tau_total` (tokens and rounds of chain speculation walked along its rows,
    common/acceptance.py), which speculators reduces to the metric `round_tau` as it does its own.

    speculators' forward calls compute_metrics once per TTT step with one `prev_correct` tensor,
    which compute_accuracy_single_step ANDs in place with that step's correctness (through
    align_for_step's view): after step t it holds "proposals 1..t+1 right" per start position, so
    the sum over the steps so far is each position's accepted chain length. Training forwards (grad
    enabled) are left alone: the walk is for the estimate only. Idempotent."""
    core = _check_round_walk()
    original = _unwrapped(core.compute_metrics)
    import torch

    from common.acceptance import ROUND_TAU, walk_rounds

    accepted: dict[str, Any] = {}  # this forward's running sum of chain-correct flags

    def compute_metrics(logits, targets, loss_mask, prev_correct, ttt_step, *args, **kwargs):
        loss, metrics = original(logits, targets, loss_mask, prev_correct, ttt_step, *args, **kwargs)
        if prev_correct is None or torch.is_grad_enabled():
            return loss, metrics
        flags = prev_correct.to(torch.int32)
        accepted["sum"] = flags if ttt_step == 0 or "sum" not in accepted else accepted["sum"] + flags
        in_reply = loss_mask if loss_mask is not None else torch.ones_like(prev_correct)
        tokens = rounds = 0
        for row_accepted, row_reply in zip(accepted["sum"].tolist(), in_reply.to(torch.bool).tolist()):
            t, r = walk_rounds(row_accepted, row_reply)
            tokens, rounds = tokens + t, rounds + r
        device = loss.device
        metrics[f"{ROUND_TAU}_sum"] = torch.tensor(float(tokens), device=device)
        metrics[f"{ROUND_TAU}_total"] = torch.tensor(float(rounds), device=device)
        return loss, metrics

    compute_metrics._speculators_compat_original = original  # type: ignore[attr-defined]
    core.compute_metrics = compute_metrics


def supervise_every_position(dataset) -> None:
    """Every position of `dataset`'s rows (speculators' ArrowDataset) counts in the loss."""
    data_mod = _check_every_position()
    if type(dataset) is not data_mod.ArrowDataset:
        raise ShimOutdated("every-position", f"the training loader's dataset is a {type(dataset).__name__}, not an ArrowDataset")
    from common.every_position import EveryPositionDataset

    dataset.__class__ = EveryPositionDataset  # per row, nothing copied; pickles by name for spawned workers


def _check_round_walk():
    """round-walk: walk_rounds_in_validation() reads the `prev_correct` flags speculators'
    compute_metrics leaves after each TTT step (its docstring says how)."""
    from speculators.models import metrics as shared_metrics
    from speculators.models.eagle3 import core as eagle3_core
    from speculators.models.eagle3 import metrics as eagle3_metrics

    _require("round-walk", eagle3_core.Eagle3DraftModel.forward, "s_loss, s_metrics = compute_metrics(", "prev_correct,", "ttt_step,", "metrics.update(s_metrics)")
    _require("round-walk", eagle3_metrics.align_for_step, "prev_correct = prev_correct[:, :-ttt_step] if ttt_step > 0 else prev_correct")
    _require("round-walk", shared_metrics.compute_accuracy_single_step, "torch.logical_and(prev_correct, correct, out=prev_correct)")
    if not callable(getattr(eagle3_core, "compute_metrics", None)):
        raise ShimOutdated("round-walk", "speculators.models.eagle3.core no longer imports compute_metrics")
    return eagle3_core


def _check_online_measure():
    """online-measure (train --online): ArrowDataset generates a missing row's states through
    `self.transfer.get_generated(...)`, then `self.transfer.delete(handle)`.
    measure_generated_states() wraps each loader's dataset's transfer in common/online.py's
    MeasuredTransfer (below), which sums the staging directory between the two (the peak disk of online
    training); nothing else changes."""
    from speculators.train import data as data_mod

    _require("online-measure", data_mod.ArrowDataset._generate_hidden_states_once,
             "loaded_hs = self.transfer.get_generated(hs_transfer_params)", "self.transfer.delete(handle)")
    _require("online-measure", data_mod.ArrowDataset.__init__, "self.transfer = transfer or FileTransfer(")
    _require("online-measure", data_mod.ArrowDataset._get_raw_data, "cached_hs = self.transfer.get_cached(file_idx)", 'if self.on_missing == "generate":')
    return data_mod


def measure_generated_states(dataset, staging: str) -> None:
    """`dataset`'s generated hidden states are measured on disk before their deletion (see above)."""
    data_mod = _check_online_measure()
    if not isinstance(dataset, data_mod.ArrowDataset):
        raise ShimOutdated("online-measure", f"a loader's dataset is a {type(dataset).__name__}, not an ArrowDataset")
    if not isinstance(dataset.transfer, MeasuredTransfer):
        dataset.transfer = MeasuredTransfer(dataset.transfer, staging)


class MeasuredTransfer:
    """speculators' HiddenStatesTransfer with the staging directory summed at each generated load
    (common/online.py: staging_bytes, measured_peak; docs/architecture/common-modules.md, common/online.py).
    Module level and plain attributes: spawned workers unpickle it."""

    def __init__(self, inner: Any, staging: str):
        self.inner = inner
        self.staging = staging
        self.peak = 0

    def __setstate__(self, state: dict) -> None:
        # Unpickled in a spawned dataloader worker: the one object of ours that gets there, so it
        # brings the endpoint shim along (the worker's requests reach our vLLM's socket with its key).
        self.__dict__.update(state)
        reach_our_server()

    def setup(self) -> None:
        self.inner.setup()

    def get_cached(self, file_idx: int):
        return self.inner.get_cached(file_idx)

    def get_generated(self, hs_transfer_params: dict[str, Any]):
        from common.online import PEAK_PREFIX, staging_bytes  # this file also runs as a script, where common/ is no package

        loaded = self.inner.get_generated(hs_transfer_params)
        size = staging_bytes(Path(self.staging))
        if size > self.peak:
            self.peak = size
            # one record per process and per loader: a rank's training and validation loaders
            # measure in the same process, and neither may overwrite the other's high
            record = Path(self.staging) / f"{PEAK_PREFIX}{os.getpid()}.{id(self)}"
            tmp = record.with_name(record.name + ".tmp")
            tmp.write_text(str(size))
            os.replace(tmp, record)
        return loaded

    def delete(self, handle: str) -> None:
        self.inner.delete(handle)


def _check_endpoint():
    """endpoint: speculators' clients of a vLLM server (generate-offline-data's AsyncOpenAI,
    the online dataloader's OpenAI in ArrowDataset._setup_client) pass api_key="EMPTY" and no
    http_client; our servers want their key (VLLM_API_KEY) and listen on a unix socket
    (HARNESS_VLLM_SOCKET; common/vllm_server.py). reach_our_server() makes openai's clients in
    this process send the key and connect to the socket (train applies it; spawned dataloader
    workers apply it when they unpickle MeasuredTransfer).
    generate-offline-data runs through this file (`python speculators_compat.py
    generate-offline-data ...`), which applies it first. Returns (openai's client class, its
    default http client, that client's package's transport) for the sync and the async client."""
    import importlib

    import openai

    generate_offline_data = importlib.import_module("speculators.cli.generate_offline_data")  # the package's name is the function
    from speculators.train import data

    _require("endpoint", generate_offline_data._generate_and_save_hidden_states, "openai.AsyncOpenAI(", 'api_key="EMPTY"')
    _require("endpoint", data.ArrowDataset._setup_client, "openai.OpenAI(", 'api_key="EMPTY"')
    for client in (generate_offline_data._generate_and_save_hidden_states, data.ArrowDataset._setup_client):
        if "http_client" in _source(client):
            raise ShimOutdated("endpoint", f"{client.__qualname__} now passes its own http_client")
    clients = []
    for cls, default, name in ((openai.OpenAI, openai.DefaultHttpxClient, "HTTPTransport"), (openai.AsyncOpenAI, openai.DefaultAsyncHttpxClient, "AsyncHTTPTransport")):
        if "http_client" not in inspect.signature(cls.__init__).parameters:
            raise ShimOutdated("endpoint", f"openai.{cls.__name__} takes no http_client")
        # the package openai's clients are made of (httpx, or its fork httpx2 in openai 3): its transport, not another's
        package = importlib.import_module(next(c for c in default.__mro__ if not c.__module__.startswith("openai")).__module__.partition(".")[0])
        transport = getattr(package, name, None)
        if transport is None or "uds" not in inspect.signature(transport.__init__).parameters:
            raise ShimOutdated("endpoint", f"{package.__name__}.{name} cannot connect to a unix socket (uds)")
        clients.append((cls, default, transport))
    return clients


CHECKS: dict[str, Callable[[], Any]] = {
    "trainer-device": _check_trainer_device,
    "step-timer-sync": _check_step_timer,
    "resume-device": _check_resume_device,
    "metrics-bridge": _check_metrics_bridge,
    "trainer-hook": _check_main_hooks,
    "flex-kernel-options": _check_flex_kernel_options,
    "tau-probe": _check_tau_probe,
    "early-stop": _check_early_stop,
    "mask-token": _check_mask_token,
    "every-position": _check_every_position,
    "round-walk": _check_round_walk,
    "online-measure": _check_online_measure,
    "endpoint": _check_endpoint,
}


# --- the patches ---------------------------------------------------------------------------------


def apply_cpu_shims() -> list[str]:
    """Patch speculators' trainer for a machine without an accelerator; returns the shims applied.

    Idempotent. On a machine with an accelerator it changes nothing and returns [].
    """
    if has_accelerator():
        return []
    import torch

    applied: list[str] = []

    trainer_mod = _check_trainer_device()
    if not getattr(trainer_mod.Trainer.setup_model, "_speculators_compat", False):
        original_setup_model = trainer_mod.Trainer.setup_model

        def setup_model(self):  # Trainer.setup_model, on CPU
            self.local_rank = torch.device("cpu")
            self.device_type = "cpu"
            return original_setup_model(self)

        setup_model._speculators_compat = True  # type: ignore[attr-defined]
        setup_model._speculators_compat_original = original_setup_model  # type: ignore[attr-defined]
        trainer_mod.Trainer.setup_model = setup_model
    applied.append("trainer-device")

    trainer_mod = _check_step_timer()
    if not getattr(trainer_mod._StepTimer, "_speculators_compat", False):
        base = trainer_mod._StepTimer

        class CpuStepTimer(base):  # type: ignore[misc,valid-type]
            """speculators' step timer without the accelerator synchronization."""

            _speculators_compat = True
            _speculators_compat_original = base

            def mark(self, name: str) -> None:
                if self.enabled:
                    self._marks[name] = _perf_counter()

            def now(self) -> float | None:
                return _perf_counter() if self.enabled else None

        trainer_mod._StepTimer = CpuStepTimer
    applied.append("step-timer-sync")

    ckpt_mod = _check_resume_device()
    if not getattr(ckpt_mod.get_current_device, "_speculators_compat", False):

        def get_current_device() -> str:
            return "cpu"

        get_current_device._speculators_compat = True  # type: ignore[attr-defined]
        get_current_device._speculators_compat_original = ckpt_mod.get_current_device  # type: ignore[attr-defined]
        ckpt_mod.get_current_device = get_current_device
    applied.append("resume-device")
    return applied


def set_flex_kernel_options(kernel_options: dict[str, int] | None) -> None:
    """Make speculators' flex attention pass `kernel_options` to torch's flex_attention (None:
    torch's defaults). Idempotent."""
    import functools

    attn_mod = _check_flex_kernel_options()
    original = getattr(attn_mod.flex_attention, "_speculators_compat_original", attn_mod.flex_attention)
    if kernel_options is None:
        attn_mod.flex_attention = original
        return
    patched = functools.partial(original, kernel_options=dict(kernel_options))
    patched._speculators_compat_original = original  # type: ignore[attr-defined]
    attn_mod.flex_attention = patched


HARMLESS_MASK_TOKEN_ID = 0  # EAGLE-3 never embeds the mask token (checked by _check_mask_token)


def mask_token_id(verifier: str, vocab_size: int, trust_remote_code: bool = False) -> tuple[int, str]:
    """speculators' resolve_mask_token_id order (tokenizer's mask token; the id <|MASK|> would get
    while the embedding has unused rows; pad/eos/unk), from the tokenizer alone, never the
    processor. Without a loadable tokenizer: the config's pad/eos, else HARMLESS_MASK_TOKEN_ID.
    Returns (id, where it came from) for the stage's log."""
    _check_mask_token()
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(verifier, trust_remote_code=trust_remote_code)
    except Exception as e:  # no tokenizer files, or one this environment cannot load
        reason = f"no loadable tokenizer ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
    else:
        if tokenizer.mask_token_id is not None:
            return tokenizer.mask_token_id, "the tokenizer's mask token"
        if len(tokenizer) < vocab_size:  # as speculators does, on this throwaway tokenizer
            tokenizer.add_special_tokens({"mask_token": "<|MASK|>"})
            return tokenizer.mask_token_id, f"a new <|MASK|> in an unused embedding row (vocab {vocab_size})"
        for name in ("pad_token_id", "eos_token_id", "unk_token_id"):
            if getattr(tokenizer, name, None) is not None:
                return getattr(tokenizer, name), f"the tokenizer's {name}"
        reason = "the tokenizer has no mask, pad, eos or unk token"
    config = AutoConfig.from_pretrained(verifier, trust_remote_code=trust_remote_code)
    config = getattr(config, "text_config", None) or config
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int):
            return value, f"the config's {name} ({reason})"
    return HARMLESS_MASK_TOKEN_ID, f"{HARMLESS_MASK_TOKEN_ID}, harmless: EAGLE-3 never reads it ({reason})"


def _perf_counter() -> float:
    import time

    return time.perf_counter()


class MetricsBridge(logging.Handler):
    """Hands speculators' metric dicts to `on_train(step, record)` / `on_val(epoch, step, record)`.

    Records: train {"train": {...}, "profile": {...} | None, "epoch", "lr", "global_step"};
    val {"val": {...}, "epoch"}; the logger's `extra={"step": ...}` gives the global step.
    """

    def __init__(self, on_train: Callable[[int, dict], None], on_val: Callable[[int, int, dict], None]):
        super().__init__(level=logging.INFO)
        self.on_train = on_train
        self.on_val = on_val

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if not isinstance(msg, dict):
            return
        try:
            if "train" in msg and isinstance(msg["train"], dict):
                self.on_train(int(msg.get("global_step", getattr(record, "step", 0))), msg)
            elif "val" in msg and isinstance(msg["val"], dict):
                self.on_val(int(msg.get("epoch", 0)), int(getattr(record, "step", 0)), msg)
        except Exception:  # a reporting error must never stop training
            self.handleError(record)

    def attach(self) -> "MetricsBridge":
        _check_metrics_bridge()
        logger = logging.getLogger("speculators.metrics")
        if self not in logger.handlers:
            logger.addHandler(self)
        logger.setLevel(logging.INFO)
        return self

    def detach(self) -> None:
        logging.getLogger("speculators.metrics").removeHandler(self)


def partial_validation(trainer, max_batches: int) -> dict[str, float]:
    """speculators' validation metrics over the first `max_batches` validation batches of each
    rank (val_epoch's forward, without its logging); every rank must call it at the same step.
    Leaves the model in training mode."""
    import torch
    import torch.distributed as dist

    trainer_mod = _check_tau_probe()
    from speculators.train.utils import normalize_counted_metrics

    if trainer.val_loader is None:
        return {}
    accumulated: dict[str, Any] = {}
    batches = min(max_batches, len(trainer.val_loader))
    trainer.model.eval()
    try:
        with torch.no_grad():
            for _, batch in zip(range(batches), trainer.val_loader):
                gpu_batch = {k: v.to(trainer.local_rank, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                with torch.autocast(trainer.device_type, dtype=trainer.config.hidden_states_dtype):
                    _tokens, _loss, metrics = trainer.model(**gpu_batch, **(trainer.config.val_call_kwargs or {}))
                for k, v in metrics.items():
                    accumulated[k] = v.float() if k not in accumulated else accumulated[k] + v.float()
    finally:
        trainer.model.train()
    if trainer.is_distributed and accumulated:
        accumulated = trainer_mod._all_reduce_metrics(accumulated)
    values = {k: v.item() / max(1, batches) for k, v in accumulated.items()}
    return normalize_counted_metrics(values, dist.get_world_size() if trainer.is_distributed else 1)


def hook_main(
    before_training: Callable[..., None],
    bridge: MetricsBridge | None = None,
    every_steps: tuple[int, Callable[[Any], None]] | None = None,
    stop_after: Callable[[int, dict], str | None] | None = None,
) -> None:
    """Make speculators.train.cli.main call `before_training(draft_model, trainer_config,
    train_loader, val_loader)` (Trainer's own arguments) before its Trainer is
    built, and attach `bridge` right after main configures its metric logger. `every_steps`
    (n, probe): call `probe(trainer)` on every rank after each n-th optimizer step. `stop_after`
    (epoch, validation metrics) -> a reason to stop, or None: asked on every rank after each
    epoch's validation; a reason raises StopTraining (shim 'early-stop'). A run that has taken its
    max_steps stops after that epoch's checkpoint and validation the same way: speculators' epoch
    loop does not look at max_steps, so each epoch left would train one more step, save one more
    checkpoint and validate again. Idempotent: a later call replaces the earlier hooks."""
    cli_mod = _check_main_hooks()
    _check_metrics_bridge()
    if every_steps is not None:
        _check_tau_probe()
    _check_early_stop()
    from speculators.train.trainer import Trainer

    class GuardedTrainer(Trainer):  # type: ignore[misc,valid-type]
        """speculators' Trainer, after our preflight guards have seen the model."""

        def __init__(self, model, *args, **kwargs):
            before_training(model, *args, **kwargs)  # (model, trainer_config, train_loader, val_loader)
            super().__init__(model, *args, **kwargs)

        def train_epoch(self, epoch, *, step_callback=None):
            if every_steps is None:
                return super().train_epoch(epoch, step_callback=step_callback)
            n, probe = every_steps

            def after_step() -> None:
                if step_callback is not None:
                    step_callback()
                if self.global_step % n == 0:
                    probe(self)

            return super().train_epoch(epoch, step_callback=after_step)

        def val_epoch(self, epoch):
            metrics = super().val_epoch(epoch)
            reason = stop_after(epoch, metrics or {}) if stop_after is not None else None
            if reason:
                raise StopTraining(epoch, reason)
            max_steps = self.config.max_steps
            if max_steps is not None and self.global_step >= max_steps and epoch + 1 < self.config.num_epochs:
                raise StopTraining(epoch, f"--max-steps {max_steps} taken", early=False)
            return metrics

    cli_mod.Trainer = GuardedTrainer

    original = getattr(cli_mod.setup_metric_logger, "_speculators_compat_original", cli_mod.setup_metric_logger)

    def setup_metric_logger(*args, **kwargs):
        result = original(*args, **kwargs)
        if bridge is not None:
            bridge.attach()
        return result

    setup_metric_logger._speculators_compat_original = original  # type: ignore[attr-defined]
    cli_mod.setup_metric_logger = setup_metric_logger


# --- endpoint -------------------------------------------------------------------------------------

SOCKET_ENV = "HARNESS_VLLM_SOCKET"  # our server's unix socket (common/vllm_server.py sets it for its clients)


def our_server_socket() -> str | None:
    """Where reach_our_server() sends openai's clients, for a person ("unix socket PATH"), None: to their URL."""
    import os

    uds = os.environ.get(SOCKET_ENV)
    return f"unix socket {uds}" if uds and os.environ.get("VLLM_API_KEY") else None


def reach_our_server() -> bool:
    """The endpoint shim: openai's clients made with api_key="EMPTY" send VLLM_API_KEY instead,
    and connect to HARNESS_VLLM_SOCKET where it is set (the URL's host is then only a name). A
    no-op (False) without the key. Idempotent."""
    import os

    key = os.environ.get("VLLM_API_KEY")
    if not key:
        return False
    import openai

    if getattr(openai.OpenAI, "_speculators_compat", False):
        return True
    (sync, sync_client, sync_transport), (asynchronous, async_client, async_transport) = _check_endpoint()
    uds = os.environ.get(SOCKET_ENV)

    def ours(base, client, transport):
        class Ours(base):
            _speculators_compat = True

            def __init__(self, *args, api_key=None, http_client=None, **kwargs):
                if uds and http_client is None:
                    http_client = client(transport=transport(uds=uds, limits=openai.DEFAULT_CONNECTION_LIMITS))
                super().__init__(*args, api_key=key if api_key == "EMPTY" else api_key, http_client=http_client, **kwargs)

        Ours.__name__ = Ours.__qualname__ = base.__name__
        return Ours

    openai.OpenAI = ours(sync, sync_client, sync_transport)
    openai.AsyncOpenAI = ours(asynchronous, async_client, async_transport)
    return True


if __name__ == "__main__":  # python speculators_compat.py SUBCOMMAND ...: speculators' CLI, keyed
    import os
    import runpy
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]  # our modules shadow nothing
    reach_our_server()
    sys.argv[0] = "speculators"
    runpy.run_module("speculators", run_name="__main__")
