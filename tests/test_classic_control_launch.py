"""launch/classic_control.sh's tables: final returns and greedy evaluations per seed, their mean and interval, from
run directories."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

REPO = Path(__file__).resolve().parents[1]


def fake_run(run_dir: Path, finals: list[tuple[int, float]]) -> None:
    with SummaryWriter(str(run_dir / "tb")) as w:
        for step, value in finals:
            w.add_scalar("episode/return_mean100", value, step)


def test_the_table_holds_every_finished_run_and_only_those(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    fake_run(runs / "CartPole-v1" / "lstm_s1", [(100, 20.0), (1000, 400.0)])
    fake_run(runs / "CartPole-v1" / "lstm_s2", [(1000, 500.0)])
    for seed, score in ((1, 480.0), (2, 500.0)):  # as rfwp-rl eval names them, beside one for an earlier step
        run = runs / "CartPole-v1" / f"lstm_s{seed}"
        (run / "eval_000000001000_greedy.json").write_text(json.dumps({"mean": score}))
        (run / "eval_000000000100_greedy.json").write_text(json.dumps({"mean": 9.0}))
    fake_run(runs / "Acrobot-v1" / "ff_s1", [(1000, -100.0)])  # not evaluated: no greedy cells
    fake_run(runs / "CartPole-v1" / "rdn_s1", [(500, 300.0)])  # unfinished: left out
    out.mkdir()
    (out / "README.md").write_text("# page\n\ntext kept\n\n<!-- defaults -->\nold table\n<!-- /defaults -->\n")
    env = {**os.environ, "STEPS": "1000", "SEEDS": " ", "RUNS": str(runs), "OUT": str(out)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        ["bash", str(REPO / "launch" / "classic_control.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = (out / "README.md").read_text()
    assert "text kept" in text and "old table" not in text
    # t(1) intervals: 12.71 x 50 and 12.71 x 10
    assert "| CartPole-v1 | lstm | 2 | 400, 500 | 450 [-185, 1085] | 480, 500 | 490 [363, 617] |" in text
    assert "| Acrobot-v1 | ff | 1 | -100 | -100 |  |  |" in text
    assert "rdn" not in text
    csv = (out / "defaults.csv").read_text().splitlines()
    assert csv == [
        "env,core,seed,steps,return_100,greedy_100",
        "Acrobot-v1,ff,1,1000,-100,",
        "CartPole-v1,lstm,1,1000,400,480",
        "CartPole-v1,lstm,2,1000,500,500",
    ]
