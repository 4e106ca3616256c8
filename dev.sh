#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for dusk (LLVM 19, gcc, ptxas) and runs a job.
#
#   ./dev.sh setup  install what is missing, then say what was found
#   ./dev.sh test   install what is missing, then run every test (what CI runs): the
#                   workspace's, then the Python package's (built into .venv, on the CPU)
#   ./dev.sh run    install what is missing, then run the main job (examples/twilight):
#                   sparse-attention pipelines (Full, Quest, Quest+Twilight, DS+Twilight,
#                   SparQ, Full+Twilight, a centroid selector+Twilight) on a synthetic
#                   long-context batch, each checked against the f64 reference of its
#                   algorithm, with a verdict; per-head budgets, errors against dense
#                   attention and step times, a budget plot (on the GPU when there is
#                   one, the interpreter otherwise)
#
# Python packages (ptxas comes as one) go into a virtual environment in the repository,
# .venv/ (gitignored), made with the python3 on the PATH: a distribution's python3 refuses
# `pip install` outside one (PEP 668, "externally-managed-environment").
set -euo pipefail
cd "$(dirname "$0")"

case "${1:-}" in
  setup | test | run) ;;
  *) echo "usage: ./dev.sh setup | test | run" >&2; exit 2 ;;
esac

sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# apt_install PACKAGE...: installs Debian/Ubuntu packages.
apt_install() {
  echo "dev.sh: installing $* (apt)" >&2
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get update -q
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}

# LLVM 19 (llvm-sys reads LLVM_SYS_191_PREFIX, set in .cargo/config.toml).
if [ ! -x /usr/lib/llvm-19/bin/llvm-config ]; then
  apt_install llvm-19-dev libpolly-19-dev zlib1g-dev libzstd-dev
fi

# gcc (and g++): the C example and the bundle's C header are built in the tests.
if ! command -v gcc >/dev/null || ! command -v g++ >/dev/null; then
  apt_install gcc g++
fi

# venv_install PACKAGE...: pip-installs the packages into .venv/, made first if missing.
VENV="$PWD/.venv"
venv_install() {
  if [ ! -x "$VENV/bin/python" ]; then
    command -v python3 >/dev/null || apt_install python3 python3-venv
    echo "dev.sh: making $VENV with $(command -v python3)" >&2
    if ! python3 -m venv "$VENV"; then
      # Debian and Ubuntu ship venv's pip (ensurepip) apart, in python3.X-venv.
      rm -rf "$VENV"
      apt_install "$(python3 -c 'import sys; print("python3.%d-venv" % sys.version_info[1])')"
      python3 -m venv "$VENV"
    fi
  fi
  echo "dev.sh: installing $* into $VENV (pip)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
}

# ptxas, from the PyPI package nvidia-cuda-nvcc (no CUDA toolkit or GPU needed); a
# DUSK_PTXAS already set, or a ptxas on the PATH, wins.
find_ptxas() {
  if [ -n "${DUSK_PTXAS:-}" ]; then echo "$DUSK_PTXAS"; return; fi
  command -v ptxas && return
  local p
  for p in "$VENV"/lib/python3*/site-packages/nvidia/cu*/bin/ptxas; do
    if [ -x "$p" ]; then echo "$p"; return; fi
  done
  return 1
}
if ! PTXAS=$(find_ptxas); then
  venv_install nvidia-cuda-nvcc
  PTXAS=$(find_ptxas)
fi
export DUSK_PTXAS="$PTXAS"

case "$1" in
  setup)
    echo "LLVM:    /usr/lib/llvm-19 ($(/usr/lib/llvm-19/bin/llvm-config --version))"
    echo "gcc:     $(command -v gcc) ($(gcc -dumpfullversion))"
    echo "ptxas:   $DUSK_PTXAS ($("$DUSK_PTXAS" --version | grep -o 'release [0-9.]*'))"
    if [ -x "$VENV/bin/python" ]; then
      echo "venv:    $VENV ($("$VENV/bin/python" --version), from $(readlink -f "$VENV/bin/python"))"
    fi
    ;;
  test)
    cargo test --workspace
    # The Python package (python/, outside the workspace: see python/Cargo.toml), built in
    # debug into .venv (sharing target/) and tested on the CPU through the interpreter, with
    # NumPy arrays (no torch or GPU needed; its GPU tests skip themselves).
    venv_install "maturin>=1.9.4,<2" numpy pytest
    (cd python && VIRTUAL_ENV="$VENV" "$VENV/bin/maturin" develop)
    "$VENV/bin/python" -m pytest -q python/tests
    ;;
  run)  cargo run --release --example twilight ;;
esac
