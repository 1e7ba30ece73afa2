#!/usr/bin/env python3
"""NCCL across a box's GPUs inside a server's own network namespace (remote_scripts/common/private_network.py),
against the same in the box's network, side by side in one call, the ratio printed:

    python bench/gpu/private_network_nccl.py [--size-mib 256] [--iters 20]

What vLLM does at tensor parallel > 1 under harness: its workers bootstrap NCCL over TCP on the
only interface they have (the namespace's loopback) and then move the data over NVLink/P2P. Each
mode runs `torchrun --standalone` over every visible GPU: an all-reduce of --size-mib, timed
over --iters after a warm-up, and a bf16 matmul; rank 0 prints its bus bandwidth (nccl-tests'
definition: 2 (n-1)/n x bytes / time; 0 on one GPU, where only the CUDA and NCCL start inside
the namespace are shown), TFLOP/s, and the addresses its process listens on (NCCL's bootstrap,
torch's store): in the box's network as it is, with vllm_server's LOOPBACK_ENV (what a server
gets where a namespace is refused), and in a namespace of its own with it (every server's way).
A namespace the box refuses is a row that says why.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "remote_scripts"))
from common import private_network  # noqa: E402
from common.vllm_server import LOOPBACK_ENV  # noqa: E402

WORKER = r"""
import json, os, socket, sys, time, torch, torch.distributed as dist
size_mib, iters = int(sys.argv[1]), int(sys.argv[2])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
x = torch.ones(size_mib * 2**20 // 2, dtype=torch.bfloat16, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(x)
torch.cuda.synchronize()
seconds = (time.perf_counter() - start) / iters
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
a @ a
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(iters):
    a @ a
torch.cuda.synchronize()
tflops = 2 * 8192**3 * iters / (time.perf_counter() - t0) / 1e12
def listeners():  # where this process listens (NCCL's bootstrap, torch's store): address:port
    from common.vllm_server import held_sockets, listening_sockets  # (PYTHONPATH: remote_scripts)
    held = held_sockets("self")
    found = []
    for inode, local in listening_sockets().items():
        if inode in held:
            address, port = local.split(":")
            raw = bytes.fromhex(address)
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # the kernel's host-order words
            found.append(f"{socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)}:{int(port, 16)}")
    return sorted(found)
if rank == 0:
    print("RESULT " + json.dumps({"world": world, "listeners": listeners(), "ms": round(seconds * 1e3, 3), "busbw_gbps": round(2 * (world - 1) / world * x.numel() * 2 / seconds / 1e9, 1),
                                  "matmul_tflops": round(tflops, 1),
                                  "netns": os.readlink("/proc/self/ns/net"), "interfaces": sorted(name for _, name in socket.if_nameindex())}), flush=True)
dist.destroy_process_group()
"""


MODES = {  # mode: (in a namespace of its own, with the servers' LOOPBACK_ENV)
    "box network": (False, False),
    "box network, LOOPBACK_ENV": (False, True),
    "own namespace, LOOPBACK_ENV": (True, True),  # as vllm_server starts its servers
}


def run(mode: str, gpus: int, size_mib: int, iters: int) -> dict:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", "--no-python",
            sys.executable, "-c", WORKER, str(size_mib), str(iters)]
    own, loopback = MODES[mode]
    if own:
        reason = private_network.unavailable()
        if reason:
            return {"mode": mode, "error": reason}
        argv = private_network.wrap(argv)
    env = {**os.environ, "NCCL_DEBUG": "WARN", "PYTHONPATH": str(REPO / "remote_scripts"), **(LOOPBACK_ENV if loopback else {})}
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    rows = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not rows:
        return {"mode": mode, "error": f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:300]}"}
    return {"mode": mode, **rows[0], "wall_s": round(time.monotonic() - started, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 1:
        print("no GPU")
        return 1
    rows = [run(mode, gpus, args.size_mib, args.iters) for mode in MODES]
    for row in rows:
        print(json.dumps(row))
    box, _, own = rows
    if "error" not in box and "error" not in own:
        if gpus > 1:
            print(f"all-reduce of {args.size_mib} MiB over {gpus} GPUs: bus bandwidth {own['busbw_gbps']} GB/s in its own namespace, "
                  f"{box['busbw_gbps']} GB/s in the box's network: ratio {own['busbw_gbps'] / box['busbw_gbps']:.3f}")
        print(f"bf16 matmul 8192^3 on rank 0: {own['matmul_tflops']} TFLOP/s in its own namespace, {box['matmul_tflops']} in the box's network: "
              f"ratio {own['matmul_tflops'] / box['matmul_tflops']:.3f}")
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
