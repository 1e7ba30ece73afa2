#!/usr/bin/env bash
# The whole test set-up and run on a fresh Debian machine (as root), then the tests.
#   scripts/test.sh [pytest args...]
# Installs: openssh-server (the tests start their own sshd on loopback), docker.io (dockerd is
# started here if not running), debootstrap (the offline base image for container tests),
# rsync (a comparison in benches), iproute2 (network-namespace test hosts), tmux (a terminal
# the first-session test types into); then the Python
# packages into .venv (scripts/setup.sh --dev: the pipeline, the test tools, a real vLLM). Then
# ruff (a finding fails the run), then pytest in parallel lanes (pytest-xdist; HARNESS_TEST_LANES,
# default 3: the stages are single-threaded and many tests wait on sshd, dockerd or vLLM, so a
# third lane fills the 2 cores that two leave half idle). pytest's exit code 5 ("no tests
# collected") is a failure. Under CI=true (.ci/run) a test bed that cannot start, or a module a
# test needs, fails its tests; otherwise they are skipped, listed in pytest's block at the end and
# again, loudly, after it (the file tests/conftest.py writes them to).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh: needs root (apt, dockerd, network namespaces): run sudo scripts/test.sh" >&2
  exit 1
fi

need_apt=()
for pair in sshd:openssh-server ssh:openssh-client dockerd:docker.io debootstrap:debootstrap rsync:rsync ip:iproute2 tmux:tmux; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || need_apt+=("${pair##*:}")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== apt-get install ${need_apt[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null
fi
mkdir -p /run/sshd

# The python packages install beside the engine's start and the base image's debootstrap: neither
# needs the other, and each leaves a core idle on its own. Its output is shown when it ends.
echo "== python packages (beside the docker engine and the base image)"
setup_log=$(mktemp)
started=$SECONDS
setsid scripts/setup.sh --dev >"$setup_log" 2>&1 &  # a process group of its own, to stop it whole
setup_pid=$!
trap 'kill -- "-$setup_pid" 2>/dev/null || true; rm -f "$setup_log"' EXIT  # the engine or the image failed

echo "== docker engine"
scripts/start-dockerd.sh

echo "== offline base image for container tests"
scripts/make-test-base-image.sh

setup_rc=0
wait "$setup_pid" || setup_rc=$?
trap - EXIT
grep -v "^WARNING: Location " "$setup_log" || true
rm -f "$setup_log"
[ "$setup_rc" -eq 0 ] || { echo "scripts/test.sh: scripts/setup.sh --dev failed (exit $setup_rc): its output is above" >&2; exit 1; }
echo "(set-up of the python packages: $((SECONDS - started)) s)"
# The project's environment first on PATH: the tests' `python3`, `harness` and `ruff` are its own.
export PATH="$PWD/.venv/bin:$PATH" VIRTUAL_ENV="$PWD/.venv"

echo "== ruff"
python3 -m ruff check .

echo "== pytest"
under_ci=false
case "${CI:-}" in 1|[Tt][Rr][Uu][Ee]|[Yy][Ee][Ss]) under_ci=true ;; esac  # as tests/fixtures/beds.py reads it
$under_ci || echo "(CI is not true: a test bed that cannot start SKIPS its tests instead of failing them; they are listed at the end)"
beds_file=$(mktemp)
set +e
HARNESS_BEDS_NOT_STARTED="$beds_file" python3 -m pytest -q -rs -n "${HARNESS_TEST_LANES:-3}" --dist loadfile --no-loadscope-reorder --durations=30 "$@"
rc=$?
set -e
if [ -s "$beds_file" ]; then
  {
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo "scripts/test.sh: TEST BEDS DID NOT START: their tests were SKIPPED, not passed (CI=true fails them):"
    sed 's/^/  /' "$beds_file"
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  } >&2
fi
rm -f "$beds_file"
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
