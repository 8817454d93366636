"""The IMPALA learner: the model being trained and the optimizer steps on it.

- :class:`Learner` owns the agent, its optimizer and LR schedule (:mod:`rfwp_rl.impala.optim`),
  the step counters and the non-finite guard. A single learner's update is :meth:`Learner.update`,
  top to bottom as in TorchBeast monobeast's ``learn``: the V-trace loss of the batch
  (:mod:`rfwp_rl.impala.loss`) and its gradients, the optimizer step (clip, RMSProp or Adam, LR
  schedule), the trust region (:mod:`rfwp_rl.impala.trust_region`), the counters, the new
  parameters handed to the actors. A learner of a group (``--broker``) hands its gradients to the
  group instead (:mod:`rfwp_rl.impala.multi_learner`), which makes the optimizer step
  (:meth:`Learner.apply`) once the group's round is done.
- :class:`Learning` turns full batches into updates: in the calling thread, or in a
  :class:`LearnerThread` while the actors go on with their own copy of the model.
"""

from __future__ import annotations

import copy
import dataclasses
import queue
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn as nn

from rfwp_rl.impala.config import ImpalaConfig
from rfwp_rl.impala.loss import ReturnScale, compute_loss, loss_config
from rfwp_rl.impala.optim import apply_gradients, linear_decay_of_steps, make_optimizer
from rfwp_rl.impala.trust_region import behaviour_kl, limit_policy_change
from rfwp_rl.impala.wire import Refused, check_finite_number, check_int, check_like, short
from rfwp_rl.perf import autocast
from rfwp_rl.safety import NonFiniteGuard


class LearnerThread:
    """Runs ``learn(batch)`` for each submitted batch in a background thread.

    ``submit`` waits while an update is still running (one batch in flight, so the policy
    lag stays at most one update); an exception in the thread (e.g.
    :class:`rfwp_rl.safety.TrainingAborted`) is raised again by the next ``submit``,
    ``wait_idle`` or ``close``.
    """

    def __init__(self, learn: Callable[[Any], None]):
        self._learn = learn
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="learner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    self._learn(batch)
            except BaseException as e:  # handed to the main thread
                self._error = e
            finally:
                self._queue.task_done()

    def _check(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(self, batch: Any) -> None:
        while True:
            self._check()
            try:
                self._queue.put(batch, timeout=0.1)
                return
            except queue.Full:
                continue

    @property
    def pending(self) -> int:
        """Batches submitted and not yet learned (the one being learned included)."""
        return self._queue.unfinished_tasks

    def wait_idle(self) -> None:
        """Wait until every submitted batch is learned."""
        self._queue.join()
        self._check()

    def close(self) -> None:
        """Finish the submitted batches and stop the thread (re-raises its error, if any)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._check()


class Gradients(NamedTuple):
    """What :meth:`Learner.learn` left in the parameters' ``.grad``: the gradient of the summed
    loss over ``env_steps`` env steps, and whether loss and gradients are finite."""

    finite: bool
    env_steps: int
    stats: dict


@dataclasses.dataclass
class GroupStep:
    """A learner group's optimizer step (:meth:`Learner.apply`): the gradients now in ``.grad`` and what
    they were computed on."""

    env_steps: int  # env steps of all gradients averaged into this step (summed over the group's learners)
    gradients: int  # batches averaged (0: nothing to apply, e.g. a refused round)
    own_steps: int  # this learner's part of env_steps


class Learner:
    """The learner: the agent being trained, its optimizer, LR schedule, step counters and
    non-finite guard.

    - :meth:`update`: a single learner's update on one batch (see the module docstring);
    - :meth:`learn` and :meth:`apply`, a learner group's two halves of it: :meth:`learn` adds the
      gradients of one batch's V-trace loss to ``.grad`` -> :class:`Gradients`, handed to the group;
      :meth:`apply` makes the optimizer step on the group's weighted mean in ``.grad``;
    - :meth:`state_dict` / :meth:`load_state_dict`: the checkpoint; :meth:`shared_state` /
      :meth:`load_shared_state`: what a learner group hands a joining learner besides the parameters.

    After every optimizer step its stats are queued in ``learned`` and the new parameters are
    handed to the ``followers`` (:meth:`publish`: the actors' copy, remote actors).
    ``counters["step"]`` counts env steps trained (in a group: the group's), ``["updates"]``
    optimizer steps; the LR decays linearly to 0 over ``cfg.total_steps`` env steps. ``lock``
    guards the model, optimizer and counters (updates vs checkpoints vs the group's thread).
    """

    def __init__(self, agent: nn.Module, cfg: ImpalaConfig):
        self.agent = agent
        self.cfg = cfg
        self.device = next(agent.parameters()).device
        self.precision = cfg.precision
        self.steps_per_update = cfg.batch_size * cfg.unroll_length
        self.counters = {"step": 0, "updates": 0}
        self.optimizer = make_optimizer(agent, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, linear_decay_of_steps(cfg.total_steps, self._steps_trained)
        )
        self.loss_cfg = loss_config(cfg)
        self.guard = NonFiniteGuard(cfg.max_nonfinite)
        self.lock = threading.Lock()
        self.followers: list[Any] = []  # objects with follow(learner), told after every change of the model
        self.learned: queue.SimpleQueue = queue.SimpleQueue()  # (step, stats) of updates not logged yet
        self.loss_stats: dict[str, float] = {}  # of this learner's last batch, logged with the step that used it
        self.adoptions = 0  # times the model was replaced by a group leader's
        self.last_batch: Any = None  # the batch of the last learn(), for the trust region of the step
        self.stepped_batch: Any = None  # the batch of the last step (the same one again: a later epoch)
        self.return_scale = ReturnScale(self.loss_cfg.normalize_returns)

    def _steps_trained(self) -> int:
        return self.counters["step"]

    @property
    def step(self) -> int:
        return self.counters["step"]

    @property
    def updates(self) -> int:
        return self.counters["updates"]

    def parameters(self) -> list[nn.Parameter]:
        return list(self.agent.parameters())

    def buffers(self) -> list[torch.Tensor]:
        return list(self.agent.buffers())

    def update(self, batch: Any, count_env_steps: bool = True) -> None:
        """One optimizer step of a single learner on ``batch``: the V-trace loss and its gradients
        (:meth:`learn`), the optimizer step (:meth:`_optimizer_step`), the gradients cleared. A
        non-finite loss or gradient skips the step (the schedule advances, the env steps count).
        ``count_env_steps=False``: a later epoch on the same batch, whose env steps count once. The
        caller holds ``lock``."""
        gradients = self.learn(batch)
        self._optimizer_step(
            gradients.env_steps if count_env_steps else 0, stepped=gradients.finite, with_loss_stats=count_env_steps
        )
        for p in self.agent.parameters():
            p.grad = None

    def learn(self, batch: Any) -> Gradients:
        """Add the gradients of the V-trace loss of ``batch`` (a
        :class:`rfwp_rl.impala.actors.Rollout` of ``[T+1, B, ...]`` tensors) to ``.grad``."""
        self.agent.train()
        batch = batch.to(self.device)  # actors on another device (e.g. the CPU for a small model)
        with autocast(self.device, self.precision):  # bf16: the torso's convolutions; the loss stays fp32
            loss, stats = compute_loss(self.agent, batch.data, batch.state, self.loss_cfg, self.return_scale.value)
        loss.backward()
        self.loss_stats = stats
        self.last_batch = batch
        finite = self.guard.ok(loss, self.agent.parameters())
        if finite:
            self.return_scale.update(stats["learner/return_ms"])
        return Gradients(finite, self.steps_per_update, stats)

    def apply(self, step: GroupStep) -> None:
        """A learner group's optimizer step on the gradients in ``.grad`` (``step.gradients == 0``: only
        the schedule advances). The caller holds ``lock`` and zeroes the gradients afterwards."""
        self._optimizer_step(step.env_steps, stepped=step.gradients > 0, with_loss_stats=step.own_steps > 0)

    def _optimizer_step(self, env_steps: int, stepped: bool, with_loss_stats: bool) -> None:
        """Count ``env_steps`` and the update; grad-norm clip, RMSProp or Adam and the LR schedule
        (``stepped=False``: only the schedule advances); the trust region; queue the stats (with this
        learner's last loss stats if ``with_loss_stats``); tell the followers."""
        self.counters["step"] += env_steps
        self.counters["updates"] += 1
        # the trust region needs the batch the step came from: one learner's own (groups refuse max_kl)
        trust_region = self.loss_cfg.max_kl > 0 and stepped and self.last_batch is not None
        before = [p.detach().clone() for p in self.agent.parameters()] if trust_region else []
        start_kl = 0.0
        if trust_region and self.last_batch is self.stepped_batch:  # a later epoch: measure where it starts
            with torch.no_grad(), autocast(self.device, self.precision):
                start_kl = float(behaviour_kl(self.agent, self.last_batch.data, self.last_batch.state))
        stats = apply_gradients(self.agent, self.optimizer, self.scheduler, self.cfg.grad_norm_clip, step=stepped)
        if trust_region:
            with autocast(self.device, self.precision):
                stats.update(
                    limit_policy_change(
                        self.agent, before, self.last_batch.data, self.last_batch.state, self.loss_cfg.max_kl, start_kl
                    )
                )
        self.stepped_batch, self.last_batch = self.last_batch, None
        if with_loss_stats:
            stats.update(self.loss_stats)
        self.learned.put((self.counters["step"], stats))
        self.publish()

    def publish(self) -> None:
        """Tell the followers (the actors' copy of the model, remote actors) that the parameters changed."""
        for follower in self.followers:
            follower.follow(self)

    def state_dict(self) -> dict:
        """Agent, optimizer, LR schedule and counters (``step``, ``updates``, ``skipped_updates``)."""
        counters = {**self.counters, "skipped_updates": self.guard.skipped}
        return {
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "counters": counters,
            "return_scale": self.return_scale.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.counters.update({k: state["counters"][k] for k in self.counters})
        self.guard.skipped = state["counters"]["skipped_updates"]
        self.return_scale.load_state_dict(state["return_scale"])

    def shared_state(self) -> dict:
        """What a group's leader hands a joining learner besides the parameters and buffers."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "counters": dict(self.counters),
            "return_scale": self.return_scale.state_dict(),
        }

    def load_shared_state(self, state: Any) -> None:
        """Take a leader's :meth:`shared_state` (moolib has copied its parameters already). A state that
        does not fit this learner (:meth:`check_shared_state`) is :class:`Refused`, nothing taken."""
        self.check_shared_state(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.counters.update(state["counters"])
        self.return_scale.load_state_dict(state["return_scale"])
        self.adoptions += 1
        self.publish()

    def check_shared_state(self, state: Any) -> None:
        """:class:`Refused` (naming the first problem) unless ``state`` has the form of this learner's own
        :meth:`shared_state`: its keys; the optimizer's param groups and settings and the schedule's base
        learning rates equal to this learner's (a group shares its settings) but for the current
        learning rate, in ``[0, base rate]``; per-parameter optimizer state holding exactly the tensors this
        optimizer keeps, each of its parameter's shape (or a scalar), dtype and finite; the schedule's
        state of the form of this one's; counters ``step`` and ``updates``, integers >= 0; the return
        scale None or a finite float >= 0."""
        mine = self.shared_state()
        if not isinstance(state, dict) or set(state) != set(mine):
            got = sorted(map(str, state)) if isinstance(state, dict) else short(state)
            raise Refused(f"the shared state must hold {sorted(mine)}, got {got}")
        self._check_optimizer_state(state["optimizer"], mine["optimizer"])
        check_like(state["scheduler"], mine["scheduler"], "scheduler")
        for key in ("base_lrs", "lr_lambdas"):
            if state["scheduler"][key] != mine["scheduler"][key]:
                raise Refused(
                    f"scheduler.{key} is {short(state['scheduler'][key])}, this learner's {mine['scheduler'][key]}"
                )
        counters = state["counters"]
        if not isinstance(counters, dict) or set(counters) != set(self.counters):
            raise Refused(f"counters must hold {sorted(self.counters)}, got {short(counters)}")
        for key, value in counters.items():
            check_int(value, f"counters.{key}", 0, 2**62)
        scale = state["return_scale"]
        if not isinstance(scale, dict) or set(scale) != {"mean_square"}:
            raise Refused(f"return_scale must hold 'mean_square', got {short(scale)}")
        square = scale["mean_square"]
        if square is not None and (not isinstance(square, float) or check_finite_number(square, "mean_square") < 0):
            raise Refused(f"return_scale.mean_square must be None or a finite float >= 0, got {short(square)}")

    def _check_optimizer_state(self, value: Any, mine: dict) -> None:
        if not isinstance(value, dict) or set(value) != set(mine):
            raise Refused(f"optimizer state must hold {sorted(mine)}, got {short(value)}")
        check_like(value["param_groups"], mine["param_groups"], "optimizer.param_groups")
        for i, (theirs, ours) in enumerate(zip(value["param_groups"], mine["param_groups"])):
            for key, setting in ours.items():
                if key != "lr" and theirs[key] != setting:
                    raise Refused(
                        f"optimizer.param_groups[{i}].{key} is {short(theirs[key])}, this learner's {short(setting)}"
                    )
            top = ours.get("initial_lr", ours["lr"])
            if not 0 <= theirs["lr"] <= top:
                raise Refused(f"optimizer.param_groups[{i}].lr is {short(theirs['lr'])}; allowed: 0..{top:g}")
        params = {
            index: p
            for group, ours in zip(self.optimizer.param_groups, mine["param_groups"])
            for index, p in zip(ours["params"], group["params"])
        }
        kept = self._optimizer_state_template()
        states = value["state"]
        if not isinstance(states, dict) or not set(states) <= set(params):
            raise Refused(f"optimizer.state must map parameter indices 0..{len(params) - 1} to their state")
        for index, entry in states.items():
            p = params[index]
            template = {k: torch.empty(() if t.dim() == 0 else p.shape, dtype=t.dtype) for k, t in kept.items()}
            check_like(entry, template, f"optimizer.state[{index}]")

    def _optimizer_state_template(self) -> dict[str, torch.Tensor]:
        """The per-parameter state this optimizer keeps (names, scalar or not, dtypes): one step of an
        optimizer of its class and settings on a one-element parameter."""
        probe = torch.zeros(1, dtype=self.parameters()[0].dtype, requires_grad=True)
        optimizer = type(self.optimizer)([probe], **self.optimizer.defaults)
        probe.grad = torch.zeros_like(probe)
        optimizer.step()
        return dict(optimizer.state[probe])


class Learning:
    """Turns full batches into updates: a single learner's (:meth:`Learner.update`), or with a learner
    ``group`` the gradients handed in to the group's round. In the calling thread, or with
    ``thread=True`` in a :class:`LearnerThread` while the actors go on with ``acting_agent``, a copy
    of the model refreshed after each update (copied off the learner's device first, then loaded under
    ``acting_lock``)."""

    def __init__(
        self, learner: Learner, group: Any = None, thread: bool = False, acting_device: torch.device | None = None
    ):
        self.learner, self.group = learner, group
        self.thread = LearnerThread(self._learn) if thread else None
        acting_device = learner.device if acting_device is None else torch.device(acting_device)
        own_copy = thread or acting_device != learner.device
        self.acting_device = acting_device
        self.acting_agent = copy.deepcopy(learner.agent).to(acting_device) if own_copy else learner.agent
        self.acting_lock = threading.Lock()
        if own_copy:
            learner.followers.append(self)

    def follow(self, learner: Learner) -> None:
        # The copy off the learner's device waits for its update to finish, so it is made before the lock
        # is taken: the actors go on acting meanwhile and only wait for the copy into their model.
        state = {k: v.detach().to(self.acting_device, copy=True) for k, v in learner.agent.state_dict().items()}
        with self.acting_lock:
            self.acting_agent.load_state_dict(state)

    def submit(self, batch: Any) -> None:
        """Learn on ``batch`` (with a thread: waits while the previous batch is learned)."""
        if self.thread is not None:
            self.thread.submit(batch)
        else:
            self._learn(batch)

    def _learn(self, batch: Any) -> None:
        for epoch in range(self.learner.cfg.epochs):  # the batch's env steps count once, with its first step
            with self.learner.lock:
                if self.group is None:
                    self.learner.update(batch, count_env_steps=epoch == 0)
                else:
                    gradients = self.learner.learn(batch)
                    self.group.hand_in(gradients if epoch == 0 else gradients._replace(env_steps=0))

    @property
    def pending_steps(self) -> int:
        """Env steps submitted to the learner thread and not yet learned."""
        return self.thread.pending * self.learner.steps_per_update if self.thread is not None else 0

    def wait_idle(self) -> None:
        if self.thread is not None:
            self.thread.wait_idle()

    def close(self) -> None:
        """Finish the submitted batches (re-raises the learner thread's error, if any)."""
        if self.thread is not None:
            self.thread.close()
