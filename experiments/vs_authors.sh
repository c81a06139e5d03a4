#!/usr/bin/env bash
# experiments/vs_authors.py on the GPU machine: every task's stream at once (one process per run
# inside each), cut at CALL_S seconds so that the report and Triton's cache come back.
# Carry .whl .whl-st .tcache .authors (see vs_authors.py) and, to go on from an earlier call,
# its result files in vs-prev/ (runs with a result there are not run again).
#   TASKS="copying mqar state_tracking" SEEDS="0 1 2" CALL_S=540 bash experiments/vs_authors.sh
set -u
source benchmarks/device-env.sh
export TQDM_MININTERVAL=30 HF_DATASETS_DISABLE_PROGRESS_BARS=1
if [ -d .whl-st ] && [ -n "$(ls .whl-st)" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-st/*.whl || exit 1
fi
python3 -c "import torch, triton, pyarrow; print('torch', torch.__version__, 'triton', triton.__version__, 'pyarrow', pyarrow.__version__, torch.cuda.get_device_name())"
V=$R/vs
mkdir -p "$V"
if [ -d vs-prev ]; then cp vs-prev/*.json "$V/" 2>/dev/null; fi
# One stream per task and seed: the models are small, so the GPU has room for all of them and
# a call holds more seeds than one stream per task could run in turn.
for task in ${TASKS:-copying mqar state_tracking}; do
  for seed in ${SEEDS:-0 1 2}; do
    timeout "${CALL_S:-540}" python3 experiments/vs_authors.py all --release .authors/selective-rope --release-commit "${RELEASE_COMMIT:-d12e825}" \
      --tasks "$task" --seeds "$seed" --out "$V" > "$R/vs-$task-$seed.log" 2>&1 &
  done
done
wait
rm -rf "$V"/ours-*/  # run folders: their results are in the per-run JSON
python3 experiments/vs_authors.py report "$V" > "$R/vs-report.log" 2>&1
for f in "$R"/vs-*-*.log; do echo "== $f"; tail -n 4 "$f"; done; tail -n 60 "$R/vs-report.log"
# At most 8 files of 16 MiB come back from a call: the results, the figure and the logs in one
# archive, the logs moved out of $R so that nothing else counts against the eight.
du -sh "$V"/* | sort -h | tail -n 5
mv "$R"/vs-*.log "$V/"
(cd "$R" && tar czf vs.tgz vs/*.json vs/*.png vs/*.log) && rm -rf "$V"
[ -f .tcache/pack.sh ] && bash .tcache/pack.sh
