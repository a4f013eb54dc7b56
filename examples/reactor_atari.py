"""Reactor on an Atari game: Nature CNN torso, LSTM branches with stored state, 51 atoms.

Gruslys et al., 2018 (arXiv:1704.04651). Needs ``ale-py`` and the Atari preprocessing of
:func:`ac_extensions.runtime.envs.make_batched_env` for ``ALE/...`` ids (observations
``[E, 4, 84, 84]`` uint8); the recipe picks the CNN torso because the observation has three
dims. The network follows the paper's shape (conv torso, then a policy LSTM and a critic LSTM
fed the previous action and reward; R2D2-style stored state), with rewards clipped to
[−1, 1] by the env (so ``reward_scale`` 1 and the C51 support ±10). Not tuned or scored
here: Atari needs ~10^7 frames and a GPU learner (``--device cuda``); the defaults below are
a starting point, not reproduced results. On one H200 with 16 cores it trained at under ~100
fps (a 170 s check, ``benchmarks/results/gpu.md``): 10M frames would take more than a day.
The replay's sample is what bounds it, not the GPU: on an H100, 138 of a learner step's
188 ms went to gathering the 32 × 33 stacked frames (and their next ones) out of the CPU
storage (``gpu.md``, section 4).

    python examples/reactor_atari.py --env_id ALE/Pong-v5 --frames 10000000 --device cuda
"""

from __future__ import annotations

from _cli import parse_config, report

from ac_extensions.recipes.reactor import ReactorConfig, train

ATARI = ReactorConfig.defaults_for_family("atari") | {"env_id": "ALE/Pong-v5"}
"""The recipe's Atari settings (``ReactorConfig.FAMILY_DEFAULTS``, sources given there)."""

if __name__ == "__main__":
    config = parse_config(ReactorConfig, __doc__.splitlines()[0], defaults=ATARI)
    for i, metrics in enumerate(train(config)):
        report(metrics, every=10, index=i)
