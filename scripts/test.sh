#!/usr/bin/env bash
# The whole test set-up and run on a fresh Debian machine (as root), then the tests.
#   scripts/test.sh [pytest args...]
# Installs: openssh-server (the tests start their own sshd on loopback), docker.io (dockerd is
# started here if not running), debootstrap (the offline base image for container tests),
# rsync (a comparison in benches), iproute2 (network-namespace test hosts); then the Python
# packages (scripts/setup.sh --dev). Then ruff (a finding fails the run), then pytest; pytest's
# exit code 5 ("no tests collected") is a failure. Under CI=true (.ci/run) a test bed that cannot
# start fails its tests; otherwise they are skipped and listed in a block at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pair in sshd:openssh-server ssh:openssh-client dockerd:docker.io debootstrap:debootstrap rsync:rsync ip:iproute2; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || need_apt+=("${pair##*:}")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== apt-get install ${need_apt[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null
fi
mkdir -p /run/sshd

echo "== python packages"
scripts/setup.sh --dev

echo "== docker engine"
scripts/start-dockerd.sh

echo "== offline base image for container tests"
scripts/make-test-base-image.sh

echo "== ruff"
python3 -m ruff check .

echo "== pytest"
set +e
python3 -m pytest -q -rs "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
