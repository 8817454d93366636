"""The command-line vocabulary of every command: one flag name, one unit and one help text per setting.

A trainer's settings are the fields of its config dataclass (:class:`rfwp_rl.impala.config.ImpalaConfig`,
:class:`rfwp_rl.meta_rl.config.MetaRLConfig`, :class:`rfwp_rl.seq.config.SeqConfig`): each field is a
flag ``--field-name`` and a ``--set field_name=VALUE`` key, and the field's default is the flag's
default (help strings show it with ``%(default)s``). :func:`add_fields` makes the flags from the
fields. Settings that several commands share (:data:`SHARED`) have one name and one help text here;
a field adds only what is its command's own (what 0 means, which unit its budget counts). Sample
Factory's ``cfg/cfg.py`` is the model: the shared flags defined once, each command adding its own.

Units: durations are seconds; ``--total-steps`` and the intervals of the RL trainers count env steps;
a budget or interval in optimizer steps is named for them (``--updates``, ``--eval-every-updates``), so
that one flag never takes two units.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable
from typing import Any

from rfwp_rl.errors import UserError

SECONDS = "seconds"
ENV_STEPS = "env steps"
OPTIMIZER_STEPS = "optimizer steps"

# Settings of several commands: the help every one of them starts with ({unit}: the field's unit).
SHARED: dict[str, str] = {
    "seed": "random seed",
    "total_steps": "training budget in {unit}",
    "updates": f"training budget in {OPTIMIZER_STEPS}",
    "learning_rate": "learning rate",
    "adam_eps": "Adam's epsilon",
    "grad_norm_clip": "clip the gradients' global norm to this before each optimizer step (0: no clipping)",
    "entropy_cost": "weight of the entropy bonus in the loss",
    "baseline_cost": "weight of the value (baseline) loss",
    "discount": "discount factor of the returns",
    "num_actors": "environments stepped together by this process",
    "torch_threads": "torch intra-op threads of this process",
    "device": "torch device: cpu, cuda, cuda:1 ...",
    "checkpoint_every": "{unit} between periodic checkpoints (one is also saved at the end and on Ctrl-C / SIGTERM)",
    "log_every": "{unit} between console progress lines",
    "eval_every": "{unit} between evaluations",
}


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers a setting allows: ``low`` < or <= value < or <= ``high`` (``closed``: which ends are
    allowed), NaN never; ``note`` adds what a value means (e.g. ``0: off``)."""

    low: float = 0.0
    high: float = math.inf
    closed: str = "[)"
    note: str = ""

    def allows(self, value: float) -> bool:
        above = value >= self.low if self.closed[0] == "[" else value > self.low
        below = value <= self.high if self.closed[1] == "]" else value < self.high
        return above and below

    def text(self) -> str:
        if self.high == math.inf:
            what = f"a number {'>=' if self.closed[0] == '[' else '>'} {self.low:g}"
        else:
            what = f"a number in {self.closed[0]}{self.low:g}, {self.high:g}{self.closed[1]}"
        return f"{what} ({self.note})" if self.note else what


# The ranges of the number settings several trainers share (as SHARED holds their help); NaN is in none.
SHARED_RANGES: dict[str, Range] = {
    "learning_rate": Range(closed="()"),
    "adam_eps": Range(closed="()"),
    "entropy_cost": Range(),
    "baseline_cost": Range(),
    "discount": Range(0, 1, "[]"),
    "grad_norm_clip": Range(note="0: no clipping"),
    "checkpoint_every": Range(0, math.inf, "[]", "seconds; inf: only at the end"),
    "log_every": Range(0, math.inf, "[]", "seconds"),
}


def shared_ranges(*names: str) -> dict[str, Range]:
    """The :data:`SHARED_RANGES` of ``names``, for a trainer's table of ranges."""
    return {name: SHARED_RANGES[name] for name in names}


def check_ranges(cfg: Any, ranges: dict[str, Range]) -> None:
    """A one-line :class:`UserError` for the first setting of ``cfg`` outside its range."""
    for name, allowed in ranges.items():
        value = getattr(cfg, name)
        if not allowed.allows(value):
            raise UserError(f"{flag_name(name)} {value:g} is invalid; allowed: {allowed.text()}")


class CommandParser(argparse.ArgumentParser):
    """The parser of every ``rfwp-rl`` command: a bad flag or value is one line on stderr naming it
    (argparse's own message), exit status 2, not the command's whole usage before it."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists what is allowed)\n")


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    unit: str = "",
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    type: Callable[[str], Any] | None = None,
    choices: tuple | None = None,
    metavar: str | None = None,
) -> Any:
    """A config dataclass field that is also a flag: ``help`` (after the :data:`SHARED` text of its
    name, if any), ``unit`` (seconds, env steps, optimizer steps: shown in the help), and for the flag
    a parser ``type`` (default: from the annotation), ``choices`` and ``metavar``."""
    metadata = {"help": help, "unit": unit, "type": type, "choices": choices, "metavar": metavar}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def integer(text: str) -> int:
    """An integer flag value; counts may be written ``5e7`` or ``50_000_000``."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected an integer, e.g. 50000000 or 5e7; got {text!r}")
    return int(value)


def flag_name(name: str) -> str:
    """``total_steps`` -> ``--total-steps``."""
    return "--" + name.replace("_", "-")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _field(cls: type, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def default_of(cls: type, name: str) -> Any:
    """The default of field ``name`` of the dataclass ``cls``."""
    f = _field(cls, name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def help_of(cls: type, name: str, help: str | None = None, default: Any = dataclasses.MISSING) -> str:
    """The flag's help: the shared text, the field's own (or ``help``), the unit and ``%(default)s``."""
    f = _field(cls, name)
    own = f.metadata.get("help", "") if help is None else help
    unit = f.metadata.get("unit", "")
    shared = SHARED.get(name, "")
    text = "; ".join(t for t in (shared.format(unit=unit), own) if t)
    if unit and "{unit}" not in shared:
        text = f"{text}; in {unit}" if text else f"in {unit}"
    if default is dataclasses.MISSING:
        if f.default_factory is not dataclasses.MISSING:  # chosen for the machine: the text says how
            return text
        default = f.default
    shown = not (default is None or default is False or (isinstance(default, (str, tuple)) and not default))
    if shown and "%(default)" not in text:
        text = f"{text} (default %(default)s)" if text else "default %(default)s"
    return text


def _parser_type(cls: type, f: dataclasses.Field) -> tuple[Any, Callable[[str], Any] | None]:
    """(the field's plain type, the parser type of its flag)."""
    hint = _hints(cls)[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:  # X | None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if f.metadata.get("type") is not None:
        return hint, f.metadata["type"]
    if hint is int:
        return hint, integer
    if hint in (float, str, bool):
        return hint, hint
    raise TypeError(f"{cls.__name__}.{f.name}: give its flag a parser type (flags.setting(type=...))")


def add_field(
    group: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    name: str,
    *,
    default: Any = dataclasses.MISSING,
    help: str | None = None,
    **kwargs: Any,
) -> argparse.Action:
    """The flag ``--<name>`` of field ``name`` of the config dataclass ``cls`` (dest ``name``). Its
    default is the field's, or ``default`` (None: a setting filled later, e.g. by a profile); ``help``
    replaces the field's own text (the shared text, unit and default stay); ``kwargs`` go to
    ``add_argument``."""
    f = _field(cls, name)
    value = default_of(cls, name) if default is dataclasses.MISSING else default
    plain, parse = _parser_type(cls, f)
    options: dict[str, Any] = dict(dest=name, default=value, help=help_of(cls, name, help, default))
    if plain is bool:
        options["action"] = argparse.BooleanOptionalAction if value is None or value else "store_true"
    elif typing.get_origin(plain) is tuple:  # a list, written as every list flag is: words, commas or both
        options.update(type=parse, nargs="+", action=_TupleItems)
    else:
        options["type"] = parse
        for key in ("choices", "metavar"):
            if f.metadata.get(key) is not None:
                options[key] = f.metadata[key]
    options.update(kwargs)
    return group.add_argument(flag_name(name), **options)


def add_fields(group: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *names: str) -> None:
    """:func:`add_field` for each of ``names`` with the field's own default and help."""
    for name in names:
        add_field(group, cls, name)


def config_from_args(cls: type, args: argparse.Namespace, **changes: Any) -> Any:
    """The ``cls`` config of the parsed flags (the namespace's values of its fields, the field
    defaults for fields without a flag), with ``changes`` on top."""
    values = vars(args)
    given = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
    return cls(**{**given, **changes})


def settings_keys(cls: type, exclude: tuple[str, ...] = ()) -> list[str]:
    """The ``--set`` keys of a trainer config: its fields but ``exclude``."""
    return [f.name for f in dataclasses.fields(cls) if f.name not in exclude]


def add_shared(
    group: argparse.ArgumentParser | argparse._ArgumentGroup,
    name: str,
    default: Any,
    help: str = "",
    *,
    unit: str = "",
    **kwargs: Any,
) -> argparse.Action:
    """A :data:`SHARED` setting as a flag of a command without a config dataclass (eval, probe, bench):
    ``--<name>`` with the shared help, then ``help`` (this command's own), ``unit`` and the default."""
    shared = SHARED[name].format(unit=unit)
    text = "; ".join(t for t in (shared, help) if t)
    if unit and "{unit}" not in SHARED[name]:
        text += f"; in {unit}"
    if default is not None and "%(default)" not in text:
        text += " (default %(default)s)"
    kwargs.setdefault(
        "type",
        integer
        if isinstance(default, int) and not isinstance(default, bool)
        else type(default)
        if default is not None
        else str,
    )
    return group.add_argument(flag_name(name), dest=name, default=default, help=text, **kwargs)


class _Items(argparse.Action):
    """A list flag's words, each already split at its commas, as one flat list."""

    collect: type = list

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, self.collect(item for word in values for item in word))


class _TupleItems(_Items):
    """:class:`_Items` for a config field that holds a tuple."""

    collect = tuple


def add_list_argument(
    group: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    default: list | None,
    help: str,
    item: Callable[[str], Any] = str,
    metavar: str | None = None,
    default_text: str | None = None,
    allow_empty: bool = False,
) -> None:
    """A flag that takes a list, written the one way every command reads lists: words, commas or both
    (``--cores lstm rdn``, ``--cores lstm,rdn``); ``item`` parses each element. The value is a list;
    ``default_text`` says what the default means where the list itself does not (e.g. None: all);
    ``allow_empty``: the flag may be given with no words (an empty list)."""

    def words(text: str) -> list:
        return [item(part.strip()) for part in text.split(",") if part.strip()]

    words.__name__ = getattr(item, "__name__", "item")  # argparse names it in "invalid <type> value"
    shown = default_text if default_text is not None else ", ".join(map(str, default or ())) or "none"
    group.add_argument(
        flag,
        nargs="*" if allow_empty else "+",
        type=words,
        action=_Items,
        default=default,
        metavar=metavar or flag.lstrip("-").upper().rstrip("S"),
        help=f"{help} (a list: words or commas; default {shown})",
    )


# How a trained agent chooses its actions when it is played (eval, probe, the meta-RL tests) or whose plays
# a command reads (compare): the policy's argmax, or drawn from the policy as the actors draw them.
ACTIONS = ("greedy", "sample")
ACTIONS_HELP = (
    "how the agent's actions are chosen: greedy (the policy's argmax) or sample (drawn from it, as in training)"
)


def add_actions_argument(
    group: argparse.ArgumentParser | argparse._ArgumentGroup, default: str, also: dict[str, str] | None = None
) -> None:
    """``--actions`` (dest ``actions``): one of :data:`ACTIONS`, or of ``also`` (choice: what it means)."""
    also = also or {}
    extra = "".join(f", or {name} ({meaning})" for name, meaning in also.items())
    group.add_argument(
        "--actions", choices=(*ACTIONS, *also), default=default, help=f"{ACTIONS_HELP}{extra} (default %(default)s)"
    )


# ---- the flags of every trainer that are not settings of its config


def add_set_argument(group: argparse.ArgumentParser | argparse._ArgumentGroup, what: str, example: str) -> None:
    """``--set KEY=VALUE`` (:mod:`rfwp_rl.overrides`), repeatable; dest ``overrides``."""
    group.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override {what} or a setting of this command by its flag's name with _ for -, "
        f"e.g. {example} (TOML values; repeatable)",
    )


def add_run_dir_argument(group: argparse.ArgumentParser | argparse._ArgumentGroup, default_text: str) -> None:
    """``--run-dir``: the run directory (dest ``run_dir``; None: the command's default)."""
    group.add_argument(
        "--run-dir",
        default=None,
        help=f"run directory; a run started again with it resumes from its newest checkpoint (default {default_text})",
    )
