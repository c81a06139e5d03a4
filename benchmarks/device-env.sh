# Sourced at the start of a GPU call (benchmarks/run.sh, experiments/gpu.sh): installs the
# carried fla wheels, points Python at src/ and Triton at the carried cache; sets R, the
# result folder ($OUT on the device machine, else out/gpu).
# once per machine: a second install under a running job would replace the packages it imports
stamp=/tmp/site/.installed-$(ls .whl | md5sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  touch "$stamp"
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
if [ -f .tcache/use.sh ]; then source .tcache/use.sh; else export TRITON_CACHE_DIR=$PWD/.tcache/cache; mkdir -p "$TRITON_CACHE_DIR"; fi
R=${OUT:-$PWD/out/gpu}  # absolute: pack_synth archives from inside out/
mkdir -p "$R"
