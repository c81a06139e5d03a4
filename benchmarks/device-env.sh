# Sourced at the start of a GPU call (benchmarks/run.sh, experiments/gpu.sh): installs the
# carried fla wheels, points Python at src/ and Triton at its cache; sets R, the result folder
# ($OUT on the device machine, else out/gpu).
# Wheels and Triton's cache live outside the working tree, set up once per machine: a call
# replaces the carried .whl and .tcache (and removes them when it carries neither), and a run
# detached from an earlier call lost its compiled kernels that way (its evaluation failed
# reading one); a second install under a running job would replace the packages it imports.
if [ -d .whl ] && [ -n "$(ls .whl)" ]; then
  stamp=/tmp/site/.installed-$(ls .whl | md5sum | cut -c1-12)
  if [ ! -f "$stamp" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    touch "$stamp"
  fi
elif ! compgen -G '/tmp/site/.installed-*' > /dev/null; then
  echo "device-env: no wheels in .whl and none installed on this machine: carry .whl" >&2
  exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/srope-triton-cache
if [ ! -f "$TRITON_CACHE_DIR.seeded" ]; then
  mkdir -p "$TRITON_CACHE_DIR"
  if [ -f .tcache/triton-cache.tgz ]; then tar xzf .tcache/triton-cache.tgz -C "$TRITON_CACHE_DIR" || exit 1; fi
  touch "$TRITON_CACHE_DIR.seeded"
fi
R=${OUT:-$PWD/out/gpu}  # absolute: pack_synth archives from inside out/
mkdir -p "$R"
