"""Atari learning curve of one run: ``step,wall_seconds,return_100`` CSV and a plot.

    python results/atari/curve.py results/atari/pong_run --csv results/atari/pong.csv --png results/atari/pong.png

Reads the run's TensorBoard events (``tb/``, every session of a resumed run): every full-game episode's
return (``episode/return``), and the training wall time (``perf/train_minutes``, carried across resumes in
the checkpoint). One row per progress report: the mean return of the last 100 episodes that ended by
its step, over all sessions (the run's own ``episode/return_mean100`` starts its window again on a resume).
"""

from __future__ import annotations

import argparse
import bisect
from pathlib import Path

from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.runlog import scalar_events

MINUTES = "perf/train_minutes"


def episode_returns(run_dir: Path, events: dict | None = None) -> list[tuple[int, float]]:
    """``[(step, return)]`` of every episode, in the order they ended (several may share a step)."""
    points = (events if events is not None else scalar_events(run_dir)).get("episode/return", [])
    return [(step, value) for step, _, value in sorted(points, key=lambda p: (p[0], p[1]))]


def curve(run_dir: Path, window: int = 100) -> list[tuple[int, float, float]]:
    """``(step, wall seconds, mean return of the last ``window`` episodes)`` at each progress report that
    has ``window`` episodes behind it."""
    events = scalar_events(run_dir)  # the event files read once, for both tags
    episodes = episode_returns(run_dir, events)
    ends = [s for s, _ in episodes]
    rows = []
    minutes = {step: value for step, _, value in events.get(MINUTES, [])}  # a step logged twice: the later
    for step, value in sorted(minutes.items()):
        n = bisect.bisect_right(ends, step)
        if n >= window:
            last = [r for _, r in episodes[n - window : n]]
            rows.append((step, 60.0 * value, sum(last) / window))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    rows = curve(args.run_dir)
    table = [{"step": s, "wall_seconds": f"{w:.0f}", "return_100": f"{r:.2f}"} for s, w, r in rows]
    atomic_write_csv(args.csv, table)
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([s / 1e6 for s, _, _ in rows], [r for _, _, r in rows])
        ax.axhline(18, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("env steps (millions)")
        ax.set_ylabel("mean return, last 100 episodes")
        ax.set_title(args.run_dir.name)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
    print(f"wrote {args.csv} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
