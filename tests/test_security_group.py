"""A learner group's key holders, bounded: what a member or a leader sends is checked before it is taken.

moolib is replaced by a stand-in (:class:`FakeMoolib`) that delivers what a peer would send: a member's
answer to the settings check, and a leader's model and shared state, written into the parameters as
moolib's Accumulator does before the learner looks at them. The learner is a real one (a tiny MLP agent).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rfwp_rl.agent import Agent
from rfwp_rl.errors import UserError
from rfwp_rl.impala.config import ImpalaConfig
from rfwp_rl.impala.learner import Learner
from rfwp_rl.impala.multi_learner import INFO_FUNCTION, LearnerGroup, member_info, pack, unpack
from rfwp_rl.impala.wire import Refused

PACKAGE = Path(__file__).resolve().parent.parent / "rfwp_rl"
SETTINGS = {"env": "CartPole-v1", "x": 1}


class FakeFuture:
    def __init__(self, reply: Any):
        self.reply = reply

    def done(self) -> bool:
        return True

    def result(self) -> Any:
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply


class FakeRpc:
    def __init__(self, moolib: FakeMoolib):
        self.moolib = moolib

    def set_name(self, name: str) -> None:
        self.moolib.name = name

    def define(self, name: str, fn: Any) -> None:
        self.moolib.defined[name] = fn

    def connect(self, address: str) -> None:
        pass

    def async_(self, member: str, function: str, *args: Any) -> FakeFuture:
        return FakeFuture(self.moolib.replies[member])


class FakeGroup:
    def __init__(self, moolib: FakeMoolib):
        self.moolib = moolib

    def update(self) -> None:
        pass

    def members(self) -> list[str]:
        return [self.moolib.name, *self.moolib.replies]

    def sync_id(self) -> int:
        return 1


class FakeAccumulator:
    """moolib's Accumulator as a member sees it: a received model is copied into the parameters and
    buffers inside ``update()``, then ``has_new_state()`` says so and ``state()`` hands the user state."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.tensors = tensors
        self.version = 0
        self.incoming: tuple[list[torch.Tensor], int, Any] | None = None
        self.fail_after: int | None = None  # raise as moolib does when a copy fails, after this many tensors
        self._state: Any = None

    def update(self) -> None:
        if self.incoming is None:
            return
        tensors, version, state = self.incoming
        self.incoming = None
        self.version = version
        with torch.no_grad():
            for i, (t, new) in enumerate(zip(self.tensors, tensors)):
                if i == self.fail_after:
                    raise RuntimeError("The size of tensor a (64) must match the size of tensor b (3)")
                t.copy_(new)
        self._state = state

    def set_virtual_batch_size(self, n: int) -> None:
        pass

    def set_model_version(self, version: int) -> None:
        self.version = version

    def model_version(self) -> int:
        return self.version

    def connected(self) -> bool:
        return True

    def get_leader(self) -> str:
        return "learner-leader"

    def has_new_state(self) -> bool:
        return self._state is not None

    def state(self) -> Any:
        state, self._state = self._state, None
        return state

    def has_gradients(self) -> bool:
        return False

    def wants_state(self) -> bool:
        return False


class FakeMoolib:
    def __init__(self, replies: dict[str, Any]):
        self.replies = replies
        self.defined: dict[str, Any] = {}
        self.name = ""
        self.acc: FakeAccumulator | None = None
        # the patched build's counts of refused model updates (an older build has no such function)
        self.accumulator_refusals = lambda: {"not_leader": 0, "not_requested": 0, "mismatch": 0, "not_finite": 0}

    def create_uid(self) -> str:
        return "0123456789"

    def Rpc(self) -> FakeRpc:  # noqa: N802 - moolib's names
        return FakeRpc(self)

    def Group(self, rpc: FakeRpc, name: str) -> FakeGroup:  # noqa: N802
        return FakeGroup(self)

    def Accumulator(self, name, parameters, buffers, group) -> FakeAccumulator:  # noqa: N802
        self.acc = FakeAccumulator([*parameters, *buffers])
        return self.acc


def _learner() -> Learner:
    torch.manual_seed(0)
    return Learner(Agent((4,), 2, "ff"), ImpalaConfig(env="CartPole-v1", batch_size=2, unroll_length=3))


def _group(monkeypatch, replies: dict[str, Any], learner: Learner | None = None) -> tuple[LearnerGroup, FakeMoolib]:
    fake = FakeMoolib(replies)
    monkeypatch.setattr("rfwp_rl.impala.multi_learner.import_moolib", lambda: fake)
    group = LearnerGroup("127.0.0.1:1", "g", learner or _learner(), SETTINGS, seed=1, total_steps=10**6)
    return group, fake


def _info(seed: int = 2) -> str:
    return json.dumps({"settings": SETTINGS, "seed": seed})


@pytest.fixture
def joined(monkeypatch):
    group, fake = _group(monkeypatch, {"learner-leader": _info()})
    group.sync()
    assert fake.acc is not None
    yield group, fake
    group.close()


def _model(learner: Learner) -> list[torch.Tensor]:
    return [t.detach().clone() for t in [*learner.parameters(), *learner.buffers()]]


def _leader_shared(learner: Learner, **changes: Any) -> dict:
    shared = unpack(pack(learner.shared_state()))
    shared.update(changes)
    return shared


# ------------------------------------------------------------------ handlers


def test_every_rpc_handler_of_the_package_goes_through_the_wrapper():
    unwrapped = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "define":
                fn = node.args[1] if len(node.args) > 1 else None
                wrapped = isinstance(fn, ast.Call) and getattr(fn.func, "id", "") == "handler"
                if not wrapped:
                    unwrapped.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert unwrapped == []


def test_a_moolib_build_that_does_not_check_model_updates_is_refused(monkeypatch):
    fake = FakeMoolib({})
    del fake.accumulator_refusals
    monkeypatch.setattr("rfwp_rl.impala.multi_learner.import_moolib", lambda: fake)
    with pytest.raises(UserError, match=r"does not check a learner group's model updates .* run: bash scripts/"):
        LearnerGroup("127.0.0.1:1", "g", _learner(), SETTINGS, seed=1)


def test_the_settings_handler_answers_a_call_with_wrong_arguments_with_an_error(monkeypatch, capsys):
    group, fake = _group(monkeypatch, {})
    try:
        info = fake.defined[INFO_FUNCTION]
        assert json.loads(info()) == {"settings": SETTINGS, "seed": 1}
        reply = info("unexpected", 3)
        assert reply["error"].startswith("could not handle _info: TypeError"), reply
        assert group.refusals.count == 1
        assert "refused a message: could not handle _info: TypeError" in capsys.readouterr().err
    finally:
        group.close()


# ------------------------------------------------------------------ a member's settings


@pytest.mark.parametrize(
    "reply, message",
    [
        (["settings", 1], "must be a JSON string, got \\['settings', 1\\]"),
        (json.dumps([1, 2]), "must be an object with 'settings' and 'seed', got \\[1, 2\\]"),
        (json.dumps({"settings": [], "seed": 1}), "must be an object"),
        (json.dumps({"settings": {}, "seed": "1"}), "its seed must be an integer"),
        ("{not json", "not JSON"),
        ("[" * 100_000, "not JSON"),
        ({"error": "refused: x"}, "it answered an error: refused: x"),
        (7, "must be a JSON string"),
    ],
)
def test_a_members_malformed_settings_are_refused(reply, message):
    with pytest.raises(Refused, match=message):
        member_info(reply)


def test_malformed_member_replies_are_logged_and_the_learner_joins(monkeypatch, capsys):
    replies = {"learner-a": ["a", "list"], "learner-b": json.dumps([1]), "learner-c": _info(), "learner-d": None}
    replies["learner-d"] = RuntimeError("gone")  # a member that left meanwhile: not a refusal
    group, fake = _group(monkeypatch, replies)
    try:
        group.sync()
        assert fake.acc is not None  # joined: the malformed members were not taken as learners
        assert group.refusals.count == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err  # one line: the first refusal; the next within WARN_EVERY_SECONDS are counted
        assert err[0].startswith("warning: group g refused a message: the settings of member learner-"), err
    finally:
        group.close()


# ------------------------------------------------------------------ a leader's state and model


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.pop("optimizer"), "the shared state must hold"),
        (lambda s: s.update(optimizer=[1, 2]), "optimizer state must hold"),
        (lambda s: s["optimizer"]["param_groups"][0].update(lr="0.1"), "lr must be a finite number"),
        (lambda s: s["optimizer"]["param_groups"][0].update(lr=1.0), "lr is 1.0; allowed: 0..0.0006"),
        (lambda s: s["optimizer"]["param_groups"][0].update(eps=0.5), "eps is 0.5, this learner's 0.01"),
        (lambda s: s["optimizer"]["param_groups"][0].update(params=[7, 6, 5, 4, 3, 2, 1, 0]), "params is"),
        (lambda s: s["optimizer"]["state"].update({99: {}}), "optimizer.state must map parameter indices"),
        (lambda s: s["optimizer"]["state"][0].update(square_avg=torch.zeros(3)), r"must be a tensor \[64, 4\]"),
        (lambda s: s["optimizer"]["state"][0]["square_avg"].fill_(float("nan")), "holds NaN or inf"),
        (lambda s: s["optimizer"]["state"][0].pop("step"), r"optimizer.state\[0\] must hold"),
        (lambda s: s["scheduler"].update(base_lrs=[10.0]), "scheduler.base_lrs is"),
        (lambda s: s["scheduler"].update(last_epoch=1.5), "last_epoch must be int"),
        (lambda s: s["counters"].update(step=-1), "counters.step must be an integer"),
        (lambda s: s.update(counters=[0, 0]), "counters must hold"),
        (lambda s: s.update(return_scale={"mean_square": -1.0}), "mean_square must be None or a finite float"),
        (lambda s: s.update(extra=1), "the shared state must hold"),
    ],
)
def test_a_malformed_leader_state_is_refused_and_nothing_is_taken(change, message):
    leader, member = _learner(), _learner()
    for p in leader.agent.parameters():  # a leader that has trained: its optimizer holds state
        p.grad = torch.ones_like(p)
    leader.optimizer.step()
    good = _leader_shared(leader)
    member.check_shared_state(good)  # the unchanged state fits
    bad = _leader_shared(leader)
    change(bad)
    before = member.shared_state()
    with pytest.raises(Refused, match=message):
        member.load_shared_state(bad)
    after = member.shared_state()
    assert after["optimizer"]["state"] == {} and after["scheduler"] == before["scheduler"]
    assert after["counters"] == before["counters"] and member.adoptions == 0


def test_a_refused_adoption_puts_the_learners_own_model_back_and_a_good_one_is_taken(joined, capsys):
    group, fake = joined
    learner = group.learner
    own = _model(learner)
    leader = _learner()
    with torch.no_grad():
        for p in leader.agent.parameters():
            p.add_(1.0)
    good_model = _model(leader)
    nan_model = [t.clone() for t in good_model]
    nan_model[0][0, 0] = float("nan")
    state = {"shared": pack(_leader_shared(leader, counters={"step": 40, "updates": 4})), "leader": "learner-leader"}
    malformed = {"shared": pack(_leader_shared(leader, optimizer=None)), "leader": "learner-leader"}

    attempts = [
        ("NaN parameters", (nan_model, 4, state), None),
        ("a malformed state", (good_model, 4, malformed), None),
        ("a model moolib could not copy in", (good_model, 4, state), 2),
    ]
    for what, incoming, fail_after in attempts:
        fake.acc.incoming, fake.acc.fail_after = incoming, fail_after
        group.sync()
        assert all(torch.equal(a, b) for a, b in zip(_model(learner), own)), what
        assert fake.acc.model_version() == learner.updates == 0, what
        assert learner.adoptions == 0 and learner.counters == {"step": 0, "updates": 0}, what
    assert group.refusals.count == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "warning: group g refused a message: the leader's state: the adopted model's parameter 0 holds NaN or inf "
        "values"
    ]

    fake.acc.incoming, fake.acc.fail_after = (good_model, 4, state), None
    group.sync()
    assert all(torch.equal(a, b) for a, b in zip(_model(learner), good_model))
    assert learner.adoptions == 1 and learner.counters == {"step": 40, "updates": 4}
    assert fake.acc.model_version() == 4
    fake.acc.incoming = (nan_model, 5, state)  # a later bad model: back to the adopted one, not the first
    group.sync()
    assert all(torch.equal(a, b) for a, b in zip(_model(learner), good_model))
    assert fake.acc.model_version() == 4 and group.refusals.count == 4
