"""Every public function documents its equation source, arguments, shapes and return."""

from __future__ import annotations

import inspect

import pytest

import ac_extensions
from ac_extensions import functional

PUBLIC = [getattr(functional, name) for name in functional.__all__]


def test_all_is_sorted_and_complete():
    assert functional.__all__ == sorted(functional.__all__)
    defined = {
        name
        for module in (
            functional.acer,
            functional.off_policy,
            functional.policy_gradients,
            functional.trust_region,
            functional.distributional,
            functional.ppo,
            functional.reactor,
        )
        for name in module.__all__
    }
    assert defined == set(functional.__all__)
    assert ac_extensions.__version__


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__name__)
def test_docstring_has_reference_args_shapes_returns_example(fn):
    doc = inspect.getdoc(fn)
    assert doc, fn.__name__
    for section in ("Args:", "Returns:", "Example:", ">>>"):
        assert section in doc, f"{fn.__name__} lacks {section}"
    assert "arXiv:" in doc, f"{fn.__name__} cites no paper"
    assert "Shape [" in doc or "shape [" in doc, f"{fn.__name__} states no shape"
    for name in inspect.signature(fn).parameters:
        assert f"{name}:" in doc, f"{fn.__name__} does not document {name}"


EXPECTED_SIGNATURES = {
    "retrace_targets": [
        "reward",
        "chosen_action_value",
        "state_value",
        "next_state_value",
        "trace",
        "done",
        "terminated",
        "gamma",
    ],
    "distributional_retrace_targets": [
        "reward",
        "chosen_atom_probs",
        "next_expected_atom_probs",
        "trace",
        "done",
        "terminated",
        "gamma",
        "support",
    ],
    "categorical_projection": ["atoms", "weights", "support"],
    "trust_region_step": ["g", "k", "delta"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_SIGNATURES))
def test_contract_signatures(name):
    params = list(inspect.signature(getattr(functional, name)).parameters)
    assert params == EXPECTED_SIGNATURES[name]


def test_runtime_names_are_documented():
    from ac_extensions import runtime

    assert len(set(runtime.__all__)) == len(runtime.__all__)  # (ruff's RUF022 sorts it)
    for name in runtime.__all__:
        value = getattr(runtime, name)
        if isinstance(value, str):  # a constant, documented where it is defined
            continue
        doc = inspect.getdoc(value)
        assert doc and len(doc.split()) > 5, f"ac_extensions.runtime.{name} is undocumented"


def test_every_recipe_config_is_exported_and_documented():
    from ac_extensions import recipes
    from ac_extensions.recipes import a2c, acer, ppo, reactor

    configs = {a2c.A2CConfig, acer.ACERConfig, ppo.PPOConfig, reactor.ReactorConfig}
    assert configs <= {getattr(recipes, name) for name in recipes.__all__}
    for config in configs:
        doc = inspect.getdoc(config)
        assert doc and len(doc.split()) > 5, f"{config.__name__} is undocumented"
