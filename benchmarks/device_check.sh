#!/usr/bin/env bash
# CUDA checks for a GPU machine, in one go (at most about 6.5 minutes):
#
#   1. the tests marked `gpu` (tests/recipes/test_gpu.py: every recipe's learner on CUDA);
#   2. the Atari examples (examples/acer_atari.py, examples/reactor_atari.py) on CUDA, a few
#      thousand learning frames each: that they run, and at what fps;
#   3. Reactor on MinAtar Breakout (the grid's settings, 25k frames: 5k before learning starts,
#      then 5,000 learner steps) with the learner on CUDA and, side by side, on the CPU.
#
# Steps 1 and 2 run at the same time, then the two runs of step 3. Logs, the runs' summaries
# and scalars go to $OUT (default /tmp/device_check) and into $OUT/device_check.tar.gz.
#
#   OUT=/tmp/x bash benchmarks/device_check.sh
#
# A machine without torchrl & co. can get them as wheels in .whl/: benchmarks/_device_env.sh
# installs them into /tmp/site first when that folder exists.
set -u
OUT=${OUT:-/tmp/device_check}
LOGS=$OUT/logs
mkdir -p "$LOGS"
# shellcheck source=benchmarks/_device_env.sh
source "$(dirname "$0")/_device_env.sh"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    echo "cpus: $(nproc)"
    $PY -c "import sys, torch, torchrl, tensordict, gymnasium, ale_py; \
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, \
'torchrl', torchrl.__version__, 'tensordict', tensordict.__version__, \
'gymnasium', gymnasium.__version__, 'ale_py', ale_py.__version__)"
} > "$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt"

stamp() { echo "[$(date +%H:%M:%S)] $*"; }

# 1 + 2, side by side.
stamp "gpu tests, Atari examples: start"
(timeout 170 $PY -m pytest -q -m gpu tests/recipes/test_gpu.py -p no:cacheprovider -n 4 \
    --durations=0 > "$LOGS/gpu_tests.txt" 2>&1; echo "exit $?" >> "$LOGS/gpu_tests.txt") &
(timeout 170 $PY examples/acer_atari.py --frames 20000 --replay-start 5000 --device cuda \
    --seed 1 > "$LOGS/acer_atari.txt" 2>&1; echo "exit $?" >> "$LOGS/acer_atari.txt") &
(timeout 170 $PY examples/reactor_atari.py --frames 16000 --replay-start 4000 --device cuda \
    --seed 1 > "$LOGS/reactor_atari.txt" 2>&1; echo "exit $?" >> "$LOGS/reactor_atari.txt") &
wait
stamp "gpu tests, Atari examples: done"
tail -n 15 "$LOGS/gpu_tests.txt" "$LOGS/acer_atari.txt" "$LOGS/reactor_atari.txt"

# 3. Reactor on MinAtar Breakout, learner on CUDA and on the CPU (one thread), side by side.
stamp "Reactor MinAtar cuda / cpu: start"
for device in cuda cpu; do
    (timeout 200 $PY -m ac_extensions reactor --env MinAtar/Breakout-v1 --frames 25000 \
        --seed 1 --device "$device" --out "$OUT/reactor_minatar_$device" --quiet \
        > "$LOGS/reactor_minatar_$device.txt" 2>&1
    echo "exit $?" >> "$LOGS/reactor_minatar_$device.txt") &
done
wait
stamp "Reactor MinAtar cuda / cpu: done"
for device in cuda cpu; do
    tail -n 3 "$LOGS/reactor_minatar_$device.txt"
    cat "$OUT/reactor_minatar_$device/summary.json" 2>/dev/null | head -12
done
tar -czf /tmp/device_check.tar.gz -C "$OUT" . && mv /tmp/device_check.tar.gz "$OUT/"
