#!/usr/bin/env bash
# Everything a GPU call runs, by stage: bash benchmarks/gpu_session.sh STAGE [STAGE ...]
#
# Expects (see GUIDE §6): fla 0.6.0 wheels in .whl/ (../shared/tools/device-wheels.sh), the
# Triton cache in .tcache/ (../shared/tools/triton-cache.sh init), the prepared Shakespeare
# token store in .data/shakespeare (srope data prepare shakespeare, then copy the store).
# Results go to gpu_results/ and come back as $OUT/results.tgz with the Triton cache.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
source .tcache/use.sh
R=gpu_results
mkdir -p $R
log() { echo "== $(date +%T) $*"; }
run() { local limit=$1; shift; log "$*"; timeout "$limit" "$@" 2>&1 | tail -n 40; echo "exit ${PIPESTATUS[0]}"; }
FAST="python benchmarks/fast_autotune.py"  # correctness only: one autotune candidate per kernel

stage_checks() {
  run 120 python benchmarks/check_cuda_rotary.py --out $R/rotary_checks_h200.json
  run 150 python -m pytest tests/triton -m gpu -q -x -p no:cacheprovider
  run 240 $FAST benchmarks/check_cuda_models.py --out $R/models_cuda_h200.json
  run 200 $FAST benchmarks/check_cuda_mixers.py --skip-timings --out $R/mixers_checks_h200.json
}

stage_models() {
  run 200 $FAST benchmarks/check_cuda_models.py --out $R/models_cuda_h200.json
}

stage_bench() {
  run 200 python benchmarks/bench_op.py --out $R/op_h200.json
  run 150 python benchmarks/bench_layer.py --out $R/layer_h200.json
  run 120 python benchmarks/bench_model.py --preset gla-370m --out $R/model_h200.json
  run 120 python benchmarks/check_cuda_mixers.py --skip-checks --out $R/mixers_timings_h200.json
}

stage_lm() {  # a small GLA on Shakespeare: NoPE / RoPE / SRoPE, lr chosen per PE, ppl beyond the context
  for pe in nope rope selective_rope; do
    run 110 $FAST -m srope sweep-lr --preset gla-370m --position $pe --data .data/shakespeare --max-steps 200 \
      --lrs 1e-3,3e-3 --out $R/lm/$pe --set model.num_hidden_layers=4 --set seq_len=512 \
      --set global_batch_size=32 --set checkpoint_every=10000 --set eval_rows=128 --set tensorboard=false
  done
  python - <<'PY'
import json, pathlib
for pe in ("nope", "rope", "selective_rope"):
    sweep = pathlib.Path(f"gpu_results/lm/{pe}/sweep.json")
    if sweep.exists():
        print(pe, json.loads(sweep.read_text()).get("chosen"))
PY
  for pe in nope rope selective_rope; do
    best=$(python -c "import json;print(json.load(open('$R/lm/$pe/sweep.json'))['chosen']['dir'])" 2>/dev/null) || continue
    run 50 $FAST -m srope eval --model "$R/lm/$pe/$best" --seq-len 512 1024 2048 --max-rows 32 --out $R/lm/$pe-eval.json
  done
}

stage_recheck() {  # what changed since the last full check: the decode checks, the fp32 DeltaNet route
  run 120 python benchmarks/check_cuda_rotary.py --out $R/rotary_checks_h200.json
  run 120 $FAST benchmarks/check_cuda_mixers.py --skip-timings --only deltanet --out $R/mixers_checks_deltanet_h200.json
}

stage_kernels() {  # the rotation kernels: checks at real sizes, GPU tests, per-kernel times
  run 120 python benchmarks/check_cuda_rotary.py --out $R/rotary_checks_h200.json
  run 150 python -m pytest tests/triton -m gpu -q -x -p no:cacheprovider
  run ${TUNE_LIMIT:-150} python benchmarks/tune_rotation.py --out $R/tune_rotation_h200.json --budget-s ${TUNE_BUDGET:-120}
}

stage_speed() {  # op, layer and model benchmarks (the issue's three levels)
  run ${OP_LIMIT:-240} python benchmarks/bench_op.py --out $R/op_h200.json
  run 150 python benchmarks/bench_layer.py --out $R/layer_h200.json
  run 150 python benchmarks/bench_model.py --preset gla-370m --out $R/model_h200.json
}

# `srope demo --device cuda` (the paper-scale preset) on the GPU while the spare CPU cores
# screen CPU-preset recipes (benchmarks/screen_demo.py; SCREEN_VARIANTS, SCREEN_SEEDS)
stage_demo() {
  local screen_pid=
  if [ -n "${SCREEN_VARIANTS:-}" ]; then
    mkdir -p $R/demo_screen
    OMP_NUM_THREADS=2 python benchmarks/screen_demo.py --variants "$SCREEN_VARIANTS" --seeds "${SCREEN_SEEDS:-0-4}" --threads 2 \
      --out $R/demo_screen/screen.json > $R/demo_screen/screen.log 2>&1 &
    screen_pid=$!
  fi
  run ${DEMO_LIMIT:-240} $FAST -m srope demo --device cuda --out $R/demo_cuda
  if [ -n "$screen_pid" ]; then
    timeout ${SCREEN_WAIT:-240} tail --pid=$screen_pid -f /dev/null; kill $screen_pid 2>/dev/null
    tail -n 12 $R/demo_screen/screen.log
  fi
}

stage_generator() {  # the short conv through fla and the x̂-free generator: checks, profile, layer
  run 200 python -m pytest tests/ops/test_conv.py tests/triton -m gpu -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu.xml
  run 150 python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
  run 150 python benchmarks/bench_layer.py --out $R/layer_h200.json
}

stage_model() {  # the HF models on CUDA (cached generation with the fla conv), then their speed
  run 150 python benchmarks/bench_model.py --preset gla-370m --out $R/model_h200.json
  run 240 $FAST benchmarks/check_cuda_models.py --out $R/models_cuda_h200.json
}

stage_graphs() {  # eager and CUDA-graph layer and model speed; the graphed decode checked against eager
  run 240 python benchmarks/bench_layer.py --out $R/layer_h200.json
  run 300 python benchmarks/bench_model.py --preset gla-370m --out $R/model_h200.json
}

stage_decode() {  # the decode step's kernels on the GPU (tests, checks), the model benchmark with graphs, the model checks
  run 200 $FAST -m pytest tests/triton -m gpu -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu.xml
  run 120 python benchmarks/check_cuda_rotary.py --out $R/rotary_checks_h200.json
  run 200 python benchmarks/bench_model.py --preset gla-370m --out $R/model_h200.json
  run 240 $FAST benchmarks/check_cuda_models.py --out $R/models_cuda_h200.json
}

stage_final() {  # the CUDA demo preset, then the GPU tests of the final code
  run ${DEMO_LIMIT:-240} $FAST -m srope demo --device cuda --out $R/demo_cuda
  run 200 $FAST -m pytest tests/triton tests/ops/test_conv.py -m gpu -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu.xml
}

stage_cudademo() {  # `srope demo --device cuda` itself, for each seed in CUDA_SEEDS
  for seed in ${CUDA_SEEDS:-0}; do
    run ${DEMO_LIMIT:-240} $FAST -m srope demo --device cuda --seed $seed --out $R/demo_cuda_seed$seed
  done
}

stage_cpuscreen() {  # a demo recipe screen on the host's CPUs: SCREEN_VARIANTS, SCREEN_SEEDS, SCREEN_LIMIT, SCREEN_THREADS per run (2)
  log "screen $SCREEN_VARIANTS seeds $SCREEN_SEEDS on $(nproc) CPUs"
  OMP_NUM_THREADS=${SCREEN_THREADS:-2} CUDA_VISIBLE_DEVICES= timeout ${SCREEN_LIMIT:-500} python benchmarks/screen_demo.py --variants $SCREEN_VARIANTS \
    --seeds $SCREEN_SEEDS --threads ${SCREEN_THREADS:-2} --eval-size 1000 --out $R/screen.json 2>&1 | tail -n 120
}

stage_gatetest() {  # the fused head gate compiled: its tests and the projection gradient's, then every GPU test
  run 150 python -m pytest tests/triton/test_head_gate.py tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA \
    --junitxml=$R/pytest_gpu_head_gate.xml
  run 240 python -m pytest tests/triton tests/ops/test_conv.py -m gpu -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu.xml
}

stage_gatelayer() {  # the GLA layer with each PE and Selective RoPE with the torch gate (same run)
  run 150 python benchmarks/bench_layer.py --hosts gla --out $R/layer_gla_h200.json
}

stage_gatemodel() {  # gla-370m training and decoding speed with each PE
  run ${MODEL_LIMIT:-200} python benchmarks/bench_model.py --preset gla-370m --out $R/model_h200.json
}

stage_opsrope() {  # the Selective RoPE op alone (our fixed RoPE beside it), at the four benchmark shapes
  run ${OP_LIMIT:-240} python benchmarks/bench_op.py --only srope_triton,rope_srope --skip-decode --out $R/op_srope_h200.json
}

stage_opdecode() {  # the op-level one-token decode step (and our RoPE op beside it), without the full op benchmark
  run 200 python benchmarks/bench_op.py --only rope_srope --out $R/op_decode_h200.json
}

stage_profile() {  # kernel by kernel: the GLA layer with each PE, the angle generator, its conv
  run ${PROFILE_LIMIT:-200} python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
}

stage_genops() {  # the generator's kernels attributed to ATen ops (profile_layer's parts.generator.ops)
  run 150 python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
}

stage_final2() {  # the CUDA demo preset with the CPU preset's projection gain, then the GPU tests of the final code
  run ${DEMO_LIMIT:-240} $FAST benchmarks/screen_demo.py --full '{"selective_rope": {"projection_gain": 8}}' --preset cuda \
    --device cuda --out $R/demo_cuda_gain8
  run 240 $FAST -m pytest tests/triton tests/ops/test_conv.py -m gpu -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu.xml
  run 100 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA
}

stage_cudavariant() {  # one whole CUDA demo of a variant: CUDA_VARIANT (JSON overrides of the cuda preset) -> CUDA_VARIANT_OUT
  run ${DEMO_LIMIT:-240} $FAST benchmarks/screen_demo.py --full "$CUDA_VARIANT" --preset cuda --device cuda --seed ${CUDA_SEED:-0} \
    --out $R/$CUDA_VARIANT_OUT
}

stage_fusedgrad() {  # the generator's fused input gradient: tiles against torch, its GPU tests, then gradlow
  run 120 python benchmarks/tune_projection_grad.py --out $R/tune_projection_grad_h200.json
  run 200 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA
  stage_gradlow
}

stage_foldgrad() {  # dz and the norm's coefficient folded into the fused input gradient: tiles, GPU tests, then gradlow and the model checks
  run 150 python benchmarks/tune_projection_grad.py --out $R/tune_projection_grad_h200.json
  run 100 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider
  run 200 $FAST -m pytest tests/triton tests/ops/test_conv.py -m gpu -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu.xml
  stage_gradlow
  stage_models
}

stage_gradlow() {  # the generator's backward products under autocast: profile, GLA layer, model speed, model checks
  run 150 python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
  run 120 python benchmarks/bench_layer.py --hosts gla --out $R/layer_gla_h200.json
  run 240 python benchmarks/bench_model.py --preset gla-370m --out $R/model_h200.json
}

stage_verify() {  # the GPU tests and checks of the current tree, then the full op benchmark
  run 120 python benchmarks/check_cuda_rotary.py --out $R/rotary_checks_h200.json
  stage_gputests
  run ${OP_LIMIT:-240} python benchmarks/bench_op.py --out $R/op_h200.json
}

stage_light() {  # the light kernels walked token by token: checks, GPU tests, the op benchmark, their tiles
  stage_verify
  run 200 python benchmarks/tune_rotation.py --light-only --shapes 0,1,2 --budget-s 150 --out $R/tune_rotation_light_h200.json
}

stage_final3() {  # after the light kernels' tile change: GPU tests, the op benchmark, the GLA layer and the model
  stage_gputests
  run ${OP_LIMIT:-240} python benchmarks/bench_op.py --out $R/op_h200.json
  stage_gatelayer
  stage_gatemodel
}

stage_genfwd() {  # the generator projection's float32 forward on tensor cores: its tests and tiles, the scans' tiles, the GLA layer, every GPU test
  run 150 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  run 120 python benchmarks/tune_projection_grad.py --out $R/tune_projection_h200.json
  run 130 python benchmarks/tune_rotation.py --scan-only --shapes 1,0 --budget-s 100 --out $R/tune_rotation_scan_h200.json
  run 150 python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
  stage_gatelayer
}

stage_genfwd2() {  # the forward's products from fresh accumulators per chunk: its tests and tiles
  run 150 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  run 120 python benchmarks/tune_projection_grad.py --out $R/tune_projection_h200.json
}

stage_final4a() {  # the final code: rotation checks, every GPU test, the op benchmark
  run 120 python benchmarks/check_cuda_rotary.py --out $R/rotary_checks_h200.json
  stage_gputests
  run ${OP_LIMIT:-240} python benchmarks/bench_op.py --out $R/op_h200.json
}

stage_final4b() {  # the final code: the GLA layer with each PE, its profile, gla-370m training and decoding
  stage_gatelayer
  run 150 python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
  stage_gatemodel
}

stage_final5() {  # 64-bit row offsets in the projection's input gradient: its tests and tiles, every GPU test, the GLA layer, the model
  run 150 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  run 120 python benchmarks/tune_projection_grad.py --out $R/tune_projection_h200.json
  stage_gputests
  stage_gatelayer
  stage_gatemodel
}

stage_final6() {  # the forward's 32-input tile: its tests, every GPU test, the GLA layer, the model
  run 100 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  stage_gputests
  stage_gatelayer
  stage_gatemodel
}

stage_wgrad() {  # the weight gradient fused into the projection's backward kernel: its tests and tiles, the GLA layer, its profile
  run 150 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  run 150 python benchmarks/tune_projection_grad.py --backward-only --out $R/tune_projection_backward_h200.json
  stage_gatelayer
  run 150 python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
}

stage_final7() {  # the fused weight gradient's larger tiles, its tests, every GPU test, the GLA layer, its profile, the model
  run 100 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  run 120 python benchmarks/tune_projection_grad.py --backward-only --out $R/tune_projection_backward_tiles_h200.json
  stage_gputests
  stage_gatelayer
  run 150 python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
  stage_gatemodel
}

stage_final8() {  # the generator's cast shared with the host's linear maps: projection tests, every GPU test, the GLA layer, its profile, the model, the CUDA model checks
  run 100 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  stage_gputests
  stage_gatelayer
  run 150 python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
  stage_gatemodel
  run 200 $FAST benchmarks/check_cuda_models.py --out $R/models_cuda_h200.json
}

stage_final9() {  # the final code's GPU tests: the projection's (with their tolerances for recompiled variants), then every GPU test
  run 100 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  stage_gputests
}

stage_gputests() {  # every GPU test (one autotune candidate per kernel), its log and junit xml returned
  run ${TEST_LIMIT:-450} $FAST -m pytest tests/triton tests/ops/test_conv.py -m gpu -q -p no:cacheprovider -rA \
    --junitxml=$R/pytest_gpu.xml > $R/pytest_gpu.log 2>&1
  tail -n 5 $R/pytest_gpu.log
}

stage_op() {
  run ${OP_LIMIT:-240} python benchmarks/bench_op.py --out $R/op_h200.json
}

# copying with GLA (train lengths 2-64, evaluate 2-512), one run per position encoding;
# COPY_PES, COPY_STEPS and COPY_LIMIT (seconds per run) from the environment
stage_copying() {
  for pe in ${COPY_PES:-nope rope selective_rope}; do
    mkdir -p $R/synthetic
    log "copying $pe"
    timeout ${COPY_LIMIT:-150} $FAST -m srope synth copying --device cuda --position $pe \
      --set seeds=0 --set steps=${COPY_STEPS:-1500} --set batch_size=${COPY_BATCH:-256} --set eval_lengths=2-512:30 \
      --set eval_examples=200 --out $R/synthetic/copying-$pe > $R/synthetic/copying-$pe.log 2>&1
    echo "exit $?"; tail -c 600 $R/synthetic/copying-$pe.log | tr '\r' '\n' | tail -n 6
  done
}

# gla-370m (Selective RoPE) on 1 GPU, then 2 GPUs with DDP and with FSDP2 (nvidia-h200-x2);
# same global batch; tokens/s from metrics.jsonl. Needs the prepared token store in .data.
stage_multi_gpu() {
  local common="--preset gla-370m --data shakespeare --cache .data --max-steps ${MG_STEPS:-20} --set seq_len=2048
    --set global_batch_size=16 --set checkpoint_every=100000 --set eval_rows=4 --set tensorboard=false"
  run ${MG_LIMIT:-110} $FAST -m srope train $common --out $R/multi_gpu/1gpu
  run ${MG_LIMIT:-110} torchrun --nproc-per-node 2 benchmarks/fast_autotune.py -m srope train $common --set parallel=ddp --out $R/multi_gpu/ddp
  run ${MG_LIMIT:-110} torchrun --nproc-per-node 2 benchmarks/fast_autotune.py -m srope train $common --set parallel=fsdp --out $R/multi_gpu/fsdp
}

stage_parity() {
  for pe in nope rope selective_rope; do
    run 85 $FAST -m srope synth state_tracking --device cuda --position $pe --no-progress \
      --set seeds=0 --set train_size=100000 --set eval_size=1000 --set epochs=4 --out $R/synthetic/parity-$pe
  done
}

# stop 22's candidates for the projection's kernels, each alone at the GLA-370M shape (prepared
# without a GPU): then, for the winners, gputests and speed
stage_projvariants() {
  run ${PROJ_LIMIT:-420} python benchmarks/projection_variants.py --out $R/projection_variants_h200.json
}

stage_compile() {  # whole models under torch.compile (inductor) on CUDA: graph breaks, compiled step against eager
  run ${COMPILE_LIMIT:-420} python benchmarks/check_compile.py --out $R/compile_cuda_h200.json --positions selective_rope
}

stage_stop23() {  # the transposed projection backward and the pipelined norm pass: their tests (the norm pass falls
  # back to (32, 1) in this copy if they fail), every GPU test, the GLA layer, gla-370m training and decoding
  run 150 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  if ! grep -q 'failures="0"' $R/pytest_gpu_projection.xml || grep -q 'errors="[1-9]' $R/pytest_gpu_projection.xml; then
    log "projection tests failed: NORM_PASS = (32, 1) in this copy"; sed -i 's/^NORM_PASS = .*/NORM_PASS = (32, 1)/' src/srope/ops/triton/projection.py
  fi
  TEST_LIMIT=${TEST_LIMIT:-200} stage_gputests
  stage_gatelayer
  stage_gatemodel
}

stage_stop23b() {  # the backward's tiles near the shipped one, the layer's profile, compiled GLA and attention models
  run 150 python benchmarks/projection_variants.py --only "shipped,bandwidth,tile,forward shipped" --out $R/projection_tiles_h200.json
  run 150 python benchmarks/profile_layer.py --out $R/profile_layer_h200.json
  run ${COMPILE_LIMIT:-250} python benchmarks/check_compile.py --out $R/compile_cuda_h200.json --positions selective_rope --mixers gla,attention
}

stage_stop23c() {  # the three-stage backward tile: projection tests, tiles beside it, the GLA layer, the model, compiled GLA and GDN
  run 150 python -m pytest tests/triton/test_projection_kernels.py -q -p no:cacheprovider -rA --junitxml=$R/pytest_gpu_projection.xml
  run 150 python benchmarks/projection_variants.py --only "shipped,bandwidth,tile" --out $R/projection_tiles_h200.json
  stage_gatelayer
  stage_gatemodel
  run ${COMPILE_LIMIT:-250} python benchmarks/check_compile.py --out $R/compile_cuda_h200.json --positions selective_rope --mixers gla,gated_deltanet
}

stage_stop24() {  # the projection writing the gate's shares apart, the gate's one kernel each way: their tests,
  # the kernels alone, the GLA layer, gla-370m training and decoding, the layer's profile
  run 200 python -m pytest tests/triton/test_projection_kernels.py tests/triton/test_head_gate.py -q -p no:cacheprovider -rA \
    --junitxml=$R/pytest_gpu_projection.xml
  run 150 python benchmarks/projection_variants.py --only "shipped,parts,bandwidth,forward shipped,forward split" \
    --out $R/projection_split_h200.json
  stage_gatelayer
  stage_gatemodel
  stage_profile
}

stage_stop24b() {  # every GPU test of the final code, a second run of the GLA layer and gla-370m, compiled GLA and GDN
  TEST_LIMIT=${TEST_LIMIT:-280} stage_gputests
  stage_gatelayer
  stage_gatemodel
  run ${COMPILE_LIMIT:-180} python benchmarks/check_compile.py --out $R/compile_cuda_h200.json --positions selective_rope --mixers gla,gated_deltanet
}

stage_stop24c() {  # the conv's activation moved into the gate's kernel: every GPU test, the GLA layer, gla-370m, the profile
  TEST_LIMIT=${TEST_LIMIT:-280} stage_gputests
  stage_gatelayer
  stage_gatemodel
  stage_profile
}

stage_stop24d() {  # a second run of the final code's GLA layer and gla-370m, and the projection kernels alone again
  stage_gatelayer
  stage_gatemodel
  run 100 python benchmarks/projection_variants.py --only "shipped,parts,forward shipped,forward split" \
    --out $R/projection_split_h200.json
}

# Programmatic dependent launch (srope.ops.triton.ops.pdl) against SROPE_PDL=0 in the same call
stage_pdltest() {  # its GPU test, with the compile + CUDA-graph one
  run 200 python -m pytest tests/triton/test_gpu.py -q -p no:cacheprovider -rA -k "programmatic or inductor" \
    --junitxml=$R/pytest_gpu_pdl.xml
}
stage_pdlop() {  # the rotation op and the decode step, PDL off then on
  SROPE_PDL=0 run ${OP_LIMIT:-150} python benchmarks/bench_op.py --only srope_triton,rope_srope --out $R/op_srope_pdl_off_h200.json
  run ${OP_LIMIT:-150} python benchmarks/bench_op.py --only srope_triton,rope_srope --out $R/op_srope_h200.json
}
stage_pdlop2() {  # a second run, PDL on then off
  run ${OP_LIMIT:-150} python benchmarks/bench_op.py --only srope_triton,rope_srope --out $R/op_srope_run2_h200.json
  SROPE_PDL=0 run ${OP_LIMIT:-150} python benchmarks/bench_op.py --only srope_triton,rope_srope --out $R/op_srope_pdl_off_run2_h200.json
}
stage_pdllayer() {  # the GLA layer with each PE, PDL off then on
  SROPE_PDL=0 run 150 python benchmarks/bench_layer.py --hosts gla --out $R/layer_gla_pdl_off_h200.json
  stage_gatelayer
}
stage_pdlmodel() {  # gla-370m training and decoding, PDL on then off
  stage_gatemodel
  SROPE_PDL=0 run ${MODEL_LIMIT:-200} python benchmarks/bench_model.py --preset gla-370m --out $R/model_pdl_off_h200.json
}
stage_compilegdn() {  # Gated DeltaNet + Selective RoPE compiled whole on CUDA (after the warn_once fix of stop 24)
  run ${COMPILE_LIMIT:-200} python benchmarks/check_compile.py --out $R/compile_cuda_gdn_h200.json --positions selective_rope \
    --mixers gated_deltanet
}

stage_stop26() {  # the final code of stop 26 (bf16 dL/dangle scratch for a bf16 phi, the scans load one step
  # ahead, the offset's gradient without phi's): checks, GPU tests, the whole op benchmark, the light kernels'
  # tiles (and the chunk sums without maxnreg), the scans' tiles at 1x65536
  run 150 python benchmarks/check_cuda_rotary.py --out $R/rotary_checks_h200.json
  run 200 python -m pytest tests/triton tests/ops/test_conv.py -m gpu -q -p no:cacheprovider --junitxml=$R/pytest_gpu_h200.xml
  run ${OP_LIMIT:-300} python benchmarks/bench_op.py --out $R/op_h200.json
  run 100 python benchmarks/tune_rotation.py --light-only --shapes 0,1,2 --out $R/tune_rotation_light_h200.json --budget-s 80
  run 100 python benchmarks/tune_rotation.py --scan-only --shapes 1 --out $R/tune_rotation_scan_h200.json --budget-s 80
}
stage_baseline() {  # the op benchmark of an earlier commit in the same call, for ratios against it: here first
  # `mkdir .old && git archive REV src benchmarks tests | tar -x -C .old` and carry .old (stop 26: REV e1b4962,
  # its output kept as op_srope_stop25_code_h200.json)
  (cd .old && PYTHONPATH=/tmp/site:$PWD/src:$PWD run 150 python benchmarks/bench_op.py --only srope_triton --skip-decode \
    --out ../$R/op_srope_baseline_h200.json)
}
stage_stop26b() {  # the GPU tests of the final code (the first try's run did not come back), a second op run
  run 240 python -m pytest tests/triton -m gpu -q -p no:cacheprovider --junitxml=$R/pytest_gpu_h200.xml 2>&1 | tee $R/pytest_gpu_h200.log
  run 120 python benchmarks/bench_op.py --only srope_triton,rope_srope --skip-decode --out $R/op_srope_run2_h200.json
}

pack() {  # after every stage, so that a call cut short still returns what finished
  find $R \( -name '*.xml' -o -name '*.json' -o -name '*.md' -o -name '*.png' -o -name '*.jsonl' -o -name '*.log' \) -not -path '*/checkpoints/*' -not -path '*/model/*' \
    | tar czf "$OUT/results.tgz" -T -
}

for stage in "$@"; do "stage_$stage"; log "packing results"; pack; done
bash .tcache/pack.sh
