#!/usr/bin/env bash
# Start dockerd in the background unless an engine already answers. Idempotent.
# The logic (overlay2 where the kernel allows it, else vfs) lives in tests/fixtures/dockerd.py (the
# standard library alone: it runs before the project's environment exists), which the test
# session's docker_engine fixture uses too.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m tests.fixtures.dockerd --start "$@"
