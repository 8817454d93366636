"""The best checkpoint: best.pt written atomically beside the periodic ones and never pruned, the
trainer's rule (mean of the last 100 episodes, once 100 have ended, strictly better), and
`rfwp-rl eval RUN --checkpoint best|latest|PATH`."""

import json
import math
from types import SimpleNamespace

import pytest

from rfwp_rl import cli
from rfwp_rl.checkpoint import BEST_FILE, Checkpointer, list_checkpoints, read_checkpoint
from rfwp_rl.errors import UserError
from rfwp_rl.impala.evaluate import choose_checkpoint
from rfwp_rl.impala.train import BEST_WINDOW, ImpalaTrainer
from rfwp_rl.runlog import read_scalars

pytestmark = pytest.mark.usefixtures("one_thread")


def test_best_file_survives_pruning_and_keeps_its_score(tmp_path):
    ckpt = Checkpointer(tmp_path, {"trainer": "test"}, keep=2)
    ckpt.save({"x": 0}, 10)
    best = ckpt.save_best({"x": 1}, 20, score=0.75)
    (tmp_path / f".tmp-{BEST_FILE}-killed").write_bytes(b"partial")  # a writer killed mid-write
    for step in (30, 40, 50):
        ckpt.save({"x": step}, step)
    assert best == tmp_path / BEST_FILE and best.is_file()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_000000000050.pt", "ckpt_000000000040.pt"]
    obj = read_checkpoint(best)
    assert (obj["step"], obj["score"], obj["state"], obj["meta"]) == (20, 0.75, {"x": 1}, {"trainer": "test"})
    assert not list(tmp_path.glob(".tmp-*"))
    ckpt.save_best({"x": 2}, 60, score=0.9)  # a better one replaces it
    assert read_checkpoint(best)["step"] == 60 and len(list(tmp_path.glob("*.pt"))) == 3


@pytest.mark.parametrize("none_yet", [None, -math.inf])  # a new run's counter; a checkpoint's of before
def test_trainer_keeps_the_best_only_with_a_full_window_and_a_strictly_better_mean(none_yet):
    saved = []
    trainer = SimpleNamespace(
        returns=[0.0] * (BEST_WINDOW - 1), counts={"best_return": none_yet}, save_best=saved.append
    )
    ImpalaTrainer.keep_best(trainer, 0.5)  # 99 episodes: too few
    trainer.returns.append(0.0)
    for mean in (0.5, 0.4, 0.5, 0.6):
        ImpalaTrainer.keep_best(trainer, mean)
    assert saved == [0.5, 0.6] and trainer.counts["best_return"] == 0.6


@pytest.mark.slow
def test_training_writes_best_and_eval_picks_it(tmp_path, capsys):
    """A tiny CartPole run past 100 episodes: best.pt holds the best logged mean, the latest
    checkpoint carries it on (for a resume), and eval evaluates best, latest or a named file."""
    run = tmp_path / "run"
    assert (
        cli.main(
            [
                "train",
                "--env",
                "CartPole-v1",
                "--core",
                "lstm",
                "--set",
                "core_config.hidden_size=8",
                "--total-steps",
                "3000",
                "--num-actors",
                "4",
                "--unroll-length",
                "5",
                "--batch-size",
                "2",
                "--env-backend",
                "local",
                "--run-dir",
                str(run),
                "--log-every",
                "0.02",
                "--checkpoint-every",
                "0.2",
            ]
        )
        == 0
    )
    best = read_checkpoint(run / BEST_FILE)
    latest = read_checkpoint(list_checkpoints(run)[0])
    assert latest["step"] == 3000 and best["step"] <= 3000 and len(list_checkpoints(run)) == 2
    assert best["state"]["counters"]["best_return"] == best["score"] == latest["state"]["counters"]["best_return"]
    later = [v for step, v in read_scalars(run, "episode/return_mean100") if step > best["step"]]
    assert all(v <= best["score"] + 1e-4 for v in later)
    assert best["state"]["counters"]["episodes"] >= BEST_WINDOW

    capsys.readouterr()
    common = ["--episodes", "2", "--repeats", "1", "--no-tensorboard"]
    for which in ("best", "latest"):
        assert cli.main(["eval", str(run), "--checkpoint", which, "--out", str(tmp_path / which), *common]) == 0
    (best_eval,), (latest_eval,) = (list((tmp_path / w).glob("eval_*_greedy.json")) for w in ("best", "latest"))
    record = json.loads(best_eval.read_text())
    assert (record["checkpoint"], record["steps"]) == (str(run / BEST_FILE), best["step"])
    record = json.loads(latest_eval.read_text())
    assert (record["checkpoint"], record["steps"]) == (str(list_checkpoints(run)[0]), 3000)
    assert choose_checkpoint(run, "best") == run / BEST_FILE
    assert choose_checkpoint(run) == choose_checkpoint(run, "latest") == list_checkpoints(run)[0]
    name = list_checkpoints(run)[1].name
    assert choose_checkpoint(run, name) == run / name == choose_checkpoint(run, str(run / name))


def test_checkpoint_choice_errors_are_one_line(tmp_path, capsys):
    Checkpointer(tmp_path, {"trainer": "impala"}).save({}, 5)
    with pytest.raises(UserError, match="no best.pt in .*use --checkpoint latest"):
        choose_checkpoint(tmp_path, "best")
    with pytest.raises(UserError, match="'nope.pt' is neither latest nor best nor a checkpoint file"):
        choose_checkpoint(tmp_path, "nope.pt")
    with pytest.raises(UserError, match="is a checkpoint file; pass its run directory"):
        choose_checkpoint(list_checkpoints(tmp_path)[0], "best")
    assert cli.main(["eval", str(tmp_path), "--checkpoint", "best"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no best.pt") and "\n" not in err
