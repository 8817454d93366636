"""The ``ale`` env backend (rfwp_rl/envs/ale_vector_pool.py): ale-py's vector env behind the pools'
``step(batch, action)``, checked against the in-process pool of the package's own preprocessing."""

import numpy as np
import pytest
import torch

from rfwp_rl.envs.ale_vector_pool import AleVectorPool, rom_name
from rfwp_rl.errors import UserError
from rfwp_rl.impala.env_batches import LocalEnvPool, make_env_pool

pytest.importorskip("ale_py.vector_env")

KEYS = ("episode_return", "episode_step", "episode_end", "truncated", "reward", "done")


def test_rom_names_and_refusals():
    assert rom_name("ALE/Pong-v5") == "pong" and rom_name("ALE/SpaceInvaders-v5") == "space_invaders"
    with pytest.raises(UserError, match="steps Atari games"):
        rom_name("CartPole-v1")
    with pytest.raises(UserError, match="episodic_life"):
        AleVectorPool("ALE/Pong-v5", {"episodic_life": True}, 0, 2, 1, 1)
    with pytest.raises(UserError, match="cannot pass the env option.s. mode"):
        AleVectorPool("ALE/Pong-v5", {"mode": 1}, 0, 2, 1, 1)
    with pytest.raises(UserError, match="--env-backend ale steps Atari games"):
        make_env_pool("ale", "CartPole-v1", {}, 0, 4, 2, 1)


def test_frames_and_a_cut_game_as_the_in_process_pool_gives_them():
    """No no-op starts (so both start alike) and a frame limit of 40 frames (10 agent steps): the same frames,
    rewards and episode flags step by step, through the cut; after it, ALE's new game has moved one step
    further (the module docstring), so only the flags are compared there."""
    options = {"noop_max": 0, "max_episode_frames": 40}
    ale = AleVectorPool("ALE/Pong-v5", options, 0, 2, 1, 1)
    ours = LocalEnvPool("ALE/Pong-v5", options, 0, 2, 1)
    rng = np.random.default_rng(0)
    for t in range(14):
        action = torch.from_numpy(rng.integers(0, 6, 2))
        a, b = ale.step(0, action).result(), ours.step(0, action).result()
        for key in KEYS:
            assert torch.equal(a[key].to(b[key].dtype), b[key]), (t, key, a[key], b[key])
        if t < 10:
            assert torch.equal(a["obs"], b["obs"]), t
        if t == 10:  # the cut game's last frame: ALE's, not max-pooled with the frame before (a few pixels)
            assert a["truncated"].all() and not a["done"].any()
            assert torch.equal(a["obs"][:, :-1], b["obs"][:, :-1])
            assert (a["obs"][:, -1] != b["obs"][:, -1]).float().mean() < 0.01
        if t == 11:  # the new game: done, the cut game's statistics, a stack filled with its first frame
            assert a["done"].all() and a["episode_end"].all() and (a["episode_step"] == 10).all()
            assert (a["obs"] == a["obs"][:, -1:]).all()
    ale.close()
    ours.close()


def test_a_game_over_resets_in_the_same_step():
    """Pong with random actions ends (21 points to the opponent) within a few thousand steps; the step that ends
    it reports done with the new game's first frame (a filled stack) and the game's return and length."""
    pool = AleVectorPool("ALE/Pong-v5", {}, 1, 2, 1, 1)
    pool.step(0, torch.zeros(2, dtype=torch.long)).result()
    rng = np.random.default_rng(1)
    returns = np.zeros(2)
    for _ in range(6000):
        out = pool.step(0, torch.from_numpy(rng.integers(0, 6, 2))).result()
        returns += out["reward"].numpy()
        if out["done"].any():
            i = int(np.flatnonzero(out["done"].numpy())[0])
            assert out["episode_end"][i] and not out["truncated"][i]
            assert out["episode_return"][i] == pytest.approx(returns[i]) and returns[i] <= -1
            assert out["episode_step"][i] > 100
            assert (out["obs"][i] == out["obs"][i, -1:]).all()
            break
    else:
        pytest.fail("no Pong game ended in 6000 random steps")
    pool.close()
