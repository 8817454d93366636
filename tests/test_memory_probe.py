"""rfwp-rl memory-probe: the episodes and labels it trains on, that a core with memory passes it and
one without fails, the table and the resumable results file."""

import numpy as np
import pytest
import torch

from rfwp_rl import cli
from rfwp_rl.errors import UserError
from rfwp_rl.memory import probe

pytestmark = pytest.mark.usefixtures("one_thread")


def test_episodes_and_labels_are_the_tasks_own():
    env = probe.make_task("DelayedRecall", "easy")
    obs, target = probe.draw_episodes(env, [3, 4, 5])
    assert obs.shape == (10, 3, 9) and target.shape == (10, 3) and obs.dtype == torch.float32
    for b, seed in enumerate([3, 4, 5]):
        cue = int(obs[0, b, :4].argmax())
        assert target[-1, b].item() == cue and (target[:-1, b] == -1).all()
        env.reset(seed=seed)
        assert np.array_equal(env.episode.obs, obs[:, b].numpy())


def test_only_scored_steps_enter_the_loss():
    logits = torch.zeros(3, 2, 4)
    logits[2, :, 1] = 5.0  # confident and right at the only scored step
    logits[0, :, 3] = -50.0  # unscored steps may be anything
    target = torch.tensor([[-1, -1], [-1, -1], [1, 1]])
    expected = -torch.log_softmax(torch.tensor([0.0, 5.0, 0.0, 0.0]), 0)[1]
    assert probe.scored_loss(logits, target).item() == pytest.approx(expected.item())


def test_a_core_with_memory_stores_the_cue_and_one_without_cannot():
    config = probe.ProbeConfig(updates=120, batch_size=32, eval_episodes=128)
    lstm = probe.probe("DelayedRecall", "easy", "lstm", 1, config)
    ff = probe.probe("DelayedRecall", "easy", "ff", 1, config)
    assert lstm.normalized > 0.9, lstm
    assert ff.normalized < 0.3, ff  # a feedforward agent sees only the query flag: chance
    assert lstm.episode_steps == 10 and lstm.settings == ""


def test_settings_change_the_agent():
    config = probe.ProbeConfig(updates=1, batch_size=2, eval_episodes=2)
    small = probe.probe("DelayedRecall", "easy", "gru", 1, config, ("core_config.hidden_size=8",))
    default = probe.probe("DelayedRecall", "easy", "gru", 1, config)
    assert small.params < default.params and small.settings == "core_config.hidden_size=8"


def test_command_writes_resumes_and_tabulates(tmp_path, capsys):
    rl = tmp_path / "runs.csv"
    rl.write_text("task,level,core,normalized\nDelayedRecall,easy,gru,0.5\nDelayedRecall,easy,gru,0.7\n")
    argv = ["memory-probe", "--cores", "gru", "ff", "--tasks", "DelayedRecall", "--levels", "easy"]
    argv += ["--updates", "2", "--batch-size", "4", "--out", str(tmp_path / "out"), "--rl", str(rl)]
    assert cli.main(argv) == 0
    rows = probe.read_rows(tmp_path / "out" / "probe.csv")
    assert [(r.core, r.updates) for r in rows] == [("gru", 2), ("ff", 2)]  # in the order asked
    table = (tmp_path / "out" / "probe.md").read_text()
    assert "| DelayedRecall (easy) |" in table and "/ 0.60 |" in table and "/ - |" in table  # gru's RL mean; ff none
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert "0 to train" in capsys.readouterr().out
    assert len(probe.read_rows(tmp_path / "out" / "probe.csv")) == 2
    assert probe.read_rows(tmp_path / "out" / "probe.csv") == rows


def test_bad_input_is_one_line():
    with pytest.raises(UserError, match="CueGrid"):
        probe.make_task("CueGrid", "easy")
    assert cli.main(["memory-probe", "--tasks", "Nope"]) == 2
    assert cli.main(["memory-probe", "--updates", "0", "--cores", "ff"]) == 2


def test_an_rl_table_that_is_not_a_runs_csv_is_one_line(tmp_path):
    assert probe.read_rl([tmp_path / "missing.csv"]) == {}  # skipped, as the default table on a fresh clone
    cases = [
        (b"\x91\x80", "is not a text file"),
        (b"task,level\nx,y\n", "is not a memory-results runs.csv: no core, normalized"),
        (b"task,level,core,normalized\nA,easy,lstm,abc\n", "runs.csv:2: normalized 'abc' is no number"),
    ]
    for content, message in cases:
        (tmp_path / "runs.csv").write_bytes(content)
        with pytest.raises(UserError, match=message):
            probe.read_rl([tmp_path / "runs.csv"])
    (tmp_path / "runs.csv").write_text("task,level,core,normalized\nA,easy,lstm,0.5\nA,easy,lstm,1\n")
    assert probe.read_rl([tmp_path / "runs.csv"]) == {("A", "easy", "lstm"): [0.5, 1.0]}
