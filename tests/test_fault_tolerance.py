"""Fault tolerance of the three trainers, end to end through the real CLI.

- SIGKILL at random moments (several times), then SIGTERM, then a run to the end: every
  restart resumes from the last complete checkpoint; the final step is the target, the
  checkpoint loads, TensorBoard steps are strictly increasing (no duplicates after resumes).
- Truncated / garbage / mismatched checkpoints: previous one used, or a one-line refusal.
- Failing environments (an env that raises every N steps; a killed moolib worker process).
- An injected NaN loss: the update is skipped, counted in TensorBoard, never checkpointed.

The tiniest configs of each trainer are used; subprocesses are guarded by timeouts.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import rfwp_rl.runlog  # noqa: F401  (imported at collection: RunLogger binds sys.stdout as its default stream)
from rfwp_rl import cli
from rfwp_rl.checkpoint import Checkpointer, list_checkpoints, non_finite_entries, read_checkpoint

ROOT = Path(__file__).resolve().parents[1]

# (argv for a run directory and a target, TensorBoard tag logged once per step/update,
#  step of the target, state key of the model)
IMPALA = [
    "train",
    "--env",
    "CartPole-v1",
    "--core",
    "lstm",
    "--set",
    "core_config.hidden_size=8",
    "--env-backend",
    "local",
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
META = [
    "meta-rl",
    "--core",
    "lstm",
    "--set",
    "core_config.hidden_size=8",
    "--batch-size",
    "4",
    "--train-graphs",
    "8",
    "--test-graphs",
    "4",
    "--episode-steps",
    "10",
    "--eval-every",
    "100000000",
    "--checkpoint-every",
    "0.3",
    "--torch-threads",
    "1",
    "--log-every",
    "1000",
]
SEQ = [
    "seq",
    "--task",
    "assoc",
    "--num-keys",
    "4",
    "--core",
    "lt",
    "--num-layers",
    "1",
    "--num-heads",
    "1",
    "--hidden-size",
    "8",
    "--ff-size",
    "16",
    "--emb-size",
    "8",
    "--batch-size",
    "4",
    "--torch-threads",
    "1",
    "--eval-every-updates",
    "100000",
    "--eval-batch-size",
    "8",
]
EPISODE = 4 * 10  # meta-RL: env steps of one episode of the batch (one update)
TRAINERS = {
    # name: (argv(run_dir, target, checkpoint_every seconds), TensorBoard tag, model key in the state)
    "impala": (lambda d, n, c=None: IMPALA + ["--run-dir", str(d), "--total-steps", str(n)], "loss/total", "agent"),
    "meta_rl": (
        lambda d, n, c=None: META + ["--run-dir", str(d), "--total-steps", str(n)],
        "train/total_reward",
        "model",
    ),
    "seq": (
        lambda d, n, c=0.3: SEQ + ["--run-dir", str(d), "--updates", str(n), "--checkpoint-every", str(c)],
        "train/loss",
        "model",
    ),
}
UNREACHABLE = 10**9  # the target of the runs that are signalled: they never end before the signal
FINISH = {"impala": 400, "meta_rl": 60 * EPISODE, "seq": 60}  # the last run's target: this far past the stop
KILLS = {"impala": 1, "meta_rl": 3, "seq": 1}  # several for one trainer; the machine is shared
PRESETS = {"impala": 10, "meta_rl": EPISODE, "seq": 1}  # steps per update (TensorBoard step spacing)
DEADLINE = 300  # s: only ever a failure deadline (a slow or busy machine just takes longer)


pytestmark = pytest.mark.usefixtures("one_thread")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _start(argv: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rfwp_rl", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env or _env(),
        cwd=ROOT,
    )


def _newest_step(run_dir: Path) -> int:
    files = list_checkpoints(run_dir)
    return int(files[0].name[5:-3]) if files else -1


def _wait_for_checkpoint_after(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = DEADLINE) -> int:
    """Wait until the run has a checkpoint newer than ``step`` (or the process ended)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        newest = _newest_step(run_dir)
        if newest > step or proc.poll() is not None:
            return newest
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"no new checkpoint after step {step} within {timeout} s")


def _tb_steps(run_dir: Path, tag: str) -> list[int]:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def _tb_values(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


# ------------------------------------------------------------------ hard kills, SIGTERM


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_sigkill_at_random_moments_then_sigterm_then_finish(tmp_path, name):
    """SIGKILLs at random moments after fresh progress (3 for meta-RL, 1 for the others, to keep
    the test short), then one SIGTERM (checkpoint, exit 0), then a run to a target past the stop.
    Each restart resumes from the newest checkpoint. The signalled runs have a target they cannot
    reach, so no signal races the end of a run, however fast the machine."""
    argv_of, tag, model_key = TRAINERS[name]
    run_dir = tmp_path / "run"
    argv = argv_of(run_dir, UNREACHABLE)
    rng = random.Random(8)
    last = -1
    for kill in range(KILLS[name]):
        proc = _start(argv)
        newest = _wait_for_checkpoint_after(proc, run_dir, last)
        assert proc.poll() is None, f"run ended before kill {kill}: {proc.stdout.read()}"
        time.sleep(rng.uniform(0.0, 0.3))  # somewhere between checkpoints, possibly mid-write
        proc.send_signal(signal.SIGKILL)
        out = proc.communicate(timeout=DEADLINE)[0]
        assert proc.returncode == -signal.SIGKILL
        if kill > 0:
            assert "resum" in out, out
        assert newest > last
        last = _newest_step(run_dir)
        for path in list_checkpoints(run_dir):  # every file left behind is complete
            read_checkpoint(path)

    # SIGTERM: a checkpoint at the current step, exit 0 (the run's target lies far beyond: it stops because asked)
    proc = _start(argv)
    _wait_for_checkpoint_after(proc, run_dir, last)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=DEADLINE)[0]
    assert proc.returncode == 0, out
    assert "SIGTERM received" in out
    stopped = _newest_step(run_dir)
    assert last < stopped < UNREACHABLE

    # resumed once more, to a target past the stop, the run finishes
    target = stopped + FINISH[name]
    proc = _start(argv_of(run_dir, target))
    out = proc.communicate(timeout=DEADLINE)[0]
    assert proc.returncode == 0, out
    assert f"{stopped:,}" in out and "resum" in out
    ck = read_checkpoint(list_checkpoints(run_dir)[0])
    assert ck["step"] == target
    assert not non_finite_entries(ck["state"][model_key])
    steps = _tb_steps(run_dir, tag)
    assert steps[-1] == target
    back = [(a, b) for a, b in zip(steps, steps[1:]) if b <= a]
    assert not back, f"TensorBoard steps repeat or go back: {back} (files {sorted(os.listdir(run_dir / 'tb'))})"
    # at most the point at each resumed checkpoint step is missing (RunLogger purges >= start)
    expected = target // PRESETS[name]
    assert expected - 5 <= len(steps) <= expected


# ------------------------------------------------------------------ broken checkpoints


def _two_checkpoints(tmp_path: Path, name: str) -> tuple[Path, list[Path]]:
    argv_of, _, _ = TRAINERS[name]
    run_dir = tmp_path / name
    if name == "impala":
        assert cli.main(argv_of(run_dir, 20)[:-2] + ["--total-steps", "10", "--checkpoint-every", "1000"]) == 0
        assert cli.main(argv_of(run_dir, 20) + ["--checkpoint-every", "1000"]) == 0
    elif name == "meta_rl":
        assert cli.main(argv_of(run_dir, 2 * EPISODE)) == 0
        assert cli.main(argv_of(run_dir, 3 * EPISODE)) == 0
    else:  # the final checkpoints of two runs (no periodic one)
        assert cli.main(argv_of(run_dir, 2, 1000)) == 0
        assert cli.main(argv_of(run_dir, 4, 1000)) == 0
    files = list_checkpoints(run_dir)
    assert len(files) == 2
    return run_dir, files


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_broken_and_mismatched_checkpoints_through_the_cli(tmp_path, name, capsys):
    argv_of, _, _ = TRAINERS[name]
    run_dir, (newest, previous) = _two_checkpoints(tmp_path, name)
    prev_step = read_checkpoint(previous)["step"]
    capsys.readouterr()
    target = {"impala": 30, "meta_rl": 4 * EPISODE, "seq": 6}[name]

    # other core / config: one-line refusal naming the difference, nothing written
    if name == "impala":
        other = [a if a != "lstm" else "ff" for a in argv_of(run_dir, target)]
        other = [a for a in other if a not in ("--set", "core_config.hidden_size=8")]
        refused = "core: checkpoint has 'lstm', this run has 'ff'"
    elif name == "meta_rl":
        other = [
            a if a != "core_config.hidden_size=8" else "core_config.hidden_size=12" for a in argv_of(run_dir, target)
        ]
        refused = "core_config.hidden_size: checkpoint has 8, this run has 12"
    else:
        other = [a if a != "lt" else "delta" for a in argv_of(run_dir, target, 2)]
        refused = "core: checkpoint has 'lt', this run has 'delta'"
    before = sorted(p.name for p in run_dir.iterdir())
    assert cli.main(other) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: checkpoint") and refused in err[0], err
    assert sorted(p.name for p in run_dir.iterdir()) == before
    if name == "impala":  # another action count (Acrobot: 3 actions, 6 observations)
        assert cli.main([a if a != "CartPole-v1" else "Acrobot-v1" for a in argv_of(run_dir, target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "num_actions: checkpoint has 2, this run has 3" in err[0], err

    # truncated newest: one warning line naming it, the previous one is used
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 3])
    argv = argv_of(run_dir, target, 2) if name == "seq" else argv_of(run_dir, target)
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    warnings = [line for line in cap.err.splitlines() if "unreadable" in line]
    assert len(warnings) == 1 and newest.name in warnings[0], cap.err
    assert f"{prev_step:,}" in cap.out and "resum" in cap.out
    assert read_checkpoint(list_checkpoints(run_dir)[0])["step"] == target

    # garbage in every checkpoint: one-line error naming the files, exit 2
    files = list_checkpoints(run_dir)
    for path in files:
        path.write_bytes(os.urandom(2000))
    assert cli.main(argv_of(run_dir, 2 * target, 2) if name == "seq" else argv_of(run_dir, 2 * target)) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and all(p.name in err[0] for p in files) and "no usable checkpoint" in err[0]


# ------------------------------------------------------------------ failing environments

FLAKY_ENV = textwrap.dedent('''
    """Test env: CartPole whose step raises every ``every`` steps (per env instance). With ``gate``
    (a path), step ``gate_at`` of an instance first writes ``<gate>.waiting`` and waits until
    ``<gate>.open`` exists: the test acts while the run cannot go on, then lets it."""
    import os
    import time

    import gymnasium


    class FlakyCartPole(gymnasium.Wrapper):
        def __init__(self, every=25, gate="", gate_at=10):
            super().__init__(gymnasium.make("CartPole-v1"))
            self.every, self.n, self.gate, self.gate_at = every, 0, str(gate), int(gate_at)

        def step(self, action):
            self.n += 1
            if self.gate and self.n == self.gate_at and not os.path.exists(self.gate + ".open"):
                open(self.gate + ".waiting", "w").close()
                while not os.path.exists(self.gate + ".open"):
                    time.sleep(0.02)
            if self.n % self.every == 0:
                raise RuntimeError(f"injected failure at step {self.n}")
            return self.env.step(action)


    if "FlakyCartPole-v0" not in gymnasium.registry:
        gymnasium.register("FlakyCartPole-v0", entry_point=FlakyCartPole, kwargs={"every": 25})
''')


@pytest.fixture
def flaky_module(tmp_path, monkeypatch):
    (tmp_path / "flaky_env_mod.py").write_text(FLAKY_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "flaky_env_mod:FlakyCartPole-v0"


def test_env_that_raises_is_replaced_and_training_reaches_its_target(tmp_path, flaky_module, capsys):
    argv = [a if a != "CartPole-v1" else flaky_module for a in IMPALA] + [
        "--run-dir",
        str(tmp_path / "run"),
        "--total-steps",
        "300",
    ]
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    assert "finished at step 300" in cap.out
    # 4 envs x ~80 steps each, every 25th raises: each env fails about 3 times
    reports = [line for line in cap.err.splitlines() if "raised RuntimeError: injected failure" in line]
    assert len(reports) >= 8 and "FlakyCartPole-v0 #" in reports[0]
    counted = [line for line in cap.err.splitlines() if "failed and was replaced" in line]
    assert counted and "env failures so far (limit --max-env-failures 100)" in counted[-1]
    ck = read_checkpoint(list_checkpoints(tmp_path / "run")[0])
    assert ck["step"] == 300 and ck["state"]["counters"]["env_failures"] == len(reports)


def test_too_many_env_failures_stop_with_a_checkpoint(tmp_path, flaky_module, capsys):
    argv = [a if a != "CartPole-v1" else flaky_module for a in IMPALA] + [
        "--run-dir",
        str(tmp_path / "run"),
        "--total-steps",
        "100000",
        "--max-env-failures",
        "2",
    ]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    # the 2 envs of a batch fail at the same step: 4 failures when the limit is crossed
    assert "error: training aborted: 4 environment failures (limit --max-env-failures 2)" in err
    ck = read_checkpoint(list_checkpoints(tmp_path / "run")[0])
    assert ck["state"]["counters"]["env_failures"] == 4 and 0 < ck["step"] < 100000


@pytest.mark.moolib
@pytest.mark.slow
def test_moolib_failing_env_and_killed_worker_process(tmp_path):
    """moolib backend in a subprocess: envs that raise are replaced inside the workers; a
    SIGKILLed worker process is detected, the trainer checkpoints, ends the old pool,
    re-executes itself (same pid) and reaches its step target. The worker is killed while the
    envs wait at a gate (the run cannot end first); the gate opens after the kill."""
    (tmp_path / "flaky_env_mod.py").write_text(FLAKY_ENV)
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join((str(tmp_path), env["PYTHONPATH"]))
    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    argv = [
        a
        if a not in ("CartPole-v1", "local")
        else {"CartPole-v1": "flaky_env_mod:FlakyCartPole-v0", "local": "moolib"}[a]
        for a in IMPALA
    ]
    argv += [
        "--num-env-processes",
        "2",
        "--run-dir",
        str(run_dir),
        "--total-steps",
        "400",
        "--env-option",
        f"gate={gate}",
    ]
    proc = _start(argv, env)
    deadline = time.monotonic() + DEADLINE
    while not Path(f"{gate}.waiting").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no env reached the gate: {proc.communicate()[0]}")
        time.sleep(0.02)
    assert proc.poll() is None

    def children(pid):
        try:
            return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            return []

    workers = [w for server in children(proc.pid) for w in children(server)]
    assert len(workers) == 2, workers
    os.kill(workers[0], signal.SIGKILL)
    Path(f"{gate}.open").touch()
    out = proc.communicate(timeout=DEADLINE)[0]
    assert proc.returncode == 0, out
    assert f"env worker process {workers[0]} died" in out
    assert "restarting at step" in out and "resuming" in out
    assert "raised RuntimeError: injected failure" in out  # reported from inside a worker
    assert "finished at step 400" in out
    assert "nanobind" not in out
    ck = read_checkpoint(list_checkpoints(run_dir)[0])
    assert ck["step"] == 400 and ck["state"]["counters"]["env_failures"] >= 1
    steps = _tb_steps(run_dir, "loss/total")
    assert steps[-1] == 400 and all(b > a for a, b in zip(steps, steps[1:]))


# ------------------------------------------------------------------ non-finite updates


def _nan_on_calls(real, calls: set[int]):
    """Wrap a loss function so that its result is NaN (loss and gradients) on the given calls."""
    count = {"n": 0}

    def wrapped(*args, **kwargs):
        count["n"] += 1
        out = real(*args, **kwargs)
        if count["n"] not in calls:
            return out
        if isinstance(out, tuple):  # IMPALA: (loss, stats)
            return (out[0] * float("nan"), *out[1:])
        if isinstance(out, dict):  # meta-RL: {"loss": ...}
            return dict(out, loss=out["loss"] * float("nan"))
        return out * float("nan")  # seq: loss tensor

    return wrapped


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_nan_loss_skips_the_update_and_is_logged(tmp_path, name, monkeypatch, capsys):
    argv_of, _, model_key = TRAINERS[name]
    run_dir = tmp_path / "run"
    if name == "impala":
        from rfwp_rl.impala import learner

        monkeypatch.setattr(learner, "compute_loss", _nan_on_calls(learner.compute_loss, {2, 3}))
        argv, target = argv_of(run_dir, 60) + ["--log-every", "0"], 60
    elif name == "meta_rl":
        from rfwp_rl.meta_rl import a2c

        monkeypatch.setattr(a2c, "a2c_loss", _nan_on_calls(a2c.a2c_loss, {2, 3}))
        argv, target = argv_of(run_dir, 6 * EPISODE), 6 * EPISODE
    else:
        from rfwp_rl.seq.model import SeqModel

        monkeypatch.setattr(SeqModel, "loss", staticmethod(_nan_on_calls(SeqModel.loss, {2, 3})))
        argv, target = argv_of(run_dir, 6, 3), 6
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "non-finite loss or gradient, update skipped (2 in a row, 2 in total)" in err
    ck = read_checkpoint(list_checkpoints(run_dir)[0])
    assert ck["step"] == target
    assert not non_finite_entries(ck["state"][model_key]) and not non_finite_entries(ck["state"]["optimizer"])
    logged = _tb_values(run_dir, "train/skipped_updates")
    assert logged[-1][1] == 2.0 and max(v for _, v in logged) == 2.0


def test_nan_every_update_aborts_with_the_last_finite_checkpoint(tmp_path, monkeypatch, capsys):
    from rfwp_rl.seq.model import SeqModel

    monkeypatch.setattr(SeqModel, "loss", staticmethod(_nan_on_calls(SeqModel.loss, set(range(4, 1000)))))
    run_dir = tmp_path / "run"
    assert cli.main(TRAINERS["seq"][0](run_dir, 100, 1000)) == 1
    err = capsys.readouterr().err
    assert "error: training aborted: 21 non-finite updates in a row (limit 20); checkpoint at step 23 saved" in err
    ck = read_checkpoint(list_checkpoints(run_dir)[0])
    assert ck["step"] == 23 and ck["state"]["skipped"] == 21 and not non_finite_entries(ck["state"]["model"])


def test_checkpointer_refuses_non_finite_state(tmp_path):
    from rfwp_rl.checkpoint import NonFiniteState

    ck = Checkpointer(tmp_path, {"trainer": "t"})
    ck.save({"model": {"w": torch.ones(2)}}, 1)
    with pytest.raises(NonFiniteState, match=r"model\.w holds NaN/inf"):
        ck.save({"model": {"w": torch.tensor([1.0, math.inf])}}, 2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_000000000001.pt"]
