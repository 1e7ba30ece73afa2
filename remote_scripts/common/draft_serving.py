"""Serving an exported draft with vLLM: what to start, whether this vLLM can, and greedy requests.

The export (export.py) is speculators' format with the verifier's absolute path in config.json;
vLLM serves it beside its verifier with

    vllm serve VERIFIER --speculative-config '{"method": "eagle3", "model": EXPORT, "num_speculative_tokens": K}'

(vllm/config/speculative.py: method "eagle3", `model` the draft's directory). serve_check.py
(served acceptance, a stage) and serve_draft.py (`harness serve`) both start it through
common/vllm_server.py's ManagedServer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from common.vllm_server import ServeOptions, auth_headers, http_request



class ServeCheckError(RuntimeError):
    """A problem with the inputs, reported as one line."""


@dataclass(frozen=True)
class Export:
    directory: str  # absolute
    verifier: str  # absolute, as export.py recorded it
    speculative_tokens: int

    def speculative_config(self, k: int | None = None) -> dict:
        return {"method": "eagle3", "model": self.directory, "num_speculative_tokens": k or self.speculative_tokens}

    def serve_args(self, k: int | None = None) -> list[str]:
        return ["--speculative-config", json.dumps(self.speculative_config(k))]


def read_export(directory: str | Path) -> Export:
    """The export's verifier and K, from export.json (export.py's manifest), else its config.json."""
    path = Path(directory).resolve()
    manifest, config = path / "export.json", path / "config.json"
    if not config.is_file():
        raise ServeCheckError(f"--export {path}: no config.json (run the export stage first)")
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        return Export(str(path), str(data["verifier"]), int(data["num_speculative_tokens"]))
    cfg = json.loads(config.read_text())
    spec = cfg.get("speculators_config") or {}
    verifier = (spec.get("verifier") or {}).get("name_or_path")
    methods = spec.get("proposal_methods") or [{}]
    if not verifier:
        raise ServeCheckError(f"{config}: no speculators_config.verifier.name_or_path")
    return Export(str(path), str(verifier), int(methods[0].get("speculative_tokens") or 3))


def _model_config(model_dir: str, key: str | None = None) -> Any:
    """A model's config.json (its `key` section when given) as attributes, for vllm_compat's rule."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get(key) or {} if key else cfg
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, "text_config": SimpleNamespace(**cfg["text_config"])}
    return SimpleNamespace(**cfg)


def cannot_serve(export: Export, distribution: str | None) -> str | None:
    """Why this vLLM cannot serve the verifier with its draft (one line), or None: vllm_compat's
    rule (the head sizes the installed CPU build's attention serves) on both models."""
    from common.vllm_compat import unservable_reason

    for what, config in (("verifier", _model_config(export.verifier)), ("draft", _model_config(export.directory, "transformer_layer_config"))):
        reason = config is not None and unservable_reason(config, distribution, what=what)
        if reason:
            return reason
    return None


def complete(server: ServeOptions, model: str, prompt: list[int], max_tokens: int, timeout: float) -> dict:
    """One greedy completion of a token-id prompt: {"token_ids": [...], "completion_tokens": n}."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "return_token_ids": True}
    status, reply = http_request(server, "POST", "/v1/completions", {"Content-Type": "application/json", **auth_headers()}, json.dumps(body).encode(), timeout)
    if status != 200:
        raise OSError(f"POST /v1/completions: HTTP {status}: {reply[:300].decode('utf-8', 'replace')}")
    answer = json.loads(reply)
    choice = answer["choices"][0]
    usage = answer.get("usage") or {}
    ids = choice.get("token_ids")
    return {"token_ids": ids, "completion_tokens": int(usage.get("completion_tokens") if usage.get("completion_tokens") is not None else len(ids or []))}


# Where vLLM takes a batch-size schedule of k, and where it drops one: read in the installed source
# (no import: vllm's takes seconds). 0.32.0: SpeculativeConfig.num_speculative_tokens_per_batch_size,
# dropped under data parallelism by VllmConfig._maybe_disable_dynamic_sd_for_data_parallel.
SCHEDULE_FIELD = "num_speculative_tokens_per_batch_size"
SCHEDULE_DROPPED_UNDER_DP = "_maybe_disable_dynamic_sd_for_data_parallel"


def installed_vllm_source(relative: str) -> str | None:
    """The text of one file of the installed vllm package (e.g. "config/speculative.py"), or None."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / relative
        if path.is_file():
            return path.read_text(errors="replace")
    return None


def schedule_unsupported(data_parallel_size: int) -> str | None:
    """None where the installed vLLM serves a batch-size schedule of k at this data parallelism,
    else why not (one clause)."""
    speculative = installed_vllm_source("config/speculative.py")
    if speculative is None:
        return "the installed vLLM's source was not found to check for a batch-size schedule of k"
    if SCHEDULE_FIELD not in speculative:
        return f"the installed vLLM has no {SCHEDULE_FIELD} (a batch-size schedule of k)"
    if data_parallel_size > 1 and SCHEDULE_DROPPED_UNDER_DP in (installed_vllm_source("config/vllm.py") or ""):
        return f"the installed vLLM drops {SCHEDULE_FIELD} under data parallelism (--data-parallel-size {data_parallel_size})"
    return None
