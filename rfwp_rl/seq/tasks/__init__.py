"""The sequence tasks: language modelling (:mod:`.lm`) and three algorithmic tasks
(:mod:`.code_exec`, :mod:`.listops`, :mod:`.assoc`), all generated or read locally.

An algorithmic task (:class:`TaggingTask`) is a set of token sequences with one target per
position (``IGNORE`` where nothing is scored). Batches are time-major and padded at the end
(input index 0, target ``IGNORE``), so padding never influences a scored position of a
causal model. Training batch ``i`` is a deterministic function of ``(seed, i)``, so a
resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rfwp_rl.errors import check_choice
from rfwp_rl.seq.tasks import assoc, code_exec, listops

IGNORE = -100
TASKS = ("lm", "code_exec", "listops", "assoc")


def pad_batch(xs: list[np.ndarray], ys: list[np.ndarray]) -> tuple[Tensor, Tensor]:
    """Sequences ``[L_i]`` (or ``[L_i, F]``) -> x ``[T, B]`` (or ``[T, B, F]``, pad 0) and
    y ``[T, B]`` (pad ``IGNORE``), T the longest length."""
    T = max(len(x) for x in xs)
    x = np.zeros((T, len(xs), *xs[0].shape[1:]), dtype=np.int64)
    y = np.full((T, len(xs)), IGNORE, dtype=np.int64)
    for b, (xi, yi) in enumerate(zip(xs, ys)):
        x[: len(xi), b] = xi
        y[: len(yi), b] = yi
    return torch.from_numpy(x), torch.from_numpy(y)


class FixedSet:
    """A generated split: lists of input and target arrays."""

    def __init__(self, xs: list[np.ndarray], ys: list[np.ndarray]):
        self.xs, self.ys = xs, ys

    def __len__(self) -> int:
        return len(self.xs)

    def batch(self, idx: np.ndarray) -> tuple[Tensor, Tensor]:
        return pad_batch([self.xs[i] for i in idx], [self.ys[i] for i in idx])

    def batches(self, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """Evaluation order: sorted by length (less padding), every sequence once."""
        order = np.argsort([len(x) for x in self.xs], kind="stable")
        for i in range(0, len(order), batch_size):
            yield self.batch(order[i : i + batch_size])


class TaggingTask:
    """Base of the algorithmic tasks.

    Attributes set by subclasses: ``name``, ``field_sizes`` (input vocabulary size per input
    field; one field = plain tokens), ``num_classes``, ``main_metric``, ``no_output`` (the
    class index of "no output" for tasks that report print accuracy, else None),
    ``config`` (a dataclass of generator settings).
    """

    name: str
    field_sizes: tuple[int, ...]
    num_classes: int
    main_metric: str = "seq_acc"
    no_output: int | None = None

    def __init__(self, seed: int):
        self.seed = seed

    def settings(self) -> dict:
        return {"task": self.name, **asdict(self.config), "data_seed": self.seed}

    def train_batch(self, step: int, batch_size: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def eval_batches(self, split: str, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        raise NotImplementedError


class FixedSetTask(TaggingTask):
    """A task with generated train/valid/test sets; training walks through shuffled epochs."""

    splits: dict[str, FixedSet]

    def settings(self) -> dict:
        # The set sizes change what is learned, so they belong to what a resumed run must match.
        return {**super().settings(), "data_sizes": [len(self.splits[s]) for s in ("train", "valid", "test")]}

    def train_batch(self, step: int, batch_size: int) -> tuple[Tensor, Tensor]:
        train = self.splits["train"]
        per_epoch = max(len(train) // batch_size, 1)
        epoch, i = divmod(step, per_epoch)
        order = np.random.default_rng([self.seed, epoch, 11]).permutation(len(train))
        return train.batch(order[i * batch_size : (i + 1) * batch_size])

    def eval_batches(self, split: str, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        check_choice("split", split, [s for s in self.splits if s != "train"])
        return self.splits[split].batches(batch_size)

    def epochs(self, step: int, batch_size: int) -> float:
        return step * batch_size / len(self.splits["train"])


class CodeExecTask(FixedSetTask):
    """RFWP App. B.1; main metric: sequence accuracy."""

    name = "code_exec"
    main_metric = "seq_acc"

    def __init__(
        self, seed: int, num_vars: int = 3, num_statements: int = 100, sizes: tuple[int, int, int] = (10000, 1000, 1000)
    ):
        super().__init__(seed)
        self.config = code_exec.CodeExecConfig(num_vars=num_vars, num_statements=num_statements)
        self.config.check()
        vocab = code_exec.CodeExecVocab(self.config)
        self.field_sizes = (len(vocab.input_tokens),)
        self.num_classes = len(vocab.output_tokens)
        self.no_output = vocab.no_output
        self.vocab = vocab
        self.splits = {
            s: FixedSet(*code_exec.generate(self.config, n, f"{seed}-{s}"))
            for s, n in zip(("train", "valid", "test"), sizes)
        }


class ListOpsTask(FixedSetTask):
    """RFWP App. B.3; main metric: accuracy of the answer (scored at the last position, so
    ``seq_acc`` is the answer accuracy)."""

    name = "listops"
    main_metric = "seq_acc"

    def __init__(
        self, seed: int, depth: int = 10, max_args: int = 5, sizes: tuple[int, int, int] = (10000, 1000, 1000)
    ):
        super().__init__(seed)
        self.config = listops.ListOpsConfig(depth=depth, max_args=max_args)
        self.config.check()
        self.field_sizes = (len(listops.INPUT_TOKENS),)
        self.num_classes = len(listops.OUTPUT_TOKENS)
        self.splits = {
            s: FixedSet(*listops.generate(self.config, n, f"{seed}-{s}"))
            for s, n in zip(("train", "valid", "test"), sizes)
        }


class AssocTask(TaggingTask):
    """Secretly-FWP Sec. 6.1; fresh training sequences every batch, a fixed evaluation set
    (20 sequences x every query, separately drawn for valid and test)."""

    name = "assoc"
    main_metric = "seq_acc"

    def __init__(self, seed: int, num_keys: int = 32, setting: int = 1, eval_sequences: int = 20):
        super().__init__(seed)
        self.config = assoc.AssocConfig(num_keys=num_keys, setting=setting)
        self.config.check()
        self._assoc = assoc
        self.field_sizes = (num_keys, num_keys + 1)
        self.num_classes = num_keys
        self.eval_sets = {
            s: FixedSet(*self._split(assoc.eval_set(seed * 2 + k, self.config, eval_sequences)))
            for k, s in ((1, "valid"), (2, "test"))
        }

    @staticmethod
    def _split(xy: tuple[np.ndarray, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        x, y = xy
        return list(x.transpose(1, 0, 2)), list(y.T)

    def train_batch(self, step: int, batch_size: int) -> tuple[Tensor, Tensor]:
        rng = np.random.default_rng([self.seed, step, 13])
        x, y = self._assoc.train_batch(rng, self.config, batch_size)
        return torch.from_numpy(x), torch.from_numpy(y)

    def eval_batches(self, split: str, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        check_choice("split", split, self.eval_sets)
        return self.eval_sets[split].batches(batch_size)


# --------------------------------------------------------------------------- metrics


@dataclass
class TaggingScore:
    """Accumulated evaluation counts of a tagging task."""

    nll: float = 0.0
    tokens: int = 0
    correct_tokens: int = 0
    sequences: int = 0
    correct_sequences: int = 0
    printed: int = 0
    correct_printed: int = 0

    def add(
        self, logits: Tensor, y: Tensor, no_output: int | None = None, loss_fn: Callable[..., Tensor] | None = None
    ) -> None:
        """logits ``[T, B, C]``, y ``[T, B]`` (IGNORE where not scored); ``loss_fn(logits, y,
        reduction="sum")`` (default: cross-entropy) gives the summed loss."""
        scored = y != IGNORE
        if loss_fn is None:
            self.nll += float(
                F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE, reduction="sum"
                )
            )
        else:
            self.nll += float(loss_fn(logits, y, reduction="sum"))
        right = (logits.argmax(-1) == y) & scored
        self.tokens += int(scored.sum())
        self.correct_tokens += int(right.sum())
        has_target = scored.any(0)
        self.sequences += int(has_target.sum())
        self.correct_sequences += int(((right | ~scored).all(0) & has_target).sum())
        if no_output is not None:
            printed = scored & (y != no_output)
            self.printed += int(printed.sum())
            self.correct_printed += int((right & printed).sum())

    def metrics(self, with_print: bool = False) -> dict[str, float]:
        out = {
            "loss": self.nll / max(self.tokens, 1),
            "token_acc": self.correct_tokens / max(self.tokens, 1),
            "seq_acc": self.correct_sequences / max(self.sequences, 1),
        }
        if with_print:
            out["print_acc"] = self.correct_printed / max(self.printed, 1)
        return out
