"""The MinAtar comparison: IMPALA runs on the five MinAtar games -> ``results/minatar/``.

``rfwp-rl minatar-results --runs runs/minatar --out results/minatar`` (the runs of ``launch/minatar.sh``) reads
every run directory under ``--runs`` on a ``MinAtar/<Game>-v1`` id and writes what ``rfwp-rl memory-results``
writes (:mod:`rfwp_rl.memory.results`: ``runs.csv``, ``summary.csv``, ``aggregate.csv`` with the IQM per core
and its 95% stratified-bootstrap interval over all five games, ``performance_profile.png``, ``curves.png``, the
README tables, the finished runs' ``records/``, from which the tables are remade when a run directory is
gone), and ``normalization.csv``.

Normalised return of a game: ``(R - random) / (best - random)``, ``random`` the mean return of a uniformly
random policy (``--random-episodes`` episodes, seeded), ``best`` the highest mean final return over seeds of
any core in the comparison on that game: the best core of each game scores 1 by construction, and the scores
say how close each core comes to it, not how close to the game's optimum.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.envs import make_env
from rfwp_rl.errors import UserError
from rfwp_rl.memory.results import (
    RECORDS,
    Benchmark,
    Run,
    add_bootstrap_argument,
    add_record_argument,
    aggregate_table,
    check_bootstrap_reps,
    collect,
    markdown_table,
    with_benchmark,
    write_record,
    write_records,
    write_tables,
)

GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
ENVS = tuple(f"MinAtar/{game}-v1" for game in GAMES)


def _describe(env: str) -> tuple[str, str]:
    return env.removeprefix("MinAtar/").removesuffix("-v1"), "v1"


RAW = Benchmark(ENVS, _describe, lambda env, value: value, "MinAtar: the comparison of cores", name="MinAtar")


def random_returns(envs: tuple[str, ...] = ENVS, episodes: int = 100, seed: int = 0) -> dict[str, float]:
    """Mean return of a uniformly random policy per env, over ``episodes`` full episodes."""
    means = {}
    for env_id in envs:
        env = make_env(env_id, seed=seed)
        env.action_space.seed(seed)
        total = 0.0
        for _ in range(episodes):
            env.reset()
            done = False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                total += float(reward)
                done = terminated or truncated
        env.close()
        means[env_id] = total / episodes
    return means


def best_returns(runs: list[Run]) -> dict[str, float]:
    """Per env, the highest mean final return over seeds of any core."""
    by: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        by.setdefault((r.env, r.core), []).append(r.final_return)
    best: dict[str, float] = {}
    for (env, _), values in by.items():
        best[env] = max(best.get(env, -np.inf), float(np.mean(values)))
    return best


def normalized_benchmark(random: dict[str, float], best: dict[str, float]) -> Benchmark:
    """:data:`RAW` with returns normalised between ``random`` (0) and ``best`` (1) per env."""

    def normalize(env: str, value: float) -> float:
        span = best[env] - random[env]
        return (value - random[env]) / span if span > 0 else float("nan")

    return dataclasses.replace(RAW, normalize=normalize)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", default="runs/minatar", help="folder of the runs (default %(default)s)")
    parser.add_argument(
        "--out", default="results/minatar", help="where the CSVs, plots and README tables go (default %(default)s)"
    )
    parser.add_argument(
        "--random-episodes",
        type=int,
        default=100,
        help="episodes of the random policy per game, for the normalisation (default %(default)s)",
    )
    add_bootstrap_argument(parser)
    add_record_argument(parser)


def run(args: argparse.Namespace) -> int:
    if args.random_episodes < 1:
        raise UserError(f"--random-episodes {args.random_episodes} is invalid; allowed: an integer >= 1")
    check_bootstrap_reps(args.bootstrap_reps)
    runs_root, out = Path(args.runs), Path(args.out)
    if args.record:
        print(f"wrote {write_record(Path(args.record), runs_root, out / RECORDS, RAW)}")
        return 0
    raw = collect(runs_root, RAW, out / RECORDS)
    if not raw:
        raise UserError(f"no MinAtar runs under {args.runs!r} (runs of MinAtar/<Game>-v1 with episodes logged)")
    envs = tuple(e for e in ENVS if any(r.env == e for r in raw))
    random, best = random_returns(envs, args.random_episodes), best_returns(raw)
    runs = with_benchmark(raw, normalized_benchmark(random, best))
    write_records(runs, runs_root, out / RECORDS)
    summary, agg = write_tables(runs, out, "all", args.bootstrap_reps)
    normalization = [{"env": e, "random_return": random[e], "best_return": best[e]} for e in envs]
    atomic_write_csv(out / "normalization.csv", normalization, float_format=".4f")
    print(markdown_table(summary, runs[0].bench))
    print()
    print(aggregate_table(agg))
    print(
        f"wrote {out}/runs.csv, summary.csv, aggregate.csv, normalization.csv, curves.png, performance_profile.png "
        f"and the finished runs' {RECORDS}/"
    )
    return 0


if __name__ == "__main__":
    from rfwp_rl.cli import main

    sys.exit(main(["minatar-results", *sys.argv[1:]]))
