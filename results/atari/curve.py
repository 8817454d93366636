"""Atari learning curve of one run: ``step,wall_seconds,return_100`` CSV and a plot.

    python results/atari/curve.py results/atari/pong_run --csv results/atari/pong.csv --png results/atari/pong.png

Reads the run's TensorBoard events (``tb/``, every session of a resumed run): the mean return of the
last 100 full-game episodes (``episode/return_mean100``) and the training wall time
(``perf/train_minutes``, carried across resumes in the checkpoint), matched by step.
"""

from __future__ import annotations

import argparse
import bisect
from pathlib import Path

from rfwp_rl.checkpoint import atomic_write_text
from rfwp_rl.runlog import read_all_scalars


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    scalars = read_all_scalars(run_dir)
    returns = scalars.get("episode/return_mean100", [])
    minutes = scalars.get("perf/train_minutes", [])
    steps = [s for s, _ in minutes]
    rows = []
    for step, ret in returns:
        i = min(bisect.bisect_left(steps, step), len(steps) - 1) if steps else -1
        rows.append((step, 60.0 * minutes[i][1] if i >= 0 else float("nan"), ret))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    rows = curve(args.run_dir)
    atomic_write_text(
        args.csv, "step,wall_seconds,return_100\n" + "".join(f"{s},{w:.0f},{r:.2f}\n" for s, w, r in rows)
    )
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
