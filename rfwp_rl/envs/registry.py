"""Environment ids: gymnasium's registry, ALE short names, user modules, close-match errors.

An env id is one of
* a gymnasium id (``CartPole-v1``, ``ALE/Pong-v5``, ``PongNoFrameskip-v4``, ...);
* an ALE game name, case-insensitive (``Pong``, ``SpaceInvaders``, ``space_invaders``);
* ``package.module:EnvId``: the module is imported first (it registers ``EnvId``);
* a memory-suite id ``rfwp/<Task>-<level>-v0`` (:mod:`rfwp_rl.memory`).

Any id whose gymnasium entry point is ale-py's ``AtariEnv`` (image observations) is an
Atari id: only the game is taken from it, the preprocessing settings come from
:data:`rfwp_rl.envs.atari.ATARI_DEFAULTS` and the caller's overrides.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import gymnasium

from rfwp_rl.errors import UserError
from rfwp_rl.memory import register as register_memory_suite

#: Meta-RL POMDP graph task (FWM paper Sec. 4.2); registered lazily (string entry point),
#: so importing this package never needs the module.
POMDP_GRAPH_ID = "rfwp_rl/PomdpGraph-v0"
POMDP_GRAPH_ENTRY_POINT = "rfwp_rl.meta_rl.graph_env:PomdpGraphEnv"

_ALE_ENTRY_POINT = "ale_py.env:AtariEnv"
_ALE_V5 = re.compile(r"^ALE/([A-Za-z0-9]+)-v5$")
_registered = False


def ensure_registered() -> None:
    """Register ale-py's Atari ids and this package's ids with gymnasium (idempotent)."""
    global _registered
    if _registered:
        return
    try:
        import ale_py
    except ImportError:  # Atari ids are then unknown; everything else still works
        ale_py = None
    if ale_py is not None:
        gymnasium.register_envs(ale_py)
    if POMDP_GRAPH_ID not in gymnasium.registry:
        gymnasium.register(id=POMDP_GRAPH_ID, entry_point=POMDP_GRAPH_ENTRY_POINT)
    register_memory_suite()  # rfwp/<Task>-<level>-v0, lazy entry points
    _registered = True


def atari_games() -> dict[str, str]:
    """``{lower-case alias: CamelCase game}`` for every ALE game registered as ``ALE/<Game>-v5``.

    Aliases: the CamelCase name lower-cased (``spaceinvaders``) and ale-py's snake_case ROM
    name (``space_invaders``).
    """
    ensure_registered()
    out: dict[str, str] = {}
    for gym_id, spec in gymnasium.registry.items():
        m = _ALE_V5.match(gym_id)
        if m and _is_ale_image_spec(spec):
            name = m.group(1)
            out[name.lower()] = name
            rom = spec.kwargs.get("game")
            if isinstance(rom, str):
                out[rom.lower()] = name
    return out


def _is_ale_image_spec(spec: gymnasium.envs.registration.EnvSpec) -> bool:
    ep = spec.entry_point
    name = ep if isinstance(ep, str) else f"{getattr(ep, '__module__', '')}:{getattr(ep, '__name__', '')}"
    return name == _ALE_ENTRY_POINT and spec.kwargs.get("obs_type", "rgb") != "ram"


@dataclass(frozen=True)
class ResolvedId:
    """What an env id refers to."""

    kind: str  # 'atari' | 'vector'
    gym_id: str  # the gymnasium id to make (Atari: always 'ALE/<Game>-v5')
    game: str | None = None  # Atari game, CamelCase


def import_env_module(spec: str) -> ModuleType:
    """Import a module that registers gymnasium ids: a file path (``my_env.py``) or a dotted
    module name (``mypkg.envs``). Raises a one-line :class:`UserError` when it cannot."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise UserError(f"env module file {spec!r} does not exist")
        name = "rfwp_rl_user_env_" + re.sub(r"\W", "_", str(path.resolve().with_suffix("")))
        if name in sys.modules:
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise UserError(f"cannot import env module file {spec!r}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            raise UserError(f"importing env module {spec!r} failed: {type(e).__name__}: {e}") from e
        return module
    try:
        return importlib.import_module(spec)
    except ImportError as e:
        raise UserError(f"cannot import env module {spec!r}: {e}") from e


def resolve_env_id(env_id: str) -> ResolvedId:
    """Map an env id (see module docstring) to what :func:`rfwp_rl.envs.make_env` creates.

    Unknown ids raise a one-line :class:`UserError` with close matches.
    """
    ensure_registered()
    if not isinstance(env_id, str) or not env_id.strip():
        raise UserError(f"env id must be a non-empty string, got {env_id!r}")
    if ":" in env_id:
        module, _, env_id = env_id.rpartition(":")
        import_env_module(module)
    if env_id.startswith(MINATAR_PREFIX) and env_id not in gymnasium.registry:
        _register_minatar(env_id)
    spec = gymnasium.registry.get(env_id)
    if spec is not None:
        if _is_ale_image_spec(spec):
            game = atari_games().get(str(spec.kwargs.get("game", "")).lower())
            if game is not None:
                return ResolvedId("atari", f"ALE/{game}-v5", game)
        return ResolvedId("vector", env_id)
    game = atari_games().get(env_id.lower())
    if game is not None:
        return ResolvedId("atari", f"ALE/{game}-v5", game)
    raise UserError(f"unknown environment {env_id!r}; {_suggest(env_id)}")


MINATAR_PREFIX = "MinAtar/"


def _register_minatar(env_id: str) -> None:
    """Register MinAtar's ids (Young & Tian 2019; ``MinAtar/<Game>-v0`` full, ``-v1`` minimal action set): the
    package registers them only when asked, and it is an optional extra."""
    logging.disable(logging.WARNING)  # its import warns that seaborn (for rendering only) is missing
    try:
        import minatar.gym
    except ImportError as e:
        raise UserError(
            f"environment {env_id!r} needs the optional package minatar ({e}); "
            "install it with: pip install -e '.[minatar]'"
        ) from None
    finally:
        logging.disable(logging.NOTSET)
    minatar.gym.register_envs()


def _suggest(env_id: str) -> str:
    games = sorted(set(atari_games().values()))
    names = list(gymnasium.registry) + games
    by_lower: dict[str, str] = {}
    for n in names:
        by_lower.setdefault(n.lower(), n)
    close = difflib.get_close_matches(env_id.lower(), list(by_lower), n=4, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(by_lower[c]) for c in close)}? " if close else ""
    return (
        f"{hint}use a gymnasium id (e.g. 'CartPole-v1', 'ALE/Pong-v5'), an Atari game name "
        f"(e.g. 'Pong'; {len(games)} games), or 'package.module:EnvId' for your own env"
    )
