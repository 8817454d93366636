"""``--set KEY=VALUE``: one syntax and one parser for every trainer (rfwp_rl/overrides.py)."""

from __future__ import annotations

import json

import pytest

from rfwp_rl import cli
from rfwp_rl.errors import UserError
from rfwp_rl.overrides import apply_settings, parse_value
from rfwp_rl.presets import Preset

pytestmark = pytest.mark.usefixtures("one_thread")

TRAINERS = {
    "train": [
        "train",
        "--env",
        "CartPole-v1",
        "--core",
        "lstm",
        "--env-backend",
        "local",
        "--num-actors",
        "2",
        "--unroll-length",
        "5",
        "--batch-size",
        "2",
        "--total-steps",
        "10",
    ],
    "meta-rl": [
        "meta-rl",
        "--core",
        "lstm",
        "--batch-size",
        "4",
        "--train-graphs",
        "8",
        "--test-graphs",
        "4",
        "--total-steps",
        "120",
    ],  # one episode of 4 agents x 30 steps
    "seq": ["seq", "--task", "assoc", "--num-keys", "4", "--core", "lt", "--updates", "1"],
}


def test_values_are_toml_and_bare_words_are_strings():
    assert [parse_value(v) for v in ("64", "1e-3", "true", "'softmax'", "[32, 32]", "softmax")] == [
        64,
        1e-3,
        True,
        "softmax",
        [32, 32],
        "softmax",
    ]


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_an_unknown_key_is_the_same_one_line_error_in_every_trainer(tmp_path, capsys, name):
    assert cli.main([*TRAINERS[name], "--run-dir", str(tmp_path / "r"), "--set", "zzz=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --set 'zzz=1': unknown key 'zzz'; allowed: core, core_config.<option>")
    assert "a trainer setting (" in err and "\n" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "name,setting",
    [
        (name, setting)
        for name in sorted(TRAINERS)
        for setting in ("learning_rate=0.002", "grad_norm_clip=0.5", "log_every=1000")
    ]
    + [("train", "entropy_cost=0.005"), ("meta-rl", "entropy_cost=0.005")],
)
def test_core_options_and_trainer_settings_are_set_the_same_way(tmp_path, name, setting):
    argv = [*TRAINERS[name], "--run-dir", str(tmp_path / "r"), "--set", "core_config.hidden_size=8", "--set", setting]
    assert cli.main(argv) == 0
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    key, value = setting.split("=")
    assert config[key] == float(value)
    hidden = (
        config.get("core_config.hidden_size", config.get("core_config", {}).get("hidden_size"))
        if name != "seq"
        else config["core_config"]["hidden_size"]
    )
    assert hidden == 8


def test_a_setting_must_keep_its_type():
    class Config:
        batch_size = 32

    with pytest.raises(UserError, match=r"--set 'batch_size=big': batch_size takes a int \(like 32\), got 'big'"):
        apply_settings(["batch_size=big"], None, Config(), ["batch_size"])
    p = apply_settings(["core=lstm", "core_config.hidden_size=8"], Preset(core="rdn"))
    assert (p.core, p.core_config) == ("lstm", {"hidden_size": 8})
