"""``rfwp-rl bench memory-health``: the health bar every core must pass on the memory suite.

Each core (by default every registered core with a vector-env preset ``agents/vector_<core>.toml``,
i.e. every core meant for agents; the language-modelling variants have none) is trained with the
defaults of ``rfwp-rl train`` on the two easiest recall tasks, DelayedRecall-easy and
AssociativeRecall-easy, for a fixed budget (``--total-steps`` env steps) and ``--seeds``. Every run is one
``rfwp-rl train`` process, as ``launch/memory_suite.sh`` starts them, in
``<runs>/<env>/<core>_s<seed>`` with its console log beside it; a run whose newest checkpoint has
reached the budget, or that has a record in ``<out>/records/`` (written for every finished run, committed with
the table, so that it outlives the run directories), is skipped, so re-running the command resumes an
interrupted sweep.

Score: the normalised final return (random 0, optimal 1) of each run, TensorBoard's
``episode/return_mean100`` at its end (the mean return of the last 100 training episodes), mean
over seeds. A core below :data:`HEALTHY` on both tasks is flagged (a run that logged no episodes
counts as below). Writes ``health.csv``, ``health.md`` and the records to ``--out`` (atomically) after every
run, and prints the table at the end; exits 1 if a run failed.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rfwp_rl import cores as cores_mod
from rfwp_rl import flags
from rfwp_rl.checkpoint import atomic_write_csv, atomic_write_text, newest_checkpoint_step
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.memory import suite
from rfwp_rl.memory.results import RECORDS, Run, core_rank, read_record, read_run, record_text
from rfwp_rl.presets import preset_cores
from rfwp_rl.runlog import run_name

TASKS = (suite.env_id("DelayedRecall", "easy"), suite.env_id("AssociativeRecall", "easy"))
HEALTHY = 0.5  # normalised final return a core must reach on at least one of the tasks
DEFAULT_STEPS = 300_000


def agent_cores() -> list[str]:
    """Registered cores that have a vector-env preset (``agents/vector_<core>.toml``), in the
    memory table's order."""
    with_preset = set(preset_cores("vector"))
    return sorted((c for c in cores_mod.available() if c in with_preset), key=core_rank)


@dataclass(frozen=True)
class Job:
    """One training run of the health check."""

    env: str
    core: str
    seed: int
    steps: int
    run_dir: Path
    record: Path  # where its record goes once it has finished (:func:`rfwp_rl.memory.results.record_text`)

    @property
    def done(self) -> bool:
        """It has a record of the budget, or its newest checkpoint (named by its step) has reached it."""
        if self.kept() is not None:
            return True
        newest = newest_checkpoint_step(self.run_dir)
        return newest is not None and newest >= self.steps

    def kept(self) -> Run | None:
        """Its record, if it has one of the budget."""
        run = read_record(self.record) if self.record.is_file() else None
        return run if run is not None and run.total_steps >= self.steps else None

    def result(self) -> Run | None:
        """Its run: from its record (cheap to read), else from the run directory; None before any episode is
        logged."""
        return self.kept() or (read_run(self.run_dir) if self.run_dir.is_dir() else None)

    def command(self, train_args: list[str]) -> list[str]:
        """The ``rfwp-rl train`` command (one env process and one torch thread, as the suite's
        launch script; ``train_args`` come last, so they override)."""
        return [
            sys.executable,
            "-m",
            "rfwp_rl",
            "train",
            "--env",
            self.env,
            "--core",
            self.core,
            "--seed",
            str(self.seed),
            "--total-steps",
            str(self.steps),
            "--run-dir",
            str(self.run_dir),
            "--num-env-processes",
            "1",
            "--torch-threads",
            "1",
            "--log-every",
            "10",
            *train_args,
        ]


def plan(
    cores: list[str], seeds: list[int], steps: int, runs_root: Path, records_root: Path, tasks: tuple[str, ...] = TASKS
) -> list[Job]:
    """Every (seed, task, core) run, seed by seed (a partial sweep gives complete first seeds)."""
    return [
        Job(
            env,
            core,
            seed,
            steps,
            runs_root / run_name(env) / f"{core}_s{seed}",
            records_root / run_name(env) / f"{core}_s{seed}.json",
        )
        for seed in seeds
        for env in tasks
        for core in cores
    ]


def run_job(job: Job, train_args: list[str]) -> int:
    """Train one run (console output appended to ``<run_dir>.log``); its exit code."""
    job.run_dir.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(f"{job.run_dir}.log", "ab") as log:
        return subprocess.run(job.command(train_args), stdout=log, stderr=subprocess.STDOUT, env=env).returncode


def scores(jobs: list[Job]) -> dict[tuple[str, str], list[float]]:
    """``{(core, env): [normalised final return per finished seed]}``; NaN for a finished run that logged no
    episodes; runs not finished yet are left out."""
    out: dict[tuple[str, str], list[float]] = {}
    for job in jobs:
        if job.done:
            run = job.result()
            out.setdefault((job.core, job.env), []).append(run.normalized if run is not None else math.nan)
    return out


def write_outputs(jobs: list[Job], cores: list[str], steps: int, out: Path) -> str:
    """Write the records of the finished runs, ``health.csv`` and ``health.md`` (atomically); the table."""
    for job in jobs:
        run = read_run(job.run_dir) if job.kept() is None and job.run_dir.is_dir() else None
        if run is not None and run.finished:
            atomic_write_text(job.record, record_text(run))
    rows = health_rows(cores, TASKS, scores(jobs))
    table = markdown(rows, TASKS, steps, (sum(job.done for job in jobs), len(jobs)))
    write_csv(out / "health.csv", rows, TASKS, steps)
    atomic_write_text(out / "health.md", f"# Memory health check\n\n{table}\n")
    return table


def flagged(per_task: list[float], threshold: float = HEALTHY) -> bool:
    """True when every task's score is below ``threshold`` (NaN, no result, counts as below)."""
    return all(not v >= threshold for v in per_task)


def health_rows(cores: list[str], tasks: tuple[str, ...], by_run: dict[tuple[str, str], list[float]]) -> list[dict]:
    """One row per core: per task the mean normalised return over its seeds (NaN if any seed has
    none), the seed count, the tasks with a finished run, and the flag (only once every task has one)."""
    rows = []
    for core in cores:
        row: dict = {"core": core}
        means = []
        for env in tasks:
            values = by_run.get((core, env), [])
            mean = sum(values) / len(values) if values else math.nan
            row[suite.entry(env).task] = mean
            means.append(mean)
        row["seeds"] = min((len(by_run.get((core, env), [])) for env in tasks), default=0)
        row["finished"] = {suite.entry(env).task for env in tasks if (core, env) in by_run}  # tasks with a result
        row["flagged"] = flagged(means) and len(row["finished"]) == len(tasks)
        rows.append(row)
    return rows


def _cell(v: float, finished: bool) -> str:
    if not finished:
        return "not run yet"
    return "no result" if math.isnan(v) else f"{v:.2f}"


def markdown(rows: list[dict], tasks: tuple[str, ...], steps: int, finished: tuple[int, int] | None = None) -> str:
    """The table: cores x tasks, normalised final return, and the flag; ``finished``: (runs finished, runs
    planned) of a sweep under way, said above the table."""
    names = [suite.entry(e).task for e in tasks]
    lines = []
    if finished is not None and finished[0] < finished[1]:
        lines += [
            f"**Partial**: {finished[0]} of {finished[1]} runs finished; a cell is the mean over its finished seeds.",
            "",
        ]
    lines += [
        "| core | " + " | ".join(f"{n} (easy)" for n in names) + f" | seeds | below {HEALTHY} on every task |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    for r in rows:
        lines.append(
            f"| {r['core']} | "
            + " | ".join(_cell(r[n], n in r["finished"]) for n in names)
            + f" | {r['seeds']} | {'**FLAGGED**' if r['flagged'] else ''} |"
        )
    lines.append("")
    lines.append(
        f"Normalised final return (random 0, optimal 1; mean of the last 100 training episodes, mean over "
        f"seeds) after {steps:,} env steps with the defaults of `rfwp-rl train`."
    )
    others = sorted(set(cores_mod.available()) - set(agent_cores()))
    if others:
        lines.append("")
        lines.append(
            f"Registered cores without an agent preset, so not agent cores (`rfwp-rl train` refuses them; "
            f"they serve the sequence trainer, `rfwp-rl seq`): {', '.join(others)}."
        )
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict], tasks: tuple[str, ...], steps: int) -> None:
    """``health.csv``: per core its score on each task, its seeds, the budget and whether it is flagged."""
    columns = ["core", *(suite.entry(e).task for e in tasks), "seeds", "steps", "flagged"]
    table = [{**r, "steps": steps, "flagged": int(r["flagged"])} for r in rows]
    atomic_write_csv(path, table, columns, float_format=".4f")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_shared(parser, "total_steps", DEFAULT_STEPS, "of each run", unit=flags.ENV_STEPS)
    flags.add_list_argument(parser, "--seeds", [1], "seeds", item=flags.integer)
    flags.add_list_argument(
        parser,
        "--cores",
        None,
        "cores to check",
        default_text="every registered core with an agents/vector_<core>.toml",
    )
    parser.add_argument(
        "--runs", default="runs/memory_health", help="folder of the run directories (default %(default)s)"
    )
    parser.add_argument(
        "--out",
        default="results/memory/health",
        help="where health.csv, health.md and the finished runs' records/ go (default %(default)s)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default %(default)s)")
    parser.add_argument(
        "--train-args",
        default="",
        metavar="'OPTIONS'",
        help="more options of every rfwp-rl train command, e.g. '--env-backend local'",
    )


def run(args: argparse.Namespace) -> int:
    if args.total_steps < 1 or args.jobs < 1:
        raise UserError(f"--total-steps {args.total_steps} / --jobs {args.jobs}: both must be >= 1")
    if args.cores is None:
        cores = agent_cores()
        skipped = sorted(set(cores_mod.available()) - set(cores))
        if skipped:
            print(f"cores without a vector-env preset, not checked: {', '.join(skipped)}")
    else:
        cores = list(dict.fromkeys(args.cores))
        for c in cores:
            check_choice("core", c, sorted(cores_mod.available()))
    train_args = shlex.split(args.train_args)
    out = Path(args.out)
    jobs = plan(cores, args.seeds, args.total_steps, Path(args.runs), out / RECORDS)
    todo = [j for j in jobs if not j.done]
    print(
        f"memory health: {len(cores)} cores x {len(TASKS)} tasks x {len(args.seeds)} seeds, "
        f"{args.total_steps:,} env steps; "
        f"{len(jobs) - len(todo)} runs already done, {len(todo)} to train (logs: <run dir>.log)",
        flush=True,
    )

    writing = threading.Lock()

    def one(job: Job) -> int:
        code = run_job(job, train_args)
        status = "done  " if code == 0 else f"FAILED (exit {code}; log {job.run_dir}.log)"
        print(f"{status} {job.env} {job.core} seed {job.seed}", flush=True)
        with writing:  # the table fills as runs finish, so an interrupted sweep still leaves its runs' results
            write_outputs(jobs, cores, args.total_steps, out)
        return code

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        failed = sum(code != 0 for code in pool.map(one, todo))
    table = write_outputs(jobs, cores, args.total_steps, out)
    print(table)
    print(f"wrote {out / 'health.csv'} and {out / 'health.md'}")
    return 1 if failed else 0
