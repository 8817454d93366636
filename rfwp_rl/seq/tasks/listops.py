"""Sequential ListOps (RFWP paper Sec. 4.3 and App. B.3; after Nangia & Bowman's ListOps).

A list is an operation in prefix notation applied to 2..``max_args`` arguments, each a
single digit or a sub-list::

    [MAX 6 1 [FIRST 2 3 ] 0 [MIN 4 7 1 ] ]   ->  6   (depth 2)

Operations: MAX, MIN, FIRST, so every answer is a digit. The depth of a digit is 0 and the
depth of a list is one more than the deepest of its arguments; a generated sequence has
*exactly* the requested depth: the top list carries one argument of depth ``depth - 1``
(at a random position, recursively), and every other argument is a digit or, with
probability ``p_sublist``, a shallower sub-list (depth drawn uniformly below the current
one). The model reads the tokens once, left to right, and the answer is scored at the
last position only. ``p_sublist = 0.12`` gives lengths 34-347 (mean 97) at depth 10 and
56-930 (mean 205) at depth 15 (the paper: 37-364, mean 98, and 61-676, mean about 190);
10,000 training and 1,000 validation/test sequences as in the paper.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from rfwp_rl.errors import UserError

OPS = ("[MAX", "[MIN", "[FIRST")
CLOSE = "]"
DIGITS = tuple(str(d) for d in range(10))
PAD = "<pad>"
INPUT_TOKENS = (PAD, *OPS, CLOSE, *DIGITS)
OUTPUT_TOKENS = DIGITS
IGNORE = -100


@dataclass(frozen=True)
class ListOpsConfig:
    depth: int = 10
    max_args: int = 5
    p_sublist: float = 0.12

    def check(self) -> None:
        if self.depth < 1:
            raise UserError(f"listops depth {self.depth} is not allowed; allowed: >= 1")
        if self.max_args < 2:
            raise UserError(f"listops max_args {self.max_args} is not allowed; allowed: >= 2")
        if not 0.0 <= self.p_sublist < 1.0:
            raise UserError(f"listops p_sublist {self.p_sublist} is not allowed; allowed: [0, 1)")


def apply_op(op: str, args: list[int]) -> int:
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    return args[0]


def generate_list(rng: random.Random, depth: int, config: ListOpsConfig) -> tuple[list[str], int]:
    """A list of exactly ``depth`` (>= 1): (tokens, value)."""
    op = rng.choice(OPS)
    nargs = rng.randint(2, config.max_args)
    deep = rng.randrange(nargs)
    tokens, values = [op], []
    for i in range(nargs):
        if i == deep and depth > 1:
            sub, value = generate_list(rng, depth - 1, config)
        elif depth > 1 and rng.random() < config.p_sublist:
            sub, value = generate_list(rng, rng.randint(1, depth - 1), config)
        else:
            value = rng.randrange(10)
            sub = [str(value)]
        tokens += sub
        values.append(value)
    tokens.append(CLOSE)
    return tokens, apply_op(op, values)


def generate(config: ListOpsConfig, num_sequences: int, seed: int | str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs (``int64 [L]``) and targets (``int64 [L]``, IGNORE except the answer at the end)."""
    config.check()
    index = {t: i for i, t in enumerate(INPUT_TOKENS)}
    rng = random.Random(f"listops-{seed}")
    xs, ys = [], []
    for _ in range(num_sequences):
        tokens, value = generate_list(rng, config.depth, config)
        x = np.array([index[t] for t in tokens], dtype=np.int64)
        y = np.full(len(tokens), IGNORE, dtype=np.int64)
        y[-1] = value
        xs.append(x)
        ys.append(y)
    return xs, ys
