"""Associative retrieval (Secretly-FWP paper Sec. 6.1, settings 1 and 2).

``S`` keys and ``S`` values. A sequence is ``L`` key-value pairs followed by a query key;
the model must output the value stored with that key, seen only at the end:

- setting 1 (capacity, Secretly-FWP Sec. 6.1.1): ``L = S``, keys and values drawn *without*
  replacement (every key once, paired with a random permutation of the values); the query
  is one of the L keys.
- setting 2 (update rules, Sec. 6.1.2): ``L = 2S``, keys and values drawn *with*
  replacement, so a key may be re-assigned; the answer is the most recent value of the
  queried key (a key that occurred).

Each step is one input position with two fields, ``(key, value)``; the query step is
``(key, QUERY)`` with ``QUERY = S`` an extra value symbol. The model embeds the step as the
sum of a key embedding and a value embedding (a linear map of the concatenated [e(k); v],
as the paper's ``W_K [e(k); v]``). Targets are IGNORE except at the query step. The paper
regresses the value's one-hot vector with a squared error; here the answer is a class and
the loss is cross-entropy (accuracy and loss are both reported). Training draws fresh
sequences for every batch; evaluation takes 20 sequences and asks every possible query
(the paper's protocol: a batch of 20 * L).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rfwp_rl.errors import UserError

IGNORE = -100
SETTINGS = (1, 2)


@dataclass(frozen=True)
class AssocConfig:
    num_keys: int = 32  # S
    setting: int = 1

    def check(self) -> None:
        if self.setting not in SETTINGS:
            raise UserError(f"assoc setting {self.setting} is not allowed; allowed: 1, 2")
        if self.num_keys < 2:
            raise UserError(f"assoc num_keys {self.num_keys} is not allowed; allowed: >= 2")

    @property
    def num_pairs(self) -> int:
        """L, the number of key-value pairs before the query."""
        return self.num_keys if self.setting == 1 else 2 * self.num_keys

    @property
    def query_symbol(self) -> int:
        return self.num_keys


def sample_pairs(rng: np.random.Generator, config: AssocConfig, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys and values of ``batch`` sequences: two ``int64 [batch, L]`` arrays."""
    S, L = config.num_keys, config.num_pairs
    if config.setting == 1:
        keys = np.argsort(rng.random((batch, S)), axis=1)[:, :L]
        values = np.argsort(rng.random((batch, S)), axis=1)[:, :L]
    else:
        keys = rng.integers(0, S, size=(batch, L))
        values = rng.integers(0, S, size=(batch, L))
    return keys.astype(np.int64), values.astype(np.int64)


def answer(keys: np.ndarray, values: np.ndarray, query: int) -> int:
    """The most recent value stored with ``query`` in one sequence (keys, values ``[L]``)."""
    hits = np.nonzero(keys == query)[0]
    if len(hits) == 0:
        raise ValueError(f"query {query} does not occur in the sequence")
    return int(values[hits[-1]])


def make_sequences(
    keys: np.ndarray, values: np.ndarray, queries: np.ndarray, config: AssocConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Model inputs and targets for given pairs and queries.

    Args:
        keys, values: ``[N, L]``; queries: ``[N]`` (each occurring in its row of ``keys``).
    Returns:
        x ``int64 [L + 1, N, 2]`` (time-major; fields key, value-or-QUERY) and
        y ``int64 [L + 1, N]`` (IGNORE except the answer at the last step).
    """
    N, L = keys.shape
    x = np.empty((L + 1, N, 2), dtype=np.int64)
    x[:L, :, 0] = keys.T
    x[:L, :, 1] = values.T
    x[L, :, 0] = queries
    x[L, :, 1] = config.query_symbol
    y = np.full((L + 1, N), IGNORE, dtype=np.int64)
    # most recent occurrence of the query: last index where keys == query
    match = keys == queries[:, None]
    if not match.any(axis=1).all():
        raise ValueError("a query does not occur in its sequence")
    last = L - 1 - np.argmax(match[:, ::-1], axis=1)
    y[L] = values[np.arange(N), last]
    return x, y


def train_batch(rng: np.random.Generator, config: AssocConfig, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """A fresh training batch: queries drawn uniformly among each sequence's pairs."""
    keys, values = sample_pairs(rng, config, batch)
    pick = rng.integers(0, config.num_pairs, size=batch)
    queries = keys[np.arange(batch), pick]
    return make_sequences(keys, values, queries, config)


def eval_set(seed: int, config: AssocConfig, num_sequences: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """The evaluation batch: ``num_sequences`` sequences, each asked every key it contains."""
    rng = np.random.default_rng([seed, 7])
    keys, values = sample_pairs(rng, config, num_sequences)
    rows, queries = [], []
    for i in range(num_sequences):
        for q in np.unique(keys[i]):
            rows.append(i)
            queries.append(q)
    rows = np.array(rows)
    return make_sequences(keys[rows], values[rows], np.array(queries, dtype=np.int64), config)
