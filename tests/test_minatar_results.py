"""results/minatar from MinAtar runs: the normalisation between a random policy and the best core of each game,
the tables, the IQM over games and the files, from one command. minatar itself is needed only for the random
policy's returns, which these tests hand in."""

import csv
import math
import shutil

import pytest

from rfwp_rl import cli, minatar_results
from test_memory_results import fake_run

BREAKOUT, SEAQUEST = "MinAtar/Breakout-v1", "MinAtar/Seaquest-v1"


def test_normalised_between_the_random_policy_and_the_best_core():
    bench = minatar_results.normalized_benchmark({BREAKOUT: 1.0}, {BREAKOUT: 5.0})
    assert bench.normalize(BREAKOUT, 1.0) == 0.0
    assert bench.normalize(BREAKOUT, 3.0) == 0.5
    assert bench.normalize(BREAKOUT, 5.0) == 1.0
    assert bench.describe(BREAKOUT) == ("Breakout", "v1")
    assert math.isnan(minatar_results.normalized_benchmark({BREAKOUT: 2.0}, {BREAKOUT: 2.0}).normalize(BREAKOUT, 2.0))


def test_the_best_return_is_the_best_core_mean_over_seeds(tmp_path):
    fake_run(tmp_path, "ff", 1, [4.0], env=BREAKOUT)
    fake_run(tmp_path, "ff", 2, [2.0], env=BREAKOUT)  # ff mean 3
    fake_run(tmp_path, "lstm", 1, [3.5], env=BREAKOUT)  # lstm mean 3.5: the best, though ff's seed 1 is higher
    runs = minatar_results.collect(tmp_path, minatar_results.RAW)
    assert minatar_results.best_returns(runs) == {BREAKOUT: 3.5}


def test_one_command_writes_tables_iqm_and_normalisation(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for seed, (ff, lstm) in enumerate([(2.0, 5.0), (3.0, 4.0)], start=1):
        fake_run(runs, "ff", seed, [1.0, ff], env=BREAKOUT)
        fake_run(runs, "lstm", seed, [1.0, lstm], env=BREAKOUT)
        fake_run(runs, "ff", seed, [0.5, 2.0], env=SEAQUEST)
        fake_run(runs, "lstm", seed, [0.5, 1.0], env=SEAQUEST)
    fake_run(runs, "lstm", 1, [0.5], env="rfwp/DelayedRecall-easy-v0")  # not a MinAtar run: left out
    asked = []

    def random_returns(envs, episodes, seed=0):
        asked.append((envs, episodes))
        return {BREAKOUT: 1.0, SEAQUEST: 0.0}

    monkeypatch.setattr(minatar_results, "random_returns", random_returns)
    out = tmp_path / "out"
    assert cli.main(["minatar-results", "--runs", str(runs), "--out", str(out), "--random-episodes", "7"]) == 0
    assert asked == [((BREAKOUT, SEAQUEST), 7)]  # the games that have runs, in the benchmark's order
    rows = {(r["env"], r["core"], r["seed"]): r for r in csv.DictReader((out / "runs.csv").open())}
    assert len(rows) == 8
    # Breakout: random 1, best = lstm's mean 4.5 -> ff seed 1 (2.0) is 1/3.5
    assert float(rows[(BREAKOUT, "ff", "1")]["normalized"]) == pytest.approx(1 / 3.5, abs=1e-4)
    # Seaquest: random 0, best = ff's mean 2.0 -> lstm 1.0 is 0.5
    assert float(rows[(SEAQUEST, "lstm", "2")]["normalized"]) == pytest.approx(0.5, abs=1e-4)
    agg = {r["core"]: r for r in csv.DictReader((out / "aggregate.csv").open())}
    assert set(agg) == {"ff", "lstm"} and agg["ff"]["tasks"] == "2" and agg["ff"]["runs"] == "4"
    norm = list(csv.DictReader((out / "normalization.csv").open()))
    assert [(r["env"], float(r["random_return"]), float(r["best_return"])) for r in norm] == [
        (BREAKOUT, 1.0, 4.5),
        (SEAQUEST, 0.0, 2.0),
    ]
    readme = (out / "README.md").read_text()
    assert "| Breakout (v1) |" in readme and "IQM" in readme
    assert (out / "performance_profile.png").stat().st_size > 0 and (out / "curves.png").stat().st_size > 0
    # every run finished: each has its record, and the tables come out the same from the records alone
    records = sorted((out / "records").glob("*/*.json"))
    assert len(records) == 8
    one = next(p.parent for p in runs.rglob("config.json") if p.parent.name == "ff_s1" and "Breakout" in str(p))
    alone = tmp_path / "alone"
    assert cli.main(["minatar-results", "--runs", str(runs), "--out", str(alone), "--record", str(one)]) == 0
    [written] = [p for p in alone.rglob("*") if p.is_file()]  # the record alone: no random episodes, no tables
    assert written.read_text() == (out / written.relative_to(alone)).read_text() and len(asked) == 1
    table = (out / "runs.csv").read_text()
    shutil.rmtree(runs)
    runs.mkdir()
    assert cli.main(["minatar-results", "--runs", str(runs), "--out", str(out), "--random-episodes", "7"]) == 0
    assert (out / "runs.csv").read_text() == table


def test_no_runs_or_bad_counts_are_one_line_errors(tmp_path, capsys):
    assert cli.main(["minatar-results", "--runs", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no MinAtar runs" in capsys.readouterr().err
    assert cli.main(["minatar-results", "--runs", str(tmp_path), "--random-episodes", "0"]) == 2
    err = capsys.readouterr().err
    assert "--random-episodes 0 is invalid" in err and len(err.strip().splitlines()) == 1
