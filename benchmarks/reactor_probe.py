"""Probe a Reactor run's newest checkpoint: does its critic rank actions, does its policy follow?

Reactor's policy learns from its critic (the all-action term Σ_a Q(x, a) ∇π(a|x) of the
β-LOO gradient, Gruslys et al., 2018, arXiv:1704.04651v2, §3.1), so a policy can only be as
good as the critic's ranking of the actions. This plays ``--episodes`` episodes of the run's
env with each of three action rules and reports, per rule:

- the episode returns;
- the policy's mean per-state entropy H(π(·|x));
- how often argmax_a π(a|x) = argmax_a Q(x, a) (chance: 1/A);
- the mean action gap max_a Q(x, a) − min_a Q(x, a) (Q the critic's expected value, E[Z]).

The rules: ``pi`` samples π (what the run's workers do, minus the collector), ``greedy_q``
takes argmax Q (the critic's own greedy policy), ``greedy_pi`` takes argmax π.
A ``greedy_q`` that scores far below ``pi`` says the critic cannot rank the actions.

    python benchmarks/reactor_probe.py benchmarks/results/minatar/runs/Freeway/reactor/seed1
    python benchmarks/reactor_probe.py RUN_DIR --episodes 5 --json probe.json

Feed-forward networks only (the recurrent ones need their carried state); the run directory
is one ``ac-train reactor --out`` wrote, with its ``run.json`` and ``checkpoints/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import Tensor

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _probe import load, policy_and_q  # noqa: E402

RULES = ("pi", "greedy_q", "greedy_pi")


def state_stats(probs: Tensor, q: Tensor) -> dict[str, Tensor]:
    """Per-state statistics of a policy and a critic.

    Args:
        probs: π(·|x) per state. Shape [S, A].
        q: Q(x, ·), the critic's expected values. Shape [S, A].

    Returns:
        ``entropy`` H(π(·|x)), ``agree`` (1.0 where argmax π = argmax Q, else 0.0) and
        ``gap`` max_a Q − min_a Q; each of shape [S].
    """
    if probs.shape != q.shape or probs.dim() != 2:
        raise ValueError(
            f"probs and q must both have shape [S, A], got {list(probs.shape)} and {list(q.shape)}"
        )
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
    agree = (probs.argmax(-1) == q.argmax(-1)).float()
    gap = q.max(-1).values - q.min(-1).values
    return {"entropy": entropy, "agree": agree, "gap": gap}


def probe(actor, loss, env_id: str, episodes: int, seed: int = 100) -> dict:
    """Each rule's returns and mean per-state statistics over ``episodes`` episodes.

    Returns ``{rule: {"returns", "entropy", "agree", "gap"}}`` plus ``"num_actions"``.
    """
    from ac_extensions.runtime.envs import make_gym_env

    env = make_gym_env(env_id)
    results = {}
    for rule in RULES:
        returns, probs_seen, q_seen = [], [], []
        for episode in range(episodes):
            generator = torch.Generator().manual_seed(seed + episode)
            observation, _ = env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                x = torch.as_tensor(observation, dtype=torch.float32)
                probs, q = policy_and_q(actor, loss, x)
                probs_seen.append(probs)
                q_seen.append(q)
                if rule == "pi":
                    action = int(torch.multinomial(probs, 1, generator=generator))
                elif rule == "greedy_q":
                    action = int(q.argmax())
                else:
                    action = int(probs.argmax())
                observation, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        stats = state_stats(torch.stack(probs_seen), torch.stack(q_seen))
        results[rule] = {"returns": returns} | {k: float(v.mean()) for k, v in stats.items()}
    env.close()
    return results | {"num_actions": int(probs_seen[0].numel())}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="an ac-train reactor output directory")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=100, help="env seed of the first episode")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config, actor, loss, counters = load(args.run_dir, ("reactor",))
    results = probe(actor, loss, config.env_id, args.episodes, args.seed)
    num_actions = results.pop("num_actions")
    print(
        f"{args.run_dir} ({config.env_id}, {counters.get('learner_steps', '?')} learner steps; "
        f"chance agreement 1/{num_actions} = {1 / num_actions:.2f})"
    )
    for rule, r in results.items():
        mean = sum(r["returns"]) / len(r["returns"])
        print(
            f"  {rule:9s} return {mean:7.2f} {r['returns']}  entropy {r['entropy']:.3f}  "
            f"argmax π = argmax Q {r['agree']:.2f}  Q gap {r['gap']:.4f}"
        )
    record = {
        "run_dir": str(args.run_dir),
        "env_id": config.env_id,
        "learner_steps": counters.get("learner_steps"),
        "num_actions": num_actions,
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
