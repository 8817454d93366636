"""Atari 2600 through gymnasium + ale-py with DeepMind-style preprocessing.

One wrapper, :class:`AtariPreprocessing`, does all of it and drives the emulator directly
(``env.unwrapped.ale``) so that an agent step costs ``frame_skip`` emulator frames, one
screen grab per pooled frame and two small matrix products, and nothing else:

* no-op starts: after each reset, ``U{1..noop_max}`` single-frame NOOPs (as in TorchBeast's
  ``NoopResetEnv`` and gymnasium's ``AtariPreprocessing``);
* frame skip: the action is repeated ``frame_skip`` frames, the rewards are summed, and the
  observation is the pixel-wise max of the last two frames (removes Atari sprite flicker);
* grayscale (ALE luminance) 210x160 -> ``screen_size`` x ``screen_size`` by area averaging
  (the same weights as OpenCV's ``INTER_AREA``, without needing OpenCV);
* frame stack: observation ``uint8 [frame_stack, screen_size, screen_size]``, oldest first,
  filled with the first frame after a reset;
* full-game episodes: ``terminated`` is the game over, never a lost life. Opt-in
  ``episodic_life=True`` also ends the *training* episode at a life loss (the game itself
  goes on at the next ``reset()``), but ``info["episode"]`` is only written at the real game
  end and always holds the full-game return. (The reference implementation counted one life
  as one episode in its reported scores; we must not.)
* ``max_episode_frames`` (default 108,000 frames = 27,000 agent steps at frame skip 4) is the
  ALE's own frame limit; reaching it gives ``truncated=True``. 0 means no limit.

Sticky actions: ``repeat_action_probability`` defaults to 0.0. The paper's numbers come from
TorchBeast on ``<Game>NoFrameskip-v4`` ids, which have no sticky actions (their only
randomness is the up-to-30 no-op start), so 0.0 keeps our scores comparable with the paper's
tables. Set 0.25 for the Machado et al. (2018) protocol, which is the ``ALE/*-v5`` default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

from rfwp_rl.errors import UserError, check_choice

#: Defaults of the Atari preprocessing (``env_specs/atari.toml`` holds the same values).
ATARI_DEFAULTS: dict[str, Any] = {
    "noop_max": 30,
    "frame_skip": 4,
    "frame_stack": 4,
    "screen_size": 84,
    "repeat_action_probability": 0.0,
    "full_action_space": False,
    "max_episode_frames": 108_000,
    "episodic_life": False,
}


@dataclass(frozen=True)
class AtariGame:
    """One of the 20 games of the RFWP paper (App. C, Tables 9-10)."""

    name: str  # ALE game name, CamelCase, as in 'ALE/<name>-v5'
    paper_name: str  # row label in the paper's tables
    minimal_actions: int  # size of the minimal action set (ale-py 0.12)
    paper_actions: int  # action-space size the paper's agents were trained with

    @property
    def gym_id(self) -> str:
        return f"ALE/{self.name}-v5"


# Measured with ale-py 0.12.1 (``gymnasium.make('ALE/<name>-v5').action_space.n``).
# The paper trained Amidar and James Bond with 6 actions (RFWP paper App. C: "an action
# space size of 6, which is smaller than the full action space"); every other game used
# its minimal action set. env_specs/atari_games.csv is the same table.
PAPER_GAMES: tuple[AtariGame, ...] = (
    AtariGame("Alien", "Alien", 18, 18),
    AtariGame("Amidar", "Amidar", 10, 6),
    AtariGame("Assault", "Assault", 7, 7),
    AtariGame("BankHeist", "B. Heist", 18, 18),
    AtariGame("BattleZone", "Battlezone", 18, 18),
    AtariGame("BeamRider", "B. Rider", 9, 9),
    AtariGame("Berzerk", "Berzerk", 18, 18),
    AtariGame("DemonAttack", "D. Attack", 6, 6),
    AtariGame("Gopher", "Gopher", 8, 8),
    AtariGame("Jamesbond", "James Bond", 18, 6),
    AtariGame("KungFuMaster", "Kung-fu", 14, 14),
    AtariGame("MsPacman", "MsPacman", 9, 9),
    AtariGame("Pong", "Pong", 6, 6),
    AtariGame("Qbert", "Q*Bert", 6, 6),
    AtariGame("Robotank", "Robotank", 18, 18),
    AtariGame("Seaquest", "Seaquest", 18, 18),
    AtariGame("SpaceInvaders", "S. Invaders", 6, 6),
    AtariGame("StarGunner", "Stargunner", 18, 18),
    AtariGame("UpNDown", "Up'n down", 6, 6),
    AtariGame("Zaxxon", "Zaxxon", 18, 18),
)


def check_atari_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Validate Atari overrides and return the full effective settings (defaults filled in).

    Raises a one-line :class:`UserError` naming the bad key or value.
    """
    for key in settings:
        check_choice("Atari setting", key, ATARI_DEFAULTS)
    out = {**ATARI_DEFAULTS, **settings}

    def _int(key: str, low: int) -> None:
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise UserError(f"Atari setting {key}={v!r} must be an integer >= {low}")
        out[key] = int(v)

    _int("noop_max", 0)
    _int("frame_skip", 1)
    _int("frame_stack", 1)
    _int("screen_size", 8)
    if out["max_episode_frames"] is None:
        out["max_episode_frames"] = 0
    _int("max_episode_frames", 0)
    p = out["repeat_action_probability"]
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise UserError(f"Atari setting repeat_action_probability={p!r} must be a number in [0, 1]")
    out["repeat_action_probability"] = float(p)
    for key in ("full_action_space", "episodic_life"):
        if not isinstance(out[key], bool):
            raise UserError(f"Atari setting {key}={out[key]!r} must be true or false")
    return out


def area_resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """``[n_out, n_in]`` float32 weights of area-averaging resampling along one axis.

    Row o averages the source pixels covered by ``[o * s, (o + 1) * s)`` with
    ``s = n_in / n_out``, each weighted by its overlap (rows sum to 1). Applying it to both
    axes (``Ry @ img @ Rx.T``) equals OpenCV's ``INTER_AREA`` downscaling.
    """
    scale = n_in / n_out
    m = np.zeros((n_out, n_in), dtype=np.float64)
    for o in range(n_out):
        lo, hi = o * scale, (o + 1) * scale
        for i in range(int(np.floor(lo)), min(n_in, int(np.ceil(hi)))):
            m[o, i] = (min(hi, i + 1) - max(lo, i)) / scale
    return m.astype(np.float32)


def _taps(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sparse form of a resize matrix: ``idx, w`` of shape ``[n_out, K]`` (K = max taps)."""
    k = int((m > 0).sum(1).max())
    idx = np.zeros((m.shape[0], k), dtype=np.intp)
    w = np.zeros((m.shape[0], k), dtype=np.float32)
    for o in range(m.shape[0]):
        nz = np.nonzero(m[o])[0]
        idx[o, : len(nz)] = nz
        idx[o, len(nz) :] = nz[-1]  # padding taps have weight 0
        w[o, : len(nz)] = m[o, nz]
    return idx, w


class AtariPreprocessing(gymnasium.Wrapper):
    """DeepMind-style preprocessing of an ale-py env created with ``frameskip=1``.

    Observation: ``uint8 [frame_stack, screen_size, screen_size]`` (channel-first, oldest
    frame first). ``info`` has ``lives`` and ``episode_frame_number`` on every step, and
    ``info["episode"] = {"r": full-game return, "l": agent steps, "t": seconds}`` on the step
    where the game ends (game over or frame limit), like gymnasium's RecordEpisodeStatistics.
    See the module docstring for the exact semantics.
    """

    def __init__(
        self,
        env: gymnasium.Env,
        *,
        noop_max: int = 30,
        frame_skip: int = 4,
        frame_stack: int = 4,
        screen_size: int = 84,
        episodic_life: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__(env)
        base = env.unwrapped
        if getattr(base, "_frameskip", 1) != 1:
            raise ValueError("AtariPreprocessing needs the ale-py env made with frameskip=1")
        self._ale = base.ale
        # action index -> ALE action, exactly as ale-py maps it (minimal or legal set)
        self._action_set = list(base._action_set)
        self.noop_max = noop_max
        self.frame_skip = frame_skip
        self.frame_stack = frame_stack
        self.episodic_life = episodic_life
        self._pending_seed = seed

        h, w = self._ale.getScreenDims()
        self._prev = np.zeros((h, w), dtype=np.uint8)
        self._last = np.zeros((h, w), dtype=np.uint8)
        self._last_f = np.zeros((h, w), dtype=np.float32)
        # Sparse (<= 3 taps per output pixel) area weights, applied with einsum: a BLAS
        # matmul would be as exact but spawns BLAS threads in every actor process.
        self._row_idx, self._row_w = _taps(area_resize_matrix(h, screen_size))
        self._col_idx, self._col_w = _taps(area_resize_matrix(w, screen_size))
        self._stack = np.zeros((frame_stack, screen_size, screen_size), dtype=np.uint8)
        self.observation_space = gymnasium.spaces.Box(0, 255, self._stack.shape, dtype=np.uint8)
        self.action_space = base.action_space

        self._lives = 0
        self._game_over = True  # the next reset() must reset the game
        self._ep_return = 0.0
        self._ep_steps = 0
        self._ep_start = time.perf_counter()

    # -- frame processing ---------------------------------------------------------------
    def _push_frame(self, fill: bool = False) -> np.ndarray:
        """Resize ``self._last`` into the newest stack slot (or every slot) and return a copy."""
        self._last_f[...] = self._last
        rows = np.einsum("okc,ok->oc", self._last_f[self._row_idx], self._row_w)  # [S, w]
        small = np.einsum("rok,ok->ro", rows[:, self._col_idx], self._col_w)  # [S, S]
        small += 0.5  # round to nearest on the uint8 cast below
        if fill:
            self._stack[...] = small
        else:
            self._stack[:-1] = self._stack[1:]
            self._stack[-1] = small
        return self._stack.copy()

    def _noop_start(self, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        _, info = self.env.reset(seed=seed, options=options)
        if self.noop_max > 0:
            for _ in range(int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1))):
                self._ale.act(self._action_set[0])
                if self._ale.game_over():
                    _, info = self.env.reset(options=options)
        return info

    # -- gymnasium API --------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed
        if seed is not None:
            self.action_space.seed(seed)
            self._game_over = True
        self._pending_seed = None
        if self._game_over or not self.episodic_life:
            self._noop_start(seed, options)
            self._game_over = False
            self._ep_return, self._ep_steps = 0.0, 0
            self._ep_start = time.perf_counter()
            self._ale.getScreenGrayscale(self._last)
            obs = self._push_frame(fill=True)
        else:
            # episodic_life after a lost life: the game goes on. One NOOP step moves past the
            # life-loss state (as DeepMind's EpisodicLifeEnv does); its reward still counts
            # towards the full-game return.
            self.step(0)
            if self._game_over:  # the game ended on that very step
                return self.reset(options=options)
            self._stack[:-1] = self._stack[-1]
            obs = self._stack.copy()
        self._lives = self._ale.lives()
        info = {"lives": self._lives, "episode_frame_number": self._ale.getEpisodeFrameNumber()}
        return obs, info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        ale = self._ale
        index = int(action)
        if not 0 <= index < len(self._action_set):
            raise IndexError(f"action {index} out of range for {self.action_space}")
        a = self._action_set[index]
        k = self.frame_skip
        reward = 0.0
        i = 0
        for i in range(k):
            reward += ale.act(a)
            if i == k - 1 or ale.game_over():
                break
            if i == k - 2:
                ale.getScreenGrayscale(self._prev)
        ale.getScreenGrayscale(self._last)
        if k > 1 and i == k - 1:  # full skip: max over the last two frames
            np.maximum(self._prev, self._last, out=self._last)
        obs = self._push_frame()

        terminated = ale.game_over(with_truncation=False)
        truncated = ale.game_truncated() and not terminated
        lives = ale.lives()
        life_lost = 0 < lives < self._lives
        self._lives = lives
        self._ep_return += reward
        self._ep_steps += 1
        info: dict[str, Any] = {"lives": lives, "episode_frame_number": ale.getEpisodeFrameNumber()}
        if terminated or truncated:
            self._game_over = True
            info["episode"] = {
                "r": self._ep_return,
                "l": self._ep_steps,
                "t": round(time.perf_counter() - self._ep_start, 6),
            }
        elif self.episodic_life and life_lost:
            terminated = True
        return obs, reward, terminated, truncated, info


def make_atari(
    gym_id: str, seed: int | None = None, gym_kwargs: dict[str, Any] | None = None, **settings: Any
) -> gymnasium.Env:
    """Create ``gym_id`` (an ale-py id) with :class:`AtariPreprocessing`.

    ``settings`` are the keys of :data:`ATARI_DEFAULTS`; ``gym_kwargs`` go to
    ``gymnasium.make`` as they are (e.g. ``mode``, ``difficulty``).
    """
    s = check_atari_settings(settings)
    env = gymnasium.make(
        gym_id,
        frameskip=1,
        obs_type="grayscale",
        repeat_action_probability=s["repeat_action_probability"],
        full_action_space=s["full_action_space"],
        max_num_frames_per_episode=s["max_episode_frames"] or None,
        disable_env_checker=True,
        **(gym_kwargs or {}),
    )
    return AtariPreprocessing(
        env,
        noop_max=s["noop_max"],
        frame_skip=s["frame_skip"],
        frame_stack=s["frame_stack"],
        screen_size=s["screen_size"],
        episodic_life=s["episodic_life"],
        seed=seed,
    )
