"""Learner side of remote actors: a moolib ``Rpc`` endpoint that serves weights and takes rollouts.

``rfwp-rl train ... --listen HOST:PORT`` opens it; ``rfwp-rl actor --connect HOST:PORT``
(:mod:`rfwp_rl.impala.remote`) calls it. Three functions, all of which return a dict and
never raise (an exception inside a moolib handler aborts the whole learner process):

Every call is checked before use (:mod:`rfwp_rl.impala.wire`: names, sessions, versions;
:mod:`rfwp_rl.impala.rollout_check`: the rollout against the layout of the learner's own actors, the
episodes bounded and finite); a malformed one is answered ``{"error": "refused: ..."}``, counted
(``remote/rejected``) and logged in one line, and the learner goes on. Only peers holding the
shared key get this far (moolib drops the others in the connection handshake).

``hello(name, info)``
    The actor's env/core/agent description (:func:`compat_info`). Reply: ``{"error": "..."}``
    naming the first difference, or ``{"session", "version", "unroll_length", "finished"}``.
``get_weights(session, version)``
    ``{"session", "version"}`` plus ``"state"`` (a CPU ``state_dict``) unless the actor already
    holds that session's version. ``session`` is a random token per learner start, so a
    restarted learner's weights are never mistaken for an old version with the same number.
``put_rollout(name, session, version, data, state, episodes)``
    One rollout in the layout of :class:`rfwp_rl.impala.actors.Rollout`: ``data[key]``
    ``[T+1, b, *shape]`` for every key of :func:`rfwp_rl.impala.actors.rollout_spec` (its dtype and
    trailing shape; actions in the action distribution's range) (entry 0 repeats the previous rollout's
    last entry), ``state`` the core state (tuple of ``[b, ...]``) before entry 0, ``version``
    the weights version the rollout started with, ``episodes`` ``[(return, length), ...]`` of
    the episodes that ended in it. Reply ``{"ok", "session", "version", "finished"}``, or
    ``{"busy": True}`` (inbox full: resend later, this is the back-pressure), or ``{"error"}``.

The training loop drains the inbox with :meth:`RolloutServer.take` into the same
``RolloutQueue`` as its local actors' rollouts; the weights version is the learner's update
count, so ``policy lag = updates now - version the rollout started with``.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import torch

from rfwp_rl.errors import UserError
from rfwp_rl.impala.actors import Rollout
from rfwp_rl.impala.env_batches import import_moolib
from rfwp_rl.impala.net import first_mismatch, resolve_address
from rfwp_rl.impala.rollout_check import Layout, RolloutCheck
from rfwp_rl.impala.wire import RefusalLog, Refused, check_int, check_name, check_plain, handler

LEARNER_NAME = "learner"
PROTOCOL = 1
ACTIVE_SECONDS = 30.0  # an actor counts as connected if it called within this many seconds
# Actor names remembered (for the count of connected actors and for telling each that training finished):
# any key holder may call with ever new names, so the table is bounded; past this the oldest is forgotten.
MAX_ACTORS_SEEN = 4096


def compat_info(run: Any, agent: Any) -> dict:
    """What a remote actor must share with the learner: the run's :meth:`RunSpec.meta
    <rfwp_rl.impala.run_spec.RunSpec.meta>` (env, env options, core, core config, agent options,
    action count, observation shape) and the protocol version, JSON-normalised (tuples == lists)."""
    info = {"protocol": PROTOCOL, **run.meta(agent)}
    info.pop("trainer", None)
    info["env"] = info["env"].rpartition(":")[2]  # the env's id; where its module lives may differ per machine
    return json.loads(json.dumps(info, sort_keys=True, default=str))


MAX_VERSION = 2**62
MAX_SESSION_CHARS = 64


def _check_session(session: Any) -> str | None:
    if session is not None and (not isinstance(session, str) or len(session) > MAX_SESSION_CHARS):
        raise Refused(f"session must be None or a string of at most {MAX_SESSION_CHARS} characters")
    return session


class SeenActors:
    """The actors that called, by name: when each last called and whether it has heard that training
    finished. At most ``limit`` names (:data:`MAX_ACTORS_SEEN`); a new name past that drops the one that
    called longest ago. Not thread-safe (the server holds its lock)."""

    def __init__(self, limit: int = MAX_ACTORS_SEEN):
        self.limit = int(limit)
        self._last: OrderedDict[str, float] = OrderedDict()  # name -> last call (monotonic), oldest first
        self._told_finished: set[str] = set()

    def touch(self, name: str, now: float, finished: bool) -> None:
        """``name`` called at ``now``; ``finished``: its answer says that training finished."""
        self._last[name] = now
        self._last.move_to_end(name)
        while len(self._last) > self.limit:
            oldest, _ = self._last.popitem(last=False)
            self._told_finished.discard(oldest)
        if finished:
            self._told_finished.add(name)

    def __len__(self) -> int:
        return len(self._last)

    def active(self, now: float, within: float) -> int:
        """Actors that called within the last ``within`` seconds."""
        return sum(now - t < within for t in self._last.values())

    def not_told(self, now: float, within: float) -> list[str]:
        """Actors that called within the last ``within`` seconds and have not heard that training finished."""
        return [n for n, t in self._last.items() if now - t < within and n not in self._told_finished]


class RolloutServer:
    """Serves the learner's weights to remote actors and queues their rollouts.

    Create it after the env pool (moolib forks there, and refuses to once Rpc threads exist).
    It follows the :class:`rfwp_rl.impala.learner.Learner`: after every change of the model the
    learner calls :meth:`follow`, which makes a CPU copy of the parameters the served weights
    (version: the learner's update count). Thread-safe: handlers run on moolib threads,
    :meth:`follow` on the learner's thread, :meth:`take` on the training loop's.

    Args:
        address: ``HOST:PORT`` to listen on.
        learner: the learner (its agent gives the expected state shapes, its config the unroll
            length T, its device where :meth:`take` puts rollouts).
        info: :func:`compat_info` of the learner's run.
        max_pending: rollout entries (envs) held before ``put_rollout`` answers busy; also the most
            envs one rollout may carry.
        layout: what a local actor's rollout holds (:func:`rfwp_rl.impala.actors.rollout_spec`).
        actions_ok: the action space's check of received actions (``ActionDistribution.valid``).
        reward_range: the env's declared reward range, if any (bounds the received rewards:
            :func:`rfwp_rl.impala.rollout_check.reward_bounds`).
    """

    def __init__(
        self,
        address: str,
        learner: Any,
        info: dict,
        max_pending: int,
        layout: Layout,
        actions_ok: Callable[[torch.Tensor], bool],
        reward_range: tuple[float, float] | None = None,
    ):
        moolib = import_moolib()
        self.address = resolve_address(address, "--listen")
        self.learner = learner
        self.info = info
        self.unroll_length = int(learner.cfg.unroll_length)
        self.max_pending = int(max_pending)
        self.device = learner.device
        self.session = secrets.token_hex(6)
        template = learner.agent.initial_state(1)
        self.check = RolloutCheck(
            layout,
            [(tuple(s.shape[1:]), s.dtype) for s in template],
            self.unroll_length,
            self.max_pending,
            actions_ok,
            reward_range,
        )
        self.refusals = RefusalLog("learner (remote actors)")
        self.finished = False
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._weights: tuple[int, dict] | None = None
        self._inbox: deque[tuple[Rollout, int | None, list]] = deque()
        self._pending = 0  # env entries in the inbox
        self._seen = SeenActors()
        self.env_steps = 0  # remote env steps received (T per env per rollout)
        self.rollouts = 0
        self._lags: list[int] = []
        self._window = (time.monotonic(), 0, 0)  # (time, env_steps, rollouts) at the last stats()
        self.rpc = moolib.Rpc()
        self.rpc.set_name(LEARNER_NAME)
        for fn in (self.hello, self.get_weights, self.put_rollout):
            self.rpc.define(fn.__name__, handler(fn, self.refusals))
        try:
            self.rpc.listen(self.address)
        except RuntimeError as e:
            raise UserError(f"--listen {address}: cannot listen there ({e})") from None
        self.follow(learner)
        learner.followers.append(self)

    # ---- learner thread
    def follow(self, learner: Any) -> None:
        """Make the learner's current parameters the served weights (a CPU copy), as version ``learner.updates``."""
        state = {k: v.detach().to("cpu", copy=True) for k, v in learner.agent.state_dict().items()}
        with self._lock:
            self._weights = (int(learner.updates), state)

    def take(self, wait: float = 0.0) -> tuple[list[Rollout], list[tuple[float, int]]]:
        """All queued remote rollouts (moved to the device) and their finished episodes.

        ``wait``: seconds to wait for a rollout if none is queued (a learner without local actors).
        The policy lag of a rollout is the learner's update count now minus the version it started with."""
        with self._arrived:
            if not self._inbox and wait > 0:
                self._arrived.wait(wait)
            items = list(self._inbox)
            self._inbox.clear()
            self._pending = 0
        rollouts, episodes = [], []
        version = self.learner.updates
        for rollout, rollout_version, eps in items:
            data = {k: self._to_device(v) for k, v in rollout.data.items()}
            rollouts.append(Rollout(data, tuple(self._to_device(s) for s in rollout.state)))
            episodes += eps
            if rollout_version is not None:
                self._lags.append(version - rollout_version)
        return rollouts, episodes

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """CUDA: through page-locked memory, without blocking (torch keeps the staging buffer until the copy is
        done)."""
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    @property
    def rejected(self) -> int:
        """Calls refused so far (malformed, or a rollout that does not fit)."""
        return self.refusals.count

    def pop_lags(self) -> list[int]:
        """Policy lags (updates) of the rollouts taken since the last call."""
        lags, self._lags = self._lags, []
        return lags

    def stats(self, now: float) -> dict[str, float]:
        """Scalars since the previous call: ``remote/actors`` (active), ``remote/env_sps``,
        ``remote/rollouts_per_s``, ``remote/policy_lag`` (mean, updates; NaN if none),
        ``remote/policy_lag_max`` and ``remote/rejected`` (total)."""
        last_t, last_steps, last_rollouts = self._window
        dt = max(now - last_t, 1e-9)
        lags = self.pop_lags()
        out = {
            "remote/actors": float(self.active_actors()),
            "remote/env_sps": (self.env_steps - last_steps) / dt,
            "remote/rollouts_per_s": (self.rollouts - last_rollouts) / dt,
            "remote/policy_lag": sum(lags) / len(lags) if lags else float("nan"),
            "remote/policy_lag_max": float(max(lags)) if lags else float("nan"),
            "remote/rejected": float(self.rejected),
        }
        self._window = (now, self.env_steps, self.rollouts)
        return out

    def active_actors(self) -> int:
        now = time.monotonic()
        with self._lock:
            return self._seen.active(now, ACTIVE_SECONDS)

    def close(self, grace: float = 3.0) -> None:
        """Tell the actors that training finished (their next call gets ``finished``), waiting up
        to ``grace`` seconds for the recently active ones to hear it, then stop serving."""
        self.finished = True
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            now = time.monotonic()
            with self._lock:
                waiting = self._seen.not_told(now, 5.0)
            if not waiting:
                break
            time.sleep(0.05)
        self.rpc = None

    # ---- Rpc handlers (moolib threads; wrapped by _safe)
    def _touch(self, name: str) -> None:
        with self._lock:
            self._seen.touch(str(name), time.monotonic(), self.finished)

    def hello(self, name: str, info: dict) -> dict:
        check_name(name, "actor name")
        if not isinstance(info, dict):
            raise Refused("hello info must be a dict")
        check_plain(info, "hello info")
        self._touch(name)
        problem = first_mismatch(self.info, info)
        if problem:
            print(f"remote actor {name} refused: {problem}", flush=True)
            return {"error": problem}
        with self._lock:
            version = self._weights[0] if self._weights else -1
        print(f"remote actor {name} connected", flush=True)
        return {
            "session": self.session,
            "version": version,
            "unroll_length": self.unroll_length,
            "finished": self.finished,
        }

    def get_weights(self, session: str, version: int) -> dict:
        _check_session(session)
        check_int(version, "version", -1, MAX_VERSION)
        with self._lock:
            weights = self._weights
        if weights is None:
            return {"session": self.session, "version": -1, "finished": self.finished}
        reply = {"session": self.session, "version": weights[0], "finished": self.finished}
        if session != self.session or version != weights[0]:
            reply["state"] = weights[1]
        return reply

    def put_rollout(self, name: str, session: str, version: int, data: dict, state: Any, episodes: list) -> dict:
        check_name(name, "actor name")
        _check_session(session)
        check_int(version, "version", -1, MAX_VERSION)
        self._touch(name)
        if self.finished:
            return {"finished": True, "session": self.session}
        b = self.check.envs(data, state)
        eps = self.check.episodes(episodes, b)
        with self._arrived:
            if self._pending >= self.max_pending:
                return {"busy": True, "session": self.session}
            self._inbox.append(
                (Rollout(dict(data), tuple(state)), int(version) if session == self.session else None, eps)
            )
            self._pending += b
            self.env_steps += self.unroll_length * b
            self.rollouts += 1
            current = self._weights[0] if self._weights else -1
            self._arrived.notify()
        return {"ok": True, "session": self.session, "version": current, "finished": False}


class NoLocalActors:
    """Stands in for :class:`rfwp_rl.impala.actors.Actors` when the learner has no local
    environments (``--num-actors 0``: remote actors only)."""

    def __init__(self, env_failures: int = 0):
        self.env_steps = 0
        self.env_failures = env_failures
        self.should_stop: Callable[[], bool] = lambda: False

    def step(self) -> tuple[list[Rollout], list[tuple[float, int]]]:
        return [], []

    def release(self) -> None:
        pass

    def drain(self) -> None:
        pass
