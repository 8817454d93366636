"""results/memory from suite runs: numbers per run, mean and 95% interval over seeds, the README
table between its markers, the curves figure; and a short default run that learns."""

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from rfwp_rl import cli, stats
from rfwp_rl.errors import UserError
from rfwp_rl.memory import results, suite
from rfwp_rl.runlog import RunLogger

ENV = "rfwp/DelayedRecall-easy-v0"  # random 1/4, optimal 1
AR = "rfwp/AssociativeRecall-easy-v0"  # random 1/4, optimal 1


def fake_run(root, core, seed, returns, minutes=2.0, env=ENV, minutes_step=None):
    """A run directory as `rfwp-rl train` writes it: config.json and TensorBoard return_mean100, and
    perf/train_minutes with the loss at ``minutes_step`` (default: the last return's step) unless
    ``minutes`` is None."""
    run_dir = root / env.replace("/", "-") / f"{core}_s{seed}"
    logger = RunLogger(
        run_dir,
        {
            "env": env,
            "core": core,
            "seed": seed,
            "num_params": 1000 + seed,
            "total_steps": 1000 * len(returns),
            "trainer": "impala",
        },
        total=1000 * len(returns),
    )
    for i, r in enumerate(returns):
        logger.log(1000 * (i + 1), {"episode/return_mean100": r})
    if minutes is not None:
        logger.log(minutes_step or 1000 * len(returns), {"loss/total": 0.1, "perf/train_minutes": minutes})
    logger.close()
    return run_dir


def test_runs_summary_table_and_curves(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "lstm", 1, [0.25, 0.5, 1.0])  # normalised final 1.0
    fake_run(runs, "lstm", 2, [0.25, 0.4, 0.625])  # normalised 0.5
    fake_run(runs, "rdn", 1, [0.3, 0.7], minutes=None)  # no minutes logged yet
    # a second easy task (random 1/4, optimal 1): lstm normalised 0.0 and 0.75
    fake_run(runs, "lstm", 1, [0.25], env=AR, minutes=3.0, minutes_step=1500)
    fake_run(runs, "lstm", 2, [0.8125], env=AR, minutes=5.0, minutes_step=1500)
    fake_run(runs, "lstm", 1, [1.0], env="rfwp/DelayedRecall-medium-v0")  # not in the easy aggregate
    (runs / "other").mkdir()
    (runs / "other" / "config.json").write_text('{"env": "CartPole-v1", "core": "lstm"}')  # not a suite run
    out = tmp_path / "out"
    (out).mkdir()
    (out / "README.md").write_text(
        "# intro kept\n\n<!-- memory-table -->\nold\n<!-- /memory-table -->\n\nmiddle kept\n"
        "<!-- memory-aggregate -->\nold\n<!-- /memory-aggregate -->\n"
        "<!-- memory-aggregate-levels -->\nold\n<!-- /memory-aggregate-levels -->\ntail kept\n"
    )

    summary, agg = results.write_results(runs, out, reps=2000)

    rows = list(csv.DictReader((out / "runs.csv").open()))
    assert [(r["env"], r["core"], r["seed"]) for r in rows] == [
        (ENV, "lstm", "1"),
        (ENV, "lstm", "2"),
        (ENV, "rdn", "1"),
        ("rfwp/DelayedRecall-medium-v0", "lstm", "1"),
        (AR, "lstm", "1"),
        (AR, "lstm", "2"),
    ]
    assert [(float(r["minutes"]), r["steps"]) for r in rows[4:]] == [(3.0, "1500"), (5.0, "1500")]
    assert float(rows[1]["normalized"]) == pytest.approx(0.5, abs=1e-4)
    assert float(rows[0]["minutes"]) == pytest.approx(2.0) and math.isnan(float(rows[2]["minutes"]))
    assert rows[0]["steps"] == "3000"
    # the peak: lstm seed 2 rose to 0.625 at its last point; a run that learned and lost shows it
    assert (rows[1]["peak_return"], rows[1]["peak_step"]) == ("0.6250", "3000")
    assert float(rows[1]["peak_normalized"]) == pytest.approx(0.5, abs=1e-4)
    fake_run(runs, "rdn", 2, [0.25, 1.0, 1.0, 0.4])  # peak 1.0 first reached at step 2000, then lost
    lost = next(r for r in results.collect(runs) if r.core == "rdn" and r.seed == 2)
    assert lost.peak == (2000, 1.0) and lost.final_return == pytest.approx(0.4)
    # normalised 0, 1, 1, 0.2: reached 0.9 at step 2000, lowest after it (0.4 - 0.25) / 0.75
    assert lost.held() == (2000, pytest.approx(0.2)) and lost.held(1.01) is None
    row = results.run_row(lost)
    assert row["reached_0.9_step"] == 2000 and row["lowest_after_0.9"] == pytest.approx(0.2)
    assert rows[1]["reached_0.9_step"] == rows[1]["lowest_after_0.9"] == ""  # peak 0.5: never reached
    # a comparison assembled by linking run directories kept elsewhere
    linked = tmp_path / "linked" / "any"
    linked.mkdir(parents=True)
    (linked / "rdn_s2").symlink_to(lost.path, target_is_directory=True)
    assert [(r.core, r.seed) for r in results.collect(tmp_path / "linked")] == [("rdn", 2)]
    lstm = next(r for r in summary if r["core"] == "lstm")
    # mean 0.75; sd = 0.3536; half-width t(0.975, 1) * sd / sqrt(2) = 12.706 * 0.25
    assert lstm["normalized_mean"] == pytest.approx(0.75)
    assert lstm["normalized_ci95"] == pytest.approx(12.706 * 0.25, rel=1e-4)
    assert lstm["normalized_std"] == pytest.approx(0.5**0.5 / 2)
    assert lstm["seeds"] == 2 and lstm["params"] == 1002
    rdn = next(r for r in summary if r["core"] == "rdn")
    assert rdn["normalized_mean"] == pytest.approx((0.7 - 0.25) / 0.75) and math.isnan(rdn["normalized_ci95"])

    readme = (out / "README.md").read_text()
    assert readme.startswith("# intro kept") and readme.rstrip().endswith("tail kept") and "old" not in readme
    assert readme.index("| DelayedRecall (easy)") < readme.index("middle kept") < readme.index("| lstm | 0.62")
    assert "| DelayedRecall (easy) | 0.75 ± 0.35 (2) | 0.60 (1) |" in readme  # mean ± sd (seeds)
    # IQM of lstm's 4 easy runs (1.0, 0.5; 0.0, 0.75): drop one at each end, mean(0.5, 0.75)
    assert [(a["core"], a["runs"], a["tasks"]) for a in agg] == [("lstm", 4, 2), ("rdn", 1, 1)]
    assert agg[0]["iqm"] == pytest.approx(0.625) and agg[1]["iqm"] == pytest.approx(0.6)
    assert agg[0]["ci95_low"] < 0.625 < agg[0]["ci95_high"] and agg[1]["ci95_low"] == agg[1][
        "ci95_high"
    ] == pytest.approx(0.6)
    again = stats.stratified_bootstrap([[1.0, 0.5], [0.0, 0.75]], stats.iqm, reps=2000)
    assert (agg[0]["ci95_low"], agg[0]["ci95_high"]) == pytest.approx((again.low, again.high))
    assert "| lstm | 0.62 [" in readme and "| rdn | 0.60 [0.60, 0.60] | 1 | 1 of 2 | 1 | one seed |" in readme
    assert list(csv.DictReader((out / "aggregate.csv").open()))[0]["iqm"] == "0.6250"
    # each level pooled on its own: lstm's medium run alone, rdn has none; bold: the best, or overlapping it
    by_level = list(csv.DictReader((out / "aggregate_levels.csv").open()))
    assert [(r["level"], r["core"], r["iqm"]) for r in by_level] == [
        ("easy", "lstm", "0.6250"),
        ("easy", "rdn", "0.6000"),
        ("medium", "lstm", "1.0000"),
    ]
    assert "| core | easy (2 tasks) | medium (1 task) |" in readme
    assert "| rdn | 0.60 [0.60, 0.60] | - |" in readme and "| lstm | **0.62 [" in readme
    assert "**1.00 [1.00, 1.00]** |" in readme
    assert (out / "performance_profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "summary.csv").read_text().splitlines()[0].startswith("env,task,level,core,seeds")


def test_records_keep_the_tables_when_the_run_directories_are_gone(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    gone = [fake_run(runs, "lstm", 1, [0.25, 0.5, 1.0]), fake_run(runs, "lstm", 2, [0.25, 1.0, 0.625])]
    going = fake_run(runs, "rdn", 1, [0.3, 0.7])
    config = json.loads((going / "config.json").read_text())
    (going / "config.json").write_text(json.dumps({**config, "total_steps": 9000}))  # not finished: no record
    results.write_results(runs, out, reps=50)
    table = (out / "runs.csv").read_text()
    assert not (out / "aggregate_levels.csv").exists()  # one level: the aggregate is the level's
    records = sorted(p.relative_to(out / "records") for p in (out / "records").rglob("*.json"))
    assert records == [Path("rfwp-DelayedRecall-easy-v0/lstm_s1.json"), Path("rfwp-DelayedRecall-easy-v0/lstm_s2.json")]
    for run_dir in gone:
        shutil.rmtree(run_dir)
    fake_run(runs, "lstm", 2, [0.25])  # the same run restarted from scratch: the longer record wins
    results.write_results(runs, out, reps=50)
    assert (out / "runs.csv").read_text() == table  # the same rows, peaks and held columns
    kept = next(r for r in results.collect(runs, records_root=out / "records") if r.seed == 2)
    assert kept.curve == [(1000, 0.25), (2000, 1.0), (3000, 0.625)] and kept.path.suffix == ".json"
    # a record kept without its curve: its final return and peak, no held columns; the curves leave it out
    curveless = {**json.loads(kept.path.read_text()), "curve": [], "seed": 3}
    (kept.path.parent / "lstm_s3.json").write_text(json.dumps(curveless))
    results.write_results(runs, out, reps=50)
    row = next(r for r in csv.DictReader((out / "runs.csv").open()) if r["seed"] == "3")
    assert (row["final_return"], row["peak_return"], row["peak_step"]) == ("0.6250", "1.0000", "2000")
    assert row["reached_0.9_step"] == row["lowest_after_0.9"] == ""
    (kept.path.parent / "lstm_s4.json").write_text('{"env": "rfwp/DelayedRecall-easy-v0"')
    with pytest.raises(UserError, match=r"run record '.*lstm_s4.json' is unreadable \(JSONDecodeError"):
        results.write_results(runs, out, reps=50)


def test_one_runs_record_is_the_one_the_tables_keep(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    run_dir = fake_run(runs, "lstm", 1, [0.25, 0.5, 1.0])
    path = results.write_record(run_dir, runs, out / "records")
    assert path == out / "records" / "rfwp-DelayedRecall-easy-v0" / "lstm_s1.json"
    alone = path.read_text()
    results.write_results(runs, out, reps=10)
    assert path.read_text() == alone
    assert (
        cli.main(["memory-results", "--runs", str(runs), "--out", str(tmp_path / "o"), "--record", str(run_dir)]) == 0
    )
    assert [p.name for p in (tmp_path / "o").rglob("*") if p.is_file()] == ["lstm_s1.json"]
    with pytest.raises(UserError, match=r"--record '.*' is not under --runs"):
        results.write_record(run_dir, tmp_path / "elsewhere", out / "records")
    with pytest.raises(UserError, match=r"is not a run on an env of memory-suite with episodes logged"):
        results.write_record(runs / "missing", runs, out / "records")


def test_a_run_whose_record_holds_its_newest_checkpoint_is_taken_from_the_record(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    run_dir = fake_run(runs, "lstm", 1, [0.25, 0.5, 1.0])
    (run_dir / "ckpt_000000003000.pt").write_bytes(b"")  # only its name is read
    path = results.write_record(run_dir, runs, out / "records")
    path.write_text(json.dumps({**json.loads(path.read_text()), "final_return": 0.75}))  # tells the sources apart
    (run,) = results.collect(runs, records_root=out / "records")
    assert (run.final_return, run.path) == (0.75, path)
    (run_dir / "ckpt_000000004000.pt").write_bytes(b"")  # trained on past its record: its events are read
    (run,) = results.collect(runs, records_root=out / "records")
    assert (run.final_return, run.path) == (1.0, run_dir)
    (run,) = results.collect(runs)  # no records: the events
    assert run.path == run_dir


def test_versus_best_follows_the_intervals():
    rows = [
        {"core": "a", "iqm": 0.9, "ci95_low": 0.8, "ci95_high": 1.0},
        {"core": "b", "iqm": 0.7, "ci95_low": 0.5, "ci95_high": 0.8},  # touches the best's low end
        {"core": "c", "iqm": 0.6, "ci95_low": 0.55, "ci95_high": 0.79},
    ]
    assert results.versus_best(rows) == {"a": "best", "b": "no difference", "c": "below"}
    one_seed = [dict(r, seeds_max=1) for r in rows]  # intervals of one run per task are points
    assert results.versus_best(one_seed) == {"a": "best", "b": "one seed", "c": "one seed"}


def test_no_runs_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match="no memory-suite runs"):
        results.write_results(tmp_path, tmp_path / "out")
    assert cli.main(["memory-results", "--runs", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2


@pytest.mark.slow
def test_a_short_default_run_on_the_easiest_task_learns(tmp_path, capsys):
    """`rfwp-rl train --env rfwp/DelayedRecall-easy-v0 --core rdn` with the defaults (vector profile,
    agents/vector_rdn.toml) ends clearly above random (1/4) after 100k env steps (~30 s here)."""
    run_dir = tmp_path / "run"
    assert (
        cli.main(
            [
                "train",
                "--env",
                ENV,
                "--core",
                "rdn",
                "--total-steps",
                "100000",
                "--env-backend",
                "local",
                "--run-dir",
                str(run_dir),
                "--log-every",
                "5",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "settings (vector profile)" in out and "batch 16 x unroll 20" in out
    run = results.read_run(run_dir)
    assert run is not None and run.steps >= 100_000
    assert 0 < run.minutes < 10  # perf/train_minutes from TensorBoard
    assert suite.normalized_return(ENV, run.final_return) > 0.5, out
