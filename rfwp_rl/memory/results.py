"""The memory-suite evidence: IMPALA runs on the ``rfwp/`` tasks -> ``results/memory/``.

``rfwp-rl memory-results --runs runs/memory/easy_suite --out results/memory/easy_suite`` (the defaults:
the runs of ``launch/memory_suite.sh`` and the easy-suite table) reads every run directory under
``--runs`` whose env is a suite id
(its ``config.json`` and TensorBoard events) and writes the files below. ``--bench comparison`` reads the
runs of the extended comparison instead (``launch/memory_comparison.sh``; defaults ``--runs
runs/memory/comparison --out results/memory/comparison``): the suite's easy and medium ids, popgym's easy
memory tasks and MiniGrid-MemoryS7 (:mod:`rfwp_rl.memory.comparison`), its IQM over all of them.

- ``runs.csv``: one row per run: env, task, level, core, seed, parameters, env steps reached and
  targeted, wall-clock minutes, final return and its normalised value, and the run's peak (the
  highest mean return of 100 episodes it logged), its step and normalised value: a run whose
  peak is far above its final return learned the task and lost it; the step at which the
  normalised curve first reached 0.9 and its lowest normalised value after that step (empty if it
  never did);
- ``summary.csv``: one row per (env, core): seeds, mean normalised final return, its standard
  deviation over seeds and 95% interval (Student t; both empty for one seed), mean parameters
  and minutes;
- ``aggregate.csv``: one row per core: the interquartile mean (IQM) of the normalised final
  returns of all its runs on the tasks of one level (``--aggregate-level``; ``all``: every task), with the 95%
  stratified-bootstrap interval (:mod:`rfwp_rl.stats`), and the numbers of runs and tasks;
- ``aggregate_levels.csv`` (when runs span two levels or more): the same per core and level, each level's
  tasks pooled on their own;
- ``performance_profile.png``: per core, the fraction of those runs whose normalised return
  exceeds tau, over tau, with the 95% stratified-bootstrap band;
- ``curves.png``: per env, the normalised return over env steps, mean over seeds with the 95%
  interval as a band, one line per core;
- the tables between the markers ``<!-- memory-table -->`` and ``<!-- /memory-table -->``, and
  ``<!-- memory-aggregate -->`` and ``<!-- /memory-aggregate -->``, and (runs on two levels or more) the
  per-level IQMs between ``<!-- memory-aggregate-levels -->`` and ``<!-- /memory-aggregate-levels -->``, of
  ``README.md`` (the file is created if missing; the text around the markers is kept);
- ``records/``: one small JSON file per finished run (its row's raw numbers and its curve), at the run
  directory's path under ``--runs`` (``records/<env>/<core>_s<seed>.json``). They are committed with the
  tables, so a table outlives its run directories: the tables are made from the run directories and from
  every record whose run directory is gone, and the launch scripts skip a run that has a record.

Final return: the mean return of the last 100 training episodes (sampled actions), TensorBoard's
``episode/return_mean100`` at the run's last step. Normalised: ``(R - random) / (optimal - random)``
with the suite's exact reference numbers (:mod:`rfwp_rl.memory.suite`; the comparison's other envs:
:mod:`rfwp_rl.memory.comparison`).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rfwp_rl import stats
from rfwp_rl.checkpoint import atomic_write_csv, atomic_write_figure, atomic_write_text, newest_checkpoint_step
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.memory import comparison, suite
from rfwp_rl.runlog import read_all_scalars

CORE_ORDER = (
    "ff",
    "lstm",
    "gru",
    "lt",
    "delta",
    "delta_rnn",
    "rdn",
    "fwm",
    "gated_delta",
    "delta_product",
    "srwm",
    "ffm",
    "lru",
    "mlstm",
    "mamba",
)
CURVE_TAG = "episode/return_mean100"
MINUTES_TAG = "perf/train_minutes"
TABLE_BEGIN, TABLE_END = "<!-- memory-table -->", "<!-- /memory-table -->"
AGGREGATE_BEGIN, AGGREGATE_END = "<!-- memory-aggregate -->", "<!-- /memory-aggregate -->"
LEVELS_BEGIN, LEVELS_END = "<!-- memory-aggregate-levels -->", "<!-- /memory-aggregate-levels -->"
RECORDS = "records"  # the folder of an output folder that keeps its finished runs' records
HELD_LEVEL = 0.9  # "reached the optimum": normalised return of the runs' held columns
PROFILE_TAUS = tuple(i / 100 for i in range(101))  # normalised return thresholds of the profile
# two-sided 95% Student t quantiles t_{0.975, df}, df = seeds - 1
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


@dataclass(frozen=True)
class Benchmark:
    """What the tables need to know of a set of envs: their order, each one's task and level, and how a
    return is normalised (0: random, 1: the benchmark's reference)."""

    envs: tuple[str, ...]
    describe: Callable[[str], tuple[str, str]]  # env -> (task, level)
    normalize: Callable[[str, float], float]  # (env, return) -> normalised return
    title: str = "Memory-task suite results"  # a new README's heading
    name: str = "memory-suite"  # what its runs are called in messages
    aggregate_level: str = "easy"  # the level memory-results pools by default

    @property
    def levels(self) -> tuple[str, ...]:
        """The levels of its envs, in the envs' order."""
        return tuple(dict.fromkeys(self.describe(env)[1] for env in self.envs))

    @property
    def aggregate_levels(self) -> tuple[str, ...]:
        """What ``--aggregate-level`` may be: one of :attr:`levels`, or ``all`` (every env)."""
        return (*self.levels, "all")


MEMORY_SUITE = Benchmark(
    tuple(suite.ALL), lambda env: (suite.entry(env).task, suite.entry(env).level), suite.normalized_return
)
COMPARISON = Benchmark(
    comparison.ENVS,
    comparison.describe,
    comparison.normalized_return,
    title="Memory cores: the extended comparison",
    name="comparison",
    aggregate_level="all",
)
#: ``--bench`` name -> (benchmark, default --runs, default --out)
BENCHES: dict[str, tuple[Benchmark, str, str]] = {
    "suite": (MEMORY_SUITE, "runs/memory/easy_suite", "results/memory/easy_suite"),
    "comparison": (COMPARISON, "runs/memory/comparison", "results/memory/comparison"),
}


@dataclass
class Run:
    """One training run on an env of a :class:`Benchmark` (by default the memory suite)."""

    path: Path
    env: str
    core: str
    seed: int
    params: int
    total_steps: int
    steps: int
    minutes: float
    final_return: float
    curve: list[tuple[int, float]] = field(default_factory=list)  # (env step, return_mean100)
    bench: Benchmark = MEMORY_SUITE
    # a record kept without its curve: its peak (env step, return), which the curve would give
    kept_peak: tuple[int, float] | None = None

    @property
    def task(self) -> str:
        return self.bench.describe(self.env)[0]

    @property
    def level(self) -> str:
        return self.bench.describe(self.env)[1]

    @property
    def finished(self) -> bool:
        """It reached its budget: only then is it kept as a record."""
        return self.steps >= self.total_steps

    @property
    def normalized(self) -> float:
        return self.bench.normalize(self.env, self.final_return)

    @property
    def peak(self) -> tuple[int, float]:
        """(env step, return) of the highest point of the curve (the first, on a tie)."""
        if not self.curve and self.kept_peak is not None:
            return self.kept_peak
        return max(self.curve, key=lambda point: (point[1], -point[0]))

    @property
    def normalized_curve(self) -> list[tuple[int, float]]:
        """(env step, normalised return_mean100) at every logged point."""
        return [(step, self.bench.normalize(self.env, value)) for step, value in self.curve]

    def held(self, level: float = HELD_LEVEL) -> tuple[int, float] | None:
        """(env step at which the normalised curve first reached ``level``, its lowest normalised
        value from there on), or None if it never did: a run that reached the optimum and kept it
        has the second number near the first's level, one that lost it far below (None also without a curve)."""
        normalized = self.normalized_curve
        first = next((i for i, (_, value) in enumerate(normalized) if value >= level), None)
        if first is None:
            return None
        return normalized[first][0], min(value for _, value in normalized[first:])


def read_run(run_dir: Path, bench: Benchmark = MEMORY_SUITE) -> Run | None:
    """A run's numbers, or None if ``run_dir`` is not an IMPALA run on an env of ``bench`` or has
    no episodes logged yet."""
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        return None
    config = json.loads(config_path.read_text())
    env = config.get("env")
    if env not in bench.envs or "core" not in config:
        return None
    scalars = read_all_scalars(run_dir)
    curve = scalars.get(CURVE_TAG)
    if not curve:
        return None
    # the learner logs its losses at every update's step: the last one is the step reached
    steps = max(series[-1][0] for series in scalars.values() if series)
    minutes = scalars[MINUTES_TAG][-1][1] if scalars.get(MINUTES_TAG) else float("nan")  # none logged yet
    return Run(
        run_dir,
        env,
        str(config["core"]),
        int(config.get("seed", 0)),
        int(config.get("num_params", 0)),
        int(config.get("total_steps", 0)),
        steps,
        minutes,
        float(curve[-1][1]),
        curve,
        bench,
    )


RECORD_FIELDS = ("env", "core", "seed", "params", "total_steps", "steps", "minutes", "final_return")


def record_text(r: Run) -> str:
    """The JSON record of a run: the raw numbers of its ``runs.csv`` row, its peak and its curve (no
    normalised value: those follow the benchmark, which may change)."""
    record = {k: getattr(r, k) for k in RECORD_FIELDS}
    record["peak"] = list(r.peak)
    record["curve"] = [[int(step), float(value)] for step, value in r.curve]
    return json.dumps(record, indent=None, separators=(",", ":")) + "\n"


def read_record(path: Path, bench: Benchmark = MEMORY_SUITE) -> Run | None:
    """The run a record holds, or None if its env is not one of ``bench``; a malformed record is a one-line
    error naming the file."""
    try:
        record = json.loads(path.read_text())
        env = record["env"]
        if env not in bench.envs:
            return None
        curve = [(int(step), float(value)) for step, value in record["curve"]]
        peak = record.get("peak")
        return Run(
            path,
            str(env),
            str(record["core"]),
            int(record["seed"]),
            int(record["params"]),
            int(record["total_steps"]),
            int(record["steps"]),
            float(record["minutes"]),
            float(record["final_return"]),
            curve,
            bench,
            (int(peak[0]), float(peak[1])) if peak is not None else None,
        )
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise UserError(f"run record {str(path)!r} is unreadable ({type(e).__name__}: {e}); delete or fix it") from e


def record_path(records_root: Path, runs_root: Path, run_dir: Path) -> Path:
    """Where the record of the run in ``run_dir`` (under ``runs_root``) goes: the same relative path, .json."""
    return records_root / f"{run_dir.relative_to(runs_root)}.json"


def write_records(runs: list[Run], runs_root: Path, records_root: Path) -> int:
    """Write (atomically) the record of every finished run of ``runs`` that lives under ``runs_root``; how many."""
    written = 0
    for r in runs:
        if r.finished and r.path.is_dir() and r.path.is_relative_to(runs_root):
            atomic_write_text(record_path(records_root, runs_root, r.path), record_text(r))
            written += 1
    return written


def write_record(run_dir: Path, runs_root: Path, records_root: Path, bench: Benchmark = MEMORY_SUITE) -> Path:
    """Write (atomically) the record of the one finished run in ``run_dir`` (under ``runs_root``); its path.
    The sweep launchers call it after each run, so that a record does not wait for the tables."""
    root, run = Path(os.path.abspath(runs_root)), Path(os.path.abspath(run_dir))  # links kept, as in collect
    if not run.is_relative_to(root) or run == root:
        raise UserError(f"--record {str(run_dir)!r} is not under --runs {str(runs_root)!r}")
    r = read_run(run_dir, bench)
    if r is None:
        raise UserError(f"--record {str(run_dir)!r} is not a run on an env of {bench.name} with episodes logged")
    if not r.finished:
        raise UserError(f"--record {str(run_dir)!r} is not finished ({r.steps:,} of {r.total_steps:,} env steps)")
    path = record_path(records_root, root, run)
    atomic_write_text(path, record_text(r))
    return path


def _glob(root: Path, name: str) -> list[Path]:
    # glob's ** follows links to directories (Path.rglob does not), so a comparison can be assembled
    # from runs kept elsewhere by linking them into one folder
    return sorted(Path(p) for p in glob.glob(os.path.join(glob.escape(str(root)), "**", name), recursive=True))


def collect(runs_root: Path, bench: Benchmark = MEMORY_SUITE, records_root: Path | None = None) -> list[Run]:
    """Every run on an env of ``bench`` under ``runs_root`` (any depth, through links to directories), and
    every record under ``records_root`` whose run directory is not under ``runs_root`` (or has fewer
    steps), sorted by env, core order and seed. A run directory whose record holds its newest checkpoint's
    step is taken from the record: the same numbers, without reading its events again."""
    if not runs_root.is_dir():
        raise UserError(f"--runs {str(runs_root)!r} is not a directory")
    kept: dict[Path, Run] = {}
    if records_root is not None and records_root.is_dir():
        for p in _glob(records_root, "*.json"):
            if (record := read_record(p, bench)) is not None:
                kept[p.relative_to(records_root).with_suffix("")] = record
    runs = {}
    for p in _glob(runs_root, "config.json"):
        key = p.parent.relative_to(runs_root)
        newest = newest_checkpoint_step(p.parent)
        if key in kept and newest is not None and kept[key].steps >= newest:
            continue
        if (r := read_run(p.parent, bench)) is not None:
            runs[key] = r
    for key, record in kept.items():
        if key not in runs or runs[key].steps < record.steps:
            runs[key] = record
    return sorted(runs.values(), key=lambda r: (bench.envs.index(r.env), core_rank(r.core), r.seed))


def with_benchmark(runs: list[Run], bench: Benchmark) -> list[Run]:
    """The same runs scored by ``bench`` (e.g. once a normalisation that depends on the runs is known)."""
    return [replace(r, bench=bench) for r in runs]


def core_rank(core: str) -> tuple[int, str]:
    return (CORE_ORDER.index(core) if core in CORE_ORDER else len(CORE_ORDER), core)


def mean_sd_ci(values: list[float]) -> tuple[float, float, float]:
    """Mean, sample standard deviation and the half-width of the mean's two-sided 95% Student t
    interval (both NaN for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan"), float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, sd, T975.get(n - 1, 1.96) * sd / math.sqrt(n)


def summarize(runs: list[Run]) -> list[dict]:
    """One row per (env, core): seeds, normalised final return mean and 95% half-width, etc."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.env, r.core), []).append(r)
    rows = []
    for (env, core), rs in groups.items():
        mean, sd, half = mean_sd_ci([r.normalized for r in rs])
        rows.append(
            {
                "env": env,
                "task": rs[0].task,
                "level": rs[0].level,
                "core": core,
                "seeds": len(rs),
                "normalized_mean": mean,
                "normalized_std": sd,
                "normalized_ci95": half,
                "final_return_mean": sum(r.final_return for r in rs) / len(rs),
                "params": round(sum(r.params for r in rs) / len(rs)),
                "steps_min": min(r.steps for r in rs),
                "total_steps": max(r.total_steps for r in rs),
                "minutes_mean": sum(r.minutes for r in rs) / len(rs),
            }
        )
    return rows


def markdown_table(summary: list[dict], bench: Benchmark = MEMORY_SUITE) -> str:
    """Rows: the benchmark's envs; columns: cores; cells: normalised final return ``mean ± sd (seeds)``
    (sd: the sample standard deviation over seeds)."""
    cores = sorted({r["core"] for r in summary}, key=core_rank)
    cell = {(r["env"], r["core"]): r for r in summary}
    envs = [e for e in bench.envs if any((e, c) in cell for c in cores)]
    lines = ["| task (level) | " + " | ".join(cores) + " |", "|---|" + "---|" * len(cores)]
    for env in envs:
        task, level = bench.describe(env)
        parts = []
        for c in cores:
            r = cell.get((env, c))
            if r is None:
                parts.append("")
                continue
            sd = "" if math.isnan(r["normalized_std"]) else f" ± {r['normalized_std']:.2f}"
            partial = "" if r["steps_min"] >= r["total_steps"] else f", {r['steps_min'] / 1e3:.0f}k steps"
            parts.append(f"{r['normalized_mean']:.2f}{sd} ({r['seeds']}{partial})")
        lines.append(f"| {task} ({level}) | " + " | ".join(parts) + " |")
    params = {c: [r["params"] for r in summary if r["core"] == c] for c in cores}
    minutes = {
        c: [r["minutes_mean"] for r in summary if r["core"] == c and math.isfinite(r["minutes_mean"])] for c in cores
    }
    lines.append(
        "| parameters (range over tasks) | "
        + " | ".join(f"{min(params[c]) / 1e3:.0f}k-{max(params[c]) / 1e3:.0f}k" for c in cores)
        + " |"
    )
    lines.append(
        "| minutes per run (mean) | "
        + " | ".join(f"{sum(minutes[c]) / len(minutes[c]):.1f}" if minutes[c] else "" for c in cores)
        + " |"
    )
    return "\n".join(lines)


def scores_by_core(runs: list[Run], level: str = "easy") -> dict[str, list[list[float]]]:
    """``{core: [normalised final returns of its runs on one task] per task}`` over the tasks of
    ``level`` (``all``: every level) that the core has runs on, in the benchmark's order; cores in table order."""
    if runs:
        check_choice("aggregate level", level, runs[0].bench.aggregate_levels)
    by_core: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        if level == "all" or r.level == level:
            by_core.setdefault(r.core, {}).setdefault(r.env, []).append(r.normalized)
    envs = runs[0].bench.envs if runs else ()
    return {core: [by_core[core][e] for e in envs if e in by_core[core]] for core in sorted(by_core, key=core_rank)}


def aggregate(runs: list[Run], level: str = "easy", reps: int = stats.INTERVAL_REPS, seed: int = 0) -> list[dict]:
    """One row per core: the interquartile mean of the normalised final returns of all its runs on
    the tasks of ``level``, pooled over runs and tasks, with the 95% percentile interval over
    ``reps`` bootstrap resamples stratified by task (Agarwal et al. 2021, :mod:`rfwp_rl.stats`).
    With one run per task the interval is the point (no spread to resample)."""
    rows = []
    for core, per_task in scores_by_core(runs, level).items():
        ci = stats.stratified_bootstrap(per_task, stats.iqm, reps=reps, seed=seed)
        counts = [len(t) for t in per_task]
        rows.append(
            {
                "level": level,
                "core": core,
                "iqm": ci.point,
                "ci95_low": ci.low,
                "ci95_high": ci.high,
                "runs": sum(counts),
                "tasks": len(per_task),
                "seeds_min": min(counts),
                "seeds_max": max(counts),
            }
        )
    return rows


def versus_best(rows: list[dict]) -> dict[str, str]:
    """Per core: ``best`` (the highest IQM), ``no difference`` (its interval overlaps the best's:
    the data do not separate them) or ``below`` (its interval lies wholly below the best's); with one
    seed per task (the core's or the best's) there is no interval to compare: ``one seed``."""
    if not rows:
        return {}
    top = max(rows, key=lambda r: r["iqm"])

    def verdict(r: dict) -> str:
        if r is top:
            return "best"
        if r.get("seeds_max", 2) < 2 or top.get("seeds_max", 2) < 2:
            return "one seed"
        return "no difference" if r["ci95_high"] >= top["ci95_low"] else "below"

    return {r["core"]: verdict(r) for r in rows}


def iqm_cell(row: dict) -> str:
    """An aggregate row's ``IQM [low, high]``, as every table here writes it."""
    return f"{row['iqm']:.2f} [{row['ci95_low']:.2f}, {row['ci95_high']:.2f}]"


def aggregate_table(rows: list[dict]) -> str:
    """The aggregate rows as a markdown table: ``IQM [low, high]``, runs, tasks (of how many), and
    how each core compares with the best (:func:`versus_best`)."""
    if not rows:
        return "(no runs at this level)"
    most_tasks = max(r["tasks"] for r in rows)
    verdict = versus_best(rows)
    lines = [
        f"| core | IQM of normalised return ({rows[0]['level']}) [95% CI] | runs | tasks | seeds per task | "
        "vs the best |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        tasks = f"{r['tasks']}" if r["tasks"] == most_tasks else f"{r['tasks']} of {most_tasks}"
        seeds = f"{r['seeds_min']}" if r["seeds_min"] == r["seeds_max"] else f"{r['seeds_min']}-{r['seeds_max']}"
        lines.append(f"| {r['core']} | {iqm_cell(r)} | {r['runs']} | {tasks} | {seeds} | {verdict[r['core']]} |")
    return "\n".join(lines)


def level_aggregates(runs: list[Run], reps: int = stats.INTERVAL_REPS) -> list[dict]:
    """:func:`aggregate` at each level of the runs' benchmark that has runs, in its order (the rows of
    every level one after the other); none when the runs are all of one level."""
    if not runs:
        return []
    levels = [lv for lv in runs[0].bench.levels if any(r.level == lv for r in runs)]
    return [row for lv in levels for row in aggregate(runs, lv, reps=reps)] if len(levels) > 1 else []


def levels_table(rows: list[dict]) -> str:
    """The per-level aggregate rows (:func:`level_aggregates`) as one markdown table, a column per level
    (``IQM [low, high]``, its number of tasks in the heading); bold where the core is the level's best or
    its interval overlaps the best's (:func:`versus_best`)."""
    levels = list(dict.fromkeys(r["level"] for r in rows))
    cells: dict[str, dict[str, str]] = {}
    tasks = {}
    for level in levels:
        at = [r for r in rows if r["level"] == level]
        tasks[level] = max(r["tasks"] for r in at)
        verdict = versus_best(at)
        for r in at:
            cell = iqm_cell(r)
            bold = verdict[r["core"]] in ("best", "no difference")
            cells.setdefault(r["core"], {})[level] = f"**{cell}**" if bold else cell
    heads = [f"{level} ({tasks[level]} task{'s' if tasks[level] > 1 else ''})" for level in levels]
    lines = ["| core | " + " | ".join(heads) + " |", "|---" * (len(levels) + 1) + "|"]
    for core in sorted(cells, key=core_rank):
        lines.append(f"| {core} | " + " | ".join(cells[core].get(level, "-") for level in levels) + " |")
    return "\n".join(lines)


def plot_profiles(
    runs: list[Run], path: Path, level: str = "easy", reps: int = stats.PROFILE_REPS, seed: int = 0
) -> None:
    """Performance profiles: per core, the fraction of its runs (all tasks of ``level``) whose
    normalised return exceeds tau, with the 95% stratified-bootstrap band (Agarwal et al. Fig. 5)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    taus = np.asarray(PROFILE_TAUS)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (core, per_task) in enumerate(scores_by_core(runs, level).items()):
        ci = stats.stratified_bootstrap(per_task, lambda x: stats.score_profile(x, taus), reps=reps, seed=seed)
        (line,) = ax.plot(
            taus,
            ci.point,
            label=f"{core} ({sum(len(t) for t in per_task)})",
            drawstyle="steps-post",
            ls="-" if i < 10 else "--",
        )  # the default cycle has 10 colours
        ax.fill_between(taus, ci.low, ci.high, color=line.get_color(), alpha=0.15, step="post")
    ax.set_xlabel(r"normalised return $\tau$")
    ax.set_ylabel(r"fraction of runs with return > $\tau$")
    tasks = "every task" if level == "all" else f"{level} level"
    ax.set_title(f"performance profile, {tasks} (95% stratified-bootstrap bands)", fontsize=10)
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="core (runs)", title_fontsize=7)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=90)


def plot_curves(runs: list[Run], path: Path, points: int = 100) -> None:
    """Normalised return over env steps per env (one panel each): mean over seeds, 95% band; records kept
    without their curve are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs = [r for r in runs if r.curve]
    if not runs:
        return
    envs = [e for e in runs[0].bench.envs if any(r.env == e for r in runs)]
    cols = min(3, len(envs))
    rows = math.ceil(len(envs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    for ax, env in zip(axes.flat, envs):
        by_core: dict[str, list[Run]] = {}
        for r in runs:
            if r.env == env:
                by_core.setdefault(r.core, []).append(r)
        for core in sorted(by_core, key=core_rank):
            rs = by_core[core]
            end = min(r.curve[-1][0] for r in rs)
            grid = np.linspace(0, end, points)
            # nothing before a run's first logged point (no extrapolation back to step 0)
            ys = np.array([np.interp(grid, *zip(*r.normalized_curve), left=np.nan) for r in rs])
            mean = ys.mean(0)
            (line,) = ax.plot(grid / 1e6, mean, label=f"{core} ({len(rs)})")
            if len(rs) > 1:
                half = T975.get(len(rs) - 1, 1.96) * ys.std(0, ddof=1) / math.sqrt(len(rs))
                ax.fill_between(grid / 1e6, mean - half, mean + half, color=line.get_color(), alpha=0.2)
        task, level = runs[0].bench.describe(env)
        ax.set_title(f"{task} ({level})", fontsize=10)
        ax.axhline(0, color="grey", lw=0.5)
        ax.axhline(1, color="grey", lw=0.5, ls="--")
        ax.set_xlabel("env steps (M)")
        ax.set_ylabel("normalised return")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(envs) :]:
        ax.axis("off")
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=90)


def update_readme(
    path: Path, table: str, begin: str = TABLE_BEGIN, end: str = TABLE_END, title: str = MEMORY_SUITE.title
) -> None:
    """Put ``table`` between the markers ``begin`` and ``end`` of ``path`` (appended if they are
    missing; the file is created with just the table if missing)."""
    block = f"{begin}\n{table}\n{end}"
    if path.is_file():
        text = path.read_text()
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            text = head + block + rest.split(end, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        text = f"# {title}\n\n{block}\n"
    atomic_write_text(path, text)


def run_row(r: Run) -> dict:
    """The run's row of ``runs.csv``; the two held columns are empty for a run that never reached
    ``HELD_LEVEL``."""
    (peak_step, peak_return), held = r.peak, r.held()
    return {
        "env": r.env,
        "task": r.task,
        "level": r.level,
        "core": r.core,
        "seed": r.seed,
        "params": r.params,
        "steps": r.steps,
        "total_steps": r.total_steps,
        "minutes": r.minutes,
        "final_return": r.final_return,
        "normalized": r.normalized,
        "peak_return": peak_return,
        "peak_step": peak_step,
        "peak_normalized": r.bench.normalize(r.env, peak_return),
        "reached_0.9_step": held[0] if held else "",
        "lowest_after_0.9": held[1] if held else "",
    }


def write_results(
    runs_root: Path,
    out: Path,
    level: str | None = None,
    reps: int = stats.INTERVAL_REPS,
    bench: Benchmark = MEMORY_SUITE,
) -> tuple[list[dict], list[dict]]:
    """Collect the runs of ``bench`` under ``runs_root`` and write the outputs listed in the module docstring
    (aggregates over the tasks of ``level``, default the benchmark's). Returns ``(summary rows, aggregate
    rows)``."""
    level = bench.aggregate_level if level is None else level
    check_choice("aggregate level", level, bench.aggregate_levels)
    runs = collect(runs_root, bench, out / RECORDS)
    if not runs:
        raise UserError(
            f"no {bench.name} runs under {str(runs_root)!r} (runs of its envs with episodes logged, e.g. "
            f"{bench.envs[0]})"
        )
    write_records(runs, runs_root, out / RECORDS)
    return write_tables(runs, out, level, reps)


def write_tables(runs: list[Run], out: Path, level: str = "all", reps: int = stats.INTERVAL_REPS) -> tuple[list, list]:
    """Write the outputs listed in the module docstring for ``runs`` (all of one :class:`Benchmark`; aggregates
    over the tasks of ``level``). Returns ``(summary rows, aggregate rows)``."""
    bench = runs[0].bench
    out.mkdir(parents=True, exist_ok=True)
    run_rows = [run_row(r) for r in runs]
    summary = summarize(runs)
    agg = aggregate(runs, level, reps=reps)
    by_level = level_aggregates(runs, reps)
    atomic_write_csv(out / "runs.csv", run_rows, float_format=".4f")
    atomic_write_csv(out / "summary.csv", summary, float_format=".4f")
    atomic_write_csv(out / "aggregate.csv", agg, float_format=".4f")
    if by_level:
        atomic_write_csv(out / "aggregate_levels.csv", by_level, float_format=".4f")
    plot_curves(runs, out / "curves.png")
    if agg:
        plot_profiles(runs, out / "performance_profile.png", level)
    update_readme(out / "README.md", markdown_table(summary, bench), title=bench.title)
    update_readme(out / "README.md", aggregate_table(agg), AGGREGATE_BEGIN, AGGREGATE_END, bench.title)
    if by_level:
        update_readme(out / "README.md", levels_table(by_level), LEVELS_BEGIN, LEVELS_END, bench.title)
    return summary, agg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bench",
        choices=tuple(BENCHES),
        default="suite",
        help="whose runs: the memory suite's, or the extended comparison's (suite easy and medium, popgym easy "
        "memory tasks, MiniGrid-MemoryS7) (default %(default)s)",
    )
    runs = _per_bench(lambda bench, runs, out: runs)
    parser.add_argument("--runs", help=f"folder of the run directories (default: {runs})")
    outs = _per_bench(lambda bench, runs, out: out)
    parser.add_argument("--out", help=f"where the CSVs, curves and README tables go (default: {outs})")
    levels = _per_bench(lambda bench, runs, out: "/".join(bench.aggregate_levels))
    parser.add_argument(
        "--aggregate-level",
        help=f"the level whose tasks the IQM and the performance profile pool ({levels}; all: every task) "
        f"(default: {_per_bench(lambda bench, runs, out: bench.aggregate_level)})",
    )
    add_bootstrap_argument(parser)
    add_record_argument(parser)


def _per_bench(text: Callable[[Benchmark, str, str], str]) -> str:
    """``"<text of suite> for suite, <text of comparison> for comparison"``, ``text`` of each entry of
    :data:`BENCHES`."""
    return ", ".join(f"{text(*entry)} for {name}" for name, entry in BENCHES.items())


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-reps``, for every command that writes these tables."""
    parser.add_argument(
        "--bootstrap-reps",
        type=int,
        default=stats.INTERVAL_REPS,
        help="bootstrap resamples of the IQM interval (default %(default)s, as rliable)",
    )


def add_record_argument(parser: argparse.ArgumentParser) -> None:
    """``--record``, for every command that keeps run records."""
    parser.add_argument(
        "--record",
        metavar="RUN_DIR",
        help="write only the record of this finished run (a directory under --runs) into --out's records/, no "
        "tables (the sweep launchers call it after each run)",
    )


def check_bootstrap_reps(reps: int) -> int:
    if reps < 1:
        raise UserError(f"--bootstrap-reps {reps} is invalid; allowed: an integer >= 1")
    return reps


def run(args: argparse.Namespace) -> int:
    check_bootstrap_reps(args.bootstrap_reps)
    bench, default_runs, default_out = BENCHES[check_choice("--bench", args.bench, BENCHES)]
    runs, out = Path(args.runs or default_runs), Path(args.out or default_out)
    if args.record:
        print(f"wrote {write_record(Path(args.record), runs, out / RECORDS, bench)}")
        return 0
    summary, agg = write_results(runs, out, args.aggregate_level, args.bootstrap_reps, bench)
    print(markdown_table(summary, bench))
    print()
    print(aggregate_table(agg))
    print(
        f"wrote {out}/runs.csv, summary.csv, aggregate.csv (aggregate_levels.csv where the runs span levels), "
        "curves.png, performance_profile.png, the "
        f"tables in README.md and the finished runs' {RECORDS}/"
    )
    return 0


if __name__ == "__main__":
    from rfwp_rl.cli import main

    sys.exit(main(["memory-results", *sys.argv[1:]]))
