"""Collect the ``results.json`` of sequence runs into a CSV table and draw figures.

    python -m rfwp_rl.seq.results RUNS_ROOT OUT.csv [--plot OUT.png --x KEY --y KEY --group KEY]

Every ``results.json`` under ``RUNS_ROOT`` becomes one row with its settings (task, core,
task options), the best step, the validation and test scores (prefixed ``valid_`` /
``test_``) and the wall-clock seconds. With ``--plot``, the test (or validation) metric
``--y`` is drawn against the setting ``--x`` with one line per ``--group`` value (e.g. the
associative-retrieval capacity curve: x = num_keys, y = test_seq_acc, group = core). With
``--curves OUT.png``, the training curves of every run (TensorBoard scalars ``--curve-tags``,
one panel each, one line per run) are drawn, and written as ``OUT.csv`` (run, tag, step, value).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rfwp_rl import flags
from rfwp_rl.checkpoint import atomic_write_csv, atomic_write_figure
from rfwp_rl.errors import UserError
from rfwp_rl.runlog import read_scalars
from rfwp_rl.seq.config import upgrade_settings

SETTING_KEYS = (
    "task",
    "core",
    "num_keys",
    "setting",
    "num_vars",
    "num_statements",
    "depth",
    "tokens",
    "context",
    "seg_len",
    "emb_size",
    "dropout",
    "data_sizes",
    "params",
)
CORE_KEYS = ("hidden_size", "num_layers", "num_heads", "ff_size", "feature_map")


def flatten(res: dict, run_dir: str) -> dict:
    """One results.json as a flat row."""
    s, cc = upgrade_settings(res["settings"]), res["settings"].get("core_config", {})
    row = {k: s.get(k, "") for k in SETTING_KEYS}
    if isinstance(row["data_sizes"], list):
        row["data_sizes"] = "/".join(map(str, row["data_sizes"]))
    row.update({k: cc.get(k, "") for k in CORE_KEYS})
    row.update(upgrade_settings(res.get("training", {})))
    row["best_step"] = res.get("best_step")
    row["steps_done"] = res.get("steps_done", "")
    row["early_stop"] = res.get("early_stop") or ""
    for split in ("valid", "test"):
        for k, v in res.get(split, {}).items():
            row[f"{split}_{k}"] = round(v, 6) if isinstance(v, float) else v
    row["train_seconds"] = res.get("train_seconds")
    row["eval_seconds"] = res.get("eval_seconds")
    row["run_dir"] = run_dir
    return row


def collect(root: str | Path) -> list[dict]:
    root = Path(root)
    files = sorted(root.rglob("results.json"))
    if not files:
        raise UserError(f"no results.json under {root}")
    return [flatten(json.loads(f.read_text()), str(f.parent)) for f in files]


def plot(
    rows: list[dict],
    path: str | Path,
    x: str,
    y: str,
    group: str,
    title: str = "",
    xline: float | None = None,
    xline_label: str | None = None,
    logy: bool = False,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for g in sorted({r[group] for r in rows}):
        pts = sorted((float(r[x]), float(r[y])) for r in rows if r[group] == g)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=str(g))
    if xline is not None:
        ax.axvline(xline, color="grey", linestyle=":", label=xline_label or f"{x} = {xline:g}")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=120)


def curves(rows: list[dict], root: str | Path, path: str | Path, tags: list[str]) -> None:
    """The scalars ``tags`` of every run over steps: ``path`` (png, one panel per tag, one
    line per run, named by its folder under ``root``) and the same numbers as a csv beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {str(Path(r["run_dir"]).relative_to(root)): r["run_dir"] for r in rows}
    data = {(name, tag): read_scalars(run_dir, tag) for name, run_dir in runs.items() for tag in tags}
    if not any(data.values()):
        raise UserError(f"none of the tags {tags} was logged by the runs under {root}")
    points = [
        {"run": name, "tag": tag, "step": step, "value": value}
        for (name, tag), curve in data.items()
        for step, value in curve
    ]
    atomic_write_csv(Path(path).with_suffix(".csv"), points)
    fig, axes = plt.subplots(1, len(tags), figsize=(5 * len(tags), 3.6), squeeze=False)
    for ax, tag in zip(axes[0], tags):
        for name in runs:
            points = data[(name, tag)]
            ax.plot([p[0] for p in points], [p[1] for p in points], label=name)
        ax.set_xlabel("step")
        ax.set_ylabel(tag)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rfwp_rl.seq.results", description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("csv")
    p.add_argument("--plot")
    p.add_argument("--x", default="num_keys")
    p.add_argument("--y", default="test_seq_acc")
    p.add_argument("--group", default="core")
    p.add_argument("--title", default="")
    p.add_argument("--xline", type=float, help="draw a vertical line at this x")
    p.add_argument("--xline-label")
    p.add_argument("--logy", action="store_true")
    p.add_argument("--curves", help="png of the runs' training curves (and a csv beside it)")
    flags.add_list_argument(p, "--curve-tags", ["valid/seq_acc", "valid/loss"], "TensorBoard scalars for --curves")
    args = p.parse_args(argv)
    try:
        rows = collect(args.root)
        atomic_write_csv(args.csv, rows, float_format="")
        if args.plot:
            plot(rows, args.plot, args.x, args.y, args.group, args.title, args.xline, args.xline_label, args.logy)
        if args.curves:
            curves(rows, args.root, args.curves, args.curve_tags)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(rows)} runs -> {args.csv}" + "".join(f", {f}" for f in (args.plot, args.curves) if f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
