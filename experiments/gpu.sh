#!/usr/bin/env bash
# One GPU call for the paper's experiments: bash experiments/gpu.sh STAGE [STAGE ...]
# Carry .whl, .tcache and .data as for benchmarks/run.sh; SROPE_COMMIT names the commit of the
# working tree (the device copy's .git, if any, can be older than its files). Each stage packs its result folder, without
# weights and checkpoints, into $OUT/STAGE.tgz. Every process has a time limit that ends (with
# SIGKILL 20 s after SIGINT) before the call's own: what is not packed when a call is cut off
# does not come back. By default the limits are what is left of CALL_S seconds (560) from the
# start of this script, less a margin for packing.
#   lm-ablation   experiments/lm_ablation.py on .data/shakespeare (LM_JOBS processes at once,
#                 no new run after LM_DEADLINE seconds, killed after LM_LIMIT); carry
#                 out/lm-ablation to continue it (finished sweeps and runs are not run again)
#   calibrate     seconds per step of the synthetic configurations (CAL_STEPS steps each, at
#                 most CAL_LIMIT seconds each; CAL_ONLY: a regex of the names to run)
#   demo          srope demo on the machine's CPU cores for DEMO_SEEDS (groups of seeds run
#                 at once, e.g. "1010-1012 1013-1015"), into out/demo/GROUP
#   state-tracking  Fig. 7's Transformer S2 (3 encodings) and DeltaNet A3 (NoPE, Selective RoPE)
#                 panels, all at once (SYNTH_ONLY picks), each trained for what is left of the call
#                 (max_seconds) and then evaluated; eval_size ST_EVAL (16384) instead of the
#                 preset's 500,000; seeds, jobs, a shorter schedule and tags as for st-gla.
#                 Memory: a Transformer S2 run held 4-16 GB, a DeltaNet A3 run 29-46 GB (29 GB
#                 the captured step's pool, the rest the epoch's last batch and evaluation, now
#                 given back after each evaluation): three Transformer runs fit an H100 at once,
#                 nine did not; two A3 runs fit (65,945 MiB together) since the runner gives
#                 an evaluation's blocks back, four did not. About 400 s per 1,000 steps each,
#                 three Transformer runs at once; 290 s for one A3 run alone, 400-600 s beside
#                 another. Two lanes of stages side by side: the state-tracking report's tenth round
#   st-gla        Fig. 7's GLA S2 panel at the authors' recipe: NoPE, RoPE, Selective RoPE as they
#                 ran it and with srope demo's encoding (the recipe's regularisers), for what is
#                 left of the call; detached (below), two at once reach about 10,000 steps each
#                 in a session on an H100 (14.5 steps/s together, evaluation 14 s):
#                 DETACH=1 CALL_S=1600 SYNTH_ONLY='st-gla-s2-(nope|srope)' bash experiments/gpu.sh st-gla
#                 Memory: a run held 5.5-17.8 GB (out-of-memory messages); twelve at once ran out of an
#                 H100's 80 GB, six (three arms, ST_JOBS=2) used 50-65 GB and one of them ran out
#   copying       Fig. 5 at the authors' protocol: NoPE, RoPE, Selective RoPE and Selective
#                 RoPE + gate + bias for COPY_SEEDS (default 0), each trained for at most what is
#                 left of the call less EVAL_MARGIN (150 s) for the evaluation at every length
#                 (batches of 1000). One run alone takes 6-8 minutes of training on an H200
#                 (75-98 ms a step, GPU-bound), so one call fits one variant:
#                 SYNTH_ONLY='copying-srope' bash experiments/gpu.sh copying
#                 A variant whose training and evaluation do not fit in one call (Selective
#                 RoPE + gate + bias: 11.8 steps/s, evaluation > 100 s) spans two calls on the
#                 warm machine, its checkpoint staying there: COPY_SECONDS=900 (max_seconds:
#                 a total over both calls, equal in both) and COPY_STOP_AFTER=3000 (stop with a
#                 checkpoint) in the first; COPY_SECONDS=900 alone in the next, which resumes.
#                 COPY_JOBS runs that many of a variant's seeds at once (COPY_SEEDS=1,2
#                 COPY_JOBS=2: two seeds in one folder; GPU-bound, so each at about half speed)
#                 Detached (below), two variants at once fill an H100 (12.9 steps/s together,
#                 about 940 s with their evaluation); three add nothing (12.5) and took more
#                 than the 1,300 s one session leaves them. Keep the warm-up (WARM=1) on a
#                 fresh machine: without it two runs autotuned fla's kernels side by side for
#                 their first 100 steps (5 min 48 s). Too large for a snapshot (below).
#   mqar          Fig. 6 (sequence 512, 64 pairs): NoPE, RoPE and Selective RoPE sweeps over widths,
#                 learning rates and seeds (MQAR_WIDTHS, MQAR_LRS, MQAR_SEEDS; MQAR_JOBS runs of a
#                 sweep at once; MQAR_SET: more --set, e.g. a budget), continued by later calls;
#                 MQAR_TAG names a second family of sweeps (mqar$MQAR_TAG-nope ..., packed as
#                 mqar$MQAR_TAG.tgz), so that two stages of other settings can run in one call
#   mad           Table 1: the six tasks' baseline settings (MAD_ONLY: others), NoPE, RoPE, Selective
#                 RoPE and + gate + bias over the paper's optimiser grid (MAD_JOBS, MAD_SET, MAD_TAG
#                 as for mqar)
#   repeat        whether a GPU run repeats itself bitwise: REPEATS, srope synth arguments of each
#                 repeat separated by ';', run one after the other in fresh processes, then
#                 experiments/compare_repeats.py prints each run's weights' sha256 and training
#                 loss and whether they are equal. Default: 300 steps of GLA S2 with the demo's
#                 encoding at the authors' recipe, seed 0, twice alone, once beside seed 1
#                 (--jobs 2) and once with a larger evaluation set (about 5 minutes)
#   verify        the embedding's deterministic backward on this GPU: its CUDA tests, check_cuda.py
#                 for GLA with NoPE and Selective RoPE (no host sync, the captured step, resume
#                 bitwise; carry .data), benchmarks/check_repeat.py in two processes, then the
#                 repeat stage (about 6 minutes in all). Where the call has room for less:
#                 VERIFY_CUDA=0 skips check_cuda.py, VERIFY_PROCESSES=1 runs check_repeat.py once
#                 (its repeats in one process), VERIFY_NEXT names the stage after it (none: no stage)
#   collect       waits (while the call lasts) for stages started with DETACH=1, printing their
#                 progress every PROGRESS_S seconds, then copies their packed results to $OUT
# Runs longer than a session (a machine is lent for at most 30 minutes): give them a fixed budget
# over all sessions (ST_SECONDS, COPY_SECONDS, MQAR_SET="--set max_seconds=N"; resume refuses
# another) and KEEP_CHECKPOINTS=1. The call's timeout then stops them with a checkpoint, which
# comes back in the archive (see pack_synth); unpack it into out/, name out/synth/NAME in the
# next session's carry (64 MiB with .whl and .tcache: a 2M-parameter run's checkpoint is about
# 24 MB) and run the same stage: a run folder with results.json is resumed.
# AUTOTUNE=first runs every synthetic run with `--autotune first` (SROPE_AUTOTUNE): fla's
# kernels autotune for minutes at every new model width otherwise (MQAR's first run at d 64
# had not finished one step after 194 s), and these models are host-bound.
# SYNTH_ONLY (a regex) keeps only the synthetic runs whose names match. WARM=0 skips the
# warm-up steps (a run alone always skips them: it fills its caches itself).
# NEED_S starts a synthetic run only with that many seconds of the call left (its training to
# max_steps, evaluation and start-up): in a chain, a stage that cannot finish is not begun.
#
# DETACH=1 starts the stages in a process session of their own and returns at once: they
# outlive the call (the device machine ends only processes of the call's session) and run on
# while the machine stays warm, with CALL_S counted from now. Later calls on the warm machine
# run "collect" (carrying .whl and .tcache or not: the detached runs use the machine's own
# copies, see benchmarks/device-env.sh). Results go to out/gpu until collected. They die with
# the machine: it goes back when no call arrives within its idle release (30 s), so queue each
# collect the moment the last returns (a gap of minutes lost three runs at 37-47% of their steps;
# a reply slower than 30 s has lost a call's worth). A collect that ends with runs in progress
# leaves a snapshot of them in $OUT (partial.tgz, see snapshot) to resume from in a later session.
# Stages that need different settings run in turn from one script started the same way (setsid
# nohup bash chain.sh > out/gpu/detached-chain.log &, its pid in out/gpu/detached-chain.pid, so
# that collect waits for it), each gpu.sh given what is left (CALL_S=$((END - $(date +%s))))
# and its own OUT folder where two run at once; the state-tracking report's eighth round shows one.
set -u
if [ -n "${DETACH:-}" ] && [ -n "${OUT:-}" ]; then
  mkdir -p out/gpu
  tag=$(echo "$*" | tr ' ' '+')
  DETACH='' OUT='' setsid nohup bash "$0" "$@" > "out/gpu/detached-$tag.log" 2>&1 < /dev/null &
  echo $! > "out/gpu/detached-$tag.pid"
  echo "detached: stages $* in process $! (log out/gpu/detached-$tag.log)"
  exit 0
fi
END=$(($(date +%s) + ${CALL_S:-560}))
left() { echo $((END - $(date +%s) - ${1:-40})); }  # seconds left in the call, less a margin
at_most() { local l; l=$(left); [ "$1" -lt "$l" ] && l=$1; echo "$l"; }  # $1 seconds or what is left
source benchmarks/device-env.sh  # safe beside detached stages: it installs and seeds once per machine
export TQDM_MININTERVAL=${TQDM_MININTERVAL:-20}
[ -n "${AUTOTUNE:-}" ] && export SROPE_AUTOTUNE=$AUTOTUNE  # progress lines in the logs, not a stream of them
pack() { tar czf "$R/$1.tgz" --exclude=checkpoints --exclude=tensorboard --exclude=model --exclude='*.safetensors' -C out "$1"; ls -la "$R/$1.tgz"; }

calibrate() {
  local steps=${CAL_STEPS:-40} i=0
  mkdir -p out/calibrate
  while read -r name args; do
    i=$((i + 1))
    [[ $name =~ ${CAL_ONLY:-.} ]] || continue
    local limit
    limit=$(at_most "${CAL_LIMIT:-120}")
    [ "$limit" -gt 0 ] || { echo "no time left to calibrate $name"; continue; }
    echo "== $(date +%T) calibrate $name (at most $limit s)"
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" python3 -m srope synth $args --set max_steps="$steps" --set checkpoint_every=100000 --no-progress \
      --label "$name" --out "out/calibrate/$name" > "out/calibrate/$name.log" 2>&1
    tail -n 3 "out/calibrate/$name.log"  # the whole log is packed with the results
  done <<'LIST'
copying-authors copying --set seeds=0 --set eval_lengths=2-64 --set eval_examples=64
st-gla-authors state_tracking --preset authors --set seeds=0 --set eval_size=2048
st-attention-s2 state_tracking --preset paper --mixer attention --set model.num_hidden_layers=1 --set seeds=0 --set eval_size=2048
st-deltanet-a3 state_tracking --preset paper_a3 --set seeds=0 --set eval_size=2048
mqar-512-d64 mqar --set configs=512x64 --set d_models=64 --set lrs=0.001 --set test_examples=256
mqar-512-d512 mqar --set configs=512x64 --set d_models=512 --set lrs=0.001 --set test_examples=256
mad-recall mad --set only=in-context-recall/baseline --set lrs=0.001 --set weight_decays=0.0
mad-copy-1024 mad --set only=selective-copying/seq_len=1024 --set lrs=0.001 --set weight_decays=0.0
LIST
}

# Stages named in BACKGROUND (e.g. BACKGROUND=demo) run beside the others, on the CPU cores.
demo() {
  local pids=()
  for seeds in ${DEMO_SEEDS:-1010-1012}; do
    OMP_NUM_THREADS=1 timeout -s INT -k 20 "${DEMO_LIMIT:-540}" python3 -m srope demo --seeds "$seeds" --out "out/demo/$seeds" \
      > "out/demo-$seeds.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  tail -n 12 out/demo-*.log
}

# Runs "NAME ARGS" lines of srope synth at once into out/synth/NAME, continuing those begun.
# Lines marked "warm" first run alone for one step: that fills the data cache and Triton's
# autotune cache once, instead of in every process at the same time (minutes each on a fresh
# machine, which ran a first call of this stage past its time). One run alone is not warmed: it
# fills the caches itself, and the warm-up's start-up (about 45 s) would come off its training.
synth_all() {
  local pids=() lines
  lines=$(grep -E "^(${SYNTH_ONLY:-.*})( |$)")
  [ "$(grep -c . <<< "$lines")" -ge 2 ] || local WARM=0
  # where SYNTH_ONLY leaves out the line marked warm, the first of several runs warms instead:
  # two copying runs without a warm-up autotuned side by side for their first 6 minutes
  local first=""
  grep -q '^[^ ]* warm ' <<< "$lines" || [ "$(grep -c . <<< "$lines")" -lt 2 ] || first=$(head -n 1 <<< "$lines" | cut -d' ' -f1)
  while read -r name warm args; do
    [ "$warm" = warm ] || { [ "$name" = "$first" ] && [ -n "$name" ] && args="$warm $args"; } || continue
    [ "${WARM:-1}" = 1 ] || continue
    [ -f "out/synth/$name/results.json" ] && continue  # begun in an earlier call: caches are warm
    [ "$(left)" -ge "${NEED_S:-0}" ] || continue  # no run will start
    local limit
    limit=$(at_most "${WARM_LIMIT:-240}")
    [ "$limit" -gt 0 ] || { echo "no time left to warm $name"; continue; }
    echo "== $(date +%T) warm-up for $name (at most $limit s)"
    args=${args//@LEFT@/$limit}
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" python3 -m srope synth $args --set max_steps=1 ${WARM_SET:-} --no-progress --out "out/warm/$name" \
      > "out/synth/warm-$name.log" 2>&1
    echo "exit $? after $(date +%T)"
  done <<< "$lines"
  while read -r name warm args; do
    [ "$warm" = warm ] || args="$warm $args"
    [ -z "$name" ] && continue
    local limit
    limit=${SYNTH_LIMIT:-$(left)}
    [ "$limit" -gt 0 ] || { echo "no time left to start $name"; continue; }
    # NEED_S: a run whose planned schedule (max_steps) the call's end would cut short is not
    # begun; a cut run records a result of another schedule than the one asked for
    [ "$limit" -ge "${NEED_S:-0}" ] || { echo "== $(date +%T) not started: $name needs NEED_S=$NEED_S s, $limit left"; continue; }
    # the run's own budget ends EVAL_MARGIN s before the timeout below: its start-up (imports, data,
    # graph capture) and final evaluation fall in that margin, so the run stops and records its
    # result before the timeout can interrupt it (a margin of 5 s lost all three runs of a call)
    local resume="" label=$name
    if [ -f "out/synth/$name/results.json" ]; then
      resume=--resume
      # a run continued keeps the budget it began with (resume refuses another): max_seconds is
      # a total over all calls, and what is left of it goes on from the checkpoint
      [[ $args == *@LEFT@* ]] && args=${args//@LEFT@/$(recorded_budget "out/synth/$name/results.json")}
    fi
    args=${args//@LEFT@/$((limit - ${EVAL_MARGIN:-60}))}
    # a tag (MAD_TAG, MQAR_TAG) names the folder only: the row's label stays the variant's, so
    # that the report pools a tagged sweep's points with the untagged ones
    [ -n "${LABEL_DROP:-}" ] && label=${name/$LABEL_DROP/}
    echo "== $(date +%T) synth $name $resume"
    # shellcheck disable=SC2086
    (timeout -s INT -k 20 "$limit" python3 -m srope synth $args --label "$label" --out "out/synth/$name" $resume \
      > "out/synth/$name.log" 2>&1; rc=$?; echo "== $(date +%T) $name exit $rc" >> "out/synth/$name.log") &
    pids+=($!)
  done <<< "$lines"
  wait "${pids[@]}"
  progress
}
# The last progress line of every synthetic run's log (tqdm rewrites its line with \r).
progress() {
  local log
  for log in out/synth/*.log; do
    [ -f "$log" ] && printf '%s: %s\n' "$(basename "$log" .log)" "$(tr '\r' '\n' < "$log" | grep -v '^\s*$' | tail -n 1 | cut -c1-160)"
  done
}

running() { local f; for f in out/gpu/detached-*.pid; do [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && return 0; done; return 1; }
collect() {
  local last=0
  # polls every 5 s (the call ends as soon as the stages do: its held time is device time),
  # printing their progress every PROGRESS_S seconds
  while running && [ "$(left 20)" -gt 0 ]; do
    if [ $(($(date +%s) - last)) -ge "${PROGRESS_S:-120}" ]; then
      echo "== $(date +%T) running; GPU $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)"; progress
      last=$(date +%s)
    fi
    sleep 5
  done
  if running; then
    echo "== still running: results of what finished so far only"
    snapshot
  fi
  echo "== $(date +%T)"; tail -n 12 out/gpu/detached-*.log; progress
  cp out/gpu/*.tgz* "$R"/ 2>/dev/null; ls -la "$R"
}
# The runs in progress as they stand: every synth folder with the newest checkpoint of each run,
# as partial.tgz (pieces of 15 MiB). Should the machine go back before the next collect (replies
# slower than its idle release lost two stages' detached runs in one session), the next session
# unpacks it (cat partial.tgz* | tar xz -C out), carries out/synth/NAME and runs the same stage:
# each run resumes from its checkpoint with the budget it began with. SNAPSHOT=0 skips it; a snapshot
# larger than SNAPSHOT_MIB (48: what $OUT and the next call's carry can hold beside the wheels)
# is dropped with a message (copying's 4-layer d 512 runs: 14.9M parameters, about 170 MiB a
# checkpoint with AdamW's two moments).
snapshot() {
  [ "${SNAPSHOT:-1}" = 1 ] || return 0
  rm -f "$R"/partial.tgz*
  KEEP_CHECKPOINTS=1 pack_synth partial '' > /dev/null
  local bytes
  bytes=$(cat "$R"/partial.tgz* | wc -c)
  if [ "$bytes" -gt $((${SNAPSHOT_MIB:-48} << 20)) ]; then
    echo "== snapshot of the runs in progress: $((bytes >> 20)) MiB, over SNAPSHOT_MIB (${SNAPSHOT_MIB:-48}); not kept"
    rm -f "$R"/partial.tgz*
  else
    echo "== snapshot of the runs in progress: $((bytes >> 20)) MiB in $(ls "$R"/partial.tgz* | wc -l) file(s)"
  fi
}
# The max_seconds a synth run began with, from its results.json.
recorded_budget() {
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["config"]["max_seconds"])' "$1"
}
# The synth_all lines of the paper's four variants of TASK with ARGS: NoPE (warming the caches),
# RoPE, Selective RoPE, Selective RoPE + gate + bias, as NAME-nope ... NAME-srope-gate-bias
# (NAME: $3, else TASK).
four_variants() {
  local task=$1 args=$2 name=${3:-$1}
  printf '%s\n' "$name-nope warm $task --position nope $args" "$name-rope $task --position rope $args" \
    "$name-srope $task --position selective_rope $args" \
    "$name-srope-gate-bias $task --position selective_rope --set position.gate=per-channel --set position.bias=true $args"
}
# KEEP_CHECKPOINTS=1 keeps the latest checkpoint of each run in progress in the archive, so that
# a later session can carry the run folder back and resume it; an archive over 15 MiB (a file
# from $OUT may hold 16) is split into NAME.tgz.00, .01, ...: cat NAME.tgz.* | tar xz -C out
pack_synth() {
  local keep=(--exclude=checkpoints) old
  if [ "${KEEP_CHECKPOINTS:-0}" = 1 ]; then
    keep=(--exclude='*.tmp')
    for old in out/synth/$2*/runs/*/checkpoints; do
      [ -d "$old" ] && while read -r step; do keep+=(--exclude="${step#out/}"); done < <(ls -d "$old"/step_* | grep -v '\.tmp$' | head -n -1)
    done
  fi
  (cd out && tar czf "$R/$1.tgz" --no-wildcards-match-slash "${keep[@]}" --exclude='runs/*/model.safetensors' synth/$2*)
  if [ "$(stat -c %s "$R/$1.tgz")" -gt $((15 << 20)) ]; then
    split -b 15M -d "$R/$1.tgz" "$R/$1.tgz." && rm "$R/$1.tgz"
  fi
  ls -la "$R/$1".tgz*
}

mkdir -p out/synth out/demo
# srope demo's encoding as --set options (its curriculum and weight average are not among them)
DEMO_ENCODING="--set position.projection=full-rank --set position.conv_size=1 --set position.gate=per-channel"
DEMO_ENCODING="$DEMO_ENCODING --set position.max_temperature=3.141592653589793 --set position.projection_gain=8.0 --set position.phase_noise=0.1"
stage() {
  case $1 in
    lm-ablation)
      echo "== $(date +%T) lm-ablation"
      timeout -s INT -k 20 "${LM_LIMIT:-$(left 60)}" python3 experiments/lm_ablation.py --data .data/shakespeare --out out/lm-ablation \
        --jobs "${LM_JOBS:-7}" --deadline "${LM_DEADLINE:-$(left 180)}" 2>&1
      pack lm-ablation ;;
    calibrate) calibrate; pack calibrate ;;
    demo) demo; pack demo ;;
    collect) collect ;;
    state-tracking)
      # ST_SEEDS (555; Table 6's are 555,666,777,888,999), ST_JOBS, ST_SET, ST_TAG and ST_PART as
      # for st-gla below: ST_SET="--set max_steps=1000" ST_TAG=-1k plans the cosine over 1,000
      # steps instead of the protocol's 48,900, in folders of their own
      local ST="--set seeds=${ST_SEEDS:-555} --set eval_size=${ST_EVAL:-16384} --set max_seconds=${ST_SECONDS:-@LEFT@} ${ST_SET:-}"
      [ -n "${ST_JOBS:-}" ] && ST="$ST --jobs $ST_JOBS"
      local A="state_tracking --preset paper --mixer attention --set model.num_hidden_layers=1"
      local S=st-attention-s2${ST_TAG:-} D=st-deltanet-a3${ST_TAG:-} P=${ST_PART:-}
      LABEL_DROP=$P synth_all <<LIST
$S-nope$P warm $A --position nope $ST
$S-rope$P $A --position rope $ST
$S-srope$P $A --position selective_rope $ST
$D-nope$P warm state_tracking --preset paper_a3 --position nope $ST
$D-srope$P state_tracking --preset paper_a3 --position selective_rope $ST
LIST
      pack_synth state-tracking st- ;;
    st-gla)
      # Fig. 7's GLA S2 panel with the authors' recipe (preset authors: 1 layer, hidden 384, lr
      # 5e-4, batch 1024): NoPE, RoPE, Selective RoPE as the authors ran it and with the
      # encoding of srope demo (full-rank projection at gain 8, phase noise 0.1, conv 1,
      # per-channel gate, max temperature pi; the demo's curriculum and weight average are not
      # part of this protocol), each trained for what is left of the call (SYNTH_ONLY picks);
      # ST_SEEDS (0) and ST_EVAL as above; ST_JOBS runs that many of a variant's seeds at once
      # (ST_SEEDS=1,2 ST_JOBS=2 SYNTH_ONLY=st-gla-s2-srope-demo-encoding: two seeds, one folder);
      # ST_SET adds --set options: ST_SET="--set max_steps=2000" plans the cosine over 2,000 steps
      # instead of the protocol's 195,400, of which a time-limited run sees the peak rate only;
      # ST_TAG names such runs apart (st-gla-s2$ST_TAG-nope ..., their own rows in the report);
      # ST_PART adds seeds to an arm that has its folder already (ST_PART=-seed2 ST_SEEDS=2: the
      # folder st-gla-s2$ST_TAG-srope-seed2, the row of st-gla-s2$ST_TAG-srope in the report)
      export SROPE_AUTOTUNE=${AUTOTUNE:-first}
      local G="--preset authors --set seeds=${ST_SEEDS:-0} --set eval_size=${ST_EVAL:-16384} --set max_seconds=${ST_SECONDS:-@LEFT@} ${ST_SET:-}"
      [ -n "${ST_JOBS:-}" ] && G="$G --jobs $ST_JOBS"
      local D=$DEMO_ENCODING
      local T=st-gla-s2${ST_TAG:-} P=${ST_PART:-}
      LABEL_DROP=$P synth_all <<LIST
$T-nope$P warm state_tracking --position nope $G
$T-rope$P state_tracking --position rope $G
$T-srope$P state_tracking --position selective_rope $G
$T-srope-demo-encoding$P state_tracking --position selective_rope $G $D
LIST
      pack_synth st-gla st-gla- ;;
    copying)
      # The warm-up's evaluation is cut short: only its training step fills a cache.
      local C="--set seeds=${COPY_SEEDS:-0} --set eval_batch_size=1000 --set max_seconds=${COPY_SECONDS:-@LEFT@}"
      [ -n "${COPY_STOP_AFTER:-}" ] && C="$C --stop-after-steps $COPY_STOP_AFTER"
      [ -n "${COPY_JOBS:-}" ] && C="$C --jobs $COPY_JOBS"
      four_variants copying "$C" | EVAL_MARGIN=${EVAL_MARGIN:-150} WARM_SET="--set eval_lengths=2-8 --set eval_examples=16" synth_all
      pack_synth copying copying- ;;
    mqar)
      # Fig. 6 at sequence 512 with 64 pairs: one sweep per encoding over MQAR_WIDTHS x
      # MQAR_LRS x MQAR_SEEDS, MQAR_JOBS runs of each at once, the three sweeps side by side;
      # MQAR_SET adds --set options (a budget: epochs=..., max_seconds=...). The head runs at the
      # 64 scored positions only (head_at_targets: 3.0x fewer ms a step than the full logits as a
      # CUDA graph, benchmarks/profile_synth.py at d 64 on an H100; "on" rather than the default
      # "auto", as the sweeps begun with it recorded). Autotuning cut to the first candidate that
      # runs unless AUTOTUNE says otherwise (minutes per width). Memory: with graphs and the head
      # at the targets each run process at d 64-128 held 5-7.5 GiB, and the evaluation's full
      # logits (eval_batch_size 256: 2 GiB in bf16, twice that in float32) ran 2 of 3 sweeps x 4
      # jobs out of memory on an H100; the runner now evaluates such batches in parts.
      export SROPE_AUTOTUNE=${AUTOTUNE:-first}
      local M="--set configs=512x64 --set d_models=${MQAR_WIDTHS:-64,128,256,512} --set lrs=${MQAR_LRS:-0.0001,0.000464,0.00215,0.01}"
      M="$M --set seeds=${MQAR_SEEDS:-0,1,2} --set head_at_targets=on --jobs ${MQAR_JOBS:-3} ${MQAR_SET:-}"
      local T=mqar${MQAR_TAG:-}
      LABEL_DROP=${MQAR_TAG:-} synth_all <<LIST
$T-nope warm mqar --position nope $M
$T-rope mqar --position rope $M
$T-srope mqar --position selective_rope $M
LIST
      pack_synth "$T" "$T-" ;;
    mad)
      # Table 1, first the baseline setting of each of the six tasks (MAD_ONLY: other settings),
      # the paper's optimiser grid (3 learning rates x 2 weight decays): NoPE, RoPE, Selective
      # RoPE and Selective RoPE + gate + bias side by side, MAD_JOBS runs of each at once;
      # MAD_SET adds --set options. Autotuning as for mqar; jobs kept as low as mqar's: each run
      # process holds 4.3-5.7 GiB (CUDA context, captured step's pool, allocator cache), and
      # MAD_JOBS=4 (16 processes) ran an 80 GB H100 out of memory; 3 (12) did not.
      export SROPE_AUTOTUNE=${AUTOTUNE:-first}
      local base=in-context-recall/baseline,fuzzy-in-context-recall/baseline,noisy-in-context-recall/baseline
      base=$base,selective-copying/baseline,compression/baseline,memorization/baseline
      local A="--set only=${MAD_ONLY:-$base} --jobs ${MAD_JOBS:-2} ${MAD_SET:-}" T=mad${MAD_TAG:-}
      four_variants mad "$A" "$T" | LABEL_DROP=${MAD_TAG:-} synth_all
      pack_synth "$T" "$T-" ;;
    verify)
      mkdir -p out/verify
      timeout -k 10 "$(at_most 120)" python3 -m pytest -q -p no:cacheprovider tests/models/test_embedding.py 2>&1 | tail -n 5
      if [ "${VERIFY_CUDA:-1}" = 1 ]; then
        timeout -k 10 "$(at_most 150)" python3 benchmarks/fast_autotune.py benchmarks/check_cuda.py --data .data/shakespeare \
          --mixers gla --positions nope,selective_rope --out out/verify/check_cuda.json > out/verify/check_cuda.log 2>&1
        echo "check_cuda exit $?"; tail -n 4 out/verify/check_cuda.log
      fi
      for i in $(seq "${VERIFY_PROCESSES:-2}"); do
        SROPE_AUTOTUNE=first timeout -k 10 "$(at_most 90)" python3 benchmarks/check_repeat.py --only st-gla-s2-srope-demo-encoding st-gla-s2-nope \
          --out "out/verify/check_repeat_$i.json" > "out/verify/check_repeat_$i.log" 2>&1
        echo "check_repeat $i exit $?"; grep -o "'grads_that_differ': \[[^]]*\]" "out/verify/check_repeat_$i.log" | sort | uniq -c
      done
      pack verify
      [ "${VERIFY_NEXT:-repeat}" = none ] || stage "${VERIFY_NEXT:-repeat}" ;;
    repeat)
      export SROPE_AUTOTUNE=${AUTOTUNE:-first}
      local base="state_tracking --preset authors --position selective_rope $DEMO_ENCODING --set eval_size=256 --set max_steps=300"
      local repeats=${REPEATS:-"$base --set seeds=0;$base --set seeds=0;$base --set seeds=0,1 --jobs 2;${base/eval_size=256/eval_size=16384} --set seeds=0"}
      local list i=0 args limit
      IFS=';' read -ra list <<< "$repeats"
      rm -rf out/repeat && mkdir -p out/repeat
      for args in "${list[@]}"; do
        i=$((i + 1))
        limit=$(left)
        [ "$limit" -gt 0 ] || { echo "no time left for repeat $i"; break; }
        echo "== $(date +%T) repeat $i: $args"
        # shellcheck disable=SC2086
        timeout -s INT -k 20 "$limit" python3 -m srope synth $args --no-progress --out "out/repeat/$i" > "out/repeat/$i.log" 2>&1
        echo "exit $?"
      done
      python3 experiments/compare_repeats.py out/repeat/*/results.json | tee out/repeat/compare.txt
      pack repeat ;;
    *) echo "unknown stage $1"; exit 2 ;;
  esac
}

background=()
for name in ${BACKGROUND:-}; do
  stage "$name" > "out/stage-$name.log" 2>&1 &
  background+=($!)
done
for name in "$@"; do stage "$name"; done
[ ${#background[@]} -gt 0 ] && wait "${background[@]}" && cat out/stage-*.log
if [ -n "${OUT:-}" ] && [ -f .tcache/pack.sh ]; then bash .tcache/pack.sh; fi  # if, not &&: no pack.sh is no failure of the call
