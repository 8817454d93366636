"""``rfwp-rl memory-probe``: can a core store what a memory task asks for, when RL is taken away?

The probe trains the agent a run would train (``agents/vector_<core>.toml``: torso, core, policy
head; the same observation stream, a zero reward and random previous actions as the agent's input
at every step) by supervised learning on the task's own episodes: the answer at every scored step
is the label, the loss the cross-entropy of the policy head, on fresh episodes at every update
(no data is seen twice), the whole episode in one unroll. Its score is the accuracy of the greedy
answer on held-out episodes, normalised like a return (``(acc - 1/n) / (1 - 1/n)``: random 0,
perfect 1, ``n`` the number of actions). Sequence tasks only (their observations do not depend on
the actions); CueGrid is not probed.

Beside it, the RL result of the same core, task and level from run tables (``--rl``: the
``runs.csv`` files ``memory-results`` writes): where the probe reaches 1 and RL stays at 0, the core
can store the answer and RL does not find it; where both stay low, the core (at this size and
budget) cannot store it.

Each finished probe is a row of ``probe.csv`` in ``--out`` (written atomically after every probe);
rows already there are not trained again, so re-running the command resumes.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import gymnasium
import numpy as np
import torch
import torch.nn.functional as F

from rfwp_rl import cores as cores_mod
from rfwp_rl import flags
from rfwp_rl.agent import build_agent, count_parameters
from rfwp_rl.checkpoint import atomic_write_csv, atomic_write_text
from rfwp_rl.errors import UserError, check_choice, read_text_file
from rfwp_rl.memory import suite
from rfwp_rl.memory.base import SequenceTask
from rfwp_rl.memory.health import agent_cores
from rfwp_rl.memory.results import core_rank
from rfwp_rl.presets import resolve_preset

TASKS = ("DelayedRecall", "AssociativeRecall", "RepeatPrevious", "CountRecall", "AssociativeRecallReassign")
"""The suite's sequence tasks, in the order of the table."""
EVAL_SEED_OFFSET = 1_000_003
"""Held-out episodes are drawn from seeds this far from the training ones (never the same episode)."""


@dataclass(frozen=True)
class ProbeConfig:
    """What one probe trains with (the same for every core, task and level)."""

    updates: int = 1500
    batch_size: int = 32
    learning_rate: float = 1e-3
    grad_norm_clip: float = 1.0
    eval_episodes: int = 512


@dataclass(frozen=True)
class ProbeResult:
    """One probe: a core on one task and level, one seed."""

    task: str
    level: str
    core: str
    seed: int
    params: int
    updates: int
    batch_size: int
    learning_rate: float
    settings: str
    episode_steps: int
    accuracy: float
    normalized: float
    final_loss: float
    seconds: float

    @property
    def key(self) -> tuple:
        return (
            self.task,
            self.level,
            self.core,
            self.seed,
            self.updates,
            self.batch_size,
            self.learning_rate,
            self.settings,
        )


def make_task(task: str, level: str) -> SequenceTask:
    """The registered env of ``task`` at ``level``, unwrapped (a one-line error for a task that is
    not a sequence task)."""
    check_choice("probe task", task, TASKS)
    suite.register()
    env = gymnasium.make(suite.env_id(task, level)).unwrapped
    if not isinstance(env, SequenceTask):  # the TASKS list and the suite disagree
        raise UserError(f"task {task!r} is not a sequence task; allowed: {', '.join(TASKS)}")
    return env


def draw_episodes(env: SequenceTask, seeds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Observations ``float32 [T, N, D]`` and labels ``int64 [T, N]`` (-1 where not scored) of the
    episodes drawn by ``env.reset(seed=s)`` for each seed."""
    obs, target = [], []
    for s in seeds:
        env.reset(seed=int(s))
        obs.append(env.episode.obs)
        target.append(env.episode.target)
    return torch.from_numpy(np.stack(obs, axis=1)), torch.from_numpy(np.stack(target, axis=1))


def answer_logits(agent: torch.nn.Module, obs: torch.Tensor, prev_action: torch.Tensor) -> torch.Tensor:
    """The policy head's logits ``[T, N, A]`` for whole episodes from the zero state (reward 0,
    the given previous actions, a reset at the first step)."""
    T, N = obs.shape[:2]
    done = torch.zeros(T, N, dtype=torch.bool)
    done[0] = True
    out, _ = agent(obs, torch.zeros(T, N), done, agent.initial_state(N), prev_action=prev_action)
    return out["policy_params"]


def scored_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the scored steps (``target >= 0``)."""
    scored = target >= 0
    return F.cross_entropy(logits[scored], target[scored])


def probe(
    task: str,
    level: str,
    core: str,
    seed: int,
    config: ProbeConfig,
    settings: tuple[str, ...] = (),
    log_every: int = 0,
) -> ProbeResult:
    """Train ``core``'s vector agent (its preset with the ``--set`` items ``settings``) on
    ``task`` at ``level`` by supervised learning (module docstring); score it on held-out episodes."""
    env = make_task(task, level)
    n = int(env.action_space.n)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    agent = build_agent(resolve_preset(core, None, settings, kind="vector"), env.observation_space, env.action_space)
    opt = torch.optim.Adam(agent.parameters(), lr=config.learning_rate)
    start, loss = time.perf_counter(), torch.tensor(float("nan"))
    agent.train()
    for update in range(1, config.updates + 1):
        obs, target = draw_episodes(env, rng.integers(0, 2**31 - EVAL_SEED_OFFSET, config.batch_size).tolist())
        prev = torch.from_numpy(rng.integers(0, n, size=target.shape))
        loss = scored_loss(answer_logits(agent, obs, prev), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_norm_clip > 0:
            torch.nn.utils.clip_grad_norm_(agent.parameters(), config.grad_norm_clip)
        opt.step()
        if log_every and update % log_every == 0:
            elapsed = time.perf_counter() - start
            eta = elapsed / update * (config.updates - update)
            print(
                f"  {task}-{level} {core} seed {seed}: update {update}/{config.updates} "
                f"loss {loss.item():.3f} ({update / elapsed:.1f} updates/s, ETA {eta:.0f} s)",
                flush=True,
            )
    agent.eval()
    eval_rng = np.random.default_rng(seed + EVAL_SEED_OFFSET)
    correct = scored = 0
    with torch.no_grad():
        for first in range(0, config.eval_episodes, config.batch_size):
            count = min(config.batch_size, config.eval_episodes - first)
            seeds = [2**31 - EVAL_SEED_OFFSET + first + i for i in range(count)]  # never a training seed
            obs, target = draw_episodes(env, seeds)
            logits = answer_logits(agent, obs, torch.from_numpy(eval_rng.integers(0, n, size=target.shape)))
            mask = target >= 0
            correct += int((logits.argmax(-1)[mask] == target[mask]).sum())
            scored += int(mask.sum())
    accuracy = correct / scored
    return ProbeResult(
        task,
        level,
        core,
        seed,
        count_parameters(agent),
        config.updates,
        config.batch_size,
        config.learning_rate,
        " ".join(settings),
        env.episode_length,
        accuracy,
        (accuracy - 1 / n) / (1 - 1 / n),
        float(loss.item()),
        time.perf_counter() - start,
    )


# ------------------------------------------------------------------------- tables


def read_rows(path: Path) -> list[ProbeResult]:
    """The probes already in ``probe.csv`` (none if it does not exist)."""
    if not path.is_file():
        return []
    types = {f.name: f.type for f in fields(ProbeResult)}
    cast = {"int": int, "float": float, "str": str}
    with path.open(newline="") as f:
        return [ProbeResult(**{k: cast[types[k]](v) for k, v in row.items()}) for row in csv.DictReader(f)]


def write_rows(path: Path, rows: list[ProbeResult]) -> None:
    """``rows`` as ``probe.csv`` (atomically)."""
    atomic_write_csv(path, [asdict(r) for r in rows], [f.name for f in fields(ProbeResult)], float_format=".4f")


def read_rl(paths: list[Path]) -> dict[tuple[str, str, str], list[float]]:
    """``(task, level, core) -> [normalised final return per seed]`` from ``memory-results`` run
    tables (``runs.csv``); missing files are skipped."""
    out: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for path in paths:
        if not path.is_file():
            print(f"no RL table at {path}: skipped")
            continue
        reader = csv.DictReader(io.StringIO(read_text_file(path, "RL table (--rl)"), newline=""))
        missing = [c for c in ("task", "level", "core", "normalized") if c not in (reader.fieldnames or [])]
        if missing:
            raise UserError(f"RL table (--rl) {str(path)!r} is not a memory-results runs.csv: no {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                out[(row["task"], row["level"], row["core"])].append(float(row["normalized"]))
            except (TypeError, ValueError):
                value = row["normalized"]
                raise UserError(f"RL table (--rl) {path}:{line}: normalized {value!r} is no number") from None
    return out


def markdown(rows: list[ProbeResult], rl: dict[tuple[str, str, str], list[float]]) -> str:
    """Rows task (level), columns cores (with their ``--set`` items, if any): ``probe / RL``
    (normalised, mean over seeds; ``-`` where there is no RL run of the core's defaults)."""
    by: dict[tuple[str, str, tuple[str, str]], list[float]] = defaultdict(list)
    for r in rows:
        by[(r.task, r.level, (r.core, r.settings))].append(r.normalized)
    cores = sorted({(r.core, r.settings) for r in rows}, key=lambda cs: (core_rank(cs[0]), cs[1]))
    cells = sorted({(r.task, r.level) for r in rows}, key=lambda tl: (TASKS.index(tl[0]), suite.LEVELS.index(tl[1])))
    lines = [
        "| task (level) | " + " | ".join(f"{c} ({s})" if s else c for c, s in cores) + " |",
        "|---|" + "---|" * len(cores),
    ]
    for task, level in cells:
        out = []
        for c in cores:
            p = by.get((task, level, c))
            r = None if c[1] else rl.get((task, level, c[0]))
            probe_text = f"{sum(p) / len(p):.2f}" if p else "·"
            rl_text = f"{sum(r) / len(r):.2f}" if r else "-"
            out.append(f"{probe_text} / {rl_text}")
        lines.append(f"| {task} ({level}) | " + " | ".join(out) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_list_argument(parser, "--tasks", list(TASKS[:2]), "sequence tasks")
    flags.add_list_argument(parser, "--levels", list(suite.LEVELS), "levels")
    flags.add_list_argument(
        parser, "--cores", None, "cores", default_text="every core with an agents/vector_<core>.toml"
    )
    flags.add_list_argument(parser, "--seeds", [1], "seeds", item=flags.integer)
    default = ProbeConfig()
    flags.add_shared(parser, "updates", default.updates, "of each probe")
    parser.add_argument(
        "--batch-size", type=flags.integer, default=default.batch_size, help="episodes per update (default %(default)s)"
    )
    flags.add_shared(parser, "learning_rate", default.learning_rate, "Adam")
    flags.add_shared(parser, "grad_norm_clip", default.grad_norm_clip)
    flags.add_list_argument(
        parser,
        "--rl",
        ["results/memory/comparison/runs.csv", "results/memory/hard/runs.csv"],
        "memory-results runs.csv tables to put beside the probe (none: no RL column)",
        metavar="RUNS_CSV",
        allow_empty=True,
    )
    parser.add_argument(
        "--out", default="results/memory/probe", help="where probe.csv and probe.md go (default %(default)s)"
    )
    flags.add_shared(parser, "torch_threads", 1)
    flags.add_set_argument(parser, "the agent preset", "core_config.hidden_size=64")


def run(args: argparse.Namespace) -> int:
    for task in args.tasks:
        check_choice("probe task", task, TASKS)
    for level in args.levels:
        check_choice("level", level, suite.LEVELS)
    cores = agent_cores() if args.cores is None else list(dict.fromkeys(args.cores))
    for c in cores:
        check_choice("core", c, sorted(cores_mod.available()))
    if args.updates < 1 or args.batch_size < 1 or not 0 < args.learning_rate < math.inf:
        raise UserError(
            f"--updates {args.updates} / --batch-size {args.batch_size} / --learning-rate {args.learning_rate}: "
            "allowed: integers >= 1 and a finite rate > 0"
        )
    torch.set_num_threads(args.torch_threads)
    config = ProbeConfig(args.updates, args.batch_size, args.learning_rate, args.grad_norm_clip)
    out = Path(args.out)
    path = out / "probe.csv"
    rows = read_rows(path)
    done = {r.key for r in rows}
    settings = " ".join(args.overrides)
    plan = [
        (task, level, core, seed)
        for seed in args.seeds
        for level in args.levels
        for task in args.tasks
        for core in cores
        if (task, level, core, seed, config.updates, config.batch_size, config.learning_rate, settings) not in done
    ]
    print(
        f"memory probe: {len(cores)} cores x {len(args.tasks)} tasks x {len(args.levels)} levels x "
        f"{len(args.seeds)} seeds, {config.updates} updates of {config.batch_size} episodes; "
        f"{len(plan)} to train, results in {path}",
        flush=True,
    )
    for i, (task, level, core, seed) in enumerate(plan, 1):
        result = probe(task, level, core, seed, config, tuple(args.overrides), log_every=max(config.updates // 5, 1))
        rows.append(result)
        write_rows(path, rows)
        print(
            f"[{i}/{len(plan)}] {task}-{level} {core} seed {seed}: accuracy {result.accuracy:.3f} "
            f"(normalised {result.normalized:.2f}) in {result.seconds:.0f} s",
            flush=True,
        )
    rl = read_rl([Path(p) for p in args.rl])
    current = [
        r
        for r in rows
        if (r.updates, r.batch_size, r.learning_rate) == (config.updates, config.batch_size, config.learning_rate)
    ]
    table = markdown(current, rl)
    atomic_write_text(
        out / "probe.md",
        f"# Memory probe: supervised / RL (normalised)\n\n{table}\n\n"
        f"Probe: {config.updates} updates of {config.batch_size} episodes, Adam {config.learning_rate}.\n",
    )
    print(table)
    return 0
