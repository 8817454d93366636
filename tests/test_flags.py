"""One vocabulary for every command (rfwp_rl/flags.py): the flags of each trainer are the fields of
its config dataclass with their defaults, and shared settings have one name (no aliases) in every command."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import re

import pytest

from rfwp_rl import cli, flags
from rfwp_rl.bench import BENCHMARKS
from rfwp_rl.cli import COMMANDS
from rfwp_rl.impala import profiles
from rfwp_rl.impala.config import ImpalaConfig, trainer_keys
from rfwp_rl.impala.loss import LossConfig, loss_config
from rfwp_rl.meta_rl.config import MetaRLConfig
from rfwp_rl.seq.config import NOT_SET_KEYS, SeqConfig

TRAINERS = {"train": ImpalaConfig, "meta-rl": MetaRLConfig, "seq": SeqConfig}


def _parser(module_name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    importlib.import_module(module_name).add_arguments(parser)
    return parser


def _parsers() -> dict[str, argparse.ArgumentParser]:
    out = {name: _parser(module) for name, (module, _) in COMMANDS.items() if name != "bench"}
    out.update({f"bench {name}": _parser(module) for name, (module, _) in BENCHMARKS.items()})
    return out


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings}


@pytest.mark.parametrize("command", sorted(TRAINERS))
def test_every_setting_of_a_trainer_is_a_flag_with_the_fields_default(command):
    cls = TRAINERS[command]
    actions = _actions(_parser(COMMANDS[command][0]))
    # train: the profile fills the options it names where the command line leaves them unset
    unset = set(profiles.PROFILE_OPTIONS) if command == "train" else set()
    for f in dataclasses.fields(cls):
        action = actions[f.name]
        assert action.option_strings[0] == flags.flag_name(f.name), f.name  # (and --no-... for a bool)
        if f.name in unset:
            assert action.default is None, f.name
        elif f.name != "profile":  # --profile auto: chosen from the env's spaces
            assert action.default == flags.default_of(cls, f.name), f.name
        assert (
            "%(default)" in action.help
            or action.default in (None, False, "", ())
            or f.default_factory is not dataclasses.MISSING
        ), f"{f.name}: the help must not restate the default"


@pytest.mark.parametrize("command", sorted(TRAINERS))
def test_a_command_line_without_flags_gives_the_config_defaults(command):
    cls = TRAINERS[command]
    args = _parser(COMMANDS[command][0]).parse_args([])
    if command == "train":
        from rfwp_rl.impala.train import config_from_args

        assert config_from_args(args, "atari") == ImpalaConfig()
    else:
        assert flags.config_from_args(cls, args) == cls()


def test_set_keys_are_the_config_fields():
    assert set(trainer_keys()) == {f.name for f in dataclasses.fields(ImpalaConfig)} - {"env", "profile"}
    assert set(flags.settings_keys(MetaRLConfig)) == {f.name for f in dataclasses.fields(MetaRLConfig)}
    assert set(flags.settings_keys(SeqConfig, NOT_SET_KEYS)) == {f.name for f in dataclasses.fields(SeqConfig)} - {
        "task",
        "model",
        "core",
    }


def test_shared_settings_have_one_name_in_every_command_and_no_aliases():
    seen: dict[str, set[str]] = {}
    for command, parser in _parsers().items():
        for action in parser._actions:
            long = [o for o in action.option_strings if o.startswith("--")]
            if isinstance(action, argparse.BooleanOptionalAction):  # --x and --no-x
                long = long[:1]
            assert len(long) <= 1, (command, action.option_strings)  # one name, no alias
            if action.dest in flags.SHARED:
                assert long == [flags.flag_name(action.dest)], (command, action.option_strings)
                seen.setdefault(action.dest, set()).add(command)
    assert {
        "train",
        "actor",
        "eval",
        "probe",
        "meta-rl",
        "seq",
        "bench impala",
        "bench seq",
        "bench kernels",
        "bench meta_rl",
    } <= seen["torch_threads"]
    for name in ("learning_rate", "grad_norm_clip", "checkpoint_every", "log_every", "seed"):
        assert {"train", "meta-rl", "seq"} <= seen[name], name
    assert {"train", "meta-rl", "bench memory-health"} <= seen["total_steps"]
    assert {"seq", "memory-probe"} <= seen["updates"]
    for name in ("entropy_cost", "baseline_cost", "discount"):
        assert {"train", "meta-rl"} <= seen[name], name
    assert {"train", "actor", "eval", "probe", "bench impala"} <= seen["num_actors"]


def test_where_the_output_goes_is_out_in_every_command():
    """A file (a CSV), a prefix or a folder, as the command writes one or several: always --out."""
    for command, parser in _parsers().items():
        for action in parser._actions:
            for option in action.option_strings:
                stem = option.lstrip("-").replace("_", "-")
                if stem.startswith(("out", "output")) and option != "--out":
                    raise AssertionError(f"{command}: {option} names where the output goes; the vocabulary has --out")


def test_how_actions_are_chosen_is_actions_in_every_command():
    """Playing a saved agent (eval, probe), reading such plays (compare), the meta-RL trainer's tests."""
    named = {}
    for command, parser in _parsers().items():
        for action in parser._actions:
            assert not {"--greedy", "--sample", "--mode", "--eval-policy"} & set(action.option_strings), command
            if action.dest in ("actions", "eval_actions"):
                named[command] = action
    assert set(named) == {"eval", "probe", "compare", "meta-rl"}, sorted(named)
    for command, action in named.items():
        assert set(flags.ACTIONS) <= set(action.choices), command
    assert (named["eval"].default, named["probe"].default, named["compare"].default) == ("greedy", "sample", "greedy")
    assert named["meta-rl"].option_strings == ["--eval-actions"] and named["meta-rl"].default == "sample"


def test_every_list_flag_takes_words_commas_or_both():
    lists = {}
    for command, parser in _parsers().items():
        for action in parser._actions:
            if action.option_strings and action.nargs in ("+", "*"):
                assert isinstance(action, flags._Items), (command, action.option_strings)
                lists.setdefault(command, []).append(action.dest)
    assert {"cores", "devices", "topologies"} <= set(lists["bench impala"])
    assert {"tasks", "levels", "cores", "seeds"} <= set(lists["memory-probe"])
    assert "snapshot_steps" in lists["train"]  # a config field holding a tuple
    parser = argparse.ArgumentParser()
    flags.add_list_argument(parser, "--seeds", [1], "seeds", item=flags.integer)
    for words in (["1", "2", "3"], ["1,2,3"], ["1,2", "3"], ["1,", "2,3"]):
        assert parser.parse_args(["--seeds", *words]).seeds == [1, 2, 3], words
    assert parser.parse_args([]).seeds == [1]
    assert "(a list: words or commas; default 1)" in parser.format_help()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--env", "CartPole-v1", "--snapshot-steps", "a"], "rfwp-rl train: error: argument --snapshot-steps"),
        (["eval", "RUN", "--actions", "best"], "rfwp-rl eval: error: argument --actions: invalid choice: 'best'"),
        (["bench", "memory-health", "--seeds", "x"], "rfwp-rl bench memory-health: error: argument --seeds"),
        (["bench", "impala", "--cores"], "rfwp-rl bench impala: error: argument --cores: expected at least one"),
        (["no-such-command"], "rfwp-rl: error: argument COMMAND: invalid choice: 'no-such-command'"),
        (["train", "--env", "CartPole-v1", "--bogus"], "rfwp-rl train: error: unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_flag_or_value_is_one_line_not_the_usage(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    err = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith(message), err
    assert err[0].endswith("--help lists what is allowed)")


@pytest.mark.parametrize("command", sorted(TRAINERS))
def test_durations_are_seconds_and_budgets_name_their_unit(command):
    actions = _actions(_parser(COMMANDS[command][0]))
    for name in ("checkpoint_every", "log_every"):
        assert actions[name].help.startswith("seconds "), (command, name)
    budget = "updates" if command == "seq" else "total_steps"
    unit = flags.OPTIMIZER_STEPS if command == "seq" else flags.ENV_STEPS
    assert actions[budget].help.startswith(f"training budget in {unit}")


def test_a_flag_counts_in_one_unit_in_every_command():
    """``--total-steps 1e6`` is a million env steps wherever it is given, never a million updates."""
    units: dict[str, set[str]] = {}
    for parser in _parsers().values():
        for option, action in _actions(parser).items():
            named = re.findall(r"\b(env steps|optimizer steps|seconds)\b", action.help or "")
            if named:
                units.setdefault(option, set()).add(named[0])
    assert {option: found for option, found in units.items() if len(found) > 1} == {}
    assert units["total_steps"] == {flags.ENV_STEPS} and units["updates"] == {flags.OPTIMIZER_STEPS}


def test_the_loss_settings_are_the_trainers():
    assert [f.name for f in dataclasses.fields(LossConfig) if f.default is not dataclasses.MISSING] == [
        "clip_pg_rho"
    ]  # not a trainer setting
    assert {f.name for f in dataclasses.fields(LossConfig)} - {"clip_pg_rho"} <= {
        f.name for f in dataclasses.fields(ImpalaConfig)
    }
    cfg = ImpalaConfig(discount=0.5, entropy_cost=0.2, max_kl=0.01)
    loss = loss_config(cfg)
    assert (loss.discount, loss.entropy_cost, loss.max_kl, loss.reward_clip) == (0.5, 0.2, 0.01, cfg.reward_clip)
    assert loss_config(bound_cost=0.0).baseline_cost == ImpalaConfig().baseline_cost


def test_profiles_name_config_fields():
    fields = {f.name for f in dataclasses.fields(ImpalaConfig)}
    for profile in (profiles.ATARI, profiles.VECTOR, profiles.CONTROL):
        assert set(profile) <= fields


def test_counts_may_be_written_in_exponent_notation():
    assert flags.integer("5e7") == 50_000_000 and flags.integer("1_000") == 1000
    with pytest.raises(argparse.ArgumentTypeError):
        flags.integer("2.5")


def test_a_range_names_what_it_allows_and_refuses_nan():
    assert flags.Range().allows(0.0) and not flags.Range(closed="()").allows(0.0)
    assert flags.Range(0, 1, "[]").allows(1.0) and not flags.Range(0, 1, "[)").allows(1.0)
    assert not any(r.allows(math.nan) for r in (flags.Range(), flags.Range(0, 1, "[]"), flags.Range(0, math.inf, "(]")))
    assert flags.Range(0, math.inf, "(]").allows(math.inf) and not flags.Range().allows(math.inf)
    assert flags.Range(0, 1, "[)").text() == "a number in [0, 1)"
    assert flags.Range(note="0: off").text() == "a number >= 0 (0: off)"
