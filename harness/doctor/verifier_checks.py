"""Doctor verdicts on what the verifier checkpoint asks of the stages that load it: code of its
own (`auto_map`) and a quantization the extraction backend must be able to run. Pure functions
of the probe's facts (harness/host_helpers/ml_probe.py) and the configuration."""

from __future__ import annotations

from harness.doctor.base import CheckResult

VLLM_HINT = 'use the vLLM backend: [pipeline.stages.extract] backend = "vllm"'


def verdict_remote_code(verifier: dict, trust_remote_code: bool) -> CheckResult:
    name = "verifier-code"
    if not verifier.get("found"):
        return CheckResult(name, "warn", "not checked: no verifier config", "see the verifier check")
    files = verifier.get("auto_map") or []
    if not files:
        return CheckResult(name, "ok", "no code of its own (no auto_map)" + ("; trust_remote_code is on but unused" if trust_remote_code else ""))
    where = ", ".join(files)
    if trust_remote_code:
        return CheckResult(name, "ok", f"its own code ({where} declare auto_map) runs: [pipeline] trust_remote_code = true")
    return CheckResult(
        name, "warn",
        f"the verifier ships code of its own ({where} declare auto_map) and [pipeline] trust_remote_code is off: transformers then refuses, or builds its own tokenizer from the files (for a tiktoken.model, not necessarily with the same ids)",
        "if you trust that code, set trust_remote_code = true under [pipeline]",
    )


def verdict_quantization(verifier: dict, extract_backend: str) -> CheckResult:
    name = "verifier-quantization"
    if not verifier.get("found"):
        return CheckResult(name, "warn", "not checked: no verifier config", "see the verifier check")
    q = verifier.get("quantization")
    if not verifier.get("quantization_config") or not q:
        return CheckResult(name, "ok", "not quantized")
    if extract_backend == "vllm":
        return CheckResult(name, "ok", f"quantized ({q['method']}); extraction runs through vLLM (evaluate still loads it with transformers: {'it can' if q['runs'] else 'it cannot here'})")
    if q["runs"]:
        return CheckResult(name, "ok", f"quantized ({q['method']}): the transformers backend loads it through {q['detail']}")
    return CheckResult(name, "fail", f"quantized ({q['method']}) and the transformers extraction backend cannot run it here: {q['detail']}", VLLM_HINT)
