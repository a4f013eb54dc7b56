#!/usr/bin/env bash
# Reactor's learner step on a GPU, phase by phase (benchmarks/profile_learner.py), plus the
# tests marked `gpu`, in one go (at most about 7 minutes):
#
#   1. the tests marked `gpu` and, beside them, Reactor's Atari learner step (Pong, the LSTM
#      network of examples/reactor_atari.py's defaults) on CUDA;
#   2. Reactor's MinAtar Breakout learner step on CUDA, eager;
#   3. the same with the networks compiled in torch.compile's CUDA-graph mode
#      (`--compile reduce-overhead`).
#
# Each profile writes benchmarks/results/reactor_learner_profile/<label>.json; they are copied
# to $OUT/profiles with the logs in $OUT/logs. Bring the JSON files back and rerun
# `python benchmarks/profile_learner.py --summary-only` to rebuild the markdown.
#
#   OUT=/tmp/x bash benchmarks/device_profile.sh
set -u
OUT=${OUT:-/tmp/device_profile}
LOGS=$OUT/logs
mkdir -p "$LOGS" "$OUT/profiles"
# shellcheck source=benchmarks/_device_env.sh
source "$(dirname "$0")/_device_env.sh"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    echo "cpus: $(nproc)"
    $PY -c "import sys, torch, torchrl, tensordict; \
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, \
'torchrl', torchrl.__version__, 'tensordict', tensordict.__version__)"
    $PY -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -n 1
} > "$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt"
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
profile() { # label timeout args...
    local label=$1 limit=$2
    shift 2
    timeout "$limit" $PY benchmarks/profile_learner.py --label "$label" --device cuda "$@" \
        > "$LOGS/$label.txt" 2>&1
    echo "exit $?" >> "$LOGS/$label.txt"
    cp benchmarks/results/reactor_learner_profile/"$label".json "$OUT/profiles/" 2>/dev/null
    tail -n 9 "$LOGS/$label.txt"
}

stamp "1: gpu tests + Atari learner step: start"
(timeout 150 $PY -m pytest -q -m gpu tests/recipes/test_gpu.py -p no:cacheprovider -n 4 \
    --durations=0 > "$LOGS/gpu_tests.txt" 2>&1; echo "exit $?" >> "$LOGS/gpu_tests.txt") &
profile cuda_atari_pong 160 --env ALE/Pong-v5 --fill 2000 --steps 10 --repeats 2 &
wait
tail -n 12 "$LOGS/gpu_tests.txt"
stamp "2: MinAtar eager"
profile cuda_minatar_breakout 100 --env MinAtar/Breakout-v1 --steps 20 --repeats 3
stamp "3: MinAtar CUDA graphs"
profile cuda_graphs_minatar_breakout 200 --env MinAtar/Breakout-v1 --steps 20 --repeats 3 \
    --compile reduce-overhead
stamp "done"
