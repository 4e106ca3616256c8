#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for dusk (LLVM 19, ptxas) and runs a job.
#
#   ./dev.sh test   install what is missing, then run every test (what CI runs)
#   ./dev.sh run    install what is missing, then run the main job, Twilight's pipeline:
#                   select pages, score the candidates with the INT4 SpGEMV, prune them
#                   with top-p, attend over the kept tokens, check every stage against
#                   its reference (on the GPU when there is one, the interpreter otherwise)
set -euo pipefail
cd "$(dirname "$0")"

sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# LLVM 19 (llvm-sys reads LLVM_SYS_191_PREFIX, set in .cargo/config.toml).
if [ ! -x /usr/lib/llvm-19/bin/llvm-config ]; then
  echo "dev.sh: installing LLVM 19 (Debian's llvm-19-dev)" >&2
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get update -q
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    llvm-19-dev libpolly-19-dev zlib1g-dev libzstd-dev
fi

# gcc (and g++): the C example and the bundle's C header are built in the tests.
if ! command -v gcc >/dev/null || ! command -v g++ >/dev/null; then
  echo "dev.sh: installing gcc and g++" >&2
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get update -q
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc g++
fi

# ptxas, from the PyPI package nvidia-cuda-nvcc (no CUDA toolkit or GPU needed).
find_ptxas() {
  command -v ptxas 2>/dev/null && return
  python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for p in sorted(glob.glob(os.path.join(r, "nvidia", "cu*", "bin", "ptxas"))):
        print(p); sys.exit(0)
sys.exit(1)
PY
}
if ! PTXAS=$(find_ptxas); then
  echo "dev.sh: installing ptxas (pip package nvidia-cuda-nvcc)" >&2
  python3 -m pip install -q nvidia-cuda-nvcc
  PTXAS=$(find_ptxas)
fi
export DUSK_PTXAS="$PTXAS"

case "${1:-}" in
  test) cargo test --workspace ;;
  run)  cargo run --release --example twilight ;;
  *) echo "usage: ./dev.sh test | run" >&2; exit 2 ;;
esac
