"""moolib as built by scripts/build_moolib.sh: import, EnvPool workers, Rpc, Broker/Group.

Every check runs in a fresh Python process with a hard timeout: EnvPool forks and refuses to
once moolib threads exist, and moolib's own timeouts are minutes long. If moolib is not
installed the module is skipped (run scripts/build_moolib.sh), unless RFWP_REQUIRE_MOOLIB=1,
where a missing moolib fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from procs import MOOLIB_EXIT, free_port, script_result  # tests/procs.py

REPO = Path(__file__).resolve().parent.parent
DEADLINE = 300  # s: only ever a failure deadline (a slow or busy machine just takes longer)

try:
    import moolib  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("RFWP_REQUIRE_MOOLIB") == "1":
        raise
    pytest.skip(f"moolib not installed ({e}); run scripts/build_moolib.sh", allow_module_level=True)


def _run(script: str, timeout: float = DEADLINE) -> dict:
    """Run ``script`` in a fresh interpreter; it prints one JSON line last."""
    return script_result([sys.executable, "-c", textwrap.dedent(script) + MOOLIB_EXIT], cwd=REPO, timeout=timeout)


def test_build_matches_pins():
    import moolib._rfwp_build as b

    pins = dict(
        line.split("=", 1)
        for line in (REPO / "third_party/moolib/source.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert b.MOOLIB_VERSION == pins["MOOLIB_VERSION"] == "0.0.9b0"
    assert b.PYBIND11_VERSION == pins["PYBIND11_VERSION"]
    assert b.PATCH == pins["MOOLIB_PATCH"]
    import torch

    assert b.TORCH_VERSION == torch.__version__  # moolib links libtorch: must match
    out = subprocess.run(
        ["bash", str(REPO / "scripts/build_moolib.sh"), "--check"], capture_output=True, text=True, timeout=DEADLINE
    )
    assert out.returncode == 0, out.stdout + out.stderr  # the installed build has the current key


def test_envpool_steps_envs_in_worker_processes():
    out = _run(
        """
        import json, os
        import numpy as np, torch, moolib

        class CountEnv:  # old-gym interface that moolib.EnvPool drives
            def __init__(self):
                self.t = 0
            def reset(self):
                self.t = 0
                return {"pid": np.int64(os.getpid()), "t": np.int64(self.t), "x": np.zeros(3, np.float32)}
            def step(self, action):
                self.t += 1
                obs = {"pid": np.int64(os.getpid()), "t": np.int64(self.t),
                       "x": np.full(3, action, np.float32)}
                return obs, float(action), self.t == 3, {}

        pool = moolib.EnvPool(CountEnv, num_processes=2, batch_size=4, num_batches=2)
        seen, ts, rewards, dones, xs = set(), [], [], [], []
        futures = [pool.step(k, torch.zeros(4, dtype=torch.int64)) for k in range(2)]
        for it in range(8):
            k = it % 2
            out = futures[k].result()
            keys = sorted(out)
            shapes = {key: list(v.shape) for key, v in out.items()}
            dtypes = {key: str(v.dtype) for key, v in out.items()}
            seen.update(out["pid"].tolist())
            if k == 0:
                ts.append(out["t"].tolist()); rewards.append(out["reward"].tolist())
                dones.append(out["done"].tolist())
                xs.append(out["x"][:, 0].tolist())
            action = torch.arange(4, dtype=torch.int64) + it
            futures[k] = pool.step(k, action)
        for f in futures:
            f.result()
        print(json.dumps({"keys": keys, "shapes": shapes, "dtypes": dtypes, "pids": sorted(seen),
                          "me": os.getpid(), "t": ts, "reward": rewards, "done": dones, "x": xs}))
        """
    )
    assert out["keys"] == ["done", "pid", "reward", "t", "x"]
    assert out["shapes"] == {"done": [4], "pid": [4], "reward": [4], "t": [4], "x": [4, 3]}
    assert out["dtypes"]["reward"] == "torch.float32" and out["dtypes"]["done"] == "torch.bool"
    assert len(out["pids"]) == 2 and out["me"] not in out["pids"]  # 2 worker processes
    # Batch 0 results: the first is the reset (its action is ignored); then the actions
    # posted at it = 0, 2, 4 were index + it. The step that ends the episode (t == 3) reports
    # its own reward with done=True but the NEXT episode's first observation (t == 0, x == 0).
    assert out["t"] == [[0] * 4, [1] * 4, [2] * 4, [0] * 4]
    assert out["x"] == [[0.0] * 4, [0.0, 1.0, 2.0, 3.0], [2.0, 3.0, 4.0, 5.0], [0.0] * 4]
    assert out["reward"] == [[0.0] * 4, [0.0, 1.0, 2.0, 3.0], [2.0, 3.0, 4.0, 5.0], [4.0, 5.0, 6.0, 7.0]]
    assert out["done"] == [[False] * 4, [False] * 4, [False] * 4, [True] * 4]


def test_envpool_with_rfwp_pool_env_factory():
    out = _run(
        """
        import json, torch, moolib
        from rfwp_rl.envs.pool_env import PoolEnvFactory

        pool = moolib.EnvPool(PoolEnvFactory("CartPole-v1"), num_processes=2, batch_size=4, num_batches=1)
        returns, lengths, steps = [], [], torch.zeros(4, dtype=torch.int64)
        action = torch.zeros(4, dtype=torch.int64)  # always push left: episodes of ~10 steps
        for it in range(60):
            out = pool.step(0, action).result()
            if it > 0:
                steps += 1
            assert out["obs"].shape == (4, 4) and out["obs"].dtype == torch.float32
            for i in torch.nonzero(out["done"]).flatten().tolist():
                assert bool(out["episode_end"][i])
                returns.append(float(out["episode_return"][i])); lengths.append(int(out["episode_step"][i]))
                assert lengths[-1] == int(steps[i]); steps[i] = 0
            live = ~out["done"]  # done rows report the ended episode (checked above)
            assert torch.equal(out["episode_step"][live], steps[live].int())
        print(json.dumps({"returns": returns, "lengths": lengths}))
        """
    )
    assert len(out["lengths"]) >= 8
    assert out["returns"] == [float(n) for n in out["lengths"]]  # CartPole: +1 per step
    assert all(5 <= n <= 30 for n in out["lengths"])


def test_rpc_call_between_two_peers_on_loopback():
    port = free_port()
    out = _run(
        f"""
        import json, torch, moolib

        host = moolib.Rpc()
        host.set_name("host")
        host.define("add", lambda a, b: a + b)
        host.define("info", lambda x: {{"sum": float(x.sum()), "shape": list(x.shape)}})
        host.listen("127.0.0.1:{port}")

        client = moolib.Rpc()
        client.set_name("client")
        client.set_timeout(20)
        client.connect("127.0.0.1:{port}")
        fut = client.async_("host", "add", torch.arange(4), 10)
        added = fut.result().tolist()
        info = client.sync("host", "info", torch.ones(2, 3))
        try:
            client.sync("host", "no_such_function")
            error = None
        except RuntimeError as e:  # moolib.RpcError is not an exception class
            error = str(e)
        print(json.dumps({{"added": added, "info": info, "error": error}}))
        """
    )
    assert out["added"] == [10, 11, 12, 13]
    assert out["info"] == {"sum": 6.0, "shape": [2, 3]}
    assert out["error"] is not None and "no_such_function" in out["error"]


def test_exception_in_rpc_handler_aborts_the_host(tmp_path):
    """moolib 0.0.9b0 aborts the process when a defined function raises (its default
    exception mode; not settable from Python): handlers must catch their own errors."""
    import resource

    port = free_port()
    script = f"""
import moolib
host = moolib.Rpc(); host.set_name("host")
def fail(): raise ValueError("bad input 42")
host.define("fail", fail)
host.listen("127.0.0.1:{port}")
client = moolib.Rpc(); client.set_timeout(20); client.connect("127.0.0.1:{port}")
client.sync("host", "fail")
print("survived")
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=tmp_path,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)),
    )
    assert proc.returncode < 0 and "survived" not in proc.stdout
    assert "Unhandled exception in RPC function: ValueError: bad input 42" in proc.stderr


def test_broker_forms_a_group_of_two_peers():
    port = free_port()
    out = _run(
        f"""
        import json, time, torch, moolib

        broker_rpc = moolib.Rpc()
        broker_rpc.set_name("broker")
        broker = moolib.Broker(broker_rpc)
        broker_rpc.listen("127.0.0.1:{port}")

        peers, groups = [], []
        for name in ("peer0", "peer1"):
            rpc = moolib.Rpc()
            rpc.set_name(name)
            rpc.connect("127.0.0.1:{port}")
            peers.append(rpc)
            groups.append(moolib.Group(rpc, "test/group"))
        deadline = time.monotonic() + {DEADLINE - 60}
        while time.monotonic() < deadline:
            broker.update()
            for g in groups:
                g.update()
            if all(sorted(g.members()) == ["peer0", "peer1"] for g in groups):
                break
            time.sleep(0.05)
        members = [sorted(g.members()) for g in groups]
        futures = [g.all_reduce("x", torch.full((3,), float(i + 1)), None) for i, g in enumerate(groups)]
        while time.monotonic() < deadline and not all(f.done() for f in futures):
            broker.update()
            for g in groups:
                g.update()
            time.sleep(0.01)
        reduced = [f.result().tolist() for f in futures]
        print(json.dumps({{"members": members, "reduced": reduced}}))
        """
    )
    assert out["members"] == [["peer0", "peer1"]] * 2
    assert out["reduced"] == [[3.0, 3.0, 3.0]] * 2  # default op: sum


def test_accumulator_averages_gradients_of_two_peers():
    port = free_port()
    out = _run(
        f"""
        import json, time, torch, moolib

        broker_rpc = moolib.Rpc(); broker_rpc.set_name("broker")
        broker = moolib.Broker(broker_rpc); broker_rpc.listen("127.0.0.1:{port}")
        peers = []
        for i in range(2):
            torch.manual_seed(i)  # different initial weights: the leader's must win
            model = torch.nn.Linear(2, 1)
            rpc = moolib.Rpc(); rpc.set_name(f"p{{i}}"); rpc.connect("127.0.0.1:{port}")
            group = moolib.Group(rpc, "test/acc")
            acc = moolib.Accumulator("model", model.parameters(), model.buffers(), group=group)
            acc.set_virtual_batch_size(2)
            peers.append(dict(model=model, rpc=rpc, group=group, acc=acc, sent=False, grad=None))
        deadline = time.monotonic() + {DEADLINE - 60}
        started = False  # gradients are handed in once both peers are in the group, whichever joined first
        while time.monotonic() < deadline and any(p["grad"] is None for p in peers):
            broker.update()
            started = started or all(p["acc"].connected() and len(p["group"].members()) == 2 for p in peers)
            for i, p in enumerate(peers):
                p["group"].update(); acc = p["acc"]; acc.update()
                if not acc.connected():
                    continue
                if acc.wants_state():
                    acc.set_state({{"step": 0}})
                if acc.has_new_state():
                    acc.state()
                if acc.has_gradients():
                    p["grad"] = p["model"].weight.grad.tolist()
                    acc.zero_gradients()
                elif started and acc.wants_gradients() and not p["sent"]:
                    p["model"].weight.grad = torch.full((1, 2), float(i + 1))
                    p["model"].bias.grad = torch.zeros(1)
                    acc.reduce_gradients(1)
                    p["sent"] = True
            time.sleep(0.01)
        print(json.dumps({{"grads": [p["grad"] for p in peers],
                           "leaders": sorted(p["acc"].is_leader() for p in peers),
                           "same_weights": torch.equal(peers[0]["model"].weight, peers[1]["model"].weight)}}))
        """
    )
    assert out["grads"] == [[[1.5, 1.5]], [[1.5, 1.5]]]  # mean of 1 and 2 (batch 1 each)
    assert out["leaders"] == [False, True]
    assert out["same_weights"]  # the leader's parameters were broadcast to the other peer
