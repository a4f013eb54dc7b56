"""What the checkpoint probes share: loading a run's newest checkpoint, and π and Q in one state."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from torch import Tensor

NAMES = {"acer": "ACER", "reactor": "Reactor"}


def load(run_dir: Path, algorithms: tuple[str, ...]):
    """(config, policy, loss, counters) of the run's newest checkpoint.

    Refuses (``SystemExit``) a run of another algorithm than ``algorithms``, a recurrent one
    (its carried state is not replayed here) and one without a checkpoint.
    """
    from ac_extensions.cli._config import read_run
    from ac_extensions.runtime import Checkpointer
    from ac_extensions.runtime.checkpoint import load_loss_state_dict

    algorithm, config = read_run(run_dir)
    if algorithm not in algorithms:
        names = " and ".join(NAMES[a] for a in algorithms)
        raise SystemExit(f"{run_dir} is an {algorithm} run; this probes {names} runs")
    if config.recurrent:
        raise SystemExit(f"{run_dir}: recurrent networks are not supported by this probe")
    state = Checkpointer(run_dir / "checkpoints").load()
    if state is None:
        raise SystemExit(f"{run_dir} has no checkpoint (checkpoints/latest)")
    built = importlib.import_module(f"ac_extensions.recipes.{algorithm}").build(config)
    policy, loss = built[0], built[1]
    load_loss_state_dict(loss, state["loss"])
    return config, policy, loss, state["counters"]


@torch.no_grad()
def policy_and_q(policy, loss, observation: Tensor) -> tuple[Tensor, Tensor]:
    """π(·|x) and Q(x, ·) for one observation; each of shape [A].

    Args:
        policy: a run's collection policy; it writes ``"logits"``, and ``"action_value"`` (ACER)
            or ``"action_value_logits"`` (Reactor's distributional critic).
        loss: the run's loss; only Reactor's ``support`` is read, for Q = E[Z].
        observation: one observation, without a batch dimension.
    """
    from tensordict import TensorDict

    x = torch.as_tensor(observation, dtype=torch.float32).unsqueeze(0)
    out = policy(TensorDict({"observation": x}, [1]))
    probs = out["logits"].softmax(-1)[0]
    if "action_value_logits" in out.keys():
        q = (out["action_value_logits"].softmax(-1)[0] * loss.support).sum(-1)
    else:
        q = out["action_value"][0]
    return probs, q
