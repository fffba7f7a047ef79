#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with the wheels benchmarks/gpu_check.py needs on the
# nvidia-h200 device image and prints their total size (the device tool carries at
# most 64 MiB with the working tree). The list, and why each is there:
# benchmarks/gpu_wheels.txt. Run from anywhere, with network access to PyPI:
#
#   bash benchmarks/gpu_wheels.sh            # PYTHON=... to choose the pip
#
# Downloads cp312 manylinux x86_64 (or pure-Python) wheels as the device README says;
# builds the "build" lines from their sdists with this machine's Python (pip's wheel
# cache makes a second run fast). Removes wheels that are not in the list, so .whl/
# holds one version of each (two stop the install on the device).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
list="$root/benchmarks/gpu_wheels.txt"
out="$root/.whl"
py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py=python3
mkdir -p "$out"

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done

want=()
while read -r kind spec; do
  case "$kind" in ''|'#'*) continue ;; esac
  case "$kind" in
    build) ;;
    replace) kind=download ;;
    *) spec="$kind"; kind=download ;;
  esac
  name="${spec%%==*}"
  # A wheel's file name spells the project with underscores, in any case.
  stem="$(echo "$name" | tr '[:upper:]-' '[:lower:]_')-${spec##*==}-"
  want+=("$stem")
  if ls "$out" | tr '[:upper:]' '[:lower:]' | grep -q "^${stem}"; then
    continue
  fi
  echo "$kind $spec"
  if [ "$kind" = build ]; then
    "$py" -m pip wheel -q --no-deps -w "$out" "$spec"
  else
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp "${platforms[@]}" -d "$out" "$spec"
  fi
done <"$list"

for f in "$out"/*.whl; do
  low="$(basename "$f" | tr '[:upper:]' '[:lower:]')"
  keep=0
  for stem in "${want[@]}"; do
    case "$low" in "$stem"*) keep=1 ;; esac
  done
  [ "$keep" = 1 ] || { echo "removing $(basename "$f") (not in the list)"; rm -f "$f"; }
done

n="$(ls "$out"/*.whl | wc -l)"
wheels="$(du -sb "$out" | cut -f1)"
echo "$n wheels in $out: $(du -sh "$out" | cut -f1) ($wheels bytes)"
# What the device tool sends: tracked and untracked-not-ignored files, plus the carry.
tree="$(cd "$root" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)"
total=$((tree + wheels))
echo "working tree $tree bytes + .whl = $((total / 1048576)) MiB of the tool's 64 MiB"
[ "$total" -le $((64 * 1048576)) ] || { echo "too large to travel" >&2; exit 1; }
