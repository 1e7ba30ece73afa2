#!/usr/bin/env bash
# Start dockerd in the background unless an engine already answers. Idempotent.
set -euo pipefail
if docker info >/dev/null 2>&1; then echo "dockerd already running"; exit 0; fi
log=/var/log/harness-dockerd.log
# overlay2 where the kernel allows it, else vfs (slow but works everywhere, e.g. nested containers)
for driver in overlay2 vfs; do
  nohup dockerd --host unix:///var/run/docker.sock --storage-driver "$driver" >"$log" 2>&1 &
  for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then echo "dockerd started (storage driver $driver)"; exit 0; fi
    kill -0 $! 2>/dev/null || break
    sleep 0.5
  done
  kill $! 2>/dev/null || true; sleep 1
done
echo "dockerd failed to start; see $log" >&2
tail -n 20 "$log" >&2
exit 1
