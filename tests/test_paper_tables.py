"""The RFWP paper's Atari tables as CSV (results/paper/): shape, parsing, spot values."""

from __future__ import annotations

import csv

import pytest

from rfwp_rl.scores import PAPER_GAMES, PAPER_TABLES, load_paper, paper_dir, read_score_csv

SIX = {"ff", "lstm", "lt", "delta", "rdn", "delta_rnn"}


def _raw_rows(name: str) -> list[dict]:
    with open(paper_dir() / f"{name}.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", PAPER_TABLES)
def test_every_number_parses_and_is_non_negative(name):
    rows = _raw_rows(name)
    assert rows, name
    for r in rows:
        assert set(r) == {"table", "game", "game_label", "model", "model_label", "steps", "mean", "std", "note"}
        mean, std, steps = float(r["mean"]), float(r["std"]), int(r["steps"])
        assert mean >= 0 and std >= 0 and steps in (50_000_000, 200_000_000)
        assert "," not in r["mean"] + r["std"]
        assert r["table"] == name.removeprefix("table")


@pytest.mark.parametrize("name,steps", [("table9", 50_000_000), ("table10", 200_000_000)])
def test_tables_9_and_10_are_20_games_by_6_models(name, steps):
    scores = read_score_csv(paper_dir() / f"{name}.csv")
    assert len(scores) == 120
    assert {s.game for s in scores} == set(PAPER_GAMES)
    assert {s.model for s in scores} == SIX
    assert {s.steps for s in scores} == {steps}
    assert len({(s.game, s.model) for s in scores}) == 120  # no duplicate cell


def test_tables_3_and_8_shape():
    t3 = read_score_csv(paper_dir() / "table3.csv")
    assert {s.game for s in t3} == {"BattleZone", "Berzerk", "Gopher", "Seaquest"}
    assert {s.model for s in t3} == {"lstm", "rdn", "rdn_large"} and len(t3) == 12
    t8 = read_score_csv(paper_dir() / "table8.csv")
    assert {s.game for s in t8} == {"Berzerk", "Gopher", "Seaquest", "SpaceInvaders"}
    assert {s.model for s in t8} == {"lstm", "ff", "ff_gated"} and len(t8) == 12


@pytest.mark.parametrize(
    "game,model,steps,mean,std",
    [
        ("Alien", "ff", 50_000_000, 1985, 90),
        ("Assault", "rdn", 50_000_000, 8088, 2851),
        ("Jamesbond", "delta_rnn", 50_000_000, 2929.3, 408),  # printed with a decimal
        ("Robotank", "ff", 50_000_000, 7.1, 0.7),
        ("Seaquest", "rdn", 50_000_000, 686, 1),  # row printed as "Sequester"
        ("UpNDown", "lstm", 50_000_000, 155847, 15318),
        ("Zaxxon", "ff", 50_000_000, 4863, 872),
        ("Qbert", "rdn", 200_000_000, 987275, 0),
        ("SpaceInvaders", "rdn", 200_000_000, 170871, 80),
        ("Zaxxon", "delta", 200_000_000, 10523, 568),  # printed "1,0523"
        ("Gopher", "lstm", 200_000_000, 124914, 22422),
        ("BattleZone", "rdn_large", 200_000_000, 28273, 5333),  # Table 3
        ("SpaceInvaders", "ff_gated", 200_000_000, 95629, 11991),  # Table 8
    ],
)
def test_spot_values(game, model, steps, mean, std):
    by_key = {s.key: s for s in load_paper("all")}
    s = by_key[(game, model, steps)]
    assert (s.mean, s.std) == (mean, std)


def test_all_tables_merge_consistently():
    """Table 3's and 8's LSTM/RDN/FF cells repeat Table 10's: merged once, no conflict."""
    scores = load_paper("all")
    assert len(scores) == 120 + 120 + 4 + 4  # + rdn_large and ff_gated rows
    t10 = {s.key: s for s in load_paper("table10")}
    for row in _raw_rows("table3") + _raw_rows("table8"):
        if row["note"] == "identical to Table 10":
            key = (row["game"], row["model"], int(row["steps"]))
            assert (t10[key].mean, t10[key].std) == (float(row["mean"]), float(row["std"]))


def test_table10_notes_mark_cells_repeated_from_table9():
    t9 = {(r["game"], r["model"]): (r["mean"], r["std"]) for r in _raw_rows("table9")}
    marked = {(r["game"], r["model"]) for r in _raw_rows("table10") if r["note"]}
    same = {
        (r["game"], r["model"]) for r in _raw_rows("table10") if t9[(r["game"], r["model"])] == (r["mean"], r["std"])
    }
    assert marked == same
    assert {g for g, _ in marked} == {"BankHeist", "Pong", "Robotank", "UpNDown"}
