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

from rfwp_rl.runlog import RunLogger, format_duration, read_all_scalars, run_name, scalar_events
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


def _accumulated(run_dir):
    """TensorBoard's own reading of every scalar (the reference :func:`read_all_scalars` must equal), NaN as a
    string so that lists compare."""
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: _comparable({e.step: e.value for e in acc.Scalars(tag)}.items()) for tag in acc.Tags()["scalars"]}


def _comparable(points):
    return sorted((step, "nan" if math.isnan(value) else value) for step, value in points)


def _read(run_dir):
    return {tag: _comparable(points) for tag, points in read_all_scalars(run_dir).items()}


def _session(run_dir, start, steps, offset):
    log = RunLogger(run_dir, {"core": "rdn"}, total=100, start=start, stream=io.StringIO())
    for step in steps:
        scalars = {"loss": offset + step, "episode/return": float("nan") if step % 7 == 3 else -float(step)}
        if step % 2:
            scalars["odd"] = float(step)
        log.log(step, scalars)
    log.close()


def test_read_all_scalars_equals_tensorboard_over_resumed_sessions(tmp_path):
    # sessions: from 0; crashed past its checkpoint at 12 and resumed; resumed further back (from 4); resumed
    # from its step-0 checkpoint (a purge from 1); a step logged twice in one session keeps the later value
    _session(tmp_path, 0, range(0, 20), 0.0)
    _session(tmp_path, 12, range(13, 30), 100.0)
    _session(tmp_path, 4, [5, 6, 6, 9], 200.0)
    reference = _accumulated(tmp_path)
    assert _read(tmp_path) == reference
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    every_point = {tag: [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)] for tag in ["loss", "odd"]}
    assert {tag: scalar_events(tmp_path)[tag] for tag in every_point} == every_point  # both points of step 6
    assert [s for s, _ in reference["loss"]] == [0, 1, 2, 3, 4, 5, 6, 9]
    assert reference["loss"][-3:] == [(5, 205.0), (6, 206.0), (9, 209.0)]
    _session(tmp_path, 0, [0, 3], 300.0)
    assert _read(tmp_path) == _accumulated(tmp_path)
    assert _read(tmp_path)["loss"] == [(0, 300.0), (3, 303.0)]  # step 0 logged again: the later value


def test_read_all_scalars_stops_at_a_torn_tail_as_tensorboard_does(tmp_path):
    _session(tmp_path, 0, range(0, 10), 0.0)
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    data = path.read_bytes()
    for cut in (3, 11, 40):  # inside the last record's CRC, inside it, into the one before
        path.write_bytes(data[:-cut])
        read = _read(tmp_path)
        assert read == _accumulated(tmp_path) and read["loss"][0] == (0, 0.0) and len(read["loss"]) < 10
    path.write_bytes(b"\xff" * 12 + b"not an event file")  # an absurd length: nothing read, no error
    assert read_all_scalars(tmp_path) == {}


def test_read_all_scalars_without_a_file_version_purges_out_of_order_steps_by_tag(tmp_path):
    # files of other writers may lack the version event: TensorBoard then drops a tag's points from the step
    # of a summary that goes back in time
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    (tmp_path / "tb").mkdir()
    with open(tmp_path / "tb" / "events.out.tfevents.1.host", "wb") as f:
        writer = RecordWriter(f)
        for step, tag, value in [(0, "a", 1.0), (1, "a", 2.0), (2, "b", 3.0), (3, "a", 4.0), (1, "a", 5.0)]:
            event = Event(step=step, summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)]))
            writer.write(event.SerializeToString())
        writer.flush()
    assert _read(tmp_path) == _accumulated(tmp_path) == {"a": [(0, 1.0), (1, 5.0)], "b": [(2, 3.0)]}


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
    past = io.StringIO()  # the last batch may pass the target: nothing is left, not an unknown time
    log = RunLogger(tmp_path / "past", {}, total=1000, unit="env steps", stream=past)
    log.progress(1200, force=True)
    log.close()
    assert "(120.0%)" in past.getvalue() and "ETA 0m00s" in past.getvalue()


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
