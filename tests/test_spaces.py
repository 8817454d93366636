"""Every kind of gymnasium space: action distributions against torch.distributions, V-trace ratios by
hand, observation encoders' shapes, one training update per kind end to end, one-line errors."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rfwp_rl.agent import Agent
from rfwp_rl.distributions import Bernoulli, Categorical, DiagGaussian, MultiCategorical, make_distribution
from rfwp_rl.encoders import DictTorso, GridTorso, ResNetTorso, has_image_torso
from rfwp_rl.envs import env_spec, make_env
from rfwp_rl.envs.spaces import action_space_dict, space_from_dict, space_to_dict, tensor_obs_space
from rfwp_rl.errors import UserError
from rfwp_rl.impala import learner, vtrace
from rfwp_rl.impala.actors import Actors, rollout_spec
from rfwp_rl.impala.env_batches import LocalEnvPool
from rfwp_rl.impala.loss import compute_loss, loss_config
from rfwp_rl.impala.run_spec import RunSpec

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
import space_envs  # noqa: E402,F401 - registers the Space*-v0 ids

D = torch.distributions


def test_categorical_matches_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, 4, generator=g)
    a = torch.randint(4, (5, 3), generator=g)
    dist, ref = Categorical(4), D.Categorical(logits=logits)
    torch.testing.assert_close(dist.log_prob(logits, a), ref.log_prob(a))
    torch.testing.assert_close(dist.entropy(logits), ref.entropy())
    assert torch.equal(dist.mode(logits), logits.argmax(-1))


def test_discrete_actions_from_a_start_reach_the_env_shifted():
    dist = make_distribution(spaces.Discrete(3, start=-1))
    a = torch.tensor([[0, 1, 2], [2, 2, 0]])
    assert dist.valid(a) and not dist.valid(a - 1)  # stored 0..n-1, as for start 0
    assert torch.equal(dist.env_action(a), a - 1) and dist.env_action(a).dtype == torch.int64
    assert torch.equal(Categorical(3).env_action(a), a)
    assert "the env's -1..1" in repr(dist)


def test_discrete_sampling_is_the_agents_original_draw():
    logits = torch.randn(6, 2, 5)
    torch.manual_seed(7)
    got = Categorical(5).sample(logits)
    torch.manual_seed(7)
    want = torch.multinomial(torch.softmax(logits.reshape(12, -1), -1), 1).view(6, 2)
    assert torch.equal(got, want)


def test_multi_categorical_matches_torch():
    g = torch.Generator().manual_seed(1)
    nvec = [3, 2, 4]
    params = torch.randn(7, 9, generator=g)
    dist = MultiCategorical(nvec)
    a = dist.sample(params)
    assert a.shape == (7, 3) and dist.valid(a)
    refs = [D.Categorical(logits=p) for p in params.split(nvec, -1)]
    torch.testing.assert_close(dist.log_prob(params, a), sum(r.log_prob(a[:, i]) for i, r in enumerate(refs)))
    torch.testing.assert_close(dist.entropy(params), sum(r.entropy() for r in refs))
    assert dist.prev_action_encoding(a).shape == (7, 9)
    assert not dist.valid(torch.tensor([[3, 0, 0]])) and not dist.valid(torch.tensor([[0, -1, 0]]))


def test_bernoulli_matches_torch():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 5, 3, generator=g)
    dist = Bernoulli(3)
    a = dist.sample(logits)
    ref = D.Independent(D.Bernoulli(logits=logits), 1)
    torch.testing.assert_close(dist.log_prob(logits, a), ref.log_prob(a.float()))
    torch.testing.assert_close(dist.entropy(logits), ref.entropy())
    assert dist.valid(a) and not dist.valid(a + 1)


def test_gaussian_matches_torch_and_maps_to_the_bounds():
    g = torch.Generator().manual_seed(3)
    dist = DiagGaussian(np.array([-2.0, 0.0]), np.array([2.0, 10.0]))
    with torch.no_grad():
        dist.log_std.copy_(torch.tensor([-0.5, 0.3]))
    mean = torch.randn(6, 2, generator=g)
    a = dist.sample(mean)
    ref = D.Independent(D.Normal(mean, dist.log_std.exp()), 1)
    torch.testing.assert_close(dist.log_prob(mean, a), ref.log_prob(a))
    torch.testing.assert_close(dist.entropy(mean), ref.entropy())
    assert torch.equal(dist.mode(mean), mean)
    # u in [-1, 1] spans [low, high]; beyond it the env gets the bound, the log-prob stays the sample's
    u = torch.tensor([[-1.0, 1.0], [0.0, 0.0], [3.0, -5.0]])
    torch.testing.assert_close(dist.env_action(u), torch.tensor([[-2.0, 10.0], [0.0, 5.0], [2.0, 0.0]]))
    assert dist.valid(u) and not dist.valid(torch.tensor([[float("nan"), 0.0]]))


def _hand_gaussian_ratio(a, mu_pi, mu_b, sigma_pi, sigma_b):
    """prod_i N(a_i; mu_pi_i, sigma_pi_i) / N(a_i; mu_b_i, sigma_b_i) in plain floats."""
    pdf = lambda x, m, s: math.exp(-((x - m) ** 2) / (2 * s * s)) / (s * math.sqrt(2 * math.pi))
    return math.prod(pdf(x, m1, s1) / pdf(x, m2, s2) for x, m1, m2, s1, s2 in zip(a, mu_pi, mu_b, sigma_pi, sigma_b))


def _hand_categorical_ratio(a, logits_pi, logits_b, nvec):
    def prob(logits, i):
        e = [math.exp(x) for x in logits]
        return e[i] / sum(e)

    ratio, start = 1.0, 0
    for k, n in enumerate(nvec):
        ratio *= prob(logits_pi[start : start + n], a[k]) / prob(logits_b[start : start + n], a[k])
        start += n
    return ratio


@pytest.mark.parametrize("kind", ["gaussian", "multi_discrete"])
def test_vtrace_importance_weights_equal_a_hand_computation(kind):
    """The learner's log_rhos (target log-prob minus the stored behaviour log-prob) give the ratios
    pi(a|x)/mu(a|x) computed by hand, and V-trace's rho_t = min(1, ratio) uses them."""
    torch.manual_seed(4)
    T, B = 3, 2
    if kind == "gaussian":
        behaviour, target = (DiagGaussian(np.full(2, -1.0), np.full(2, 1.0)) for _ in range(2))
        with torch.no_grad():
            target.log_std.copy_(torch.tensor([0.2, -0.4]))
        params_b, params_pi = torch.randn(T, B, 2), torch.randn(T, B, 2)
    else:
        nvec = [3, 2]
        behaviour = target = MultiCategorical(nvec)
        params_b, params_pi = torch.randn(T, B, 5), torch.randn(T, B, 5)
    with torch.no_grad():
        actions = behaviour.sample(params_b)
        behaviour_log_prob = behaviour.log_prob(params_b, actions)
        log_rhos = target.log_prob(params_pi, actions) - behaviour_log_prob
    for t in range(T):
        for b in range(B):
            a = actions[t, b].tolist()
            if kind == "gaussian":
                hand = _hand_gaussian_ratio(
                    a,
                    params_pi[t, b].tolist(),
                    params_b[t, b].tolist(),
                    target.log_std.exp().tolist(),
                    behaviour.log_std.exp().tolist(),
                )
            else:
                hand = _hand_categorical_ratio(a, params_pi[t, b].tolist(), params_b[t, b].tolist(), nvec)
            assert math.exp(float(log_rhos[t, b])) == pytest.approx(hand, rel=1e-4)
    rewards, values = torch.randn(T, B), torch.randn(T, B)
    discounts, bootstrap = torch.full((T, B), 0.9), torch.randn(B)
    out = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    rho = log_rhos.exp().clamp(max=1.0)
    torch.testing.assert_close(out.pg_advantages[-1], rho[-1] * (rewards[-1] + 0.9 * bootstrap - values[-1]))


def test_dict_observation_with_image_discrete_and_text_encodes_with_documented_shapes():
    env = make_env("space_envs:SpaceDict-v0", seed=0)
    space = env.observation_space
    assert list(space.spaces) == ["direction", "image"]  # the Text mission is skipped
    agent = Agent(space, env.action_space, "lstm", {"hidden_size": 16})
    torso = agent.torso
    assert isinstance(torso, DictTorso) and isinstance(torso.images["image"], GridTorso)
    assert torso.images["image"].flat_size == 32 * 7 * 7  # no pooling on a 7x7 grid
    assert torso.vector.output_size == 64 and torso.output_size == 64 + 256
    assert torso.vector.net[0].in_features == 4  # one-hot direction
    T, B = 3, 2
    obs = {"direction": torch.randint(4, (T, B)), "image": torch.randint(0, 256, (T, B, 7, 7, 3), dtype=torch.uint8)}
    out, _ = agent(obs, torch.zeros(T, B), torch.zeros(T, B, dtype=torch.bool), agent.initial_state(B))
    assert out["policy_params"].shape == (T, B, 3) and out["action"].shape == (T, B)
    assert out["log_prob"].shape == (T, B) and out["baseline"].shape == (T, B)


def test_images_pick_the_torso_by_size_and_layout():
    from rfwp_rl.agent import AgentConfig
    from rfwp_rl.encoders import make_torso

    cfg = AgentConfig()
    big = make_torso(spaces.Box(0, 255, (64, 48, 3), np.uint8), cfg)
    assert isinstance(big, ResNetTorso) and big.hwc and big.flat_size == 32 * 8 * 6
    assert big(torch.randint(0, 256, (2, 64, 48, 3), dtype=torch.uint8)).shape == (2, 256)
    small = make_torso(spaces.Box(0.0, 1.0, (2, 5, 5), np.float32), cfg)
    assert isinstance(small, GridTorso) and not small.hwc and small.divisor == 1.0
    for channels in (4, 6, 7, 10):  # MinAtar's games: [10, 10, C], channels last whatever C
        grid = make_torso(spaces.Box(0, 1, (10, 10, channels), bool), cfg)
        assert isinstance(grid, GridTorso) and grid.hwc and grid.convs[0].in_channels == channels
        assert grid(torch.ones(2, 10, 10, channels, dtype=torch.bool)).shape == (2, 256)
    with pytest.raises(UserError, match="agent torso 'resnet' needs image observations"):
        make_torso(spaces.Box(0.0, 1.0, (5,), np.float32), AgentConfig(torso="resnet"))
    # a Dict part can be overridden (here: the image left out)
    dict_space = tensor_obs_space(space_envs.dict_env().observation_space, "x")
    torso = make_torso(dict_space, AgentConfig(encoders={"image": "skip"}))
    assert len(torso.images) == 0 and torso.output_size == 64
    # the thread choice sees a ResNet inside a Dict encoder as well as alone
    with_resnet = make_torso(dict_space, AgentConfig(encoders={"image": "resnet"}))
    assert has_image_torso(big) and has_image_torso(with_resnet)
    assert not has_image_torso(small) and not has_image_torso(torso)


def test_grid_embedding_sums_one_learned_vector_per_channel_value():
    from rfwp_rl.agent import AgentConfig
    from rfwp_rl.encoders import make_torso

    space = spaces.Box(0, 255, (7, 7, 3), np.uint8)  # a grid world's [H, W, (object, colour, state)]
    torso = make_torso(space, AgentConfig(grid_embedding=4))
    assert isinstance(torso, GridTorso) and torso.convs[0].in_channels == 4
    obs = torch.zeros(1, 7, 7, 3, dtype=torch.uint8)
    obs[0, 2, 5] = torch.tensor([5, 1, 2], dtype=torch.uint8)  # a key, colour 1, state 2
    cells = torso.cells(obs)
    table = torso.embed.weight
    assert cells.shape == (1, 4, 7, 7)
    torch.testing.assert_close(cells[0, :, 2, 5], table[5] + table[256 + 1] + table[512 + 2])
    torch.testing.assert_close(cells[0, :, 0, 0], table[0] + table[256] + table[512])
    obs_ball = obs.clone()
    obs_ball[0, 2, 5, 0] = 6
    assert (torso.cells(obs_ball)[0, :, 2, 5] - cells[0, :, 2, 5]).abs().max() > 0.1  # 5 and 6 apart
    # channels first gives the same cells; float and bool grids are not symbols and keep no table
    chw = make_torso(spaces.Box(0, 255, (3, 7, 7), np.uint8), AgentConfig(grid_embedding=4))
    chw.load_state_dict(torso.state_dict())
    torch.testing.assert_close(chw(obs.permute(0, 3, 1, 2)), torso(obs))
    floats = make_torso(spaces.Box(0.0, 1.0, (10, 10, 4), np.float32), AgentConfig(grid_embedding=4))
    assert floats.embed is None and floats.convs[0].in_channels == 4
    # the default embeds uint8 grid cells (16 wide); 0 scales them by 1/255
    assert make_torso(space, AgentConfig()).convs[0].in_channels == 16
    scaled = make_torso(space, AgentConfig(grid_embedding=0))
    assert scaled.embed is None and scaled.divisor == 255.0 and scaled.convs[0].in_channels == 3
    with pytest.raises(UserError, match="agent grid_embedding -1 is invalid; allowed: 0"):
        AgentConfig.from_dict({"grid_embedding": -1})
    # an agent records the option only where a uint8 grid is embedded, so that runs and checkpoints of
    # other observations (vectors, MinAtar's bool grids) read the same as before the option existed
    from rfwp_rl.agent import Agent

    for obs_space, recorded in [
        (space, 16),
        (spaces.Box(0, 1, (10, 10, 4), bool), 0),
        (spaces.Box(-1.0, 1.0, (5,), np.float32), 0),
    ]:
        assert Agent(obs_space, 3, "lstm", {"hidden_size": 8}).config.grid_embedding == recorded


def test_spaces_round_trip_as_plain_data():
    for space in [
        spaces.Box(-2.0, 2.0, (1,), np.float32),
        space_envs.box_matrix_env().action_space,  # bounds per element
        spaces.Tuple((spaces.Discrete(3, start=1), spaces.Dict({"b": spaces.MultiBinary(2)}))),
        space_envs.grid_discrete_env().action_space,  # 2-D, with starts
        space_envs.shaped_tuple_env().action_space,  # a 2x2 MultiBinary and a scalar Box
        spaces.Discrete(5),
        spaces.MultiDiscrete([3, 4]),
        spaces.MultiBinary(3),
        tensor_obs_space(space_envs.dict_env().observation_space, "x"),
    ]:
        assert space_from_dict(space_to_dict(space)) == space


def test_a_space_description_nested_past_the_recursion_limit_is_a_one_line_error():
    """A checkpoint's space description is read from a file: nesting cannot end the reader with a traceback."""
    for wrap in (lambda d: {"type": "Tuple", "spaces": [d]}, lambda d: {"type": "Dict", "spaces": {"a": d}}):
        d = {"type": "Discrete", "n": 2}
        for _ in range(sys.getrecursionlimit() + 10):
            d = wrap(d)
        with pytest.raises(UserError) as e:
            space_from_dict(d)
        assert "nested deeper than" in str(e.value) and "\n" not in str(e.value)


SPACE_ENVS = [
    "SpaceBox-v0",
    "SpaceBoxMatrix-v0",
    "SpaceMultiDiscrete-v0",
    "SpaceMultiBinary-v0",
    "SpaceDiscreteStart-v0",
    "SpaceComposite-v0",
    "SpaceGridDiscrete-v0",
    "SpaceShapedTuple-v0",
    "SpaceShapedObs-v0",
    "SpaceIntBox-v0",
    "SpaceDict-v0",
    "SpaceTuple-v0",
]


@pytest.mark.parametrize("env_id", SPACE_ENVS)
def test_one_update_end_to_end(env_id):
    """Actors on the in-process pool make rollouts of the layout rollout_spec describes (valid actions),
    the learner's loss on them is finite, starts on-policy (ratio 1) and an update changes the policy."""
    from rfwp_rl.impala.config import ImpalaConfig

    torch.manual_seed(0)
    spec = env_spec(f"space_envs:{env_id}")
    run = RunSpec(
        f"space_envs:{env_id}",
        "vector",
        spec.obs_space,
        spec.action_space,
        {},
        __import__("rfwp_rl.presets", fromlist=["Preset"]).Preset(
            core="lstm", core_config={"hidden_size": 16}, agent={"use_prev_action": True}
        ),
    )
    agent = run.build_agent()
    pool = LocalEnvPool(f"space_envs:{env_id}", {}, seed=1, batch_size=2, num_batches=1)
    actors = Actors(pool, agent, num_envs=2, num_batches=1, unroll_length=6)
    rollouts = []
    while not rollouts:
        rollouts, _ = actors.step()
    pool.close()
    data = rollouts[0].data
    layout = rollout_spec(agent.obs_space, agent.action_dist)
    assert sorted(data) == sorted(layout)
    for key, (dtype, shape) in layout.items():
        assert data[key].dtype == dtype and tuple(data[key].shape) == (7, 2, *shape), key
    assert agent.action_dist.valid(data["action"])
    lrn = learner.Learner(agent, ImpalaConfig(total_steps=1000, batch_size=2, unroll_length=6))
    before = [p.detach().clone() for p in agent.parameters()]
    lrn.update(rollouts[0])
    assert lrn.guard.skipped == 0 and lrn.loss_stats["learner/mean_rho"] == pytest.approx(1.0, rel=1e-4)
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.parameters()))


def test_bound_cost_adds_the_squared_distance_of_the_mean_past_the_bounds():
    """``bound_cost`` adds c x sum over acted steps of relu(|mu| - 1)^2 (normalised units, bounded
    dimensions only) to the loss, and nothing for a distribution that cannot leave its bounds."""
    from rfwp_rl.agent import Agent

    torch.manual_seed(5)
    space = spaces.Box(np.array([-2.0, -np.inf], np.float32), np.array([2.0, np.inf], np.float32))
    agent = Agent((3,), space, "ff")
    with torch.no_grad():
        agent.policy.bias.copy_(torch.tensor([1.2, 5.0]))  # means past the bound on dimension 0 only
    T, B = 4, 2
    batch = {
        "obs": torch.randn(T + 1, B, 3),
        "reward": torch.randn(T + 1, B),
        "done": torch.zeros(T + 1, B, dtype=torch.bool),
        "prev_action": torch.zeros(T + 1, B, 2),
        "action": torch.randn(T + 1, B, 2),
        "behaviour_log_prob": torch.full((T + 1, B), -2.0),
        "truncated": torch.zeros(T + 1, B, dtype=torch.bool),
    }
    batch["truncated"][2, 1] = True  # that step's action never ran: no penalty there either
    base, _ = compute_loss(agent, batch, (), loss_config(bound_cost=0.0))
    with_bound, stats = compute_loss(agent, batch, (), loss_config(bound_cost=0.5))
    with torch.no_grad():
        out, _ = agent(batch["obs"], batch["reward"], batch["done"], ())
    hand = sum(
        max(abs(float(out["policy_params"][t, b, 0])) - 1.0, 0.0) ** 2
        for t in range(T)
        for b in range(B)
        if not (t == 2 and b == 1)
    )
    assert hand > 0
    assert float((with_bound - base).detach()) == pytest.approx(0.5 * hand, rel=1e-4)
    assert stats["loss/bound"] == pytest.approx(0.5 * hand, rel=1e-4)
    (grad,) = torch.autograd.grad(with_bound - base, agent.policy.bias)
    assert float(grad[0]) > 0 and float(grad[1]) == 0.0  # pulls dimension 0 back towards the box
    logits = torch.randn(3, 4, 5) * 10
    assert torch.equal(Categorical(5).out_of_bounds(logits), torch.zeros(3, 4))
    assert agent.action_dist.has_bounds and not Categorical(5).has_bounds
    unbounded = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    assert not Agent((3,), unbounded, "ff").action_dist.has_bounds


@pytest.mark.parametrize("env_id, what", [("SpaceGraph-v0", "Graph"), ("SpaceSequence-v0", "Sequence")])
def test_unsupported_observation_space_is_one_line(env_id, what):
    with pytest.raises(UserError) as e:
        make_env(f"space_envs:{env_id}")
    msg = str(e.value)
    assert what in msg and "supported: Box, Discrete" in msg and "\n" not in msg


def test_unsupported_action_space_is_one_line():
    for space in [spaces.Tuple((spaces.Discrete(2), spaces.Text(4))), spaces.Text(4)]:
        with pytest.raises(UserError) as e:
            make_distribution(space)
        assert "supported: Discrete, MultiDiscrete" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError) as e:  # an integer Box of too many values for a categorical per element
        make_distribution(spaces.Box(0, 5000, (2,), np.int64))
    assert "at most 1024 values per element" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "space, supported",
    [
        (spaces.Box(0, 1023, (2,), np.int64), True),
        (spaces.Box(0, 1024, (2,), np.int64), False),  # 1025 values per element
        (spaces.Box(-1.0, 1.0, (2,), np.float32), True),
        (spaces.Box(0, 1, (2,), np.bool_), False),
        (spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Tuple((spaces.MultiBinary(2), spaces.Text(4)))}), False),
        (spaces.Tuple(()), False),
        (spaces.Tuple((spaces.Discrete(2), spaces.MultiDiscrete([2, 3]))), True),
    ],
)
def test_env_check_and_distribution_agree_on_which_action_spaces_are_supported(space, supported):
    """The env's description at start and the policy head apply one rule: no space passes the first and fails
    the second."""
    if supported:
        assert space_from_dict(action_space_dict(space, "e")) == space and make_distribution(space) is not None
        return
    for refuse in (lambda: action_space_dict(space, "e"), lambda: make_distribution(space)):
        with pytest.raises(UserError) as e:
            refuse()
        assert "\n" not in str(e.value) and str(space) in str(e.value)


def test_integer_box_actions_are_categoricals_over_their_values_from_low():
    space = spaces.Box(np.array([0, -2]), np.array([4, 2]), dtype=np.int32)
    dist = make_distribution(space)
    assert dist.nvec == [5, 5] and dist.env_shape == (2,) and dist.env_dtype == torch.int32
    a = torch.tensor([[4, 0], [0, 4]])
    env = dist.env_action(a)
    assert env.dtype == torch.int32 and env.tolist() == [[4, -2], [0, 2]]
    assert all(space.contains(row) for row in env.numpy())


def test_composite_actions_are_their_parts_side_by_side_and_reach_the_env_in_its_structure():
    """A Dict of (a Tuple of a Discrete from 1 and a MultiBinary, a Box, a MultiDiscrete): the leaves in sorted-key
    order whatever the Dict's own order, log-prob and entropy the sums of torch's distributions of the parts,
    and the env's structure back from the flat env action."""
    space = space_envs.composite_env().action_space
    assert list(space.spaces) == ["pick", "move", "aim"]  # an OrderedDict keeps its order
    from rfwp_rl.envs.spaces import action_leaves, env_step_action

    assert [path for path, _ in action_leaves(space)] == ["aim", "move", "pick/0", "pick/1"]
    dist = make_distribution(space, log_std_init=-0.5)
    assert dist.num_params == 5 + 2 + 3 + 2 and dist.action_shape == (2 + 2 + 1 + 2,) and dist.env_shape == (7,)
    g = torch.Generator().manual_seed(3)
    params = torch.randn(4, 2, dist.num_params, generator=g)
    a = dist.sample(params).detach()  # (the Box part's learned log-std carries a gradient)
    assert a.dtype == torch.float32 and a.shape == (4, 2, 7) and dist.valid(a)
    aim, move, pick0, pick1 = params.split([5, 2, 3, 2], dim=-1)
    sigma = torch.full((2,), -0.5).exp()
    parts = [
        (D.Categorical(logits=aim[..., :2]), a[..., 0].long()),
        (D.Categorical(logits=aim[..., 2:]), a[..., 1].long()),
        (D.Normal(move, sigma), a[..., 2:4]),
        (D.Categorical(logits=pick0), a[..., 4].long()),
        (D.Bernoulli(logits=pick1), a[..., 5:7]),
    ]
    want = sum(d.log_prob(x).reshape(4, 2, -1).sum(-1) for d, x in parts)
    torch.testing.assert_close(dist.log_prob(params, a), want)
    torch.testing.assert_close(dist.entropy(params), sum(d.entropy().reshape(4, 2, -1).sum(-1) for d, _ in parts))
    assert not dist.valid(a + 0.5) and not dist.valid(a.double())  # not whole numbers; not the stored dtype
    env = dist.env_action(a)
    assert env.dtype == torch.float64 and env.shape == (4, 2, 7)
    for row, stored in zip(env.reshape(-1, 7).numpy(), a.reshape(-1, 7)):
        act = env_step_action(row, space)
        assert space.contains(act), act
        assert act["pick"][0] == int(stored[4]) + 1 and list(act["aim"]) == stored[:2].long().tolist()
    assert dist.prev_action_encoding(a).shape == (4, 2, dist.prev_action_size) == (4, 2, 12)


def test_multi_discrete_multi_binary_and_scalar_box_actions_reach_the_env_in_their_shape():
    from rfwp_rl.envs.spaces import env_step_action

    grid = space_envs.grid_discrete_env().action_space
    dist = make_distribution(grid)
    assert dist.action_shape == (4,) and dist.env_shape == (2, 2) and dist.num_params == 2 + 3 + 4 + 5
    a = torch.tensor([[1, 2, 0, 4]])
    assert torch.equal(dist.env_action(a), torch.tensor([[[1, 3], [-1, 4]]]))
    assert grid.contains(env_step_action(dist.env_action(a)[0].numpy(), grid))
    bits = make_distribution(spaces.MultiBinary([2, 2]))
    assert bits.action_shape == (4,) and bits.env_action(torch.tensor([[1, 0, 0, 1]])).shape == (1, 2, 2)
    scalar = spaces.Box(-3.0, 3.0, (), np.float32)
    dist = make_distribution(scalar)
    assert dist.action_shape == (1,) and dist.env_shape == ()
    env = dist.env_action(torch.tensor([[0.5], [9.0]]))
    torch.testing.assert_close(env, torch.tensor([1.5, 3.0]))  # the bounds' units, clipped, one number each
    act = env_step_action(env[0].numpy(), scalar)
    assert isinstance(act, np.ndarray) and act.shape == () and scalar.contains(act)


def test_box_actions_of_any_shape_are_flattened_and_reach_the_env_in_its_shape():
    low = np.array([[-2.0, 0.0, -np.inf], [-1.0, -1.0, 5.0]], np.float32)
    high = np.array([[2.0, 1.0, np.inf], [1.0, 3.0, 6.0]], np.float32)
    dist = make_distribution(spaces.Box(low, high, dtype=np.float32))
    assert dist.action_shape == (6,) and dist.num_params == 6 and dist.env_shape == (2, 3)
    u = torch.tensor([[[1.0, -1.0, 7.5, 0.0, 2.0, -3.0]]])  # [1, 1, 6] normalised
    want = torch.tensor([[[[2.0, 0.0, 7.5], [0.0, 3.0, 5.0]]]])  # mapped to each bound (clipped), inf passed on
    torch.testing.assert_close(dist.env_action(u), want)


@pytest.mark.slow
def test_train_dict_obs_and_box_actions_through_moolib(tmp_path):
    """The CLI trains on the moolib pool: Dict observations (one tensor per part key), integer
    observations, MultiDiscrete actions, Discrete actions from -1 and Dict actions of several kinds (through the
    shared action table; the env checks each action is in its space), then eval plays the checkpoint greedily.
    (A Box's actions in its own shape: in the table as the others; test_one_update_end_to_end.)"""
    for env_id in ["SpaceDict-v0", "SpaceMultiDiscrete-v0", "SpaceDiscreteStart-v0", "SpaceComposite-v0"]:
        run = tmp_path / env_id
        argv = [
            "train",
            "--env",
            f"space_envs:{env_id}",
            "--core",
            "lstm",
            "--set",
            "core_config.hidden_size=8",
            "--env-backend",
            "moolib",
            "--num-actors",
            "4",
            "--num-env-processes",
            "2",
            "--unroll-length",
            "5",
            "--batch-size",
            "2",
            "--total-steps",
            "40",
            "--run-dir",
            str(run),
            "--log-every",
            "0.5",
        ]
        code = (
            f"import sys; sys.path.insert(0, {str(TESTS)!r}); import space_envs; from rfwp_rl import cli; "
            f"sys.exit(cli.main({argv!r}))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        from rfwp_rl.impala.evaluate import evaluate

        # the env comes from a Python module: eval imports it only when --env names it
        record = evaluate(run, env=f"space_envs:{env_id}", episodes=2, repeats=1, num_envs=2, quiet=True)
        assert len(record["scores"][0]) == 2


class _WrongShape:
    """An env whose observations break its declared space: ``returns`` for every observation."""

    def __init__(self, space: spaces.Space, returns):
        import gymnasium

        class Env(gymnasium.Env):
            observation_space = space
            action_space = spaces.Discrete(2)

            def reset(self, seed=None, options=None):
                return returns, {}

            def step(self, action):
                return returns, 0.0, False, False, {}

        self.env = Env()


@pytest.mark.parametrize(
    "space, returns, message",
    [
        (spaces.Box(0, 1, (3,)), np.zeros(2, np.float32), "returned an observation of shape (2,); its "),
        (spaces.Box(0, 1, (3,)), "text", "returned an observation of a value that is no array"),
        (
            spaces.Dict({"a": spaces.Box(0, 1, (2,)), "b": spaces.Discrete(3)}),
            {"a": np.zeros(2)},
            "returned an observation without its part 'b'",
        ),
        (
            spaces.Dict({"a": spaces.Box(0, 1, (2,)), "b": spaces.Discrete(3)}),
            {"a": np.zeros(5), "b": 1},
            "returned part 'a' of an observation of shape (5,); its observation_space says shape (2,)",
        ),
    ],
)
def test_an_observation_outside_the_declared_space_is_named_in_one_line(space, returns, message):
    from rfwp_rl.envs.spaces import to_tensor_obs

    env = to_tensor_obs(_WrongShape(space, returns).env, "mine:Odd-v0")
    with pytest.raises(ValueError) as e:
        env.reset()
    assert str(e.value).startswith("mine:Odd-v0 ") and message in str(e.value) and "\n" not in str(e.value)


def test_a_flat_float_box_observation_is_checked_and_passed_as_float32():
    from rfwp_rl.envs.spaces import to_tensor_obs

    env = to_tensor_obs(_WrongShape(spaces.Box(0, 1, (3,)), [0.5, 0.25, 1.0]).env, "mine:Ok-v0")
    obs, _ = env.reset()
    assert obs.dtype == np.float32 and obs.tolist() == [0.5, 0.25, 1.0]
