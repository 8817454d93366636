"""rfwp-rl bench memory-health: the core list, the flag on synthetic numbers, resumable runs, and a
tiny real sweep that writes the table."""

import csv
import json
import math
import shutil

import pytest

from rfwp_rl import cli, cores
from rfwp_rl.checkpoint import Checkpointer
from rfwp_rl.memory import health
from rfwp_rl.presets import AGENTS_DIR

DR, AR = health.TASKS


def test_the_tasks_and_the_agent_cores():
    assert health.TASKS == ("rfwp/DelayedRecall-easy-v0", "rfwp/AssociativeRecall-easy-v0")
    found = health.agent_cores()
    assert {"ff", "lstm", "rdn", "mamba"} <= set(found) and found[:2] == ["ff", "lstm"]
    # language-modelling variants, and the SRWM, which failed the health bar (results/memory/cure/)
    assert not {"delta_lstm", "delta_mlp", "delta_delta", "srwm"} & set(found)
    assert all(c in cores.available() and (AGENTS_DIR / f"vector_{c}.toml").is_file() for c in found)


def test_flag_only_below_the_bar_on_both_tasks():
    assert health.flagged([0.1, 0.49])
    assert not health.flagged([0.5, 0.0]) and not health.flagged([0.2, 0.9])
    assert health.flagged([math.nan, 0.3]) and not health.flagged([math.nan, 0.95])  # no result counts as below
    by_run = {
        ("lstm", DR): [1.0, 0.0],
        ("lstm", AR): [0.2, 0.1],  # mean 0.5 on DR: healthy
        ("srwm", DR): [0.1, 0.2],
        ("srwm", AR): [0.0, 0.45],  # below on both
        ("ff", DR): [0.0],
        ("ff", AR): [math.nan],
    }  # one seed, one run without episodes
    rows = health.health_rows(["lstm", "srwm", "ff"], health.TASKS, by_run)
    assert [(r["core"], r["flagged"], r["seeds"]) for r in rows] == [
        ("lstm", False, 2),
        ("srwm", True, 2),
        ("ff", True, 1),
    ]
    assert rows[0]["DelayedRecall"] == 0.5 and rows[1]["AssociativeRecall"] == pytest.approx(0.225)
    table = health.markdown(rows, health.TASKS, 1000)
    assert "| srwm | 0.15 | 0.23 | 2 | **FLAGGED** |" in table and "| lstm | 0.50 | 0.15 | 2 |  |" in table
    assert "| ff | 0.00 | no result | 1 | **FLAGGED** |" in table
    # a sweep under way: a task without a finished run is not run yet, and no flag is raised before every task has one
    partial = health.health_rows(["lstm", "srwm", "ff"], health.TASKS, {("srwm", DR): [0.1], ("ff", DR): [0.0]})
    assert [(r["core"], r["flagged"], r["seeds"]) for r in partial] == [
        ("lstm", False, 0),
        ("srwm", False, 0),
        ("ff", False, 0),
    ]
    table = health.markdown(partial, health.TASKS, 1000, (2, 12))
    assert table.startswith("**Partial**: 2 of 12 runs finished") and "| srwm | 0.10 | not run yet | 0 |  |" in table
    assert "| lstm | not run yet | not run yet | 0 |  |" in table
    assert "Partial" not in health.markdown(partial, health.TASKS, 1000, (12, 12))
    # registered cores without an agent preset are named, not silently left out
    others = table.splitlines()[-1]
    assert others.startswith("Registered cores without an agent preset") and "srwm" in others
    assert "rdn" not in others.split(":")[-1].split(", ") and "rdn" in health.agent_cores()


def test_finished_runs_are_skipped(tmp_path):
    jobs = health.plan(["lstm", "rdn"], [1, 2], 5000, tmp_path / "runs", tmp_path / "records")
    assert [(j.seed, j.env, j.core) for j in jobs[:3]] == [(1, DR, "lstm"), (1, DR, "rdn"), (1, AR, "lstm")]
    assert jobs[0].run_dir == tmp_path / "runs" / "rfwp-DelayedRecall-easy-v0" / "lstm_s1"
    assert jobs[2].record == tmp_path / "records" / "rfwp-AssociativeRecall-easy-v0" / "lstm_s1.json"
    Checkpointer(jobs[0].run_dir, {}).save({}, 5000)
    Checkpointer(jobs[1].run_dir, {}).save({}, 4000)  # interrupted: resumed
    # a run whose directory is gone but whose record was kept: done, and scored from the record
    jobs[2].record.parent.mkdir(parents=True)
    record = {"env": AR, "core": "lstm", "seed": 1, "params": 9, "total_steps": 5000, "steps": 5000, "minutes": 1.0}
    record |= {"final_return": 0.625, "peak": [5000, 0.625], "curve": [[5000, 0.625]]}
    jobs[2].record.write_text(json.dumps(record))
    assert [j.done for j in jobs[:4]] == [True, False, True, False]
    assert not health.plan(["lstm"], [1], 6000, tmp_path / "runs", tmp_path / "records")[1].done  # a larger budget
    assert jobs[2].result().normalized == pytest.approx(0.5) and jobs[3].result() is None
    assert health.scores(jobs[2:4]) == {("lstm", AR): [pytest.approx(0.5)]}  # a run not finished is left out
    cmd = jobs[1].command(["--env-backend", "local"])
    assert cmd[1:4] == ["-m", "rfwp_rl", "train"] and cmd[-2:] == ["--env-backend", "local"]
    assert cmd[cmd.index("--total-steps") + 1] == "5000" and cmd[cmd.index("--core") + 1] == "rdn"


@pytest.mark.slow
def test_a_tiny_sweep_writes_the_table_and_skips_on_rerun(tmp_path, capsys):
    argv = [
        "bench",
        "memory-health",
        "--cores",
        "ff",
        "lstm",
        "--total-steps",
        "2000",
        "--runs",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "out"),
        "--jobs",
        "2",
        "--train-args",
        "--env-backend local --log-every 0.2",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "4 to train" in out and out.count("done  ") == 4
    rows = list(csv.DictReader((tmp_path / "out" / "health.csv").open()))
    assert [r["core"] for r in rows] == ["ff", "lstm"] and all(r["seeds"] == "1" and r["steps"] == "2000" for r in rows)
    for r in rows:  # 2000 steps learn little: real numbers near random, flagged exactly when both are below 0.5
        values = [float(r["DelayedRecall"]), float(r["AssociativeRecall"])]
        assert all(-1.5 < v <= 1.0 for v in values)
        assert r["flagged"] == str(int(all(v < 0.5 for v in values)))
    table = (tmp_path / "out" / "health.md").read_text()
    assert table.startswith("# Memory health check\n\n| core |")
    assert cli.main(argv) == 0
    assert "4 runs already done, 0 to train" in capsys.readouterr().out
    # the finished runs' records keep the table when the run directories are gone
    assert len(list((tmp_path / "out" / "records").glob("*/*.json"))) == 4
    shutil.rmtree(tmp_path / "runs")
    assert cli.main(argv) == 0
    assert "4 runs already done, 0 to train" in capsys.readouterr().out
    assert (tmp_path / "out" / "health.md").read_text() == table
