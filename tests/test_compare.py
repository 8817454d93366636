"""rfwp-rl compare: relative improvement (RFWP paper Figs. 1-4), the paper's per-game sign
patterns, CSV + PNG outputs, eval results of runs, and one-line errors."""

from __future__ import annotations

import csv
import math

import pytest

from rfwp_rl import cli
from rfwp_rl.compare import compare, summary, to_csv
from rfwp_rl.errors import UserError
from rfwp_rl.scores import METRICS, load_runs, relative_improvement, write_eval


def test_relative_improvement_definition():
    assert relative_improvement(150, 100) == pytest.approx(50.0)
    assert relative_improvement(50, 100) == pytest.approx(-50.0)
    assert relative_improvement(-10, -20) == pytest.approx(50.0)  # |baseline|: less negative is better
    assert relative_improvement(-30, -20) == pytest.approx(-50.0)
    assert relative_improvement(0, 0) == 0.0
    assert math.isnan(relative_improvement(5, 0))
    assert relative_improvement(150, 100, "gap") == pytest.approx(100 * 50 / 150)
    assert relative_improvement(50, 100, "gap") == pytest.approx(-50.0)
    assert relative_improvement(5, 0, "gap") == pytest.approx(100.0)
    with pytest.raises(UserError, match="allowed: gap, relative"):
        relative_improvement(1, 2, "ratio")


def _sets(c):
    n = c.counts()
    return set(n["better"]), set(n["similar"]), set(n["worse"])


@pytest.mark.parametrize("metric", METRICS)
def test_rdn_vs_lt_sign_pattern_matches_paper_figures_1_and_2(metric):
    """Sec. 4.4: "The RDN matches or outperforms the Linear Transformer on all games except for
    two out of 20 games at both stages of training"."""
    c50 = compare(paper="table9", model="RDN", baseline="LT", steps="50M", metric=metric)
    assert len(c50.games) == 20 and c50.steps == 50_000_000
    assert {g for g in c50.games if c50.rel[g] < 0} == {"Alien", "Seaquest"}
    assert _sets(c50)[2] == {"Alien", "Seaquest"}
    assert c50.rel["Alien"] == pytest.approx(100 * (1754 - 2135) / 2135)  # baseline is the larger here
    c200 = compare(paper="table10", model="rdn", baseline="lt", metric=metric)
    assert _sets(c200)[2] == {"Berzerk", "Seaquest"}
    # strictly lower: Up'n down too, by 5.0% ("matches")
    assert {g for g in c200.games if c200.rel[g] < 0} == {"Berzerk", "Seaquest", "UpNDown"}
    assert c200.rel["UpNDown"] == pytest.approx(-4.97, abs=0.01)


@pytest.mark.parametrize("metric", METRICS)
def test_rdn_vs_lstm_counts_match_paper_figures_3_and_4(metric):
    better, similar, worse = _sets(compare(paper="table9", model="rdn", baseline="lstm", metric=metric))
    assert (len(better), len(similar), len(worse)) == (12, 5, 3)  # "12 ... 3 ... remaining 5"
    assert worse == {"Berzerk", "KungFuMaster", "UpNDown"}
    better, similar, worse = _sets(compare(paper="table10", model="rdn", baseline="lstm", metric=metric))
    assert (len(better), len(worse)) == (9, 6)  # "6 games LSTM clearly outperforms RDN ... 9 the opposite"
    assert {"BattleZone", "Gopher", "Seaquest", "Zaxxon"} <= worse  # named in Sec. 4.4


@pytest.mark.parametrize("metric", METRICS)
def test_appendix_c_counts(metric):
    kw = dict(paper="table10", metric=metric)
    # Figs. 7-8: RDN >= Delta Net on 13 games at 200M, Delta Net better on 7
    assert len(_sets(compare(model="rdn", baseline="delta", **kw))[2]) == 7
    # Figs. 9-10: Delta RNN vs LSTM at 200M: close in 7, LSTM better in 8, Delta RNN in 5
    better, similar, worse = _sets(compare(model="delta_rnn", baseline="lstm", **kw))
    assert (len(better), len(similar), len(worse)) == (5, 7, 8)
    # Figs. 11-12: RDN vs Delta RNN at 200M: "in 16 games, the relative performance gap is within
    # 50%", Seaquest below, 3 games clearly above
    c = compare(model="rdn", baseline="delta_rnn", **kw)
    assert {g for g, r in c.rel.items() if r < -50} == {"Seaquest"}
    above = {g for g, r in c.rel.items() if r > 50}
    if metric == "gap":
        assert sum(abs(r) <= 50 for r in c.rel.values()) == 16
        assert above == {"Amidar", "Qbert", "SpaceInvaders"}
    else:  # Up'n down at +50.7%: "within 50%" only to the eye
        assert above == {"Amidar", "Qbert", "SpaceInvaders", "UpNDown"}
        assert c.rel["UpNDown"] == pytest.approx(50.67, abs=0.01)
    # Fig. 5: FF vs LSTM at 50M: FF clearly better in 8 games, LSTM in 8
    better, _, worse = _sets(compare(paper="table9", model="ff", baseline="lstm", metric=metric))
    assert (len(better), len(worse)) == (8, 8)


def test_cli_writes_table_csv_and_chart(tmp_path, capsys):
    out = tmp_path / "fig1"
    assert cli.main(["compare", "--paper", "table9", "--model", "RDN", "--baseline", "LT", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "RDN vs LT after 50M env steps on 20 games" in text and "worse on 2 (Alien, Seaquest)" in text
    rows = list(csv.DictReader(open(f"{out}.csv")))
    assert len(rows) == 20
    by_game = {r["game"]: r for r in rows}
    assert float(by_game["Gopher"]["rdn_mean"]) == 19775 and float(by_game["Gopher"]["lt_std"]) == 1720
    assert float(by_game["Alien"]["relative_improvement_pct"]) == pytest.approx(-17.845, abs=1e-3)
    assert by_game["Alien"]["metric"] == "relative"
    assert by_game["Seaquest"]["verdict"] == "worse"
    png = (tmp_path / "fig1.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert not list(tmp_path.glob(".tmp-*"))  # atomic writes leave nothing behind


def test_table_only_without_model(tmp_path, capsys):
    assert cli.main(["compare", "--paper", "table3", "--out", str(tmp_path / "t3")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "t3.csv")))
    assert [r["game"] for r in rows] == ["BattleZone", "Berzerk", "Gopher", "Seaquest"]
    assert float(rows[0]["rdn_large_mean"]) == 28273
    assert not (tmp_path / "t3.png").exists()


def _fake_eval(directory, game, model, steps, scores, mode="greedy"):
    import numpy as np

    means = [float(np.mean(s)) for s in scores]
    rec = {
        "game": game,
        "env": f"ALE/{game}-v5",
        "model": model,
        "core": model,
        "steps": steps,
        "mode": mode,
        "noneg": False,
        "episodes": len(scores[0]),
        "repeats": len(scores),
        "scores": scores,
        "mean": float(np.mean(means)),
        "std": float(np.std(means)),
        "repeat_means": means,
    }
    return write_eval(rec, directory)


def test_runs_compare_against_each_other_and_the_paper(tmp_path):
    for seed, bonus in ((1, 0.0), (2, 2.0)):
        _fake_eval(tmp_path / f"pong_rdn_s{seed}", "Pong", "rdn", 50_000_000, [[10 + bonus] * 3] * 5)
        _fake_eval(tmp_path / f"pong_lstm_s{seed}", "Pong", "lstm", 50_100_000, [[5.0] * 3] * 5)
    _fake_eval(tmp_path / "pong_rdn_s1", "Pong", "rdn", 20_000_000, [[-21.0] * 3] * 5)  # earlier snapshot
    _fake_eval(tmp_path / "pong_rdn_s1", "Pong", "rdn", 50_000_000, [[99.0] * 3] * 5, mode="sample")
    assert len(load_runs([tmp_path])) == 6

    c = compare(runs=[tmp_path], model="rdn", baseline="lstm", steps="50M")
    assert c.games == ["Pong"]
    rdn = c.cells["Pong"]["rdn"]
    assert rdn.mean == pytest.approx(11.0) and rdn.std == pytest.approx(1.0)  # 2 seeds: mean, std across seeds
    assert c.rel["Pong"] == pytest.approx(120.0)
    # without --steps: the latest eval of each run
    assert compare(runs=[tmp_path], model="rdn", baseline="lstm").cells["Pong"]["rdn"].mean == pytest.approx(11.0)
    # sampled evals are kept apart from greedy ones
    sampled = compare(runs=[tmp_path], steps="50M", mode="sample")
    assert sampled.columns == ["rdn"] and sampled.cells["Pong"]["rdn"].mean == 99.0
    with pytest.raises(UserError, match="--baseline .lstm. has no scores here; allowed: rdn"):
        compare(runs=[tmp_path], model="rdn", baseline="lstm", steps="50M", mode="sample")

    # against the paper: the name is in both sources -> must be qualified
    with pytest.raises(UserError, match="in both the paper and the runs"):
        compare(paper="table9", runs=[tmp_path], model="rdn", baseline="lstm")
    c = compare(paper="table9", runs=[tmp_path], model="run:rdn", baseline="paper:rdn")
    assert c.games == ["Pong"] and c.rel["Pong"] == pytest.approx(100 * (11 - 21) / 21)
    # a run's earlier eval next to the paper's 50M scores
    c = compare(paper="table9", runs=[tmp_path], model="run:rdn", baseline="paper:rdn", run_steps="20M")
    assert c.steps == 50_000_000 and c.cells["Pong"]["run:rdn"].mean == -21.0
    assert c.rel["Pong"] == pytest.approx(-200.0)
    assert "run:RDN@20M vs paper:RDN after 50M env steps on 1 game:" in summary(c)
    assert to_csv(c).splitlines()[1].startswith("Pong,Pong,-21,0,20000000,21,0,50000000,")


def test_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="did you mean 'rdn'"):
        compare(paper="table9", model="rnd", baseline="lt")
    with pytest.raises(UserError, match="pick one with --steps"):
        compare(paper="all", model="rdn", baseline="lt")
    with pytest.raises(UserError, match="no scores at 100M"):
        compare(paper="table9", steps="100M")
    with pytest.raises(UserError, match="both --model and --baseline"):
        compare(paper="table9", model="rdn")
    with pytest.raises(UserError, match="no eval results"):
        compare(runs=[tmp_path])
    binary = tmp_path / "eval_000000001000_greedy.json"
    binary.write_bytes(b"\x80\xbd not text")
    with pytest.raises(UserError, match=r"^eval JSON '.*eval_000000001000_greedy.json' is not a text file"):
        compare(runs=[binary], model="rdn", baseline="lt")
    binary.rename(tmp_path / "eval_000000001000_greedy.csv")
    with pytest.raises(UserError, match=r"^score table '.*' is not a text file"):
        compare(runs=[tmp_path], model="rdn", baseline="lt")
    assert (
        cli.main(["compare", "--paper", "table9", "--model", "rdn", "--baseline", "xyz", "--out", str(tmp_path / "x")])
        == 2
    )
