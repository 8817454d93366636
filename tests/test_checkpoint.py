"""Checkpoints: atomic writes, keep-previous, broken and mismatched files."""

import csv
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from rfwp_rl.checkpoint import (
    Checkpointer,
    atomic_torch_save,
    atomic_write_csv,
    csv_text,
    list_checkpoints,
    meta_differences,
    read_checkpoint,
    rng_state,
    set_rng_state,
)
from rfwp_rl.errors import UserError

META = {"trainer": "test", "core": "rdn", "num_actions": 6, "core_config": {"hidden_size": 16}}


def test_a_different_core_is_named_before_the_options_that_follow_from_it():
    """A one-line refusal shows three differences: the run's own values (``core``) come first, then the nested
    options (``agent.*`` would otherwise sort ahead of ``core``)."""
    saved = {"core": "lstm", "agent": {"a": 1, "b": 1, "c": 1}, "core_config": {"hidden_size": 8}}
    this = {"core": "ff", "agent": {"a": 2, "b": 2, "c": 2}, "core_config": {}}
    diffs = meta_differences(saved, this)
    assert diffs[0] == "core: checkpoint has 'lstm', this run has 'ff'" and len(diffs) == 5
    assert diffs[1:4] == [f"agent.{k}: checkpoint has 1, this run has 2" for k in "abc"]


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((3,), value)}, "counter": int(value)}


def test_save_keeps_newest_two_and_loads_newest(tmp_path):
    ck = Checkpointer(tmp_path, META)
    for step in (10, 20, 30):
        ck.save(_state(step), step)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_000000000030.pt", "ckpt_000000000020.pt"]
    got = ck.load_latest()
    assert got["step"] == 30 and got["state"]["counter"] == 30
    assert torch.equal(got["state"]["model"]["w"], torch.full((3,), 30.0))


def test_no_checkpoint_gives_none(tmp_path):
    assert Checkpointer(tmp_path / "new", META).load_latest() is None


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "foreign_pickle"])
def test_broken_newest_falls_back_to_previous(tmp_path, damage, capsys):
    ck = Checkpointer(tmp_path, META)
    ck.save(_state(1), 1)
    newest = ck.save(_state(2), 2)
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        newest.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        newest.write_bytes(b"")
    else:
        torch.save({"something": "else"}, newest)
    got = ck.load_latest()
    assert got["step"] == 1 and got["state"]["counter"] == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ckpt_000000000002.pt" in err[0] and "unreadable" in err[0]


def test_all_broken_names_the_files(tmp_path):
    ck = Checkpointer(tmp_path, META)
    for step in (1, 2):
        ck.save(_state(step), step).write_bytes(b"not a checkpoint")
    with pytest.raises(UserError) as e:
        ck.load_latest()
    msg = str(e.value)
    assert "\n" not in msg and "ckpt_000000000001.pt" in msg and "ckpt_000000000002.pt" in msg


def test_mismatched_meta_is_refused_naming_the_difference(tmp_path):
    Checkpointer(tmp_path, META).save(_state(1), 1)
    other = dict(META, core="lstm")
    with pytest.raises(UserError) as e:
        Checkpointer(tmp_path, other).load_latest()
    msg = str(e.value)
    assert "\n" not in msg and "core" in msg and "'rdn'" in msg and "'lstm'" in msg
    nested = dict(META, core_config={"hidden_size": 32})
    with pytest.raises(UserError, match=r"core_config\.hidden_size: checkpoint has 16, this run has 32"):
        Checkpointer(tmp_path, nested).load_latest()


def test_a_run_resumes_on_another_kernel_backend(tmp_path):
    # the backend chooses an implementation, not the numbers: it is not compared, so a checkpoint
    # made on any backend loads; any other difference is still refused
    Checkpointer(tmp_path, META).save(_state(1), 1)
    for backend in ("auto", "reference"):
        run = dict(META, core_config={"hidden_size": 16, "backend": backend})
        assert Checkpointer(tmp_path, run).load_latest()["step"] == 1
    with pytest.raises(UserError, match=r"core_config\.hidden_size: checkpoint has 16, this run has 8"):
        Checkpointer(tmp_path, dict(META, core_config={"hidden_size": 8, "backend": "auto"})).load_latest()


def test_a_run_resumes_with_other_initialisation_options(tmp_path):
    # the weights come from the checkpoint, so the init options are not compared on resume
    Checkpointer(tmp_path, dict(META, core="lstm")).save(_state(1), 1)
    for init in (
        {"forget_bias": None, "recurrent_init": "default"},
        {"forget_bias": 1.0, "recurrent_init": "orthogonal"},
    ):
        run = dict(META, core="lstm", core_config={"hidden_size": 16, **init})
        assert Checkpointer(tmp_path, run).load_latest()["step"] == 1
    with pytest.raises(UserError, match=r"core_config\.hidden_size: checkpoint has 16, this run has 8"):
        Checkpointer(
            tmp_path, dict(META, core="lstm", core_config={"hidden_size": 8, "forget_bias": 1.0})
        ).load_latest()


def test_snapshots_are_not_pruned(tmp_path):
    ck = Checkpointer(tmp_path, META)
    snap = ck.snapshot(_state(5), 5)
    for step in (10, 20, 30):
        ck.save(_state(step), step)
    assert snap.exists() and read_checkpoint(snap)["step"] == 5


def test_failed_write_leaves_old_file_and_no_temp(tmp_path):
    path = tmp_path / "x.pt"
    atomic_torch_save({"a": 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        atomic_torch_save({"a": Unpicklable()}, path)
    assert torch.load(path) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.pt"]


def test_kill_during_writes_never_leaves_a_partial_checkpoint(tmp_path):
    """A writer killed with SIGKILL mid-stream leaves only complete, loadable checkpoints."""
    script = textwrap.dedent(f"""
        import torch
        from rfwp_rl.checkpoint import Checkpointer
        ck = Checkpointer({str(tmp_path)!r}, {META!r})
        step = 0
        while True:
            step += 1
            ck.save({{"model": {{"w": torch.full((200_000,), float(step))}}}}, step)
            print(step, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    for _ in range(5):  # let it write a few
        proc.stdout.readline()
    proc.kill()
    proc.wait()
    files = list_checkpoints(tmp_path)
    assert files, "at least one checkpoint was written"
    for path in files:
        obj = read_checkpoint(path)
        step = obj["step"]
        assert torch.equal(obj["state"]["model"]["w"], torch.full((200_000,), float(step)))
    got = Checkpointer(tmp_path, META).load_latest()
    assert got["step"] == read_checkpoint(files[0])["step"]


def test_a_checkpoint_of_another_format_is_refused_in_one_line_and_kept(tmp_path):
    path = Checkpointer(tmp_path, META).save(_state(1), 1)
    obj = read_checkpoint(path)
    atomic_torch_save({**obj, "format": 0}, path)
    with pytest.raises(UserError) as e:
        Checkpointer(tmp_path, META).load_latest()
    assert str(e.value) == f"checkpoint {path} has format 0; this version of rfwp_rl reads format 1 only"
    assert list_checkpoints(tmp_path) == [path]  # refused, not set aside as damaged


def test_rng_state_round_trip():
    import random

    import numpy as np

    s = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(s)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_a_run_dir_that_is_a_file_or_cannot_be_made_is_a_one_line_error(tmp_path):
    from rfwp_rl.checkpoint import lock_run_dir

    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file, not a directory; pass another --run-dir"):
        lock_run_dir(tmp_path / "file")
    with pytest.raises(UserError, match="cannot be made"):
        lock_run_dir(tmp_path / "file" / "run")


def test_run_dir_lock_refuses_a_second_trainer(tmp_path):
    from rfwp_rl.checkpoint import lock_run_dir

    held = lock_run_dir(tmp_path)
    script = f"from rfwp_rl.checkpoint import lock_run_dir; lock_run_dir({str(tmp_path)!r})"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode != 0 and "is in use by pid" in proc.stderr and str(os.getpid()) in proc.stderr
    held.close()
    assert subprocess.run([sys.executable, "-c", script]).returncode == 0


def test_csv_text_columns_formats_and_quoting():
    rows = [{"core": "lstm", "score": 0.123456789, "note": "a,b"}, {"core": "rdn", "seeds": 3, "score": None}]
    assert csv_text(rows, float_format=".3f").splitlines() == [
        "core,score,note,seeds",  # every key, in the order first seen
        'lstm,0.123,"a,b",',  # a comma quoted, a missing key empty
        "rdn,,,3",  # None empty, an int as it is
    ]
    assert csv_text(rows, ["seeds", "core"]).splitlines() == ["seeds,core", ",lstm", "3,rdn"]  # others left out
    assert csv_text([{"x": np.float32(0.5), "y": True}]).splitlines() == ["x,y", "0.5,True"]
    assert csv_text([]) == ""


def test_atomic_writes_give_the_permissions_open_gives(tmp_path):
    import stat

    with open(tmp_path / "plain.txt", "w") as f:
        f.write("x")
    atomic_write_csv(tmp_path / "atomic.csv", [{"a": 1}])
    plain = stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode)  # 0o644 under the usual umask
    assert stat.S_IMODE((tmp_path / "atomic.csv").stat().st_mode) == plain  # not the temp file's 0o600


def test_an_atomic_write_that_cannot_happen_is_one_line_and_leaves_nothing(tmp_path):
    (tmp_path / "file").write_text("x")
    blocked = f"cannot write {tmp_path}/file/a/b.csv: {tmp_path}/file is a file, not a folder"
    with pytest.raises(UserError, match=f"^{re.escape(blocked)}$"):
        atomic_write_csv(tmp_path / "file" / "a" / "b.csv", [{"a": 1}])
    (tmp_path / "folder").mkdir()
    with pytest.raises(UserError, match=f"^{re.escape(f'cannot write {tmp_path}/folder: it is a folder')}$"):
        atomic_write_csv(tmp_path / "folder", [{"a": 1}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"] and not any((tmp_path / "folder").iterdir())


def test_atomic_write_csv_reads_back(tmp_path):
    path = tmp_path / "sub" / "table.csv"
    atomic_write_csv(path, [{"a": 1.5, "b": "x"}, {"a": 2.0, "b": "y"}], float_format=".2f")
    with path.open(newline="") as f:
        assert list(csv.DictReader(f)) == [{"a": "1.50", "b": "x"}, {"a": "2.00", "b": "y"}]
    assert [p.name for p in path.parent.iterdir()] == ["table.csv"]  # no temporary file left
