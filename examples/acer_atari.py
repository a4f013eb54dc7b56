"""ACER on Atari (Pong by default): Nature-CNN policy-plus-Q network, replay of sequences.

Wang et al., 2017 (arXiv:1611.01224v2, §6). ``ALE/…`` ids get the usual preprocessing
(4-frame skip with max-pooling, up to 30 no-op starts, 84×84 grayscale, 4 stacked frames; see
``ac_extensions.runtime.envs.make_gym_env``). Settings follow the paper and openai/baselines
where they apply (20-step sequences, replay ratio 4, c = 10, δ = 1, α = 0.99, entropy 0.01,
gradient-norm clip 10) with Adam at 1e-4 (the A3C-ACER-PyTorch port that solves Pong) and a
replay of 50k frames kept in memory-mapped files (``--memmap``; each stored frame stack is
28 KiB, twice per step). On a 2-core CPU this runs, slowly (the CNN updates dominate); give it
``--device cuda`` on a GPU machine: on one H200 with 16 cores it ran 20k frames of Pong at
~300 fps (``benchmarks/results/gpu.md``), so 10M frames take about 9 hours there. No
learning curve has been measured.

    python examples/acer_atari.py --frames 10000000 --device cuda
"""

from __future__ import annotations

from _cli import parse_config, report

from ac_extensions.recipes.acer import ACERConfig, train

ATARI = ACERConfig.defaults_for_family("atari") | {"env_id": "ALE/Pong-v5"}
"""The recipe's Atari settings (``ACERConfig.FAMILY_DEFAULTS``, sources given there)."""

if __name__ == "__main__":
    config = parse_config(ACERConfig, __doc__.splitlines()[0], defaults=ATARI)
    for i, metrics in enumerate(train(config)):
        report(metrics, every=20, index=i)
