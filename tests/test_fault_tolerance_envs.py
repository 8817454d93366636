"""Fault paths of the IMPALA actor side that tests/test_fault_tolerance.py does not reach.

- An env whose ``reset`` raises (its first reset, or a reset after an episode) or whose
  constructor raises: replaced and counted like an env whose ``step`` raises.
- An env that fails ``MAX_FAILED_CONSTRUCTIONS`` times in a row before its first observation:
  one-line error naming the env and the exception, checkpoint, exit 1 (no restart loop).
- SIGTERM / SIGINT while the learner waits on a hung moolib env: checkpoint, exit 0 within
  seconds, the hung worker processes are ended.
- ``--env-timeout``: a hung moolib env is handled like a dead worker (checkpoint, end the
  pool, re-execute, resume; counted as one env failure).

The envs are ``FaultCartPole-v0`` of tests/fault_envs.py. moolib allows one EnvPool per process,
so moolib runs go through the CLI in subprocesses; local-backend runs use ``cli.main``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import rfwp_rl.runlog  # noqa: F401  (imported at collection: RunLogger binds sys.stdout as its default stream)
from rfwp_rl import cli
from rfwp_rl.checkpoint import list_checkpoints, read_checkpoint
from rfwp_rl.envs import make_env
from rfwp_rl.envs.pool_env import FATAL_MESSAGE_BYTES, MAX_FAILED_CONSTRUCTIONS, PoolEnv, decode_fatal, encode_fatal

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
import fault_envs  # noqa: E402  (registers FaultCartPole-v0)
from procs import children_and_grandchildren, ended  # noqa: E402  (tests/procs.py)

ENV = "fault_envs:FaultCartPole-v0"
IMPALA = [
    "train",
    "--env",
    ENV,
    "--core",
    "lstm",
    "--set",
    "core_config.hidden_size=8",
    "--num-actors",
    "4",
    "--unroll-length",
    "5",
    "--batch-size",
    "2",
    "--checkpoint-every",
    "0.3",
    "--log-every",
    "0.2",
]
LOCAL = ["--env-backend", "local"]
MOOLIB = ["--env-backend", "moolib", "--num-env-processes", "2"]
DEADLINE = 300  # s: only ever a failure deadline (a slow or busy machine just takes longer)
GONE = 30  # s: time for a SIGKILLed process to be gone


@pytest.fixture(autouse=True)
def fresh_counters(one_thread):
    fault_envs.reset_counters()


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _start(argv: list[str], new_session: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rfwp_rl", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=ROOT,
        start_new_session=new_session,
    )


def _run(argv: list[str], timeout: float = DEADLINE) -> tuple[int, str]:
    proc = _start(argv)
    try:
        out = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        raise
    return proc.returncode, out


def _end(pids: list[int], grace: float = 0.0) -> list[int]:
    """The pids of ``pids`` (processes this test started) still alive after up to ``grace`` s (for
    processes already SIGKILLed to end); SIGKILLs them, so a failed check leaves no hung env worker
    behind."""
    left = ended(pids, grace)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a trainer started here and its env pool processes (a failed test leaves no hung workers)."""
    pids = [proc.pid] + children_and_grandchildren(proc.pid)
    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.communicate()


def _checkpoint(run_dir: Path) -> dict:
    return read_checkpoint(list_checkpoints(run_dir)[0])


def _reports(text: str, where: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning: env ") and f" in {where} (" in line]


# ------------------------------------------------------------------ PoolEnv unit checks


def _maker(**options):
    return lambda failures: make_env(ENV, seed=failures, **options)


def test_pool_env_replaces_an_env_whose_first_reset_raises():
    fault_envs.FIRST_RESETS["n"] = 0  # the 1st env to reset fails, its replacement works
    env = PoolEnv(None, make=_maker(reset_fails="odd_first"), name="fault #0")
    first = env.reset()
    assert set(first) == {"obs", "episode_return", "episode_step", "episode_end", "truncated", "env_error", "env_fatal"}
    assert first["env_error"] == 1 and not first["episode_end"] and env.failures == 1
    assert first["obs"].shape == (4,) and first["obs"].dtype == np.float32
    assert first["env_fatal"].shape == (FATAL_MESSAGE_BYTES,) and not first["env_fatal"].any()
    out, _, _, _ = env.step(0)
    assert out["env_error"] == 0 and out["episode_step"] == 1


def test_pool_env_reset_failure_after_an_episode_keeps_the_episode_and_counts_once():
    env = PoolEnv(None, make=_maker(reset_fails="after_episode"), name="fault #0")
    assert env.reset()["env_error"] == 0
    steps = 0
    while True:
        out, reward, done, _ = env.step(0)
        steps += 1
        if done:
            break
    after = env.reset()  # the env's 2nd reset raises: a replacement's first observation
    assert after["env_error"] == 1 and env.failures == 1
    assert after["episode_end"] and after["episode_step"] == steps and after["episode_return"] == steps
    nxt, _, _, _ = env.step(0)
    assert nxt["episode_step"] == 1 and nxt["env_error"] == 0 and not nxt["episode_end"]


def test_pool_env_step_failure_is_counted_once_with_the_replacement():
    env = PoolEnv(None, make=_maker(), name="fault #0")
    env.reset()
    env.env = None  # the next step raises (AttributeError), as a crashed env would
    out, reward, done, _ = env.step(0)
    assert done and reward == 0.0 and out["env_error"] == 0  # moolib replaces this obs with reset()'s
    new = env.reset()
    assert new["env_error"] == 1 and new["episode_step"] == 0 and not new["episode_end"]


@pytest.mark.parametrize("mode", ["reset", "make"])
def test_pool_env_gives_up_after_consecutive_failed_constructions(mode, capsys):
    options = {"reset_fails": "always"} if mode == "reset" else {"make_fails": True}
    fault_envs.MADE["n"] = 1  # make_fails: every instance from now on raises
    blank = np.zeros(4, np.float32) if mode == "make" else None  # no env is ever made: placeholder needed
    env = PoolEnv(None, make=_maker(**options), name="fault:X-v0 #3", blank_obs=blank)
    out = env.reset()
    assert env.failures == MAX_FAILED_CONSTRUCTIONS == 3
    assert out["env_error"] == 3 and out["obs"].shape == (4,) and out["obs"].dtype == np.float32
    message = decode_fatal(out["env_fatal"])
    last = "injected reset failure (always)" if mode == "reset" else "injected construction failure #4"
    stage = "first reset" if mode == "reset" else "construction"
    assert message == (
        f"env fault:X-v0 #3: 3 new envs in a row failed at construction or first reset "
        f"(limit 3); last: RuntimeError: {last}"
    )
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(f" in {stage} (failure " in line and "replacing it" in line for line in err), err
    # the slot stays given up (the worker must not die); no further envs are made
    made = fault_envs.MADE["n"]
    out2, reward, done, _ = env.step(1)
    assert done and reward == 0.0 and decode_fatal(out2["env_fatal"]) == message
    assert decode_fatal(env.reset()["env_fatal"]) == message and fault_envs.MADE["n"] == made


def test_pool_env_without_placeholder_raises_the_one_line_error():
    fault_envs.MADE["n"] = 1
    env = PoolEnv(None, make=_maker(make_fails=True), name="fault #0")
    with pytest.raises(RuntimeError, match=r"^env fault #0: 3 new envs in a row failed .*injected construction"):
        env.reset()


def test_fatal_message_roundtrip_and_truncation():
    assert decode_fatal(encode_fatal("env X: broken")) == "env X: broken"
    long = "é" * 200  # 400 bytes: cut to 240 bytes, a cut character is replaced, never an error
    field = encode_fatal(long)
    assert field.shape == (FATAL_MESSAGE_BYTES,) and field.dtype == np.uint8
    assert decode_fatal(torch.from_numpy(field)).startswith("é" * 119)
    assert decode_fatal(np.zeros(FATAL_MESSAGE_BYTES, np.uint8)) == ""


# ------------------------------------------------------------------ trainer, local backend


@pytest.mark.parametrize("mode", ["odd_first", "after_episode"])
def test_local_reset_failures_are_replaced_and_counted(tmp_path, mode, capsys):
    run_dir = tmp_path / "run"
    argv = IMPALA + LOCAL + ["--env-option", f"reset_fails={mode}", "--run-dir", str(run_dir), "--total-steps", "300"]
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    assert "finished at step 300" in cap.out
    where = "first reset" if mode == "odd_first" else "reset"
    reports = _reports(cap.err, where)
    counters = _checkpoint(run_dir)["state"]["counters"]
    assert counters["env_failures"] == len(reports)
    assert all("FaultCartPole-v0 #" in line and "replacing it" in line for line in reports)
    if mode == "odd_first":  # each of the 4 slots: its first env fails once, its replacement works
        assert len(reports) == 4 and {line.split(" (pid")[0] for line in reports} == {
            f"warning: env {ENV} #{i}" for i in range(4)
        }
    else:  # every env fails at its first reset after an episode; that episode still counts
        assert len(reports) >= 8
        assert counters["episodes"] == counters["env_failures"]
    counted = [line for line in cap.err.splitlines() if "failed and was replaced" in line]
    assert counted and f"{len(reports)} env failures so far (limit --max-env-failures 100)" in counted[-1]


@pytest.mark.parametrize("mode", ["reset", "make"])
def test_local_env_that_never_works_stops_with_one_line_error(tmp_path, mode, capsys):
    run_dir = tmp_path / "run"
    option = "reset_fails=always" if mode == "reset" else "make_fails=true"
    argv = IMPALA + LOCAL + ["--env-option", option, "--run-dir", str(run_dir), "--total-steps", "300"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    last = "injected reset failure (always)" if mode == "reset" else "injected construction failure #4"
    assert errors == [
        f"error: training aborted: env {ENV} #0: 3 new envs in a row failed at construction or "
        f"first reset (limit 3); last: RuntimeError: {last} (actor env 0); "
        "the last good model is saved"
    ], err
    assert "Traceback" not in err
    assert _checkpoint(run_dir)["step"] == 0


def test_env_timeout_must_be_positive(tmp_path, capsys):
    argv = IMPALA + LOCAL + ["--run-dir", str(tmp_path / "run"), "--total-steps", "10", "--env-timeout", "0"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --env-timeout 0 is invalid; allowed: seconds > 0 (inf: never time out)"]
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ trainer, moolib backend


@pytest.mark.moolib
@pytest.mark.slow
def test_moolib_reset_failures_are_replaced_and_a_broken_env_stops_the_run(tmp_path):
    """In the workers: first resets that raise are replaced and counted; an env that never
    resets stops the run with one line (no worker death, no restart loop)."""
    run_dir = tmp_path / "flaky"
    code, out = _run(
        IMPALA + MOOLIB + ["--env-option", "reset_fails=odd_first", "--run-dir", str(run_dir), "--total-steps", "200"]
    )
    assert code == 0, out
    assert "finished at step 200" in out
    reports = _reports(out, "first reset")
    assert len(reports) == 4 and all("(worker slot " in line for line in reports), out  # each slot once
    assert _checkpoint(run_dir)["state"]["counters"]["env_failures"] == 4
    assert "restarting" not in out and "nanobind" not in out

    run_dir = tmp_path / "broken"
    code, out = _run(
        IMPALA + MOOLIB + ["--env-option", "reset_fails=always", "--run-dir", str(run_dir), "--total-steps", "200"]
    )
    assert code == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out
    assert errors[0].startswith(f"error: training aborted: env {ENV} (worker slot ")
    assert (
        "3 new envs in a row failed at construction or first reset (limit 3); "
        "last: RuntimeError: injected reset failure (always)"
    ) in errors[0]
    assert "Traceback" not in out and "restarting" not in out and "died" not in out


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = DEADLINE) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            out = "" if proc.poll() is None else proc.stdout.read()
            _kill_tree(proc)
            raise AssertionError(f"{path} never appeared: {out}")
        time.sleep(0.05)


@pytest.mark.moolib
@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_moolib_signal_while_waiting_on_a_hung_env(tmp_path, sig):
    """An env step sleeps for an hour, and the learner waits on its batch (or is about to: it waits
    on it at the latest when it stops): SIGTERM (to the trainer) or SIGINT (to its process group,
    as Ctrl-C does) -> checkpoint, exit 0 within seconds, and the hung worker processes are ended
    rather than left behind."""
    run_dir, marker = tmp_path / "run", tmp_path / "hung"
    argv = (
        IMPALA
        + MOOLIB
        + [
            "--env-option",
            "hang_at=40",
            "--env-option",
            f"hang_marker={marker}",
            "--run-dir",
            str(run_dir),
            "--total-steps",
            "100000",
        ]
    )
    proc = _start(argv, new_session=True)
    workers: list[int] = []
    try:
        _wait_for(marker, proc)  # one env's step is asleep now
        workers = children_and_grandchildren(proc.pid)
        assert len(workers) == 3 and proc.poll() is None, workers  # pool server + 2 workers
        t0 = time.monotonic()
        if sig == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        while proc.poll() is None and time.monotonic() - t0 < DEADLINE:  # the hung step sleeps an hour
            time.sleep(0.05)
        left = _end(workers, grace=GONE)  # (a worker left behind would also hold the output pipe open)
        out = proc.communicate(timeout=DEADLINE)[0]
    except BaseException:
        _end(workers)
        if proc.poll() is None:
            _kill_tree(proc)
        raise
    assert proc.returncode == 0, out  # ended within the deadline: it did not wait for the hung env
    assert f"{sig} received" in out
    assert "ending the env worker processes" in out
    step = _checkpoint(run_dir)["step"]
    assert f"stopped at step {step:,}" in out and step < 100000
    assert not left, out


@pytest.mark.moolib
@pytest.mark.slow
def test_moolib_hung_env_times_out_like_a_dead_worker(tmp_path):
    """--env-timeout 5: an env that hangs once -> the batch times out, the trainer checkpoints,
    ends the pool, re-executes itself (counted as one env failure) and finishes."""
    run_dir, marker = tmp_path / "run", tmp_path / "hung"
    code, out = _run(
        IMPALA
        + MOOLIB
        + [
            "--env-option",
            "hang_at=40",
            "--env-option",
            f"hang_marker={marker}",
            "--env-timeout",
            "5",
            "--run-dir",
            str(run_dir),
            "--total-steps",
            "300",
        ]
    )
    assert code == 0, out
    assert marker.exists()
    assert "(env timeout 5 s): an env is hung); saving a checkpoint and restarting" in out
    assert "restarting at step" in out and "resuming" in out and "finished at step 300" in out
    ck = _checkpoint(run_dir)
    assert ck["step"] == 300 and ck["state"]["counters"]["env_failures"] == 1


@pytest.mark.moolib
@pytest.mark.slow
def test_moolib_env_hung_for_ever_stops_at_the_failure_limit(tmp_path):
    """An env that always hangs, with --max-env-failures 0: the first timeout stops the run
    (checkpoint, exit 1, one error line), and no worker is left behind."""
    run_dir = tmp_path / "run"
    proc = _start(
        IMPALA
        + MOOLIB
        + [
            "--env-option",
            "hang_at=40",
            "--env-timeout",
            "4",
            "--max-env-failures",
            "0",
            "--run-dir",
            str(run_dir),
            "--total-steps",
            "100000",
        ]
    )
    workers: list[int] = []
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < DEADLINE:
        workers = sorted(set(workers) | set(children_and_grandchildren(proc.pid)))
        time.sleep(0.1)
    if proc.poll() is None:
        _kill_tree(proc)
        raise AssertionError("the trainer did not stop")
    left = _end(workers, grace=GONE)  # (a worker left behind would also hold the output pipe open)
    out = proc.communicate(timeout=DEADLINE)[0]
    assert proc.returncode == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors[0].startswith("error: environment pool broken (no result from env batch ")
    step = _checkpoint(run_dir)["step"]
    assert errors[1] == (
        f"error: 1 environment failures (limit --max-env-failures 0); stopped at step {step:,}; "
        f"checkpoint {run_dir / list_checkpoints(run_dir)[0].name}"
    )
    assert "restarting at step" not in out
    assert not left and len(workers) == 3, (workers, left)
