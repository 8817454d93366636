"""Code execution task (RFWP paper Sec. 4.2 and App. B.1; task setting of Fan et al.).

A program is a list of statements over at most ``num_vars`` variables, written as
word-level tokens::

    x = 3 ; y = 7 ; x ++ ; if y < 6 : print x ; print x ;

Statements (each ends with ``;``):

- assign ``v = c ;`` (c a constant in ``const_range``; defines v if it was undefined),
- increment ``v ++ ;`` / decrement ``v -- ;`` of a defined variable,
- print ``print v ;`` of a defined variable,
- conditional ``if v OP c : BODY`` with v defined, OP in ``cond_ops`` and BODY one of the
  basic statements above. BODY is *executed* only when the condition holds: a conditional
  assignment or increment changes the variable (and a conditional assignment to a new
  variable defines it) only then, and a conditional print outputs only then.

The model reads the tokens left to right and predicts one output per token: the printed
value at the ``;`` that ends an executed print, the no-output token ``N`` everywhere else.
Every value a variable takes stays in ``value_range`` (default [-8, 16], the output
vocabulary): a statement whose execution would leave that range is rejected and another is
drawn. The last statement is always an unconditional print of a defined variable, so every
program ends with a prediction. The five statement kinds (assign, ++, --, if, print) are
drawn with equal probability (as in Fan et al.'s generator); 100 statements per program,
10,000 training and 1,000 validation/test programs as in the paper.

Metrics (RFWP App. B.2): sequence accuracy (every output token of the program correct) and
print accuracy (accuracy on the tokens where a value is printed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from rfwp_rl.errors import UserError

VARIABLE_NAMES = ("x", "y", "z", "p", "r")
KEYWORDS = ("=", "++", "--", "print", "if", ":", ";")
ALL_COND_OPS = ("<", ">", "==", "!=")
NO_OUTPUT = "N"
PAD = "<pad>"
KINDS = ("assign", "inc", "dec", "if", "print")
BASIC = ("assign", "inc", "dec", "print")


@dataclass(frozen=True)
class CodeExecConfig:
    """Generator settings (defaults: RFWP paper App. B.1)."""

    num_vars: int = 3
    num_statements: int = 100
    value_range: tuple[int, int] = (-8, 16)
    const_range: tuple[int, int] = (0, 10)
    cond_ops: tuple[str, ...] = ("<", ">")

    def check(self) -> None:
        if not 1 <= self.num_vars <= len(VARIABLE_NAMES):
            raise UserError(f"num_vars {self.num_vars} is not allowed; allowed: 1..{len(VARIABLE_NAMES)}")
        if self.num_statements < 2:
            raise UserError(f"num_statements {self.num_statements} is not allowed; allowed: >= 2")
        lo, hi = self.value_range
        clo, chi = self.const_range
        if not (lo <= clo <= chi <= hi):
            raise UserError(f"const_range {self.const_range} must lie inside value_range {self.value_range}")
        for op in self.cond_ops:
            if op not in ALL_COND_OPS:
                raise UserError(f"condition operator {op!r} is not allowed; allowed: {', '.join(ALL_COND_OPS)}")


class CodeExecVocab:
    """Input and output vocabularies (fixed by the config, identical for every split)."""

    def __init__(self, config: CodeExecConfig):
        lo, hi = config.value_range
        numbers = [str(v) for v in range(lo, hi + 1)]
        self.input_tokens = [PAD, *VARIABLE_NAMES[: config.num_vars], *KEYWORDS, *ALL_COND_OPS, *numbers]
        self.output_tokens = [NO_OUTPUT, *numbers]
        self.input_index = {t: i for i, t in enumerate(self.input_tokens)}
        self.output_index = {t: i for i, t in enumerate(self.output_tokens)}
        self.no_output = self.output_index[NO_OUTPUT]


def _condition(value: int, op: str, const: int) -> bool:
    if op == "<":
        return value < const
    if op == ">":
        return value > const
    if op == "==":
        return value == const
    return value != const


class _Program:
    """Generator state: the variables' values and the tokens/outputs written so far."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.tokens: list[str] = []
        self.outputs: list[str] = []


def _basic(
    rng: random.Random, kind: str, values: dict[str, int], config: CodeExecConfig, names: tuple[str, ...]
) -> tuple[list[str], str, int | None] | None:
    """Draw a basic statement of ``kind``; returns (tokens, variable, value after execution
    or None for print), or None if ``kind`` is impossible (no defined variable)."""
    defined = [v for v in names if v in values]
    if kind == "assign":
        var = rng.choice(names)
        const = rng.randint(*config.const_range)
        return [var, "=", str(const), ";"], var, const
    if not defined:
        return None
    var = rng.choice(defined)
    if kind == "inc":
        return [var, "++", ";"], var, values[var] + 1
    if kind == "dec":
        return [var, "--", ";"], var, values[var] - 1
    return ["print", var, ";"], var, None


def _try_statement(
    rng: random.Random, prog: _Program, config: CodeExecConfig, names: tuple[str, ...], kind: str
) -> bool:
    """Append one statement of ``kind`` if it can be made valid; return whether it was."""
    lo, hi = config.value_range
    cond: list[str] = []
    executed = True
    if kind == "if":
        defined = [v for v in names if v in prog.values]
        if not defined:
            return False
        var = rng.choice(defined)
        op = rng.choice(config.cond_ops)
        const = rng.randint(*config.const_range)
        cond = ["if", var, op, str(const), ":"]
        executed = _condition(prog.values[var], op, const)
        kind = rng.choice(BASIC)
    drawn = _basic(rng, kind, prog.values, config, names)
    if drawn is None:
        return False
    body, var, new_value = drawn
    if executed and new_value is not None and not lo <= new_value <= hi:
        return False  # reject: a value outside the output range (RFWP App. B.1)
    tokens = cond + body
    outputs = [NO_OUTPUT] * len(tokens)
    if executed:
        if new_value is None:  # print
            outputs[-1] = str(prog.values[var])
        else:
            prog.values[var] = new_value
    prog.tokens += tokens
    prog.outputs += outputs
    return True


def generate_program(rng: random.Random, config: CodeExecConfig) -> tuple[list[str], list[str]]:
    """One program: (input tokens, output tokens), equally long."""
    names = VARIABLE_NAMES[: config.num_vars]
    prog = _Program()
    for _ in range(config.num_statements - 1):  # the first one to succeed is an assignment
        while not _try_statement(rng, prog, config, names, rng.choice(KINDS)):
            pass
    while not _try_statement(rng, prog, config, names, "print"):  # last: unconditional print
        pass
    return prog.tokens, prog.outputs


def generate(config: CodeExecConfig, num_programs: int, seed: int | str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``num_programs`` programs as index arrays: inputs (``int64 [L]``) and targets (``int64 [L]``).

    Deterministic for a given ``seed`` (use a different seed per split).
    """
    config.check()
    vocab = CodeExecVocab(config)
    rng = random.Random(f"code_exec-{seed}")
    xs, ys = [], []
    for _ in range(num_programs):
        tokens, outputs = generate_program(rng, config)
        xs.append(np.array([vocab.input_index[t] for t in tokens], dtype=np.int64))
        ys.append(np.array([vocab.output_index[o] for o in outputs], dtype=np.int64))
    return xs, ys
