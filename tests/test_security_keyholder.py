"""Attacks by holders of the shared key on a learner group, end to end with rfwp_rl's moolib build.

A broker, a learner training CartPole in a group of its own (``--broker --group``) that takes its rollouts
from one remote actor (``--listen``, ``--num-actors 0``), and a malicious peer that holds the key. What is
shown, each attack in its own test:

- a model update that this learner did not ask for, from a peer that is not the group's leader (NaN,
  misshapen or well formed), is refused inside moolib before anything is copied, and counted;
- calls of every function the learner defines (rfwp_rl's handlers and moolib's own) with the wrong arity
  or types are answered with an error;
- a key holder that joins the group and is elected its leader (the highest model version leads) cannot
  hand over a misshapen model or a NaN one (refused in moolib) nor a bad shared state (refused by the
  learner, which puts its own model back); once it is gone, the learner leads again;
- rollouts with rewards beyond the bound are refused, and at the bound the learner trains on.

After each the learner, broker and actor are alive, the learner trains (its step count goes on), and its
next checkpoint holds finite values only. The tests run in this order on one set of processes. The raw
peer (tests/preauth_wire.py) calls moolib's own functions, which moolib's Python API cannot.

Against moolib without the Accumulator's checks the first test fails (an update naming the learner's
model version is answered True: taken) and so does the third (the learner logs "took the model of
key-holder": moolib broadcast the [1] tensors into every parameter, and the learner's own checks pass).
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from preauth_wire import REQ_ERROR, REQ_SUCCESS, Call, RawPeer  # tests/preauth_wire.py
from procs import MOOLIB_EXIT, finite, free_port, listening_ports, script_result  # tests/procs.py
from rfwp_rl.checkpoint import list_checkpoints, read_checkpoint

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
DEADLINE = 300  # s: only ever a failure deadline (a slow or busy machine just takes longer)
GROUP = "keyholder/run"
AGENT = ["--env", "CartPole-v1", "--core", "lstm", "--set", "core_config.hidden_size=16"]
FLOAT32 = 6  # torch's ScalarType number

pytestmark = [pytest.mark.moolib, pytest.mark.slow]


def _env(**extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


class Proc:
    """A subprocess whose merged stdout/stderr lines are collected by a thread."""

    def __init__(self, argv: list[str], env: dict, stdin: int | None = None):
        self.p = subprocess.Popen(
            argv, cwd=REPO, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines[-80:])

    def has(self, pattern: str, since: int = 0) -> bool:
        return any(re.search(pattern, line) for line in self.lines[since:])

    def wait_for(self, pattern: str, since: int = 0) -> None:
        deadline = time.monotonic() + DEADLINE
        while not self.has(pattern, since):
            assert self.p.poll() is None, f"it ended ({self.p.returncode}) before {pattern!r}:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {pattern!r}:\n{self.output()}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=60)


def rfwp(*argv: str, env: dict) -> Proc:
    return Proc([sys.executable, "-m", "rfwp_rl", *argv], env)


class Cluster:
    """The broker, the learner and its remote actor; the key they share."""

    def __init__(self, tmp: Path, procs: list[Proc]):
        key_file = tmp / "auth.key"
        env = _env(RFWP_AUTH_KEY_FILE=str(key_file))
        env.pop("RFWP_AUTH_KEY", None)
        self.broker_port, self.port = free_port(), free_port()
        self.run_dir = tmp / "run"
        self.procs = procs  # every process started, for the fixture to end
        self.broker = self._start(rfwp("broker", "--address", f"127.0.0.1:{self.broker_port}", env=env))
        self.broker.wait_for("broker listening on")  # it has made the key
        self.key = key_file.read_text().strip()
        # fmt: off
        self.learner = self._start(rfwp(
            "train", *AGENT, "--num-actors", "0", "--listen", f"127.0.0.1:{self.port}",
            "--broker", f"127.0.0.1:{self.broker_port}", "--group", GROUP, "--run-dir", str(self.run_dir),
            "--unroll-length", "5", "--batch-size", "2", "--total-steps", "100000000", "--log-every", "0.5",
            "--checkpoint-every", "1", env=env,
        ))
        # fmt: on
        self.learner.wait_for("listening for remote actors")
        self.actor = self._start(
            rfwp("actor", "--connect", f"127.0.0.1:{self.port}", *AGENT, "--num-actors", "2", env=env)
        )
        self.learner.wait_for(r"1 learner\(s\), leader this learner")
        self.still_training()

    def _start(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        return proc

    def steps(self) -> int:
        """The env steps of the learner's latest progress line (0 before the first)."""
        for line in reversed(self.learner.lines):
            if m := re.match(r"([\d,]+)/[\d,]+ ", line):
                return int(m.group(1).replace(",", ""))
        return 0

    def alive(self) -> None:
        for proc in self.procs:
            assert proc.p.poll() is None, f"{proc.p.args[3]} ended ({proc.p.returncode}):\n{proc.output()}"

    def still_training(self) -> int:
        """All three are alive and the learner's step count goes past where it was; that count."""
        before = self.steps()
        deadline = time.monotonic() + DEADLINE
        while self.steps() <= before:
            self.alive()
            assert time.monotonic() < deadline, f"no progress past {before} steps:\n{self.learner.output()}"
            time.sleep(0.05)
        return self.steps()

    def checkpoint(self, at_least: int = 0) -> tuple[Path, dict]:
        """The learner's newest checkpoint once its step is at least ``at_least``: its path and state."""
        deadline = time.monotonic() + DEADLINE
        while True:
            self.alive()
            newest = list_checkpoints(self.run_dir)[:1]
            if newest and int(re.search(r"(\d+)", newest[0].name).group(1)) >= at_least:
                try:
                    return newest[0], read_checkpoint(newest[0])["state"]
                except (FileNotFoundError, ValueError):  # (a missing file is "not a zip archive")
                    if newest[0].exists():
                        raise
                    # pruned meanwhile, a newer one written
            assert time.monotonic() < deadline, f"no checkpoint at step {at_least}+:\n{self.learner.output()}"
            time.sleep(0.05)

    def recovered(self) -> dict:
        """After an attack: all alive, the learner trains on, and its next checkpoint's parameters, optimizer
        state and return scale are finite (its counters hold -inf as "no best return yet"); that state."""
        steps = self.still_training()
        _, state = self.checkpoint(at_least=steps)
        assert state["agent"] and finite({k: state[k] for k in ("agent", "optimizer", "return_scale")})
        return state

    def refusals(self) -> dict[str, int]:
        """The learner's latest report of the model updates moolib refused, by reason (all 0 before one)."""
        for line in reversed(self.learner.lines):
            if m := re.search(r"model update\(s\) from the group refused \((.*) in all\)", line):
                return {reason: int(n) for reason, n in (item.split() for item in m.group(1).split(", "))}
        return {}

    def refused(self, reason: str, more_than: int, attacker: Proc | None = None) -> None:
        """Until the learner reports more than ``more_than`` refusals for ``reason`` (all, and the
        ``attacker`` if given, alive)."""
        deadline = time.monotonic() + DEADLINE
        while self.refusals().get(reason, 0) <= more_than:
            self.alive()
            assert attacker is None or attacker.p.poll() is None, f"the attacker ended:\n{attacker.output()}"
            assert time.monotonic() < deadline, f"no {reason} refusal reported:\n{self.learner.output()}"
            time.sleep(0.05)

    def group_rpc(self) -> tuple[int, str]:
        """The port and name of the learner's group Rpc (moolib has it listen on a random port): the one
        of its listening ports whose greeting names a ``learner-...``."""
        for port in listening_ports(self.learner.p.pid):
            if port == self.port:
                continue
            peer = RawPeer(port, self.key, name=b"key-holder-scout")
            greeting = peer.their_greeting
            peer.close()
            (n,) = struct.unpack_from("<Q", greeting, 16)  # after rid, fid and the signature
            name = greeting[24 : 24 + n].decode()
            if name.startswith("learner-"):
                return port, name
        raise AssertionError(f"no group Rpc among ports {listening_ports(self.learner.p.pid)}")

    def run(self, script: str, *args: str) -> dict:
        """A key holder built with moolib's Python API (``script`` with the key, the learner's and the
        broker's ports and ``args``); the JSON line it prints at its end."""
        argv = [sys.executable, "-c", script + MOOLIB_EXIT, self.key, str(self.port), str(self.broker_port), *args]
        return script_result(argv, env=_env(), cwd=REPO, timeout=DEADLINE)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    procs: list[Proc] = []
    try:
        yield Cluster(tmp_path_factory.mktemp("keyholder"), procs)
    finally:
        for proc in procs:
            proc.stop()


def _tensors(params: list[torch.Tensor]) -> list[tuple[int, list[int], bytes]]:
    return [(FLOAT32, list(t.shape), t.contiguous().numpy().tobytes()) for t in params]


# ------------------------------------------------------------------ model updates nobody asked for


def test_unrequested_model_updates_from_a_non_leader_are_refused_in_moolib(cluster):
    since, before = len(cluster.learner.lines), cluster.refusals().get("not_leader", 0)
    port, name = cluster.group_rpc()
    _, state = cluster.checkpoint()
    params = list(state["agent"].values())  # the learner's parameters, in order (its agent has no buffers)
    version = state["counters"]["updates"]  # about the learner's model version (moolib counts updates)
    # The group's sync id, as any key holder gets it: the broker answers a ping with it.
    broker = RawPeer(cluster.broker_port, cluster.key, name=b"key-holder-ping")
    ping = Call("BrokerService::ping").text(GROUP.encode()).text(name.encode()).u32(10_000)
    ping.send(broker)
    kind, fields = broker.reply(ping.rid)
    assert kind == REQ_SUCCESS, fields
    (sync_id,) = struct.unpack_from("<I", fields)
    broker.close()

    nan = [t.clone() for t in params]
    nan[0].view(-1)[0] = float("nan")
    models = {
        "nan": nan,
        "misshapen": [torch.full([1], 0.5) for _ in params],  # copy_ would broadcast it into every parameter
        "well formed": [t + 1.0 for t in params],
    }
    peer = RawPeer(port, cluster.key, name=b"key-holder")
    calls = []
    for model in models.values():
        for regular in (True, False):  # the leader's periodic re-sync, and an answer to a request
            for v in range(version, version + 20):  # the learner's version somewhere in there
                call = Call("AccumulatorService::modelUpdate").text(f"{GROUP}::model".encode())
                calls.append(call.u32(sync_id).boolean(regular).i64(v).tensors(_tensors(model)).tensors([]).none())
    calls.append(Call("AccumulatorService::buffersUpdate").text(f"{GROUP}::model".encode()))
    calls[-1].u32(sync_id).tensors([])
    for call in calls:
        call.send(peer)
    for call in calls:  # each answered False: not taken
        kind, fields = peer.reply(call.rid)
        assert kind == REQ_SUCCESS and fields[0] == 0, (call.rid, kind, fields[:8])
    peer.close()
    cluster.refused("not_leader", before + len(calls) - 1)
    assert cluster.refusals()["not_leader"] == before + len(calls)
    # moolib copied nothing in: the learner's own checks never saw a model
    assert not cluster.learner.has(r"took the model of|the leader's state", since)
    cluster.recovered()


# ------------------------------------------------------------------ wrong arity, wrong types

CALLS = textwrap.dedent("""
    import json, sys, moolib
    key, port, broker_port, group_rpc = sys.argv[1:5]
    moolib.set_auth_key(key)
    moolib.set_listen_hosts(["127.0.0.1"])
    rpc = moolib.Rpc(); rpc.set_name("key-holder-calls"); rpc.set_timeout(120)
    rpc.connect("127.0.0.1:" + port)
    rpc.connect("127.0.0.1:" + broker_port)
    wrong = [(), ("x",), ("x", 1, [2.0], None, {"k": (1,)}, -7, "y", 3.5)]
    calls = [("learner", "hello", a) for a in [(), ("x",), ("x", {}, 3), (7, [1])]]
    calls += [("learner", "get_weights", a) for a in [(), ("s", 1, 2), (3.5, "v"), (None, [1])]]
    calls += [("learner", "put_rollout", a) for a in [(), ("x",) * 7, ("a", None, 0, [1], (), []), (1, 2, 3, 4, 5)]]
    calls += [(group_rpc, "rfwp_learner_info", a) for a in [("x",), (1, 2)]]
    native = ["AccumulatorService::requestModel", "AccumulatorService::modelUpdate",
              "AccumulatorService::buffersUpdate", "GroupService::sync", "GroupService::update",
              "AllReduceService::reduce", "AllReduceService::share"]
    calls += [(group_rpc, fn, a) for fn in native for a in wrong]
    calls += [("broker", fn, a) for fn in ["BrokerService::groupSize", "BrokerService::ping", "BrokerService::resync"]
              for a in wrong]
    futures = [(peer, fn, rpc.async_(peer, fn, *a)) for peer, fn, a in calls]
    out = []
    for peer, fn, future in futures:
        try:
            out.append([peer, fn, "reply", future.result()])
        except RuntimeError as e:
            out.append([peer, fn, "error", str(e).splitlines()[0]])
    print(json.dumps({"calls": out}, default=repr))
""")


def test_calls_with_the_wrong_arity_or_types_are_answered_with_errors(cluster):
    port, name = cluster.group_rpc()
    out = cluster.run(CALLS, name)["calls"]
    assert len(out) == 14 + 7 * 3 + 3 * 3
    for peer, fn, how, reply in out:
        if fn in ("hello", "get_weights", "put_rollout", "rfwp_learner_info"):  # rfwp_rl's handlers
            assert how == "reply" and reply["error"].startswith(("refused: ", "could not handle ")), (fn, reply)
        else:  # moolib's own: the arguments do not deserialize
            assert how == "error" and "timed out" not in reply, (peer, fn, reply)
    # moolib's own functions, from a raw peer: a call cut short, and one with bytes after its fields
    peer = RawPeer(port, cluster.key, name=b"key-holder-raw")
    short = Call("AccumulatorService::modelUpdate").text(f"{GROUP}::model".encode())
    trailing = Call("AccumulatorService::requestModel").text(f"{GROUP}::model".encode()).u32(1).text(b"x").i64(0)
    for call in (short, trailing):
        call.send(peer)
        assert peer.reply(call.rid)[0] == REQ_ERROR
    peer.close()
    cluster.recovered()


# ------------------------------------------------------------------ a key holder elected leader

LEADER = textwrap.dedent("""
    import sys, threading, time, torch, moolib
    from rfwp_rl.impala.multi_learner import pack
    key, port, broker_port, group_name, learner_state = sys.argv[1:6]
    moolib.set_auth_key(key)
    moolib.set_listen_hosts(["127.0.0.1"])
    state = torch.load(learner_state, weights_only=True)  # from a checkpoint of the learner
    good = [t.clone() for t in state["agent"].values()]  # the learner's parameters, in order (no buffers)
    shared = {"optimizer": state["optimizer"], "scheduler": state["scheduler"], "return_scale": state["return_scale"],
              "counters": {k: state["counters"][k] for k in ("step", "updates")}}  # a state the learner would take
    params = [t.clone().requires_grad_() for t in good]
    rpc = moolib.Rpc(); rpc.set_name("key-holder")
    rpc.connect("127.0.0.1:" + broker_port)
    group = moolib.Group(rpc, group_name)
    acc = moolib.Accumulator("model", params, [], group=group)
    acc.set_model_version(10**9)  # the highest model version is elected leader
    commands = []  # what to serve next, from the test (stdin): misshapen, nan, bad_state, exit
    threading.Thread(target=lambda: commands.extend(line.strip() for line in sys.stdin), daemon=True).start()
    serving, made = "misshapen", None
    while serving != "exit":
        if commands:
            serving = commands.pop(0)
        if made != serving:
            with torch.no_grad():
                for p, g in zip(params, good):
                    p.set_(torch.full([1], 0.5) if serving == "misshapen" else g.clone())
                if serving == "nan":
                    params[0].view(-1)[0] = float("nan")
            made = serving
        group.update()
        acc.update()
        if acc.wants_state():
            served = dict(shared, counters={"step": -1, "updates": 0}) if serving == "bad_state" else shared
            acc.set_state({"shared": pack(served), "leader": "key-holder"})
        if acc.wants_gradients():
            acc.skip_gradients()
        if acc.has_gradients():
            acc.zero_gradients()
        time.sleep(0.01)  # moolib's Accumulator is driven by polling
""")


def test_a_key_holder_elected_leader_hands_over_no_bad_model_or_state(cluster, tmp_path):
    learner = cluster.learner
    since, before = len(learner.lines), cluster.refusals()
    torch.save(cluster.checkpoint()[1], tmp_path / "learner_state.pt")  # (the learner prunes its checkpoints)
    argv = [cluster.key, str(cluster.port), str(cluster.broker_port), GROUP, str(tmp_path / "learner_state.pt")]
    leader = Proc([sys.executable, "-c", LEADER + MOOLIB_EXIT, *argv], _env(), stdin=subprocess.PIPE)

    def serve(what: str) -> None:
        assert leader.p.poll() is None, leader.output()
        leader.p.stdin.write(what + "\n")
        leader.p.stdin.flush()

    try:
        # It leads; the learner asks it for the model and gets, one request after the other:
        cluster.refused("mismatch", before.get("mismatch", 0), leader)  # parameters of [1] (copy_ broadcasts them)
        serve("nan")
        cluster.refused("not_finite", before.get("not_finite", 0), leader)  # NaN in a parameter
        serve("bad_state")  # the right model with a shared state the learner does not take
        learner.wait_for(r"refused a message: the leader's state: shared step counter must be an integer", since)
        serve("exit")
        assert leader.p.wait(timeout=DEADLINE) == 0, leader.output()
    finally:
        leader.stop()
    assert not learner.has(r"took the model of key-holder|holds NaN", since), learner.output()
    learner.wait_for(r"1 learner\(s\), leader this learner", since)  # the broker dropped the key holder
    cluster.recovered()


# ------------------------------------------------------------------ huge rewards

REWARDS = textwrap.dedent("""
    import json, math, sys, moolib, torch
    key, port = sys.argv[1:3]
    moolib.set_auth_key(key)
    moolib.set_listen_hosts(["127.0.0.1"])
    rpc = moolib.Rpc(); rpc.set_name("key-holder-rewards"); rpc.set_timeout(120)
    rpc.connect("127.0.0.1:" + port)
    def rollout(reward):
        T, b = 6, 2  # unroll length + 1, envs
        data = {"obs": torch.zeros(T, b, 4), "reward": torch.full((T, b), reward),
                "done": torch.zeros(T, b, dtype=torch.bool), "truncated": torch.zeros(T, b, dtype=torch.bool),
                "prev_action": torch.zeros(T, b, dtype=torch.int64), "action": torch.ones(T, b, dtype=torch.int64),
                "behaviour_log_prob": torch.full((T, b), math.log(0.5))}
        return data, (torch.zeros(b, 1, 16), torch.zeros(b, 1, 16))  # the lstm core state, per env
    out = {}
    for label, reward in [("1e30", 1e30), ("-1e12", -1e12), ("inf", math.inf)]:
        out[label] = rpc.sync("learner", "put_rollout", "key-holder", None, 0, *rollout(reward), [])
    out["episode"] = rpc.sync("learner", "put_rollout", "key-holder", None, 0, *rollout(1.0), [(1e31, 5)])
    taken = 0
    for i in range(60):  # at the bound, +1e9 and -1e9 in turn
        while True:
            reply = rpc.sync("learner", "put_rollout", "key-holder", None, 0, *rollout(1e9 * (-1) ** i), [])
            if not reply.get("busy"):
                break
        taken += bool(reply.get("ok"))
    out["taken"] = taken
    print(json.dumps(out))
""")


def test_rewards_beyond_the_bound_are_refused_and_at_the_bound_training_goes_on(cluster):
    since = len(cluster.learner.lines)
    out = cluster.run(REWARDS)
    assert "rollout reward holds values outside [-1e+09, 1e+09]" in out["1e30"]["error"], out
    assert "rollout reward holds values outside" in out["-1e12"]["error"], out
    assert "reward holds NaN or inf" in out["inf"]["error"], out
    assert "episode 0 return must be a finite number" in out["episode"]["error"], out
    assert out["taken"] == 60, out
    cluster.recovered()
    assert not cluster.learner.has("training aborted", since)
