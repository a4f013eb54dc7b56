"""SequencePPOLoss's fast path and forward_backward against its TorchRL path (differential)."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.modules import ValueOperator

from ac_extensions.modules import FlatParameters, MLPBackprop, make_actor_critic
from ac_extensions.objectives import KLPenalty, SequencePPOLoss
from tests._helpers import on_policy_batch

OBS, ACT = 4, 3

SETTINGS = {
    "normalized-no-entropy": dict(normalize_advantage=True, entropy_coeff=0.0),
    "raw-entropy": dict(normalize_advantage=False, entropy_coeff=0.05),
    "value-clip-normalized": dict(clip_value=0.3, normalize_advantage=True, entropy_coeff=0.01),
    "value-clip-raw": dict(clip_value=0.3, normalize_advantage=False, entropy_coeff=0.0),
}


@pytest.fixture
def networks():
    torch.manual_seed(0)
    return make_actor_critic(OBS, ACT, hidden_sizes=(16, 16))


def make_loss(networks, fast=True, **kw):
    kw = dict(clip_epsilon=0.2, critic_coeff=0.5, loss_critic_type="l2", functional=False) | kw
    return SequencePPOLoss(*networks, fast_path=fast, **kw)


def make_batch(networks, shape, seed=0):
    # Behaviour log-probs perturbed by 0.3: ratios spread on both sides of the clip range;
    # stored values perturbed so that value clipping binds on some steps.
    td = on_policy_batch(shape, seed=seed, networks=networks, log_prob_noise=0.3)
    with torch.no_grad():
        td["state_value"] = networks[1](td.clone())["state_value"] + 0.5 * torch.randn(*shape, 1)
    return td


def loss_grads(loss, td):
    out = loss(td.clone())
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    params = [p for p in loss.parameters() if p.requires_grad]
    return out, torch.autograd.grad(total, params, allow_unused=True)


def assert_same_outputs(got, expected):
    assert list(got.keys()) == list(expected.keys())
    for key in expected.keys():
        torch.testing.assert_close(got[key], expected[key].detach(), msg=key)
        assert got[key].shape == torch.Size([]), key
        if not key.startswith("loss_"):
            assert not got[key].requires_grad, key


def assert_same_grads(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b)


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls of the fast forward and of the hand backward."""
    calls = {"fast": 0, "hand": 0}
    fast, hand = SequencePPOLoss._fast_forward, MLPBackprop.backward

    def counted_fast(self, *args):
        calls["fast"] += 1
        return fast(self, *args)

    def counted_hand(self, *args):
        calls["hand"] += 1
        return hand(self, *args)

    monkeypatch.setattr(SequencePPOLoss, "_fast_forward", counted_fast)
    monkeypatch.setattr(MLPBackprop, "backward", counted_hand)
    return calls


class TestFastForward:
    @pytest.mark.parametrize("diagnostics", [True, False], ids=["diagnostics", "losses-only"])
    @pytest.mark.parametrize("settings", list(SETTINGS.values()), ids=list(SETTINGS))
    @pytest.mark.parametrize("shape", [(64,), (4, 16)], ids=["N", "BxT"])
    def test_equals_the_torchrl_path(self, networks, shape, settings, diagnostics, spy):
        td = make_batch(networks, shape)
        fast, slow = make_loss(networks, **settings), make_loss(networks, False, **settings)
        fast.diagnostics = slow.diagnostics = diagnostics
        assert fast.fast_path_blocker(td) is None
        assert slow.fast_path_blocker(td) == "fast_path is off"
        expected, expected_grads = loss_grads(slow, td)
        assert spy["fast"] == 0
        got, got_grads = loss_grads(fast, td)
        assert spy["fast"] == 1
        assert_same_outputs(got, expected)
        assert_same_grads(got_grads, expected_grads)
        for key in ("loss_objective", "loss_critic"):
            assert got[key].requires_grad
        if diagnostics:
            # The batch exercises both clips, or the test could not tell their branches apart.
            assert 0.05 < got["clip_fraction"] < 0.95
            if "clip_value" in settings:
                assert 0.05 < got["value_clip_fraction"] < 0.95
        else:
            assert sorted(got.keys()) == ["loss_critic", "loss_entropy", "loss_objective"]

    def test_functional_loss_takes_it_too(self, networks, spy):
        td = make_batch(networks, (4, 16))
        fast = make_loss(networks, functional=True)
        slow = make_loss(networks, False, functional=True)
        expected, expected_grads = loss_grads(slow, td)
        got, got_grads = loss_grads(fast, td)
        assert spy["fast"] == 1
        assert_same_outputs(got, expected)
        assert_same_grads(got_grads, expected_grads)

    def test_reads_the_settings_at_call_time(self, networks, spy):
        # What a training loop changes between calls: the annealed clip, the coefficients,
        # the advantage standardisation and the diagnostics switch.
        td = make_batch(networks, (4, 16), seed=1)
        fast, slow = make_loss(networks, clip_value=0.3), make_loss(networks, False, clip_value=0.3)
        fast(td)
        for loss in (fast, slow):
            loss.clip_epsilon.fill_(0.05)
            loss.entropy_coeff.fill_(0.2)
            loss.critic_coeff.fill_(2.0)
            loss.clip_value.fill_(0.1)
            loss.normalize_advantage = False
        for diagnostics in (True, False):
            fast.diagnostics = slow.diagnostics = diagnostics
            expected, expected_grads = loss_grads(slow, td)
            got, got_grads = loss_grads(fast, td)
            assert_same_outputs(got, expected)
            assert_same_grads(got_grads, expected_grads)
        assert spy["fast"] == 3
        fast.fast_path = False
        fast(td)
        assert spy["fast"] == 3

    def test_still_validates_its_input(self, networks):
        loss = make_loss(networks)
        td = make_batch(networks, (4, 5))
        with pytest.raises(KeyError, match=r"advantage.*make_value_estimator"):
            loss(td.exclude("advantage"))
        bad = td.clone()
        bad["action_log_prob"] = bad["action_log_prob"].unsqueeze(-1)
        with pytest.raises(ValueError, match=r"action_log_prob.*\[4, 5\].*\[4, 5, 1\]"):
            loss(bad)
        bad = td.clone()
        bad["advantage"][1, 2] = float("inf")
        with pytest.raises(ValueError, match=r"advantage.*1 non-finite"):
            loss(bad)
        with pytest.raises(ValueError, match=r"advantage.*1 non-finite"):
            loss.forward_backward(bad)


def _recurrent_case():
    torch.manual_seed(0)
    actor, critic = make_actor_critic(OBS, ACT, hidden_sizes=(16,), recurrent="lstm")
    gen = torch.Generator().manual_seed(0)
    shape = (3, 6)
    td = TensorDict(
        {
            "observation": torch.randn(*shape, OBS, generator=gen),
            "is_init": torch.zeros(*shape, 1, dtype=torch.bool),
            "action": torch.randint(ACT, shape, generator=gen),
            "action_log_prob": torch.full(shape, -1.1) + 0.3 * torch.randn(shape, generator=gen),
            "advantage": torch.randn(*shape, 1, generator=gen),
            "value_target": torch.randn(*shape, 1, generator=gen),
        },
        shape,
    )
    td["is_init"][:, 0] = True
    for name in ("actor", "critic"):
        for part in ("h", "c"):
            td[f"{name}_recurrent_state_{part}"] = torch.zeros(*shape, 1, 64)
    return (actor, critic), td, {}


def _masked_case(key):
    def case():
        networks = make_actor_critic(OBS, ACT, hidden_sizes=(16,))
        td = make_batch(networks, (4, 8))
        mask = torch.ones(4, 8, dtype=torch.bool)
        mask[1, 5:] = False
        td[key] = mask
        return networks, td, {}

    return case


def _addon_case():
    networks = make_actor_critic(OBS, ACT, hidden_sizes=(16,))
    other, _ = make_actor_critic(OBS, ACT, hidden_sizes=(16,))
    return networks, make_batch(networks, (4, 8)), dict(addons=[KLPenalty(other, coeff=0.5)])


def _settings_case(**kw):
    def case():
        networks = make_actor_critic(OBS, ACT, hidden_sizes=(16,))
        return networks, make_batch(networks, (4, 8)), kw

    return case


def _hooked_critic_case():
    networks = make_actor_critic(OBS, ACT, hidden_sizes=(16,))
    networks[1].register_forward_hook(lambda module, args, out: out)
    return networks, make_batch(networks, (4, 8)), {}


BLOCKED = {
    "mask": (_masked_case(("collector", "mask")), "padding mask"),
    "shifted-valid": (_masked_case("shifted_valid"), "padding mask"),
    "addon": (_addon_case, "add-ons"),
    "recurrent": (_recurrent_case, "actor"),
    "smooth-l1": (_settings_case(loss_critic_type="smooth_l1"), "l2"),
    "sum": (_settings_case(reduction="sum"), "reduction"),
    "asymmetric-clip": (_settings_case(clip_epsilon=(0.2, 0.3)), "asymmetric"),
    "hooks": (_hooked_critic_case, "hooks"),
}


class TestFastPathNotTaken:
    @pytest.mark.parametrize("case, reason", list(BLOCKED.values()), ids=list(BLOCKED))
    def test_falls_back_to_torchrl_with_the_same_results(self, case, reason, spy):
        torch.manual_seed(0)
        networks, td, kw = case()
        fast, slow = make_loss(networks, **kw), make_loss(networks, False, **kw)
        assert reason in fast.fast_path_blocker(td)
        expected, expected_grads = loss_grads(slow, td)
        got, got_grads = loss_grads(fast, td)
        assert spy["fast"] == 0
        assert_same_outputs(got, expected)
        assert_same_grads(got_grads, expected_grads)

    def test_deep_copied_functional_loss_falls_back(self, networks, spy):
        # A deep copy of a functional=True loss holds new parameters its networks' modules do
        # not use: calling the modules directly would train the wrong tensors.
        loss = make_loss(networks, functional=True)
        td = make_batch(networks, (32,))
        assert loss.fast_path_blocker(td) is None
        twin = copy.deepcopy(loss)
        assert "parameters" in twin.fast_path_blocker(td)
        expected, expected_grads = loss_grads(make_loss(networks, False, functional=True), td)
        got, got_grads = loss_grads(twin, td)
        assert spy["fast"] == 0
        assert_same_outputs(got, expected)
        assert_same_grads(got_grads, expected_grads)

    def test_constructor_option_and_attribute(self, networks, spy):
        td = make_batch(networks, (16,))
        loss = make_loss(networks, fast=False)
        assert not loss.fast_path
        loss(td)
        assert spy["fast"] == 0
        loss.fast_path = True
        loss(td)
        assert spy["fast"] == 1


class _NotAnMLP(nn.Module):
    """Linear + LayerNorm + tanh: the fast path applies, MLPBackprop does not."""

    def __init__(self, out_features):
        super().__init__()
        self.hidden = nn.Linear(OBS, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, out_features)
        self.unused = nn.Linear(2, 2)  # a trained parameter no loss reaches

    def forward(self, x):
        return self.head(self.norm(self.hidden(x)).tanh())


def _non_mlp_networks():
    torch.manual_seed(0)
    actor, _ = make_actor_critic(OBS, ACT, hidden_sizes=(16,))
    actor.module[0].module = _NotAnMLP(ACT)
    critic = ValueOperator(_NotAnMLP(1), in_keys=["observation"])
    return actor, critic


class TestForwardBackward:
    @pytest.mark.parametrize("diagnostics", [True, False], ids=["diagnostics", "losses-only"])
    @pytest.mark.parametrize("settings", list(SETTINGS.values()), ids=list(SETTINGS))
    @pytest.mark.parametrize("shape", [(64,), (4, 16)], ids=["N", "BxT"])
    def test_hand_gradients_equal_autograd(self, networks, shape, settings, diagnostics, spy):
        td = make_batch(networks, shape, seed=2)
        loss, slow = make_loss(networks, **settings), make_loss(networks, False, **settings)
        loss.diagnostics = slow.diagnostics = diagnostics
        assert loss.hand_gradients
        expected, expected_grads = loss_grads(slow, td)
        got = loss.forward_backward(td)
        assert spy["hand"] == 2 and spy["fast"] == 0  # no autograd forward
        assert_same_outputs(got, expected)
        assert not any(v.requires_grad for v in got.values())
        assert_same_grads([p.grad for p in loss.parameters()], expected_grads)

    @pytest.mark.parametrize(
        "branch", ["fast-forward-autograd", "torchrl-autograd", "fast-path-off"]
    )
    def test_autograd_branch(self, branch, spy):
        if branch == "fast-forward-autograd":
            networks = _non_mlp_networks()  # fast path, no hand backward
            td = make_batch(networks, (4, 8))
        else:
            networks = make_actor_critic(OBS, ACT, hidden_sizes=(16,))
            td = make_batch(networks, (4, 8))
            if branch == "torchrl-autograd":
                td["shifted_valid"] = torch.rand(4, 8) > 0.3
        loss, slow = make_loss(networks, clip_value=0.3), make_loss(networks, False, clip_value=0.3)
        loss.fast_path = branch != "fast-path-off"
        expected, expected_grads = loss_grads(slow, td)
        with torch.no_grad():  # forward_backward turns grad mode on for itself
            got = loss.forward_backward(td)
        assert spy["hand"] == 0
        assert spy["fast"] == (branch == "fast-forward-autograd")
        assert_same_outputs(got, expected)
        assert not any(v.requires_grad for v in got.values())
        assert_same_grads([p.grad for p in loss.parameters()], expected_grads)

    @pytest.mark.parametrize("hand", [True, False], ids=["hand", "autograd"])
    def test_overwrites_grad_in_place(self, hand):
        networks = make_actor_critic(OBS, ACT, hidden_sizes=(16,)) if hand else _non_mlp_networks()
        td = make_batch(networks, (4, 8))
        loss = make_loss(networks)
        assert loss.hand_gradients == hand
        _, expected_grads = loss_grads(make_loss(networks, False), td)
        flat = FlatParameters(loss.parameters())
        flat.grad.fill_(100.0)  # stale gradients: must be overwritten, not added to
        for _ in range(2):
            loss.forward_backward(td)
        flat.check()  # every .grad is still a view into the flat buffer
        assert_same_grads([p.grad for p in loss.parameters()], expected_grads)
        if not hand:  # the unused layer's stale gradient is zeroed
            unused = loss.critic_network.module.unused
            assert unused.weight.grad is not None and not unused.weight.grad.any()

    def test_parameters_without_grad_get_one(self, networks):
        td = make_batch(networks, (32,))
        loss = make_loss(networks)
        _, expected_grads = loss_grads(make_loss(networks, False), td)
        for p in loss.parameters():
            p.grad = None
        loss.forward_backward(td)
        assert_same_grads([p.grad for p in loss.parameters()], expected_grads)

    def test_frozen_parameter_disables_hand_gradients(self, networks, spy):
        loss = make_loss(networks)
        assert loss.hand_gradients
        networks[1].module[0].weight.requires_grad_(False)
        assert not loss.hand_gradients
        td = make_batch(networks, (32,))
        loss.forward_backward(td)
        assert spy["hand"] == 0 and spy["fast"] == 1
        assert networks[1].module[0].weight.grad is None


def test_a_layer_replaced_after_the_first_call_is_used(networks, spy):
    # The fast path calls the networks (and their layers, by hand) directly: replacing one
    # after the first call must not leave it computing with the old one.
    td = make_batch(networks, (32,))
    loss = make_loss(networks)
    loss.forward_backward(td)
    torch.manual_seed(5)
    networks[1].module[0] = nn.Linear(OBS, 16)
    networks[0].module[0].module[-1] = nn.Linear(16, ACT)
    _, expected_grads = loss_grads(make_loss(networks, False), td)
    expected = make_loss(networks, False)(td)
    got = loss.forward_backward(td)
    assert spy["hand"] == 4
    assert_same_outputs(got, expected)
    assert_same_grads([p.grad for p in loss.parameters()], expected_grads)


def _image_batch(networks, shape, channels=4, seed=0):
    """An on-policy batch of binary MinAtar-like maps ``[*shape, C, 10, 10]``."""
    gen = torch.Generator().manual_seed(seed)
    obs = (torch.rand(*shape, channels, 10, 10, generator=gen) < 0.2).float()
    td = TensorDict({"observation": obs}, batch_size=shape)
    with torch.no_grad():
        dist = networks[0].get_dist(td.clone())
        action = dist.sample()
        log_prob = dist.log_prob(action) + 0.3 * torch.randn(shape, generator=gen)
        value = networks[1](td.clone())["state_value"]
    td.update(
        {
            "action": action,
            "action_log_prob": log_prob,
            "advantage": torch.randn(*shape, 1, generator=gen),
            "value_target": torch.randn(*shape, 1, generator=gen),
            "state_value": value + 0.5 * torch.randn(*shape, 1, generator=gen),
        }
    )
    return td


def _shared(torso):
    torch.manual_seed(0)
    if torso == "mlp":
        networks = make_actor_critic(OBS, ACT, hidden_sizes=(16, 16), share_torso=True)
        return networks, make_batch(networks, (4, 16))
    networks = make_actor_critic((4, 10, 10), ACT, torso="minatar", share_torso=True)
    return networks, _image_batch(networks, (4, 16))


class TestSharedTorso:
    """``make_actor_critic(share_torso=True)``: the torso runs once, the results are TorchRL's."""

    @pytest.mark.parametrize("settings", list(SETTINGS.values()), ids=list(SETTINGS))
    @pytest.mark.parametrize("torso", ["mlp", "minatar"])
    def test_equals_the_torchrl_path_with_one_torso_call(self, torso, settings, spy):
        networks, td = _shared(torso)
        body = networks[0].module[0].module[0]
        assert body is networks[1].module[0]
        calls = []
        body.register_forward_hook(lambda module, args, out: calls.append(args[0].shape))
        fast, slow = make_loss(networks, **settings), make_loss(networks, False, **settings)
        assert fast.fast_path_blocker(td) is None
        assert not fast.hand_gradients  # autograd through the shared torso
        expected, expected_grads = loss_grads(slow, td)
        assert len(calls) == 2  # TorchRL's path: once for the actor, once for the critic
        got, got_grads = loss_grads(fast, td)
        assert spy["fast"] == 1 and len(calls) == 3  # the fast path: once for both heads
        assert_same_outputs(got, expected)
        assert_same_grads(got_grads, expected_grads)
        # The loss trains each shared parameter once (no duplicate in loss.parameters()).
        params = list(fast.parameters())
        assert len({id(p) for p in params}) == len(params)
        assert {id(p) for p in body.parameters()} <= {id(p) for p in params}

    def test_the_torso_gradient_is_the_sum_of_both_heads(self, spy):
        # d(L_policy + L_value)/d torso = d L_policy/d torso + d L_value/d torso: checked by
        # switching each term off in turn (critic_coeff 0 is blocked, so scale it instead).
        networks, td = _shared("minatar")
        body = list(networks[1].module[0].parameters())

        def torso_grad(**kw):
            loss = make_loss(networks, entropy_coeff=0.0, **kw)
            out = loss(td.clone())
            total = sum(v for k, v in out.items() if k.startswith("loss_"))
            return torch.autograd.grad(total, body)

        both = torso_grad(critic_coeff=1.0)
        small = torso_grad(critic_coeff=1e-30)  # policy term only (the value term vanishes)
        out = make_loss(networks, entropy_coeff=0.0, critic_coeff=1.0)(td.clone())
        value_only = torch.autograd.grad(out["loss_critic"], body)
        for total, policy, value in zip(both, small, value_only, strict=True):
            torch.testing.assert_close(total, policy + value)
            assert value.abs().sum() > 0 and policy.abs().sum() > 0

    def test_forward_backward_writes_the_same_gradients(self, spy):
        networks, td = _shared("minatar")
        loss, slow = make_loss(networks, clip_value=0.3), make_loss(networks, False, clip_value=0.3)
        expected, expected_grads = loss_grads(slow, td)
        flat = FlatParameters(loss.parameters())
        flat.grad.fill_(7.0)
        got = loss.forward_backward(td)
        flat.check()
        assert spy["fast"] == 1 and spy["hand"] == 0
        assert_same_outputs(got, expected)
        assert_same_grads([p.grad for p in loss.parameters()], expected_grads)

    def test_other_sharing_falls_back(self, spy):
        # Heads that share a layer, or one torso read from two different entries: TorchRL's path.
        networks, td = _shared("mlp")
        actor, critic = networks
        torso, middle = actor.module[0].module[0], nn.Linear(16, 16)
        actor.module[0].module = nn.Sequential(torso, middle, nn.Tanh(), nn.Linear(16, ACT))
        critic.module = nn.Sequential(torso, middle, nn.Tanh(), nn.Linear(16, 1))
        loss = make_loss(networks)
        assert "outside one common torso" in loss.fast_path_blocker(td)
        expected, expected_grads = loss_grads(make_loss(networks, False), td)
        got, got_grads = loss_grads(loss, td)
        assert_same_outputs(got, expected)
        assert_same_grads(got_grads, expected_grads)

        networks, td = _shared("mlp")
        networks[1].in_keys = ["other"]
        td["other"] = td["observation"] + 1
        loss = make_loss(networks)
        assert "different entries" in loss.fast_path_blocker(td)
        expected, expected_grads = loss_grads(make_loss(networks, False), td)
        got, got_grads = loss_grads(loss, td)
        assert spy["fast"] == 0
        assert_same_outputs(got, expected)
        assert_same_grads(got_grads, expected_grads)

    def test_builder_refuses_a_recurrent_shared_torso(self):
        with pytest.raises(ValueError, match="share_torso=True needs feed-forward"):
            make_actor_critic(OBS, ACT, recurrent="lstm", share_torso=True)
        with pytest.raises(ValueError, match="at least one hidden layer"):
            make_actor_critic(OBS, ACT, hidden_sizes=(), share_torso=True)
        separate = make_actor_critic((4, 10, 10), ACT, torso="minatar")
        shared = make_actor_critic((4, 10, 10), ACT, torso="minatar", share_torso=True)
        count = lambda nets: len({id(p) for n in nets for p in n.parameters()})  # noqa: E731
        torso = 4  # conv and linear, weight and bias
        assert count(separate) == count(shared) + torso
