"""Learner defaults by env kind: the paper's for Atari, the vector profile for vector envs, and the
command line's value wherever it gives one."""

import argparse

import pytest

from rfwp_rl.errors import UserError
from rfwp_rl.impala import profiles, train
from rfwp_rl.impala.config import DEFAULTS


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_atari_keeps_the_paper_settings():
    cfg = train.config_from_args(parse(), "atari")
    assert cfg.profile == "atari"
    assert (cfg.num_actors, cfg.batch_size, cfg.unroll_length) == (48, 32, 50)
    assert (cfg.optimizer, cfg.learning_rate, cfg.rmsprop_eps, cfg.entropy_cost) == ("rmsprop", 6e-4, 0.01, 0.01)
    assert not cfg.normalize_advantages and cfg.vtrace_lambda == 1.0 and cfg.discount == 0.99


def test_vector_profile_matches_the_unroll_to_the_memory_horizon():
    cfg = train.config_from_args(parse(), "vector", memory_horizon=33, max_episode_steps=34)
    assert cfg.profile == "vector" and cfg.unroll_length == 66
    assert (cfg.optimizer, cfg.normalize_advantages, cfg.vtrace_lambda) == ("adam", True, 0.9)
    assert (cfg.num_actors, cfg.batch_size) == (profiles.VECTOR["num_actors"], 5)  # 320 steps / 66
    # no horizon: the episode limit; neither: the assumed 50 steps; always within the bounds
    assert profiles.vector_unroll_length(None, 30) == 60
    assert profiles.vector_unroll_length(None, None) == 2 * profiles.UNKNOWN_HORIZON
    assert profiles.vector_unroll_length(3, 10) == profiles.MIN_UNROLL
    assert profiles.vector_unroll_length(None, 500) == profiles.MAX_UNROLL
    # a stated horizon is spanned past MAX_UNROLL (an unroll shorter than the span cannot learn it)
    assert profiles.vector_unroll_length(129, 130) == 258
    assert profiles.vector_unroll_length(10**6, None) == profiles.MAX_STATED_UNROLL


def test_vector_batches_hold_about_320_env_steps_whatever_the_unroll():
    assert [profiles.vector_batch_size(u) for u in (20, 22, 38, 66, 100, 128, 7)] == [16, 15, 8, 5, 4, 4, 16]
    short = train.config_from_args(parse(), "vector", memory_horizon=5)
    assert (short.batch_size, short.unroll_length) == (16, 20)
    # the batch follows an unroll given on the command line; a batch given there wins
    assert train.config_from_args(parse("--unroll-length", "80"), "vector", memory_horizon=5).batch_size == 4
    assert train.config_from_args(parse("--unroll-length", "80", "--batch-size", "32"), "vector").batch_size == 32


def test_the_command_line_wins_over_the_profile():
    cfg = train.config_from_args(
        parse(
            "--unroll-length",
            "7",
            "--optimizer",
            "rmsprop",
            "--no-normalize-advantages",
            "--vtrace-lambda",
            "1",
            "--learning-rate",
            "1e-3",
        ),
        "vector",
        memory_horizon=33,
    )
    assert (cfg.unroll_length, cfg.optimizer, cfg.normalize_advantages, cfg.vtrace_lambda, cfg.learning_rate) == (
        7,
        "rmsprop",
        False,
        1.0,
        1e-3,
    )
    # and a forced profile wins over the env kind
    cfg = train.config_from_args(parse("--profile", "atari"), "vector", memory_horizon=33)
    assert cfg.unroll_length == DEFAULTS.unroll_length and cfg.optimizer == "rmsprop"


@pytest.mark.parametrize(
    "argv,message",
    [
        (("--vtrace-lambda", "1.5"), "--vtrace-lambda 1.5 is invalid; allowed: a number in [0, 1]"),
        (("--learning-rate", "0"), "--learning-rate 0 is invalid; allowed: a number > 0"),
        (("--unroll-length", "0"), "--unroll-length 0 is invalid"),
        (("--advantage-min", "-0.1"), "--advantage-min -0.1 is invalid; allowed: a number >= 0"),
        (("--discount", "2"), "--discount 2 is invalid; allowed: a number in [0, 1]"),
        (("--entropy-cost", "nan"), "--entropy-cost nan is invalid; allowed: a number >= 0"),
        (("--checkpoint-every", "-1"), "--checkpoint-every -1 is invalid; allowed: a number >= 0 (seconds"),
        (("--clip-rho", "0"), "--clip-rho 0 is invalid; allowed: a number > 0"),
        (("--rmsprop-momentum", "1"), "--rmsprop-momentum 1 is invalid; allowed: a number in [0, 1)"),
    ],
)
def test_bad_values_are_one_line_errors(argv, message):
    with pytest.raises(UserError) as e:
        train.config_from_args(parse(*argv), "vector")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_every_number_setting_of_the_defaults_is_in_its_range():
    for profile in ("atari", "vector", "control"):
        train.check_config(train.config_from_args(parse(), profile))
    assert {"discount", "entropy_cost", "learning_rate", "checkpoint_every"} <= set(train.NUMBER_RANGES)


def test_settings_line_names_every_learning_setting():
    line = profiles.describe(train.config_from_args(parse(), "vector", memory_horizon=9), "agents/vector_rdn.toml")
    for part in (
        "vector profile",
        "batch 16 x unroll 20",
        "adam lr 0.0005",
        "advantages normalised (floor 0.3 x target RMS, at least 0.1)",
        "V-trace lambda 0.9",
        "entropy 0.03",
        "reward clip 1, returns scaled to RMS <= 1",
        "agents/vector_rdn.toml",
    ):
        assert part in line
    assert "bound cost" not in line  # discrete actions: nothing for it to keep in bounds
    assert ", bound cost 1" in profiles.describe(train.config_from_args(parse(), "vector"), "x", bounded_actions=True)


def test_continuous_actions_get_the_control_profile():
    cfg = train.config_from_args(parse(), "vector", max_episode_steps=200, continuous_actions=True)
    assert cfg.profile == "control"
    assert (cfg.batch_size, cfg.unroll_length, cfg.entropy_cost) == (4, profiles.CONTROL_UNROLL, 0.0)
    assert cfg.normalize_returns and cfg.reward_clip == 0.0 and cfg.optimizer == "adam"
    # on-policy batches (one env per batch row) and advantages divided by their plain RMS
    assert (cfg.num_actors, cfg.advantage_floor, cfg.advantage_min, cfg.max_kl) == (4, 0.0, 0.0, 0.0)
    # a stated memory horizon sets the unroll as in the vector profile
    cfg = train.config_from_args(parse(), "vector", memory_horizon=30, continuous_actions=True)
    assert cfg.unroll_length == 60
    # images keep the paper's settings, and the command line still wins
    assert train.config_from_args(parse(), "atari", continuous_actions=True).profile == "atari"
    cfg = train.config_from_args(parse("--entropy-cost", "0.01"), "vector", continuous_actions=True)
    assert cfg.entropy_cost == 0.01
    assert "control profile" in profiles.describe(cfg, "agents/vector_ff.toml")


def test_vector_profile_takes_a_trust_region_step_except_in_a_group():
    cfg = train.config_from_args(parse(), "vector", memory_horizon=9)
    assert cfg.max_kl == profiles.VECTOR["max_kl"] > 0
    assert cfg.normalize_advantages and cfg.advantage_floor == 0.3  # noise on a solved task stays small
    assert cfg.advantage_min == 0.1  # and on a task whose returns are still near 0
    grouped = train.config_from_args(parse("--broker", "127.0.0.1:4431", "--group", "g"), "vector", memory_horizon=9)
    assert grouped.max_kl == 0.0
    assert train.config_from_args(parse(), "atari").max_kl == 0.0
