"""One recipe setting at a time on MinAtar: named variants of a study, side by side (resumable).

A study is one of our algorithms and a few named variants, each a list of ``ac-train`` flags
on top of the recipe's MinAtar defaults; every variant runs on the same games, seeds and frame
budget, through the CLI exactly as ``minatar_grid.py`` runs ours::

    python benchmarks/minatar_variants.py --study ppo_torso --games Breakout Asterix --seeds 1
    python benchmarks/minatar_variants.py --study reactor_acting --games Breakout --frames 100000
    python benchmarks/minatar_variants.py --study ppo_epochs --games Asterix Breakout SpaceInvaders
    python benchmarks/minatar_variants.py --study reactor_entropy --games Freeway --seeds 1
    python benchmarks/minatar_variants.py --study acer_lr --games Asterix Seaquest --seeds 1
    python benchmarks/minatar_variants.py --study acer_lr --variants "lr 2.5e-4" --seeds 1 2 3
    python benchmarks/minatar_variants.py --study a2c_torso --seeds 1
    python benchmarks/minatar_variants.py --summary-only

Studies (:data:`STUDIES`):

- ``ppo_torso``: PPO with separate actor and critic torsos (the MinAtar default when it ran) or one
  shared torso (``--share-torso true``; the MinAtar paper's AC(λ) and SB3's ``CnnPolicy``
  share one).
- ``ppo_epochs``: PPO with 4 epochs per batch (rl-baselines3-zoo's Atari PPO, what the grid's
  ``sb3_ppo`` baseline runs) instead of the PPO paper's 3 (the recipe's MinAtar default when it
  ran; its baseline is the grid's ``ppo`` runs, the same command without ``--epochs``).
- ``reactor_acting``: Reactor with 4 environment frames per learner step (the paper's "4–6
  acting steps per learning step") or 16 (a quarter of the replayed frames per collected
  frame: each learner step replays 16 × 16 = 256 steps, so 64 or 16 replayed steps per frame;
  MinAtar's DQN replays 32), over 100k frames.
- ``reactor_ratio``: Reactor's MinAtar default, 16 frames per learner step with the target
  network copied every 250 learner steps (chosen by this study, with branches 64 wide, the
  default then: ``reactor_width``'s variant), against the paper's
  ratio of 4 frames per step with the target copied every 1,000 (the same 4,000-frame lag;
  the default before, whose runs were the grid's), and against 16 frames per step with the
  target left at 1,000 steps (a 16,000-frame lag), and against 32 frames per step with the
  target copied every 125 (the same lag; 8 transitions replayed per frame, the DQN peers'
  replay ratio). A quarter of the learner's work per frame buys about four times the frames
  per second where the learner sets the pace.
- ``reactor_lr``: Reactor's Adam step size on MinAtar at 5e-4 and 1e-3 (ACER's MinAtar default)
  against 2.5e-4 (the MinAtar DQN's, the default), branches 64 wide (the default then): at
  one learner step per 16 frames Reactor's Asterix and Seaquest returns are still rising at
  1M frames, a quarter of the updates of the paper's ratio at the same step size.
- ``reactor_epsilon``: Reactor's uniform mixing ε of the policy (1 − ε) softmax + ε/A at 0.1
  against 0.01 (the default), branches 64 wide (the default then): the DQN and QR-DQN peers,
  which win Asterix and Seaquest, act ε-greedily with ε 0.1 after their first 100k frames,
  and Reactor's MinAtar policies are near-deterministic on the games it loses.
- ``reactor_entropy``: Reactor's entropy bonus at 0.001 instead of A3C/ACER's 0.01 (the
  default), both with the policy gradient stopped at the torso (the MinAtar default when it
  ran; the 0.01 runs are ``reactor_torso``'s variant). On Freeway that setting's policy stayed
  near uniform (entropy ~0.9 of ln 3 ≈ 1.10 from 200k frames on) while its return fell from 14
  to 9–11; the critic's action gaps are small next to a 0.01 temperature.
- ``reactor_torso``: Reactor's policy gradient let into the torso it shares with the
  critic (the MinAtar default, chosen by this study) or stopped there
  (``--policy-torso-gradient false``: the paper's §3.4.1, the policy head reads features the
  distributional critic alone shapes; its runs were made by the grid while this was the
  MinAtar default), both at 4 frames per learner step (``reactor_ratio``'s variant).
- ``reactor_support``: Reactor's categorical support [-10, 30] instead of C51's [-10, 10] (the
  paper's value, and the default): MinAtar's rewards are 0/1 like Atari's clipped ones, but
  dense in SpaceInvaders, where a run's mean Q neared the top atom (8.9 at 200k frames, on a
  ≈100-step horizon at γ 0.99); mass beyond it is clipped onto it, and clipped actions stop
  being ranked. 51 atoms either way (Δz 0.4 and 0.8); both at 4 frames per learner step.
- ``ppo_envs``: PPO's 1,024-frame batch as 32 envs × 32 steps instead of 8 × 128 (the
  default; the grid's ``ppo`` rows): TorchRL's per-step collection cost is paid once per 32
  frames instead of 8 (``minatar_ppo_layout.py``), the GAE horizon within a batch shortens to
  32 steps; with and without ``--async-collection true`` (the batch collected by the policy
  of one update earlier).
- ``ppo_rounding``: one seed of PPO run again with nothing changed but the float rounding
  (today's code with one learner thread, and with two), beside the grid's run of that seed
  (an older commit): how far a run's outcome moves under rounding-sized changes, to set
  beside the spread across seeds.
- ``acer_lr``: ACER's Adam step size on MinAtar: 1e-4, 2.5e-4 (the MinAtar DQN's, the first
  default) and 5e-4 (the second) against 1e-3, the default this study chose, all at a
  constant entropy weight 0.01 (the default when they ran).
- ``acer_gamma``: ACER's discount on MinAtar at γ 0.995 against 0.99 (the default), at the
  step size and entropy weight of that time: Seaquest's oxygen runs out after 200 frames, and
  surfacing with a rescued diver pays off only beyond γ 0.99's ≈100-step horizon.
- ``acer_entropy``: ACER's entropy weight at 0.001 (the ACER paper's) and 0.003 against 0.01
  (openai/baselines', the default then), at Adam 5e-4.
- ``acer_entropy_lr``: ACER's entropy weight at 0.003 against 0.01 at Adam 1e-3: at 5e-4 it won
  Freeway and cost Seaquest (``acer_entropy``).
- ``acer_entropy_anneal``: ACER's entropy weight annealed linearly from 0.01 (openai/baselines')
  at the first frame to 0.001 (the ACER paper's) at the last (the MinAtar default, chosen by
  this study; the grid's ``acer`` rows), against 0.01 throughout (``--entropy-coeff-final
  none``, the default before): 0.003 throughout won Freeway and cost Asterix
  (``acer_entropy_lr``); exploring early and committing late keeps Freeway's gain.
- ``acer_replay``: ACER at replay ratio 8 against the paper's 4 (the default), at the step size
  and entropy weight of that time: twice the off-policy updates per collected batch, at about
  twice the learner's cost per frame.
- ``a2c_torso``: A2C with one MinAtar torso shared by the policy and value heads, as the A3C
  paper's network shares all non-output layers (Mnih et al., 2016, arXiv:1602.01783,
  experimental setup), with linear heads (the paper's) or 2×64 tanh heads (PPO's MinAtar
  default, SB3's ``net_arch`` after a shared features extractor), against separate torsos
  (the default when it ran; the grid's ``a2c`` rows of that time). The 2×64 heads are the
  MinAtar default since.
- ``ppo_overlap``: PPO with ``--overlap-collection`` (each batch collected beside the update
  on the one before, with the weights from before that update: one update behind, and
  bit-reproducible), at the default layout (8 envs × 128 steps) and at 32 envs × 32 steps,
  against the default (the grid's ``ppo`` rows): does the one-update lag cost return? Their
  speed is ``ppo_speed.py``'s, measured one run at a time (two overlapped runs on two cores
  have no core to overlap on, so this study's fps column says nothing about it).
- ``reactor_overlap``: Reactor with ``--overlap-collection`` (acting beside learning, one
  batch behind, bit-reproducible) against the default, both with branches 64 wide (the
  default then): does
  the one-batch lag cost return? Its speed is ``train_fps.py``'s, one run at a time.
- ``reactor_width``: Reactor's policy and critic branches 128 wide (the MinAtar default,
  chosen by this study; the grid's ``reactor`` rows) against 64 (``--recurrent-size 64``, the
  default before): each branch is one tanh layer on the MinAtar torso's 128 features, while
  the QR-DQN peer that wins Asterix and Seaquest puts its quantile head straight on those 128.
- ``reactor_target``: Reactor's target network copied every 62 learner steps (992 frames, the
  QR-DQN peer's 1,000) instead of every 250 (4,000 frames, the default; the grid's
  ``reactor`` rows), on the games it loses to QR-DQN: both climb late, and a fresher target
  passes value back faster.
- ``reactor_overlap_wide``: ``reactor_overlap`` at today's defaults (branches 128 wide, the
  grid's ``reactor`` rows): acting beside learning runs 1.29× the default's fps one run at a
  time, and at 64 wide it ended higher in 8 of 10 seed pairs.
- ``reactor_lr_wide``: ``reactor_lr``'s 5e-4 at today's defaults (branches 128 wide, the grid's
  ``reactor`` rows) on Asterix, where 5e-4 at 64 wide ended above all five seeds of 2.5e-4.

Resumable as the grid: each run lives in
``<results>/minatar_variants/runs/<study>/<variant>/<Game>/seed<N>/`` with its own ``summary.json``
and logs; a run complete at ``--frames`` or more is skipped, an unfinished one resumes from its
checkpoint (``ac-train --resume``); ``--jobs`` runs at a time. A finished run's checkpoints
are deleted (replays are large) unless ``--keep-checkpoints``, which keeps its last one for a
probe that plays it (``seaquest_probe.py``, ``reactor_probe.py``). The summary,
``<results>/minatar_variants.md`` and ``.json``, has one table per study: per variant and game
the mean return of the last 100 episodes at a quarter, half and all of the run's frames
(median over seeds), and fps (whole run, median); under a study with a baseline, each
variant's probability of improvement over it (:func:`against_baseline`), the verdict rule of
the grids' pages.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import write_markdown  # noqa: E402
from _scheduler import (  # noqa: E402
    ac_train,
    complete_at,
    failed,
    has_checkpoint,
    prune_checkpoints,
    read_summary,
    run_claimed,
    stop_on_interrupt,
)
from minatar_grid import GAMES, WINDOW, Run, read_run  # noqa: E402

RESULTS = HERE / "results"
REACTOR_TARGET_1000 = ["--target-update-period", "1000"]
"""Reactor's target copied every 1,000 learner steps, its MinAtar default before 16 frames per
learner step (and 250 steps) replaced it: the older Reactor studies spell it out to reproduce
their runs."""
REACTOR_64_WIDE = ["--recurrent-size", "64"]
"""Reactor's branches 64 wide, its MinAtar default before ``reactor_width`` chose 128: the
older Reactor studies spell it out to reproduce their runs."""
REACTOR_4_FRAMES = [
    "--acting-steps-per-learning-step",
    "4",
    *REACTOR_TARGET_1000,
    *REACTOR_64_WIDE,
]
"""One Reactor learner step per 4 frames with the target every 1,000 steps (the paper's ratio,
the MinAtar default when those studies ran), branches 64 wide."""
STUDIES: dict[str, dict] = {
    "ppo_torso": {
        "algo": "ppo",
        "variants": {
            "separate torsos": ["--share-torso", "false"],
            "shared torso": ["--share-torso", "true"],
        },
    },
    "ppo_epochs": {
        "algo": "ppo",
        "baseline": "3 epochs (the default then)",
        "baseline_recorded": True,
        "variants": {
            # The default (the PPO paper's 3 epochs) is the grid's ppo row (same command).
            "4 epochs (SB3 zoo)": ["--epochs", "4"],
        },
    },
    "reactor_acting": {
        "algo": "reactor",
        "variants": {
            # Both with the target copied every 1,000 learner steps, the default when they ran.
            "4 frames per learner step": REACTOR_4_FRAMES,
            "16 frames per learner step": [
                "--acting-steps-per-learning-step",
                "16",
                *REACTOR_TARGET_1000,
                *REACTOR_64_WIDE,
            ],
        },
    },
    "reactor_ratio": {
        "algo": "reactor",
        "baseline": "16 frames per learner step, target every 250 steps (default), 64 wide",
        "baseline_from": ("reactor_width", "branches 64 wide"),
        "variants": {
            # The default chosen by this study, at the branch width of that time. The
            # paper's ratio, one learner step per 4 frames with the target copied every 1,000
            # steps (the same 4,000-frame lag), was the default before; its runs were the grid's.
            "4 frames per learner step, target every 1,000 steps": REACTOR_4_FRAMES,
            # A quarter of the replay with the target's period left at 1,000 steps, so that it
            # lags 16,000 frames.
            "16 frames per learner step": [
                "--acting-steps-per-learning-step",
                "16",
                *REACTOR_TARGET_1000,
                *REACTOR_64_WIDE,
            ],
            # Half the default's replay per frame, with the target's lag kept at 4,000 frames:
            # 16 sequences of 16 steps per 32 frames replay 8 transitions per frame, the
            # replay ratio of the DQN and QR-DQN peers (32 per 4 frames).
            "32 frames per learner step, target every 125 steps": [
                "--acting-steps-per-learning-step",
                "32",
                "--target-update-period",
                "125",
                *REACTOR_64_WIDE,
            ],
        },
    },
    "reactor_lr": {
        "algo": "reactor",
        "baseline": "lr 2.5e-4 (default), branches 64 wide",
        "baseline_from": ("reactor_width", "branches 64 wide"),
        "variants": {
            # At the branch width of that time.
            "lr 5e-4": ["--lr", "5e-4", *REACTOR_64_WIDE],
            "lr 1e-3": ["--lr", "1e-3", *REACTOR_64_WIDE],
        },
    },
    "reactor_epsilon": {
        "algo": "reactor",
        "baseline": "policy epsilon 0.01 (default), branches 64 wide",
        "baseline_from": ("reactor_width", "branches 64 wide"),
        "variants": {
            # At the branch width of that time.
            "policy epsilon 0.1": ["--policy-epsilon", "0.1", *REACTOR_64_WIDE],
        },
    },
    "reactor_entropy": {
        "algo": "reactor",
        "baseline": "entropy 0.01 (default), policy gradient stopped at the torso",
        "baseline_from": ("reactor_torso", "policy gradient stopped at the torso"),
        "variants": {
            # Ran when the paper's stopped gradient and one learner step per 4 frames were the
            # MinAtar default; compared with the same setting at the default entropy
            # (reactor_torso's variant).
            "entropy 0.001": [
                "--entropy-coeff",
                "0.001",
                "--policy-torso-gradient",
                "false",
                *REACTOR_4_FRAMES,
            ],
        },
    },
    "reactor_torso": {
        "algo": "reactor",
        "baseline": "policy gradient into the torso (MinAtar default), 4 frames per learner step",
        "baseline_from": ("reactor_ratio", "4 frames per learner step, target every 1,000 steps"),
        "variants": {
            # Both at one learner step per 4 frames, the MinAtar default when they ran; the
            # paper's setting (§3.4.1) is the variant.
            "policy gradient stopped at the torso": [
                "--policy-torso-gradient",
                "false",
                *REACTOR_4_FRAMES,
            ],
        },
    },
    "reactor_support": {
        "algo": "reactor",
        "baseline": "support [-10, 10] (C51's, the default), 4 frames per learner step",
        "baseline_from": ("reactor_ratio", "4 frames per learner step, target every 1,000 steps"),
        "variants": {
            # MinAtar rewards are 0/1 and dense on SpaceInvaders: the seed-1 run's mean Q was
            # 8.9 at 200k frames, close to the top atom, where Q stops ranking actions. Both at
            # one learner step per 4 frames, the MinAtar default when they ran.
            "support [-10, 30]": [
                "--v-max",
                "30",
                *REACTOR_4_FRAMES,
            ],
        },
    },
    "ppo_envs": {
        "algo": "ppo",
        "baseline": "8 envs × 128 steps (default)",
        "baseline_recorded": True,
        "variants": {
            # The default (8 envs × 128 steps) is the grid's ppo row (same command).
            "32 envs × 32 steps": ["--envs-per-worker", "32", "--rollout-length", "32"],
            "32 envs × 32 steps, async": [
                "--envs-per-worker",
                "32",
                "--rollout-length",
                "32",
                "--async-collection",
                "true",
            ],
        },
    },
    "ppo_rounding": {
        "algo": "ppo",
        "baseline": "1 learner thread (default)",
        "variants": {
            # The same seed and settings; only the float rounding differs: two learner threads
            # split the GEMMs' sums differently from one (the first losses differ in the 8th
            # digit; three threads reproduce two's run exactly). The default is the grid's
            # ppo row (same command, run at an older commit); the rerun is today's code.
            "1 learner thread, rerun": ["--torch-threads", "1"],
            "2 learner threads": ["--torch-threads", "2"],
        },
    },
    "acer_lr": {
        "algo": "acer",
        "baseline": "lr 1e-3 (default), entropy 0.01",
        "baseline_from": ("acer_entropy_anneal", "entropy 0.01"),
        "variants": {
            # 2.5e-4, the MinAtar DQN's step size, and then 5e-4 were the default before;
            # their runs were the grid's. All at the constant entropy weight of that time.
            "lr 1e-4": ["--lr", "1e-4", "--entropy-coeff-final", "none"],
            "lr 2.5e-4": ["--lr", "2.5e-4", "--entropy-coeff-final", "none"],
            "lr 5e-4": ["--lr", "5e-4", "--entropy-coeff-final", "none"],
        },
    },
    "acer_gamma": {
        "algo": "acer",
        "baseline": "gamma 0.99, lr 5e-4 (the default then)",
        "baseline_from": ("acer_lr", "lr 5e-4"),
        "variants": {
            # Seaquest's oxygen lasts 200 frames: the payoff of surfacing with a diver lies
            # beyond γ 0.99's ≈100-step horizon. Run at the step size of that time.
            "gamma 0.995": ["--gamma", "0.995", "--lr", "5e-4", "--entropy-coeff-final", "none"],
        },
    },
    "acer_entropy": {
        "algo": "acer",
        "baseline": "entropy 0.01, lr 5e-4 (the default then)",
        "baseline_from": ("acer_lr", "lr 5e-4"),
        "variants": {
            # The ACER paper's entropy weight; 0.01 is openai/baselines'. Run at the step size
            # of that time.
            "entropy 0.001": [
                "--entropy-coeff",
                "0.001",
                "--lr",
                "5e-4",
                "--entropy-coeff-final",
                "none",
            ],
            "entropy 0.003": [
                "--entropy-coeff",
                "0.003",
                "--lr",
                "5e-4",
                "--entropy-coeff-final",
                "none",
            ],
        },
    },
    "acer_entropy_lr": {
        "algo": "acer",
        "baseline": "entropy 0.01 (the default then)",
        "baseline_from": ("acer_entropy_anneal", "entropy 0.01"),
        "variants": {
            # The entropy weight again, at the step size chosen since; constant, as then.
            "entropy 0.003": ["--entropy-coeff", "0.003", "--entropy-coeff-final", "none"],
        },
    },
    "acer_entropy_anneal": {
        "algo": "acer",
        "baseline": "entropy 0.01 to 0.001 (default)",
        "variants": {
            # The default is the grid's acer row (same command); 0.01 throughout was the
            # default before this study, and its runs were the grid's.
            "entropy 0.01": ["--entropy-coeff-final", "none"],
        },
    },
    "acer_replay": {
        "algo": "acer",
        "baseline": "replay ratio 4, lr 5e-4 (the default then)",
        "baseline_from": ("acer_lr", "lr 5e-4"),
        "variants": {
            # Twice the off-policy updates per collected batch: 16 replayed transitions per
            # frame against 8 (16 sequences of 20 steps, 4 times per 160 frames), which is
            # also the QR-DQN peer's 32 every 4 frames. Run at the step size of that time.
            "replay ratio 8": [
                "--replay-ratio",
                "8",
                "--lr",
                "5e-4",
                "--entropy-coeff-final",
                "none",
            ],
        },
    },
    "a2c_torso": {
        "algo": "a2c",
        "baseline": "separate torsos (the default then)",
        "baseline_recorded": True,
        "variants": {
            # The baseline was the grid's a2c rows of that time; the 2×64 variant is the
            # MinAtar default since.
            "shared torso, linear heads": ["--share-torso"],
            "shared torso, 2×64 heads": ["--share-torso", "--head-sizes", "64,64"],
        },
    },
    "ppo_overlap": {
        "algo": "ppo",
        "baseline": "8 envs × 128 steps, synchronous (default)",
        "variants": {
            # The default is the grid's ppo row (same command).
            "overlapped collection": ["--overlap-collection"],
            "32 envs × 32 steps, overlapped": [
                "--envs-per-worker",
                "32",
                "--rollout-length",
                "32",
                "--overlap-collection",
            ],
        },
    },
    "reactor_overlap": {
        "algo": "reactor",
        "baseline": "collection between learner steps (default), branches 64 wide",
        "baseline_from": ("reactor_width", "branches 64 wide"),
        "variants": {
            # At the branch width of that time.
            "collection beside learning": ["--overlap-collection", *REACTOR_64_WIDE],
        },
    },
    "reactor_width": {
        "algo": "reactor",
        "baseline": "branches 128 wide (default)",
        "variants": {
            # The default is the grid's reactor row (same command), chosen by this study; 64
            # wide was the default before, and its runs were the grid's.
            "branches 64 wide": REACTOR_64_WIDE,
        },
    },
    "reactor_target": {
        "algo": "reactor",
        "baseline": "target every 250 learner steps (default)",
        "variants": {
            # The default is the grid's reactor row (same command).
            "target every 62 learner steps": ["--target-update-period", "62"],
        },
    },
    "reactor_overlap_wide": {
        "algo": "reactor",
        "baseline": "collection between learner steps (default)",
        "variants": {
            # The default is the grid's reactor row (same command).
            "collection beside learning": ["--overlap-collection"],
        },
    },
    "reactor_lr_wide": {
        "algo": "reactor",
        "baseline": "lr 2.5e-4 (default)",
        "variants": {
            # The default is the grid's reactor row (same command).
            "lr 5e-4": ["--lr", "5e-4"],
        },
    },
}
"""Study → our algorithm and its variants (name → ``ac-train`` flags). A study whose default
is one of ``minatar_grid.py``'s own runs (the same command without the flags) names it as
``baseline``: its table shows the grid's runs of the same games and seeds under that name. With
``baseline_from`` (study, variant) the baseline's runs are that other study's variant's instead
of the grid's (a comparison made when the grid's default was another). With
``baseline_recorded`` the grid's runs of that time have since been replaced by runs of newer
defaults, so the baseline's rows are the ones recorded under its name in the previous
``minatar_variants.json``, kept as they were, and never read from today's grid."""
FRACTIONS = (0.25, 0.5, 1.0)
"""Where along each run the table reads the 100-episode mean (fractions of its frames)."""


def slug(name: str) -> str:
    """A folder name for a variant."""
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def run_dir(results: Path, study: str, variant: str, game: str, seed: int) -> Path:
    """Where one run lives."""
    return results / "minatar_variants" / "runs" / study / slug(variant) / game / f"seed{seed}"


def command(study: str, variant: str, game: str, seed: int, frames: int, out: Path) -> list:
    """The ``ac-train`` command of a fresh run, or of its resumption when it has a checkpoint."""
    algo = STUDIES[study]["algo"]
    if has_checkpoint(out):
        return [*ac_train(), algo, "--resume", str(out), "--frames", str(frames)]
    return [
        *ac_train(),
        algo,
        "--env",
        f"MinAtar/{game}-v1",
        "--frames",
        str(frames),
        "--seed",
        str(seed),
        "--return-window",
        str(WINDOW),
        "--out",
        str(out),
        *STUDIES[study]["variants"][variant],
    ]


def run_all(args: argparse.Namespace) -> int:
    """Run every missing run of the study, ``args.jobs`` at a time; return the failures."""
    todo = []
    for variant in args.variants or STUDIES[args.study]["variants"]:
        for game in args.games:
            for seed in args.seeds:
                out = run_dir(args.results, args.study, variant, game, seed)
                if complete_at(read_summary(out), args.frames):
                    continue
                todo.append((variant, game, seed, out))
    print(f"{len(todo)} run(s) to go, {args.jobs} at a time", flush=True)
    failures = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {}
        for variant, game, seed, out in todo:
            cmd = command(args.study, variant, game, seed, args.frames, out)

            def replan(variant=variant, game=game, seed=seed, out=out):
                # decided again once the run's lock is taken (minatar_grid.run_claimed)
                if complete_at(read_summary(out), args.frames):
                    return "done", []
                how = "resume" if has_checkpoint(out) else "fresh"
                return how, command(args.study, variant, game, seed, args.frames, out)

            futures[
                pool.submit(
                    run_claimed,
                    cmd=cmd,
                    directory=out,
                    timeout=args.timeout,
                    fresh=not has_checkpoint(out),
                    replan=replan,
                )
            ] = (variant, game, seed, out)
        with stop_on_interrupt():
            for future in as_completed(futures):
                variant, game, seed, out = futures[future]
                result = future.result()
                failures += failed(result["status"])
                if result["status"] == "ok" and not args.keep_checkpoints:
                    prune_checkpoints(out)
                s = result["summary"] or {}
                print(
                    f"{args.study} / {variant} / {game} seed {seed}: {result['status']} in "
                    f"{result['seconds']:.0f} s, return {s.get('final_mean_return')}",
                    flush=True,
                )
    return failures


def value_at(run: dict, frames: float) -> float | None:
    """The 100-episode mean at the last logged point at or before ``frames``."""
    curve = run["curve"]
    points = [v for f, v in zip(curve["frames"], curve["values"], strict=True) if f <= frames]
    return points[-1] if points else None


def _row(directory: Path) -> dict | None:
    """One complete run's summary row (None if absent or unfinished)."""
    run = read_run(directory)
    if run is None or not run["complete"]:
        return None
    return {
        "seed": run["seed"],
        "frames": run["frames"],
        "fps": run["fps"],
        "final_mean_return": run["final_mean_return"],
        "at": {str(f): value_at(run, f * run["frames"]) for f in FRACTIONS},
    }


def _baseline_dir(results: Path, spec: dict, game: str, seed: int) -> Path:
    """Where a study's baseline run of ``game`` and ``seed`` lives.

    The grid's run, or that of ``baseline_from``'s study variant.
    """
    if "baseline_from" in spec:
        study, variant = spec["baseline_from"]
        return run_dir(results, study, variant, game, seed)
    return Run(game, spec["algo"], seed).directory(results)


def summarize(results: Path) -> dict:
    """Every study's runs found under ``results``: ``{study: {variant: {game: [run...]}}}``.

    A study with a ``baseline`` gets it as a first variant: the grid's complete runs of the
    study's algorithm on the games and seeds its variants ran (or ``baseline_from``'s), or the
    rows recorded in the previous summary (``baseline_recorded``).
    """
    previous_path = results / "minatar_variants.json"
    previous = json.loads(previous_path.read_text()) if previous_path.is_file() else {}
    found: dict = {}
    for study, spec in STUDIES.items():
        for variant in spec["variants"]:
            for game in GAMES:
                base = run_dir(results, study, variant, game, 0).parent
                for directory in sorted(base.glob("seed*")):
                    row = _row(directory)
                    if row is None:
                        continue
                    found.setdefault(study, {}).setdefault(variant, {}).setdefault(game, [])
                    found[study][variant][game].append(row)
        if "baseline" not in spec or study not in found:
            continue
        if spec.get("baseline_recorded"):
            recorded = previous.get(study, {}).get(spec["baseline"])
            if recorded:
                found[study] = {spec["baseline"]: recorded, **found[study]}
            continue
        baseline: dict = {}
        for game in GAMES:
            seeds = sorted({r["seed"] for v in found[study].values() for r in v.get(game, [])})
            rows = [_row(_baseline_dir(results, spec, game, seed)) for seed in seeds]
            if any(rows):
                baseline[game] = [r for r in rows if r is not None]
        if baseline:
            found[study] = {spec["baseline"]: baseline, **found[study]}
    return found


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def against_baseline(study: str, variants: dict) -> list[dict]:
    """Each variant's P(variant > baseline) of a study with a baseline, with its verdict.

    Per game on that game's complete runs (the two sides resampled independently), and over
    the games both sides ran when each side has the same seeds on every one of them
    (``_intervals.probability_of_improvement``: rliable's probability of improvement with a
    95% stratified bootstrap interval; "above" or "below" where it excludes 0.5). One run a
    side has no spread to resample: no interval, no verdict.
    """
    import _intervals as intervals
    import numpy as np

    baseline = STUDIES[study].get("baseline")
    if baseline not in variants:
        return []
    rows = []
    for variant, games in variants.items():
        if variant == baseline:
            continue
        common = [g for g in games if variants[baseline].get(g)]
        finals = {
            side: {
                g: {r["seed"]: r["final_mean_return"] for r in variants[side][g]} for g in common
            }
            for side in (variant, baseline)
        }
        per_game = {}
        for game in common:
            x, y = (np.array(list(finals[side][game].values()))[:, None] for side in finals)
            point, low, high = intervals.probability_of_improvement(x, y)
            runs = min(len(x), len(y))
            per_game[game] = (point, low, high, intervals.verdict(low, high), runs)
        overall = None
        seed_sets = {side: {frozenset(f[g]) for g in common} for side, f in finals.items()}
        if len(common) > 1 and all(len(sets) == 1 for sets in seed_sets.values()):
            x, y = (
                np.array([[f[g][seed] for g in common] for seed in sorted(f[common[0]])])
                for f in finals.values()
            )
            point, low, high = intervals.probability_of_improvement(x, y)
            overall = (point, low, high, intervals.verdict(low, high), min(len(x), len(y)))
        rows.append({"variant": variant, "games": common, "overall": overall, "per_game": per_game})
    return rows


def markdown(found: dict) -> str:
    """The tables of every study with runs."""
    lines = [
        "# MinAtar: one setting at a time",
        "",
        "Command: `python benchmarks/minatar_variants.py --study <study> --games ... --seeds ... "
        "--frames ...` (see its docstring for the studies). Online training return, mean of "
        "the last 100 episodes, read at a quarter, half and all of each run's frames (median "
        "over seeds); fps of the whole run (median).",
    ]
    for study, variants in found.items():
        spec = STUDIES[study]
        lines += ["", f"## {study} ({spec['algo']})", ""]
        head = " | ".join(f"at {f:.0%}" for f in FRACTIONS)
        lines += [
            f"| variant | flags | game | seeds | frames | {head} | fps |",
            "|---|---|---|---|---|" + "---|" * len(FRACTIONS) + "---|",
        ]
        for variant, games in variants.items():
            for game, runs in games.items():
                at = [_median(r["at"][str(f)] for r in runs) for f in FRACTIONS]
                cells = " | ".join("—" if v is None else f"{v:.2f}" for v in at)
                frames = _median(r["frames"] for r in runs)
                fps = _median(r["fps"] for r in runs)
                flags = spec["variants"].get(variant)
                if flags is None and "baseline_from" in spec:
                    other, other_variant = spec["baseline_from"]
                    flags = STUDIES[other]["variants"][other_variant]
                then = " of that time" if spec.get("baseline_recorded") else ""
                flags = (
                    f"`{' '.join(flags)}`"
                    if flags
                    else f"(`minatar_grid.py`'s {spec['algo']}{then})"
                )
                lines.append(
                    f"| {variant} | {flags} | {game} | "
                    f"{', '.join(str(r['seed']) for r in runs)} | {frames:,.0f} | {cells} | "
                    f"{'—' if fps is None else format(fps, ',.0f')} |"
                )
        comparisons = against_baseline(study, variants)
        if comparisons:
            lines += [
                "",
                f"P(variant > {spec['baseline']}) on the final returns [95% CI] and its verdict, "
                "over the games (where each side has the same seeds on all of them) and per game:",
                "",
                "| variant | over the games | " + " | ".join(GAMES) + " |",
                "|---|---|" + "---|" * len(GAMES),
            ]
            for row in comparisons:
                cells = [_improvement_cell(row["overall"])]
                cells += [_improvement_cell(row["per_game"].get(game)) for game in GAMES]
                lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _improvement_cell(value) -> str:
    """``verdict, P [low, high]``; ``one seed, P`` without a spread; — with nothing to compare."""
    if value is None:
        return "—"
    point, low, high, word, runs = value
    if runs < 2:
        return f"one seed, {point:.2f}"
    return f"{word}, {point:.2f} [{low:.2f}, {high:.2f}]"


def main(argv: list[str] | None = None) -> int:
    """Run a study (unless ``--summary-only``), then rewrite the summary of all studies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=list(STUDIES))
    parser.add_argument("--games", nargs="+", default=["Breakout"], choices=GAMES)
    parser.add_argument(
        "--variants", nargs="+", default=None, help="only these of the study's variants (names)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep each finished run's last checkpoint (for the probes) instead of deleting it",
    )
    args = parser.parse_args(argv)
    args.results = args.results.resolve()
    args.timeout = args.timeout or args.frames / 10 + 600
    failures = 0
    if not args.summary_only:
        if args.study is None:
            parser.error("--study is required unless --summary-only")
        known = STUDIES[args.study]["variants"]
        unknown = [v for v in args.variants or [] if v not in known]
        if unknown:
            names = ", ".join(repr(v) for v in known)
            parser.error(f"--variants {unknown} not in study {args.study!r}: {names}")
        failures = run_all(args)
    found = summarize(args.results)
    write_markdown(args.results / "minatar_variants.md", markdown(found))
    (args.results / "minatar_variants.json").write_text(json.dumps(found, indent=1) + "\n")
    print(markdown(found))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
