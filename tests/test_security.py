"""Attacks on the learner's network endpoints, its learner group and its checkpoint files.

What is shown: a peer without the shared key reaches no endpoint, and a pickle whose unpickling
would write a file is never unpickled (not even from a key holder); malformed rollouts and group
rounds are refused, counted and logged while the learner trains on; a checkpoint holding a pickled
object is refused by eval and resume in one line, running nothing. Network tests bind 127.0.0.1 only.
"""

from __future__ import annotations

import hmac
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from procs import MOOLIB_EXIT, free_port, script_result  # tests/procs.py
from rfwp_rl import cli
from rfwp_rl.checkpoint import (
    Checkpointer,
    UnsafeCheckpoint,
    list_checkpoints,
    read_checkpoint,
    rng_state,
    set_rng_state,
)
from rfwp_rl.impala.actors import rollout_spec
from rfwp_rl.impala.rollout_check import MAX_ABS_REWARD, RolloutCheck, reward_bounds
from rfwp_rl.impala.wire import RefusalLog, Refused, check_plain, handler, read_key_file, resolve_key

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
DEADLINE = 300  # s: only ever a failure deadline (a slow or busy machine just takes longer)
TINY = ["--env", "CartPole-v1", "--core", "lstm", "--set", "core_config.hidden_size=16"]


class Evil:
    """Unpickling this runs ``open(path, "w")``: a file appears if anything unpickles it."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _env(**extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


# ------------------------------------------------------------------ key and payload rules


def test_key_file_must_be_private_and_is_created_once_without_showing_the_key(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RFWP_AUTH_KEY", raising=False)
    monkeypatch.setenv("RFWP_AUTH_KEY_FILE", str(tmp_path / "cfg" / "auth.key"))
    key = resolve_key(None, create=True, role="a learner")
    assert len(key) == 64 and (tmp_path / "cfg" / "auth.key").stat().st_mode & 0o777 == 0o600
    err = capsys.readouterr().err
    assert f"created a new auth key in {tmp_path / 'cfg' / 'auth.key'} (mode 600)" in err and key not in err
    assert resolve_key(None, create=True, role="a learner") == key
    assert capsys.readouterr().err == ""
    (tmp_path / "cfg" / "auth.key").chmod(0o644)
    with pytest.raises(Exception, match="accessible by other users .*chmod 600"):
        read_key_file(tmp_path / "cfg" / "auth.key")
    monkeypatch.setenv("RFWP_AUTH_KEY_FILE", str(tmp_path / "none.key"))
    with pytest.raises(Exception, match="an actor needs the shared auth key"):
        resolve_key(None, create=False, role="an actor")


@pytest.mark.parametrize(
    "key, ok",
    [
        ("0123456789abcdef" * 2, True),  # 32 hex digits: 128 bits
        ("0123456789abcdef" * 2 + "0123456789ABCDEF" * 2, True),
        ("0123456789abcdef" * 2 + "=", True),  # base64 (with padding): 32 characters, 192 bits
        ("0123456789abcde" * 2 + "a", False),  # 31 hex digits: 124 bits
        ("abcdefghijklmnopqrstuv", True),  # 22 base64 characters: 132 bits
        ("abcdefghij-_+/KLMNOPQ==", False),  # 21 base64 characters (padding not counted): 126 bits
        ("abc!@#$%^&*()[]{};:,.", True),  # 21 printable ASCII characters
        ("abc!@#$%^&*()[]{};:", False),  # 19 printable ASCII characters: 125 bits
        ("abcdefghijklmnop", False),  # 16 printable characters, the old minimum
        ("schlüssel-" * 5, False),  # not ASCII
    ],
)
def test_a_key_needs_128_bits_measured_by_its_alphabet_and_length(key, ok, monkeypatch):
    from rfwp_rl.impala.wire import check_key

    monkeypatch.setenv("RFWP_AUTH_KEY", key)
    if ok:
        assert check_key(key, "test") == key and resolve_key(None, create=False, role="an actor") == key
    else:
        with pytest.raises(Exception) as e:
            resolve_key(None, create=False, role="an actor")
        message = str(e.value)
        assert message.startswith("the auth key in $RFWP_AUTH_KEY ") and key not in message
        assert message.endswith(
            "allowed: at least 128 bits of entropy (32+ hex digits, 22+ base64 characters, 20+ printable ASCII "
            "characters); make one with: rfwp-rl keygen"
        ), message


def test_key_and_lock_files_are_never_opened_through_a_symbolic_link(tmp_path, monkeypatch):
    from rfwp_rl.checkpoint import lock_run_dir
    from rfwp_rl.errors import UserError

    monkeypatch.delenv("RFWP_AUTH_KEY", raising=False)
    real = tmp_path / "real.key"
    real.write_text("0123456789abcdef" * 4 + "\n")
    real.chmod(0o600)
    link = tmp_path / "link.key"
    link.symlink_to(real)
    with pytest.raises(UserError, match=f"auth key file {link} is a symbolic link; allowed: a regular file"):
        read_key_file(link)
    monkeypatch.setenv("RFWP_AUTH_KEY_FILE", str(tmp_path / "cfg" / "auth.key"))
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "auth.key").symlink_to(tmp_path / "planted.key")  # dangling: creating would write there
    with pytest.raises(UserError, match="is a symbolic link"):
        resolve_key(None, create=True, role="a learner")
    assert not (tmp_path / "planted.key").exists()
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is not a regular file"):  # and does not block
        read_key_file(fifo)

    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (run / ".lock").symlink_to(victim)
    with pytest.raises(UserError, match=f"lock file {run / '.lock'} is a symbolic link"):
        lock_run_dir(run)
    assert victim.read_text() == "precious\n"
    (run / ".lock").unlink()
    lock = lock_run_dir(run)
    assert (run / ".lock").read_text() == f"{os.getpid()}\n" and (run / ".lock").stat().st_mode & 0o777 == 0o600
    lock.close()


def test_keygen_prints_a_key_on_stdout_only_or_writes_a_new_private_file(tmp_path, capsys):
    assert cli.main(["keygen"]) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    assert err == "" and len(key) == 64 and int(key, 16) >= 0
    assert cli.main(["keygen"]) == 0 and capsys.readouterr().out.strip() != key
    path = tmp_path / "new" / "auth.key"
    assert cli.main(["keygen", "--auth-key-file", str(path)]) == 0
    out, err = capsys.readouterr()
    written = path.read_text().strip()
    assert written not in out + err and str(path) in out
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert read_key_file(path) == written
    for existing in (path, tmp_path / "dangling.key"):
        if existing != path:
            existing.symlink_to(tmp_path / "elsewhere.key")
        assert cli.main(["keygen", "--auth-key-file", str(existing)]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"error: --auth-key-file {existing} exists; allowed: a path where nothing is (a key file is never "
            "replaced: remove it first, then copy the new key to every machine)"
        ]
    assert path.read_text().strip() == written and not (tmp_path / "elsewhere.key").exists()


def test_only_plain_data_passes_and_handlers_never_raise():
    check_plain({"a": [1, 2.5, "x", None, True, (torch.zeros(2),)]})
    for bad in ({"a": Evil("/nonexistent")}, {1: "int key"}, {"a": np.zeros(2)}, [[[]]] * 1 + ["x" * 70000]):
        with pytest.raises(Refused):
            check_plain(bad)
    refusals = RefusalLog("test")

    def boom(x):
        raise Refused(f"bad {x}")

    def returns_object():
        return {"x": object()}

    assert handler(boom, refusals)(1) == {"error": "refused: bad 1"}
    assert handler(returns_object, refusals)()["error"].startswith("could not handle returns_object")
    assert refusals.count == 2


# ------------------------------------------------------------------ rollouts


@pytest.fixture(scope="module")
def rollout_check():
    import argparse

    from rfwp_rl.impala.config import trainer_keys
    from rfwp_rl.impala.run_spec import RunSpec, add_run_arguments

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    spec = RunSpec.from_args(parser.parse_args(TINY), trainer_keys())
    agent = spec.build_agent()
    layout = rollout_spec(agent.obs_space, agent.action_dist)
    states = [(tuple(s.shape[1:]), s.dtype) for s in agent.initial_state(1)]
    return RolloutCheck(layout, states, unroll_length=5, max_envs=8, actions_ok=agent.action_dist.valid), layout, agent


def _rollout(layout, agent, b: int = 2) -> tuple[dict, tuple]:
    data = {k: torch.zeros((6, b, *shape), dtype=dtype) for k, (dtype, shape) in layout.items()}
    return data, tuple(s.repeat(b, *[1] * (s.dim() - 1)) for s in agent.initial_state(1))


def test_rollout_layout_is_what_a_local_actor_stores(rollout_check):
    _, layout, _ = rollout_check
    assert layout == {
        "obs": (torch.float32, (4,)),
        "reward": (torch.float32, ()),
        "done": (torch.bool, ()),
        "truncated": (torch.bool, ()),
        "prev_action": (torch.int64, ()),
        "action": (torch.int64, ()),
        "behaviour_log_prob": (torch.float32, ()),
    }


@pytest.mark.parametrize(
    "attack, message",
    [
        (lambda d: d.update(action=d["action"].to(torch.int32)), "action is .* torch.int32; the learner needs"),
        (lambda d: d["action"].fill_(2), "action holds actions outside the action space .*0..1"),
        (lambda d: d["prev_action"].fill_(-1), "prev_action holds actions outside"),
        (lambda d: d["reward"].fill_(float("nan")), "reward holds NaN or inf"),
        (lambda d: d.update(obs=torch.zeros(6, 2, 5)), r"obs is \[6, 2, 5\]"),
        (lambda d: d.update(obs=torch.zeros(7, 2, 4)), r"obs is \[7, 2, 4\]"),
        (lambda d: d.pop("truncated"), "rollout keys must be"),
        (lambda d: d.update(extra=torch.zeros(6, 2)), "rollout keys must be"),
    ],
)
def test_malformed_rollouts_are_refused(rollout_check, attack, message):
    check, layout, agent = rollout_check
    data, state = _rollout(layout, agent)
    assert check.envs(data, state) == 2
    attack(data)
    with pytest.raises(Refused, match=message):
        check.envs(data, state)


def test_oversize_rollouts_bad_states_and_episodes_are_refused(rollout_check):
    check, layout, agent = rollout_check
    with pytest.raises(Refused, match="rollout has 9 envs; allowed: 1..8"):
        check.envs(*_rollout(layout, agent, b=9))
    data, state = _rollout(layout, agent)
    with pytest.raises(Refused, match="core state 0 must be"):
        check.envs(data, (state[0][:1], *state[1:]))
    assert check.episodes([(1.5, 10), [2, 3]], 2) == [(1.5, 10), (2.0, 3)]
    for bad, message in [
        ([(float("nan"), 3)], "return must be a finite number"),
        ([(1.0, -1)], "length must be"),
        ([(1.0, 2)] * 49, "at most 48"),
        ([(1.0,)], "pair"),
    ]:
        with pytest.raises(Refused, match=message):
            check.episodes(bad, 2)


def test_rewards_beyond_the_envs_declared_range_or_the_limit_are_refused(rollout_check):
    _, layout, agent = rollout_check
    assert reward_bounds(None) == (-MAX_ABS_REWARD, MAX_ABS_REWARD)
    assert reward_bounds((-1.0, 1.0)) == (-1.0, 1.0)
    assert reward_bounds((1.0, 2.0)) == (0.0, 2.0)  # a pool's blank and reset entries hold reward 0
    assert reward_bounds((float("-inf"), 5.0)) == (-MAX_ABS_REWARD, 5.0)
    unbounded = RolloutCheck(
        layout, [(tuple(s.shape[1:]), s.dtype) for s in agent.initial_state(1)], 5, 8, agent.action_dist.valid
    )
    clipped = RolloutCheck(
        layout, [(tuple(s.shape[1:]), s.dtype) for s in agent.initial_state(1)], 5, 8, agent.action_dist.valid, (-1, 1)
    )
    data, state = _rollout(layout, agent)
    data["reward"][3, 1] = 2.0
    assert unbounded.envs(data, state) == 2
    with pytest.raises(Refused, match=r"rollout reward holds values outside \[-1, 1\] \(from 0 to 2\)"):
        clipped.envs(data, state)
    data["reward"][3, 1] = -2 * MAX_ABS_REWARD
    with pytest.raises(Refused, match=r"rollout reward holds values outside \[-1e\+09, 1e\+09\]"):
        unbounded.envs(data, state)


def test_an_envs_declared_reward_range_reaches_the_run_spec():
    import gymnasium

    from rfwp_rl.envs import declared_reward_range, env_spec

    class Declares(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,))
        action_space = gymnasium.spaces.Discrete(2)
        reward_range = (-1, 1)

    if "rfwp_test/DeclaredRewards-v0" not in gymnasium.registry:
        gymnasium.register("rfwp_test/DeclaredRewards-v0", entry_point=Declares)
    assert env_spec("rfwp_test/DeclaredRewards-v0").reward_range == (-1.0, 1.0)
    assert env_spec("CartPole-v1").reward_range is None  # gymnasium 1.x envs declare none
    for bad in [(5, 1), "ab", 3, (1,)]:
        Declares.reward_range = bad
        assert declared_reward_range(Declares()) is None


def test_the_table_of_actor_names_is_bounded_and_forgets_the_oldest_first():
    from rfwp_rl.impala.rollout_server import MAX_ACTORS_SEEN, SeenActors

    assert SeenActors().limit == MAX_ACTORS_SEEN
    seen = SeenActors(limit=3)
    for i, name in enumerate(["a", "b", "c"]):
        seen.touch(name, now=float(i), finished=name == "a")
    seen.touch("a", now=3.0, finished=False)  # a calls again: b is now the oldest
    for i in range(100):  # a key holder calling with ever new names
        seen.touch(f"flood{i}", now=4.0 + i, finished=True)
    assert len(seen) == 3
    assert seen.active(now=104.0, within=3.5) == 3
    assert seen.not_told(now=104.0, within=1000.0) == []  # a was forgotten with its "told" mark
    seen.touch("a", now=105.0, finished=False)
    assert seen.not_told(now=105.0, within=1000.0) == ["a"] and len(seen) == 3


# ------------------------------------------------------------------ the learner's endpoints, end to end

ATTACKER = textwrap.dedent("""
    import json, sys, time, moolib, torch
    key, port, marker = sys.argv[1], sys.argv[2], sys.argv[3]
    holder = len(sys.argv) > 4  # a key holder, with the rollout layout: its calls are answered

    class Evil:
        def __reduce__(self):
            return (open, (marker, "w"))

    if key != "-":
        moolib.set_auth_key(key)
    moolib.set_listen_hosts(["127.0.0.1"])
    rpc = moolib.Rpc(); rpc.set_name("attacker")
    rpc.set_timeout(60 if holder else 2)  # without the key nothing is ever answered: a call can only time out
    rpc.connect("127.0.0.1:" + port)
    out = {}
    def call(label, fn, *args):
        try:
            out[label] = rpc.sync("learner", fn, *args)
        except RuntimeError as e:
            out[label] = "RuntimeError: " + str(e).splitlines()[0]
    calls = [("hello", (Evil(), {"x": Evil()})), ("get_weights", (Evil(), Evil())),
             ("put_rollout", ("a", None, 0, {"obs": Evil()}, (Evil(),), [Evil()]))]
    futures = {fn: rpc.async_("learner", fn, *args) for fn, args in calls}  # at once: one timeout in all
    for fn, future in futures.items():
        try:
            out[fn] = future.result()
        except RuntimeError as e:
            out[fn] = "RuntimeError: " + str(e).splitlines()[0]
    if holder:  # a key holder's malformed rollouts
        from rfwp_rl.impala.run_spec import RunSpec
        layout = json.loads(sys.argv[4])
        for attack in ("dtype", "action", "nan", "oversize"):
            b = 64 if attack == "oversize" else 2
            data = {k: torch.zeros([6, b, *shape], dtype=getattr(torch, dtype)) for k, (dtype, shape) in layout.items()}
            if attack == "dtype":
                data["obs"] = data["obs"].double()
            elif attack == "action":
                data["action"].fill_(7)
            elif attack == "nan":
                data["reward"][2, 1] = float("nan")
            state = (torch.zeros(b, 16), torch.zeros(b, 16))
            call(attack, "put_rollout", "a", None, 0, data, state, [])
        call("hello_ok", "hello", "attacker", {"protocol": 1})
    elif key != "-":  # a wrong key: the learner's proof is refused here too (when its greeting came)
        deadline = time.monotonic() + 120
        while moolib.auth_refusals() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    out["refused_connections"] = moolib.auth_refusals()
    print(json.dumps(out))
""")


@pytest.mark.moolib
@pytest.mark.slow
def test_learner_endpoints_refuse_peers_without_the_key_and_pickles_and_bad_rollouts(tmp_path):
    port = free_port()
    key_file = tmp_path / "auth.key"
    env = _env(RFWP_AUTH_KEY_FILE=str(key_file))
    env.pop("RFWP_AUTH_KEY", None)
    learner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rfwp_rl",
            "train",
            *TINY,
            "--run-dir",
            str(tmp_path / "run"),
            "--listen",
            f"127.0.0.1:{port}",
            "--num-actors",
            "2",
            "--num-env-processes",
            "1",
            "--unroll-length",
            "5",
            "--batch-size",
            "2",
            "--total-steps",
            "200000",
            "--log-every",
            "0.5",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in learner.stdout), daemon=True).start()

    def wait_for(text: str, since: int = 0) -> None:
        """Until a line from ``since`` on holds ``text`` (the learner still running)."""
        deadline = time.monotonic() + DEADLINE
        while not any(text in line for line in lines[since:]):
            assert learner.poll() is None and time.monotonic() < deadline, f"no {text!r}:\n" + "\n".join(lines)
            time.sleep(0.05)

    try:
        wait_for("listening for remote actors")
        assert key_file.exists(), "\n".join(lines)
        key = key_file.read_text().strip()
        layout = {
            "obs": ["float32", [4]],
            "reward": ["float32", []],
            "done": ["bool", []],
            "truncated": ["bool", []],
            "prev_action": ["int64", []],
            "action": ["int64", []],
            "behaviour_log_prob": ["float32", []],
        }
        marker = tmp_path / "pwned"

        def attack(attacker_key: str, *extra: str) -> dict:
            argv = [sys.executable, "-c", ATTACKER + MOOLIB_EXIT, attacker_key, str(port), str(marker), *extra]
            return script_result(argv, env=_env(RFWP_MOOLIB_SEND_PICKLES_FOR_TESTS="1"), cwd=REPO, timeout=DEADLINE)

        for attacker_key in ("-", "wrong-key-0123456789abcdef"):  # no key, a wrong key: no endpoint answers
            out = attack(attacker_key)
            assert all(
                out[k].startswith("RuntimeError") and "timed out" in out[k]
                for k in ("hello", "get_weights", "put_rollout")
            ), out
        assert out["refused_connections"] >= 1  # the attacker refused the learner's proof too
        out = attack(key, json.dumps(layout))  # the right key: answered, but no pickle is ever unpickled
        for k in ("hello", "get_weights", "put_rollout"):
            assert "refused a pickled Python object" in str(out[k]), out
        assert out["dtype"]["error"].startswith("refused: rollout obs is [6, 2, 4] torch.float64"), out
        assert "outside the action space" in out["action"]["error"], out
        assert "reward holds NaN" in out["nan"]["error"], out
        assert "rollout has 64 envs; allowed: 1..4" in out["oversize"]["error"], out
        assert "does not match the learner's" in out["hello_ok"]["error"], out  # a key holder is answered
        assert not marker.exists()
        wait_for("env_sps", since=len(lines))  # a progress line after the attacks: still training
        wait_for("refused a message")
        wait_for("connection(s) without the shared key refused")
        assert key not in "\n".join(lines[1:])  # the key is shown once, when made
    finally:
        learner.kill()
        learner.wait(timeout=30)


# ------------------------------------------------------------------ a learner group member's attacks


@pytest.mark.moolib
@pytest.mark.slow
def test_group_refuses_nan_gradients_impossible_step_counts_and_counters_past_the_target(tmp_path):
    script = textwrap.dedent(f"""
        import json, threading, time, torch, moolib
        from rfwp_rl.impala.learner import Gradients
        from rfwp_rl.impala.multi_learner import LearnerGroup
        from rfwp_rl.impala.net import free_port

        moolib.set_auth_key("group-test-key-0123456789")
        moolib.set_listen_hosts(["127.0.0.1"])

        class Learner:
            def __init__(self, w, steps, counters):
                self.w, self.steps, self.lock, self.steps_per_update = w, steps, threading.Lock(), S
                self.counters, self.loaded = counters, []
            updates = property(lambda self: self.counters["updates"])
            def parameters(self):
                return [self.w]
            def buffers(self):
                return []
            def apply(self, step):
                self.steps.append((step.env_steps, step.gradients))
            def shared_state(self):
                return {{"counters": dict(self.counters)}}
            def load_shared_state(self, state):
                self.loaded.append(state)

        broker_rpc = moolib.Rpc(); broker_rpc.set_name("broker")
        port = free_port()  # taken here, just before the broker listens on it
        broker = moolib.Broker(broker_rpc); broker_rpc.listen(f"127.0.0.1:{{port}}")
        S, TOTAL = 3, 1000
        learners = []
        # learner 0 leads (more updates) and hands over counters past --total-steps
        for i, counters in enumerate([{{"step": 10**9, "updates": 50}}, {{"step": 0, "updates": 0}}]):
            w = torch.nn.Parameter(torch.zeros(2))
            steps = []
            l = Learner(w, steps, counters)
            group = LearnerGroup(f"127.0.0.1:{{port}}", "t/w", l, {{"x": 1}}, seed=i, total_steps=TOTAL)
            learners.append(dict(w=w, group=group, steps=steps, l=l))
        def ready(l):  # in the group with the other (learner 1: has refused the leader's state)
            g = l["group"]
            with g._lock:
                joined = g.acc is not None and g.acc.connected() and g.size == 2 and not g.acc.has_new_state()
            return joined and (l is learners[0] or g.refusals.count >= 1)

        # round 1: learner 1 hands in NaN gradients; round 2: learner 1 claims 10**6 env steps
        plan = [(None, (float("nan"), S)), (None, (1.0, 10**6))]
        deadline, rnd = time.monotonic() + {DEADLINE - 60}, 0
        started = False  # the plan starts once both learners are in the group, whichever joined first
        while time.monotonic() < deadline and rnd < len(plan):
            broker.update()
            for l in learners:
                l["group"].sync()
            started = started or all(ready(l) for l in learners)
            for i, l in enumerate(learners):
                g = plan[rnd][i] if started else None
                if g is not None and l["group"].wants_gradients() and not l.get("handed"):
                    l["w"].grad.fill_(g[0])
                    l["group"].hand_in(Gradients(True, g[1], {{}}))
                    l["handed"] = True
                l["group"].idle()
            if all(len(l["steps"]) > rnd for l in learners):
                rnd += 1
                for l in learners:
                    l["handed"] = False
            time.sleep(0.005)
        def status(g):  # what a failure message needs: how far each learner got into the group
            acc = g.acc
            if acc is None:
                return {{"accumulator": False, "members": len(g.group.members())}}
            return {{"connected": acc.connected(), "size": g.size, "leader": acc.get_leader() == g.name,
                     "new_state": acc.has_new_state(), "version": acc.model_version(), "round": rnd,
                     "started": started}}
        print(json.dumps({{"steps": [l["steps"] for l in learners], "loaded": [len(l["l"].loaded) for l in learners],
                          "refused": [l["group"].refusals.count for l in learners],
                          "status": [status(l["group"]) for l in learners]}}))
        for l in learners:
            l["group"].close()
    """)
    lines: list[str] = []
    out = script_result(
        [sys.executable, "-c", script + MOOLIB_EXIT], env=_env(), cwd=REPO, timeout=DEADLINE, lines=lines
    )
    output = "".join(lines)
    # both rounds are only counted on both learners: no optimizer step, no env steps
    assert out["steps"] == [[[0, 0], [0, 0]], [[0, 0], [0, 0]]], out
    assert out["loaded"][1] == 0  # the leader's counters past the target were not adopted
    assert out["refused"][0] >= 2 and out["refused"][1] >= 3, out
    assert "refused a message: the leader's state: shared step counter must be an integer in [0, 1006]" in output
    assert "a round: the reduced gradients hold NaN or inf values" in output, output  # later lines: rate-limited


@pytest.mark.moolib
def test_moolib_hmac_is_hmac_sha256():
    import moolib

    for key, message in [(b"k", b""), (b"key" * 30, b"m" * 200), (b"x" * 64, b"y" * 55)]:
        assert moolib.hmac_sha256(key, message) == hmac.new(key, message, "sha256").digest()


# ------------------------------------------------------------------ torch


@pytest.mark.parametrize(
    "version, ok",
    [
        ("2.5.1", False),
        ("2.6.0rc1", False),
        ("2.6.0a0+gitabc", False),
        ("1.13.1", False),
        ("nonsense", False),
        ("2.6.0", True),
        ("2.6.1rc1", True),
        ("2.13.0+cpu", True),
    ],
)
def test_torch_older_than_2_6_is_refused(version, ok):
    from rfwp_rl import torch_problem

    problem = torch_problem(version)
    assert (problem is None) == ok, problem
    if not ok:
        assert problem.startswith("rfwp_rl needs torch >= 2.6 (torch.load(weights_only=True) is unsafe before 2.6")
        assert f"this is torch {version!r}: pip install --upgrade 'torch>=2.6,<3'" in problem
    assert torch_problem() is None  # the torch these tests run on


def test_the_package_requires_torch_2_6():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    from rfwp_rl import MIN_TORCH

    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch>={'.'.join(map(str, MIN_TORCH))},<3" in dependencies


def test_an_older_torch_stops_the_import_the_cli_and_the_setup_in_one_line(tmp_path):
    old = tmp_path / "old" / "torch-2.5.1.dist-info"  # what importlib.metadata finds first on the path
    old.mkdir(parents=True)
    (old / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.5.1\n")
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(old.parent), env["PYTHONPATH"]])
    expected = "rfwp_rl needs torch >= 2.6 (torch.load(weights_only=True) is unsafe before 2.6, CVE-2025-32434); "
    run = lambda *argv: subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=DEADLINE)
    imported = run(sys.executable, "-c", "import rfwp_rl")
    assert imported.returncode == 1 and imported.stderr.strip().splitlines()[-1].startswith(f"ImportError: {expected}")
    cli_run = run(sys.executable, "-c", "import sys; sys.argv[0] = '/usr/bin/rfwp-rl'; from rfwp_rl.cli import main")
    assert cli_run.returncode == 2 and cli_run.stderr.splitlines() == [
        f"error: {expected}this is torch '2.5.1': pip install --upgrade 'torch>=2.6,<3'"
    ], cli_run.stderr
    setup = run("bash", str(REPO / "scripts" / "setup.sh"))
    assert setup.returncode == 1 and setup.stderr.splitlines() == [
        f"[setup] error: {expected}this is torch '2.5.1': pip install --upgrade 'torch>=2.6,<3'"
    ], setup.stderr
    assert "[setup] moolib" not in setup.stdout  # nothing built or installed


# ------------------------------------------------------------------ checkpoints


def _evil_checkpoint(path: Path, marker: Path) -> None:
    meta = {"trainer": "impala", "env": "CartPole-v1", "core": "lstm", "num_actions": 2, "obs_shape": [4]}
    torch.save({"format": 1, "meta": meta, "step": 5, "state": {"agent": {}, "x": Evil(str(marker))}}, path)


def test_eval_and_resume_refuse_a_checkpoint_holding_a_pickle(tmp_path, capsys):
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    run.mkdir()
    _evil_checkpoint(run / "ckpt_000000000005.pt", marker)
    assert cli.main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: checkpoint {run / 'ckpt_000000000005.pt'} holds a Python "
        "object (io.open) that loading would have to execute"
    ), err
    assert (
        cli.main(
            [
                "train",
                *TINY,
                "--run-dir",
                str(run),
                "--num-actors",
                "2",
                "--env-backend",
                "local",
                "--total-steps",
                "100",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trust-checkpoint" in err[0], err
    assert not marker.exists()
    assert list_checkpoints(run) == [run / "ckpt_000000000005.pt"]  # refused, not treated as damaged


def test_eval_imports_a_checkpoints_env_module_only_when_named(tmp_path, capsys, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_envs.py").write_text(f"open({str(marker)!r}, 'w')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    meta = {"trainer": "impala", "env": "evil_envs:Foo-v0", "core": "lstm", "num_actions": 2, "obs_shape": [4]}
    torch.save({"format": 1, "meta": meta, "step": 5, "state": {"agent": {}}}, tmp_path / "ckpt_000000000005.pt")
    assert cli.main(["eval", str(tmp_path / "ckpt_000000000005.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: checkpoint {tmp_path / 'ckpt_000000000005.pt'} was trained on env 'evil_envs:Foo-v0'; "
        "evaluating it imports the Python module 'evil_envs', which runs its code: pass --env "
        "evil_envs:Foo-v0 to confirm"
    ]
    assert not marker.exists()


@pytest.mark.parametrize("command", ["eval", "probe"])
def test_a_run_directorys_env_file_or_module_is_never_imported_unless_named(tmp_path, capsys, monkeypatch, command):
    marker = tmp_path / "imported"
    run = tmp_path / "downloaded_run"
    run.mkdir()
    (run / "rfwp_rl.x.py").write_text(f"open({str(marker)!r}, 'w')\n")  # shipped with the run, named like ours
    monkeypatch.chdir(run)  # rfwp-rl eval .
    for env in ("rfwp_rl.x.py:CartPole-v1", "rfwp_rl.memory.suite:CartPole-v1"):
        meta = {"trainer": "impala", "env": env, "core": "lstm", "num_actions": 2, "obs_shape": [4]}
        torch.save({"format": 1, "meta": meta, "step": 5, "state": {"agent": {}}}, run / "ckpt_000000000005.pt")
        for named in ([], ["--env", "CartPole-v1"], ["--env", "other.py:CartPole-v1"]):
            assert cli.main([command, ".", *named]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            what = (
                "file 'rfwp_rl.x.py' (a relative path is read from the working directory)"
                if env.endswith(".py:CartPole-v1")
                else "module 'rfwp_rl.memory.suite'"
            )
            assert err == [
                f"error: checkpoint ckpt_000000000005.pt was trained on env {env!r}; evaluating it imports the "
                f"Python {what}, which runs its code: pass --env {env} to confirm"
            ], (named, err)
            assert not marker.exists()
    # named on the command line (here by its absolute path): past the check, to the checkpoint's next problem
    meta = {"trainer": "impala", "env": "rfwp_rl.x.py:CartPole-v1", "core": "lstm", "num_actions": 2}
    torch.save({"format": 1, "meta": meta, "step": 5, "state": {"agent": {}}}, run / "ckpt_000000000005.pt")
    assert cli.main([command, ".", "--env", f"{run / 'rfwp_rl.x.py'}:CartPole-v1"]) == 2
    err = capsys.readouterr().err
    assert "lacks meta" in err and "runs its code" not in err, err


def test_same_env_module_compares_files_by_path_and_modules_by_name(tmp_path, monkeypatch):
    from rfwp_rl.impala.evaluate import same_env_module

    monkeypatch.chdir(tmp_path)
    assert same_env_module("envs.py", str(tmp_path / "envs.py"))
    assert same_env_module("./envs.py", "envs.py")
    assert not same_env_module("other.py", "envs.py")
    assert not same_env_module("", "envs.py")
    assert same_env_module("pkg.envs", "pkg.envs")
    assert not same_env_module("pkg.envs", "pkg.other")
    assert not same_env_module("envs", "envs.py")


def test_checkpoints_holding_objects_load_only_when_trusted_and_rng_state_is_plain(tmp_path):
    old = tmp_path / "old.pt"
    torch.save({"format": 1, "meta": {}, "step": 1, "state": {"rng": {"numpy": np.random.get_state()}}}, old)
    with pytest.raises(UnsafeCheckpoint, match="numpy"):
        read_checkpoint(old)
    assert read_checkpoint(old, trust=True)["step"] == 1
    np.random.seed(3)
    state = rng_state()
    torch.save({"rng": state}, tmp_path / "new.pt")
    loaded = torch.load(tmp_path / "new.pt", weights_only=True)["rng"]
    expected = np.random.rand(3)
    set_rng_state(loaded)
    assert np.array_equal(np.random.rand(3), expected)


def test_pruning_keeps_the_newest_readable_checkpoint(tmp_path, capsys):
    ck = Checkpointer(tmp_path, {"m": 1}, keep=2)
    for step in (10, 20):
        ck.save({"counter": step}, step)
    (tmp_path / "ckpt_000000000030.pt").write_bytes(b"damaged")  # a newer step number, unreadable
    assert ck.load_latest()["step"] == 20
    assert "unreadable" in capsys.readouterr().err
    ck.save({"counter": 21}, 21)
    ck.save({"counter": 22}, 22)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_000000000022.pt", "ckpt_000000000021.pt"]
    assert (tmp_path / "ckpt_000000000030.pt.damaged").exists()  # set aside, not deleted


@pytest.mark.parametrize(
    "scale, ok",
    [
        ({"mean_square": 4.0}, True),
        ({"mean_square": None}, True),
        ({}, True),
        ({"mean_square": float("nan")}, False),
        ({"mean_square": -1.0}, False),
        ({"mean_square": "9"}, False),
        ([], False),
    ],
)
def test_a_leaders_return_scale_is_checked_before_it_is_taken(scale, ok):
    from types import SimpleNamespace

    from rfwp_rl.impala.multi_learner import LearnerGroup, pack

    member = SimpleNamespace(total_steps=1000, _round_limit=lambda: 10)
    state = {"shared": pack({"return_scale": scale}), "leader": "learner-a"}
    if ok:
        assert LearnerGroup._leader_state(member, state)[1]["return_scale"] == scale
    else:
        with pytest.raises(Refused, match="return_scale"):
            LearnerGroup._leader_state(member, state)
