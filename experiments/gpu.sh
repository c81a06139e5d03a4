#!/usr/bin/env bash
# One GPU call: bash experiments/gpu.sh STAGE [STAGE ...]; carry .whl, .tcache and .data as for benchmarks/run.sh. A stage
# runs recipes (srope synth --list-recipes) side by side, NAME:ARM into out/synth/NAME$TAG-ARM$PART labelled NAME$TAG-ARM
# (a folder with results.json resumes, on the budget it began with), then packs them without weights into $OUT/STAGE.tgz
# (15 MiB pieces STAGE.tgz.NN if larger). All ends within CALL_S (560) s. Settings: BUDGET (max_seconds of a run: left, the
# call's rest less EVAL_MARGIN; none; or N), SEEDS, JOBS, SET (more srope synth options), TAG, PART, ONLY (a regex of
# folders), NEED_S (start no run with less left), WARM=0 (no one-step run first), KEEP_CHECKPOINTS=1, AUTOTUNE (first);
# stage `recipes` runs RECIPES="NAME:ARM ..." (e.g. "st-release-tenth:nope st-release-tenth:srope"), resumed call after call.
set -u
END=$(($(date +%s) + ${CALL_S:-560}))
left() { echo $((END - $(date +%s) - ${1:-40})); }
source benchmarks/device-env.sh && mkdir -p out/synth
export TQDM_MININTERVAL=20 SROPE_AUTOTUNE=${AUTOTUNE:-first}
synth() { local t=$1; shift; [ "$t" -gt 0 ] || { echo "no time left for $*"; return 124; }; timeout -s INT -k 20 "$t" python3 -m srope synth "$@" --no-progress; }
folder() { local a=-${1#*:}; [ "$a" = "-$1" ] && a=; echo "${1%%:*}${TAG:-}$a${PART:-}"; }  # NAME:ARM -> NAME$TAG-ARM$PART
pack() {  # STAGE PATH... under out/; KEEP_CHECKPOINTS=1 keeps each run's latest checkpoint
  local stage=$1 keep=(--exclude=checkpoints) c d; shift
  [ "${KEEP_CHECKPOINTS:-0}" = 1 ] && mapfile -t keep < <(echo "--exclude=*.tmp"; for d in "${@/#/out/}"; do for c in "$d"/runs/*/checkpoints; do
    [ -d "$c" ] && ls -d "$c"/step_* | grep -v '\.tmp$' | head -n -1 | sed 's|^out/|--exclude=|'; done; done)
  tar czf "$R/$stage.tgz" -C out --ignore-failed-read --no-wildcards-match-slash "${keep[@]}" --exclude=tensorboard --exclude=model --exclude='runs/*/model.safetensors' "$@"
  [ "$(stat -c %s "$R/$stage.tgz")" -le $((15 << 20)) ] || { split -b 15M -d "$R/$stage.tgz" "$R/$stage.tgz." && rm "$R/$stage.tgz"; }; ls -la "$R/$stage".tgz*
}
runs() {  # STAGE BUDGET NAME:ARM ...
  local stage=$1 budget=${BUDGET:-$2} r f b limit list=() paths=() warmed=" " extra=(${SET:-}); shift 2
  [ -n "${SEEDS:-}" ] && extra+=(--set "seeds=$SEEDS"); [ -n "${JOBS:-}" ] && extra+=(--jobs "$JOBS")
  for r in "$@"; do f=$(folder "$r"); [[ $f =~ ^(${ONLY:-.*})$ ]] && list+=("$r") && paths+=("synth/$f" "synth/$f.log"); done
  for r in "${list[@]}"; do  # one step of each recipe's first new run alone: the data and kernel caches fill once, not in every run at once
    f=$(folder "$r") limit=$(left)
    [ "${WARM:-1}" = 1 ] && [ ${#list[@]} -ge 2 ] && [[ $warmed != *" ${r%%:*} "* ]] && [ ! -f "out/synth/$f/results.json" ] && [ "$limit" -ge "${NEED_S:-0}" ] || continue
    warmed+="${r%%:*} " && echo "== $(date +%T) one step of $f"
    synth $((limit < 240 ? limit : 240)) --recipe "$r" "${extra[@]}" --set max_steps=1 ${WARM_SET:-} --out "out/warm/$f" > "out/synth/warm-$f.log" 2>&1
  done
  for r in "${list[@]}"; do
    f=$(folder "$r") b=$budget limit=$(left)
    [ "$limit" -ge "${NEED_S:-0}" ] || { echo "== $(date +%T) not started: $f needs NEED_S=${NEED_S:-0} s, $limit left"; continue; }
    local args=(--recipe "$r" "${extra[@]}" --label "$(PART='' folder "$r")" --out "out/synth/$f")
    [ -f "out/synth/$f/results.json" ] && args+=(--resume) && [ "$b" = left ] \
      && b=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["config"]["max_seconds"])' "out/synth/$f/results.json")
    [ "$b" = left ] && b=$((limit - ${EVAL_MARGIN:-60})); [ "$b" = none ] || args+=(--set "max_seconds=$b")
    echo "== $(date +%T) synth $f"; (synth "$limit" "${args[@]}" > "out/synth/$f.log" 2>&1; echo "== $(date +%T) exit $?" >> "out/synth/$f.log") &
  done
  wait; for f in "${paths[@]}"; do [ -f "out/$f" ] && echo "$f: $(tr '\r' '\n' < "out/$f" | grep . | tail -n 2 | head -n 1)"; done; pack "$stage" "${paths[@]}"
}
stage() { case $1 in
    recipes) runs "$1" "${BUDGET:-none}" ${RECIPES:?RECIPES names the runs: NAME:ARM ...} ;;  # any recipes, each to its end
    state-tracking) runs "$1" left st-attention-s2:{nope,rope,srope} st-deltanet-a3:{nope,srope} ;;
    st-gla) runs "$1" left st-gla-s2:{nope,rope,srope,srope-demo-encoding} ;;
    copying) WARM_SET="--set eval_lengths=2-8 --set eval_examples=16" EVAL_MARGIN=${EVAL_MARGIN:-150} runs "$1" left copying-release-arms:{nope,rope,srope,srope-bias,srope-gate,srope-gate-bias} ;;
    mqar) JOBS=${JOBS:-3} runs "$1" none mqar-fig6:{nope,rope,srope} ;;
    mad) JOBS=${JOBS:-2} runs "$1" none mad-table1:{nope,rope,srope,srope-gate-bias} ;;
    repeat) local i=0 a; rm -rf out/repeat && mkdir -p out/repeat  # one run alone twice, beside seed 1, with a larger evaluation
      for a in "" "" "--set seeds=0,1 --jobs 2" "--set eval_size=16384"; do i=$((i + 1)); synth "$(left)" --recipe st-gla-s2:srope-demo-encoding \
        --set eval_size=256 --set max_steps=300 --set seeds=0 $a --out "out/repeat/$i" > "out/repeat/$i.log" 2>&1; echo "repeat $i exit $?"; done
      python3 experiments/compare_repeats.py out/repeat/*/results.json | tee out/repeat/compare.txt; pack repeat repeat ;;
    lm-ablation) timeout -s INT -k 20 "$(left 60)" python3 experiments/lm_ablation.py --data .data/shakespeare --out out/lm-ablation \
      --jobs "${JOBS:-7}" --deadline "$(left 180)"; pack lm-ablation lm-ablation ;;
    *) echo "unknown stage $1"; exit 2 ;;
  esac
}
for name in "$@"; do stage "$name"; done; if [ -n "${OUT:-}" ] && [ -f .tcache/pack.sh ]; then bash .tcache/pack.sh; fi
