#!/usr/bin/env bash
# draftline's own pipeline on the H200 test host, through Snakemake and the project's rules (issue 34).
# The host has no network: vLLM and the rest come from ../shared/gpu-host's bundle (/root/venv),
# used as it is (DRAFTLINE_USE_ENV) with the GPU lock of its pins (DRAFTLINE_GPU_LOCKFILE=vllm0.26).
# A command there may run 10 minutes, so the runs go on in the background and each call waits:
#   bash benchmarks/cuda/h200_pipeline.sh start RUN...    # copy this checkout to /root/w/RUN, start each run
#   bash benchmarks/cuda/h200_pipeline.sh wait SECONDS    # wait for them (at most SECONDS), pack logs into $OUT
# RUN: default (the quick start's whole DAG), preflight, online (hidden_states.mode online, to the
# checkpoint), or bench (benchmarks/cuda/vllm_rates.py on the 8B shape); each in its own copy, with its
# own GPU lock folder so that runs share the one GPU, each engine given a share of its memory
# (benchmarks/cuda/h200_configs/*.yaml: the only setting that differs from the run's config).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
W=/root/w
export DRAFTLINE_USE_ENV=/root/venv DRAFTLINE_GPU_LOCKFILE=vllm0.26 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

start_run() {
  local run=$1 dir=$W/$1
  mkdir -p "$dir"
  # this checkout as it is here (no results, no bundle, no environment)
  mkdir -p "$dir/repo"
  (cd "$REPO" && tar cf - --exclude=./.gpu-bundle --exclude=./results --exclude=./.snakemake --exclude=./logs \
    --exclude=./runs --exclude=./.venv .) | tar xf - -C "$dir/repo"
  local share="$REPO/benchmarks/cuda/h200_configs/$run.yaml"
  local cmd
  case $run in
    default) cmd=(./draftline snakemake --cores all --keep-going "--configfile=$share") ;;
    preflight) cmd=(./draftline snakemake --cores all --keep-going preflight "--configfile=$share") ;;
    online) cmd=(./draftline snakemake --cores all --keep-going results/checkpoint/final "--configfile=$share") ;;
    bench) cmd=(./draftline python benchmarks/cuda/vllm_rates.py --out "$dir/out" --work "$dir/work") ;;
    *) echo "unknown run $run"; return 2 ;;
  esac
  (
    cd "$dir/repo" || exit 1
    export DRAFTLINE_GPU_LOCK_DIR="$dir/gpu-locks"
    echo "start $(date -u +%FT%TZ) ${cmd[*]}" > "$dir/status"
    setsid bash -c "$(printf '%q ' "${cmd[@]}") > '$dir/run.log' 2>&1; echo \"end \$(date -u +%FT%TZ) rc \$?\" >> '$dir/status'" \
      < /dev/null > /dev/null 2>&1 &
  )
  echo "started $run in $dir"
}

pack() {
  local out=${OUT:-/tmp/out}
  mkdir -p "$out"
  for dir in "$W"/*/; do
    local run; run=$(basename "$dir")
    # logs, small results (no hidden states, no weights), Snakemake's own log
    (cd "$dir" && tar czf "$out/$run.tar.gz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
      --exclude='*.arrow' --exclude='*.gguf' --exclude='resources' --exclude='.staging' --exclude='work' \
      status run.log $(cd "$dir" && ls -d repo/logs repo/results repo/.snakemake/log out 2>/dev/null)) 2>/dev/null
  done
  nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv > "$out/gpu.csv" 2>&1
  ls -la "$out"
}

case "${1:-}" in
  start)
    shift
    nvidia-smi -L
    for run in "$@"; do start_run "$run"; done ;;
  wait)
    limit=${2:-540}; t0=$SECONDS
    while (( SECONDS - t0 < limit )); do
      running=0
      for s in "$W"/*/status; do grep -q '^end' "$s" || running=$((running + 1)); done
      (( running == 0 )) && break
      sleep 10
    done
    for dir in "$W"/*/; do
      echo "== $(basename "$dir"): $(tr '\n' ' ' < "$dir/status")"
      grep -E "steps \(|Error in rule|error|Error|Traceback|Finished job|Exiting because" "$dir/run.log" | tail -12
    done
    pack ;;
  *) echo "usage: $0 start RUN... | wait SECONDS" >&2; exit 2 ;;
esac
