"""``rfwp-rl eval``: evaluate a trained IMPALA agent with the RFWP paper's protocol.

Protocol (RFWP paper Sec. 4.4 and the captions of Tables 9-10): the agent plays 30 test
episodes, repeated 5 times; the score is the mean of the 5 per-repeat means +- their
standard deviation (population std, numpy's default; the paper does not say which).
Episodes are FULL games (a lost life does not end an episode; ``episodic_life`` is forced
off), actions are the argmax of the policy ("argmax in test", DESIGN.md; ``--actions sample``
samples instead). ``--noneg`` is the variant the paper's code used for Battlezone and
Up'n Down: episodes with a negative final score are dropped and play goes on until every
repeat has 30 non-negative episodes.

Speed: ``--num-actors`` environments are stepped together, one batched forward pass of the
agent per step. Each environment plays a fixed quota of episodes decided up front, so
which episodes count never depends on how long they take (collecting "the first 150
episodes to finish" from parallel envs would favour short episodes); episodes are assigned
to repeats in (env, episode) order.

Outputs, next to the run (atomically): ``eval_<step>_<greedy|sample>[_noneg].json`` with
every episode's score and length, and ``.csv`` with one row in the columns of the paper's
tables (``results/paper/``), which ``rfwp-rl compare --runs`` reads; scalars and a score
histogram go to the run's TensorBoard (``<run>/tb``, at the checkpoint's step).

Examples::

    rfwp-rl eval runs/impala/ALE-Pong-v5_rdn_s1
    rfwp-rl eval runs/impala/ALE-Pong-v5_rdn_s1 --checkpoint best   # the best training return's best.pt
    rfwp-rl eval runs/impala/ALE-BattleZone-v5_rdn_s1/snapshot_000050000000.pt --noneg
    rfwp-rl eval RUN --episodes 10 --repeats 1 --video pong.gif
    rfwp-rl eval RUN --env-option max_episode_frames=108000     # Machado et al.'s 30-minute cap
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rfwp_rl import envs as envs_mod
from rfwp_rl import flags
from rfwp_rl.checkpoint import (
    BEST_FILE,
    add_trust_argument,
    atomic_write_bytes,
    check_meta,
    find_checkpoint_file,
    read_checkpoint,
)
from rfwp_rl.encoders import has_image_torso
from rfwp_rl.envs import resolve_env_id
from rfwp_rl.envs.spaces import action_space_dict, env_step_action, map_obs, space_to_dict, stack_obs
from rfwp_rl.errors import UserError
from rfwp_rl.impala.run_spec import META_KEYS, RunSpec, parse_env_options
from rfwp_rl.perf import choose_torch_threads, set_torch_threads
from rfwp_rl.scores import canonical_game, eval_file_stem, format_steps, write_eval

DEFAULT_EPISODES = 30  # RFWP paper Sec. 4.4 (after Nair et al.)
DEFAULT_REPEATS = 5
# RFWP paper App. C: "No time limit is set for evaluation". The reference code ran gym's
# <Game>NoFrameskip-v4 ids, whose registration then capped an episode at 100,000 x 4 emulator
# frames; that cap is the default here (a greedy agent can stall a game forever, e.g. never
# pressing FIRE, so some cap is needed). --env-option max_episode_frames=0 removes it.
EVAL_MAX_EPISODE_FRAMES = 400_000


# ---------------------------------------------------------------- aggregation (pure)


def split_repeats(
    scores: Sequence[float], episodes: int, repeats: int, noneg: bool = False
) -> tuple[list[list[float]], int]:
    """Assign finished episodes, in order, to ``repeats`` groups of ``episodes``.

    With ``noneg``, episodes whose final score is negative are dropped first (paper's code
    for Battlezone and Up'n Down: play until 30 episodes with a non-negative score).
    Returns ``(groups [repeats][episodes], number dropped)``; raises ``ValueError`` when
    fewer than ``episodes * repeats`` episodes remain. Episodes beyond that are ignored.
    """
    kept = [float(s) for s in scores if not (noneg and s < 0)]
    dropped = len(scores) - len(kept)
    need = episodes * repeats
    if len(kept) < need:
        raise ValueError(f"{len(kept)} usable episodes, {need} needed ({dropped} dropped as negative)")
    return [kept[r * episodes : (r + 1) * episodes] for r in range(repeats)], dropped


def summarize(groups: Sequence[Sequence[float]]) -> dict[str, Any]:
    """``{"mean", "std", "repeat_means"}``: mean and (population) std of the per-repeat means."""
    means = [float(np.mean(g)) for g in groups]
    return {"mean": float(np.mean(means)), "std": float(np.std(means)), "repeat_means": means}


def quotas(total: int, num_envs: int) -> list[int]:
    """Split ``total`` episodes over ``num_envs`` envs as evenly as possible (first envs get the extra)."""
    base, extra = divmod(total, num_envs)
    return [base + (1 if i < extra else 0) for i in range(num_envs)]


# ---------------------------------------------------------------- playing


@dataclasses.dataclass
class Episode:
    env: int  # index of the env that played it
    index: int  # its episode number within that env
    score: float  # full-game return (unclipped)
    length: int  # agent steps
    truncated: bool  # ended by a time/frame limit rather than game over


class GifRecorder:
    """Collects RGB frames of one episode and writes an animated GIF (Pillow, no moviepy).

    ``grab()`` returns an ``[H, W, 3]`` uint8 frame. At most ``max_frames`` frames are kept.
    Frames are stored as 256-colour palette images (about 34 kB each for Atari).
    """

    def __init__(self, path: str | Path, grab: Callable[[], np.ndarray], fps: float = 15.0, max_frames: int = 2700):
        self.path, self.grab, self.fps, self.max_frames = Path(path), grab, fps, max_frames
        self.frames: list = []
        self.cut = False
        # GIF delays are in 1/100 s: 15 frames/s (Atari at frame skip 4) -> 70 ms per frame
        self.frame_ms = max(20, 10 * int(round(100 / fps)))

    def capture(self) -> None:
        from PIL import Image

        if len(self.frames) >= self.max_frames:
            self.cut = True
            return
        frame = self.grab()
        if not (isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[-1] in (3, 4)):
            got = f"an array of shape {frame.shape}" if isinstance(frame, np.ndarray) else type(frame).__name__
            raise UserError(f"--video: the env's render() gave {got}, not an RGB frame [H, W, 3]")
        img = Image.fromarray(np.ascontiguousarray(frame[..., :3]).astype(np.uint8, copy=False))
        self.frames.append(img.quantize(colors=256))  # palette image: 1 byte/pixel in memory

    def save(self) -> Path | None:
        import io

        if not self.frames:
            return None
        buf = io.BytesIO()
        self.frames[0].save(
            buf, format="GIF", save_all=True, append_images=self.frames[1:], duration=self.frame_ms, loop=0
        )
        atomic_write_bytes(self.path, buf.getvalue())
        return self.path


VIDEO_OPTIONS = {"render_mode": "rgb_array"}  # what --video asks of an env that is not Atari


def _frame_grabber(env) -> Callable[[], np.ndarray]:
    base = env.unwrapped
    if hasattr(base, "ale"):  # Atari: the emulator's RGB screen, independent of obs_type
        return base.ale.getScreenRGB
    if getattr(env, "render_mode", None) == VIDEO_OPTIONS["render_mode"]:
        return env.render
    raise UserError(
        "--video needs an Atari env or one made with render_mode='rgb_array' (add --env-option render_mode=rgb_array)"
    )


def play(
    agent: torch.nn.Module,
    envs: Sequence[Any],
    episode_quota: Sequence[int],
    greedy: bool = True,
    noneg: bool = False,
    max_dropped: int | None = None,
    recorder: GifRecorder | None = None,
    progress: Callable[[int, int, list[Episode]], None] | None = None,
    observer: Callable[[list[int], list[int], dict, dict, tuple], None] | None = None,
    with_features: bool = False,
) -> list[Episode]:
    """Play full episodes with ``agent`` on ``envs`` stepped together (batched inference).

    Env ``i`` plays until it has ``episode_quota[i]`` counted episodes (with ``noneg``,
    episodes with a negative score are not counted; more than ``max_dropped`` of them in total
    raises :class:`UserError`). Each env must already be seeded through ``make_env``.
    The agent gets ``obs [1, n, *obs_shape]`` (a dict of them for a Dict observation), ``reward [1, n]``
    and ``done [1, n]`` exactly
    as the trainer's env pool delivers them: ``reward`` is the reward received on arriving at
    the observation (at an episode's first frame: that of the previous episode's last step,
    0 for an env's first episode) and ``done`` is True at an episode's first frame (the core
    state is reset); plus ``prev_action [1, n, *action_shape]``. Greedy play takes the action
    distribution's mode; the envs get its ``env_action`` (e.g. clipped to a Box's bounds).
    ``recorder`` captures the first episode of env 0. ``observer(envs, steps, inputs, out, state)`` sees every
    forward pass: the active envs' indices, each one's step index within its episode, the agent's
    inputs (``x``, ``reward``, ``done``, ``prev_action``, each ``[1, n, ...]``), its outputs
    (``[1, n, ...]``; with ``with_features`` also the torso's ``features`` and the ``core_output``) and the new
    core state of those envs (tensors ``[n, ...]``). Returns every finished episode, including dropped ones,
    sorted by (env, index).
    """
    game = _Play(agent, envs, episode_quota, noneg, max_dropped, recorder, progress, observer, with_features)
    active = [i for i in range(len(envs)) if episode_quota[i] > 0]
    while active:
        actions = game.act(active, greedy)
        active = [i for j, i in enumerate(active) if game.step(i, actions[j])]
    game.episodes.sort(key=lambda e: (e.env, e.index))
    return game.episodes


class _Play:
    """The per-env state of :func:`play`: observations, the agent's inputs and core state, episode counts."""

    def __init__(
        self,
        agent: torch.nn.Module,
        envs: Sequence[Any],
        quota: Sequence[int],
        noneg: bool,
        max_dropped: int | None,
        recorder: GifRecorder | None,
        progress: Callable[[int, int, list[Episode]], None] | None,
        observer: Callable[[list[int], list[int], dict, dict, tuple], None] | None = None,
        with_features: bool = False,
    ):
        n = len(envs)
        self.agent, self.envs, self.quota, self.noneg, self.max_dropped = agent, envs, quota, noneg, max_dropped
        self.recorder, self.progress, self.observer = recorder, progress, observer
        self.with_features = with_features
        self.device = next(agent.parameters()).device
        self.state = [s.clone() for s in agent.initial_state(n, device=self.device)]
        self.obs = [env.reset()[0] for env in envs]
        self.reward = torch.zeros(n)
        self.done = torch.ones(n, dtype=torch.bool)
        dist = agent.action_dist
        self.dist = dist
        self.prev_action = torch.zeros(n, *dist.action_shape, dtype=dist.action_dtype)
        self.ret, self.length, self.counted, self.played = [0.0] * n, [0] * n, [0] * n, [0] * n
        self.episodes: list[Episode] = []
        self.dropped = 0
        self.recording = recorder is not None
        if self.recording:
            recorder.capture()

    def act(self, active: list[int], greedy: bool) -> torch.Tensor:
        """Actions ``[len(active)]`` of the active envs (their core states are updated)."""
        idx = torch.tensor(active)
        d = self.device
        x = map_obs(stack_obs([self.obs[i] for i in active]), lambda v: v.unsqueeze(0).to(d))
        sub = tuple(s.index_select(0, idx.to(s.device)) for s in self.state)
        inputs = {
            "x": x,
            "reward": self.reward[idx].unsqueeze(0).to(d),
            "done": self.done[idx].unsqueeze(0).to(d),
            "prev_action": self.prev_action[idx].unsqueeze(0).to(d),
        }
        with torch.inference_mode():
            out, new_sub = self.agent(
                inputs["x"],
                inputs["reward"],
                inputs["done"],
                sub,
                prev_action=inputs["prev_action"],
                greedy=greedy,
                with_features=self.with_features,
            )
        for s, ns in zip(self.state, new_sub):
            s.index_copy_(0, idx.to(s.device), ns)
        if self.observer is not None:
            self.observer(active, [self.length[i] for i in active], inputs, out, new_sub)
        return out["action"][0].cpu()

    def step(self, i: int, a: torch.Tensor) -> bool:
        """Env ``i`` takes action ``a`` (the agent's form of it); False once it has played its quota."""
        with torch.inference_mode():
            env_action = self.dist.env_action(a.to(self.device)).cpu().numpy()
        self.obs[i], r, terminated, truncated, info = self.envs[i].step(
            env_step_action(env_action, self.envs[i].action_space)
        )
        self.ret[i] += float(r)
        self.length[i] += 1
        if self.recording and i == 0:
            self.recorder.capture()
        if not (terminated or truncated):
            self.reward[i], self.done[i], self.prev_action[i] = float(r), False, a
            return True
        self._episode_ended(i, info, bool(truncated and not terminated))
        if self.counted[i] >= self.quota[i]:
            return False
        self.obs[i], _ = self.envs[i].reset()
        self.ret[i], self.length[i] = 0.0, 0
        # as in training (moolib EnvPool / TorchBeast): the new episode's first frame comes
        # with the reward of the step that ended the previous one, and done=True
        self.reward[i], self.done[i] = float(r), True
        self.prev_action[i] = 0
        return True

    def _episode_ended(self, i: int, info: dict, truncated: bool) -> None:
        ep = info.get("episode")
        score = float(np.asarray(ep["r"])) if ep is not None else self.ret[i]
        steps = int(np.asarray(ep["l"])) if ep is not None else self.length[i]
        self.episodes.append(Episode(i, self.played[i], score, steps, truncated))
        self.played[i] += 1
        if i == 0:
            self.recording = False
        if self.noneg and score < 0:
            self.dropped += 1
            if self.max_dropped is not None and self.dropped > self.max_dropped:
                raise UserError(
                    f"--noneg: {self.dropped} episodes ended with a negative score (more than "
                    f"--max-dropped {self.max_dropped}); noneg is meant for games where a negative "
                    "final score is an emulator glitch (Battlezone, Up'n Down)"
                )
        else:
            self.counted[i] += 1
        if self.progress is not None:
            self.progress(sum(self.counted), sum(self.quota), self.episodes)


# ---------------------------------------------------------------- checkpoint -> agent


CHECKPOINT_CHOICES = ("latest", "best")


def choose_checkpoint(path: str | Path, which: str = "latest") -> Path:
    """The checkpoint file to evaluate. ``which``: ``latest`` (``path`` itself if it is a file, else
    the run directory's newest ``ckpt_*.pt``), ``best`` (the run directory's ``best.pt``: the state
    of its best mean training return), or a checkpoint file (a path, or a name inside the run
    directory). Anything else: a one-line :class:`UserError`."""
    path = Path(path)
    if which == "latest":
        return find_checkpoint_file(path)
    if not path.is_dir():
        find_checkpoint_file(path)  # a missing path: its own error
        raise UserError(f"--checkpoint {which}: {path} is a checkpoint file; pass its run directory instead")
    if which == "best":
        if not (path / BEST_FILE).is_file():
            raise UserError(
                f"no {BEST_FILE} in {path} (training writes it once the first 100 episodes have ended; "
                "runs made before it was kept have none); use --checkpoint latest"
            )
        return path / BEST_FILE
    for candidate in (Path(which), path / which):
        if candidate.is_file():
            return candidate
    raise UserError(
        f"--checkpoint {which!r} is neither {' nor '.join(CHECKPOINT_CHOICES)} nor a checkpoint file "
        f"(as a path, or inside {path})"
    )


def _is_file(module: str) -> bool:
    """Whether an env id's module part names a file (as :func:`rfwp_rl.envs.import_env_module` reads it)."""
    return module.endswith(".py") or Path(module).is_file()


def same_env_module(given: str, recorded: str) -> bool:
    """Whether the module part of the user's ``--env`` (``given``) names the checkpoint's ``recorded`` one:
    the same file (paths resolved from the working directory) or the same dotted module name."""
    if not given:
        return False
    if _is_file(given) or _is_file(recorded):
        return _is_file(given) and _is_file(recorded) and Path(given).resolve() == Path(recorded).resolve()
    return given == recorded


def load_agent(
    path: str | Path,
    core: str | None = None,
    env: str | None = None,
    num_actions: int | None = None,
    which: str = "latest",
    trust: bool = False,
) -> tuple[torch.nn.Module, dict, int, Path]:
    """The agent of an IMPALA checkpoint: a file, or in a run directory the checkpoint ``which``
    names (see :func:`choose_checkpoint`; default its newest ``ckpt_*.pt``).

    ``core``, ``env`` and ``num_actions``, when given, must match the checkpoint's meta,
    else a one-line :class:`UserError` names the difference. An env from a Python module or file
    (``module:EnvId``, ``path/to/file.py:EnvId``; whatever its name) is only imported (which runs its
    code) when ``env`` names the same one: the checkpoint and its run directory may come from elsewhere.
    ``trust``: see :func:`rfwp_rl.checkpoint.read_checkpoint`. Returns
    ``(agent in eval mode, meta, step, checkpoint file)``.
    """
    file = choose_checkpoint(path, which)
    try:
        obj = read_checkpoint(file, trust=trust)
    except ValueError as e:
        raise UserError(f"cannot read checkpoint {file}: {e}") from None
    meta = obj.get("meta") or {}
    if meta.get("trainer") != "impala":
        raise UserError(
            f"checkpoint {file} was written by trainer {meta.get('trainer')!r}, not 'impala'; "
            "rfwp-rl eval evaluates IMPALA agents"
        )
    if "env" not in meta:
        raise UserError(f"checkpoint {file} lacks meta 'env'; was it written by rfwp-rl train?")
    module = str(meta["env"]).rpartition(":")[0]
    if module and (env is None or not same_env_module(env.rpartition(":")[0], module)):
        if _is_file(module):
            what = f"file {module!r} (a relative path is read from the working directory)"
        else:
            what = f"module {module!r}"
        raise UserError(
            f"checkpoint {file} was trained on env {meta['env']!r}; evaluating it imports the Python {what}, "
            f"which runs its code: pass --env {meta['env']} to confirm"
        )
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise UserError(
            f"checkpoint {file} lacks meta {', '.join(map(repr, missing))}: it has another layout than "
            "rfwp-rl train of this version writes"
        )
    wanted: dict[str, Any] = {}
    if core is not None:
        wanted["core"] = core
    if num_actions is not None:
        wanted["num_actions"] = int(num_actions)
    if env is not None:
        want_gym, have_gym = resolve_env_id(env).gym_id, resolve_env_id(str(meta["env"])).gym_id
        if want_gym != have_gym:
            check_meta({"env": meta["env"]}, {"env": want_gym}, file)
    check_meta({k: meta[k] for k in wanted}, wanted, file)

    state = obj["state"]
    weights = state.get("agent") if isinstance(state, dict) else None
    if weights is None:
        raise UserError(f"checkpoint {file} holds no agent weights (state['agent'])")
    agent = RunSpec.from_meta(meta).build_agent()
    try:
        agent.load_state_dict(weights)
    except RuntimeError as e:
        raise UserError(
            f"checkpoint {file}: weights do not fit a {meta['core']!r} agent built from its meta "
            f"({str(e).splitlines()[0]})"
        ) from None
    agent.eval()
    return agent, meta, int(obj["step"]), file


def eval_env_options(meta: dict, overrides: dict, kind: str) -> dict:
    """The env options of the evaluation: the training run's, then ``overrides``.

    Atari: ``episodic_life`` is forced off (full-game episodes; DESIGN.md: the reference
    counted one life as one episode), and the frame limit is :data:`EVAL_MAX_EPISODE_FRAMES`
    (not the training run's) unless ``overrides`` sets ``max_episode_frames``.
    """
    options = {**dict(meta.get("env_options") or {}), **overrides}
    if kind == "atari":
        if options.get("episodic_life"):
            print("note: evaluating full games (episodic_life off; it was on in training)", file=sys.stderr)
        options["episodic_life"] = False
        options["max_episode_frames"] = overrides.get("max_episode_frames", EVAL_MAX_EPISODE_FRAMES)
    return options


# ---------------------------------------------------------------- the whole evaluation


def evaluate(
    path: str | Path,
    episodes: int = DEFAULT_EPISODES,
    repeats: int = DEFAULT_REPEATS,
    greedy: bool = True,
    noneg: bool = False,
    num_envs: int = 16,
    seed: int = 12345,
    env_overrides: dict | None = None,
    core: str | None = None,
    env: str | None = None,
    num_actions: int | None = None,
    label: str | None = None,
    video: str | Path | None = None,
    max_dropped: int | None = None,
    device: str = "cpu",
    quiet: bool = False,
    torch_threads: int | None = None,
    which: str = "latest",
    trust_checkpoint: bool = False,
) -> dict:
    """Load the checkpoint at ``path`` (``which``: see :func:`choose_checkpoint`), play ``episodes * repeats``
    counted full episodes and return the eval record (what ``rfwp-rl eval`` writes as JSON; see the module docstring).
    ``torch_threads``: set torch's thread count (0: chosen for the agent); None leaves it.
    ``trust_checkpoint``: see :func:`rfwp_rl.checkpoint.read_checkpoint`."""
    if episodes < 1 or repeats < 1:
        raise UserError(f"--episodes {episodes} / --repeats {repeats}: both must be >= 1")
    if num_envs < 1:
        raise UserError(f"--num-actors {num_envs} is invalid; allowed: an integer >= 1")
    agent, meta, step, file = load_agent(
        path, core=core, env=env, num_actions=num_actions, which=which, trust=trust_checkpoint
    )
    agent.to(torch.device(device))
    if torch_threads is not None:
        set_torch_threads(choose_torch_threads(torch_threads, 0, has_image_torso(agent.torso))[0])
    env_id = str(meta["env"])
    kind = envs_mod.resolve_env_id(env_id).kind
    options = eval_env_options(meta, dict(env_overrides or {}), kind)
    total = episodes * repeats
    n = min(num_envs, total)
    if not quiet:
        print(
            f"eval {file} (step {step:,}, core {meta['core']}) on {env_id}: {repeats} x {episodes} full episodes, "
            f"{'greedy' if greedy else 'sampled'} actions{', noneg' if noneg else ''}, {n} envs",
            flush=True,
        )
    torch.manual_seed(seed)
    env_list = []
    try:
        for i in range(n):
            renders = video is not None and i == 0 and kind != "atari" and "render_mode" not in options
            try:
                env_list.append(
                    envs_mod.make_env(env_id, seed=seed + i, **options, **(VIDEO_OPTIONS if renders else {}))
                )
            except UserError as e:
                if renders and "render_mode" in str(e):
                    raise UserError(f"--video: {env_id} cannot render frames (it takes no render_mode); {e}") from e
                raise
        _check_envs(env_list[0], env_id, meta, file)
        recorder = GifRecorder(video, _frame_grabber(env_list[0])) if video is not None else None
        t0 = time.monotonic()
        played = play(
            agent,
            env_list,
            quotas(total, n),
            greedy=greedy,
            noneg=noneg,
            max_dropped=total if max_dropped is None else max_dropped,
            recorder=recorder,
            progress=None if quiet else _Progress(t0),
        )
        wall = time.monotonic() - t0
    finally:
        for e in env_list:
            e.close()

    groups, dropped = split_repeats([e.score for e in played], episodes, repeats, noneg)
    kept = [e for e in played if not (noneg and e.score < 0)]
    video_path = recorder.save() if recorder is not None else None
    record = {
        "game": canonical_game(env_id.rpartition(":")[2]),
        "env": env_id,
        "core": meta["core"],
        "model": label or meta["core"],
        "steps": step,
        "checkpoint": str(file),
        "mode": "greedy" if greedy else "sample",
        "noneg": bool(noneg),
        "episodes": episodes,
        "repeats": repeats,
        **summarize(groups),
        "scores": groups,
        "lengths": [[e.length for e in kept[r * episodes : (r + 1) * episodes]] for r in range(repeats)],
        "dropped_negative": dropped,
        "truncated": sum(e.truncated for e in kept),
        "env_options": options,
        "core_config": meta["core_config"],
        "num_actions": meta["num_actions"],
        "num_envs": n,
        "seed": seed,
        "env_steps": sum(e.length for e in played),
        "wall_time_s": round(wall, 3),
        "video": str(video_path) if video_path else None,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    if recorder is not None and recorder.cut:
        record["video_note"] = f"cut after {recorder.max_frames} frames"
    return record


def _check_envs(env: Any, env_id: str, meta: dict, file: Path) -> None:
    """The evaluation env must have the checkpoint's action and observation spaces."""
    check_meta(
        {"action_space": meta["action_space"], "obs_space": meta["obs_space"]},
        {
            "action_space": action_space_dict(env.action_space, env_id),
            "obs_space": space_to_dict(env.observation_space),
        },
        file,
    )


class _Progress:
    """A console line every 10 s of play (and at the end)."""

    def __init__(self, t0: float):
        self.t0 = self.last = t0

    def __call__(self, done_count: int, need: int, eps: list[Episode]) -> None:
        now = time.monotonic()
        if now - self.last < 10.0 and done_count < need:
            return
        self.last = now
        scores = [e.score for e in eps]
        print(
            f"  {done_count}/{need} episodes | mean score {np.mean(scores):.2f} | "
            f"{sum(e.length for e in eps) / max(now - self.t0, 1e-9):,.0f} steps/s",
            flush=True,
        )


def log_tensorboard(run_dir: str | Path, record: dict) -> None:
    """Eval scalars (and a histogram of the counted scores) into ``<run_dir>/tb`` at the checkpoint's step."""
    from torch.utils.tensorboard import SummaryWriter

    variant = record["mode"] + ("_noneg" if record["noneg"] else "")
    writer = SummaryWriter(log_dir=str(Path(run_dir) / "tb"), filename_suffix=".eval")
    try:
        step = int(record["steps"])
        writer.add_scalar(f"eval/{variant}/mean", record["mean"], step)
        writer.add_scalar(f"eval/{variant}/std", record["std"], step)
        writer.add_scalar(f"eval/{variant}/mean_length", float(np.mean(record["lengths"])), step)
        writer.add_histogram(f"eval/{variant}/scores", np.asarray(record["scores"], dtype=np.float64).ravel(), step)
    finally:
        writer.close()


# ---------------------------------------------------------------- CLI


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The saved agent to load: ``RUN_OR_CHECKPOINT`` and ``--checkpoint`` (see :func:`choose_checkpoint`)."""
    parser.add_argument(
        "run",
        metavar="RUN_OR_CHECKPOINT",
        help="a run directory (its newest ckpt_*.pt; see --checkpoint) or a checkpoint / snapshot file",
    )
    parser.add_argument(
        "--checkpoint",
        default="latest",
        metavar="latest|best|PATH",
        help="which checkpoint of the run directory: latest (the newest ckpt_*.pt, default), best "
        "(best.pt: the best mean return of 100 training episodes), or a checkpoint file",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:" + __doc__.split("Examples::", 1)[1]
    add_checkpoint_arguments(parser)
    g = parser.add_argument_group("protocol (RFWP paper Sec. 4.4)")
    g.add_argument("--episodes", type=int, default=DEFAULT_EPISODES, help="episodes per repeat (default %(default)s)")
    g.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="repeats (default %(default)s)")
    flags.add_actions_argument(g, "greedy")  # the paper's test protocol
    g.add_argument(
        "--noneg",
        action="store_true",
        help="drop episodes with a negative final score and play on until each repeat has "
        "--episodes of them (the paper's Battlezone / Up'n Down evaluation)",
    )
    g.add_argument(
        "--max-dropped",
        type=int,
        default=None,
        help="--noneg: give up after this many negative episodes (default: episodes x repeats)",
    )
    g = parser.add_argument_group("checks (must match the checkpoint)")
    g.add_argument("--core", default=None, help="expected core; a checkpoint of another core is an error")
    g.add_argument(
        "--env",
        default=None,
        help="expected env; a checkpoint trained on another env is an error; an env of the form MODULE:ID or "
        "FILE.py:ID is imported (its code runs) only when named here",
    )
    g.add_argument("--num-actions", type=int, default=None, help="expected action count")
    add_trust_argument(g)
    g = parser.add_argument_group("running")
    g.add_argument(
        "--env-option",
        dest="env_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an env option of the training run, e.g. max_episode_frames=108000 (Atari; "
        "default for eval: 400000, see EVAL_MAX_EPISODE_FRAMES; 0 = no limit) or "
        "max_episode_steps=500 (other gymnasium envs)",
    )
    flags.add_shared(g, "num_actors", 16, "one batched forward pass of the agent per step")
    flags.add_shared(g, "seed", 12345, "env i is seeded with SEED + i")
    flags.add_shared(g, "device", "cpu")
    flags.add_shared(g, "torch_threads", 0, "0: one for a small (MLP) agent, the available cores for an image agent")
    g = parser.add_argument_group("outputs")
    g.add_argument(
        "--label", default=None, help="model name in the result files (default: the core name), e.g. rdn_large"
    )
    g.add_argument("--out", default=None, help="the folder for eval_*.json/.csv (default: the run directory)")
    g.add_argument(
        "--video",
        default=None,
        metavar="PATH",
        help="write env 0's first episode as an animated GIF (Pillow; 15 frames/s, at most 2700 frames)",
    )
    g.add_argument("--no-tensorboard", action="store_true", help="do not log to the run's TensorBoard")


def run(args: argparse.Namespace) -> int:
    record = evaluate(
        args.run,
        which=args.checkpoint,
        episodes=args.episodes,
        repeats=args.repeats,
        greedy=args.actions == "greedy",
        noneg=args.noneg,
        num_envs=args.num_actors,
        seed=args.seed,
        env_overrides=parse_env_options(args.env_options, "max_episode_frames=0"),
        core=args.core,
        env=args.env,
        num_actions=args.num_actions,
        label=args.label,
        video=args.video,
        max_dropped=args.max_dropped,
        device=args.device,
        torch_threads=args.torch_threads,
        trust_checkpoint=args.trust_checkpoint,
    )
    record["command"] = (
        "rfwp-rl eval " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["eval"] else ""
    )
    run_dir = Path(record["checkpoint"]).parent
    out_dir = Path(args.out) if args.out else run_dir
    stem = eval_file_stem(record["steps"], record["mode"], record["noneg"], args.label or "")
    json_path, csv_path = write_eval(record, out_dir, stem)
    if not args.no_tensorboard:
        log_tensorboard(run_dir, record)
    means = ", ".join(f"{m:.2f}" for m in record["repeat_means"])  # as many decimals as the mean
    extra = f"; {record['dropped_negative']} negative episodes dropped" if record["noneg"] else ""
    trunc = f"; {record['truncated']} episodes hit the time limit" if record["truncated"] else ""
    print(
        f"{record['game']} {record['model']} @ {format_steps(record['steps'])}: "
        f"{record['mean']:.2f} ± {record['std']:.2f} (repeat means {means}){extra}{trunc}; "
        f"{record['env_steps']:,} steps in {record['wall_time_s']:.1f}s"
    )
    if record.get("video"):
        print(f"wrote {record['video']}")
    print(f"wrote {json_path} and {csv_path}")
    return 0
