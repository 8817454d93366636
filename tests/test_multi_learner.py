"""Several IMPALA learners training one model (``rfwp-rl broker``, ``rfwp-rl train --broker --group``).

The gradient weighting is checked as a pure function and on a real moolib group; the end-to-end
checks run a broker and learners as subprocesses on loopback (moolib allows one EnvPool per
process, and this pytest process must not start moolib threads), each with a hard timeout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from procs import MOOLIB_EXIT, alive, children_and_grandchildren, ended, free_port, script_result  # tests/procs.py
from rfwp_rl import cli
from rfwp_rl.checkpoint import list_checkpoints, read_checkpoint
from rfwp_rl.impala.multi_learner import group_gradient_factor, pack, unpack
from rfwp_rl.impala.net import settings_mismatch

REPO = Path(__file__).resolve().parent.parent
DEADLINE = 300  # s: only ever a failure deadline (a slow or busy machine just takes longer)
TESTS = Path(__file__).resolve().parent
TINY = [
    "--env",
    "CartPole-v1",
    "--core",
    "lstm",
    "--set",
    "core_config.hidden_size=16",
    "--num-actors",
    "4",
    "--num-env-processes",
    "1",
    "--unroll-length",
    "5",
    "--batch-size",
    "4",
    "--log-every",
    "0.5",
]


class Proc:
    """A ``rfwp-rl`` subprocess whose merged stdout/stderr lines are collected by a thread."""

    def __init__(self, *argv: str):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
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
        self.workers: set[int] = set()  # env pool processes seen (ended by stop())
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def find(self, pattern: str, since: int = 0) -> int | None:
        """Index of the first line from ``since`` on that matches ``pattern`` (None: none yet)."""
        return next((i for i, line in enumerate(self.lines[since:], since) if re.search(pattern, line)), None)

    def has(self, pattern: str, since: int = 0) -> bool:
        return self.find(pattern, since) is not None

    def steps(self, since: int = 0) -> list[int]:
        """The env steps of the progress lines from ``since`` on."""
        return [
            int(m.group(1).replace(",", ""))
            for line in self.lines[since:]
            for m in [re.match(r"([\d,]+)/[\d,]+ env steps ", line)]
            if m
        ]

    def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``done()`` (True) or the process ended or ``timeout`` s passed (``done()`` then)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.workers |= set(children_and_grandchildren(self.p.pid))
            if done():
                return True
            if self.p.poll() is not None:
                self.reader.join(timeout=30)  # the last lines
                return done()
            time.sleep(0.05)
        return done()

    def wait_for(self, pattern: str, timeout: float, since: int = 0) -> bool:
        return self.wait_until(lambda: self.has(pattern, since), timeout)

    def wait(self, timeout: float) -> int:
        """The exit code, once the process and the reader of its output ended."""
        code = self.p.wait(timeout=timeout)
        self.reader.join(timeout=30)
        return code

    def kill(self) -> None:
        """SIGKILL the process and its env pool processes (a lost machine)."""
        self.workers |= set(children_and_grandchildren(self.p.pid))
        for pid in [self.p.pid, *sorted(self.workers, reverse=True)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.p.wait(timeout=DEADLINE)

    def stop(self) -> None:
        """Kill it and its env pool processes if they still run; then all its output is in ``lines``."""
        if self.p.poll() is None:
            self.kill()
        for pid in self.workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.reader.join(timeout=30)


@pytest.fixture
def broker():
    """A broker on a free loopback port; at the end SIGTERM must stop it with exit 0."""
    port = free_port()
    proc = Proc("broker", "--address", f"127.0.0.1:{port}", "--log-every", "1")
    try:
        assert proc.wait_for("broker listening on", DEADLINE), proc.text()
        yield f"127.0.0.1:{port}", proc
        assert proc.p.poll() is None, proc.text()  # the broker outlives its learners
        proc.p.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE) == 0, proc.text()
        assert proc.has(r"broker on 127\.0\.0\.1:\d+ up ") and proc.has("SIGTERM received: broker stopped")
    finally:
        proc.stop()


def _learner(address: str, run_dir: Path, seed: int, total: int, *extra: str) -> Proc:
    return Proc(
        "train",
        *TINY,
        "--broker",
        address,
        "--group",
        "test/g",
        "--seed",
        str(seed),
        "--total-steps",
        str(total),
        "--run-dir",
        str(run_dir),
        *extra,
    )


def _final(run_dir: Path) -> dict:
    return read_checkpoint(list_checkpoints(run_dir)[0])


def _assert_same_model(a: dict, b: dict) -> None:
    """Same parameters and optimizer state, bit for bit: every learner applies the same reduced
    gradients (moolib sums them once and shares the result) with the same ops on one machine."""
    sa, sb = a["state"]["agent"], b["state"]["agent"]
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa), [k for k in sa if not torch.equal(sa[k], sb[k])]
    oa, ob = a["state"]["optimizer"], b["state"]["optimizer"]
    assert oa["param_groups"] == ob["param_groups"]
    assert all(torch.equal(oa["state"][i][k], ob["state"][i][k]) for i in oa["state"] for k in oa["state"][i])


# ------------------------------------------------------------------ gradient weighting


def test_group_gradient_is_the_batch_size_weighted_mean():
    """moolib's reduced gradient (sum of the hand-ins / their number) times the factor equals the
    per-env-step mean over all learners' steps, in the scale of one batch of S steps."""
    torch.manual_seed(0)
    S = 20  # one learner's batch: env steps per update
    sizes = [20, 5, 35]  # env steps of each learner's hand-in
    per_step = [torch.randn(n, 7) for n in sizes]  # gradient of each env step's loss term
    hand_ins = [g.sum(0) for g in per_step]  # gradient of each learner's summed loss
    moolib_grad = torch.stack(hand_ins).sum(0) / len(hand_ins)
    group = moolib_grad * group_gradient_factor(len(hand_ins), sum(sizes), S)
    expected = S * torch.cat(per_step).mean(0)  # each env step weighs the same, whoever computed it
    assert torch.allclose(group, expected, atol=1e-5, rtol=1e-5)
    plain_mean = torch.stack([h / n * S for h, n in zip(hand_ins, sizes)]).mean(0)  # unweighted: differs
    assert not torch.allclose(group, plain_mean, atol=1e-2)
    assert group_gradient_factor(3, 60, 20) == 1.0  # equal batches: moolib's mean as it is
    assert group_gradient_factor(1, 20, 20) == 1.0  # one learner: its own gradient
    with pytest.raises(ValueError):
        group_gradient_factor(0, 0, 20)


def test_settings_mismatch_and_lossless_state_packing():
    mine = {"env": "CartPole-v1", "core_config": {"hidden_size": 16}, "discount": 0.99}
    assert settings_mismatch(mine, json.loads(json.dumps(mine))) is None
    assert (
        settings_mismatch(mine, {**mine, "core_config": {"hidden_size": 32}})
        == "core_config.hidden_size 32 there, 16 here"
    )
    assert settings_mismatch(mine, {**mine, "discount": 0.9}) == "discount 0.9 there, 0.99 here"
    state = {"lr": 6e-4, "counters": {"step": 123}, "t": torch.arange(3.0)}
    back = unpack(pack(state))  # moolib would send the float as float32
    assert back["lr"] == 6e-4 and back["counters"] == {"step": 123} and torch.equal(back["t"], state["t"])


@pytest.mark.moolib
@pytest.mark.slow
def test_a_real_group_applies_the_weighted_mean_on_every_learner(tmp_path):
    """Broker + two LearnerGroups in one (sub)process, batches of S = 3 env steps: learner 0 hands in a
    1-step gradient, learner 1 a 3-step one; both apply S * (g0 + g1) / 4 (moolib alone: (g0 + g1) / 2).
    In the next round only learner 1 hands in (2 steps): both apply S * g1 / 2."""
    port = free_port()
    script = textwrap.dedent(f"""
        import json, threading, time, torch, moolib
        from rfwp_rl.impala.learner import Gradients
        from rfwp_rl.impala.multi_learner import LearnerGroup

        class Learner:  # what LearnerGroup uses of rfwp_rl.impala.learner.Learner; apply records each step
            def __init__(self, w, steps):
                self.w, self.steps, self.lock, self.steps_per_update, self.updates = w, steps, threading.Lock(), S, 0
            def parameters(self):
                return [self.w]
            def buffers(self):
                return []
            def apply(self, step):
                self.steps.append((step.env_steps, step.gradients, step.own_steps, self.w.grad.tolist()))
            def shared_state(self):
                return {{}}
            def load_shared_state(self, state):
                pass

        broker_rpc = moolib.Rpc(); broker_rpc.set_name("broker")
        broker = moolib.Broker(broker_rpc); broker_rpc.listen("127.0.0.1:{port}")
        S, grads = 3, [torch.tensor([1.0, 2.0]), torch.tensor([9.0, -3.0])]
        learners = []
        for i in range(2):
            w = torch.nn.Parameter(torch.zeros(2))
            steps = []
            group = LearnerGroup("127.0.0.1:{port}", "t/w", Learner(w, steps), {{"x": 1}}, seed=i)
            learners.append(dict(w=w, group=group, steps=steps))
        def ready(l):  # in the group with the other, on the model it took (no round handed in yet)
            g = l["group"]
            with g._lock:
                return g.acc is not None and g.acc.connected() and g.size == 2 and not g.acc.has_new_state()

        plan = [(1, 3), (None, 2)]  # env steps handed in per round by learner 0, 1 (None: nothing)
        deadline, rnd = time.monotonic() + {DEADLINE - 60}, 0
        started = False  # the plan starts once both learners are in the group, whichever joined first
        while time.monotonic() < deadline and rnd < len(plan):
            broker.update()
            for l in learners:
                l["group"].sync()
            started = started or all(ready(l) for l in learners)
            for i, l in enumerate(learners):
                n = plan[rnd][i] if started else None
                if n is not None and l["group"].wants_gradients() and not l.get("handed"):
                    l["w"].grad.copy_(grads[i])
                    l["group"].hand_in(Gradients(True, n, {{}}))
                    l["handed"] = True
                l["group"].idle()
            if all(len(l["steps"]) > rnd for l in learners):
                rnd += 1
                for l in learners:
                    l["handed"] = False
            time.sleep(0.005)
        print(json.dumps([l["steps"] for l in learners]))
        for l in learners:
            l["group"].close()
    """)
    steps = script_result([sys.executable, "-c", script + MOOLIB_EXIT], cwd=REPO, timeout=DEADLINE)
    S, g0, g1 = 3, torch.tensor([1.0, 2.0]), torch.tensor([9.0, -3.0])
    weighted = (S * (g0 + g1) / 4).tolist()  # 4 env steps in the round: each counts the same
    assert weighted != ((g0 + g1) / 2).tolist()
    assert steps[0][0] == [4, 2, 1, pytest.approx(weighted)] and steps[1][0] == [4, 2, 3, pytest.approx(weighted)]
    assert steps[0][0][3] == steps[1][0][3]  # the same gradient on both learners
    # round 2: only learner 1 hands in (2 env steps); learner 0 applies the same step
    alone = (S * g1 / 2).tolist()
    assert steps[0][1] == [2, 1, 0, pytest.approx(alone)] and steps[1][1] == [2, 1, 2, pytest.approx(alone)]


# ------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--group", "g"], "error: --group 'g' needs --broker HOST:PORT"),
        (["--broker", "127.0.0.1:4432"], "error: --broker 127.0.0.1:4432 needs --group NAME"),
        (["--broker", "127.0.0.1", "--group", "g"], "error: --broker '127.0.0.1' is invalid; allowed: HOST:PORT"),
        (["--broker", "127.0.0.1:70000", "--group", "g"], "error: --broker '127.0.0.1:70000' is invalid"),
        (
            ["--broker", "no-such-host.invalid:4432", "--group", "g"],
            "error: --broker no-such-host.invalid:4432: cannot resolve host 'no-such-host.invalid'",
        ),
        (["--broker", "127.0.0.1:4432", "--group", "bad name"], "error: --group 'bad name' is invalid; allowed: "),
    ],
)
def test_bad_group_arguments_are_one_line_errors(tmp_path, capsys, argv, message):
    code = cli.main(["train", *TINY, "--run-dir", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "run").exists()


def test_bad_broker_and_actor_arguments_are_one_line_errors(capsys):
    assert cli.main(["broker", "--address", "localhost"]) == 2
    assert cli.main(["broker", "--address", "127.0.0.1:4432", "--log-every", "0"]) == 2
    assert cli.main(["actor", "--connect", "127.0.0.1:4431", "--env-timeout", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --address 'localhost' is invalid; allowed: HOST:PORT, e.g. 127.0.0.1:4431 or 0.0.0.0:4431",
        "error: --log-every 0 is invalid; allowed: seconds > 0",
        "error: --env-timeout 0.0 is invalid; allowed: seconds > 0",
    ]


# ------------------------------------------------------------------ learners end to end


@pytest.mark.moolib
@pytest.mark.slow
def test_late_learner_takes_the_current_model_and_both_finish_with_the_same_one(tmp_path, broker):
    """A trains alone to ``first`` env steps, then rejoins the group as a learner without actors of its
    own (``--num-actors 0 --listen``), so it cannot move on before B comes: B joins late, takes A's model
    at exactly A's update count and trains the group to the target on its own actors; both finish with
    the same model. Nothing here depends on which process is faster."""
    address, _ = broker
    first, total = 1000, 3000
    assert (
        cli.main(
            [
                "train",
                *TINY,
                "--env-backend",
                "local",
                "--seed",
                "1",
                "--total-steps",
                str(first),
                "--run-dir",
                str(tmp_path / "a"),
            ]
        )
        == 0
    )
    alone = _final(tmp_path / "a")["state"]["counters"]
    assert alone["step"] == first and alone["updates"] > 0
    a = _learner(address, tmp_path / "a", 1, total, "--num-actors", "0", "--listen", f"127.0.0.1:{free_port()}")
    b = None
    try:
        assert a.wait_for(r"1 learner\(s\), leader this learner", DEADLINE), a.text()
        b = _learner(address, tmp_path / "b", 2, total)  # another seed: another initial model
        assert b.wait(DEADLINE) == 0, b.text()
        assert a.wait(DEADLINE) == 0, a.text()
    finally:
        for p in (a, b):
            if p is not None:
                p.stop()
    assert a.has(re.escape(f"resuming {tmp_path / 'a'} from step {first:,}")), a.text()
    assert b.has(rf"took the model of learner-\S+-s1-\S+ at update {alone['updates']:,}$"), b.text()
    assert a.has(r"2 learner\(s\), leader this learner") and b.has(r"2 learner\(s\), leader learner-")
    refused = "model update.s. from the group refused"  # moolib refuses none of a group's own updates
    assert not a.has(refused) and not b.has(refused), a.text() + b.text()
    ca, cb = _final(tmp_path / "a"), _final(tmp_path / "b")
    assert ca["step"] == cb["step"] >= total  # the group's count; both stop at the same round
    assert ca["state"]["counters"]["updates"] == cb["state"]["counters"]["updates"] > alone["updates"]
    _assert_same_model(ca, cb)
    # A's own actors made the steps it trained alone, B's every step trained after it joined
    assert ca["state"]["counters"]["actor_steps"] == alone["actor_steps"] < total
    assert cb["state"]["counters"]["actor_steps"] >= cb["step"] - first


@pytest.mark.moolib
@pytest.mark.slow
def test_killed_learner_does_not_stop_the_other_and_it_resumes(tmp_path, broker):
    """B is killed while the two train (to a target neither reaches first); A loses the group, goes on
    alone and trains on; SIGTERM saves it, and re-running it resumes its run directory to a new target."""
    address, _ = broker
    total = 10**7
    a = _learner(address, tmp_path / "a", 1, total)
    b = _learner(address, tmp_path / "b", 2, total)
    progress = r"^([\d,]+)/10,000,000 env steps "
    try:
        for p in (a, b):
            assert p.wait_for(r"2 learner\(s\)", DEADLINE), p.text()
        assert a.wait_for(progress + ".*learners 2", DEADLINE), a.text()
        b.kill()  # a lost machine: no goodbye, the broker drops it after moolib's group timeout
        assert a.wait_for("lost the group ", DEADLINE), a.text()
        lost = a.find("lost the group ")
        assert a.wait_for(r"1 learner\(s\), leader this learner", DEADLINE, since=lost), a.text()
        alone = a.find(r"1 learner\(s\), leader this learner", since=lost)
        assert a.wait_until(lambda: len(set(a.steps(since=alone))) >= 2, DEADLINE), a.text()  # A trains on alone
        a.p.send_signal(signal.SIGTERM)
        assert a.wait(DEADLINE) == 0, a.text()
    finally:
        for p in (a, b):
            p.stop()
    stopped = _final(tmp_path / "a")["step"]
    assert a.has("SIGTERM received") and a.has(f"stopped at step {stopped:,};"), a.text()

    # re-running the learner resumes its run directory (here alone in its group) to a new target
    a2 = _learner(address, tmp_path / "a", 1, stopped + 2000)
    try:
        assert a2.wait(DEADLINE) == 0, a2.text()
    finally:
        a2.stop()
    assert a2.has(re.escape(f"resuming {tmp_path / 'a'} from step {stopped:,}"))
    assert _final(tmp_path / "a")["step"] >= stopped + 2000


@pytest.mark.moolib
@pytest.mark.slow
def test_mismatched_learner_is_refused_with_one_line(tmp_path, broker):
    address, _ = broker
    a = _learner(address, tmp_path / "a", 1, 10**7)
    try:
        assert a.wait_for(r"1 learner\(s\), leader this learner", DEADLINE), a.text()
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "rfwp_rl",
                "train",
                *TINY,
                "--broker",
                address,
                "--group",
                "test/g",
                "--seed",
                "2",
                "--total-steps",
                str(10**7),
                "--discount",
                "0.9",
                "--run-dir",
                str(tmp_path / "b"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
    finally:
        a.stop()
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(errors) == 1, bad.stdout + bad.stderr
    assert re.match(
        r"error: learner learner-\S+-s1-\S+ of group 'test/g' trains with other settings "
        r"\(discount 0\.99 there, 0\.9 here\)",
        errors[0],
    ), errors


# ------------------------------------------------------------------ remote actor: env timeout, no hung worker


@pytest.mark.moolib
@pytest.mark.slow
def test_remote_actor_times_out_a_hung_env_and_leaves_no_worker(tmp_path):
    port = free_port()
    env = [
        "--env",
        "fault_envs:FaultCartPole-v0",
        "--env-option",
        "hang_at=30",
        "--core",
        "lstm",
        "--set",
        "core_config.hidden_size=16",
    ]
    learner = Proc(
        "train",
        *env,
        "--num-actors",
        "0",
        "--listen",
        f"127.0.0.1:{port}",
        "--unroll-length",
        "5",
        "--batch-size",
        "2",
        "--total-steps",
        str(10**7),
        "--run-dir",
        str(tmp_path / "run"),
    )
    actor = None
    try:
        assert learner.wait_for("listening for remote actors", DEADLINE), learner.text()
        actor = Proc(
            "actor",
            "--connect",
            f"localhost:{port}",
            *env,
            "--num-actors",
            "2",
            "--num-env-processes",
            "1",
            "--env-timeout",
            "3",
            "--rpc-timeout",
            "5",
        )  # a host name: resolved before moolib sees it
        assert actor.wait_for("connected to the learner", DEADLINE), actor.text()
        code = actor.wait(DEADLINE)
        left = ended(actor.workers, DEADLINE)  # before stop() would end them
    finally:
        for p in (learner, actor):
            if p is not None:
                p.stop()
    out = actor.text()
    assert code == 1, out
    assert "(env timeout 3 s): an env is hung); exiting (restart the actor)" in out
    assert "ending the env worker processes" in out  # released: the hung worker does not outlive the actor
    assert actor.workers and not left, (actor.workers, left)
