#!/usr/bin/env bash
# Regenerates ptx/*.ptx from ptx/*.cu with the pinned nvcc, or checks them.
#
#   scripts/ptx.sh           regenerate the committed PTX
#   scripts/ptx.sh --check   fail if the committed PTX differs from a fresh
#                            build, exceeds PTX ISA 9.0, or does not assemble
#                            with ptxas for sm_80 and sm_90
#
# nvcc comes from PyPI, pinned together (an unpinned nvidia-nvvm pulls a newer
# NVVM that silently emits a PTX ISA the CUDA 13.0 driver rejects). It is
# installed once into $NVCC_HOME (default: ~/.cache/datafusion-gpu/nvcc-13.0.88).
# No GPU and no system CUDA toolkit are needed.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
nvcc_home="${NVCC_HOME:-$HOME/.cache/datafusion-gpu/nvcc-13.0.88}"
packages=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
)
max_ptx_isa="9.0"
nvcc_flags=(-ptx -arch=compute_80 -O3 -std=c++17)

bin="$nvcc_home/nvidia/cu13/bin"
if [[ ! -x "$bin/nvcc" ]]; then
  echo "installing pinned nvcc into $nvcc_home" >&2
  python3 -m pip install --quiet --disable-pip-version-check --target "$nvcc_home" "${packages[@]}"
fi

mode="${1:-generate}"
out_dir="$root/ptx"
if [[ "$mode" == "--check" ]]; then
  out_dir="$(mktemp -d)"
  trap 'rm -rf "$out_dir"' EXIT
fi

status=0
for cu in "$root"/ptx/*.cu; do
  name="$(basename "$cu" .cu)"
  "$bin/nvcc" "${nvcc_flags[@]}" -I "$root/ptx" -o "$out_dir/$name.ptx" "$cu"
  isa="$(awk '/^\.version/ {print $2; exit}' "$out_dir/$name.ptx")"
  if ! awk -v a="$isa" -v b="$max_ptx_isa" 'BEGIN { exit !(a + 0 <= b + 0) }'; then
    echo "error: $name.ptx has PTX ISA $isa, above $max_ptx_isa (driver 580 rejects it)" >&2
    status=1
  fi
  for sm in sm_80 sm_90; do
    if ! "$bin/ptxas" -arch="$sm" -o /dev/null "$out_dir/$name.ptx"; then
      echo "error: ptxas -arch=$sm rejects $name.ptx" >&2
      status=1
    fi
  done
  if [[ "$mode" == "--check" ]]; then
    if ! cmp -s "$out_dir/$name.ptx" "$root/ptx/$name.ptx"; then
      echo "error: ptx/$name.ptx is stale: run scripts/ptx.sh and commit the result" >&2
      diff -u "$root/ptx/$name.ptx" "$out_dir/$name.ptx" | head -20 >&2 || true
      status=1
    fi
  fi
done
for ptx in "$root"/ptx/*.ptx; do
  [[ -f "$root/ptx/$(basename "$ptx" .ptx).cu" ]] || { echo "error: $ptx has no source" >&2; status=1; }
done
[[ $status -eq 0 ]] && echo "ptx: $mode ok ($(ls "$root"/ptx/*.cu | wc -l) modules, ISA <= $max_ptx_isa, sm_80 and sm_90 assemble)"
exit $status
