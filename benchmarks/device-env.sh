# Sourced at the start of a GPU call (benchmarks/run.sh, experiments/gpu.sh): installs the
# carried fla wheels, points Python at src/ and Triton at the carried cache; sets R, the
# result folder ($OUT on the device machine, else out/gpu).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
source .tcache/use.sh
R=${OUT:-out/gpu}
mkdir -p "$R"
