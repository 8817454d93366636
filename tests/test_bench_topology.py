"""``rfwp-rl bench impala --topologies``: one learner, remote actors and a learner group, timed side by side.

The end-to-end checks run the benchmark as a subprocess (it starts learners, actors and a broker, which
start moolib threads and env workers) and watch every process below it; deadlines are only ever failure
deadlines (a slow or busy machine just takes longer).
"""

from __future__ import annotations

import csv
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from procs import descendants, ended  # tests/procs.py
from rfwp_rl import cli
from rfwp_rl.bench.topology import progress, timed_window
from rfwp_rl.errors import UserError

REPO = Path(__file__).resolve().parent.parent
DEADLINE = 600  # s: only ever a failure deadline (a bench runs three topologies one after the other)
TINY = [
    "--env",
    "rfwp/DelayedRecall-easy-v0",
    "--cores",
    "lstm",
    "--devices",
    "cpu",
    "--set",
    "core_config.hidden_size=16",
    "--num-actors",
    "4",
    "--batch-size",
    "2",
    "--unroll-length",
    "10",
    "--env-backend",
    "process",
    "--num-env-processes",
    "1",
]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--topologies", "local,cloud"], "unknown topology 'cloud'; allowed: group, local, remote"),
        (["--topologies", ","], "--topologies names none; allowed: a list of local, remote, group"),
        (["--topologies", "remote", "--remote-actors", "0"], "--remote-actors 0 is invalid; allowed: an integer >= 1"),
        (
            ["--topologies", "local,remote", "--num-actors", "6", "--remote-actors", "4"],
            "--num-actors 6 cannot be split among --remote-actors 4 in batches of --num-env-batches 2; "
            "allowed: a multiple of 4 x 2 = 8",
        ),
        (
            ["--topologies", "group", "--num-actors", "6"],
            "--num-actors 6 cannot be split between the group's 2 learners in batches of --num-env-batches 2; "
            "allowed: a multiple of 2 x 2 = 4",
        ),
        (["--topologies", "local", "--num-actors", "5"], "--num-actors 5 is invalid; allowed: a multiple of"),
        (["--env", "CartPole-v1", "--num-actors", "0"], "--num-actors 0 is invalid"),  # before any env starts
    ],
)
def test_bad_topology_arguments_are_one_line_errors(capsys, argv, message):
    assert cli.main(["bench", "impala", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_without_moolib_remote_and_group_are_skipped_in_one_line(monkeypatch, capsys, tmp_path):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "moolib" else find_spec(name, *a))
    out = tmp_path / "t.csv"
    assert cli.main(["bench", "impala", *TINY, "--topologies", "remote,group", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "moolib is not installed: remote and group need it (bash scripts/setup.sh); skipping them"
    ]
    assert not out.exists()


def test_progress_lines_and_the_timed_window():
    line = "1,200/1,000,000,000,000 env steps (0.0%) | 400/s | ETA ? | env_sps 0 | remote_actors 2 | remote_sps 401"
    assert progress(line) == {"step": 1200.0, "remote_actors": 2.0}
    assert progress("[12:00:00] group g: 2 learner(s), leader this learner, update 3") is None
    # reports every 0.5 s; the second actor connects at 2 s; 100 env steps a report from then on
    reports = [(i, 0.5 * i) for i in range(40)]  # (report, learner clock s)
    scalars = {
        "perf/train_minutes": [(100 * i, t / 60) for i, t in reports],
        "remote/actors": [(100 * i, 1.0 if t < 2.0 else 2.0) for i, t in reports],
    }
    steps, seconds = timed_window(scalars, {"remote/actors": 2.0}, warmup=3.0, seconds=5.0)
    assert (steps, round(seconds, 6)) == (1000, 5.0)  # from the report at 5 s to the one at 10 s
    with pytest.raises(UserError, match="hold no report 18 s after that"):  # the last report is at 19.5 s
        timed_window(scalars, {"remote/actors": 2.0}, warmup=3.0, seconds=15.0)
    with pytest.raises(UserError, match="hold no report with the topology in place"):
        timed_window(scalars, {"remote/actors": 3.0}, warmup=0.0, seconds=1.0)


class Bench:
    """The benchmark as a subprocess; a thread reads its output and notes every process below it."""

    def __init__(self, tmp_path: Path, *argv: str):
        env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        (tmp_path / "tmp").mkdir()
        self.p = subprocess.Popen(
            [sys.executable, "-m", "rfwp_rl", "bench", "impala", *TINY, *argv],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.seen: set[int] = set()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def _watch(self) -> None:
        while self.p.poll() is None:
            self.seen |= set(descendants(self.p.pid))
            time.sleep(0.05)

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.p.poll() is None:
            if any(text in line for line in self.lines):
                return True
            time.sleep(0.05)
        return any(text in line for line in self.lines)

    def wait(self, timeout: float) -> int:
        code = self.p.wait(timeout=timeout)
        self.reader.join(timeout=30)
        self.watcher.join(timeout=30)
        return code

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.wait(DEADLINE)


@pytest.mark.moolib
@pytest.mark.slow
def test_three_topologies_side_by_side_leave_no_process(tmp_path):
    out = tmp_path / "topology.csv"
    bench = Bench(
        tmp_path, "--topologies", "local,remote,group", "--seconds", "2", "--warmup-seconds", "1", "--out", str(out)
    )
    try:
        assert bench.wait(DEADLINE) == 0, bench.text()
    finally:
        bench.stop()
    # learners, actors, a broker and their env workers were all seen, and none is left
    assert len(bench.seen) >= 5, bench.text()
    assert ended(bench.seen, 60) == [], bench.text()
    assert not list((tmp_path / "tmp").glob("rfwp-topology-*")), "the runs' temporary directory is left"
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert {"agent", "device", "topology", "envs", "processes", "env_sps", "vs_local"} <= set(rows[0])
    assert [(r["agent"], r["device"], r["topology"]) for r in rows] == [
        ("lstm", "cpu", "local"),
        ("lstm", "cpu", "remote"),
        ("lstm", "cpu", "group"),
    ]
    assert [int(r["processes"]) for r in rows] == [1, 3, 3] and all(int(r["envs"]) == 4 for r in rows)
    assert all(float(r["env_sps"]) > 0 and float(r["window_seconds"]) >= 2.0 for r in rows), rows
    assert float(rows[0]["vs_local"]) == 1.0
    for r in rows[1:]:
        assert float(r["vs_local"]) == pytest.approx(float(r["env_sps"]) / float(rows[0]["env_sps"]), rel=1e-4)
    assert "wrote" in bench.lines[-1]


@pytest.mark.moolib
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_bench_leaves_no_process(tmp_path, sig):
    """SIGTERM: the bench stops its processes and exits 130. SIGKILL: the kernel sends its children SIGTERM."""
    bench = Bench(tmp_path, "--topologies", "group", "--seconds", "600", "--out", str(tmp_path / "t.csv"))
    try:
        assert bench.wait_for("in place:", DEADLINE), bench.text()
        assert len(bench.seen) >= 5, bench.text()  # a broker, two learners and their env workers
        bench.p.send_signal(sig)
        code = bench.wait(DEADLINE)
    finally:
        bench.stop()
    assert ended(bench.seen, 120) == [], bench.text()
    if sig == signal.SIGTERM:
        assert code == 130 and bench.lines[-1] == "interrupted", bench.text()
        assert not list((tmp_path / "tmp").glob("rfwp-topology-*")), "the runs' temporary directory is left"
