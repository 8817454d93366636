"""``--set KEY=VALUE``: the one override syntax of every trainer (train, actor, meta-rl, seq).

Keys: ``core`` (the core's name), ``core_config.<option>`` (an option of the core),
``agent.<option>`` (an agent option, where the trainer's agent has any) and the trainer's own
settings by their flag's name with ``_`` for ``-`` (``batch_size``, ``entropy_cost``, ``learning_rate`` ...:
the fields of the trainer's config dataclass, :mod:`rfwp_rl.flags`). Values are TOML
(``64``, ``1e-3``, ``true``, ``'softmax'``, ``[32, 32]``); a bare word that is not TOML is a
string. An unknown key is the same one-line error for every trainer. The files that hold such
settings (agent presets, env configs) are read by :func:`read_toml_file`.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from rfwp_rl.errors import UserError, choices_hint, read_text_file

PRESET_SECTIONS = ("core_config", "agent")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One parsed ``--set`` item: ``key`` (dotted for a section), its ``value`` and the ``item`` as given."""

    key: str
    value: Any
    item: str

    @property
    def section(self) -> str:
        """``core_config``/``agent`` for a dotted key, else ``""``."""
        return self.key.partition(".")[0] if "." in self.key else ""

    @property
    def option(self) -> str:
        return self.key.partition(".")[2] if "." in self.key else self.key


def read_toml_file(path: str | Path, what: str) -> dict:
    """The tables of the TOML file ``path``; a one-line UserError naming ``what`` (e.g. ``preset``) and the
    file where it is missing, not a file, unreadable, not UTF-8 text or not valid TOML."""
    text = read_text_file(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{what} {str(path)!r} is not valid TOML: {e}") from None


def parse_value(text: str) -> Any:
    """A ``--set`` value in TOML syntax; a bare word that is not TOML is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_settings(items: Iterable[str], flag: str = "--set") -> list[Setting]:
    """``["core_config.hidden_size=64", ...]`` -> :class:`Setting` list; a malformed item is a one-line error."""
    out = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"{flag} {item!r}: expected key=value, e.g. core_config.hidden_size=64")
        out.append(Setting(key, parse_value(text.strip()), item))
    return out


def unknown_key(
    setting: Setting, sections: Iterable[str], trainer_keys: Iterable[str], core_options: Iterable[str] = ()
) -> UserError:
    """The one-line error for a key no trainer part takes (the same wording for every trainer)."""
    allowed = ["core", *(f"{s}.<option>" for s in sections)]
    keys = sorted(trainer_keys)
    if keys:
        allowed.append(f"a trainer setting ({', '.join(keys)})")
    hint = ""
    if setting.key in set(core_options):
        hint = f"core options are set as --set core_config.{setting.key}={setting.item.partition('=')[2]}; "
    elif keys and not setting.section:
        hint = choices_hint(setting.key, keys).split("allowed:")[0]  # "did you mean 'x'? " or ""
    return UserError(f"--set {setting.item!r}: unknown key {setting.key!r}; {hint}allowed: {', '.join(allowed)}")


def typed_like(value: Any, current: Any) -> tuple[bool, Any]:
    """Whether ``value`` has the type of ``current`` (an int may stand in for a float, a list for a tuple or
    list; any value for a ``current`` of another type), and ``value`` in that type."""
    if isinstance(current, bool):
        return isinstance(value, bool), value
    if isinstance(current, int):
        return isinstance(value, int) and not isinstance(value, bool), value
    if isinstance(current, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if isinstance(current, str):
        return isinstance(value, str), value
    if isinstance(current, (tuple, list)):
        ok = isinstance(value, list)
        return ok, type(current)(value) if ok else value
    return True, value


def coerce(setting: Setting, current: Any) -> Any:
    """``setting.value`` in the type of the trainer setting's ``current`` value (ints may stand in for floats)."""
    value = setting.value
    if current is None or isinstance(current, str):
        return value if current is None else str(value)
    ok, value = typed_like(value, current)
    if not ok:
        raise UserError(
            f"--set {setting.item!r}: {setting.key} takes a {type(current).__name__} (like {current!r}), got {value!r}"
        )
    return value


def split_settings(
    items: Iterable[str],
    trainer_keys: Iterable[str] = (),
    sections: Iterable[str] = PRESET_SECTIONS,
    core_options: Iterable[str] = (),
) -> tuple[list[Setting], list[Setting]]:
    """Parse ``--set`` items into (agent settings: ``core`` and ``<section>.<option>``, trainer
    settings: ``trainer_keys``); any other key is the one-line :func:`unknown_key` error.
    ``core_options``: the core's option names, only for a better error on a bare option name."""
    sections, keys = tuple(sections), set(trainer_keys)
    agent, trainer = [], []
    for setting in parse_settings(items):
        if setting.key == "core" or (setting.section in sections and setting.option):
            agent.append(setting)
        elif not setting.section and setting.key in keys:
            trainer.append(setting)
        else:
            raise unknown_key(setting, sections, keys, core_options)
    return agent, trainer


def apply_to_preset(preset: Any, settings: Iterable[Setting]) -> Any:
    """A copy of ``preset`` (:class:`rfwp_rl.presets.Preset`) with ``core``/``<section>.<option>`` settings."""
    preset = copy.deepcopy(preset)
    for setting in settings:
        if setting.key == "core":
            preset.core = str(setting.value)
        else:
            getattr(preset, setting.section)[setting.option] = setting.value
    return preset


_EXAMPLES = {int: 0, float: 0.0, str: "", bool: False}


def apply_to_trainer(trainer: Any, settings: Iterable[Setting]) -> None:
    """Set trainer settings on ``trainer`` (a config dataclass or an ``argparse.Namespace``), each
    value in the type of the current one (an unset one of a dataclass: the field's type)."""
    for setting in settings:
        current = getattr(trainer, setting.key)
        if current is None and dataclasses.is_dataclass(trainer):
            hint = typing.get_type_hints(type(trainer)).get(setting.key)
            kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
            current = _EXAMPLES.get(kinds[0]) if len(kinds) == 1 else None
        setattr(trainer, setting.key, coerce(setting, current))


def apply_settings(
    items: Iterable[str],
    preset: Any = None,
    trainer: Any = None,
    trainer_keys: Iterable[str] = (),
    sections: Iterable[str] = PRESET_SECTIONS,
    core_options: Iterable[str] = (),
) -> Any:
    """Apply ``--set`` items: ``core``/``<section>.<option>`` to a copy of ``preset`` (returned),
    trainer keys to ``trainer`` (changed in place). See :func:`split_settings`."""
    agent, trainer_settings = split_settings(items, trainer_keys if trainer is not None else (), sections, core_options)
    apply_to_trainer(trainer, trainer_settings)
    return apply_to_preset(preset, agent) if preset is not None else None


def namespace_keys(values: Mapping[str, Any], exclude: Iterable[str] = ()) -> list[str]:
    """The trainer keys of an ``argparse`` namespace's ``vars()``: its settings minus ``exclude``
    (and private ``_`` keys)."""
    skip = {"command", *exclude}  # "command": the CLI's subcommand
    return [k for k in values if not k.startswith("_") and k not in skip]
