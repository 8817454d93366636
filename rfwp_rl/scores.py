"""Score tables: the RFWP paper's Atari tables and this package's evaluation results.

One record type, :class:`Score`, for both: a game, a model, a training step count and the
mean and standard deviation of the evaluation score (the paper's protocol: the mean over 30
test episodes, repeated 5 times; ``mean`` is the mean of the 5 means and ``std`` their
standard deviation).

Sources:

- the paper's tables, stored as tidy CSV in ``results/paper/`` (``table3``, ``table8``,
  ``table9``, ``table10``; see ``results/paper/README.md``), read with :func:`load_paper`;
- evaluation outputs of ``rfwp-rl eval`` (``eval_*.json`` with every episode score, and a
  one-row ``eval_*.csv`` in the same columns as the paper CSVs), read with :func:`load_runs`
  from files, run directories or directories of runs.

Names are canonical: games are ALE names without prefix or version (``BattleZone`` for
``ALE/BattleZone-v5``, ``BattleZoneNoFrameskip-v4`` or the paper's "Battlezone"); models are
core names (``rdn``, ``lt``, ...; the paper's "RDN", "Linear Transformer", "Delta Net" are
accepted); step counts are integers (``"50M"`` -> 50_000_000).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from rfwp_rl.checkpoint import atomic_write_text, csv_text
from rfwp_rl.errors import UserError, check_choice, read_text_file
from rfwp_rl.resources import data_dir

PAPER_TABLES = ("table3", "table8", "table9", "table10")
EVAL_FORMAT = "rfwp_rl.eval/1"

# The 20 games of RFWP paper Sec. 4.4 / App. C (ALE name -> label printed in Tables 9-10).
PAPER_GAMES = {
    "Alien": "Alien",
    "Amidar": "Amidar",
    "Assault": "Assault",
    "BattleZone": "Battlezone",
    "Berzerk": "Berzerk",
    "BankHeist": "B. Heist",
    "BeamRider": "B. Rider",
    "DemonAttack": "D. Attack",
    "Gopher": "Gopher",
    "Jamesbond": "James Bond",
    "KungFuMaster": "Kung-fu",
    "MsPacman": "MsPacman",
    "Pong": "Pong",
    "Qbert": "Q*Bert",
    "Robotank": "Robotank",
    "Seaquest": "Seaquest",
    "SpaceInvaders": "S. Invaders",
    "StarGunner": "Stargunner",
    "UpNDown": "Up'n down",
    "Zaxxon": "Zaxxon",
}

# Model ids (core names, plus the two extra models of Tables 3 and 8) -> label in the paper.
MODEL_LABELS = {
    "ff": "Feedforward",
    "lstm": "LSTM",
    "gru": "GRU",
    "lt": "LT",
    "delta": "Delta Net",
    "rdn": "RDN",
    "delta_rnn": "Delta RNN",
    "rdn_large": "RDN larger",
    "ff_gated": "FF gated",
}
_MODEL_ALIASES = {
    "feedforward": "ff",
    "linear transformer": "lt",
    "lineartransformer": "lt",
    "deltanet": "delta",
    "delta net": "delta",
    "recurrent delta net": "rdn",
    "recurrentdeltanet": "rdn",
    "deltarnn": "delta_rnn",
    "delta rnn": "delta_rnn",
    "rdn larger": "rdn_large",
    "rdn-large": "rdn_large",
    "ff gated": "ff_gated",
    "ff-gated": "ff_gated",
}

CSV_COLUMNS = ("game", "model", "steps", "mean", "std")  # required; other columns are kept as extras


@dataclasses.dataclass
class Score:
    """One evaluation result: ``mean`` +- ``std`` of ``model`` on ``game`` after ``steps`` env steps.

    ``source`` says where it came from (``"paper:table9"`` or the path of an eval file);
    ``extra`` holds the other columns of the row (note, episodes, mode...).
    """

    game: str
    model: str
    steps: int
    mean: float
    std: float
    source: str = ""
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.game, self.model, self.steps)


# ---------------------------------------------------------------- names and numbers


def canonical_game(name: str) -> str:
    """``"ALE/BattleZone-v5"``, ``"BattleZoneNoFrameskip-v4"``, ``"Battlezone"`` -> ``"BattleZone"``;
    the paper's labels ("B. Heist", "Q*Bert", "Up'n down") map to ALE names; any other env
    id loses only its ``-vN`` suffix and namespace (``"CartPole-v1"`` -> ``"CartPole"``)."""
    base = str(name).strip().split("/")[-1]
    base = re.sub(r"-v\d+$", "", base)
    base = re.sub(r"(NoFrameskip|Deterministic)$", "", base)
    key = re.sub(r"[^a-z0-9]", "", base.lower())
    for game, label in PAPER_GAMES.items():
        if key in (game.lower(), re.sub(r"[^a-z0-9]", "", label.lower())):
            return game
    if key in ("sinvader", "spaceinvader", "sequester", "kungfu"):  # paper variants
        return {
            "sinvader": "SpaceInvaders",
            "spaceinvader": "SpaceInvaders",
            "sequester": "Seaquest",
            "kungfu": "KungFuMaster",
        }[key]
    return base


def canonical_model(name: str) -> str:
    """``"RDN"`` -> ``"rdn"``, ``"Linear Transformer"`` -> ``"lt"``, ``"Delta RNN"`` -> ``"delta_rnn"``;
    unknown names are lower-cased and kept (a run may use a custom ``--label``)."""
    low = str(name).strip().lower()
    return _MODEL_ALIASES.get(low, low.replace(" ", "_"))


def model_label(model: str) -> str:
    return MODEL_LABELS.get(model, model)


def game_label(game: str) -> str:
    return PAPER_GAMES.get(game, game)


def parse_steps(text: str | int | float) -> int:
    """``"50M"`` / ``"50m"`` / ``"200M"`` / ``"1.5e6"`` / ``"25k"`` / ``"5000000"`` -> int env steps."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return int(round(text))
    s = str(text).strip().replace(",", "").replace("_", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kKmMgGbB]?)", s)
    if not m:
        raise UserError(f"bad step count {text!r}; write e.g. 50M, 200M, 250k or 5000000")
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}[m.group(2).lower()]
    return int(round(float(m.group(1)) * scale))


def format_steps(steps: int) -> str:
    """50_000_000 -> ``"50M"``, 1_500_000 -> ``"1.5M"``, 25_000 -> ``"25k"``, 999 -> ``"999"``."""
    for scale, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if steps >= scale:
            return f"{steps / scale:.4g}{suffix}"
    return str(steps)


def _number(value: str, where: str) -> float:
    try:
        x = float(str(value).strip())
    except ValueError:
        raise UserError(f"{where}: {value!r} is not a number") from None
    return x


# ---------------------------------------------------------------- reading


def read_score_csv(path: str | Path, source: str | None = None) -> list[Score]:
    """Rows of a score CSV (header with at least game, model, steps, mean, std)."""
    path = Path(path)
    text = read_text_file(path, "score table")
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise UserError(
            f"{path}: not a score table (missing column(s) {', '.join(missing)}; need {', '.join(CSV_COLUMNS)})"
        )
    rows = []
    for i, row in enumerate(reader, start=2):
        where = f"{path}:{i}"
        extra = {k: v for k, v in row.items() if k not in CSV_COLUMNS and k is not None}
        rows.append(
            Score(
                game=canonical_game(row["game"]),
                model=canonical_model(row["model"]),
                steps=parse_steps(row["steps"]),
                mean=_number(row["mean"], where),
                std=_number(row["std"], where),
                source=source or str(path),
                extra=extra,
            )
        )
    return rows


def paper_dir() -> Path:
    """``results/paper/`` of the source checkout, else the copy shipped in the installed package
    (one-line :class:`UserError` when neither exists)."""
    return data_dir("results/paper")


def load_paper(tables: str | Sequence[str] = "all", directory: str | Path | None = None) -> list[Score]:
    """The paper's scores from ``table3|table8|table9|table10`` (or ``"all"``).

    With several tables, rows that repeat another table's (same game, model, steps, mean
    and std: Table 3's and Table 8's LSTM/RDN/FF rows are Table 10's) are kept once; the
    same key with different numbers raises :class:`UserError`.
    """
    names = list(PAPER_TABLES) if tables == "all" else [tables] if isinstance(tables, str) else list(tables)
    directory = Path(directory) if directory is not None else paper_dir()
    out: dict[tuple, Score] = {}
    for name in names:
        check_choice("paper table", name, PAPER_TABLES + ("all",))
        path = directory / f"{name}.csv"
        if not path.is_file():
            raise UserError(
                f"paper table {path} not found; pass --paper-dir DIR (the repository's results/paper folder)"
            )
        for s in read_score_csv(path, source=f"paper:{name}"):
            old = out.get(s.key)
            if old is not None and (old.mean, old.std) != (s.mean, s.std):
                raise UserError(
                    f"{s.game}/{s.model}/{format_steps(s.steps)}: {old.source} has "
                    f"{old.mean:g}±{old.std:g} but {s.source} has {s.mean:g}±{s.std:g}"
                )
            out.setdefault(s.key, s)
    return list(out.values())


def read_eval_json(path: str | Path) -> Score:
    """The summary of one ``rfwp-rl eval`` JSON file as a :class:`Score`."""
    path = Path(path)
    try:
        d = json.loads(read_text_file(path, "eval JSON"))
    except (json.JSONDecodeError, RecursionError) as e:
        raise UserError(f"{path}: cannot read eval JSON ({e})") from None
    if not isinstance(d, dict) or d.get("format") != EVAL_FORMAT:
        raise UserError(f"{path}: not an rfwp-rl eval file (expected format {EVAL_FORMAT!r})")
    extra = {k: d[k] for k in ("env", "mode", "noneg", "episodes", "repeats", "checkpoint", "core") if k in d}
    return Score(
        game=canonical_game(d["game"]),
        model=canonical_model(d["model"]),
        steps=int(d["steps"]),
        mean=float(d["mean"]),
        std=float(d["std"]),
        source=str(path),
        extra=extra,
    )


def _eval_files(directory: Path) -> list[Path]:
    """``eval_*.json`` under ``directory`` (recursively); an ``eval_*.csv`` counts only
    when no JSON of the same name is next to it."""
    files = sorted(directory.rglob("eval_*.json"))
    stems = {p.with_suffix("") for p in files}
    files += [p for p in sorted(directory.rglob("eval_*.csv")) if p.with_suffix("") not in stems]
    return files


def load_runs(paths: Iterable[str | Path]) -> list[Score]:
    """Evaluation results from eval JSON/CSV files, run directories, or directories of runs."""
    out: list[Score] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files = _eval_files(p)
            if not files:
                raise UserError(f"no eval results (eval_*.json or eval_*.csv) under {p}; run 'rfwp-rl eval {p}' first")
        elif p.is_file():
            files = [p]
        else:
            raise UserError(f"{str(p)!r} does not exist (expected an eval JSON/CSV file or a run directory)")
        for f in files:
            if f.suffix == ".json":
                out.append(read_eval_json(f))
            elif f.suffix == ".csv":
                out.extend(read_score_csv(f))
            else:
                raise UserError(f"{f}: unknown result file type {f.suffix!r}; allowed: .json, .csv")
    return out


# ---------------------------------------------------------------- writing


def score_rows_csv(scores: Sequence[Score], extra_columns: Sequence[str] = ()) -> str:
    """CSV text of ``scores`` in the paper tables' columns plus ``extra_columns``."""
    rows = [
        {
            **s.extra,
            "game": s.game,
            "game_label": game_label(s.game),
            "model": s.model,
            "model_label": model_label(s.model),
            "steps": s.steps,
            "mean": f"{s.mean:.6g}",
            "std": f"{s.std:.6g}",
        }
        for s in scores
    ]
    columns = ["game", "game_label", "model", "model_label", "steps", "mean", "std", *extra_columns]
    return csv_text(rows, columns, float_format="")


METRICS = ("relative", "gap")


def relative_improvement(model_score: float, baseline_score: float, metric: str = "relative") -> float:
    """Relative improvement of a model over a baseline, in percent.

    ``"relative"`` (default): ``100 * (model - baseline) / |baseline|``.
    ``"gap"``: ``100 * (model - baseline) / max(|model|, |baseline|)``, bounded in [-100, 100].

    RFWP paper Sec. 4.4, Figures 1-4 and App. C Figures 5-12 ("relative improvements in test
    scores"). The paper does not print its formula. Both definitions reproduce every
    better / similar / worse count its text states about those figures with a +-5% "similar"
    band (``tests/test_compare.py``), and a score normalised by human and random scores does
    not (App. C: RDN vs Delta RNN at 200M, "in 16 games the relative performance gap is within
    50%", Seaquest outside, would then have Seaquest within). They differ on one statement:
    that count of 16 is exact with ``"gap"``; with ``"relative"`` Up'n down sits at +50.7%
    (15 games strictly within). ``"relative"`` is the default because it is what "relative
    improvement" means. A zero baseline gives ``nan`` (0 when the model scores 0 too).
    """
    check_choice("relative-improvement metric", metric, METRICS)
    if metric == "gap":
        denom = max(abs(model_score), abs(baseline_score))
    else:
        denom = abs(baseline_score)
    if denom == 0:
        return 0.0 if model_score == baseline_score else math.nan
    return 100.0 * (model_score - baseline_score) / denom


# ---------------------------------------------------------------- eval result files

EVAL_CSV_EXTRA = ("env", "core", "mode", "noneg", "episodes", "repeats", "checkpoint")


def eval_file_stem(step: int, mode: str, noneg: bool, label: str = "") -> str:
    """``eval_000050000000_greedy`` (+ ``_noneg``, + ``_<label>``): the name of an eval's files."""
    stem = f"eval_{int(step):012d}_{mode}" + ("_noneg" if noneg else "")
    if label:
        stem += "_" + re.sub(r"[^A-Za-z0-9.+-]+", "-", label).strip("-")
    return stem


def write_eval(record: dict, directory: str | Path, stem: str | None = None) -> tuple[Path, Path]:
    """Write an eval ``record`` (see :mod:`rfwp_rl.impala.evaluate`) as ``<stem>.json`` (everything,
    including every episode's score) and ``<stem>.csv`` (one row in the paper tables' columns),
    both atomically. Returns the two paths."""
    record = dict(record, format=EVAL_FORMAT)
    for key in ("game", "model", "steps", "mean", "std"):
        if key not in record:
            raise ValueError(f"eval record lacks {key!r}")
    directory = Path(directory)
    stem = stem or eval_file_stem(record["steps"], record.get("mode", "greedy"), bool(record.get("noneg")))
    json_path, csv_path = directory / f"{stem}.json", directory / f"{stem}.csv"
    atomic_write_text(json_path, json.dumps(record, indent=1, default=str) + "\n")
    score = Score(
        game=canonical_game(record["game"]),
        model=canonical_model(record["model"]),
        steps=int(record["steps"]),
        mean=float(record["mean"]),
        std=float(record["std"]),
        extra={k: record.get(k, "") for k in EVAL_CSV_EXTRA},
    )
    atomic_write_text(csv_path, score_rows_csv([score], EVAL_CSV_EXTRA))
    return json_path, csv_path
