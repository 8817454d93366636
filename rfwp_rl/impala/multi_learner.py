"""Keep one IMPALA learner in sync with its group of data-parallel learners (moolib Broker/Group/Accumulator).

``rfwp-rl train ... --broker HOST:PORT --group NAME`` makes the learner one of a group that trains
one model: every learner has its own actors (and remote actors, ``--listen``), and each optimizer
step of the group applies the same gradients on every learner, so their parameters stay equal:

- **Rounds.** Between env steps the training loop calls :meth:`LearnerGroup.sync`. A learner with a
  full batch computes its gradients and hands them in (:meth:`LearnerGroup.hand_in`); one without
  lets the round go on without it (:meth:`LearnerGroup.idle`). moolib all-reduces the handed-in
  gradients; when the round is done every learner, whether it handed in or not, makes the same
  optimizer step on the same averaged gradients (:meth:`rfwp_rl.impala.learner.Learner.apply`). Nothing
  here blocks the loop: actors keep acting while a round is under way.
- **Averaging.** The gradients are averaged weighted by the env steps they were computed on (see
  :func:`group_gradient_factor`), and the steps of a round are summed: ``counters["step"]`` and the
  LR schedule are the group's, so ``--total-steps`` means env steps trained by the whole group and
  every learner stops at the same round.
- **Joining.** A new learner first asks every member for its settings (``rfwp_learner_info``) and
  stops with a one-line error if the env, agent or learner settings differ. Then it creates its
  Accumulator; moolib elects the member with the highest model version (update count) as leader,
  and the leader serves its parameters plus the shared state (optimizer, LR schedule, global
  counters: :meth:`rfwp_rl.impala.learner.Learner.shared_state`) to the newcomer. A learner
  resumed from a checkpoint with more updates than the group becomes the leader.
- **Leaving.** A heartbeat thread keeps this learner's membership alive while it computes. When a
  learner stops or dies, the broker drops it after moolib's group timeout (10 s without a heartbeat);
  the round under way is abandoned, and the others go on as a smaller group.

- **Trust.** Only holders of the shared key reach a member (moolib's connection handshake,
  :mod:`rfwp_rl.impala.wire`). What they send is still checked before use. moolib (our patch,
  ``third_party/moolib``) takes a model or buffer update only from the elected leader, only when this
  learner asked for it (or as the leader's periodic re-sync of the version it holds), and only if every
  tensor has this learner's dtype and shape and finite values; it counts the others, which the learner
  reports (``net/refused_model_updates``). A round whose reduced
  gradients are not finite, or whose env-step count is more than its learners can have handed in,
  advances only the schedule (as a skipped update does); a leader's state whose counters are not
  sane (negative, more updates than env steps, or beyond ``--total-steps`` by more than a round), that
  does not have the form of this learner's own (:meth:`rfwp_rl.impala.learner.Learner.check_shared_state`),
  or that came with parameters or buffers holding NaN/inf is not adopted: moolib has already copied
  the received model in, so the learner puts back its own (a copy kept after every accepted change) and
  keeps its model version. A member's malformed answer to the settings check is not taken as a
  learner's. Every handler goes through :func:`rfwp_rl.impala.wire.handler`. Each refusal is counted
  (``group/refused``) and logged in one line, and the learner goes on.

moolib 0.0.9b0 note: ``Accumulator.reduce_gradients(n)`` uses ``n`` only to decide when a round has
enough data (``set_virtual_batch_size``); the reduced gradient is the plain mean over the number of
hand-ins. The batch-size weighting is therefore done here, from ``get_gradient_stats()``.

:class:`LearnerGroup` takes the :class:`rfwp_rl.impala.learner.Learner`. Without ``--broker`` there is no
group: the learner makes its own optimizer steps (:meth:`rfwp_rl.impala.learner.Learner.update`).
"""

from __future__ import annotations

import io
import json
import math
import re
import socket
import sys
import threading
import time
from typing import Any

import torch

from rfwp_rl.errors import UserError
from rfwp_rl.impala.env_batches import import_moolib
from rfwp_rl.impala.learner import Gradients, GroupStep
from rfwp_rl.impala.net import resolve_address, settings_mismatch
from rfwp_rl.impala.wire import RefusalLog, Refused, check_int, check_name, handler, short

GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,99}")
INFO_FUNCTION = "rfwp_learner_info"
HANDSHAKE_SECONDS = 15.0  # a member that does not answer within this long is not checked (it may be gone)
HEARTBEAT_SECONDS = 0.5  # how often the heartbeat thread pings the broker (moolib pings every 4 s of these)
LINGER_SECONDS = 1.5  # a finished learner stays this long so that the others receive the last round
WAITING_NOTE_SECONDS = 30.0  # how often a learner not yet in its group says it is still waiting


def group_gradient_factor(num_gradients: int, group_env_steps: int, steps_per_update: int) -> float:
    """Factor that turns moolib's reduced gradient into the batch-size-weighted group gradient.

    Learner k hands in ``g_k``, the gradient of its loss summed over its ``n_k`` env steps
    (:func:`rfwp_rl.impala.loss.compute_loss`). moolib 0.0.9b0 puts ``sum_k g_k / K`` in every
    learner's ``.grad`` (K = ``num_gradients``). The group gradient is the per-step mean over all
    the round's env steps, in the scale of one learner's batch of ``S = steps_per_update`` steps::

        G = S * sum_k g_k / sum_k n_k = (sum_k g_k / K) * (K * S / sum_k n_k)

    so each env step counts the same, whichever learner it came from; with one learner ``G = g``,
    and with equal batches it is the plain mean (factor 1). ``group_env_steps = sum_k n_k``.
    """
    if num_gradients < 1 or group_env_steps < 1 or steps_per_update < 1:
        raise ValueError(
            f"group_gradient_factor needs positive counts, got {num_gradients}, {group_env_steps}, {steps_per_update}"
        )
    return num_gradients * steps_per_update / group_env_steps


def check_group_args(broker: str, group: str) -> None:
    """One-line :class:`UserError` for ``--broker``/``--group`` values that cannot work."""
    if group and not broker:
        raise UserError(
            f"--group {group!r} needs --broker HOST:PORT (the moolib broker the group meets at: "
            "rfwp-rl broker --address HOST:PORT)"
        )
    if broker:
        resolve_address(broker, "--broker")
        if not group:
            raise UserError(
                f"--broker {broker} needs --group NAME: learners with the same group name at the same "
                "broker train one model"
            )
        if not GROUP_NAME.fullmatch(group):
            raise UserError(
                f"--group {group!r} is invalid; allowed: 1-100 characters from letters, digits and "
                "_ . - /, starting with a letter or digit"
            )


def check_counters(counters: Any, total_steps: int | None, slack: int) -> dict:
    """A leader's shared counters, if sane: ``step`` and ``updates`` integers with ``0 <= updates <= step``
    (every update trains at least one env step) and ``step <= total_steps + slack`` (the last round may
    pass the target by at most ``slack`` env steps); else :class:`Refused`."""
    if not isinstance(counters, dict) or not {"step", "updates"} <= set(counters):
        raise Refused("shared counters must hold 'step' and 'updates'")
    limit = 2**62 if total_steps is None else total_steps + slack
    step = check_int(counters["step"], "shared step counter", 0, limit)
    check_int(counters["updates"], "shared update counter", 0, step)
    return counters


def member_info(reply: Any) -> dict:
    """A member's answer to ``rfwp_learner_info``: a JSON object ``{"settings": {...}, "seed": int}``
    (:meth:`LearnerGroup._info`); else :class:`Refused`, naming what it is instead."""
    if isinstance(reply, dict) and isinstance(reply.get("error"), str):
        raise Refused(f"it answered an error: {reply['error'][:200]}")
    if not isinstance(reply, str):
        raise Refused(f"the reply must be a JSON string, got {short(reply)}")
    try:
        info = json.loads(reply)
    except (ValueError, RecursionError):
        raise Refused("the reply is not JSON (or nested too deep)") from None
    if not isinstance(info, dict) or not isinstance(info.get("settings"), dict):
        raise Refused(f"the reply must be an object with 'settings' and 'seed', got {short(info)}")
    check_int(info.get("seed"), "its seed", -(2**63), 2**63 - 1)
    return info


def pack(obj: Any) -> torch.Tensor:
    """``obj`` (tensors, numbers, containers) as a uint8 tensor: moolib sends Python floats as float32,
    which would round e.g. the optimizer's learning rate; a tensor of bytes travels unchanged."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def unpack(data: torch.Tensor) -> Any:
    """Inverse of :func:`pack`."""
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu", weights_only=True)


class LearnerGroup:
    """This learner's membership of a moolib group, and the rounds of gradient averaging.

    Create it after the env pool (moolib forks there, and refuses to once Rpc threads exist).
    :meth:`sync` runs on the training loop's thread and holds the learner's ``lock`` (it calls
    :meth:`Learner.apply`, ``shared_state`` and ``load_shared_state``, and moolib writes ``.grad``
    and the parameters there); :meth:`hand_in` is called with that lock held (from the learner
    thread with ``--learner-thread``). moolib calls are serialised by ``self._lock``.

    Args:
        broker: the broker's ``HOST:PORT``.
        group: the group name.
        learner: the :class:`rfwp_rl.impala.learner.Learner` (its parameters and buffers are shared
            with moolib: the averaged gradients land in the parameters' ``.grad``, a joining
            learner's tensors are overwritten in place; its ``steps_per_update`` is the gradient
            scale and its update count the model version, the highest of which leads).
        settings: what every learner of the group must share (env, agent, learner settings).
        seed: this learner's ``--seed`` (a member with the same seed gets a warning).
        total_steps: the run's ``--total-steps`` (bounds the counters a leader may hand over).
    """

    def __init__(
        self, broker: str, group: str, learner: Any, settings: dict, seed: int, total_steps: int | None = None
    ):
        moolib = import_moolib()
        if not hasattr(moolib, "accumulator_refusals"):
            raise UserError(
                "the installed moolib does not check a learner group's model updates (an older build of "
                "rfwp_rl's patch); run: bash scripts/build_moolib.sh"
            )
        self.moolib, self.broker, self.group_name = moolib, broker, group
        self.learner = learner
        self.parameters = learner.parameters()
        self._model = [*self.parameters, *learner.buffers()]  # what moolib may overwrite with the leader's
        self._kept: list[torch.Tensor] | None = None  # their copy as last accepted (_keep_model)
        self.steps_per_update = int(learner.steps_per_update)
        self.settings = json.loads(json.dumps(settings, sort_keys=True, default=str))  # as the others see it
        self.seed = int(seed)
        self.total_steps = total_steps
        self.refusals = RefusalLog(f"group {group}")
        self._info_json = json.dumps({"settings": self.settings, "seed": self.seed}, sort_keys=True)
        self.name = f"learner-{socket.gethostname()}-s{seed}-{moolib.create_uid()[:6]}"
        self._lock = threading.Lock()
        self.rpc = moolib.Rpc()
        self.rpc.set_name(self.name)
        self.rpc.define(INFO_FUNCTION, handler(self._info, self.refusals))
        try:
            self.rpc.connect(resolve_address(broker, "--broker"))
        except (RuntimeError, ValueError) as e:
            raise UserError(f"--broker {broker}: cannot connect there ({str(e).splitlines()[0]})") from None
        self.group = moolib.Group(self.rpc, group)
        self.acc = None  # created once this learner's settings are checked against the members'
        self.in_flight = 0  # env steps handed in to the round under way
        self._handed_in = False  # this iteration (idle() skips otherwise)
        self._round_sync_id = 0
        self._asked: dict[str, Any] = {}  # member -> future of its settings
        self._ask_started = 0.0
        self._members: list[str] = []
        self._connected = False
        self._took_model = False
        self._leader = ""
        self.last_gradients = 0
        self.dropped_rounds = 0
        self.dropped_batches = 0
        self._waiting_since = self._waiting_noted = time.monotonic()
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="group-heartbeat", daemon=True)
        self._heartbeat.start()
        self._say(f"joining group {group!r} at broker {broker}")

    # ---- moolib-side helpers
    def _info(self) -> str:
        """RPC handler (must never raise): this learner's settings for a newcomer's check, as JSON
        (moolib would send floats as float32)."""
        return self._info_json

    def _beat(self) -> None:
        """Keep the membership alive while the training loop computes (the broker drops a member
        that has not pinged for moolib's group timeout, 10 s)."""
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with self._lock:
                self.group.update()

    def _say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] group {self.group_name}: {text}", flush=True)

    @property
    def size(self) -> int:
        return max(1, len(self._members))

    # ---- joining
    def _check_members(self) -> bool:
        """Ask every other member for its settings; True once all answered (or did not in time).
        A member with other settings is a one-line UserError (this learner's model stays untouched)."""
        members = list(self.group.members())
        if self.name not in members:
            return False  # the broker has not taken this learner in yet
        if not self._asked:
            self._ask_started = time.monotonic()
        for member in members:
            if member != self.name and member not in self._asked:
                self._asked[member] = self.rpc.async_(member, INFO_FUNCTION)
        waiting = False
        for member, future in list(self._asked.items()):
            if future is None:
                continue
            if not future.done():
                waiting = True
                continue
            self._asked[member] = None
            try:
                reply = member_info(future.result())
            except RuntimeError:
                continue  # gone meanwhile (the broker will drop it)
            except Refused as e:  # not a learner of this package, or a broken one: not checked
                self.refusals.refuse(f"the settings of member {member}: {e}")
                continue
            mismatch = settings_mismatch(self.settings, reply["settings"])
            if mismatch:
                raise UserError(
                    f"learner {member} of group {self.group_name!r} trains with other settings "
                    f"({mismatch}); every learner of a group needs the same env, agent and learner "
                    "options (--env/--core/--preset/--set/--batch-size/--unroll-length/"
                    "--learning-rate/...)"
                )
            if reply["seed"] == self.seed:
                print(
                    f"warning: learner {member} also uses --seed {self.seed}: its actors play the same episodes "
                    "as this learner's; give each learner its own --seed",
                    file=sys.stderr,
                    flush=True,
                )
        return not waiting or time.monotonic() - self._ask_started > HANDSHAKE_SECONDS

    def _create_accumulator(self) -> None:
        for p in self.parameters:  # moolib needs every gradient allocated, always
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        self.acc = self.moolib.Accumulator("model", self.parameters, self.learner.buffers(), group=self.group)
        self.acc.set_virtual_batch_size(1)  # a round ends as soon as any learner handed in a batch
        self.acc.set_model_version(self.learner.updates)
        self._keep_model()

    # ---- the training loop's side
    def sync(self) -> None:
        """Between env steps: membership, the shared state (serve it as leader, adopt the leader's),
        and, when a round has finished, the learner's optimizer step on the averaged gradients in
        ``.grad``. Returns at once, doing nothing, while the learner thread holds the learner's lock."""
        if not self.learner.lock.acquire(blocking=False):
            return
        try:
            with self._lock:
                self.group.update()
                if self.acc is None:
                    self._join()
                else:
                    self._sync()
        finally:
            self.learner.lock.release()

    def _join(self) -> None:
        if self._check_members():
            self._create_accumulator()
        elif time.monotonic() - self._waiting_noted >= WAITING_NOTE_SECONDS:
            self._waiting_noted = time.monotonic()
            self._say(
                f"still waiting to join ({time.monotonic() - self._waiting_since:.0f} s): is "
                f"`rfwp-rl broker` running at {self.broker}? (training starts once this learner "
                "is in the group)"
            )

    def _sync(self) -> None:
        version = self.acc.model_version()
        try:
            self.acc.update()
        except RuntimeError as e:  # moolib could not copy a received model in (e.g. a tensor's shape differs)
            self._refuse_model(f"the group's model: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            return
        self._report_membership()
        if self.in_flight and self.group.sync_id() != self._round_sync_id:
            self.in_flight = 0  # the group changed: moolib abandoned the round (a learner came or went)
            self.dropped_rounds += 1
        adopted = self.acc.has_new_state()
        if adopted:
            try:
                leader, shared = self._leader_state(self.acc.state())
                self._check_model()
                self.learner.load_shared_state(shared)
            except Refused as e:
                self._refuse_model(f"the leader's state: {e}")
                adopted = False
            else:
                self._keep_model()
                if not self._took_model or self.acc.model_version() != version:  # else the leader's re-sync
                    self._say(f"took the model of {leader} at update {self.acc.model_version():,}")
                self._took_model = True
        if self.acc.has_gradients():
            if not adopted:  # else: the state adopted in this same update already includes the round
                self._step(self.acc.get_gradient_stats())
            self.acc.zero_gradients()
            self.in_flight = 0
        if self.acc.wants_state():  # after any step: the served model and state belong together
            self.acc.set_state({"shared": pack(self.learner.shared_state()), "leader": self.name})

    def _keep_model(self) -> None:
        """Copy the model as this learner now holds it (its own, or an adopted one that passed the checks):
        what a refused adoption rolls back to (moolib writes a received model into the parameters
        before this side can look at it)."""
        with torch.no_grad():
            if self._kept is None:
                self._kept = [t.detach().clone() for t in self._model]
            else:
                for kept, t in zip(self._kept, self._model):
                    kept.copy_(t)

    def _refuse_model(self, problem: str) -> None:
        """Refuse what moolib took in: log it, put this learner's last kept model back, and keep its own
        model version (the leader's is not adopted)."""
        self.refusals.refuse(problem)
        if self._kept is not None:
            with torch.no_grad():
                for kept, t in zip(self._kept, self._model):
                    t.copy_(kept)
        self.acc.set_model_version(self.learner.updates)

    def _check_model(self) -> None:
        """:class:`Refused` if an adopted parameter or buffer holds NaN or inf values (moolib has already
        copied it in with this learner's shapes and dtypes, so those cannot differ)."""
        for i, t in enumerate(self._model):
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                kind = "parameter" if i < len(self.parameters) else "buffer"
                raise Refused(f"the adopted model's {kind} {i} holds NaN or inf values")

    def _leader_state(self, state: Any) -> tuple[str, dict]:
        """The leader's name and shared state (:meth:`Learner.shared_state`), checked; :class:`Refused`."""
        if (
            not isinstance(state, dict)
            or not isinstance(state.get("shared"), torch.Tensor)
            or state["shared"].dtype != torch.uint8
            or state["shared"].dim() != 1
        ):
            raise Refused("the state must be {'shared': uint8 tensor, 'leader': name}")
        leader = check_name(state.get("leader"), "leader name")
        try:
            shared = unpack(state["shared"])
        except Exception as e:  # noqa: BLE001 - weights_only refuses anything but tensors and plain data
            raise Refused(f"unreadable shared state ({type(e).__name__})") from None
        if not isinstance(shared, dict):
            raise Refused("the shared state must be a dict")
        if "counters" in shared:
            check_counters(shared["counters"], self.total_steps, self._round_limit())
        scale = shared.get("return_scale", {})
        square = scale.get("mean_square") if isinstance(scale, dict) else "?"
        if square is not None and not (isinstance(square, float) and math.isfinite(square) and square >= 0):
            raise Refused("return_scale.mean_square must be None or a finite float >= 0")
        return leader, shared

    def _round_limit(self) -> int:
        """The most env steps one round can add: every member hands in one batch."""
        return max(1, len(self._members)) * self.steps_per_update

    def _step(self, stats: dict) -> None:
        """The round's optimizer step: moolib's mean gradient, reweighted by env steps. A round whose
        gradients are not finite or whose env-step count cannot be is only counted: the schedule
        advances as for a skipped update, on every learner alike (they all see the same round)."""
        if stats["num_gradients"] < 1:
            return
        limit = stats["num_gradients"] * self.steps_per_update
        problem = None
        if not 1 <= stats["batch_size"] <= limit:
            problem = f"{stats['batch_size']:,} env steps from {stats['num_gradients']} learner(s) (at most {limit:,})"
        elif not all(bool(torch.isfinite(p.grad).all()) for p in self.parameters if p.grad is not None):
            problem = "the reduced gradients hold NaN or inf values"
        if problem:
            self.refusals.refuse(f"a round: {problem}")
            self.learner.apply(GroupStep(env_steps=0, gradients=0, own_steps=0))
            return
        factor = group_gradient_factor(stats["num_gradients"], stats["batch_size"], self.steps_per_update)
        if factor != 1.0:
            for p in self.parameters:
                if p.grad is not None:
                    p.grad.mul_(factor)
        self.last_gradients = stats["num_gradients"]
        self.learner.apply(
            GroupStep(env_steps=stats["batch_size"], gradients=stats["num_gradients"], own_steps=self.in_flight)
        )
        self._keep_model()

    def wants_gradients(self) -> bool:
        """True when a round takes this learner's gradients now."""
        with self._lock:
            return self.acc is not None and self.acc.wants_gradients()

    def hand_in(self, gradients: Gradients) -> None:
        """Hand this learner's gradients (in ``.grad``) to the round under way; not finite: leave
        this round without them. The optimizer step follows in :meth:`sync` once the round is done."""
        env_steps, finite = gradients.env_steps, gradients.finite
        with self._lock:
            self._handed_in = True
            if self.acc is None or not self.acc.wants_gradients():  # the group changed since the check
                for p in self.parameters:
                    if p.grad is not None:
                        p.grad.zero_()
                self.dropped_batches += 1
                return
            if finite:
                self.acc.reduce_gradients(int(env_steps))  # copies .grad and zeroes it
                self.in_flight += int(env_steps)
                self._round_sync_id = self.group.sync_id()
            else:
                self.acc.skip_gradients()

    def idle(self) -> None:
        """End of a loop iteration: if this learner handed nothing in, the round goes on without it."""
        with self._lock:
            if not self._handed_in and self.acc is not None and self.acc.wants_gradients():
                self.acc.skip_gradients()
            self._handed_in = False

    def _report_membership(self) -> None:
        connected = self.acc.connected()
        members = sorted(self.group.members())
        leader = self.acc.get_leader() if connected else ""
        if connected != self._connected or (connected and (members != self._members or leader != self._leader)):
            if connected:
                who = "this learner" if leader == self.name else leader
                self._say(f"{len(members)} learner(s), leader {who}, update {self.acc.model_version():,}")
            else:
                self._say("lost the group (a learner came or went, or the broker is unreachable); waiting")
        self._connected, self._members, self._leader = connected, members, leader

    def stats(self) -> dict[str, float]:
        """TensorBoard scalars: group size, leadership, batches averaged in the last step, rounds the
        group abandoned with this learner's gradients in them, batches it came too late for."""
        return {
            "group/size": float(self.size),
            "group/leader": float(self._leader == self.name),
            "group/gradients_per_step": float(self.last_gradients),
            "group/dropped_rounds": float(self.dropped_rounds),
            "group/refused_batches": float(self.dropped_batches),
            "group/refused": float(self.refusals.count),
        }

    def close(self, finished: bool = False) -> None:
        """Leave the group. ``finished``: stay ``LINGER_SECONDS`` first (still answering moolib), so
        that the last round's result reaches every other learner before this process exits."""
        if finished:
            end = time.monotonic() + LINGER_SECONDS
            while time.monotonic() < end:
                with self._lock:
                    self.group.update()
                    if self.acc is not None:
                        self.acc.update()
                time.sleep(0.02)
        self._stop.set()
        self._heartbeat.join(timeout=5)
        self.acc = None
