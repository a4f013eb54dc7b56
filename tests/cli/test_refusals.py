"""Action spaces a recipe cannot handle are refused before anything starts: one line naming
the algorithm, the env and its action space, exit status 2, no run directory."""

from __future__ import annotations

import pytest

from ac_extensions.cli.train import main
from ac_extensions.recipes import reactor
from ac_extensions.recipes.reactor import ReactorConfig
from ac_extensions.runtime.envs import action_space_kind, require_action_space

MULTI = "tests._spaces:MultiDiscreteToy-v0"
MATRIX = "tests._spaces:MatrixBoxToy-v0"


@pytest.mark.parametrize(
    ("algorithm", "env_id", "space", "needs"),
    [
        ("reactor", "Pendulum-v1", "Box(-2.0, 2.0, (1,), float32)", "a Discrete action space"),
        ("reactor", MULTI, "MultiDiscrete([3 3])", "a Discrete action space"),
        ("ppo", MULTI, "MultiDiscrete([3 3])", "a Discrete action space or a 1-D Box"),
        ("a2c", MATRIX, "Box(-1.0, 1.0, (2, 3), float32)", "or a 1-D Box action space"),
        ("acer", MULTI, "MultiDiscrete([3 3])", "a Discrete action space or a 1-D Box"),
    ],
)
def test_refused_before_anything_starts(tmp_path, capsys, algorithm, env_id, space, needs):
    out = tmp_path / "run"
    status = main([algorithm, "--env", env_id, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"ac-train: error: {algorithm} cannot train on {env_id}"), err
    assert space in err and needs in err, err
    assert not out.exists()


def test_action_space_kinds():
    assert action_space_kind("CartPole-v1") == ("discrete", "Discrete(2)")
    assert action_space_kind("Pendulum-v1")[0] == "box"
    assert action_space_kind(MULTI)[0] == action_space_kind(MATRIX)[0] == "other"
    assert require_action_space("Pendulum-v1", ("discrete", "box"), "PPO") == "box"


def test_the_recipes_refuse_too_not_only_the_cli():
    with pytest.raises(ValueError, match="Reactor cannot train on Pendulum-v1"):
        reactor.build(ReactorConfig(env_id="Pendulum-v1"))


def test_recurrent_acer_on_box_actions_is_refused_before_anything_starts(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["acer", "--env", "Pendulum-v1", "--recurrent", "lstm", "--out", str(out)]
    status = main(argv)
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert err == (
        "ac-train: error: recurrent='lstm' is for discrete actions; Pendulum-v1 has continuous "
        "actions (the stochastic dueling network's memory would need running at collection too)"
    )
    assert not out.exists()
