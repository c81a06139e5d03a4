#!/usr/bin/env bash
# The release-exact presets on the GPU (carry .whl and .tcache; SROPE_COMMIT names the commit).
#   bash experiments/release.sh start     a few captured steps of every release preset (their
#                                         speed and that they run), then MQAR 512x64 with Zoology's
#                                         model started detached: Selective RoPE, NoPE and RoPE at
#                                         width MQAR_WIDTH, one learning rate of MQAR_LRS after the other
#                                         (PROBE=1: profile and concurrency probes first)
#   bash experiments/release.sh collect   waits for the detached runs while the call lasts (CALL_S),
#                                         then packs every results.json and log into $OUT/release.tgz
#                                         (STOP=1: stops runs still going, keeping their checkpoints;
#                                         CHECKPOINTS=1: keeps each run's latest checkpoint while runs
#                                         go on, so that a machine lost before the next call costs little)
# Detached runs live while the machine is warm: queue each collect as soon as the last returns.
set -u
END=$(($(date +%s) + ${CALL_S:-560}))
source benchmarks/device-env.sh
export SROPE_AUTOTUNE=first TQDM_MININTERVAL=60  # no minutes of fla autotuning per new width
synth() { python3 -m srope synth "$@" --set cuda_graph=on --no-progress; }
smoke() {
  mkdir -p out/release/smoke
  while read -r name args; do
    [ -n "$name" ] || continue  # SMOKE_ONLY matched none
    # shellcheck disable=SC2086
    synth $args --set max_steps=40 --set seeds=0 --out "out/release/smoke/$name" > "out/release/smoke/$name.log" 2>&1
    python3 - "out/release/smoke/$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1] + "/results.json"))["runs"][0]
print(f"{sys.argv[1]}: {r['steps']} steps ({r['graph_steps']} captured) in {r['seconds']:.1f} s, eval {r['eval_seconds']:.1f} s, score {r['score']:.4f}")
PY
  done <<LIST
$(grep -E "${SMOKE_ONLY:-.}" <<'ALL'
st-release state_tracking --preset release --set train_size=40960 --set eval_size=2048
st-release-attention state_tracking --preset release_attention --set train_size=40960 --set eval_size=2048
copying-release copying --preset release --set eval_lengths=2-80 --set eval_examples=64
copying-release-gate-bias copying --preset release --set eval_lengths=2-80 --set eval_examples=64 --set position.gate=standard --set position.bias=true
mqar-release mqar --preset release --set configs=512x64 --set d_models=128 --set lrs=0.01 --set test_examples=512
ALL
)
LIST
}
# Fig. 6's recipe (mqar-fig6, Zoology's model) at width MQAR_WIDTH, one learning rate of MQAR_LRS
# after the other, its arms MQAR_ARMS one after the other (MQAR_AT_ONCE=1: at once; =all: every
# run at once), seeds MQAR_SEEDS, each to the protocol's end (early stopping at 0.99) or
# MQAR_SECONDS. A folder that holds a run already (an earlier call's, carried in out/release)
# resumes from its checkpoint.
mqar_chain() {
  for lr in ${MQAR_LRS:-0.00215}; do
    for arm in ${MQAR_ARMS:-srope nope rope}; do
      name="mqar-fig6-d${MQAR_WIDTH:-128}-lr$lr-$arm" args=()
      [ "${MQAR_SECONDS:-none}" = none ] || args+=(--set "max_seconds=$MQAR_SECONDS")
      [ -f "out/release/$name/results.json" ] && args+=(--resume)
      synth --recipe "mqar-fig6:$arm" --set d_models="${MQAR_WIDTH:-128}" --set lrs="$lr" --set seeds="${MQAR_SEEDS:-0}" \
        "${args[@]}" --out "out/release/$name" > "out/release/$name.log" 2>&1 &
      [ "${MQAR_AT_ONCE:-0}" = 0 ] && wait
    done
    [ "${MQAR_AT_ONCE:-0}" = all ] || wait
  done
  wait
}
# PROBE=1: before the chain, where MQAR's step spends its time and how many steps 1 and 3 runs
# at once make, time-sliced and under the MPS daemon (which stays on for the chain when MPS=1).
probe() {
  python3 benchmarks/profile_synth.py --only mqar-release-512x64-d64-srope mqar-release-512x64-d128-srope --backend auto --steps 20 \
    --out "$R/profile-mqar.json" 2>&1 | grep -v Warning
  python3 benchmarks/bench_concurrent.py --only mqar-release-512x64-d64-srope --processes 1 3 --out "$R/concurrent-timesliced.json"
  mps_on && python3 benchmarks/bench_concurrent.py --only mqar-release-512x64-d64-srope --processes 3 6 --out "$R/concurrent-mps.json"
  [ "${MPS:-0}" = 1 ] || { echo quit | nvidia-cuda-mps-control; }
}
# The MPS daemon lets the kernels of several processes overlap instead of taking turns.
mps_on() { nvidia-cuda-mps-control -d && sleep 2 && echo "MPS daemon started" && nvidia-smi -q | grep -i "compute mode"; }
case "$1" in
  start)
    python3 -c "import torch, triton; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"
    smoke
    [ "${PROBE:-0}" = 1 ] && probe
    [ "${MPS:-0}" = 1 ] && [ "${PROBE:-0}" != 1 ] && mps_on
    mkdir -p out/gpu
    { declare -f synth mqar_chain; echo mqar_chain; } > out/gpu/release-chain.sh
    setsid nohup bash out/gpu/release-chain.sh > out/gpu/release-chain.log 2>&1 < /dev/null &
    echo $! > out/gpu/release-chain.pid ;;&
  start|collect)
    while kill -0 "$(cat out/gpu/release-chain.pid)" 2>/dev/null && [ $((END - $(date +%s))) -gt ${STOP_MARGIN:-25} ]; do sleep 10; done
    keep=(--exclude=checkpoints)
    if [ "${STOP:-0}" = 1 ] && kill -0 "$(cat out/gpu/release-chain.pid)" 2>/dev/null; then
      # the last call of the machine: every run checkpoints at its next step and exits; the
      # latest checkpoints travel back, to resume from out/release in a later session
      pkill -INT -f "srope synth"; sleep 45
    fi
    if [ "${STOP:-0}" = 1 ] || [ "${CHECKPOINTS:-0}" = 1 ]; then
      mapfile -t keep < <(echo "--exclude=*.tmp"; for c in out/release/*/runs/*/checkpoints; do
        [ -d "$c" ] && ls -d "$c"/step_* | grep -v '\.tmp$' | head -n -1 | sed 's|^out/|--exclude=|'; done)
    fi
    for f in out/release/mqar-*.log; do echo "$f: $(tail -c 300 "$f" | tr '\r' '\n' | tail -n 1)"; done
    tar czf "$R/release.tgz" "${keep[@]}" -C out release gpu/release-chain.log
    [ "$(stat -c %s "$R/release.tgz")" -le $((15 << 20)) ] || { split -b 15M -d "$R/release.tgz" "$R/release.tgz." && rm "$R/release.tgz"; }
    ls -la "$R" ;;
esac
