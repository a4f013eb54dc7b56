"""benchmarks/seaquest_probe.py: end causes and refill counts on scripted games, and a probe of a
saved run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from tests._helpers import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "seaquest_probe.py"


@pytest.fixture(scope="module")
def bench():
    yield from load_script(SCRIPT, "seaquest_probe")


def game(**state):
    base = dict(terminal=False, oxygen=200, sub_y=0, surface=True, diver_count=0)
    return SimpleNamespace(**(base | state))


def test_end_cause_by_hand(bench):
    assert bench.end_cause(game(terminal=True, oxygen=0, sub_y=4, surface=False), False) == "oxygen"
    # oxygen out and hit in the same step: the oxygen is named
    assert (
        bench.end_cause(game(terminal=True, oxygen=-1, sub_y=7, surface=False), False) == "oxygen"
    )
    empty = game(terminal=True, oxygen=150, sub_y=0, surface=False, diver_count=0)
    assert bench.end_cause(empty, False) == "surfaced_empty"
    # at the surface after a refill (surface marked) the sub can still be hit
    assert bench.end_cause(game(terminal=True, oxygen=200, sub_y=0, surface=True), False) == "hit"
    hit = game(terminal=True, oxygen=120, sub_y=5, surface=False, diver_count=3)
    assert bench.end_cause(hit, False) == "hit"
    assert bench.end_cause(game(oxygen=50, sub_y=3, surface=False), True) == "truncated"
    with pytest.raises(ValueError, match="still running"):
        bench.end_cause(game(), False)


class ScriptedEnv:
    """A gym-like env whose Seaquest state follows a script, one entry a step."""

    def __init__(self, script, rewards):
        self.script, self.rewards = script, rewards
        self.action_space = SimpleNamespace(n=6)
        self.unwrapped = SimpleNamespace(game=SimpleNamespace(env=game()))

    def reset(self, seed):
        self.t = 0
        self.unwrapped.game.env = game()
        return torch.zeros(10, 10, 10).numpy(), {}

    def step(self, action):
        state = self.unwrapped.game.env
        for key, value in self.script[self.t].items():
            setattr(state, key, value)
        reward = self.rewards[self.t]
        self.t += 1
        return torch.zeros(10, 10, 10).numpy(), reward, state.terminal, False, {}


def test_play_counts_refills_and_divers(bench):
    dive = dict(surface=False, sub_y=1)
    script = [
        dive,
        dict(diver_count=1, sub_y=3),
        dict(diver_count=2),
        dict(sub_y=0, surface=True, diver_count=1),  # refill with two divers: one is used
        dive,
        *[dict(diver_count=n) for n in range(2, 7)],
        dict(sub_y=0, surface=True, diver_count=-1),  # six divers: the game leaves -1
        dive,
        dict(diver_count=0),  # a pick-up from -1
        dict(terminal=True, oxygen=0, sub_y=2),
    ]
    rewards = [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 7, 0, 0, 0]
    env = ScriptedEnv(script, rewards)
    out = bench.play(None, None, env, "uniform", seed=0)
    assert out == {
        "return": 8.0,
        "length": 14,
        "cause": "oxygen",
        "refills": 2,
        "full_refills": 1,
        "divers": 2 + 5 + 1,
        "most_divers": 6,
    }


def test_play_samples_the_policy(bench):
    """A policy sure of one action: the scripted env sees only that action."""
    seen = []

    class Recording(ScriptedEnv):
        def step(self, action):
            seen.append(action)
            return super().step(action)

    def policy(td):  # an ACER policy writes its Q head beside the logits
        logits = torch.tensor([[0.0, 0, 0, 50.0, 0, 0]])
        return TensorDict({"logits": logits, "action_value": torch.zeros(1, 6)}, [1])

    env = Recording([dict(surface=False, sub_y=1), dict(terminal=True, sub_y=4)], [0, 0])
    out = bench.play(policy, None, env, "pi", seed=3)
    assert seen == [3, 3] and out["cause"] == "hit" and out["length"] == 2


def test_action_probs_by_rule(bench):
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    obs = torch.zeros(10, 10, 10)

    def acer(td):
        return TensorDict({"logits": logits, "action_value": torch.tensor([[3.0, 1, 2]])}, [1])

    def reactor(td):
        # Action 0 puts its mass on -1, action 1 on +1, action 2 splits it: E[Z] = -1, 1, 0.
        z = torch.tensor([[[9.0, -9.0], [-9.0, 9.0], [0.0, 0.0]]])
        return TensorDict({"logits": logits, "action_value_logits": z}, [1])

    pi = bench.action_probs(acer, None, obs, "pi", 3)
    torch.testing.assert_close(pi, logits.softmax(-1)[0])
    greedy = bench.action_probs(acer, None, obs, "greedy_q", 3)
    torch.testing.assert_close(greedy, torch.tensor([1.0, 0, 0]))
    uniform = bench.action_probs(None, None, obs, "uniform", 3)
    torch.testing.assert_close(uniform, torch.full((3,), 1 / 3))
    loss = SimpleNamespace(support=torch.tensor([-1.0, 1.0]))  # Reactor's Q is E[Z]
    greedy = bench.action_probs(reactor, loss, obs, "greedy_q", 3)
    torch.testing.assert_close(greedy, torch.tensor([0.0, 1, 0]))


def test_summarize(bench):
    def episode(ret, cause, refills):
        return {"return": ret, "length": 10, "cause": cause, "refills": refills} | {
            "full_refills": 0,
            "divers": refills,
            "most_divers": 1,
        }

    s = bench.summarize([episode(0.0, "hit", 0), episode(4.0, "oxygen", 2)])
    assert s["return"] == 2.0 and s["refills"] == 1.0 and s["with_refill"] == 0.5
    assert s["length"] == 10.0 and s["most_divers"] == 1.0
    assert s["causes"] == {"hit": 0.5, "oxygen": 0.5, "surfaced_empty": 0.0, "truncated": 0.0}


def _save_run(tmp_path, algorithm, config):
    from ac_extensions.cli._config import RUN_FILE, config_to_json
    from ac_extensions.runtime.checkpoint import loss_state_dict

    recipe = __import__(f"ac_extensions.recipes.{algorithm}", fromlist=["build"])
    loss = recipe.build(config)[1]
    checkpoint = tmp_path / "checkpoints" / "ckpt-000000001"
    checkpoint.mkdir(parents=True)
    state = {"loss": loss_state_dict(loss), "counters": {"batches": 3}}
    torch.save(state, checkpoint / "state.pt")
    (tmp_path / "checkpoints" / "latest").write_text("ckpt-000000001\n")
    run = {"algorithm": algorithm, "config": config_to_json(config)}
    (tmp_path / RUN_FILE).write_text(json.dumps(run))


@pytest.mark.timeout(120)
def test_probe_of_a_saved_run(bench, tmp_path):
    from ac_extensions.recipes.acer import ACERConfig

    _save_run(tmp_path, "acer", ACERConfig(env_id="MinAtar/Seaquest-v1", seed=0, frames=1_000))
    record = bench.main([str(tmp_path), "--episodes", "2", "--json", str(tmp_path / "p.json")])
    assert record["counters"] == {"batches": 3}
    assert json.loads((tmp_path / "p.json").read_text()) == record
    for rule in bench.RULES:
        summary, episodes = record["results"][rule]["summary"], record["results"][rule]["episodes"]
        assert len(episodes) == 2 and all(e["length"] >= 1 for e in episodes)
        assert sum(summary["causes"].values()) == pytest.approx(1.0)
        assert summary["return"] == sum(e["return"] for e in episodes) / 2
    # Seeded: the same episodes twice.
    again = bench.main([str(tmp_path), "--episodes", "2"])["results"]
    assert again == record["results"]


@pytest.mark.timeout(60)
def test_probe_refuses_other_runs(bench, tmp_path):
    from ac_extensions.recipes.acer import ACERConfig

    _save_run(tmp_path, "acer", ACERConfig(env_id="MinAtar/Breakout-v1", seed=0, frames=1_000))
    with pytest.raises(SystemExit, match="not MinAtar/Seaquest-v1"):
        bench.main([str(tmp_path)])
