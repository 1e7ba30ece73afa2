"""Can the transformers extraction backend run this verifier's quantization? Decided from the
config alone, before any weight is loaded.

Released large verifiers are often quantized (Kimi-K2.5: INT4 compressed-tensors). transformers
loads a `quantization_config` through a quantizer that needs its own package (compressed-tensors,
optimum, gptqmodel, accelerate, bitsandbytes ...) and sometimes particular hardware. Rather than
keep our own table, this asks transformers' quantizer for that method to validate the
environment, the check from_pretrained runs first, and turns its answer into one line that names
the way out (the vLLM backend) when the answer is no.

harness/host_helpers/ml_probe.py asks the same question for `harness doctor` (it cannot import this
module: it runs before remote_scripts/ is synced).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VLLM_HINT = 'use the vLLM backend: extract --backend vllm ([pipeline.stages.extract] backend = "vllm")'


@dataclass(frozen=True)
class QuantizationVerdict:
    method: str
    runs: bool  # the transformers backend can load it here
    detail: str  # the quantizer that runs it, or why none can

    def line(self) -> str:
        if self.runs:
            return f"the verifier is quantized ({self.method}): the transformers backend loads it through {self.detail}"
        return f"the verifier is quantized ({self.method}) and the transformers backend cannot run it here ({self.detail}); {VLLM_HINT}"


def quantization_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's quantization_config, at the top level or under text_config."""
    for holder in (config, config.get("text_config") or {}):
        qc = holder.get("quantization_config") if isinstance(holder, dict) else None
        if isinstance(qc, dict) and qc:
            return qc
    return None


def read_config(verifier: str, trust_remote_code: bool = False) -> dict[str, Any]:
    """The verifier's config as a dict: its config.json, or AutoConfig's for a hub id."""
    config_path = Path(verifier) / "config.json"
    if config_path.is_file():
        return json.loads(config_path.read_text())
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(verifier, trust_remote_code=trust_remote_code).to_dict()


def method_of(qc: dict[str, Any]) -> str:
    if qc.get("load_in_4bit") or qc.get("load_in_8bit"):
        return "bitsandbytes " + ("4-bit" if qc.get("load_in_4bit") else "8-bit")
    return str(qc.get("quant_method") or "unknown method")


def transformers_verdict(config: dict[str, Any], device: str = "cpu") -> QuantizationVerdict | None:
    """None for an unquantized verifier; else whether transformers' quantizer for its method
    validates in this environment for `device` (its own error message when not)."""
    qc = quantization_config(config)
    if qc is None:
        return None
    method = method_of(qc)
    try:
        from transformers.quantizers.auto import AutoHfQuantizer

        quantizer = AutoHfQuantizer.from_config(dict(qc), pre_quantized=True)
        quantizer.validate_environment(device_map={"": device}, dtype=None)
    except Exception as e:  # ImportError (missing package), ValueError (unknown method, no GPU) ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return QuantizationVerdict(method, False, first[:300])
    return QuantizationVerdict(method, True, f"transformers' {type(quantizer).__name__}")


def loading_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """Extra from_pretrained arguments for a quantized verifier the transformers backend runs.

    compressed-tensors leaves packed weights (Kimi-K2.5's INT4 `weight_packed`) in place until a
    pre-hook on the WHOLE model's first forward unpacks them; the extractor calls the text model
    inside it, whose Linear layers would have no `weight`. `dequantize=True`, a loading attribute
    transformers merges into the checkpoint's own quantization_config, unpacks them at load
    instead: the same values, in the load dtype (so the memory of an unquantized model)."""
    qc = quantization_config(config)
    if qc is None or method_of(qc) != "compressed-tensors":
        return {}
    from transformers import CompressedTensorsConfig

    return {"quantization_config": CompressedTensorsConfig(dequantize=True)}
