"""Attacks on a learner's listening port before the key handshake, from raw sockets.

What is shown: nothing a peer without the key sends can end the learner, make it allocate what the
peer declares, or keep its connections: a huge declared length, random bytes, a truncated greeting,
deeply nested containers and many idle connections each leave it training (its step count goes on),
each refused connection is counted, idle ones are closed after the handshake timeout while a key
holder is still answered, and the parameters it ends with are finite. Network tests bind 127.0.0.1.

The raw peer (tests/preauth_wire.py) speaks tensorpipe's and moolib's wire formats as far as the
attacks need. scripts/preauth_attack_bench.py measures a learner's env steps/s under a minute of them.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from preauth_wire import (  # tests/preauth_wire.py
    REQ_GREETING,
    SIGNATURE,
    RawPeer,
    auth_proof,
    challenge,
    frame,
    function_id,
    greeting,
    moolib_str,
    nop_array,
    nop_str,
    nop_struct,
    nop_variant,
    tensor_meta,
)
from procs import MOOLIB_EXIT, finite, free_port, script_result  # tests/procs.py
from rfwp_rl.checkpoint import list_checkpoints, read_checkpoint

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
DEADLINE = 300  # s: only ever a failure deadline (a slow or busy machine just takes longer)
TINY = ["--env", "CartPole-v1", "--core", "lstm", "--set", "core_config.hidden_size=16"]

pytestmark = [pytest.mark.moolib, pytest.mark.slow]


def _env(**extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


# ------------------------------------------------------------------ the learner under attack


class Learner:
    """``rfwp-rl train`` on CartPole listening on 127.0.0.1 with a key; its output lines kept."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.run_dir = tmp / "run"
        env = _env(RFWP_AUTH_KEY_FILE=str(tmp / "auth.key"))
        env.pop("RFWP_AUTH_KEY", None)
        # fmt: off
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rfwp_rl", "train", *TINY, "--run-dir", str(self.run_dir),
             "--listen", f"127.0.0.1:{self.port}", "--num-actors", "2", "--num-env-processes", "1",
             "--unroll-length", "5", "--batch-size", "2", "--total-steps", "100000000", "--log-every", "0.5"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        # fmt: on
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for("listening for remote actors")
        self.key = (tmp / "auth.key").read_text().strip()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def wait_for(self, pattern: str, since: int = 0) -> re.Match:
        deadline = time.monotonic() + DEADLINE
        while True:
            for line in self.lines[since:]:
                if m := re.search(pattern, line):
                    return m
            assert self.proc.poll() is None, f"the learner ended ({self.proc.returncode}):\n{self.output()}"
            assert time.monotonic() < deadline, f"no {pattern!r}:\n{self.output()}"
            time.sleep(0.05)

    def steps(self) -> int:
        """The env steps of its latest progress line (0 before the first)."""
        for line in reversed(self.lines):
            if m := re.match(r"([\d,]+)/[\d,]+ ", line):
                return int(m.group(1).replace(",", ""))
        return 0

    def still_training(self) -> None:
        """It is alive and its step count goes past where it was."""
        before = self.steps()
        deadline = time.monotonic() + DEADLINE
        while self.steps() <= before:
            assert self.proc.poll() is None, f"the learner ended ({self.proc.returncode}):\n{self.output()}"
            assert time.monotonic() < deadline, f"no progress past {before} steps:\n{self.output()}"
            time.sleep(0.05)

    def refused_warning(self, since: int) -> None:
        """It reports refused connections (moolib.auth_refusals, on its progress cadence)."""
        self.wait_for(r"connection\(s\) without the shared key refused", since)


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    learner = Learner(tmp_path_factory.mktemp("preauth"))
    learner.wait_for(r"^[\d,]+/[\d,]+ ")  # training
    yield learner
    # the end is checked here, after every test of the module on this worker: a test that ended the learner
    # could run before others that need it (xdist's worksteal reorders a module's tests)
    try:
        learner_ends_with_finite_parameters(learner)
    finally:
        if learner.proc.poll() is None:
            learner.proc.kill()
            learner.proc.wait(timeout=60)


def test_huge_declared_length_is_refused_unread(learner):
    since = len(learner.lines)
    with socket.create_connection(("127.0.0.1", learner.port)) as s:
        s.sendall(b"\xff" * 8 + b"\0" * 64)
    learner.still_training()
    learner.refused_warning(since)


def test_random_bytes_are_refused(learner):
    since = len(learner.lines)
    rng = random.Random(0)
    payloads = [rng.randbytes(n) for n in (1, 7, 8, 9, 100, 5000)]
    payloads += [struct.pack("<Q", 64) + rng.randbytes(64)]  # a plausible length, an unparseable object
    payloads += [frame(nop_variant(0, nop_struct(nop_str(b"")))) + struct.pack("<Q", 1 << 40)]  # huge brochure
    payloads += [frame(nop_variant(4, nop_struct(nop_str(b"x"), nop_array([]), nop_array([]))))]  # not a hello
    for payload in payloads:
        with socket.create_connection(("127.0.0.1", learner.port)) as s:
            s.sendall(payload)
    learner.still_training()
    learner.refused_warning(since)


def test_truncated_and_oversize_greetings_are_refused(learner):
    since = len(learner.lines)
    head = struct.pack("<IIQ", 0, REQ_GREETING, SIGNATURE) + moolib_str(b"attacker") + b"\0" * 16  # up to the info
    attacks = [
        dict(body=head[:20]),  # cut short, no info, no proof
        dict(body=head + struct.pack("<Q", 1 << 40)),  # an info list of 2**40 entries, no proof
        dict(body=challenge(), declared=1 << 31),  # a size far over the pre-handshake limit
        dict(body=challenge(), tensors=[1 << 40]),  # a tensor of 2**40 bytes before the handshake
        dict(body=challenge(), tensors=[-1]),  # a negative size
        dict(body=struct.pack("<IIQ", 0, REQ_GREETING, SIGNATURE) + b"\0" * 8000),  # all zeros, no proof
    ]
    for attack in attacks:
        peer = RawPeer(learner.port)
        peer.send(**attack)
        assert peer.closed_by_peer(), attack
        peer.close()
    # a frame cut short: 1 KiB announced, 10 bytes sent, then closed
    with socket.create_connection(("127.0.0.1", learner.port)) as s:
        s.sendall(struct.pack("<Q", 1024) + b"x" * 10)
    learner.still_training()
    learner.refused_warning(since)


def nested_call(function: str, depth: int, rid: int = 1) -> bytes:
    """A call of ``function`` with one argument: a list in a list ... ``depth`` deep, around None.
    ``rid`` (odd) numbers the call: moolib answers a repeated one from its cache, not again."""
    nested = (b"\x06" + struct.pack("<Q", 1)) * depth + b"\x07"  # moolib's list tag and a count of 1, per level
    args = b"\x01" + struct.pack("<Q", 1) + nested  # std::optional<py::args>: present, a 1-tuple
    return struct.pack("<II", rid, function_id(function)) + args + b"\x00"  # no kwargs


def test_nested_containers_before_the_handshake_are_refused(learner):
    since = len(learner.lines)
    peer = RawPeer(learner.port)
    peer.send(challenge())
    peer.send(nested_call("hello", 100_000))  # before any greeting: refused unparsed (and over the size)
    assert peer.closed_by_peer()
    peer.close()
    learner.still_training()
    learner.refused_warning(since)


KEY_HOLDER = textwrap.dedent("""
    import json, sys, moolib
    moolib.set_auth_key(sys.argv[1])
    moolib.set_listen_hosts(["127.0.0.1"])
    rpc = moolib.Rpc(); rpc.set_name("key-holder"); rpc.set_timeout(120)
    rpc.connect("127.0.0.1:" + sys.argv[2])
    print(json.dumps(rpc.sync("learner", "hello", "key-holder", {"protocol": 1}), default=repr))
""")


def test_idle_connections_are_bounded_and_time_out(learner):
    idle = []
    for i in range(150):
        s = socket.create_connection(("127.0.0.1", learner.port))
        if i % 2:  # half have sent their hello: they wait for a brochure, then a greeting
            s.sendall(frame(nop_variant(0, nop_struct(nop_str(b"")))))
        idle.append(s)
    # A key holder is answered while they are held.
    argv = [sys.executable, "-c", KEY_HOLDER + MOOLIB_EXIT, learner.key, str(learner.port)]
    reply = script_result(argv, env=_env(), cwd=REPO, timeout=DEADLINE)
    assert "error" in reply, reply
    learner.still_training()
    # Each is closed by the learner: the oldest to make room, the rest after the handshake timeout.
    deadline = time.monotonic() + DEADLINE
    for i, s in enumerate(idle):
        s.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            while s.recv(65536):
                pass
        except TimeoutError:
            raise AssertionError(f"idle connection {i} still open after {DEADLINE} s") from None
        except OSError:
            pass  # reset: closed too
        s.close()
    learner.still_training()


def learner_ends_with_finite_parameters(learner: Learner) -> None:
    """Still training, then SIGTERM: exit 0 and a checkpoint at or past the last step, all finite."""
    learner.still_training()
    steps = learner.steps()
    learner.proc.send_signal(signal.SIGTERM)  # checkpoint, exit 0
    assert learner.proc.wait(timeout=DEADLINE) == 0, learner.output()
    newest = list_checkpoints(learner.run_dir)[0]
    assert int(re.search(r"(\d+)", newest.name).group(1)) >= steps
    state = read_checkpoint(newest)["state"]  # (its meta holds the observation space's infinite bounds)
    assert state["agent"] and finite(state), newest


# ------------------------------------------------------------------ the counts, in a bare moolib listener

LISTENER_KEY = "preauth-test-key-0123456789"
LISTENER = textwrap.dedent(f"""
    import json, sys, moolib
    moolib.set_auth_key("{LISTENER_KEY}")
    moolib.set_listen_hosts(["127.0.0.1"])
    moolib.set_max_message_bytes(1 << 20)
    rpc = moolib.Rpc(); rpc.set_name("server")
    calls = []
    rpc.define("echo", lambda *args: calls.append(len(args)) or "ok")
    rpc.listen("127.0.0.1:" + sys.argv[1])
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(len(calls) if line.strip() == "calls" else moolib.connection_refusals()), flush=True)
""")


class Listener:
    """A moolib Rpc with a key listening on 127.0.0.1 (max message 1 MiB), and its refusal counts."""

    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LISTENER, str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(),
            cwd=REPO,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def counts(self, what: str = "") -> dict:
        """Its connection_refusals() (or, with "calls", how often echo was called)."""
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the listener ended ({self.proc.poll()})"
        return json.loads(line)

    def counted(self, reason: str, attack) -> None:
        """``attack()`` makes the count of ``reason`` go up (and the listener lives on)."""
        before = self.counts()
        attack()
        deadline = time.monotonic() + DEADLINE
        while (now := self.counts())[reason] <= before[reason]:
            assert time.monotonic() < deadline, f"no {reason} counted: {before} -> {now}"
            time.sleep(0.05)

    def send(self, payload: bytes) -> None:
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.sendall(payload)

    def raw(self, key: str | None = None, **message) -> None:
        """A pipe (a key holder's if ``key``) sends one message and is closed by the listener."""
        peer = RawPeer(self.port, key)
        peer.send(**message)
        assert peer.closed_by_peer(), message
        peer.close()


@pytest.fixture(scope="module")
def listener():
    listener = Listener()
    yield listener
    listener.proc.kill()
    listener.proc.wait(timeout=60)


def test_each_refusal_before_the_handshake_is_counted_by_reason(listener):
    listener.counted("oversize", lambda: listener.send(b"\xff" * 8 + b"\0" * 64))
    listener.counted("malformed", lambda: listener.send(struct.pack("<Q", 16) + b"\xaa" * 16))
    listener.counted("oversize", lambda: listener.raw(body=challenge(), tensors=[1 << 40]))
    listener.counted("malformed", lambda: listener.raw(body=struct.pack("<II", 1, 7) + b"\0" * 16))  # a request
    listener.counted("wrong_key", lambda: listener.raw(body=greeting(b"x") + moolib_str(b"p" * 32)))
    held: list[socket.socket] = []
    listener.counted(
        "evicted", lambda: held.extend(socket.create_connection(("127.0.0.1", listener.port)) for _ in range(40))
    )
    listener.counted("timeout", lambda: None)
    for s in held:
        s.close()


def test_the_proof_binds_the_claimed_name_and_peer_id(listener):
    # A key holder's greeting is accepted with a proof made for the name and PeerId it claims ...
    counts = listener.counts()
    peer = RawPeer(listener.port, LISTENER_KEY, name=b"raw-peer")
    assert not peer.closed_by_peer(timeout=2), "the handshake failed"
    peer.close()
    assert listener.counts()["wrong_key"] == counts["wrong_key"]
    # ... and the listener's own proof is made for its name ("server") and the PeerId it claims.
    head = struct.pack("<IIQ", 0, REQ_GREETING, SIGNATURE) + moolib_str(b"server")
    assert peer.their_greeting.startswith(head), peer.their_greeting[:64]
    their_id = peer.their_greeting[len(head) : len(head) + 16]
    key = LISTENER_KEY.encode()
    assert auth_proof(key, b"A", peer.my_nonce, peer.their_nonce, b"server", their_id) in peer.their_greeting
    assert auth_proof(key, b"A", peer.my_nonce, peer.their_nonce, b"mallory", their_id) not in peer.their_greeting
    # A proof made for another name or PeerId (a greeting rewritten on the way) is a wrong proof.
    for claims in [
        dict(name=b"mallory", signed_name=b"raw-peer"),
        dict(name=b"raw-peer", signed_name=b"raw-peer2"),
        dict(name=b"raw-peer", signed_name=b""),
        dict(name=b"raw-peer", signed_id=b"\0" * 16),
    ]:

        def renamed(claims=claims):
            peer = RawPeer(listener.port, LISTENER_KEY, **claims)
            assert peer.closed_by_peer(), claims
            peer.close()

        listener.counted("wrong_key", renamed)
    assert listener.proc.poll() is None


def test_after_the_handshake_tensors_must_fit_their_data(listener):
    counts = listener.counts()
    peer = RawPeer(listener.port, LISTENER_KEY)
    assert not peer.closed_by_peer(timeout=2), "the handshake failed"
    # 100 KiB of float32 (over the pre-handshake limit, under the 1 MiB one) is read
    body = struct.pack("<II", 1, 12345) + tensor_meta(6, [25600], [1])
    peer.send(body, tensors=[102400], offsets=[8], data=[b"\0" * 102400])
    assert not peer.closed_by_peer(timeout=2)
    peer.close()
    after = listener.counts()
    assert all(after[k] == counts[k] for k in ("wrong_key", "oversize", "malformed")), (counts, after)
    request = struct.pack("<II", 1, 12345)
    for meta, offset in [
        (tensor_meta(99, [4], [1]), 8),  # no such dtype
        (tensor_meta(6, [1 << 40], [1]), 8),  # sizes far beyond its 16 bytes
        (tensor_meta(6, [2, 2], [-1, 1]), 8),  # a negative stride
        (tensor_meta(6, [4], [1, 1]), 8),  # more strides than sizes
        (tensor_meta(6, [4], [1]), 10_000),  # described outside the message
    ]:
        listener.counted(
            "malformed",
            lambda meta=meta, offset=offset: listener.raw(
                LISTENER_KEY, body=request + meta, tensors=[16], offsets=[offset], data=[b"\0" * 16]
            ),
        )
    listener.counted(
        "oversize",
        lambda: listener.raw(
            LISTENER_KEY, body=request + tensor_meta(0, [2 << 20], [1]), tensors=[2 << 20], offsets=[8]
        ),
    )
    assert listener.proc.poll() is None


def test_after_the_handshake_deep_nesting_is_refused(listener):
    # Unbounded, this recursion overflows the stack of the listener's handler thread.
    peer = RawPeer(listener.port, LISTENER_KEY)
    assert not peer.closed_by_peer(timeout=2), "the handshake failed"
    peer.send(nested_call("echo", 100_000))  # refused with an error answer, echo not called
    peer.send(nested_call("echo", 50, rid=3))  # within the limit: called
    deadline = time.monotonic() + DEADLINE
    while listener.counts("calls") < 1:
        assert time.monotonic() < deadline, "echo was never called"
        time.sleep(0.05)
    assert listener.counts("calls") == 1 and listener.proc.poll() is None
    peer.close()
