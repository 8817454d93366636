"""Run logging (TensorBoard continuity on resume, hparams) and run-safety helpers."""

import io
import math
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rfwp_rl.runlog import RunLogger, format_duration, run_name
from rfwp_rl.safety import NonFiniteGuard, TrainingAborted


def _steps(run_dir, tag):
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_resume_purges_rewound_points(tmp_path):
    log = RunLogger(tmp_path, {"core": "rdn", "lr": 6e-4}, total=100, stream=io.StringIO())
    for step in range(0, 10):
        log.log(step, {"loss": float(step)})
    log.close()
    # the run crashed after step 9 but its last checkpoint was at step 5: resume from there
    log = RunLogger(tmp_path, {"core": "rdn", "lr": 6e-4}, total=100, start=5, stream=io.StringIO())
    for step in range(6, 8):
        log.log(step, {"loss": 100.0 + step})
    log.close()
    points = _steps(tmp_path, "loss")
    assert [s for s, _ in points] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [v for _, v in points] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 106.0, 107.0]


def test_the_scalars_of_one_call_come_back_each_under_its_tag(tmp_path):
    log = RunLogger(tmp_path, {}, total=10, stream=io.StringIO())
    log.log(3, {"episode/return": 2.5, "episode/length": 7, "loss/total": float("nan")})
    log.log(4, {"episode/return": -1.0, "loss/total": float("inf")})
    log.log(5, {})  # nothing to write
    log.close()
    assert _steps(tmp_path, "episode/return") == [(3, 2.5), (4, -1.0)]
    assert _steps(tmp_path, "episode/length") == [(3, 7.0)]
    (s3, nan), (s4, inf) = _steps(tmp_path, "loss/total")
    assert (s3, s4) == (3, 4) and math.isnan(nan) and inf == math.inf


def test_config_and_hparams_written(tmp_path):
    log = RunLogger(
        tmp_path,
        {"core": "rdn", "core_config": {"hidden_size": 128}},
        total=10,
        metrics=("episode/return",),
        stream=io.StringIO(),
    )
    log.close()
    assert '"hidden_size": 128' in (tmp_path / "config.json").read_text()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert "_hparams_/experiment" in acc.summary_metadata


def test_progress_line_has_counts_rate_and_eta(tmp_path):
    out = io.StringIO()
    log = RunLogger(tmp_path, {}, total=1000, unit="env steps", stream=out)
    log.progress(250, force=True, loss=0.5)
    log.close()
    line = out.getvalue().strip()
    assert line.startswith("250/1,000 env steps (25.0%)") and "ETA" in line and "loss 0.5" in line


def test_run_name_and_duration():
    assert run_name("ALE/Pong-v5", "rdn", "s1") == "ALE-Pong-v5_rdn_s1"
    assert format_duration(3725) == "1h02m" and format_duration(65) == "1m05s"


def test_nonfinite_guard_skips_and_aborts():
    p = torch.nn.Parameter(torch.ones(2))
    guard = NonFiniteGuard(max_consecutive=2)
    p.grad = torch.ones(2)
    assert guard.ok(torch.tensor(1.0), [p])
    p.grad = torch.tensor([1.0, float("nan")])
    assert not guard.ok(torch.tensor(1.0), [p])
    p.grad = torch.ones(2)
    assert not guard.ok(torch.tensor(float("inf")), [p])
    assert guard.skipped == 2
    assert guard.ok(torch.tensor(0.0), [p]) and guard.consecutive == 0
    for _ in range(2):
        assert not guard.ok(torch.tensor(float("nan")), [p])
    with pytest.raises(TrainingAborted):
        guard.ok(torch.tensor(float("nan")), [p])


def test_graceful_stop_first_signal_flags_second_exits():
    script = textwrap.dedent("""
        import time
        from rfwp_rl.safety import GracefulStop
        with GracefulStop() as stop:
            print("ready", flush=True)
            while not stop.requested:
                time.sleep(0.01)
            print("stopping", flush=True)
            time.sleep(3600)  # outlasts the test's wait: only an exit at the second signal ends it in time
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline().strip() == "stopping"
    proc.send_signal(signal.SIGINT)
    try:
        assert proc.wait(timeout=300) == 130
    finally:
        proc.kill()  # (a no-op once it has exited)


def test_a_run_resumed_from_its_step_0_checkpoint_drops_what_the_crashed_run_logged(tmp_path):
    crashed = RunLogger(tmp_path, {}, total=100, start=0)
    for step in (10, 20, 30, 40):
        crashed.log(step, {"loss/total": float(step)})
    crashed.close()  # (a crash after these were written, before a checkpoint past step 0)
    resumed = RunLogger(tmp_path, {}, total=100, start=0)
    for step in (10, 20):
        resumed.log(step, {"loss/total": -float(step)})
    resumed.close()
    assert _steps(tmp_path, "loss/total") == [(10, -10.0), (20, -20.0)]
