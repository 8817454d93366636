"""IMPALA actor-learner: rollout invariants, tiny end-to-end runs for every core, resume, errors."""

import sys

import pytest
import torch

from procs import finite  # tests/procs.py
from rfwp_rl import cli
from rfwp_rl.agent import Agent
from rfwp_rl.checkpoint import list_checkpoints, read_checkpoint
from rfwp_rl.errors import UserError
from rfwp_rl.impala import learner
from rfwp_rl.impala.actors import Actors, Rollout, RolloutQueue
from rfwp_rl.impala.env_batches import LocalEnvPool, import_moolib
from rfwp_rl.impala.loss import compute_loss, loss_config

CORES = ["ff", "lstm", "gru", "lt", "delta", "delta_rnn", "rdn", "fwm"]
# Tiny cores so that every end-to-end run takes about a second.
TINY = {
    "lstm": ["core_config.hidden_size=16"],
    "gru": ["core_config.hidden_size=16"],
    "fwm": ["core_config.hidden_size=16", "core_config.memory_size=4", "core_config.num_reads=2"],
    "ff": [],
}
FW_TINY = [
    "core_config.hidden_size=16",
    "core_config.num_layers=1",
    "core_config.num_heads=2",
    "core_config.ff_size=32",
]
pytestmark = pytest.mark.usefixtures("one_thread")


def train(tmp_path, env, core, steps, *extra, name="run"):
    overrides = []
    for item in TINY.get(core, FW_TINY):
        overrides += ["--set", item]
    argv = [
        "train",
        "--env",
        env,
        "--core",
        core,
        "--env-backend",
        "local",
        "--num-actors",
        "4",
        "--unroll-length",
        "5",
        "--batch-size",
        "2",
        "--total-steps",
        str(steps),
        "--run-dir",
        str(tmp_path / name),
        "--log-every",
        "0.5",
        *overrides,
        *extra,
    ]
    return cli.main(argv)


@pytest.mark.parametrize("core", ["lstm", "gru", "rdn", "delta_rnn"])
def test_rollouts_chain_and_replay_on_policy(core):
    """Rollout k+1 starts with rollout k's last entry and the state before it; re-running the
    agent over a rollout from its state reproduces the behaviour logits (so V-trace sees
    ratio 1 before any update), with episode resets inside the rollouts."""
    torch.manual_seed(0)
    overrides = dict(item.split("=") for item in (TINY.get(core) or FW_TINY))
    config = {k.split(".")[1]: int(v) for k, v in overrides.items()}
    agent = Agent((4,), 2, core, config)
    pool = LocalEnvPool("CartPole-v1", {}, seed=3, batch_size=3, num_batches=2)
    actors = Actors(pool, agent, num_envs=6, num_batches=2, unroll_length=8)
    by_batch: dict[int, list[Rollout]] = {0: [], 1: []}
    episodes = []
    for _ in range(2 * 8 * 6):  # 6 rollouts per batch
        batch_index = actors.next_batch
        rollouts, ended = actors.step()
        episodes += ended
        by_batch[batch_index] += rollouts
    pool.close()
    assert actors.env_steps == 2 * 8 * 6 * 3
    assert len(by_batch[0]) == len(by_batch[1]) == 5  # 1 + 8k steps make k rollouts
    assert episodes and all(length > 0 and ret == length for ret, length in episodes)  # CartPole: +1 per step
    saw_reset = False
    for rollouts in by_batch.values():
        for prev, cur in zip(rollouts, rollouts[1:]):
            for key in prev.data:
                assert torch.equal(prev.data[key][-1], cur.data[key][0]), key
        for r in rollouts:
            assert r.data["obs"].shape == (9, 3, 4) and r.data["behaviour_log_prob"].shape == (9, 3)
            saw_reset |= bool(r.data["done"][1:].any())
            with torch.no_grad():
                out, _ = agent(
                    r.data["obs"], r.data["reward"], r.data["done"], r.state, prev_action=r.data["prev_action"]
                )
            log_mu = torch.log_softmax(out["policy_params"], -1).gather(-1, r.data["action"][..., None])[..., 0]
            torch.testing.assert_close(log_mu, r.data["behaviour_log_prob"], rtol=1e-5, atol=1e-5)
            # prev_action[t] is action[t-1] inside a rollout
            assert torch.equal(r.data["prev_action"][1:], r.data["action"][:-1])
    assert saw_reset


def test_rollout_queue_makes_exact_batches():
    q = RolloutQueue(batch_size=4)

    def rollout(b, start):
        data = {
            k: torch.arange(start, start + b).repeat(3, 1)
            for k in ("obs", "reward", "done", "prev_action", "action", "behaviour_log_prob")
        }
        return Rollout(data, (torch.arange(start, start + b),))

    q.put(rollout(3, 0))
    assert not q.ready()
    q.put(rollout(3, 10))
    batch = q.get()
    assert batch.data["obs"].shape == (3, 4)
    assert batch.data["obs"][0].tolist() == [0, 1, 2, 10] and batch.state[0].tolist() == [0, 1, 2, 10]
    assert q.size == 2 and not q.ready()
    q.put(rollout(2, 20))
    assert q.get().state[0].tolist() == [11, 12, 20, 21]


def test_loss_is_on_policy_actor_critic_when_ratios_are_one():
    """With behaviour == target policy the policy loss is -sum log pi(a) * (r + gamma v' - V)."""
    torch.manual_seed(1)
    agent = Agent((3,), 2, "ff")
    T, B = 4, 2
    batch = {
        "obs": torch.randn(T + 1, B, 3),
        "reward": torch.randn(T + 1, B),
        "done": torch.zeros(T + 1, B, dtype=torch.bool),
        "prev_action": torch.zeros(T + 1, B, dtype=torch.long),
        "action": torch.randint(2, (T + 1, B)),
    }
    with torch.no_grad():
        out, _ = agent(batch["obs"], batch["reward"], batch["done"], ())
    batch["behaviour_log_prob"] = torch.log_softmax(out["policy_params"], -1).gather(-1, batch["action"][..., None])[
        ..., 0
    ]
    cfg = loss_config(reward_clip=0.0)
    loss, stats = compute_loss(agent, batch, (), cfg)
    v = out["baseline"]
    vs = torch.zeros(T, B)
    acc = v[-1]
    for t in reversed(range(T)):
        acc = batch["reward"][t + 1] + cfg.discount * acc
        vs[t] = acc
    vs_next = torch.cat([vs[1:], v[-1:]])
    adv = batch["reward"][1:] + cfg.discount * vs_next - v[:-1]
    logp = torch.log_softmax(out["policy_params"][:-1], -1).gather(-1, batch["action"][:-1, :, None])[..., 0]
    assert stats["loss/policy"] == pytest.approx(float(-(logp * adv).sum()), rel=1e-5)
    assert stats["loss/baseline"] == pytest.approx(float(0.25 * ((vs - v[:-1]) ** 2).sum()), rel=1e-5)
    assert stats["learner/mean_rho"] == pytest.approx(1.0)


@pytest.mark.parametrize("core", CORES)
def test_tiny_cartpole_run_every_core(tmp_path, core):
    assert train(tmp_path, "CartPole-v1", core, 60) == 0
    ckpt = read_checkpoint(list_checkpoints(tmp_path / "run")[0])
    assert ckpt["step"] == 60 and ckpt["meta"]["core"] == core and ckpt["meta"]["num_actions"] == 2
    assert ckpt["state"]["counters"]["updates"] == 6
    # fewer episodes than the best window: no best yet, and nothing infinite in the learner's state
    assert ckpt["state"]["counters"]["best_return"] is None and finite(ckpt["state"])
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("core", CORES)
def test_tiny_pong_run_every_core(tmp_path, core):
    assert train(tmp_path, "Pong", core, 20) == 0
    ckpt = read_checkpoint(list_checkpoints(tmp_path / "run")[0])
    assert ckpt["step"] == 20 and ckpt["meta"]["obs_shape"] == [4, 84, 84] and ckpt["meta"]["num_actions"] == 6
    assert ckpt["meta"]["env"] == "ALE/Pong-v5"
    agent = Agent(ckpt["meta"]["obs_shape"], 6, core, ckpt["meta"]["core_config"], ckpt["meta"]["agent"])
    agent.load_state_dict(ckpt["state"]["agent"])  # the checkpoint rebuilds the agent from its meta
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


def test_resume_continues_and_mismatches_are_one_line_errors(tmp_path, capsys):
    assert train(tmp_path, "CartPole-v1", "lstm", 40, "--snapshot-steps", "20,1000") == 0
    first = read_checkpoint(list_checkpoints(tmp_path / "run")[0])
    snapshots = sorted(p.name for p in (tmp_path / "run").glob("snapshot_*.pt"))
    assert snapshots == ["snapshot_000000000020.pt"]
    assert read_checkpoint(tmp_path / "run" / snapshots[0])["state"]["counters"]["step"] == 20
    assert train(tmp_path, "CartPole-v1", "lstm", 80) == 0
    out = capsys.readouterr().out
    assert "from step 40" in out
    ckpts = list_checkpoints(tmp_path / "run")
    last = read_checkpoint(ckpts[0])
    assert last["step"] == 80 and last["state"]["counters"]["updates"] == 8
    assert [p.name for p in ckpts] == ["ckpt_000000000080.pt", "ckpt_000000000040.pt"]
    assert last["state"]["scheduler"]["last_epoch"] == 8  # LR schedule continued
    assert not torch.equal(first["state"]["agent"]["policy.weight"], last["state"]["agent"]["policy.weight"])
    # the same command again: nothing to do
    assert train(tmp_path, "CartPole-v1", "lstm", 80) == 0
    assert "nothing to do" in capsys.readouterr().out

    assert train(tmp_path, "CartPole-v1", "rdn", 120) == 2  # another core in the same run dir
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: checkpoint") and "core: checkpoint has 'lstm', this run has 'rdn'" in err
    assert "\n" not in err

    assert train(tmp_path, "Pong", "lstm", 20, name="pong") == 0
    assert train(tmp_path, "Pong", "lstm", 40, "--env-option", "full_action_space=true", name="pong") == 2
    err = capsys.readouterr().err.strip()
    assert "does not match this run" in err and "full_action_space" in err and "\n" not in err


def test_a_resume_keeps_the_runs_own_settings_where_the_command_line_gives_none(tmp_path, capsys):
    assert train(tmp_path, "CartPole-v1", "lstm", 40, "--no-normalize-returns", "--entropy-cost", "0.02") == 0
    capsys.readouterr()
    assert train(tmp_path, "CartPole-v1", "lstm", 80) == 0  # the vector profile's defaults differ from both
    out = capsys.readouterr().out
    assert "the run's own settings where the command line gives none: entropy_cost 0.02 (the profile's: 0.03)" in out
    assert "normalize_returns False (the profile's: True)" in out
    config = read_checkpoint(list_checkpoints(tmp_path / "run")[0])["state"]["config"]
    assert (config["normalize_returns"], config["entropy_cost"]) == (False, 0.02)
    assert train(tmp_path, "CartPole-v1", "lstm", 120, "--normalize-returns") == 0  # the command line wins
    config = read_checkpoint(list_checkpoints(tmp_path / "run")[0])["state"]["config"]
    assert (config["normalize_returns"], config["entropy_cost"]) == (True, 0.02)
    (tmp_path / "run" / "config.json").write_text('{"entropy_cost": "high"}')
    assert train(tmp_path, "CartPole-v1", "lstm", 160) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("config.json: entropy_cost is 'high'; allowed: a float") and "\n" not in err
    (tmp_path / "run" / "config.json").write_text("{not json")
    assert train(tmp_path, "CartPole-v1", "lstm", 160) == 2
    assert "not the run's config" in capsys.readouterr().err


def test_cli_errors(tmp_path, capsys):
    assert train(tmp_path, "Pongg", "lstm", 10) == 2
    err = capsys.readouterr().err
    assert "unknown environment 'Pongg'" in err and "'Pong'" in err
    assert train(tmp_path, "CartPole-v1", "rdnn", 10) == 2
    assert "unknown core 'rdnn'" in capsys.readouterr().err
    assert train(tmp_path, "CartPole-v1", "rdn", 10, "--set", "core_config.hiden_size=8") == 2
    assert "unknown config key 'hiden_size'" in capsys.readouterr().err
    assert (
        cli.main(
            [
                "train",
                "--env",
                "CartPole-v1",
                "--num-actors",
                "5",
                "--env-backend",
                "local",
                "--run-dir",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "multiple of --num-env-batches" in capsys.readouterr().err
    assert train(tmp_path, "CartPole-v1", "ff", 10, "--detach-state-every-step") == 2
    assert "core 'ff' has no recurrent state" in capsys.readouterr().err
    assert train(tmp_path, "CartPole-v1", "lstm", 10, "--device", "gpu") == 2
    assert "--device 'gpu' is invalid" in capsys.readouterr().err


def test_missing_moolib_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "moolib", None)
    with pytest.raises(UserError, match="moolib is not installed.*scripts/setup.sh.*--env-backend local"):
        import_moolib()


MOOLIB_SCRIPT = """
import sys
from rfwp_rl import cli
from rfwp_rl.errors import UserError
from rfwp_rl.impala.env_batches import make_env_pool
code = cli.main(sys.argv[1:])
print("exit", code, flush=True)
try:  # moolib aborts the process on a second EnvPool fork: we raise a one-line error instead
    make_env_pool("moolib", "CartPole-v1", {}, 0, 2, 2, 1)
except UserError as e:
    print("second pool:", e, flush=True)
"""


@pytest.mark.moolib
@pytest.mark.slow
@pytest.mark.parametrize("env", ["Pong"])
def test_tiny_run_with_moolib_envpool(tmp_path, env):
    """The default backend: envs in moolib EnvPool worker processes (in a subprocess: moolib allows
    one EnvPool per process, and a second one in the pytest process would abort it)."""
    import subprocess

    argv = [
        "train",
        "--env",
        env,
        "--core",
        "lstm",
        "--set",
        "core_config.hidden_size=16",
        "--num-actors",
        "4",
        "--num-env-processes",
        "2",
        "--unroll-length",
        "5",
        "--batch-size",
        "2",
        "--total-steps",
        "60",
        "--run-dir",
        str(tmp_path / "m"),
    ]
    proc = subprocess.run([sys.executable, "-c", MOOLIB_SCRIPT, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "exit 0" in proc.stdout and "[moolib]" in proc.stdout
    assert "second pool: moolib allows one EnvPool per process" in proc.stdout
    ckpt = read_checkpoint(list_checkpoints(tmp_path / "m")[0])
    assert ckpt["step"] == 60 and ckpt["state"]["counters"]["actor_steps"] >= 60


def test_learner_thread_run_and_resume(tmp_path, capsys):
    assert train(tmp_path, "CartPole-v1", "rdn", 60, "--learner-thread") == 0
    ckpt = read_checkpoint(list_checkpoints(tmp_path / "run")[0])
    assert ckpt["step"] == 60 and ckpt["state"]["counters"]["updates"] == 6
    assert train(tmp_path, "CartPole-v1", "rdn", 100, "--learner-thread") == 0
    out = capsys.readouterr().out
    assert "from step 60" in out and "learning in its own thread" in out
    assert read_checkpoint(list_checkpoints(tmp_path / "run")[0])["step"] == 100
    assert train(tmp_path, "CartPole-v1", "rdn", 140, "--no-learner-thread") == 0  # on a CPU, the default
    assert "learning in its own thread" not in capsys.readouterr().out
    assert read_checkpoint(list_checkpoints(tmp_path / "run")[0])["step"] == 140


def test_non_finite_update_is_skipped():
    from rfwp_rl.impala.config import ImpalaConfig

    torch.manual_seed(0)
    agent = Agent((3,), 2, "ff")
    T1, B = 4, 2
    batch = {
        "obs": torch.randn(T1, B, 3),
        "reward": torch.randn(T1, B),
        "done": torch.zeros(T1, B, dtype=torch.bool),
        "prev_action": torch.zeros(T1, B, dtype=torch.long),
        "action": torch.randint(2, (T1, B)),
        "behaviour_log_prob": torch.randn(T1, B),
    }
    batch["obs"][2, 1, 0] = float("nan")
    # the training path of a single learner: Learner.update; 6 of 600 env steps per update
    lrn = learner.Learner(agent, ImpalaConfig(total_steps=600, batch_size=B, unroll_length=T1 - 1, max_nonfinite=5))
    before = [p.detach().clone() for p in agent.parameters()]
    lrn.update(Rollout(batch, ()))
    stats = lrn.learned.get()[1]
    assert stats["learner/skipped"] == 1.0 and lrn.guard.skipped == 1
    assert all(torch.equal(a, b) for a, b in zip(before, agent.parameters()))
    assert lrn.scheduler.get_last_lr()[0] == pytest.approx(6e-4 * 0.99)  # the schedule still advanced


def test_a_single_learner_steps_at_once_and_clears_the_gradients():
    """Learner.update: one optimizer step per batch with the batch's env steps and its loss stats, the
    gradients cleared; a later epoch on the same batch is an update that counts no env steps."""
    from rfwp_rl.impala.config import ImpalaConfig

    torch.manual_seed(0)
    agent = Agent((3,), 2, "ff")
    T1, B = 4, 2
    batch = {
        "obs": torch.randn(T1, B, 3),
        "reward": torch.randn(T1, B),
        "done": torch.zeros(T1, B, dtype=torch.bool),
        "prev_action": torch.zeros(T1, B, dtype=torch.long),
        "action": torch.randint(2, (T1, B)),
        "behaviour_log_prob": torch.randn(T1, B),
    }
    lrn = learner.Learner(agent, ImpalaConfig(total_steps=600, batch_size=B, unroll_length=T1 - 1))
    before = [p.detach().clone() for p in agent.parameters()]
    lrn.update(Rollout(batch, ()))
    assert lrn.counters == {"step": 6, "updates": 1}
    step, stats = lrn.learned.get()
    assert step == 6 and stats["learner/skipped"] == 0.0 and "loss/total" in stats
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.parameters()))
    assert all(p.grad is None for p in agent.parameters())
    lrn.update(Rollout(batch, ()), count_env_steps=False)
    assert lrn.counters == {"step": 6, "updates": 2} and "loss/total" not in lrn.learned.get()[1]


def test_ctrl_c_saves_and_exits_zero(tmp_path):
    import signal
    import subprocess
    import threading

    cmd = [
        sys.executable,
        "-m",
        "rfwp_rl.cli",
        "train",
        "--env",
        "CartPole-v1",
        "--core",
        "lstm",
        "--set",
        "core_config.hidden_size=16",
        "--env-backend",
        "local",
        "--num-actors",
        "2",
        "--unroll-length",
        "5",
        "--batch-size",
        "2",
        "--total-steps",
        "10000000",
        "--run-dir",
        str(tmp_path / "run"),
        "--log-every",
        "0.2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(300, proc.kill)  # only ever a failure deadline
    watchdog.start()
    try:
        for line in proc.stdout:  # wait until it has trained
            if "env steps" in line and not line.startswith("0/"):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate()
    finally:
        watchdog.cancel()
        proc.kill()
    assert proc.returncode == 0, err
    assert "SIGINT received" in err and "stopped at step" in out
    ckpt = read_checkpoint(list_checkpoints(tmp_path / "run")[0])
    assert 0 < ckpt["step"] < 10_000_000


def test_tiny_pong_run_in_the_ale_backend(tmp_path, capsys):
    """--env-backend ale: the trainer steps Atari in ale-py's vector env (an env that is not Atari: one line)."""
    pytest.importorskip("ale_py.vector_env")
    assert train(tmp_path, "Pong", "lstm", 20, "--env-backend", "ale", "--num-env-processes", "1") == 0
    ckpt = read_checkpoint(list_checkpoints(tmp_path / "run")[0])
    assert ckpt["step"] == 20 and ckpt["state"]["counters"]["updates"] == 2
    capsys.readouterr()
    assert train(tmp_path, "CartPole-v1", "lstm", 20, "--env-backend", "ale", name="cartpole") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--env-backend ale steps Atari games" in err[0], err
