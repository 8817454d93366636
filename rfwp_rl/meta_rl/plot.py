"""Curves of meta-RL runs: ``python -m rfwp_rl.meta_rl.plot [RUN_DIR ...] [--out DIR]``.

Reads ``metrics.csv`` of each run directory (default: every run under ``runs/meta_rl``) and
writes to ``--out`` (default ``results/meta_rl``):

- ``curves.csv``: all evaluation rows of all runs (long format, one ``run`` column);
- ``summary.csv``: per run the episodes and wall-clock so far, the last test reward (mean of
  the last 5 evaluations), the first episode and training minute at which that running mean
  reached 90 / 100, and the test running mean at the last episode every run has reached
  (``common_episode``: the comparison at equal training);
- ``curves.png``: training (left) and test (middle) total reward over episodes, like FWM paper
  Fig. 5, with the published reference points of that experiment; test reward over training
  wall-clock minutes (right).

The test reward plotted is the sampled one (the paper's) where a run measured it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

from rfwp_rl.checkpoint import atomic_write_csv, atomic_write_figure

# Published logs of the FWM paper's meta-RL experiment (Fig. 5): FWM test total reward near
# 45 at the start, 90 after ~29k episodes, 100 after ~42k, ending near 107 (we do not know the
# exact final episode; drawn at 60k). LSTMs of 512 to 4096 units end between 80 and 87 on test.
PAPER_FWM_TEST = [(0, 45.0), (29_000, 90.0), (42_000, 100.0), (60_000, 107.0)]
PAPER_LSTM_TEST_END = (80.0, 87.0)
SMOOTH = 5  # evaluations in the running mean


def _float(v: str) -> float:
    return float(v) if v not in ("", None) else math.nan


def read_run(run_dir: Path) -> tuple[str, list[dict]]:
    """``(label, rows)`` of one run directory; rows have float values."""
    label = run_dir.name
    cfg = run_dir / "config.json"
    if cfg.is_file():
        try:
            c = json.loads(cfg.read_text())
            label = f"{c.get('label', c.get('core', label))} (s{c.get('seed', '?')})"
        except (ValueError, OSError):
            pass
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = [{k: _float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    return label, rows


def test_curve(rows: list[dict]) -> list[float]:
    """The test reward per evaluation: sampled where measured, else greedy."""
    return [
        r["test_reward_sampled"]
        if not math.isnan(r.get("test_reward_sampled", math.nan))
        else r.get("test_reward_greedy", math.nan)
        for r in rows
    ]


def running_mean(xs: list[float], n: int = SMOOTH) -> list[float]:
    out = []
    for i in range(len(xs)):
        window = [x for x in xs[max(0, i - n + 1) : i + 1] if not math.isnan(x)]
        out.append(sum(window) / len(window) if window else math.nan)
    return out


def first_reaching(episodes: list[float], values: list[float], level: float) -> float:
    for e, v in zip(episodes, values):
        if not math.isnan(v) and v >= level:
            return e
    return math.nan


def value_at(episodes: list[float], values: list[float], episode: float) -> float:
    """The last value at or before ``episode``."""
    out = math.nan
    for e, v in zip(episodes, values):
        if e > episode:
            break
        out = v
    return out


def summarise(label: str, rows: list[dict], common_episode: float = math.nan) -> dict:
    ep = [r["episode"] for r in rows]
    minutes = [r["wall_minutes"] for r in rows]
    test = running_mean(test_curve(rows))
    train = running_mean([r.get("train_reward", math.nan) for r in rows])
    to_90, to_100 = first_reaching(ep, test, 90.0), first_reaching(ep, test, 100.0)

    def minute_of(episode: float) -> float:
        return round(value_at(ep, minutes, episode), 1) if not math.isnan(episode) else math.nan

    return {
        "run": label,
        "episodes": int(ep[-1]) if ep else 0,
        "wall_minutes": round(rows[-1]["wall_minutes"], 1) if rows else math.nan,
        "test_reward_last": round(test[-1], 2) if test else math.nan,
        "train_reward_last": round(train[-1], 2) if train else math.nan,
        "best_test_running_mean": round(max((t for t in test if not math.isnan(t)), default=math.nan), 2),
        "episodes_to_test_90": to_90,
        "episodes_to_test_100": to_100,
        "minutes_to_test_90": minute_of(to_90),
        "minutes_to_test_100": minute_of(to_100),
        "common_episode": common_episode,
        "test_at_common_episode": round(value_at(ep, test, common_episode), 2),
    }


def plot(runs: list[tuple[str, list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5), sharey=True)
    axes[1].sharex(axes[0])
    for i, (label, rows) in enumerate(runs):
        color = f"C{i}"
        ep = [r["episode"] / 1000 for r in rows]
        minutes = [r["wall_minutes"] for r in rows]
        train = [r.get("train_reward", math.nan) for r in rows]
        test = test_curve(rows)
        for ax, xs, ys in ((axes[0], ep, train), (axes[1], ep, test), (axes[2], minutes, test)):
            ax.plot(xs, ys, color=color, alpha=0.25, lw=0.8)
            ax.plot(xs, running_mean(ys), color=color, lw=1.8, label=label)
    px, py = zip(*PAPER_FWM_TEST)
    axes[1].plot([x / 1000 for x in px], py, "k--", marker="o", lw=1, label="paper FWM (published log)")
    axes[1].axhspan(*PAPER_LSTM_TEST_END, color="grey", alpha=0.15, label="paper LSTMs 512-4096, end")
    axes[0].set_title("training graphs (600)")
    axes[1].set_title("test graphs (600 unseen, sampled actions)")
    axes[2].set_title("test graphs, over training wall-clock")
    for ax in axes[:2]:
        ax.set_xlabel("episodes (thousands; 1 episode = 1 update of the whole batch)")
    axes[2].set_xlabel("training minutes on the shared 2-core CPU (evaluations included)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"total reward per 30-step episode (running mean of {SMOOTH} evals)")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle("A2C meta-RL on random POMDP graphs (FWM paper Sec. 4.2)")
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=110)


def _csv_rows(rows: list[dict]) -> list[dict]:
    """Rows for :func:`atomic_write_csv`: a NaN empty, the episode a whole number."""
    return [
        {k: None if isinstance(v, float) and math.isnan(v) else int(v) if k == "episode" else v for k, v in r.items()}
        for r in rows
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rfwp_rl.meta_rl.plot", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="run directories (default: runs/meta_rl/*)")
    parser.add_argument("--out", default="results/meta_rl", help="output directory")
    args = parser.parse_args(argv)
    dirs = [Path(r) for r in args.runs] or sorted(p.parent for p in Path("runs/meta_rl").glob("*/metrics.csv"))
    dirs = [d for d in dirs if (d / "metrics.csv").is_file()]
    if not dirs:
        print("error: no run directory with a metrics.csv (train first: launch/meta_rl.sh)")
        return 2
    runs = [read_run(d) for d in dirs]
    out = Path(args.out)
    columns = [
        "run",
        "episode",
        "wall_minutes",
        "train_reward",
        "test_reward_sampled",
        "test_reward_greedy",
        "test_goals",
        "train_invalid",
        "entropy",
    ]
    long_rows = [{"run": label, **r} for label, rows in runs for r in rows]
    atomic_write_csv(out / "curves.csv", _csv_rows(long_rows), columns, float_format="")
    common = min((rows[-1]["episode"] for _, rows in runs if rows), default=math.nan)
    summary = [summarise(label, rows, common) for label, rows in runs]
    atomic_write_csv(out / "summary.csv", _csv_rows(summary), float_format="")
    plot(runs, out / "curves.png")
    print("| " + " | ".join(summary[0]) + " |")
    print("|" + "---|" * len(summary[0]))
    for s in summary:
        print("| " + " | ".join("-" if isinstance(v, float) and math.isnan(v) else str(v) for v in s.values()) + " |")
    print(f"wrote {out / 'curves.csv'}, {out / 'summary.csv'}, {out / 'curves.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
