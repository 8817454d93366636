"""Agent presets: small TOML files naming a core, its options and agent options.

A preset file (see ``agents/README.md``)::

    description = "RFWP paper's Atari RDN"     # optional
    core = "rdn"
    [core_config]                               # keyword options of rfwp_rl.cores.make
    hidden_size = 128
    num_layers = 2
    [agent]                                     # optional, fields of rfwp_rl.agent.AgentConfig
    use_prev_action = false

``load_preset("atari_rdn")`` reads ``agents/atari_rdn.toml`` (the checkout's, or the copy shipped in a wheel);
``load_preset("my.toml")`` reads a file. ``apply_overrides(preset, ["core_config.hidden_size=64"])``
applies ``--set`` overrides; values use TOML syntax (``64``, ``true``, ``'softmax'``,
``[32, 32]``), and a bare word is taken as a string.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rfwp_rl import cores
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.overrides import apply_settings, parse_value, read_toml_file  # noqa: F401  (parse_value: env options use it too)
from rfwp_rl.resources import data_dir

# the repository's agents/ in a checkout, else the copy shipped in the wheel
AGENTS_DIR = data_dir("agents", required=False)
TOP_LEVEL_KEYS = ("description", "core", "core_config", "agent")
AGENT_KINDS = ("vector", "atari")
"""Preset file prefixes: a core with neither an ``agents/vector_<core>.toml`` nor an
``agents/atari_<core>.toml`` is a sequence-model core, not offered to the RL trainers."""


@dataclasses.dataclass
class Preset:
    """A loaded preset: ``core`` name, ``core_config`` and ``agent`` option dicts."""

    core: str
    core_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    agent: dict[str, Any] = dataclasses.field(default_factory=dict)
    description: str = ""
    source: str = "<defaults>"  # file the preset came from

    def to_dict(self) -> dict:
        return {"core": self.core, "core_config": dict(self.core_config), "agent": dict(self.agent)}


def available_presets() -> list[str]:
    """Names of the presets in ``agents/`` (the checkout's, or the copy shipped in a wheel)."""
    if not AGENTS_DIR.is_dir():
        return []
    return sorted(p.stem for p in AGENTS_DIR.glob("*.toml"))


def preset_cores(kind: str) -> list[str]:
    """The cores that have an ``agents/<kind>_<core>.toml`` preset (``kind``: ``vector``, ``atari``), sorted."""
    return sorted(name.split("_", 1)[1] for name in available_presets() if name.startswith(f"{kind}_"))


def preset_path(name_or_path: str | Path) -> Path:
    """The file of a preset given by name (``atari_rdn``) or path (``my/agent.toml``)."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.parent != Path("."):
        return p  # read_toml_file says what is wrong with it, if anything
    candidate = AGENTS_DIR / f"{p.name}.toml"
    if candidate.is_file():
        return candidate
    if not AGENTS_DIR.is_dir():
        raise UserError(
            f"preset {str(name_or_path)!r}: the presets folder {AGENTS_DIR} is missing (pass a file path to --preset)"
        )
    check_choice("preset", str(name_or_path), available_presets())
    raise AssertionError("unreachable")


def parse_preset(data: dict, source: str) -> Preset:
    """Validate the structure of a preset dict (as read from TOML)."""
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            check_choice(f"key in preset {source}:", key, TOP_LEVEL_KEYS)
    if "core" not in data or not isinstance(data["core"], str):
        raise UserError(f'preset {source} needs a line core = "<name>" (e.g. core = "rdn")')
    for table in ("core_config", "agent"):
        if not isinstance(data.get(table, {}), dict):
            raise UserError(f"preset {source}: {table} must be a table ([{table}])")
    return Preset(
        core=data["core"],
        core_config=dict(data.get("core_config", {})),
        agent=dict(data.get("agent", {})),
        description=str(data.get("description", "")),
        source=source,
    )


def load_preset(name_or_path: str | Path) -> Preset:
    """Read a preset by name (from ``agents/``) or by file path; one-line errors."""
    path = preset_path(name_or_path)
    return parse_preset(read_toml_file(path, "preset file"), str(path))


def apply_overrides(preset: Preset, overrides: Iterable[str]) -> Preset:
    """Return a copy of ``preset`` with ``--set key=value`` overrides applied
    (:func:`rfwp_rl.overrides.apply_settings`; keys ``core``, ``core_config.<option>``,
    ``agent.<option>``). Option names are checked later, by the core and the agent config."""
    return apply_settings(overrides, preset)


def resolve_preset(
    core: str | None,
    preset: str | None,
    overrides: Iterable[str] = (),
    kind: str = "vector",
    default_core: str = "lstm",
) -> Preset:
    """The preset a training run uses.

    ``preset`` (name or path) wins; otherwise ``--core NAME`` picks ``agents/<kind>_NAME.toml``
    (``kind``: ``atari`` for image observations, ``vector`` for vectors) when it exists and the
    core's own defaults otherwise. A ``core`` that contradicts the preset's is an error.
    ``overrides`` are ``--set`` items.
    """
    if preset is not None:
        p = load_preset(preset)
        if core is not None and core != p.core:
            raise UserError(
                f"--core {core!r} contradicts preset {p.source} (core = {p.core!r}); pass only one, or --set core=..."
            )
    else:
        name = core or default_core
        check_choice("core", name, sorted(cores.available()))
        kind_file = AGENTS_DIR / f"{kind}_{name}.toml"
        if AGENTS_DIR.is_dir() and not any((AGENTS_DIR / f"{k}_{name}.toml").is_file() for k in AGENT_KINDS):
            agent_cores = sorted({core for k in AGENT_KINDS for core in preset_cores(k)})
            raise UserError(
                f"core {name!r} has no agent preset (agents/<vector|atari>_{name}.toml): a sequence-model core "
                f"(rfwp-rl seq; agent cores: {', '.join(agent_cores)}; an own preset: --preset FILE.toml)"
            )
        p = load_preset(kind_file) if kind_file.is_file() else Preset(core=name)
    return apply_overrides(p, overrides)
