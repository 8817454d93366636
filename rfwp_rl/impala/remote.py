"""``rfwp-rl actor``: remote IMPALA actors that feed a learner over moolib RPC.

Runs environments (a moolib ``EnvPool``, or ``--env-backend local``) and batched inference on
this machine, sends each rollout to the learner started with ``rfwp-rl train ... --listen
HOST:PORT`` and pulls the learner's weights whenever their version changed. The rollouts
have exactly the layout of the learner's own actors (T+1 entries, the first repeating the
previous rollout's last, the core state before entry 0, the behaviour log-probs); T comes from
the learner. Server side: :mod:`rfwp_rl.impala.rollout_server`.

Examples::

    rfwp-rl train --env Pong --core rdn --listen 0.0.0.0:4431            # learner (+ its own actors)
    rfwp-rl actor --connect learner-host:4431 --env Pong --core rdn --num-actors 32

The actor must be started with the learner's env/core/preset options: on connect the learner
compares them and refuses a mismatch with a one-line error (exit 2). A lost learner is
retried with exponential backoff (the envs are kept alive meanwhile); after a learner
restart the actor validates again and takes the new learner's weights. When the learner
reaches its step target the actor exits 0. Ctrl-C / SIGTERM stop it cleanly.

Envs fail as in ``rfwp-rl train``: a failing env is replaced; an env batch without a result for
``--env-timeout`` seconds (a hung env) or a dead worker process ends the actor (exit 1: restart it).
At any exit the env workers get a moment to finish their pending steps and are ended if they do
not (:meth:`rfwp_rl.impala.env_batches.EnvBatches.release`), so no hung worker outlives the actor.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import time
from collections import deque

import numpy as np
import torch

from rfwp_rl import flags
from rfwp_rl.encoders import has_image_torso
from rfwp_rl.errors import UserError
from rfwp_rl.impala.actors import Actors
from rfwp_rl.impala.config import ImpalaConfig, trainer_keys
from rfwp_rl.impala.env_batches import EnvPoolBroken
from rfwp_rl.impala.net import resolve_address
from rfwp_rl.impala.rollout_server import compat_info
from rfwp_rl.impala.run_spec import RunSpec, add_run_arguments
from rfwp_rl.impala.wire import MAX_NAME_CHARS, Refused, check_int, resolve_key, secure_moolib, short
from rfwp_rl.perf import choose_torch_threads, set_torch_threads
from rfwp_rl.safety import GracefulStop

MAX_INFLIGHT = 2  # rollouts sent and not yet answered
MAX_OUTBOX = 4  # completed rollouts held before the actor stops stepping (back-pressure)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("learner")
    g.add_argument("--connect", required=True, metavar="HOST:PORT", help="the learner's --listen address")
    g.add_argument("--name", default=None, help="this actor's unique name (default actor-<host>-<pid>)")
    flags.add_field(
        g,
        ImpalaConfig,
        "auth_key_file",
        help="the learner's shared key (mode 600); empty: $RFWP_AUTH_KEY, else "
        "~/.config/rfwp_rl/auth.key (copy the learner machine's file there)",
    )
    g.add_argument(
        "--rpc-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds before a call counts as lost (default %(default)s)",
    )
    g.add_argument(
        "--weights-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="seconds between weight pulls (default 0: after every completed rollout); "
        "weights are only transferred when their version changed",
    )
    g.add_argument(
        "--max-backoff",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds of the longest wait between reconnect attempts (default %(default)s)",
    )
    g.add_argument(
        "--give-up-after",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="exit 1 after this many seconds without the learner (default 0: retry forever)",
    )
    g = parser.add_argument_group("agent (must match the learner's)")
    add_run_arguments(g)
    g = parser.add_argument_group("actors")
    flags.add_field(g, ImpalaConfig, "num_actors", default=16, help="")
    flags.add_fields(g, ImpalaConfig, "num_env_batches", "num_env_processes", "env_backend")
    flags.add_field(
        g,
        ImpalaConfig,
        "env_timeout",
        help="moolib backend: seconds without a result from an env batch before the env is taken as "
        "hung: the actor ends its workers and exits 1 (inf: never)",
    )
    flags.add_fields(g, ImpalaConfig, "seed", "device", "precision")
    flags.add_field(g, ImpalaConfig, "torch_threads", help="0: chosen from the cores and the env processes")
    flags.add_field(g, ImpalaConfig, "log_every", help="")


def check_args(args: argparse.Namespace) -> str:
    """One-line errors for bad actor options; returns the learner's address, resolved."""
    address = resolve_address(args.connect, "--connect")
    if args.name is not None:
        if not 0 < len(args.name) <= MAX_NAME_CHARS or not args.name.isprintable():
            raise UserError(f"--name {args.name!r} is invalid; allowed: 1-{MAX_NAME_CHARS} printable characters")
    for flag in ("num_actors", "num_env_batches", "num_env_processes"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} {getattr(args, flag)} is invalid; allowed: an integer >= 1")
    for flag in ("rpc_timeout", "max_backoff", "env_timeout"):
        if not getattr(args, flag) > 0:
            raise UserError(f"--{flag.replace('_', '-')} {getattr(args, flag)} is invalid; allowed: seconds > 0")
    return address


def run(args: argparse.Namespace) -> int:
    address = check_args(args)
    key = resolve_key(args.auth_key_file, create=False, role="an actor")
    run_spec = RunSpec.from_args(args, trainer_keys())  # the learner's --set trainer keys are accepted (unused here)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    name = args.name or f"actor-{socket.gethostname()}-{os.getpid()}"

    # The env pool first: moolib forks its workers here, and refuses to once Rpc threads exist.
    pool = run_spec.make_env_pool(
        args.env_backend, args.seed, args.num_actors, args.num_env_batches, args.num_env_processes
    )
    device = torch.device(args.device)
    agent = run_spec.build_agent(device)
    set_torch_threads(choose_torch_threads(args.torch_threads, args.num_env_processes, has_image_torso(agent.torso))[0])
    agent.eval()
    actor = RemoteActor(pool, agent, compat_info(run_spec, agent), address, name, args, device, key)
    try:
        return actor.run()
    finally:
        if actor.actors is not None:  # a hung env's worker must not outlive this process
            actor.actors.release()
        if hasattr(pool, "close"):
            pool.close()


class Disconnected(Exception):
    """A call to the learner failed (timeout, lost connection) or the learner restarted."""


class RemoteActor:
    """The actor loop: (re)connect and validate -> pull weights -> step envs, send rollouts."""

    def __init__(
        self,
        pool,
        agent: torch.nn.Module,
        info: dict,
        address: str,
        name: str,
        args: argparse.Namespace,
        device: torch.device,
        key: str,
    ):
        self.moolib = secure_moolib(key, connect=[address])  # the learner must prove the key too
        self.pool, self.agent, self.info, self.address, self.name = pool, agent, info, address, name
        self.args, self.device = args, device
        self.rpc = self.moolib.Rpc()
        self.rpc.set_name(name)
        self.rpc.set_timeout(args.rpc_timeout)
        self.rpc.connect(address)
        self.actors = None
        self.session: str | None = None
        self.version = -1  # weights version held (-1: none yet)
        self.learner_version = -1  # the learner's version in its last reply
        self.start_version: list[int] = []  # per env batch: the version its current rollout started with
        self.outbox: deque = deque()  # (rollout, version, episodes) not sent yet
        self.inflight: deque = deque()  # (future, item)
        self.episodes: list[tuple[float, int]] = []  # ended, not yet attached to a rollout
        self.weights_future = None
        self.last_pull = 0.0
        self.rollouts_sent = 0
        self.returns: deque[float] = deque(maxlen=100)
        self.versions_seen = 0
        self.kept_alive = time.monotonic()

    def log(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] actor {self.name}: {text}", flush=True)

    # ---- RPC helpers: every failure becomes Disconnected
    def _call(self, function: str, *args):
        try:
            reply = self.rpc.sync("learner", function, *args)
        except RuntimeError as e:
            raise Disconnected(str(e)) from None
        return self._check_reply(reply)

    def _check_reply(self, reply) -> dict:
        if not isinstance(reply, dict):
            raise Disconnected(f"unexpected reply {type(reply).__name__}")
        if self.session is not None and reply.get("session") not in (None, self.session):
            raise Disconnected("the learner restarted (new session)")
        return reply

    def _load_weights(self, reply: dict) -> None:
        try:
            version = check_int(reply.get("version"), "weights version", -1, 2**62)
            if "state" in reply:
                state, ours = reply["state"], self.agent.state_dict()
                if not isinstance(state, dict) or set(state) != set(ours):
                    raise Refused("the weights do not have this agent's parameter names")
                for k, v in state.items():
                    if not isinstance(v, torch.Tensor) or v.shape != ours[k].shape or v.dtype != ours[k].dtype:
                        raise Refused(f"weights {k} is {short(v)}, this agent's is {short(ours[k])}")
                    if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                        raise Refused(f"weights {k} hold NaN or inf values")
                self.agent.load_state_dict(state)
                self.versions_seen += 1
        except Refused as e:
            raise Disconnected(f"refused the learner's weights: {e}") from None
        self.version = version

    # ---- connect
    def connect(self, stop) -> bool:
        """Hello + first weights, retrying with backoff. False: give up or stop requested."""
        backoff, lost_at, attempt = 0.5, time.monotonic(), 0
        while not stop.requested:
            attempt += 1
            try:
                self.session = None
                reply = self._call("hello", self.name, self.info)
                if reply.get("error"):
                    raise UserError(f"the learner at {self.address} refused this actor: {reply['error']}")
                if reply.get("finished"):
                    raise _Finished()
                try:
                    session, unroll = (
                        reply.get("session"),
                        check_int(reply.get("unroll_length"), "unroll length", 1, 100_000),
                    )
                    if not isinstance(session, str) or len(session) > 64:
                        raise Refused("the learner's session must be a short string")
                except Refused as e:
                    raise Disconnected(f"refused the learner's hello reply: {e}") from None
                self.session = session
                if self.actors is None:
                    self.actors = Actors(
                        self.pool,
                        self.agent,
                        self.args.num_actors,
                        self.args.num_env_batches,
                        unroll,
                        self.device,
                        env_timeout=self.args.env_timeout,
                        precision=self.args.precision,
                    )
                    self.actors.should_stop = lambda: stop.requested  # also while waiting on envs
                    self.start_version = [-1] * self.args.num_env_batches
                elif unroll != self.actors.batches[0].unroll_length:
                    raise UserError(
                        f"the learner at {self.address} now uses unroll length {unroll}, "
                        f"this actor {self.actors.batches[0].unroll_length}; restart the actor"
                    )
                weights = self._call("get_weights", None, -1)
                if weights.get("version", -1) < 0 or "state" not in weights:
                    raise Disconnected("the learner has no weights yet")
                self._load_weights(weights)
                self.start_version = [self.version] * len(self.start_version)
                self.last_pull = time.monotonic()
                self.log(
                    f"connected to the learner at {self.address} (session {self.session}, "
                    f"weights v{self.version}, unroll {unroll})"
                )
                return True
            except Disconnected as e:
                waited = time.monotonic() - lost_at
                if self.args.give_up_after > 0 and waited >= self.args.give_up_after:
                    self.log(f"no learner at {self.address} for {waited:.0f}s; giving up (--give-up-after)")
                    return False
                self.log(
                    f"learner at {self.address} not reachable ({e}); attempt {attempt}, retrying in {backoff:.1f}s"
                )
                self._idle(stop, backoff)
                backoff = min(2 * backoff, self.args.max_backoff)
                self.rpc.connect(self.address)  # moolib does not retry a refused connection by itself
        return False

    def _idle(self, stop, seconds: float) -> None:
        """Wait, stepping the envs now and then (a moolib worker gives up after 120 s without
        an action); rollouts made meanwhile are dropped (each carries its own start state)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.requested:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
            if self.actors is not None and time.monotonic() - self.kept_alive > 20.0:
                for _ in self.actors.batches:
                    self.actors.step()
                self.kept_alive = time.monotonic()

    # ---- acting
    def _send(self) -> None:
        while self.outbox and len(self.inflight) < MAX_INFLIGHT:
            item = self.outbox.popleft()
            rollout, version, episodes = item
            try:
                fut = self.rpc.async_(
                    "learner", "put_rollout", self.name, self.session, version, rollout.data, rollout.state, episodes
                )
            except RuntimeError as e:
                self.outbox.appendleft(item)
                raise Disconnected(str(e)) from None
            self.inflight.append((fut, item))

    def _collect(self, block: bool) -> None:
        """Handle answered rollouts (``block``: wait for the oldest one)."""
        while self.inflight and (block or self.inflight[0][0].done()):
            block = False
            fut, item = self.inflight.popleft()
            try:
                reply = self._check_reply(fut.result())
            except (RuntimeError, Disconnected) as e:
                self.outbox.appendleft(item)  # resend after reconnecting
                raise Disconnected(str(e)) from None
            if reply.get("finished"):
                raise _Finished()
            if reply.get("busy"):
                self.outbox.appendleft(item)
                time.sleep(0.01)
            elif reply.get("error"):
                self.log(f"the learner rejected a rollout: {reply['error']}")
            else:
                self.rollouts_sent += 1
                version = reply.get("version", self.learner_version)
                self.learner_version = version if isinstance(version, int) else self.learner_version

    def _pull_weights(self, rollout_done: bool) -> None:
        fut = self.weights_future
        if fut is not None and fut.done():
            self.weights_future = None
            try:
                reply = self._check_reply(fut.result())
            except RuntimeError as e:
                raise Disconnected(str(e)) from None
            if reply.get("finished"):
                raise _Finished()
            if not reply.get("error"):
                self._load_weights(reply)
        if (
            self.weights_future is None
            and rollout_done
            and time.monotonic() - self.last_pull >= self.args.weights_every
        ):
            self.last_pull = time.monotonic()
            try:
                self.weights_future = self.rpc.async_("learner", "get_weights", self.session, self.version)
            except RuntimeError as e:
                raise Disconnected(str(e)) from None

    def act(self, stop) -> None:
        """Step, send, pull until the learner is lost (Disconnected) or finished (_Finished)."""
        last_log, last_steps, last_sent = time.monotonic(), self.actors.env_steps, self.rollouts_sent
        while not stop.requested:
            if len(self.outbox) >= MAX_OUTBOX:  # the learner is slower than this actor: wait
                self._send()
                self._collect(block=True)
                continue
            index = self.actors.next_batch
            rollouts, episodes = self.actors.step()  # inference under torch.inference_mode
            self.episodes += episodes
            self.returns.extend(r for r, _ in episodes)
            for rollout in rollouts:
                self.outbox.append((rollout, self.start_version[index], self.episodes))
                self.episodes = []
                self.start_version[index] = self.version
            self._send()
            self._collect(block=False)
            self._pull_weights(bool(rollouts))
            now = time.monotonic()
            if now - last_log >= self.args.log_every:
                dt = now - last_log
                ret = f", return(100) {np.mean(self.returns):.4g}" if self.returns else ""
                self.log(
                    f"{self.actors.env_steps:,} env steps ({(self.actors.env_steps - last_steps) / dt:,.0f}/s), "
                    f"{self.rollouts_sent:,} rollouts sent ({(self.rollouts_sent - last_sent) / dt:.1f}/s), "
                    f"weights v{self.version}, learner v{self.learner_version}{ret}"
                )
                last_log, last_steps, last_sent = now, self.actors.env_steps, self.rollouts_sent

    def run(self) -> int:
        with GracefulStop() as stop:
            try:
                while not stop.requested:
                    if not self.connect(stop):
                        return 0 if stop.requested else 1
                    try:
                        self.act(stop)
                    except Disconnected as e:
                        self.log(f"lost the learner at {self.address} ({e}); reconnecting")
                        for _, item in reversed(self.inflight):
                            self.outbox.appendleft(item)
                        self.inflight.clear()
                        self.weights_future = None
                        while len(self.outbox) > MAX_OUTBOX:
                            self.outbox.popleft()
            except EnvPoolBroken as e:
                self.log(f"environment pool broken ({e}); exiting (restart the actor)")
                return 1
            except _Finished:
                self.log(
                    f"the learner finished training; {self.rollouts_sent:,} rollouts sent, "
                    f"last weights v{self.version}; exiting"
                )
                return 0
        self.log(f"stopped; {self.rollouts_sent:,} rollouts sent")
        return 0


class _Finished(Exception):
    """The learner reached its step target."""
