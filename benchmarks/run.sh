#!/usr/bin/env bash
# One GPU call: bash benchmarks/run.sh STAGE [STAGE ...]; results under $OUT (or out/gpu).
#
# Expects fla 0.6.0 wheels in .whl/ (../shared/tools/device-wheels.sh), the Triton cache in
# .tcache/ (../shared/tools/triton-cache.sh init) and a prepared token store in .data/shakespeare
# (srope data prepare shakespeare, then copy the store folder it prints); carry all three.
# Each stage gets SIGINT at its limit (pytest then still writes its report), SIGKILL 20 s later.
# SROPE_COMMIT names the commit the working tree is (the device copy's .git, if any, can be older).
#   checks      benchmarks/check_cuda.py, 12 host x position pairs: the model on CUDA against the
#               CPU, the training step as a CUDA graph against eager, resume, host syncs, graphed
#               generate (Triton autotuning cut to one config: correctness only, run it after timings)
#   gpu-tests   every test marked gpu and every kernel test (marked kernels, compiled here):
#               pytest -m "gpu or kernels" tests, one autotune candidate as for checks; JUnit
#               XML into $R/gpu-tests.xml, with each check's measured errors as properties;
#               GPU_TESTS_ARGS narrows it (e.g. a path)
#   train       srope train (the CLI) and model.generate, beside fla's GLAForCausalLM
#   layers      every host's layer with each position encoding (eager and graph), then where the
#               GLA layer's time goes: kernels, CPU ops and sampled Python stacks
#   host        host time per call (empty kernels, srope's ops, GLA layers at tiny sizes): where
#               an eager step's time goes when the GPU waits for the CPU
#   ops         the rotation ops against the other implementations, eager and graph
#   model       benchmarks/bench_model.py: a preset's training step and decoding with each position
#               encoding, eager and graphed (MODEL_ARGS, e.g. --preset gla-1.3b)
#   scaling     torchrun srope train on 1 and 2 GPUs, DDP and FSDP2 (benchmarks/bench_scaling.py;
#               SCALING_ARGS adds e.g. --jobs), on a machine of several GPUs
#   fused       the host's fused norms and SwiGLU (srope.ops.fused) against float64 on the GPU,
#               then the synthetic protocols' training steps under srope.backend auto and torch
#   synth       the synthetic protocols' training steps (benchmarks/profile_synth.py, PROFILE_ONLY:
#               configurations, default MQAR 512x64 at d 64 and 512): eager, as a CUDA graph,
#               with the head at the targets only; autotuning as the mqar runs (first candidate)
#   stalls      benchmarks/profile_stalls.py: every Triton compile and autotune and torch.compile
#               compile of a user command (STALLS_COMMAND, default `demo --device cuda`) with its
#               time, beside the GPU's busy fraction
set -u
source benchmarks/device-env.sh
run() { local limit=$1; shift; echo "== $(date +%T) $*"; timeout -s INT -k 20 "$limit" "$@" 2>&1 | tail -n 30; echo "exit ${PIPESTATUS[0]}"; }

for stage in "$@"; do
  case $stage in
    checks) run "${CHECKS_LIMIT:-300}" python3 benchmarks/fast_autotune.py benchmarks/check_cuda.py --data .data/shakespeare --out "$R/check_cuda.json" ${CHECKS_ARGS:-} ;;
    gpu-tests) TRITON_CACHE_DIR=/tmp/triton-fast run "${GPU_TESTS_LIMIT:-420}" python3 benchmarks/fast_autotune.py -m pytest -q -p no:cacheprovider \
      -m "gpu or kernels" --junitxml="$R/gpu-tests.xml" --durations=15 ${GPU_TESTS_ARGS:-tests} ;;
    fused)
      # one autotune candidate, in a cache of its own (it must not leave first-config choices behind)
      TRITON_CACHE_DIR=/tmp/triton-fast run "${FUSED_TEST_LIMIT:-240}" python3 benchmarks/fast_autotune.py -m pytest -q -p no:cacheprovider tests/ops/test_fused.py
      run "${FUSED_PROFILE_LIMIT:-240}" python3 benchmarks/profile_synth.py --only copying-nope copying-srope \
        --out "$R/profile_synth.json" ;;
    layers)
      run "${LAYER_LIMIT:-240}" python3 benchmarks/bench_layer.py --out "$R/layer.json"
      run "${PROFILE_LIMIT:-150}" python3 benchmarks/profile_layer.py --python --out "$R/profile_layer.json" ;;
    synth) SROPE_AUTOTUNE=${AUTOTUNE:-first} run "${SYNTH_LIMIT:-300}" python3 benchmarks/profile_synth.py --backend auto \
      --only ${PROFILE_ONLY:-mqar-512x64-d64-srope mqar-512x64-d512-srope} --out "$R/profile_synth.json" ;;
    host) run "${HOST_LIMIT:-120}" python3 benchmarks/bench_host.py --out "$R/host.json" ${HOST_ARGS:-} ;;
    ops) run "${OP_LIMIT:-300}" python3 benchmarks/bench_op.py --out "$R/op.json" ;;
    model) run "${MODEL_LIMIT:-300}" python3 benchmarks/bench_model.py --out "$R/model.json" ${MODEL_ARGS:-} ;;
    scaling) run "${SCALING_LIMIT:-560}" python3 benchmarks/bench_scaling.py --data .data/shakespeare --out "$R/scaling.json" ${SCALING_ARGS:-} ;;
    train) run "${TRAIN_LIMIT:-420}" python3 benchmarks/bench_train.py --data .data/shakespeare --out "$R/train.json" ${TRAIN_ARGS:-} ;;
    stalls) run "${STALLS_LIMIT:-300}" python3 benchmarks/profile_stalls.py --out "$R/stalls.json" -- srope ${STALLS_COMMAND:-demo --device cuda} ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
[ -f .tcache/pack.sh ] && bash .tcache/pack.sh
