"""``rfwp-rl meta-rl``: A2C meta-RL on random POMDP graphs (FWM paper Sec. 4.2, App. I).

One optimizer step is one *episode* of the batch: every agent of the batch (by default one per
training graph, 600 agents, agent b always on training graph b as in the paper's code) plays
one 30-step episode, the A2C loss of the whole batch is backpropagated through all 30 steps
(full BPTT, the core state starts at zero every episode) and Adam takes one step. The budget
(``--total-steps``) and the evaluation interval (``--eval-every``) count env steps: agents x
steps, ``batch x 30`` per episode.

Every ``--eval-every`` env steps (and at the start and at the end) the agent plays one episode
on each of the test graphs, which it is never trained on. By default the test actions are
*sampled* from the policy, as in the paper's code (``--eval-actions greedy`` takes the argmax,
``both`` logs both). "Total reward" is the sum of the 30 rewards of an episode averaged over
agents; the training value logged at an evaluation is the mean over the episodes since the
previous evaluation.

Output in the run directory (default ``runs/meta_rl/<name>_s<seed>``): ``metrics.csv``
(one row per evaluation, rewritten atomically), TensorBoard events in ``tb/`` (by env step),
``config.json`` and checkpoints ``ckpt_*.pt`` (model, optimizer, counters, every RNG; written
every ``--checkpoint-every`` seconds, at the end and on Ctrl-C). Re-running the same command
resumes from the newest checkpoint and continues to ``--total-steps``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rfwp_rl import cores, flags
from rfwp_rl.checkpoint import add_trust_argument, atomic_write_csv
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.meta_rl import a2c, graph_env
from rfwp_rl.meta_rl.config import EVAL_ACTIONS, TIME_LIMITS, MetaRLConfig
from rfwp_rl.meta_rl.graph_env import GraphBatchEnv
from rfwp_rl.meta_rl.model import MetaRLAgent, count_parameters
from rfwp_rl.overrides import apply_settings
from rfwp_rl.presets import Preset, load_preset
from rfwp_rl.runlog import format_duration, run_name
from rfwp_rl.safety import GracefulStop, NonFiniteGuard, TrainingAborted
from rfwp_rl.scaffold import Trainer, run_trainer

# Core configs used by ``--core NAME`` without a preset, where the paper fixes one
# (FWM paper Sec. 4.2: LSTM of 32 units + 16x16x16 fast tensor, 3 reads). Same as
# agents/meta_rl_fwm.toml. Other cores use their defaults from rfwp_rl.cores.
META_RL_CORE_DEFAULTS: dict[str, dict[str, Any]] = {
    "fwm": {"hidden_size": 32, "memory_size": 16, "num_reads": 3},
}

CSV_COLUMNS = (
    "episode",
    "env_steps",
    "wall_minutes",
    "train_reward",
    "test_reward_sampled",
    "test_reward_greedy",
    "test_goals",
    "train_goals",
    "train_invalid",
    "loss",
    "policy_loss",
    "value_loss",
    "entropy",
    "episodes_per_s",
    "skipped_updates",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("agent")
    g.add_argument(
        "--core", default=None, help="core name (rfwp-rl info lists them); default fwm with the paper's sizes"
    )
    g.add_argument(
        "--preset",
        default=None,
        help='agent preset TOML (core = "..." and a [core_config] table), e.g. agents/meta_rl_lstm512.toml',
    )
    flags.add_set_argument(g, "a core option (core_config.hidden_size=64)", "entropy_cost=0.01")
    g = parser.add_argument_group("training (defaults: FWM paper App. I)")
    flags.add_fields(
        g,
        MetaRLConfig,
        "total_steps",
        "seed",
        "batch_size",
        "learning_rate",
        "adam_eps",
        "discount",
        "baseline_cost",
        "entropy_cost",
        "grad_norm_clip",
    )
    g = parser.add_argument_group("environment")
    flags.add_fields(
        g,
        MetaRLConfig,
        "data_seed",
        "train_graphs",
        "test_graphs",
        "episode_steps",
        "goal_reward",
        "invalid_penalty",
        "timeout_steps",
        "reward_sum_scale",
        "time_limit",
    )
    g = parser.add_argument_group("evaluation, logging, run")
    flags.add_fields(g, MetaRLConfig, "eval_every", "eval_actions", "log_every", "checkpoint_every")
    flags.add_run_dir_argument(g, "runs/meta_rl/<name>_s<seed>")
    add_trust_argument(g)
    flags.add_fields(g, MetaRLConfig, "torch_threads", "device")


# ---------------------------------------------------------------------------------------------
# agent selection


def resolve_agent(
    core: str | None, preset: str | None, overrides: list[str], trainer: Any = None, trainer_keys: Any = ()
) -> tuple[str, dict, str]:
    """``(core name, core config, label)`` from ``--core``/``--preset``/``--set``.

    The label names the run directory: the preset file's name without ``meta_rl_``
    (``lstm512``), else the core name. ``--set`` takes ``core``, ``core_config.<option>`` and
    the trainer's settings (``trainer_keys``, applied to ``trainer``); the agent has no other options.
    """
    if preset is not None:
        p = load_preset(preset)
        if core is not None and core != p.core:
            raise UserError(f"--core {core!r} contradicts preset {p.source} (core = {p.core!r}); pass only one")
        label = Path(p.source).stem.removeprefix("meta_rl_")
    else:
        name = core or "fwm"
        p = Preset(core=name, core_config=dict(META_RL_CORE_DEFAULTS.get(name, {})))
        label = name
    specs = cores.available()
    core_options = specs[p.core].defaults if p.core in specs else {}
    p = apply_settings(overrides, p, trainer, trainer_keys, sections=("core_config",), core_options=core_options)
    if p.agent:
        raise UserError(f"the meta-RL agent has no [agent] options (got {sorted(p.agent)}); use [core_config]")
    check_choice("core", p.core, sorted(specs))
    for key in p.core_config:
        check_choice(f"option of core {p.core!r}:", key, sorted(specs[p.core].defaults))
    return p.core, dict(p.core_config), label


# ---------------------------------------------------------------------------------------------
# rollouts


def rollout(
    agent: MetaRLAgent,
    env: GraphBatchEnv,
    device: torch.device,
    generator: torch.Generator,
    greedy: bool = False,
    truncated: bool = False,
    replay: bool = True,
) -> dict[str, Any]:
    """Play one episode with every agent of ``env``.

    Returns ``logits [T, B, A]``, ``values [T, B]``, ``actions [T, B]`` int64, ``rewards
    [T, B]`` float32, ``bootstrap`` (``[B]``, detached: the value of the last observation when
    ``truncated``, i.e. the episode's end is a time limit; else None) and the per-agent totals
    ``total_reward``, ``goals``, ``invalid`` [B] (numpy).

    The core runs one step at a time (the next observation depends on the action), carrying
    its state, so with gradients enabled (a training update) the backward pass is full BPTT over
    the episode. A core whose stepper is much cheaper without gradients
    (``core.act_without_gradients``: ``fwm``, the fused op's incremental stepper) acts without
    them; the logits and values returned then come from one call of the agent on the whole
    episode from the zero state: the same numbers (the cores' stepping contract), with
    gradients through one LSTM call and one fused FWM call; where the stepper recorded its steps
    (``fwm`` on the fused ops) that call is its replay, which computes nothing again
    (``replay=False``: the call instead, to compare).
    """
    train = torch.is_grad_enabled()
    recompute = train and agent.core.act_without_gradients
    obs = env.reset()
    obs_t, logits_t, values_t, actions_t, rewards_t = [], [], [], [], []
    bootstrap = None
    with torch.set_grad_enabled(train and not recompute):
        # no record when a bootstrap step follows: the replay would include it
        stepper = agent.stepper(env.num_envs, device=device, record=replay and recompute and not truncated)
        done = False
        while not done:
            x = torch.from_numpy(obs).to(device)
            logits, value = stepper.step(x)
            if greedy:
                action = logits.detach().argmax(-1).cpu()
            else:
                probs = F.softmax(logits.detach().float(), dim=-1).cpu()
                action = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            obs, reward, done = env.step(action.numpy())
            obs_t.append(x)
            logits_t.append(logits)
            values_t.append(value)
            actions_t.append(action)
            rewards_t.append(torch.from_numpy(reward))
    if truncated:  # a time limit is not a terminal state: the return goes on from V(last observation)
        with torch.no_grad():
            bootstrap = stepper.step(torch.from_numpy(obs).to(device))[1]
    replayed = stepper.replay() if recompute else None
    if replayed is not None:
        logits, values = replayed
    elif recompute:
        logits, values, _ = agent(torch.stack(obs_t), agent.initial_state(env.num_envs, device))
    else:
        logits, values = torch.stack(logits_t), torch.stack(values_t)
    rewards = torch.stack(rewards_t)
    return {
        "logits": logits,
        "values": values,
        "actions": torch.stack(actions_t).to(device),
        "rewards": rewards.to(device),
        "bootstrap": bootstrap,
        "total_reward": rewards.sum(0).numpy(),
        "goals": env.goals.copy(),
        "invalid": env.invalid.copy(),
    }


@torch.no_grad()
def evaluate(
    agent: MetaRLAgent, env: GraphBatchEnv, device: torch.device, generator: torch.Generator, greedy: bool
) -> dict[str, float]:
    """Mean total reward, goals and invalid actions per episode on ``env``'s graphs."""
    was_training = agent.training
    agent.eval()
    out = rollout(agent, env, device, generator, greedy=greedy)
    agent.train(was_training)
    return {
        "total_reward": float(out["total_reward"].mean()),
        "goals": float(out["goals"].mean()),
        "invalid": float(out["invalid"].mean()),
    }


# ---------------------------------------------------------------------------------------------
# the run


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def write_csv(path: Path, rows: list[dict]) -> None:
    """All evaluation rows to ``path`` (atomic rewrite); a NaN is left empty."""
    rows = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in rows]
    atomic_write_csv(path, rows, CSV_COLUMNS)


def _test_reward(row: dict) -> float:
    """The row's test total reward: sampled if measured, else greedy."""
    return row["test_reward_sampled"] if row.get("test_reward_sampled") is not None else row["test_reward_greedy"]


def _interval_means(acc: dict[str, list[float]]) -> dict[str, float]:
    return {k: (float(np.mean(v)) if v else float("nan")) for k, v in acc.items()}


# the number settings' ranges (flags.check_ranges); NaN is in none
NUMBER_RANGES: dict[str, flags.Range] = {
    **flags.shared_ranges("learning_rate", "adam_eps", "discount", "baseline_cost", "entropy_cost", "grad_norm_clip"),
    "reward_sum_scale": flags.Range(note="0: none, as the paper's code"),
    **flags.shared_ranges("log_every", "checkpoint_every"),
}


def check_config(cfg: MetaRLConfig) -> None:
    for name in ("total_steps", "eval_every", "train_graphs", "test_graphs", "episode_steps", "timeout_steps"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} {getattr(cfg, name)} is invalid; allowed: >= 1")
    if cfg.batch_size is not None and cfg.batch_size < 1:
        raise UserError(f"--batch-size {cfg.batch_size} is invalid; allowed: >= 1")
    flags.check_ranges(cfg, NUMBER_RANGES)
    check_choice("eval actions", cfg.eval_actions, EVAL_ACTIONS)
    check_choice("time limit", cfg.time_limit, TIME_LIMITS)
    try:
        torch.device(cfg.device)
    except RuntimeError:
        raise UserError(f"--device {cfg.device!r} is not a torch device; allowed: cpu, cuda, cuda:N") from None


def run(args: argparse.Namespace) -> int:
    cfg = flags.config_from_args(MetaRLConfig, args)
    core_name, core_config, label = resolve_agent(
        args.core, args.preset, args.overrides, cfg, flags.settings_keys(MetaRLConfig)
    )
    check_config(cfg)
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs/meta_rl") / run_name(label, f"s{cfg.seed}")
    trainer = MetaRLTrainer(cfg, core_name, core_config, label, run_dir)
    trainer.trust_checkpoint = args.trust_checkpoint
    return run_trainer(trainer)


class MetaRLTrainer(Trainer):
    """A2C meta-RL in the :mod:`rfwp_rl.scaffold`: one episode of the whole batch per update."""

    unit = "env steps"
    metrics = ("test/total_reward_sampled", "test/total_reward_greedy", "train/total_reward")

    def __init__(self, cfg: MetaRLConfig, core_name: str, core_config: dict, label: str, run_dir: Path):
        self.cfg, self.label, self.run_dir = cfg, label, run_dir
        self.total, self.log_every = cfg.total_steps, cfg.log_every
        if cfg.torch_threads > 0:
            torch.set_num_threads(cfg.torch_threads)
        self.device = torch.device(cfg.device)
        # seeds first, so that the model initialisation depends on --seed only
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self._make_envs(cfg)
        self.steps_per_update = self.batch * cfg.episode_steps  # env steps of one episode of the batch
        self.agent = MetaRLAgent(core_name, core_config, self.obs_size, self.num_actions).to(self.device)
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)
        self.sample_gen = torch.Generator().manual_seed(cfg.seed)  # training actions
        self.eval_gen = torch.Generator().manual_seed(cfg.seed + 7919)  # test actions
        self.guard = NonFiniteGuard()
        self.core_name = core_name
        self.core_config = dict(getattr(self.agent.core, "config", core_config) or core_config)
        self.meta = {
            "trainer": "meta_rl",
            "step_unit": "env steps",
            "core": core_name,
            "core_config": self.core_config,
            "obs_size": self.obs_size,
            "num_actions": self.num_actions,
            "batch_size": self.batch,
            "env": {
                "data_seed": cfg.data_seed,
                "train_graphs": cfg.train_graphs,
                "test_graphs": cfg.test_graphs,
                **self.env_kw,
                "time_limit": cfg.time_limit,
            },
        }
        self.episode, self.history, self.wall = 0, [], 0.0
        self.acc: dict[str, list[float]] = {
            k: []
            for k in ("train_reward", "train_goals", "train_invalid", "loss", "policy_loss", "value_loss", "entropy")
        }
        self.csv_path = run_dir / "metrics.csv"
        self.t_start = time.monotonic()

    def _make_envs(self, cfg: MetaRLConfig) -> None:
        self.train_tables, test_tables = graph_env.graph_sets(cfg.data_seed, cfg.train_graphs, cfg.test_graphs)
        self.batch = cfg.batch_size or len(self.train_tables)
        self.env_kw = dict(
            episode_steps=cfg.episode_steps,
            goal_reward=cfg.goal_reward,
            invalid_penalty=cfg.invalid_penalty,
            timeout_steps=cfg.timeout_steps,
            reward_sum_scale=cfg.reward_sum_scale,
        )
        self.graph_rng = np.random.default_rng([cfg.seed, 1])
        self.fixed_graphs = self.batch == len(self.train_tables)  # the paper: agent b on training graph b
        tables = self.train_tables if self.fixed_graphs else self.train_tables[:1].repeat(self.batch, 0)
        self.train_env = GraphBatchEnv(tables, rng=np.random.default_rng([cfg.seed, 2]), **self.env_kw)
        self.test_env = GraphBatchEnv(test_tables, rng=np.random.default_rng([cfg.seed, 3]), **self.env_kw)
        self.num_test_graphs = len(test_tables)
        self.obs_size, self.num_actions = self.train_env.obs_size, self.train_env.num_actions

    @property
    def step(self) -> int:
        """Env steps trained: episodes x batch x episode steps."""
        return self.episode * self.steps_per_update

    def state_dict(self) -> dict:
        return {
            "model": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "episode": self.episode,
            "history": self.history,
            "wall_seconds": self.wall + (time.monotonic() - self.t_start),
            "interval": self.acc,
            "sample_gen": self.sample_gen.get_state(),
            "eval_gen": self.eval_gen.get_state(),
            "graph_rng": self.graph_rng.bit_generator.state,
            "train_env_rng": self.train_env.rng_state(),
            "test_env_rng": self.test_env.rng_state(),
            "skipped": self.guard.skipped,
        }

    def load_state_dict(self, state: dict, path: Path, step: int) -> None:
        self.agent.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.episode, self.history, self.wall, self.acc = (
            state["episode"],
            state["history"],
            state["wall_seconds"],
            state["interval"],
        )
        self.sample_gen.set_state(state["sample_gen"])
        self.eval_gen.set_state(state["eval_gen"])
        self.graph_rng.bit_generator.state = state["graph_rng"]
        self.train_env.set_rng_state(state["train_env_rng"])
        self.test_env.set_rng_state(state["test_env_rng"])
        self.guard.skipped = state["skipped"]
        print(f"resuming {self.run_dir} at env step {self.step:,} (episode {self.episode:,}, {path.name})", flush=True)

    def prepare(self) -> str | None:
        if not self.history and self.episode == 0:
            print(f"new run {self.run_dir}", flush=True)
        print(
            f"core {self.core_name} {self.core_config} | {count_parameters(self.agent):,} trainable weights | "
            f"batch {self.batch} | {len(self.train_tables)} train / {self.num_test_graphs} test graphs | "
            f"test actions {self.cfg.eval_actions}",
            flush=True,
        )
        self.t_start = time.monotonic()
        return None

    def hparams(self) -> dict:
        return {
            **dataclasses.asdict(self.cfg),
            "core": self.core_name,
            "core_config": self.core_config,
            "label": self.label,
            "batch_size": self.batch,
            "num_parameters": count_parameters(self.agent),
            "run_dir": str(self.run_dir),
        }

    # ---- the loop
    def train(self, stop: GracefulStop) -> None:
        """Evaluate on the test graphs every ``--eval-every`` env steps; in between, one A2C update per episode."""
        recent: dict[str, float] = {"test_R": _test_reward(self.history[-1])} if self.history else {}
        last_save = time.monotonic()
        while True:
            if self.eval_due():
                self.test()
                recent["test_R"] = _test_reward(self.history[-1])
                self.logger.progress(self.step, force=True, episode=self.episode, **recent)
            if self.step >= self.cfg.total_steps or stop.requested:
                return
            recent["train_R"] = self.update()
            self.logger.progress(self.step, episode=self.episode, **recent)
            if time.monotonic() - last_save >= self.cfg.checkpoint_every:
                self.save()
                last_save = time.monotonic()

    def eval_due(self) -> bool:
        """At the start, at the end and at the first episode past each multiple of ``--eval-every`` env
        steps; never twice at one episode (a resumed run evaluated there already)."""
        if not self.history:
            return True
        last = self.history[-1]["episode"]
        if last == self.episode:
            return False
        every = self.cfg.eval_every
        return self.step >= self.cfg.total_steps or self.step // every > last * self.steps_per_update // every

    def update(self) -> float:
        """One training episode of the whole batch and its A2C update; returns the mean total reward."""
        cfg = self.cfg
        if not self.fixed_graphs:
            self.train_env.tables = self.train_tables[
                self.graph_rng.integers(0, len(self.train_tables), self.batch)
            ].astype(np.int64)
        out = rollout(self.agent, self.train_env, self.device, self.sample_gen, truncated=cfg.time_limit == "truncate")
        losses = a2c.a2c_loss(
            out["logits"],
            out["values"],
            out["actions"],
            out["rewards"],
            discount=cfg.discount,
            baseline_cost=cfg.baseline_cost,
            entropy_cost=cfg.entropy_cost,
            bootstrap=out["bootstrap"],
        )
        self.optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        if cfg.grad_norm_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.agent.parameters(), cfg.grad_norm_clip)
        if self.guard.ok(losses["loss"], self.agent.parameters()):
            self.optimizer.step()
        self.episode += 1
        self._record(out, {k: float(losses[k].detach()) for k in ("loss", "policy_loss", "value_loss", "entropy")})
        return float(out["total_reward"].mean())

    def _record(self, out: dict, scal: dict[str, float]) -> None:
        """Accumulate an update's numbers for the next evaluation row, and write them to TensorBoard."""
        train_reward = float(out["total_reward"].mean())
        self.acc["train_reward"].append(train_reward)
        self.acc["train_goals"].append(float(out["goals"].mean()))
        self.acc["train_invalid"].append(float(out["invalid"].mean()))
        for k, v in scal.items():
            self.acc[k].append(v)
        self.logger.log(
            self.step,
            {
                "train/total_reward": train_reward,
                "train/goals": float(out["goals"].mean()),
                "train/invalid_actions": float(out["invalid"].mean()),
                "loss/total": scal["loss"],
                "loss/policy": scal["policy_loss"],
                "loss/value": scal["value_loss"],
                "loss/entropy": scal["entropy"],
                "perf/skipped_updates": self.guard.skipped,
                "train/skipped_updates": self.guard.skipped,
            },
        )

    def test(self) -> None:
        """One episode on every test graph (sampled and/or greedy): a row of ``metrics.csv``."""
        policy = self.cfg.eval_actions
        results = {
            mode: evaluate(self.agent, self.test_env, self.device, self.eval_gen, greedy=(mode == "greedy"))
            for mode in (("sample", "greedy") if policy == "both" else (policy,))
        }
        means = _interval_means(self.acc)
        elapsed = self.wall + (time.monotonic() - self.t_start)
        prev = self.history[-1] if self.history else None
        rate = float("nan")
        if prev is not None and elapsed > prev["wall_minutes"] * 60:
            rate = (self.episode - prev["episode"]) / (elapsed - prev["wall_minutes"] * 60)
        first = next(iter(results.values()))
        self.history.append(
            {
                "episode": self.episode,
                "env_steps": self.step,
                "wall_minutes": elapsed / 60,
                "train_reward": means["train_reward"],
                "test_reward_sampled": results.get("sample", {}).get("total_reward"),
                "test_reward_greedy": results.get("greedy", {}).get("total_reward"),
                "test_goals": first["goals"],
                "train_goals": means["train_goals"],
                "train_invalid": means["train_invalid"],
                "loss": means["loss"],
                "policy_loss": means["policy_loss"],
                "value_loss": means["value_loss"],
                "entropy": means["entropy"],
                "episodes_per_s": rate,
                "skipped_updates": self.guard.skipped,
            }
        )
        for v in self.acc.values():
            v.clear()
        write_csv(self.csv_path, self.history)
        scalars = {
            f"test/total_reward_{'sampled' if m == 'sample' else 'greedy'}": r["total_reward"]
            for m, r in results.items()
        }
        scalars["test/goals"] = first["goals"]
        if math.isfinite(rate):
            scalars["perf/episodes_per_s"] = rate
        self.logger.log(self.step, scalars)

    # ---- the end
    def aborted(self, error: TrainingAborted, saved: Path | None) -> None:
        print(f"error: training aborted at episode {self.episode:,}: {error}", file=sys.stderr, flush=True)

    def finish(self, code: int, saved: Path | None) -> int:
        if code == 0 and self.step < self.cfg.total_steps:
            print(
                f"stopped at env step {self.step:,} (episode {self.episode:,}); re-run the same command to resume",
                flush=True,
            )
        if code == 0 and self.history:
            r = self.history[-1]
            print(
                f"env step {self.step:,} (episode {self.episode:,}): test total reward "
                f"{_fmt(r['test_reward_sampled']) or '-'} (sampled), "
                f"{_fmt(r['test_reward_greedy']) or '-'} (greedy); wall {format_duration(r['wall_minutes'] * 60)}; "
                f"metrics in {self.csv_path}",
                flush=True,
            )
        return code
