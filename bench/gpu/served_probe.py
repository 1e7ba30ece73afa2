#!/usr/bin/env python3
"""A served figure on a GPU without the whole chain (when it cannot finish in a session's device time): vLLM serves the verifier
alone, then with a draft checkpoint at k, each sent the held-out prompts one at a time (greedy,
up to 64 tokens); prints tokens/s of each, the ratio and served tau from vLLM's counters.
    python bench/gpu/served_probe.py VERIFIER DRAFT CHAT_JSONL [--k 3] [--prompts 32] [--method eagle3|ngram] [--graphs]
--method ngram: vLLM's prompt-lookup speculation instead of the draft (no model: a control that tells vLLM's own cost
of a speculative step apart from the draft's); --graphs: torch.compile and CUDA graphs instead of --enforce-eager."""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

p = argparse.ArgumentParser()
p.add_argument("verifier")
p.add_argument("draft", help="a draft vLLM loads (a speculators checkpoint or the export stage's)")
p.add_argument("chat", help="bench/quality/prompts.py's rows: the heldout split is sent")
p.add_argument("--k", type=int, default=3)
p.add_argument("--prompts", type=int, default=32)
p.add_argument("--port", type=int, default=8123)
p.add_argument("--method", choices=["eagle3", "ngram"], default="eagle3")
p.add_argument("--graphs", action="store_true")
a = p.parse_args()
rows = [json.loads(line) for line in open(a.chat)]
prompts = [r["messages"] for r in rows if r["split"] == "heldout"][: a.prompts]
base = f"http://127.0.0.1:{a.port}"


def get(path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return r.read().decode()


def serve(spec):
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", a.verifier, "--port", str(a.port), "--host", "127.0.0.1", *([] if a.graphs else ["--enforce-eager"]),
            "--gpu-memory-utilization", "0.3", "--max-model-len", "2048", "--served-model-name", "m"] + (["--speculative-config", json.dumps(spec)] if spec else [])
    log = open(f"/tmp/probe-{'draft' if spec else 'alone'}.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 200:
        if proc.poll() is not None:
            raise SystemExit(f"vllm exited {proc.returncode}: " + open(log.name).read()[-1500:])
        try:
            get("/health")
            break
        except Exception:
            time.sleep(2)
    else:
        raise SystemExit("not healthy in 200 s")
    print(f"{'draft' if spec else 'alone'}: healthy after {time.monotonic() - t0:.0f} s", flush=True)
    return proc


def send():
    tokens, t0 = 0, time.monotonic()
    for messages in prompts:
        body = json.dumps({"model": "m", "messages": messages, "max_tokens": 64, "temperature": 0}).encode()
        req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            tokens += json.loads(r.read())["usage"]["completion_tokens"]
    return tokens, time.monotonic() - t0


def counter(text, name):
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


result = {}
SPEC = {"eagle3": {"method": "eagle3", "model": a.draft, "num_speculative_tokens": a.k},
        "ngram": {"method": "ngram", "num_speculative_tokens": a.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}}
for spec in (None, SPEC[a.method]):
    proc = serve(spec)
    try:
        send()  # warm-up round
        rounds = [send() for _ in range(2)]
        metrics = get("/metrics")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(60)
    name = "draft" if spec else "alone"
    result[name] = {"tokens_per_s": [t / s for t, s in rounds]}
    if spec:
        drafts, accepted = counter(metrics, "vllm:spec_decode_num_drafts_total"), counter(metrics, "vllm:spec_decode_num_accepted_tokens_total")
        result[name].update(drafts=drafts, accepted=accepted, served_tau=1 + accepted / drafts if drafts else None)
    print(name, json.dumps(result[name]), flush=True)
alone, draft = result["alone"]["tokens_per_s"], result["draft"]["tokens_per_s"]
print(json.dumps({"k": a.k, "prompts": len(prompts), "speedup_c1": sum(draft) / sum(alone), "rounds": {"alone": alone, "draft": draft},
                  "served_tau": result["draft"].get("served_tau")}))
