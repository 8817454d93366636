"""The run setup shared by ``rfwp-rl train``, ``actor``, ``eval`` and ``bench impala``.

A :class:`RunSpec` is what an IMPALA run trains on: the environment (canonical id, options,
observation and action spaces) and the agent preset. It is built once, from the command line
(:meth:`RunSpec.from_args`) or from a checkpoint's meta (:meth:`RunSpec.from_meta`), and it
builds everything that depends on it in one way: the agent (:func:`rfwp_rl.agent.build_agent`),
the env pool, the checkpoint meta that a resume or a remote actor is compared against.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import torch

from rfwp_rl import cores, envs, flags
from rfwp_rl.agent import BEFORE_OPTION, AgentConfig, build_agent
from rfwp_rl.distributions import make_distribution
from rfwp_rl.envs.spaces import space_from_dict, zero_obs
from rfwp_rl.errors import UserError
from rfwp_rl.impala.config import ImpalaConfig
from rfwp_rl.impala.env_batches import make_env_pool
from rfwp_rl.overrides import apply_to_preset, parse_value, split_settings
from rfwp_rl.presets import Preset, resolve_preset

DEFAULT_CORE = "rdn"  # the RFWP paper's main agent
#: the keys of a checkpoint's meta (:meth:`RunSpec.meta`)
META_KEYS = (
    "trainer",
    "env",
    "env_options",
    "core",
    "core_config",
    "num_actions",
    "obs_shape",
    "obs_space",
    "action_space",
    "agent",
)


def add_run_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The options that say what a run trains on: ``--env``, ``--core``, ``--preset``, ``--set``,
    ``--detach-state-every-step``, ``--env-option``, ``--env-config``."""
    g = parser
    flags.add_field(g, ImpalaConfig, "env")
    g.add_argument(
        "--core",
        default=None,
        help=f"core name (rfwp-rl info); Atari envs use agents/atari_<core>.toml (default {DEFAULT_CORE})",
    )
    g.add_argument("--preset", default=None, help="agent preset: a name in agents/ or a .toml file")
    flags.add_set_argument(
        g, "a preset value (core_config.hidden_size=64, agent.use_prev_action=true)", "entropy_cost=0.001"
    )
    g.add_argument(
        "--detach-state-every-step",
        action="store_true",
        help="1-step BPTT through the core state (the reference code's fast-weight agents), for comparison",
    )
    g.add_argument(
        "--env-option",
        dest="env_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment option, e.g. repeat_action_probability=0.25 (Atari) or max_episode_steps=200",
    )
    g.add_argument(
        "--env-config", default=None, help="TOML file whose [atari] (Atari) or [env] table holds env options"
    )


def env_options_from_args(args: argparse.Namespace, kind: str) -> dict:
    """``--env-config`` table, then the ``--env-option KEY=VALUE`` items (TOML values)."""
    options = envs.load_env_config(args.env_config, "atari" if kind == "atari" else "env") if args.env_config else {}
    return {**options, **parse_env_options(args.env_options, "repeat_action_probability=0.25")}


def parse_env_options(items: list[str], example: str) -> dict:
    """``--env-option KEY=VALUE`` items as a dict (TOML values); a malformed item is a one-line error."""
    options = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--env-option {item!r}: expected key=value, e.g. {example}")
        options[key.strip()] = parse_value(text.strip())
    return options


def canonical_env_id(env: str) -> str:
    """The env id a run is recorded under: the gymnasium id (``Pong`` -> ``ALE/Pong-v5``), keeping
    the module of a ``module:EnvId`` id (``mypkg.envs:Maze-v0``; a file by its absolute path), so
    that eval and remote actors can make the env from the record alone."""
    gym_id = envs.resolve_env_id(env).gym_id
    module = env.rpartition(":")[0] if ":" in env else ""
    if module.endswith(".py") or Path(module).is_file():  # a file: recorded by absolute path (eval may run elsewhere)
        module = str(Path(module).resolve())
    return f"{module}:{gym_id}" if module else gym_id


@dataclasses.dataclass
class RunSpec:
    """What an IMPALA run trains on (see the module docstring)."""

    env: str  # canonical_env_id
    kind: str  # 'atari' (uint8 [C, H, W], ResNet torso) or 'vector' (any other gymnasium env)
    obs_space: dict  # the tensor observation space (rfwp_rl.envs.spaces.space_to_dict)
    action_space: dict  # the env's action space, as plain data
    env_options: dict
    preset: Preset
    memory_horizon: int | None = None  # steps a memory must span (memory tasks), for the vector profile
    max_episode_steps: int | None = None
    trainer_settings: list = dataclasses.field(default_factory=list)  # --set items for the trainer's config
    reward_range: tuple[float, float] | None = None  # one step's reward, as the env declares it (if it does)

    @classmethod
    def from_args(cls, args: argparse.Namespace, trainer_keys: Any = ()) -> RunSpec:
        """From the options of :func:`add_run_arguments`. ``--set`` items with a key of ``trainer_keys``
        are kept in ``trainer_settings`` for the trainer's config (:func:`rfwp_rl.overrides.apply_to_trainer`)."""
        resolved = envs.resolve_env_id(args.env)  # unknown env: one-line error with close matches
        agent_settings, trainer_settings = split_settings(args.overrides, trainer_keys)
        preset = resolve_preset(args.core, args.preset, (), kind=resolved.kind, default_core=DEFAULT_CORE)
        preset = apply_to_preset(preset, agent_settings)
        if args.detach_state_every_step:
            core_spec = cores.available().get(preset.core)  # an unknown core is reported when the agent is built
            if core_spec is not None and "detach_state_every_step" not in core_spec.defaults:
                raise UserError(f"--detach-state-every-step: core {preset.core!r} has no recurrent state")
            preset.core_config["detach_state_every_step"] = True
        options = env_options_from_args(args, resolved.kind)
        spec = envs.env_spec(args.env, **options)
        return cls(
            canonical_env_id(args.env),
            spec.kind,
            spec.obs_space,
            spec.action_space,
            options,
            preset,
            spec.memory_horizon,
            spec.max_episode_steps,
            trainer_settings,
            spec.reward_range,
        )

    @classmethod
    def from_meta(cls, meta: dict, env_options: dict | None = None) -> RunSpec:
        """From a checkpoint's meta (:meth:`meta`, every key of :data:`META_KEYS`); ``env_options`` replace
        the recorded ones."""
        kind = envs.resolve_env_id(str(meta["env"])).kind
        agent = dict(RunSpec.upgrade_meta(meta)["agent"])
        preset = Preset(core=meta["core"], core_config=dict(meta["core_config"]), agent=agent)
        options = dict(meta["env_options"]) if env_options is None else env_options
        return cls(str(meta["env"]), kind, dict(meta["obs_space"]), dict(meta["action_space"]), options, preset)

    def spaces(self) -> tuple[Any, Any]:
        """``(tensor observation space, action space)`` as gymnasium spaces."""
        return space_from_dict(self.obs_space), space_from_dict(self.action_space)

    @property
    def obs_shape(self) -> tuple[int, ...] | None:
        """One observation's shape (None for a Dict observation)."""
        shape = self.spaces()[0].shape
        return None if shape is None else tuple(shape)

    @property
    def num_actions(self) -> int:
        """Width of the policy head (``n`` for ``Discrete(n)``)."""
        return make_distribution(self.spaces()[1]).num_params

    def build_agent(self, device: torch.device | str = "cpu") -> torch.nn.Module:
        """The agent of this run (untrained) on ``device``."""
        return build_agent(self.preset, *self.spaces()).to(device)

    def meta(self, agent: torch.nn.Module) -> dict:
        """What a checkpoint of this run records, and what a resume or a remote actor must match."""
        return {
            "trainer": "impala",
            "env": self.env,
            "env_options": dict(self.env_options),
            "core": agent.core_name,
            "core_config": dict(agent.core.config),
            "num_actions": agent.num_actions,
            "obs_shape": list(self.obs_shape or []),
            "obs_space": dict(self.obs_space),
            "action_space": dict(self.action_space),
            "agent": agent.config.to_dict(),
        }

    @staticmethod
    def upgrade_meta(saved: dict) -> dict:
        """A saved meta with the agent options added since it was written set to what the agent had
        before each existed: their defaults, except those in :data:`rfwp_rl.agent.BEFORE_OPTION`."""
        if not isinstance(saved.get("agent"), dict):
            return saved
        return {**saved, "agent": AgentConfig.from_dict({**BEFORE_OPTION, **saved["agent"]}).to_dict()}

    def make_env_pool(self, backend: str, seed: int, num_envs: int, num_batches: int, num_processes: int):
        """The env pool (see :func:`rfwp_rl.impala.env_batches.make_env_pool`); an env slot that can never
        make its env reports it as ``env_fatal`` (one line) instead of failing its worker."""
        obs_space, action_space = self.spaces()
        dist = make_distribution(action_space)
        env_dtype = torch.empty(0, dtype=dist.env_dtype).numpy().dtype  # what env_action gives the env
        action_row = None if dist.plain_index else (dist.env_shape, env_dtype)
        return make_env_pool(
            backend,
            self.env,
            self.env_options,
            seed,
            num_envs,
            num_batches,
            num_processes,
            blank_obs=zero_obs(obs_space),
            action_row=action_row,
        )
