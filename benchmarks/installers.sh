#!/usr/bin/env bash
# pip against uv on draftline's two pinned lists (benchmarks/results/installers.md): a fresh venv,
# the list installed the way each installer does it, wall time and the venv's size.
#   benchmarks/installers.sh pip|uv cpu|gpu TAG cold|warm    (run from the repository root)
# cold: an empty cache of the installer's own (/tmp/installers/cache-INSTALLER-LIST); warm: the
# one the previous run left. uv is taken from UV (default: uv on PATH).
# pip, as ./draftline did before: `pip install --upgrade pip`, then the CPU list with --no-deps
# (this machine's pip configuration supplies torch 2.13.0+cpu), the GPU lock with its
# dependencies and no pip configuration (a find-links folder holding torch 2.13.0+cpu would
# satisfy torch==2.13.0). uv, as ./draftline does: `uv pip sync` of the list, pip's wheel
# sources handed over for the CPU list only.
set -uo pipefail
inst=$1 list=$2 tag=$3 cache=$4
UV="${UV:-uv}"
ROOT="$PWD" DIR=/tmp/installers
V=$DIR/venv-$inst-$list C=$DIR/cache-$inst-$list
mkdir -p "$DIR"
rm -rf "$V"
[[ $cache == cold ]] && rm -rf "$C"
if [[ $list == cpu ]]; then REQ=$ROOT/requirements/cpu.lock.txt; else REQ=$ROOT/requirements/gpu-py3.11.lock.txt; fi
log=$DIR/$inst-$list-$tag.log
echo "start $(date -u +%FT%TZ) $(uptime)" > "$log"
t0=$(date +%s.%N)
python3 -m venv "$V"
if [[ $inst == pip ]]; then
  "$V/bin/python" -m pip install -q --upgrade pip >>"$log" 2>&1
  if [[ $list == cpu ]]; then
    PIP_CACHE_DIR=$C "$V/bin/python" -m pip install -q --no-deps -r "$REQ" >>"$log" 2>&1; rc=$?
  else
    env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null PIP_CACHE_DIR=$C "$V/bin/python" -m pip install -q -r "$REQ" >>"$log" 2>&1; rc=$?
  fi
else
  "$UV" --version >>"$log"
  sources=()
  [[ $list == cpu ]] && sources=(--index-strategy unsafe-best-match --find-links /opt/wheels
    --extra-index-url file:///opt/pypi/simple --extra-index-url file:///opt/pypi-more/simple)
  UV_CACHE_DIR=$C "$UV" pip sync --no-config -q --python "$V/bin/python" ${sources[@]+"${sources[@]}"} "$REQ" >>"$log" 2>&1; rc=$?
fi
t1=$(date +%s.%N)
echo "rc=$rc wall_s=$(echo "$t1 - $t0" | bc)" >> "$log"
echo "venv_du=$(du -sm "$V" | cut -f1)MB cache_du=$(du -sm "$C" 2>/dev/null | cut -f1)MB" >> "$log"
echo "end $(date -u +%FT%TZ) $(uptime)" >> "$log"
grep -v "WARNING: Location" "$log"
