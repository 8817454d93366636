"""The extended comparison (rfwp_rl/memory/comparison.py, launch/memory_comparison.sh): its envs, the reference
returns of popgym's and MiniGrid's envs checked against their source (an always-right and an always-wrong
policy; a breadth-first search over MemoryS7's moves and view), its tables, and the launcher's plan."""

from __future__ import annotations

import collections
import csv
import json
import math
import os
import subprocess
from pathlib import Path

import gymnasium
import pytest

from rfwp_rl import cli
from rfwp_rl.errors import UserError
from rfwp_rl.memory import comparison, results, suite
from rfwp_rl.memory.health import agent_cores
from test_memory_results import fake_run

ROOT = Path(__file__).resolve().parent.parent
POPGYM = {
    task: f"popgym:popgym-{task}Easy-v0" for task in ("RepeatFirst", "RepeatPrevious", "CountRecall", "Autoencode")
}
MEMORY_S7 = "minigrid:MiniGrid-MemoryS7-v0"


def test_the_envs_are_the_suites_easy_and_medium_ids_then_popgym_then_minigrid():
    assert comparison.ENVS == (
        *suite.suite_ids("easy"),
        *suite.suite_ids("medium"),
        *POPGYM.values(),
        MEMORY_S7,
    )
    assert len(comparison.ENVS) == 17  # the count launch/memory_comparison.sh's header gives
    assert not set(comparison.ENVS) & set(suite.CONTROL)  # the position-only cart-pole is not a suite id
    assert results.COMPARISON.envs == comparison.ENVS
    assert results.COMPARISON.levels == ("easy", "medium", "S7")
    assert results.COMPARISON.aggregate_level == "all"
    assert comparison.describe(POPGYM["RepeatPrevious"]) == ("popgym RepeatPrevious", "easy")
    assert comparison.describe("rfwp/RepeatPrevious-easy-v0") == ("RepeatPrevious", "easy")
    assert comparison.describe(MEMORY_S7) == ("MiniGrid Memory", "S7")
    with pytest.raises(UserError, match="unknown comparison env 'rfwp/CueGrid-hard-v0'"):
        comparison.describe("rfwp/CueGrid-hard-v0")


@pytest.mark.parametrize("env", [*POPGYM.values(), MEMORY_S7])
def test_the_references_normalise_to_0_and_1(env):
    ref = comparison.EXTERNAL[env]
    assert comparison.normalized_return(env, ref.random_return) == pytest.approx(0.0, abs=1e-12)
    assert comparison.normalized_return(env, ref.optimal_return) == pytest.approx(1.0)
    assert results.COMPARISON.normalize(env, ref.optimal_return) == pytest.approx(1.0)


def test_the_derived_reference_numbers():
    """The rules of comparison.py give these numbers (the derivations are the comments there)."""
    random = {task: comparison.EXTERNAL[env].random_return for task, env in POPGYM.items()}
    assert random == pytest.approx(
        {"RepeatFirst": -0.5, "RepeatPrevious": -0.5, "CountRecall": -25 / 27, "Autoencode": -0.5}
    )
    assert all(comparison.EXTERNAL[env].optimal_return == 1.0 for env in POPGYM.values())
    assert [comparison.memory_s7_shortest_success(x) for x in comparison.MEMORY_S7_STARTS] == [6, 7, 6, 5]
    s7 = comparison.EXTERNAL[MEMORY_S7]
    assert s7.random_return == 0.0 and s7.optimal_return == pytest.approx(1 - 0.9 * 6 / 245)
    # the suite's ids keep the suite's references
    assert comparison.normalized_return("rfwp/CueGrid-medium-v0", 0.5) == suite.normalized_return(
        "rfwp/CueGrid-medium-v0", 0.5
    )


def _popgym_right_action(env) -> int:
    """The action the installed popgym env scores +, read from its state (None: the step scores nothing)."""
    name = type(env).__name__
    if name == "RepeatFirstEasy":
        return int(env.card)
    if name == "RepeatPreviousEasy":
        hand = env.deck["player"]
        return int(env.deck.suits_idx[hand[-env.k]]) if len(hand) >= env.k else None
    if name == "CountRecallEasy":
        return int(env.counts[env.query])
    if name == "AutoencodeEasy":
        return int(env.deck.suits_idx[env.deck["system"][-1]]) if env.mode == 0 else None  # Mode.PLAY
    raise AssertionError(name)


@pytest.mark.parametrize("task", sorted(POPGYM))
def test_popgym_optimal_is_1_and_random_is_the_guessing_return(task):
    """Always right: return 1; always wrong: -1; every scored step has one right action of n: a uniform
    random policy expects (1/n) * 1 + (1 - 1/n) * (-1) = 2/n - 1, the reference."""
    pytest.importorskip("popgym")
    env_id = POPGYM[task].partition(":")[2]
    ref = comparison.EXTERNAL[POPGYM[task]]
    returns, lengths = [], []
    for wrong in (False, True):
        env = gymnasium.make(env_id).unwrapped
        assert type(env).__name__ == f"{task}Easy"
        n = int(env.action_space.n)
        env.reset(seed=wrong)
        total, steps, done = 0.0, 0, False
        while not done:
            right = _popgym_right_action(env)
            action = 0 if right is None else (right + 1) % n if wrong else right
            _, reward, terminated, truncated, _ = env.step(action)
            assert right is not None or reward == 0
            total, steps, done = total + reward, steps + 1, terminated or truncated
        returns.append(total)
        lengths.append(steps)
    assert returns == pytest.approx([1.0, -1.0])
    assert ref.optimal_return == pytest.approx(returns[0]) and ref.random_return == pytest.approx(2 / n - 1)
    assert lengths[0] == lengths[1] == {"Autoencode": 103}.get(task, 51)


def _shortest_success(env) -> float:
    """Breadth-first search over (position, direction, cue seen, an end object seen) with the env's own walls and
    field of view, from its state after a reset: the fewest steps that end on the goal cell with both seen."""
    from minigrid.core.constants import DIR_TO_VEC

    mid, end_x = env.height // 2, comparison.MEMORY_S7_HALLWAY_END + 1
    cue, ends = (1, mid - 1), ((end_x, mid - 2), (end_x, mid + 2))  # the start room's object, the end objects
    goal, other = tuple(env.success_pos), tuple(env.failure_pos)

    def seen(pos, direction, cell) -> bool:
        env.agent_pos, env.agent_dir = pos, direction
        _, visible = env.gen_obs_grid()
        rel = env.relative_coords(*cell)
        return rel is not None and bool(visible[rel[0], rel[1]])

    def state(pos, d, knows_cue=False, knows_end=False):
        return pos, d, knows_cue or seen(pos, d, cue), knows_end or any(seen(pos, d, e) for e in ends)

    first = state((int(env.agent_pos[0]), int(env.agent_pos[1])), int(env.agent_dir))
    dist, queue, best = {first: 0}, collections.deque([first]), math.inf
    while queue:
        now = queue.popleft()
        pos, d, knows_cue, knows_end = now
        if dist[now] + 1 >= best:
            continue
        for turn in (-1, 1, 0):  # left, right, forward
            if turn:
                nxt, nd = pos, (d + turn) % 4
            else:
                ahead = (pos[0] + int(DIR_TO_VEC[d][0]), pos[1] + int(DIR_TO_VEC[d][1]))
                cell = env.grid.get(*ahead)
                nxt, nd = (ahead if cell is None or cell.can_overlap() else pos), d
            if nxt == goal and knows_cue and knows_end:
                best = dist[now] + 1
            elif nxt not in (goal, other):  # stepping on either goal cell ends the episode
                s = state(nxt, nd, knows_cue, knows_end)
                if s not in dist:
                    dist[s] = dist[now] + 1
                    queue.append(s)
    return best


def test_memory_s7_shortest_successes_match_the_installed_env():
    pytest.importorskip("minigrid")
    env = gymnasium.make(MEMORY_S7.partition(":")[2]).unwrapped
    assert (env.width, env.max_steps) == (comparison.MEMORY_S7_SIZE, comparison.MEMORY_S7_MAX_STEPS)
    found: dict[int, float] = {}
    for seed in range(40):  # until every start column has come up
        env.reset(seed=seed)
        start_x = int(env.agent_pos[0])
        if start_x not in found:
            found[start_x] = _shortest_success(env)  # moves env.agent_pos
    assert found == {x: comparison.memory_s7_shortest_success(x) for x in comparison.MEMORY_S7_STARTS}


def test_memory_results_bench_comparison_writes_the_tables(tmp_path):
    runs = tmp_path / "runs"
    easy, medium = "rfwp/DelayedRecall-easy-v0", "rfwp/DelayedRecall-medium-v0"
    fake_run(runs, "lstm", 1, [0.25, 1.0], env=easy, minutes=3.0)  # normalised 1
    fake_run(runs, "lstm", 1, [0.125], env=medium)  # normalised 0
    fake_run(runs, "lstm", 1, [-0.5, 0.25], env=POPGYM["RepeatFirst"], minutes=7.5)  # (0.25 + 0.5) / 1.5 = 0.5
    fake_run(runs, "rdn", 1, [0.0], env=MEMORY_S7)  # no success: 0
    fake_run(runs, "rdn", 1, [0.5], env="rfwp/DelayedRecall-hard-v0")  # not an env of the comparison
    out = tmp_path / "out"
    assert (
        cli.main(
            [
                "memory-results",
                "--bench",
                "comparison",
                "--runs",
                str(runs),
                "--out",
                str(out),
                "--bootstrap-reps",
                "200",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader((out / "runs.csv").open()))
    assert [(r["env"], r["core"]) for r in rows] == [
        (easy, "lstm"),
        (medium, "lstm"),
        (POPGYM["RepeatFirst"], "lstm"),
        (MEMORY_S7, "rdn"),
    ]
    assert [float(r["normalized"]) for r in rows] == pytest.approx([1.0, 0.0, 0.5, 0.0], abs=1e-4)
    assert [float(r["minutes"]) for r in rows[::2]] == [3.0, 7.5]  # each run's wall-clock minutes
    assert rows[2]["task"] == "popgym RepeatFirst" and rows[3]["level"] == "S7"
    agg = list(csv.DictReader((out / "aggregate.csv").open()))
    assert [(a["level"], a["core"], a["tasks"]) for a in agg] == [("all", "lstm", "3"), ("all", "rdn", "1")]
    readme = (out / "README.md").read_text()
    assert readme.startswith("# Memory cores: the extended comparison")
    assert "| popgym RepeatFirst (easy) | 0.50 (1) |" in readme and "| MiniGrid Memory (S7) |  | 0.00 (1) |" in readme
    assert (out / "performance_profile.png").is_file() and (out / "curves.png").is_file()
    # a level of the comparison; a level it does not have is a one-line error
    s7_only = ["--aggregate-level", "S7", "--bootstrap-reps", "10"]
    assert cli.main(["memory-results", "--bench", "comparison", "--runs", str(runs), "--out", str(out), *s7_only]) == 0
    assert [a["core"] for a in csv.DictReader((out / "aggregate.csv").open())] == ["rdn"]
    with pytest.raises(UserError, match="unknown aggregate level 'hard'; .*allowed: S7, all, easy, medium$"):
        results.write_results(runs, out, "hard", 10, results.COMPARISON)
    # the suite reads only its own envs: the default bench is unchanged
    summary, _ = results.write_results(runs, tmp_path / "suite", reps=10)
    assert {r["env"] for r in summary} == {easy, medium, "rfwp/DelayedRecall-hard-v0"}


def test_no_comparison_runs_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match="no comparison runs under"):
        results.write_results(tmp_path, tmp_path / "out", bench=results.COMPARISON)


def _launch(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "launch/memory_comparison.sh"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_launcher_parses_and_plans_every_core_on_every_env_seed_1_first(tmp_path):
    for script in ("launch/memory_comparison.sh", "launch/memory_suite.sh"):
        subprocess.run(["bash", "-n", script], cwd=ROOT, check=True)
    done = _launch({"DRY": "1", "RUNS": str(tmp_path / "runs")})
    assert done.returncode == 0, done.stderr
    *plan, summary = done.stdout.splitlines()
    cores = agent_cores()
    runs = [line.split() for line in plan]
    assert len(runs) == len(comparison.ENVS) * len(cores) * 3
    assert {(env, core) for env, core, _ in runs} == {(env, core) for env in comparison.ENVS for core in cores}
    assert [seed for _, _, seed in runs] == sorted(seed for _, _, seed in runs)  # seed 1 of everything first
    assert runs[0][0] == suite.suite_ids("easy")[0] and runs[len(runs) // 3 - 1][0] == MEMORY_S7
    assert summary.startswith(f"# {len(runs)} runs of 1000000 env steps") and "--bench comparison" in summary
    assert not (tmp_path / "runs").exists()  # a dry listing trains nothing


def test_the_launcher_stops_at_a_missing_env_package(tmp_path):
    done = _launch({"IDS": "no_such_env_package_rfwp:Thing-v0", "CORES": "ff", "RUNS": str(tmp_path / "runs")})
    assert done.returncode == 2 and "no_such_env_package_rfwp is not installed" in done.stderr
    assert "pip install '.[envs]'" in done.stderr and not (tmp_path / "runs").exists()


def test_the_launcher_skips_a_run_with_a_record(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    env = "rfwp/DelayedRecall-easy-v0"
    fake_run(runs, "lstm", 1, [0.25, 1.0])
    results.write_results(runs, out, reps=10, bench=results.COMPARISON)
    done = _launch(
        {"IDS": env, "CORES": "lstm", "SEEDS": "1", "STEPS": "2000", "RUNS": str(tmp_path / "fresh"), "OUT": str(out)}
    )
    assert done.returncode == 0, done.stderr
    assert f"kept    1/1 {env} lstm seed 1 ({out}/records/rfwp-DelayedRecall-easy-v0/lstm_s1.json)" in done.stdout
    assert not (tmp_path / "fresh" / "rfwp-DelayedRecall-easy-v0").exists()  # nothing trained
    assert "| DelayedRecall (easy) | 1.00 (1) |" in (out / "README.md").read_text()  # the tables from the record
    # a record of fewer env steps than asked (STEPS raised) does not keep its run from training on
    record = out / "records" / "rfwp-DelayedRecall-easy-v0" / "lstm_s1.json"
    for script in ("launch/memory_suite.sh", "launch/minatar.sh"):
        assert "source launch/records.sh" in (ROOT / script).read_text()
    kept = 'source launch/records.sh; kept "$0" && echo kept || echo trains'
    for steps, answer in ((2000, "kept"), (1999, "kept"), (2001, "trains")):
        done = subprocess.run(
            ["bash", "-c", kept, str(record)],
            cwd=ROOT,
            env={**os.environ, "STEPS": str(steps)},
            capture_output=True,
            text=True,
        )
        assert done.stdout.strip() == answer, (steps, done.stderr)


@pytest.mark.slow
def test_the_launcher_trains_and_writes_each_runs_record_as_it_finishes(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    env = "rfwp/DelayedRecall-easy-v0"
    done = _launch({"IDS": env, "CORES": "ff", "SEEDS": "1", "STEPS": "3000", "RUNS": str(runs), "OUT": str(out)})
    assert done.returncode == 0, done.stderr
    assert f"done    1/1 {env} ff seed 1 (0 min)" in done.stdout  # printed once the run's record is written
    assert (out / "records" / "rfwp-DelayedRecall-easy-v0" / "ff_s1.json").is_file()
    # a run stopped before its budget (SIGTERM) gets no record, and its line says so
    going = fake_run(runs, "gru", 1, [0.25])
    config = json.loads((going / "config.json").read_text())
    (going / "config.json").write_text(json.dumps({**config, "total_steps": 9000}))
    recorded = 'source launch/records.sh; recorded "gru seed 1" "$0" memory-results --bench comparison'
    done = subprocess.run(
        ["bash", "-c", recorded, str(going)],
        cwd=ROOT,
        env={**os.environ, "RUNS": str(runs), "OUT": str(out)},
        capture_output=True,
        text=True,
    )
    assert done.stdout.startswith("stopped gru seed 1 (no record: why in "), done.stdout + done.stderr
    assert not (out / "records" / "rfwp-DelayedRecall-easy-v0" / "gru_s1.json").exists()
    assert "is not finished (1,000 of 9,000 env steps)" in Path(f"{going}.log").read_text()
