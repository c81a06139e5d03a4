set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
source .tcache/use.sh
for mode in global thread_local relaxed; do
  echo "== $mode"; timeout 120 python -c "
from tests.triton.cuda_checks import programmatic_launch_mismatches as f
print('$mode', f('$mode'))" 2>&1 | grep -v Warning | tail -4
done
