#!/usr/bin/env bash
# Installs what memtrade needs and is missing, from Debian's packages; silent when nothing is.
#
# Python: reports and the PyTorch peer use Debian's /usr/bin/python3 with python3-numpy,
# python3-matplotlib, python3-pytest and python3-torch (the PyTorch reference in the tests and
# the peer benchmarks), so one package manager serves both the C++ and the Python side. The pyenv python3 on PATH is not used.
#
# Usage: ci/setup.sh [extra Debian packages...]
set -euo pipefail

packages=(
  cmake make g++ git pkg-config clang-format
  libfmt-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
  libopenblas-openmp-dev libgtest-dev libgmock-dev libbenchmark-dev libsqlite3-dev
  python3 python3-numpy python3-matplotlib python3-pytest python3-torch python3-jsonschema
  python3-hypothesis ccache openmpi-bin libopenmpi-dev
  "$@"
)

# The PyPI packages of ci/requirements-hf.txt (Hugging Face transformers for the reference tests),
# in a folder named by that file's hash: a changed pin installs afresh, an unchanged one is silent.
# Where PyPI is unreachable the tests that need them say so and skip.
pydeps_setup() {
  local req dir
  req="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/requirements-hf.txt"
  dir="${MEMTRADE_PYDEPS:-$HOME/.cache/memtrade/pydeps-$(sha256sum "$req" | cut -c1-12)}"
  [ -f "$dir/.complete" ] && return 0
  echo "setup: installing ci/requirements-hf.txt into $dir"
  rm -rf "$dir.partial"
  if /usr/bin/python3 -m pip install -q --disable-pip-version-check --no-deps --no-compile \
      --target "$dir.partial" -r "$req" >"$dir.log" 2>&1; then
    rm -rf "$dir" && mv "$dir.partial" "$dir" && touch "$dir/.complete" && rm -f "$dir.log"
  else
    echo "setup: pip could not install ci/requirements-hf.txt (see $dir.log); the HF tests skip" >&2
    rm -rf "$dir.partial"
  fi
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  mkdir -p "$HOME/.cache/memtrade" && pydeps_setup
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then sudo="sudo"; else
    echo "setup: missing packages (${missing[*]}) and not root; install them and rerun" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "setup: apt-get failed" >&2
  exit 1
fi
rm -f "$log"
mkdir -p "$HOME/.cache/memtrade" && pydeps_setup
