"""Agent networks and presets: parameter counts of the paper's Atari agents, shapes, resets."""

import re

import pytest
import torch

from rfwp_rl.agent import Agent, AgentConfig, ResNetTorso, atari_param_counts
from rfwp_rl.errors import UserError
from rfwp_rl.presets import apply_overrides, available_presets, load_preset, preset_cores, resolve_preset

# RFWP paper App. C (reference implementation): base + per-action parameters.
PAPER_COUNTS = {
    "ff": (1_089_490, 258),
    "lstm": (1_616_849, 257),
    "lt": (1_517_905, 129),
    "delta": (1_518_929, 129),
    "rdn": (1_543_761, 129),
    "delta_rnn": (1_585_489, 129),
}
# the presets that are not the paper's. GRU: the ResNet torso (1,089,232: the LSTM agent's
# 1,616,849 less its core, 527,360, and its baseline head, 257), a GRU core of 312 units
# (3 gate blocks of 312 x (257 + 312) weights, two biases each) and the heads (313 + 313 A).
# FWM: agents/atari_fwm.toml. mLSTM: the torso, the input projection 257 -> 128 (33,024), per
# block LayerNorm (256), the q, k, v, o and gate projection with bias (128 x 520 + 520), the output
# projection (128 x 128) and the feed-forward sublayer (131,968), and the heads (129 + 129 A).
MLSTM_BLOCK = 256 + 128 * 520 + 520 + 128 * 128 + 131_968
OTHER_COUNTS = {
    "gru": (1_089_232 + 3 * 312 * 569 + 6 * 312 + 313, 313),
    "fwm": (1_683_122, 257),
    "ffm": (1_601_141, 641),  # derived in tests/test_cores_ffm.py
    "lru": (1_618_129, 129),  # derived in tests/test_cores_lru.py
    "mlstm": (1_089_232 + 33_024 + 2 * MLSTM_BLOCK + 129, 129),
    "mamba": (1_588_945, 129),  # agents/atari_mamba.toml, derived in tests/test_cores_mamba.py
}
CORES = ["ff", "lstm", "gru", "lt", "delta", "delta_rnn", "rdn", "fwm"]
SMALL = {
    "lstm": {"hidden_size": 16},
    "gru": {"hidden_size": 16},
    "fwm": {"hidden_size": 16, "memory_size": 4, "num_reads": 2},
    "ff": {},
}
FAST = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "ff_size": 32}


@pytest.mark.parametrize("num_actions", [6, 18])
def test_atari_param_counts_match_paper(num_actions):
    counts = atari_param_counts(num_actions)
    assert list(counts) == [*PAPER_COUNTS, *OTHER_COUNTS]
    for core, (base, per_action) in {**PAPER_COUNTS, **OTHER_COUNTS}.items():
        assert counts[core] == base + per_action * num_actions, core
    assert OTHER_COUNTS["gru"][0] == 1_624_001  # the count agents/atari_gru.toml states


def test_resnet_torso_shapes():
    torso = ResNetTorso((4, 84, 84))
    assert torso.flat_size == 3872
    out = torso(torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8))
    assert out.shape == (3, 256) and (out >= 0).all()


def small_agent(core, obs_shape=(4,), num_actions=3, **agent):
    torch.manual_seed(0)
    return Agent(obs_shape, num_actions, core, SMALL.get(core, FAST), agent)


@pytest.mark.parametrize("separate_baseline", [False, True])
@pytest.mark.parametrize("core", CORES)
def test_forward_shapes_and_reset_semantics(core, separate_baseline):
    """One call over T steps == T single-step calls; done[t] restarts the core from zeros."""
    agent = small_agent(core, separate_baseline=separate_baseline).eval()
    T, B = 6, 3
    g = torch.Generator().manual_seed(1)
    obs, reward = torch.randn(T, B, 4, generator=g), torch.randn(T, B, generator=g) * 3
    done = torch.zeros(T, B, dtype=torch.bool)
    done[3, 1] = True
    state = agent.initial_state(B)
    assert all(s.shape[0] == B for s in state)
    out, new_state = agent(obs, reward, done, state)
    assert out["policy_params"].shape == (T, B, 3)
    assert out["baseline"].shape == (T, B) and out["action"].shape == (T, B)
    assert out["action"].dtype == torch.int64 and ((out["action"] >= 0) & (out["action"] < 3)).all()

    s = state
    for t in range(T):
        step, s = agent(obs[t : t + 1], reward[t : t + 1], done[t : t + 1], s)
        torch.testing.assert_close(step["policy_params"][0], out["policy_params"][t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(step["baseline"][0], out["baseline"][t], rtol=1e-5, atol=1e-5)
    assert len(s) == len(new_state) == len(state)
    for a, b in zip(s, new_state):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

    # After the reset at t=3, entry 1 behaves as a fresh episode starting at t=3.
    fresh, _ = agent(obs[3:, 1:2], reward[3:, 1:2], torch.zeros(T - 3, 1, dtype=torch.bool), agent.initial_state(1))
    torch.testing.assert_close(fresh["policy_params"][:, 0], out["policy_params"][3:, 1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fresh["baseline"][:, 0], out["baseline"][3:, 1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("core", ["lstm", "rdn"])
def test_separate_baseline_has_its_own_torso_core_and_state(core):
    """With ``separate_baseline`` the value loss reaches none of the policy's parameters and the policy
    loss none of the baseline's; the state is the policy core's tensors, then the baseline core's."""
    shared, separate = small_agent(core), small_agent(core, separate_baseline=True)
    n = len(shared.initial_state(2))
    state = separate.initial_state(2)
    assert len(state) == 2 * n and separate.policy_state_size == n
    own = sum(p.numel() for m in (separate.baseline_torso, separate.baseline_core) for p in m.parameters())
    assert sum(p.numel() for p in separate.parameters()) == sum(p.numel() for p in shared.parameters()) + own
    assert own == sum(p.numel() for m in (shared.torso, shared.core) for p in m.parameters())

    obs, reward = torch.randn(5, 2, 4), torch.randn(5, 2)
    done = torch.zeros(5, 2, dtype=torch.bool)
    out, new_state = separate(obs, reward, done, state)
    policy_side = [*separate.torso.parameters(), *separate.core.parameters(), *separate.policy.parameters()]
    baseline_side = [
        *separate.baseline_torso.parameters(),
        *separate.baseline_core.parameters(),
        *separate.baseline.parameters(),
    ]
    grads = torch.autograd.grad(out["baseline"].sum(), policy_side + baseline_side, allow_unused=True)
    assert all(g is None for g in grads[: len(policy_side)])
    assert all(g is not None and g.abs().sum() > 0 for g in grads[len(policy_side) :])
    grads = torch.autograd.grad(out["policy_params"].sum(), baseline_side, allow_unused=True)
    assert all(g is None for g in grads)
    # the baseline core's state moved, the policy core's too, each from its own inputs
    assert all(not torch.equal(a, b) for a, b in zip(state, new_state))

    assert shared.config.to_dict()["separate_baseline"] is False
    assert separate.config.to_dict()["separate_baseline"] is True
    assert AgentConfig.from_dict(separate.config.to_dict()).separate_baseline


def test_reward_is_clipped_and_greedy_is_argmax():
    agent = small_agent("lstm").eval()
    obs, done = torch.randn(2, 2, 4), torch.zeros(2, 2, dtype=torch.bool)
    a, _ = agent(obs, torch.full((2, 2), 1.0), done, agent.initial_state(2), greedy=True)
    b, _ = agent(obs, torch.full((2, 2), 7.5), done, agent.initial_state(2), greedy=True)
    torch.testing.assert_close(a["policy_params"], b["policy_params"])
    assert torch.equal(a["action"], a["policy_params"].argmax(-1))


def test_prev_action_input():
    agent = small_agent("lstm", use_prev_action=True)
    assert agent.core.input_size == 64 + 1 + 3
    obs, reward = torch.randn(4, 2, 4), torch.zeros(4, 2)
    done = torch.zeros(4, 2, dtype=torch.bool)
    prev = torch.tensor([[0, 1], [2, 2], [1, 0], [0, 0]])
    out, _ = agent(obs, reward, done, agent.initial_state(2), prev_action=prev)
    other, _ = agent(obs, reward, done, agent.initial_state(2), prev_action=(prev + 1) % 3)
    assert not torch.allclose(out["policy_params"], other["policy_params"])
    # At an episode start the previous action is ignored.
    done[0] = True
    x, _ = agent(obs[:1], reward[:1], done[:1], agent.initial_state(2), prev_action=prev[:1])
    y, _ = agent(obs[:1], reward[:1], done[:1], agent.initial_state(2), prev_action=(prev[:1] + 1) % 3)
    torch.testing.assert_close(x["policy_params"], y["policy_params"])
    with pytest.raises(ValueError, match="prev_action"):
        agent(obs, reward, done, agent.initial_state(2))


def test_mlp_torso_and_errors():
    agent = Agent((4,), 2, "ff")
    assert sum(p.numel() for p in agent.torso.parameters()) == 4 * 64 + 64 + 64 * 64 + 64
    assert agent.core.output_size == 65
    with pytest.raises(UserError, match="resnet"):
        Agent((4,), 2, "ff", agent_config={"torso": "resnet"})
    with pytest.raises(UserError, match="unknown agent option 'use_prev_actions'.*use_prev_action"):
        AgentConfig.from_dict({"use_prev_actions": True})
    with pytest.raises(UserError, match="unknown core 'rdnn'.*'rdn'"):
        Agent((4,), 2, "rdnn")


def test_presets_load_override_and_errors(tmp_path):
    names = available_presets()
    for core in ["ff", "lstm", "gru", "lt", "delta", "rdn", "delta_rnn", "fwm"]:
        assert f"atari_{core}" in names and f"vector_{core}" in names
    rdn = load_preset("atari_rdn")
    assert rdn.core == "rdn" and rdn.core_config["hidden_size"] == 128
    assert rdn.core_config["feature_map"] == "softmax"
    p = apply_overrides(
        rdn, ["core_config.hidden_size=64", "agent.use_prev_action=true", "core_config.feature_map=dpfp"]
    )
    assert p.core_config["hidden_size"] == 64 and p.agent["use_prev_action"] is True
    assert p.core_config["feature_map"] == "dpfp" and rdn.core_config["hidden_size"] == 128

    # --core picks the Atari preset for Atari envs and the core defaults elsewhere.
    assert resolve_preset("lstm", None, kind="atari").core_config == {"hidden_size": 256, "num_layers": 1}
    assert resolve_preset("lstm", None, kind="vector").source.endswith("vector_lstm.toml")
    assert resolve_preset("ff", None, kind="vector").core_config == {}
    with pytest.raises(UserError, match="unknown core 'lstn'.*'lstm'"):
        resolve_preset("lstn", None)
    # a core with no agent preset of any kind is a sequence-model core: refused, naming the agent cores
    for seq_only in ("srwm", "delta_lstm"):
        with pytest.raises(UserError, match=rf"core '{seq_only}' has no agent preset .*agent cores: delta, "):
            resolve_preset(seq_only, None, kind="vector")
    assert resolve_preset("gated_delta", None, kind="atari").core_config == {}  # a vector preset only
    with pytest.raises(UserError, match="contradicts"):
        resolve_preset("lstm", "atari_rdn")

    f = tmp_path / "mine.toml"
    f.write_text('core = "delta"\n[core_config]\nhidden_size = 32\nnum_heads = 2\n')
    assert resolve_preset(None, str(f), ["core_config.num_layers=1"]).core_config == {
        "hidden_size": 32,
        "num_heads": 2,
        "num_layers": 1,
    }
    f.write_text('core = "delta"\n[core_config\n')
    with pytest.raises(UserError, match="not valid TOML"):
        load_preset(str(f))
    f.write_text('core = "delta"\ncore_confg = {}\n')
    with pytest.raises(UserError, match="core_confg.*core_config"):
        load_preset(str(f))
    with pytest.raises(UserError, match="unknown preset 'atari_rdm'.*'atari_rdn'"):
        load_preset("atari_rdm")
    with pytest.raises(UserError, match="does not exist"):
        load_preset(str(tmp_path / "missing.toml"))
    with pytest.raises(UserError, match=f"^preset file '{tmp_path}' is not a file$"):
        load_preset(str(tmp_path))
    f.write_bytes(b"\x80\xcf\x00 not text")
    with pytest.raises(UserError, match="is not a text file"):
        load_preset(str(f))
    with pytest.raises(UserError, match="expected key=value"):
        apply_overrides(rdn, ["hidden_size"])
    with pytest.raises(UserError, match="unknown key 'hidden_size'"):
        apply_overrides(rdn, ["hidden_size=3"])


def test_vector_gru_preset_matches_the_lstm_presets_count():
    # the counts agents/vector_gru.toml and agents/README.md state (9-float observation, 4 actions)
    from rfwp_rl.agent import build_agent, count_parameters

    counts = {}
    for core in ("lstm", "gru"):
        preset = resolve_preset(core, None, kind="vector")
        counts[core] = [count_parameters(build_agent(preset, (9,), a)) for a in (4, 5)]
    assert counts == {"lstm": [207_749, 207_749 + 961], "gru": [204_165, 204_165 + 897]}


def test_every_atari_preset_is_the_one_an_atari_run_of_its_core_picks():
    atari_cores = preset_cores("atari")
    assert {"ff", "lstm", "lt", "delta", "delta_rnn", "rdn", "mamba", "mlstm", "lru", "ffm"} <= set(atari_cores)
    for core in atari_cores:
        preset = resolve_preset(core, None, kind="atari")
        assert preset.source.endswith(f"atari_{core}.toml") and preset.core == core
        assert preset == load_preset(f"atari_{core}")


@pytest.mark.parametrize("core", preset_cores("vector"))
def test_every_vector_preset_takes_a_learner_step_in_the_impala_agent(core):
    # one learner step: an unroll with an episode start inside, gradients through the core's state
    from rfwp_rl.agent import Agent

    preset = resolve_preset(core, None, kind="vector")
    assert preset.source.endswith(f"vector_{core}.toml") and preset.core == core
    assert preset == load_preset(f"vector_{core}")
    torch.manual_seed(0)
    agent = Agent((9,), 4, core, core_config=preset.core_config, agent_config=preset.agent)
    T, B = 4, 3
    done = torch.zeros(T, B, dtype=torch.bool)
    done[2, 1] = True
    out, state = agent(
        torch.randn(T, B, 9), torch.randn(T, B), done, agent.initial_state(B), prev_action=torch.randint(0, 4, (T, B))
    )
    assert out["policy_params"].shape == (T, B, 4) and out["action"].shape == (T, B)
    (out["policy_params"].sum() + out["baseline"].sum()).backward()
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in agent.core.parameters())
    assert [tuple(s.shape) for s in state] == agent.core.state_shapes(B)


def test_sizes_past_the_bounds_are_refused_before_any_memory_is_taken():
    # a preset or checkpoint is a file: an absurd size in it is a one-line error, not an exhausted machine
    from rfwp_rl import cores
    from rfwp_rl.agent import build_agent
    from rfwp_rl.cores.base import MAX_PARAMETERS, MAX_REPEATS, MAX_SIZE

    with pytest.raises(UserError, match=rf"core 'rdn': hidden_size {MAX_SIZE + 1} is too large; allowed: at most"):
        cores.make("rdn", 8, hidden_size=MAX_SIZE + 1)
    with pytest.raises(UserError, match=rf"core 'lstm': num_layers {MAX_REPEATS + 1} is too large"):
        cores.make("lstm", 8, num_layers=MAX_REPEATS + 1)
    # every size within its bound, the whole too large: counted on the meta device
    too_many = rf"core 'rdn' would have [\d,]+ parameters; allowed: at most {MAX_PARAMETERS:,}"
    with pytest.raises(UserError, match=too_many):
        cores.make("rdn", 8, hidden_size=2**16, ff_size=2**16)
    with pytest.raises(UserError, match="agent mlp_sizes: a width"):
        AgentConfig.from_dict({"mlp_sizes": [MAX_SIZE + 1]})
    with pytest.raises(UserError, match="agent recall_lags"):
        AgentConfig.from_dict({"recall_lags": MAX_SIZE + 1})
    for widths, message in (
        ([64, "a"], "agent mlp_sizes: a width 'a' is invalid; allowed: an integer >= 1"),
        ([-4], "agent mlp_sizes: a width -4 is invalid"),
        ([64.5], "agent mlp_sizes: a width 64.5 is invalid"),
        (64, "agent mlp_sizes 64 is invalid; allowed: a list of integers >= 1"),
        ("64", "agent mlp_sizes '64' is invalid"),
    ):
        with pytest.raises(UserError) as e:
            AgentConfig.from_dict({"mlp_sizes": widths})
        assert str(e.value) == message or str(e.value).startswith(message), (widths, str(e.value))
    for option, message in (
        ({"separate_baseline": "yes"}, "agent separate_baseline 'yes' is invalid; allowed: true or false"),
        ({"torso_output": 1.5}, "agent torso_output 1.5 is invalid; allowed: an integer >= 1"),
        ({"torso_output": 0}, "agent torso_output 0 is invalid; allowed: an integer >= 1"),
        ({"log_std_init": float("nan")}, "agent log_std_init nan is invalid; allowed: a finite number"),
        ({"log_std_init": 1e12}, "agent log_std_init 1000000000000.0 is invalid; allowed: a number within [-20, 20]"),
        ({"log_std_init": -21}, "agent log_std_init -21 is invalid; allowed: a number within [-20, 20]"),
        ({"encoders": 1}, "agent encoders 1 is invalid; allowed: a table of part = encoder name"),
        ({"mlp_activation": 3}, "agent mlp_activation 3 is invalid; allowed: a name"),
    ):
        with pytest.raises(UserError, match=f"^{re.escape(message)}$"):
            AgentConfig.from_dict(option)
    with pytest.raises(UserError, match="agent would have [\\d,]+ parameters"):
        build_agent(resolve_preset("lstm", None, ["agent.mlp_sizes=[1000000, 1000]"]), (9,), 4)
    assert AgentConfig.from_dict({"log_std_init": -20}).log_std_init == -20  # the bound itself is allowed
    assert cores.make("rdn", 8, hidden_size=16, num_heads=2) is not None  # ordinary sizes build
