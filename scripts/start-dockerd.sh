#!/usr/bin/env bash
# Start dockerd in the background unless an engine already answers. Idempotent.
# The logic (overlay2 where the kernel allows it, else vfs) lives in tests/fixtures/docker_engine.py,
# which the test session's docker_engine fixture uses too.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m tests.fixtures.docker_engine --start "$@"
