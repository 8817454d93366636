"""Remote actors (``rfwp-rl actor --connect``) feeding a learner (``rfwp-rl train --listen``).

Learner and actors run as subprocesses on loopback (moolib allows one EnvPool per process, and
this pytest process must not start moolib threads), each with a hard timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from procs import free_port  # tests/procs.py
from rfwp_rl.checkpoint import find_checkpoint_file, read_checkpoint
from rfwp_rl.impala.net import first_mismatch

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
DEADLINE = 300  # s: only ever a failure deadline (a slow or busy machine just takes longer)
TINY = ["--env", "CartPole-v1", "--core", "lstm", "--set", "core_config.hidden_size=16"]


class Proc:
    """A ``rfwp-rl`` subprocess whose merged stdout/stderr lines are collected by a thread."""

    def __init__(self, *argv: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(REPO), env.get("PYTHONPATH", "")) if p)
        self.p = subprocess.Popen(
            [sys.executable, "-m", "rfwp_rl", *argv],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            if self.p.poll() is not None:
                self.reader.join(timeout=30)  # the last lines
                return predicate(self)
            time.sleep(0.05)
        return False

    def versions(self) -> list[int]:
        """Weights versions the actor reported (connect lines and progress lines)."""
        return [int(m.group(1)) for line in self.lines for m in [re.search(r"weights v(\d+)", line)] if m]

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait(self, timeout: float) -> int:
        """The exit code, once the process and the reader of its output ended."""
        code = self.p.wait(timeout=timeout)
        self.reader.join(timeout=30)
        return code

    def stop(self) -> None:
        """Kill it if it still runs; then all its output is in ``lines``."""
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=DEADLINE)
        self.reader.join(timeout=30)


def _actor(port: int, *extra: str, agent: list[str] | None = None) -> Proc:
    return Proc(
        "actor",
        "--connect",
        f"127.0.0.1:{port}",
        *(agent or TINY),
        "--num-actors",
        "4",
        "--log-every",
        "0.2",
        "--rpc-timeout",
        "3",
        "--max-backoff",
        "1",
        *extra,
    )


def test_first_mismatch_names_the_differing_key():
    learner = {"env": "CartPole-v1", "core": "lstm", "core_config": {"hidden_size": 16, "num_layers": 1}}
    assert first_mismatch(learner, dict(learner)) is None
    actor = {**learner, "core_config": {"hidden_size": 32, "num_layers": 1}}
    assert first_mismatch(learner, actor).startswith("actor core_config.hidden_size 32 does not match the learner's 16")
    assert "actor core 'ff'" in first_mismatch(learner, {**learner, "core": "ff"})


@pytest.mark.moolib
@pytest.mark.slow
def test_learner_trains_only_on_remote_rollouts_and_survives_a_killed_actor(tmp_path):
    """The first actor's envs stop for good at their 1000th step (the first one to get there leaves a
    marker): it cannot feed the learner to its target before the test kills it, however fast it is;
    the second actor's envs run on (the marker is there)."""
    port, marker = free_port(), tmp_path / "hung"
    total = 6000  # 300 updates of 4 rollouts x 5 steps; the first actor's 4 envs make at most 4000 steps
    agent = [
        "--env",
        "fault_envs:FaultCartPole-v0",
        "--env-option",
        "hang_at=1000",
        "--env-option",
        f"hang_marker={marker}",
        *TINY[2:],
    ]
    learner = Proc(
        "train",
        *agent,
        "--num-actors",
        "0",
        "--listen",
        f"127.0.0.1:{port}",
        "--unroll-length",
        "5",
        "--batch-size",
        "4",
        "--total-steps",
        str(total),
        "--run-dir",
        str(tmp_path / "run"),
        "--log-every",
        "0.5",
    )
    actors: list[Proc] = []
    try:
        assert learner.wait_for(lambda p: any("listening for remote actors" in line for line in p.lines), DEADLINE), (
            learner.text()
        )

        # 1. An actor with another core is refused with a one-line error (exit 2).
        bad = Proc(
            "actor",
            "--connect",
            f"127.0.0.1:{port}",
            *agent[:-4],
            "--core",
            "ff",
            "--num-actors",
            "2",
            "--env-backend",
            "local",
            "--rpc-timeout",
            "3",
        )
        assert bad.wait(DEADLINE) == 2, bad.text()
        errors = [line for line in bad.lines if line.startswith("error:")]
        assert len(errors) == 1 and "actor core 'ff' does not match the learner's 'lstm'" in errors[0], bad.text()

        # 2. A first actor (in-process envs) feeds the learner; its weights follow the learner's.
        actors.append(_actor(port, "--env-backend", "local", agent=agent))
        assert actors[0].wait_for(lambda p: len(p.versions()) >= 3 and max(p.versions()) >= 2, DEADLINE), actors[
            0
        ].text()
        v1 = actors[0].versions()
        assert "connected to the learner" in actors[0].text()
        assert actors[0].wait_for(lambda p: marker.exists(), DEADLINE), actors[0].text()  # it makes no more steps
        actors[0].p.send_signal(signal.SIGKILL)  # lost without a goodbye
        actors[0].p.wait(timeout=DEADLINE)
        since = len(learner.lines)  # the learner goes on (waiting for rollouts): a progress line after the loss
        assert learner.wait_for(lambda p: any(" env steps " in line for line in p.lines[since:]), DEADLINE), (
            learner.text()
        )
        assert learner.p.poll() is None, learner.text()

        # 3. A second actor (moolib EnvPool workers) takes over; the learner reaches its target.
        actors.append(_actor(port, "--env-backend", "moolib", "--num-env-processes", "1", agent=agent))
        assert learner.p.wait(timeout=DEADLINE) == 0, learner.text()
        assert actors[1].p.wait(timeout=DEADLINE) == 0, actors[1].text()
    finally:
        for p in [learner, *actors]:
            p.stop()

    v2 = actors[1].versions()
    assert v1 == sorted(v1) and v1[-1] > v1[0], v1  # versions received increase
    assert v2 == sorted(v2) and v2[-1] > v2[0] >= v1[-1], (v1, v2)  # the 2nd actor starts from the current weights
    assert "the learner finished training" in actors[1].text()
    assert f"finished at step {total:,}" in learner.text()
    assert learner.text().count("connected") >= 2 and "refused" in learner.text()
    lags = [float(m.group(1)) for m in re.finditer(r"policy_lag (\d+(?:\.\d+)?)", learner.text())]
    assert lags and all(0 <= lag < 50 for lag in lags), learner.text()
    ckpt = read_checkpoint(find_checkpoint_file(tmp_path / "run"))
    counters = ckpt["state"]["counters"]
    assert counters["step"] == total and counters["updates"] == total // 20
    assert counters["actor_steps"] == 0  # no local env: every update came from remote rollouts


@pytest.mark.moolib
@pytest.mark.slow
def test_actor_reconnects_after_the_learner_restarts(tmp_path):
    """SIGKILL the learner mid-run: the actor logs the loss, retries, validates again with the
    restarted learner (a new session, resumed from the checkpoint) and feeds it to its target."""
    port = free_port()
    run_dir = tmp_path / "run"

    def learner(total: int) -> Proc:
        return Proc(
            "train",
            *TINY,
            "--num-actors",
            "0",
            "--listen",
            f"127.0.0.1:{port}",
            "--unroll-length",
            "5",
            "--batch-size",
            "4",
            "--total-steps",
            str(total),
            "--run-dir",
            str(run_dir),
            "--log-every",
            "0.5",
            "--checkpoint-every",
            "0.3",
        )

    first = learner(1_000_000)
    procs = [first]
    try:
        # the actor reads the shared key that the first --listen learner makes: it starts once the learner listens
        assert first.wait_for(lambda p: any("listening for remote actors" in line for line in p.lines), DEADLINE), (
            first.text()
        )
        actor = _actor(port, "--env-backend", "local")
        procs.append(actor)
        assert actor.wait_for(lambda p: p.versions() and max(p.versions()) >= 20, DEADLINE), actor.text()
        assert first.wait_for(lambda p: list(run_dir.glob("ckpt_*.pt")), DEADLINE), first.text()
        first.p.send_signal(signal.SIGKILL)
        first.p.wait(timeout=DEADLINE)
        assert actor.wait_for(lambda p: "lost the learner" in p.text(), DEADLINE), actor.text()
        resumed = read_checkpoint(find_checkpoint_file(run_dir))["state"]["counters"]
        second = learner(resumed["step"] + 1000)
        procs.append(second)
        assert second.p.wait(timeout=DEADLINE) == 0, second.text()
        assert actor.p.wait(timeout=DEADLINE) == 0, actor.text()
    finally:
        for p in procs:
            p.stop()
    assert f"resuming {run_dir} from step {resumed['step']:,}" in second.text()
    sessions = re.findall(r"connected to the learner at \S+ \(session (\w+), weights v(\d+)", actor.text())
    assert len(sessions) == 2 and sessions[0][0] != sessions[1][0], actor.text()
    assert int(sessions[1][1]) == resumed["updates"]  # the restarted learner's (resumed) weights
    assert "the learner finished training" in actor.text()
