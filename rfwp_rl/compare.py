"""``rfwp-rl compare``: per-game score tables and relative-improvement charts.

Inputs are the RFWP paper's Atari tables (``--paper table9``; CSV in ``results/paper/``)
and/or evaluation results of this package (``--runs`` eval JSON/CSV files, run directories
or directories of runs, as written by ``rfwp-rl eval``). Output:

- a per-game table, rows = games, columns = models (mean ± std), printed and written as CSV
  (atomically); with ``--model M --baseline B`` also the relative improvement of M over B
  and a verdict per game (better / similar / worse, ``--similar`` band);
- with ``--model`` and ``--baseline``, a bar chart of the relative improvement per game,
  like the paper's Figures 1-4 (PNG, matplotlib Agg).

Relative improvement = 100 (score_M − score_B) / |score_B| (RFWP paper Figs. 1-4; the paper
does not print the formula: see :func:`rfwp_rl.scores.relative_improvement` for the evidence,
and ``--metric gap`` for the bounded alternative 100 (M − B) / max(|M|, |B|)).

Examples::

    rfwp-rl compare --paper table9 --model RDN --baseline LT            # paper Fig. 1
    rfwp-rl compare --paper table10 --model rdn --baseline lstm         # paper Fig. 4
    rfwp-rl compare --runs runs/ --model rdn --baseline lstm --steps 50M
    rfwp-rl compare --runs runs/ --paper table9 --model run:rdn --baseline paper:rdn
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from rfwp_rl import flags
from rfwp_rl.checkpoint import atomic_write_figure, atomic_write_text, csv_text
from rfwp_rl.errors import UserError, choices_hint
from rfwp_rl.scores import (
    METRICS,
    MODEL_LABELS,
    PAPER_GAMES,
    PAPER_TABLES,
    Score,
    canonical_game,
    canonical_model,
    format_steps,
    game_label,
    load_paper,
    load_runs,
    model_label,
    parse_steps,
    relative_improvement,
)
from rfwp_rl.texttable import format_columns

SOURCES = ("paper", "run")


@dataclasses.dataclass
class Comparison:
    """The result of :func:`compare`.

    ``cells[game][column]`` is the :class:`Score` shown in that cell; ``rel[game]`` the
    relative improvement (%) of ``model`` over ``baseline`` (when both were given), ``verdict``
    ``"better" | "similar" | "worse"`` per game.
    """

    games: list[str]
    columns: list[str]
    cells: dict[str, dict[str, Score]]
    steps: int | None
    model: str | None = None
    baseline: str | None = None
    similar: float = 5.0
    metric: str = "relative"
    rel: dict[str, float] = dataclasses.field(default_factory=dict)
    verdict: dict[str, str] = dataclasses.field(default_factory=dict)

    def counts(self) -> dict[str, list[str]]:
        """Games per verdict: ``{"better": [...], "similar": [...], "worse": [...], "n/a": [...]}``."""
        out: dict[str, list[str]] = {"better": [], "similar": [], "worse": [], "n/a": []}
        for g in self.games:
            if g in self.verdict:
                out[self.verdict[g]].append(g)
        return out


# ---------------------------------------------------------------- selection


def _column_label(col: str) -> str:
    src, _, model = col.rpartition(":")
    return f"{src}:{model_label(model)}" if src else model_label(model)


def _order_games(games) -> list[str]:
    paper = [g for g in PAPER_GAMES if g in games]
    return paper + sorted(g for g in games if g not in PAPER_GAMES)


def _order_models(models) -> list[str]:
    def key(col: str):
        src, _, m = col.rpartition(":")
        known = list(MODEL_LABELS)
        return (known.index(m) if m in known else len(known), m, src)

    return sorted(models, key=key)


def _select_paper(scores: list[Score], steps: int | None) -> tuple[list[Score], int | None]:
    have = sorted({s.steps for s in scores})
    if steps is None:
        if len(have) > 1:
            raise UserError(
                "the chosen paper tables hold scores at "
                f"{', '.join(format_steps(x) for x in have)} env steps; pick one with --steps"
            )
        steps = have[0] if have else None
    if steps not in have:
        raise UserError(
            f"the paper tables have no scores at {format_steps(steps)} steps; "
            f"allowed: {', '.join(format_steps(x) for x in have)}"
        )
    return [s for s in scores if s.steps == steps], steps


def _select_runs(scores: list[Score], steps: int | None, tolerance: float, mode: str) -> list[Score]:
    """One score per (game, model, run directory): closest to ``steps`` within ``tolerance``
    (relative), or the latest step when ``steps`` is None; then the mean over run
    directories (several seeds): mean of their means, std across them (a single run keeps
    its own std over the 5 repeats)."""
    if mode != "any":
        scores = [s for s in scores if s.extra.get("mode", mode) in ("", mode)]
    per_run: dict[tuple, Score] = {}
    for s in scores:
        if steps is not None and abs(s.steps - steps) > tolerance * steps:
            continue
        k = (s.game, s.model, str(Path(s.source).parent))
        old = per_run.get(k)
        better = old is None or (
            abs(s.steps - steps) < abs(old.steps - steps) if steps is not None else s.steps > old.steps
        )
        if not better and old is not None and s.steps == old.steps:
            better = _mtime(s.source) > _mtime(old.source)  # re-evaluated: newest file wins
        if better:
            per_run[k] = s
    grouped: dict[tuple, list[Score]] = defaultdict(list)
    for (game, model, _), s in per_run.items():
        grouped[(game, model)].append(s)
    out = []
    for (game, model), group in grouped.items():
        if len(group) == 1:
            out.append(group[0])
            continue
        means = [s.mean for s in group]
        mu = sum(means) / len(means)
        sd = math.sqrt(sum((m - mu) ** 2 for m in means) / len(means))
        out.append(
            Score(
                game,
                model,
                round(sum(s.steps for s in group) / len(group)),
                mu,
                sd,
                source=f"{len(group)} runs",
                extra={"runs": len(group)},
            )
        )
    return out


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def _resolve(name: str, columns: list[str], what: str, sources: dict[str, str]) -> str:
    """Map a user's model name (``RDN``, ``paper:rdn``, ``run:lstm``) to a table column;
    ``sources`` maps each column to "paper" or "run"."""
    src, _, model = name.rpartition(":")
    if src and src not in SOURCES:
        raise UserError(f"{what} {name!r}: unknown source {src!r}; allowed: paper:NAME, run:NAME")
    model = canonical_model(model)
    if src:
        for cand in (f"{src}:{model}", model):
            if cand in columns and sources.get(cand) == src:
                return cand
        raise UserError(f"{what} {name!r} is not in the {src} scores; {choices_hint(model, columns)}")
    if model in columns:
        return model
    both = [c for c in columns if c.endswith(":" + model)]
    if both:
        raise UserError(f"{what} {name!r} is in both the paper and the runs; write {' or '.join(both)}")
    raise UserError(f"{what} {name!r} has no scores here; {choices_hint(model, columns)}")


def compare(
    paper: str | Sequence[str] | None = None,
    runs: Sequence[str | Path] = (),
    model: str | None = None,
    baseline: str | None = None,
    steps: int | str | None = None,
    models: Sequence[str] = (),
    games: Sequence[str] = (),
    similar: float = 5.0,
    paper_dir: str | Path | None = None,
    steps_tolerance: float = 0.1,
    mode: str = "greedy",
    metric: str = "relative",
    run_steps: int | str | None = None,
) -> Comparison:
    """Build the per-game comparison (no printing, no files). See the module docstring.

    ``steps`` selects the paper's table rows and the runs' evals (closest within
    ``steps_tolerance``); ``run_steps`` selects the runs' evals on its own (e.g. to put a short
    run next to the paper's 50M scores). Without either, each run contributes its latest eval.
    """
    if not paper and not runs:
        raise UserError("nothing to compare: give --paper TABLE and/or --runs PATH...")
    if (model is None) != (baseline is None):
        raise UserError("give both --model and --baseline (or neither, for the score table only)")
    steps = parse_steps(steps) if steps is not None else None
    run_steps = parse_steps(run_steps) if run_steps is not None else steps
    paper_scores: list[Score] = []
    if paper:
        paper_scores, paper_steps = _select_paper(load_paper(paper, paper_dir), steps)
        steps = steps if steps is not None else paper_steps
    elif steps is None and run_steps is not None:
        steps = run_steps
    run_scores = _select_runs(load_runs(runs), run_steps, steps_tolerance, mode) if runs else []
    if runs and not run_scores:
        at = f" near {format_steps(run_steps)} steps" if run_steps is not None else ""
        raise UserError(f"no eval results{at} (mode {mode}) in {', '.join(str(r) for r in runs)}")

    paper_models = {s.model for s in paper_scores}
    run_models = {s.model for s in run_scores}
    sources: dict[str, str] = {}
    cells: dict[str, dict[str, Score]] = defaultdict(dict)
    for src, scores in (("paper", paper_scores), ("run", run_scores)):
        for s in scores:
            col = f"{src}:{s.model}" if s.model in paper_models and s.model in run_models else s.model
            sources[col] = src
            cells[s.game][col] = s
    columns = _order_models({c for row in cells.values() for c in row})
    if models:
        columns = [_resolve(m, columns, "model", sources) for m in models]
    if games:
        wanted = [canonical_game(g) for g in games]
        unknown = [g for g in wanted if g not in cells]
        if unknown:
            raise UserError(f"no scores for game {unknown[0]!r}; {choices_hint(unknown[0], cells)}")
        game_list = wanted
    else:
        game_list = _order_games(cells)
    result = Comparison(
        games=game_list, columns=columns, cells=dict(cells), steps=steps, similar=similar, metric=metric
    )
    if model is not None:
        all_columns = _order_models({c for row in cells.values() for c in row})
        m = _resolve(model, all_columns, "--model", sources)
        b = _resolve(baseline, all_columns, "--baseline", sources)
        if m == b:
            raise UserError(f"--model and --baseline are the same ({m!r})")
        result.model, result.baseline = m, b
        result.columns = [c for c in result.columns if c not in (m, b)]
        result.columns = [m, b] + result.columns
        paired = [g for g in game_list if m in cells[g] and b in cells[g]]
        if not paired:
            raise UserError(f"no game has scores for both {m!r} and {b!r}")
        result.games = paired
        for g in paired:
            r = relative_improvement(cells[g][m].mean, cells[g][b].mean, metric)
            result.rel[g] = r
            result.verdict[g] = (
                "n/a" if math.isnan(r) else "better" if r > similar else "worse" if r < -similar else "similar"
            )
    return result


# ---------------------------------------------------------------- output


def _fmt(x: float) -> str:
    """Numbers as the paper prints them: 1,754 / 48 / 7.5."""
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 100 or x == int(x):
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _fmt_score(s: Score | None) -> str:
    return "-" if s is None else f"{_fmt(s.mean)} ± {_fmt(s.std)}"


def column_steps(c: Comparison, col: str) -> set[int]:
    """Step counts of the scores in one column."""
    return {c.cells[g][col].steps for g in c.games if col in c.cells[g]}


def _header(c: Comparison, col: str) -> str:
    """Column label, with ``@steps`` when its scores are not at the comparison's step count."""
    have = column_steps(c, col)
    if not have or have == {c.steps}:
        return _column_label(col)
    return f"{_column_label(col)}@{format_steps(have.pop()) if len(have) == 1 else 'mixed'}"


def table_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the printed table."""
    header = ["game"] + [_header(c, col) for col in c.columns]
    if c.model:
        header += ["rel. impr. %", "verdict"]
    rows = []
    for g in c.games:
        row = [game_label(g)] + [_fmt_score(c.cells[g].get(col)) for col in c.columns]
        if c.model:
            r = c.rel[g]
            row += ["n/a" if math.isnan(r) else f"{r:+.1f}", c.verdict[g]]
        rows.append(row)
    return header, rows


def format_table(c: Comparison) -> str:
    header, rows = table_rows(c)
    return format_columns(header, rows, first_left=True, rule=True)


def summary(c: Comparison) -> str:
    """One line: how many games the model is better / similar / worse on."""
    if not c.model:
        return f"{len(c.games)} games, {len(c.columns)} models"
    n = c.counts()
    at = f" after {format_steps(c.steps)} env steps" if c.steps else ""
    worse = f" ({', '.join(game_label(g) for g in n['worse'])})" if n["worse"] else ""
    strictly = sum(1 for g in c.games if c.rel[g] < 0)
    na = f", n/a (zero baseline) on {len(n['n/a'])}" if n["n/a"] else ""
    metric = "" if c.metric == "relative" else f" (metric {c.metric})"
    return (
        f"{_header(c, c.model)} vs {_header(c, c.baseline)}{at}{metric} on {len(c.games)} "
        f"game{'s' if len(c.games) != 1 else ''}: "
        f"better on {len(n['better'])}, similar (within ±{c.similar:g}%) on {len(n['similar'])}, "
        f"worse on {len(n['worse'])}{worse}{na}; strictly lower score on {strictly}"
    )


def to_csv(c: Comparison) -> str:
    """The table as CSV: game, game_label, then <column>_mean, <column>_std, <column>_steps per
    column, then (with a model and a baseline) model, baseline, metric, relative_improvement_pct, verdict."""
    header = ["game", "game_label"]
    for col in c.columns:
        header += [f"{col}_mean", f"{col}_std", f"{col}_steps"]
    if c.model:
        header += ["model", "baseline", "metric", "relative_improvement_pct", "verdict"]
    rows = []
    for g in c.games:
        row = {"game": g, "game_label": game_label(g)}
        for col in c.columns:
            if (s := c.cells[g].get(col)) is not None:
                row |= {f"{col}_mean": f"{s.mean:.6g}", f"{col}_std": f"{s.std:.6g}", f"{col}_steps": s.steps}
        if c.model:
            r = c.rel[g]
            row |= {"model": c.model, "baseline": c.baseline, "metric": c.metric, "verdict": c.verdict[g]}
            row["relative_improvement_pct"] = "" if math.isnan(r) else f"{r:.4f}"
        rows.append(row)
    return csv_text(rows, header)


def plot(c: Comparison, path: str | Path, axis_limit: float = 200.0, footer: str = "") -> Path:
    """Horizontal bar chart of the relative improvement per game (paper Figs. 1-4 style),
    sorted, with ±``similar`` band; bars beyond ±``axis_limit`` % are cut and labelled with their
    value (``axis_limit`` <= 0: no cut). Written atomically as PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not c.model:
        raise UserError("the chart needs --model and --baseline")
    items = sorted(((g, r) for g, r in c.rel.items() if not math.isnan(r)), key=lambda t: t[1])
    if not items:
        raise UserError("nothing to plot: every baseline score is zero")
    names = [game_label(g) for g, _ in items]
    values = [r for _, r in items]
    shown = [max(-axis_limit, min(axis_limit, v)) if axis_limit > 0 else v for v in values]
    colours = ["#2b8cbe" if v > c.similar else "#d7301f" if v < -c.similar else "#969696" for v in values]

    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(items) + 1.6), dpi=120)
    ax.barh(range(len(items)), shown, color=colours)
    ax.set_yticks(range(len(items)), names, fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    ax.axvspan(-c.similar, c.similar, color="#dddddd", alpha=0.6, lw=0, zorder=0)
    lo, hi = min(0.0, min(shown)), max(0.0, max(shown))
    span = (hi - lo) or 1.0
    for i, (v, s) in enumerate(zip(values, shown)):
        label = f"{v:+.0f}%" if abs(v) >= 10 else f"{v:+.1f}%"
        ax.text(
            s + (0.01 * span if s >= 0 else -0.01 * span),
            i,
            label,
            va="center",
            ha="left" if s >= 0 else "right",
            fontsize=7,
            fontweight="bold" if s != v else "normal",
        )
    ax.set_xlim(lo - (0.18 if lo < 0 else 0.03) * span, hi + (0.18 if hi > 0 else 0.03) * span)
    at = f" after {format_steps(c.steps)} env. steps" if c.steps else ""
    ax.set_title(f"Relative improvement of {_header(c, c.model)} over {_header(c, c.baseline)}{at}", fontsize=10)
    formula = "|baseline|" if c.metric == "relative" else "max(|model|, |baseline|)"
    cut = f"; axis cut at ±{axis_limit:g}%" if axis_limit > 0 and shown != values else ""
    ax.set_xlabel(f"100 × (model − baseline) / {formula}  (%){cut}", fontsize=8)
    if footer:
        fig.text(0.01, 0.005, footer, fontsize=6, color="#555555", va="bottom")
    fig.tight_layout(rect=(0, 0.03 if footer else 0, 1, 1))
    path = Path(path)
    atomic_write_figure(path, fig)
    return path


# ---------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:" + __doc__.split("Examples::", 1)[1]
    src = parser.add_argument_group("inputs")
    src.add_argument(
        "--paper",
        nargs="?",
        const="all",
        choices=PAPER_TABLES + ("all",),
        default=None,
        help="the RFWP paper's table(s) (what each holds and at which step budget: results/paper/README.md); "
        "'all' (default when no value) needs --steps",
    )
    src.add_argument(
        "--paper-dir",
        default=None,
        help="folder of the paper CSVs (default: the checkout's results/paper, "
        "else the copy installed with the package)",
    )
    flags.add_list_argument(
        src, "--runs", [], "eval_*.json / eval_*.csv files, run directories, or directories of runs", metavar="PATH"
    )
    sel = parser.add_argument_group("selection")
    sel.add_argument("--model", default=None, help="model to rate, e.g. RDN, rdn, run:rdn, paper:lstm")
    sel.add_argument("--baseline", default=None, help="model to rate it against, e.g. LT, lstm")
    sel.add_argument(
        "--steps",
        default=None,
        help="env steps, e.g. 50M or 200M (runs: the eval closest to it within --steps-tolerance)",
    )
    sel.add_argument(
        "--run-steps",
        default=None,
        help="env steps of the runs' evals when they differ from --steps (default: --steps, "
        "else each run's latest eval)",
    )
    sel.add_argument(
        "--steps-tolerance",
        type=float,
        default=0.1,
        help="relative distance from --steps / --run-steps accepted for runs (default %(default)s)",
    )
    flags.add_list_argument(sel, "--models", [], "columns to show", default_text="every model found")
    flags.add_list_argument(sel, "--games", [], "games to show", default_text="all")
    # which evals of runs to use, by how their actions were chosen (greedy: the paper's test protocol)
    flags.add_actions_argument(sel, "greedy", also={"any": "either"})
    sel.add_argument(
        "--metric",
        choices=METRICS,
        default="relative",
        help="relative: 100 (M - B) / |B| (default); gap: 100 (M - B) / max(|M|, |B|), bounded "
        "by ±100 (the paper does not print its formula; see rfwp_rl.scores.relative_improvement)",
    )
    sel.add_argument(
        "--similar",
        type=float,
        default=5.0,
        help="|relative improvement| (%%) counted as 'similar' (default %(default)s)",
    )
    out = parser.add_argument_group("outputs")
    out.add_argument(
        "--out",
        default=None,
        help="output path prefix for .csv and .png (default: ./compare_<model>_vs_<baseline>_<steps>)",
    )
    out.add_argument("--no-plot", action="store_true", help="write only the CSV")
    out.add_argument(
        "--axis-limit",
        type=float,
        default=200.0,
        metavar="PERCENT",
        help="cut the chart's axis at ±PERCENT %% and label longer bars (0: no cut; default %(default)s)",
    )


def _default_prefix(c: Comparison) -> str:
    steps = f"_{format_steps(c.steps)}" if c.steps else ""
    if c.model:
        name = f"compare_{c.model}_vs_{c.baseline}{steps}"
    else:
        name = f"compare{steps}"
    return name.replace(":", "-")


def run(args: argparse.Namespace) -> int:
    if args.similar < 0:
        raise UserError(f"--similar must be >= 0, got {args.similar}")
    c = compare(
        paper=args.paper,
        runs=args.runs,
        model=args.model,
        baseline=args.baseline,
        steps=args.steps,
        models=args.models,
        games=args.games,
        similar=args.similar,
        paper_dir=args.paper_dir,
        steps_tolerance=args.steps_tolerance,
        mode=args.actions,
        metric=args.metric,
        run_steps=args.run_steps,
    )
    print(format_table(c))
    print(summary(c))
    prefix = args.out or _default_prefix(c)
    csv_path = Path(prefix + ".csv")
    atomic_write_text(csv_path, to_csv(c))
    print(f"wrote {csv_path}")
    if c.model and not args.no_plot:
        command = (
            "rfwp-rl compare " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["compare"] else ""
        )
        png = plot(c, prefix + ".png", axis_limit=args.axis_limit, footer=command)
        print(f"wrote {png}")
    return 0
