"""Play a run's newest checkpoint on MinAtar Seaquest and count how its episodes end.

MinAtar's Seaquest (Young & Tian, 2019, arXiv:1903.03176) ends an episode when the sub is hit
(by a fish, a sub or a bullet), when its oxygen runs out (a tank lasts 200 steps below the
surface), or when it surfaces with no rescued diver. Surfacing with one to five divers refills
the tank for one diver; surfacing with six refills it and pays up to 10 for the oxygen left.
Shooting pays 1 an enemy. A learner that never surfaces is capped by one tank of oxygen; the
scores above ~10 need refills. Per episode this records the return, the length, the cause of
the end, the refills, the divers picked up and the most divers held, for three action rules:
``pi`` samples the policy (what the run's workers do, minus the collector), ``greedy_q`` takes
argmax_a Q(x, a) (the critic's own greedy policy; Reactor's Q is E[Z]) and ``uniform`` picks
actions uniformly at random (the floor).

    python benchmarks/seaquest_probe.py RUN_DIR --episodes 100 --json probe.json

``RUN_DIR`` is an ``ac-train acer`` or ``ac-train reactor`` output directory on
``MinAtar/Seaquest-v1`` with feed-forward networks, holding ``run.json`` and ``checkpoints/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _probe import load, policy_and_q  # noqa: E402

RULES = ("pi", "greedy_q", "uniform")
CAUSES = ("hit", "oxygen", "surfaced_empty", "truncated")


def end_cause(game, truncated: bool) -> str:
    """Why an episode ended, from the Seaquest game's state after its last step.

    The game's ``act`` runs to the end of a step even once the sub is hit, then ends the
    episode if the oxygen had run out, or if the sub reached the surface (``sub_y == 0``) with
    no diver, in which case it does not mark the surfacing (``surface`` stays False).

    Args:
        game: ``minatar.environments.seaquest.Env`` after the episode's last step.
        truncated: whether the env cut the episode off at its step limit.

    Returns:
        One of :data:`CAUSES`; ``"oxygen"`` wins over ``"hit"`` when both happened in one step.
    """
    if not game.terminal:
        if not truncated:
            raise ValueError("the game is still running: end_cause needs a finished episode")
        return "truncated"
    if game.oxygen <= 0:
        return "oxygen"
    if game.sub_y == 0 and not game.surface and game.diver_count == 0:
        return "surfaced_empty"
    return "hit"


def action_probs(policy, loss, observation, rule: str, num_actions: int) -> torch.Tensor:
    """The probabilities ``rule`` acts with in one state; shape [A].

    Args:
        policy: the run's collection policy (see :func:`_probe.policy_and_q`).
        loss: the run's loss (only Reactor's ``support`` is read).
        observation: one observation. Shape [C, 10, 10].
        rule: one of :data:`RULES`.
        num_actions: A.
    """
    if rule == "uniform":
        return torch.full((num_actions,), 1.0 / num_actions)
    probs, q = policy_and_q(policy, loss, observation)
    if rule == "pi":
        return probs
    return torch.nn.functional.one_hot(q.argmax(), num_actions).float()


def play(policy, loss, env, rule: str, seed: int) -> dict:
    """One episode with ``rule``; its return, length, end cause, refills and divers.

    Returns ``{"return", "length", "cause", "refills", "full_refills", "divers", "most_divers"}``:
    ``refills`` counts surfacings that refilled the tank, ``full_refills`` those made with six
    divers, ``divers`` the divers picked up and ``most_divers`` the most held at once.
    """
    generator = torch.Generator().manual_seed(seed)
    observation, _ = env.reset(seed=seed)
    game = env.unwrapped.game.env
    total, length, refills, full, divers, most = 0.0, 0, 0, 0, 0, 0
    terminated = truncated = False
    while not (terminated or truncated):
        probs = action_probs(policy, loss, observation, rule, int(env.action_space.n))
        action = int(torch.multinomial(probs, 1, generator=generator))
        held, surfaced = game.diver_count, game.surface
        observation, reward, terminated, truncated, _ = env.step(action)
        total, length = total + float(reward), length + 1
        if game.surface and not surfaced:
            refills += 1
            full += held == 6
        elif game.diver_count > held:
            divers += game.diver_count - held
        most = max(most, game.diver_count)
    return {
        "return": total,
        "length": length,
        "cause": end_cause(game, truncated),
        "refills": refills,
        "full_refills": full,
        "divers": divers,
        "most_divers": most,
    }


def summarize(episodes: list[dict]) -> dict:
    """Means over episodes, the fraction of each end cause and of episodes with a refill."""
    n = len(episodes)
    out = {
        key: sum(e[key] for e in episodes) / n
        for key in ("return", "length", "refills", "full_refills", "divers", "most_divers")
    }
    out["causes"] = {c: sum(e["cause"] == c for e in episodes) / n for c in CAUSES}
    out["with_refill"] = sum(e["refills"] > 0 for e in episodes) / n
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="an ac-train acer or reactor output directory")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=100, help="env seed of the first episode")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from ac_extensions.runtime.envs import make_gym_env

    config, policy, loss, counters = load(args.run_dir, ("acer", "reactor"))
    if "Seaquest" not in config.env_id:
        raise SystemExit(f"{args.run_dir} trained on {config.env_id}, not MinAtar/Seaquest-v1")
    env = make_gym_env(config.env_id)
    results = {}
    for rule in RULES:
        episodes = [play(policy, loss, env, rule, args.seed + i) for i in range(args.episodes)]
        results[rule] = {"summary": summarize(episodes), "episodes": episodes}
    env.close()
    print(f"{args.run_dir} ({config.env_id}, counters {counters}, {args.episodes} episodes)")
    for rule, r in results.items():
        s = r["summary"]
        causes = ", ".join(f"{c} {f:.2f}" for c, f in s["causes"].items())
        print(
            f"  {rule:7s} return {s['return']:6.2f}  length {s['length']:6.1f}  "
            f"refills {s['refills']:.2f} (episodes with one {s['with_refill']:.2f})  "
            f"divers {s['divers']:.2f}  most held {s['most_divers']:.2f}  ends: {causes}"
        )
    record = {
        "run_dir": str(args.run_dir),
        "env_id": config.env_id,
        "counters": counters,
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
