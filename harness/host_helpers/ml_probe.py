"""Gather the ML facts `harness doctor` judges, in ONE run of the stage interpreter.

Run by harness.helpers in the host's runtime, its request on stdin (inside the container when
runtime = "docker", so it sees the image's libraries and the GPUs the container gets). STDLIB
ONLY at the top level: torch is imported inside a guard, so a broken or missing torch is a fact to
report, not a crash. It judges nothing; harness/doctor/ml_checks.py does.

Request: {"verifier": path, "prepared": path, "data": path, "flex": true, "head_dim": null,
          "private_network": the source of remote_scripts/common/private_network.py, or null}
(paths relative to the working directory, which is the workdir)
Result: one line on stdout, MARKER + JSON: versions, nvidia_smi, torch, flex, verifier, samples,
private_network.
Their fields: docs/architecture/host-helpers.md, "Host helpers' requests and replies".
"""

import glob
import json
import os
import re
import subprocess
import sys
import time

try:  # on the host: shipped ahead of this helper (harness/host_helpers/__init__.py); beside it when run by path
    import wire
except ImportError:  # loaded on the laptop (tests)
    from harness.host_helpers import wire

MARKER = "@@harness-ml-probe@@ "
DISTRIBUTIONS = ("torch", "transformers", "speculators", "vllm", "triton", "datasets", "safetensors")
# The smaller flex tiles to retry with when the default ones need more shared memory than the
# GPU has per block (sm_120 workstation Blackwell: ~99 KiB vs ~227 KiB on H100).
# fwd_/bwd_ prefixes scope an option to one kernel (torch/_inductor/kernel/flex/flex_attention.py).
SMALL_TILES = {
    "fwd_BLOCK_M": 32, "fwd_BLOCK_N": 32, "fwd_num_stages": 1,
    "bwd_BLOCK_M1": 16, "bwd_BLOCK_N1": 32, "bwd_BLOCK_M2": 32, "bwd_BLOCK_N2": 16, "bwd_num_stages": 1,
}


def last_line(text):
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else ""


def versions():
    try:
        import importlib.metadata as metadata
    except ImportError:
        return {name: None for name in DISTRIBUTIONS}
    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except Exception:
            found[name] = None
    return found


def nvidia_smi():
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
        )
    except FileNotFoundError:
        return {"found": False, "exit_code": 127, "gpus": [], "error": "nvidia-smi not found"}
    except subprocess.TimeoutExpired:
        return {"found": True, "exit_code": None, "gpus": [], "error": "nvidia-smi timed out after 60 s"}
    out = r.stdout.decode("utf-8", "replace")
    gpus = [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]
    error = "" if r.returncode == 0 else (last_line(r.stderr.decode("utf-8", "replace")) or last_line(out))
    return {"found": True, "exit_code": r.returncode, "gpus": gpus if r.returncode == 0 else [], "error": error}


def torch_facts():
    try:
        import torch
    except BaseException as e:  # a broken install raises anything from OSError to SystemExit
        return None, {"import_error": "%s: %s" % (type(e).__name__, last_line(e))}
    facts = {"version": torch.__version__, "cuda_version": getattr(torch.version, "cuda", None), "devices": []}
    try:
        facts["cuda_available"] = bool(torch.cuda.is_available())
    except Exception as e:
        facts["cuda_available"], facts["cuda_error"] = False, last_line(e)
    if facts["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            facts["devices"].append({
                "name": p.name,
                "capability": [p.major, p.minor],
                "total_memory": p.total_memory,
                # what Triton may use per block (the opt-in maximum); None when torch lacks it
                "smem_per_block_optin": getattr(p, "shared_memory_per_block_optin", None),
            })
    return torch, facts


def flex_facts(torch, cuda, head_dim):
    """A tiny causal flex_attention forward + backward with a BlockMask (under torch.compile
    on a GPU), at the verifier's head dimension: shared memory needs grow with it."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:
        return {"status": "failed", "device": None, "error": "cannot import flex_attention: %s: %s" % (type(e).__name__, last_line(e))}
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32

    def causal(b, h, q, kv):
        return q >= kv

    def attempt(kernel_options):
        torch._dynamo.reset()
        shape = (1, 2, 256, head_dim)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        mask = create_block_mask(causal, 1, 1, 256, 256, device=device)
        # On the GPU: compiled, as training runs it. On the CPU, eager is enough to learn that
        # the backward is unsupported (compiling first would only take longer to say so).
        run = torch.compile(flex_attention) if cuda else flex_attention
        started = time.time()
        try:
            out = run(q, k, v, block_mask=mask, kernel_options=kernel_options) if kernel_options else run(q, k, v, block_mask=mask)
            out.sum().backward()
            if cuda:
                torch.cuda.synchronize()
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            text = "%s: %s" % (type(e).__name__, e)
            failed = {"status": "failed", "error": last_line(text) if len(text) > 500 else text.strip(), "elapsed_s": round(time.time() - started, 2)}
            numbers = shared_memory_numbers(text)  # from the whole message: it is long
            if numbers:
                failed["smem_required"], failed["smem_limit"] = numbers
                failed["error"] = "out of shared memory: %s" % failed["error"]
            return failed
        return {"status": "ok", "elapsed_s": round(time.time() - started, 2)}

    result = attempt(None)
    result["device"] = device
    result["head_dim"] = head_dim
    if result["status"] == "failed":
        # 'No valid triton configs. OutOfResources: out of resource: shared memory, Required: 106496, Hardware limit: 101376'
        if cuda and ("smem_required" in result or "No valid triton configs" in result["error"] or "shared memory" in result["error"]):
            retry = attempt(dict(SMALL_TILES))
            retry["kernel_options"] = dict(SMALL_TILES)
            result["small_tiles"] = retry
    return result


def shared_memory_numbers(error):
    """(required, limit) bytes from Triton's out-of-resource message, e.g. 'No valid triton
    configs. OutOfResources: out of resource: shared memory, Required: 106496, Hardware limit:
    101376', or None."""
    m = re.search(r"Required:?\s*(\d+),?\s*(?:Hardware\s+)?limit:?\s*(\d+)", error, re.IGNORECASE)
    return (int(m.group(1)), int(m.group(2))) if m else None


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def verifier_facts(path):
    facts = {"path": path, "found": False}
    local = os.path.expanduser(path)  # `~/x` is a directory here, never a hub id
    config_path = os.path.join(local, "config.json") if os.path.isdir(local) else None
    if config_path is None and wire.is_hub_id(path):
        try:  # a hub id: its config.json in the Hugging Face cache, if downloaded
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "config.json")
            config_path = cached if isinstance(cached, str) else None
        except Exception:
            config_path = None
    if not config_path or not os.path.isfile(config_path):
        facts["error"] = "no config.json at %s" % path
        return facts
    try:
        config = read_json(config_path)
    except (OSError, ValueError) as e:
        facts["error"] = "unreadable %s: %s" % (config_path, e)
        return facts
    facts["found"] = True
    facts["model_type"] = config.get("model_type")
    text = config.get("text_config")
    facts["nested_text_config"] = isinstance(text, dict)
    layer = text if isinstance(text, dict) else config
    facts["text_model_type"] = layer.get("model_type")
    # transformers 5 writes "dtype"; older configs "torch_dtype"; the outer config may hold it
    facts["dtype"] = layer.get("dtype") or layer.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype")
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim"):
        facts[key] = layer.get(key)
    if not facts.get("head_dim") and facts.get("hidden_size") and facts.get("num_attention_heads"):
        facts["head_dim"] = facts["hidden_size"] // facts["num_attention_heads"]
    facts["auto_map"] = auto_map_files(os.path.dirname(config_path), config)
    facts["quantization_config"] = next((h["quantization_config"] for h in (config, layer) if isinstance(h.get("quantization_config"), dict) and h["quantization_config"]), None)
    return facts


def auto_map_files(directory, config):
    """The verifier's files that declare `auto_map` (code of its own that transformers would run)."""
    found = ["config.json"] if config.get("auto_map") or (config.get("text_config") or {}).get("auto_map") else []
    for name in ("tokenizer_config.json", "processor_config.json", "preprocessor_config.json"):
        path = os.path.join(directory, name)
        try:
            if os.path.isfile(path) and read_json(path).get("auto_map"):
                found.append(name)
        except (OSError, ValueError):
            pass
    return found


def quantization_facts(qc, device):
    """Whether transformers' quantizer for the verifier's quantization_config validates here (the
    check from_pretrained runs first); remote_scripts/common/quantization.py asks the same."""
    method = qc.get("quant_method") or ("bitsandbytes" if qc.get("load_in_4bit") or qc.get("load_in_8bit") else "unknown method")
    try:
        from transformers.quantizers.auto import AutoHfQuantizer

        quantizer = AutoHfQuantizer.from_config(dict(qc), pre_quantized=True)
        quantizer.validate_environment(device_map={"": device}, dtype=None)
    except Exception as e:
        return {"method": method, "runs": False, "detail": last_line(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)}
    return {"method": method, "runs": True, "detail": "transformers' %s" % type(quantizer).__name__}


def sample_facts(prepared, data):
    """How many samples the run extracts: rows of the prepared dataset, else lines of the data."""
    if prepared and os.path.isdir(prepared):
        arrows = sorted(glob.glob(os.path.join(prepared, "**", "*.arrow"), recursive=True))
        if arrows:
            try:
                import pyarrow as pa

                rows = 0
                for path in arrows:
                    with pa.memory_map(path) as source:
                        try:
                            reader = pa.ipc.open_stream(source)
                        except pa.ArrowInvalid:
                            reader = pa.ipc.open_file(source)
                            rows += sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
                            continue
                        rows += sum(batch.num_rows for batch in reader)
                return {"count": rows, "source": "rows of the prepared dataset %s" % prepared}
            except Exception:
                pass  # no pyarrow, or files it cannot read: count the lines below instead
        for name in ("samples.jsonl", "data.jsonl"):
            jsonl = os.path.join(prepared, name)
            if os.path.isfile(jsonl):
                return {"count": count_lines(jsonl), "source": "lines of %s" % jsonl}
    if data and os.path.isfile(data):
        return {"count": count_lines(data), "source": "lines of the chat data %s" % data}
    return {"count": None, "source": "neither prepared data (%s) nor chat data (%s) exist yet" % (prepared, data)}


def private_network_facts(source):
    """Whether a server could have a network namespace of its own here: remote_scripts/common/
    private_network.py's own --check, its source sent in the request (None: not sent)."""
    if not source:
        return None
    try:
        done = subprocess.run([sys.executable, "-c", source, "--check"], capture_output=True, text=True, timeout=60)
    except Exception as e:
        return {"allowed": False, "reason": last_line(e)}
    return {"allowed": done.returncode == 0, "reason": last_line(done.stderr)}


def count_lines(path):
    n = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                n += 1
    return n


def main(argv):
    started = time.time()
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # libraries printing at import must not corrupt the answer
    request = json.loads(argv[1] if len(argv) > 1 else sys.stdin.read())
    result = {"python": sys.version.split()[0], "executable": sys.executable}
    result["versions"] = versions()
    result["nvidia_smi"] = nvidia_smi()
    torch, result["torch"] = torch_facts()
    result["verifier"] = verifier_facts(request.get("verifier") or "")
    head_dim = request.get("head_dim") or result["verifier"].get("head_dim") or 128
    if torch is None:
        result["flex"] = {"status": "skipped", "reason": "torch does not import"}
    elif not request.get("flex", True):
        result["flex"] = {"status": "skipped", "reason": "not requested"}
    else:
        result["flex"] = flex_facts(torch, result["torch"].get("cuda_available"), int(head_dim))
    qc = result["verifier"].get("quantization_config")
    if qc:
        result["verifier"]["quantization"] = quantization_facts(qc, "cuda" if result["torch"].get("cuda_available") else "cpu")
    result["samples"] = sample_facts(request.get("prepared"), request.get("data"))
    result["private_network"] = private_network_facts(request.get("private_network"))
    result["elapsed_s"] = round(time.time() - started, 2)
    real_stdout.write(MARKER + json.dumps(result) + "\n")
    real_stdout.flush()


if __name__ == "__main__":
    main(sys.argv)
