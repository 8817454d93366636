"""Language modelling data: a WikiText-style corpus, its vocabulary, training segments and
the two evaluation protocols of RFWP paper App. A.1.

Corpus directory: three files for train / valid / test, found as
``wiki.{split}.tokens`` (WikiText-103 as distributed), ``{split}.tokens`` or ``{split}.txt``.
Word level: each line is split on whitespace and ``<eos>`` is appended (WikiText files
already contain ``<unk>``). Character level: the characters of each line, then ``<eos>``.
The vocabulary comes from the training file (most frequent first); tokens seen fewer than
``min_count`` times, and unseen tokens of valid/test, map to ``<unk>``.

Training (``segments``): the token stream is cut into ``batch_size`` contiguous streams
(``[N // B, B]``) read ``seg_len`` tokens at a time; segments are treated independently
(state reset at each) or, for "full context" (App. A.1 "+ full context"), the state at the
end of a segment initialises the next one (gradients stop at segment borders).

Evaluation, batch size 1 (``evaluate_carried`` / ``evaluate_sliding``; ``carried_blocks`` per block):
- carried context: the whole text is read in segments with the state carried over;
- sliding window of ``seg_len``: each window is computed from scratch, only its last
  position is scored, except the first window where every position is (App. A.1). Windows
  are independent, so they are computed many at a time; the numbers equal batch size 1.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rfwp_rl.errors import UserError, check_choice

EOS, UNK = "<eos>", "<unk>"
TOKENS = ("word", "char")  # what one token is
SPLITS = ("train", "valid", "test")


def find_split_file(data_dir: str | os.PathLike, split: str) -> Path:
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(
            f"corpus directory {str(data_dir)!r} does not exist; allowed: a directory "
            "with train/valid/test files, or 'builtin'"
        )
    for name in (f"wiki.{split}.tokens", f"{split}.tokens", f"{split}.txt"):
        if (data_dir / name).is_file():
            return data_dir / name
    raise UserError(f"no {split} file in {data_dir}; allowed names: wiki.{split}.tokens, {split}.tokens, {split}.txt")


def tokenize_line(line: str, tokens: str) -> list[str]:
    """One line's tokens, ``<eos>`` included."""
    line = line.rstrip("\n")
    return (line.split() if tokens == "word" else list(line)) + [EOS]


def read_tokens(path: str | os.PathLike, tokens: str) -> list[str]:
    """The tokens of a corpus file, read line by line (a corpus may be large); a one-line UserError where
    the file is not UTF-8 text."""
    out: list[str] = []
    lines = 0
    with open(path, encoding="utf-8") as f:
        try:
            for line in f:
                out += tokenize_line(line, tokens)
                lines += 1
        except UnicodeDecodeError as e:
            raise UserError(f"corpus file {str(path)!r} is not UTF-8 text ({e.reason} after line {lines})") from None
    return out


@dataclass
class Corpus:
    """Vocabulary and the three splits as ``int64`` index arrays."""

    vocab: list[str]
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    tokens: str
    source: str

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def split(self, name: str) -> np.ndarray:
        check_choice("split", name, SPLITS)
        return getattr(self, name)


def build_vocab(tokens: list[str], min_count: int = 1) -> list[str]:
    """Tokens with count >= ``min_count``, most frequent first (ties: alphabetical), plus
    ``<unk>`` and ``<eos>`` if missing."""
    counts = Counter(tokens)
    vocab = [t for t, c in sorted(counts.items(), key=lambda tc: (-tc[1], tc[0])) if c >= min_count]
    for special in (EOS, UNK):
        if special not in vocab:
            vocab.append(special)
    return vocab


def encode(tokens: list[str], index: dict[str, int]) -> np.ndarray:
    unk = index[UNK]
    return np.array([index.get(t, unk) for t in tokens], dtype=np.int64)


def load_corpus(data_dir: str | os.PathLike, tokens: str = "word", min_count: int = 1) -> Corpus:
    """Read and encode a corpus directory (see the module docstring)."""
    check_choice("tokens", tokens, TOKENS)
    if min_count < 1:
        raise UserError(f"min_count {min_count} is invalid; allowed: an integer >= 1")
    raw = {s: read_tokens(find_split_file(data_dir, s), tokens) for s in SPLITS}
    if len(raw["train"]) < 2:
        raise UserError(f"the train file of {data_dir} has fewer than 2 tokens")
    vocab = build_vocab(raw["train"], min_count)
    index = {t: i for i, t in enumerate(vocab)}
    enc = {s: encode(raw[s], index) for s in SPLITS}
    return Corpus(vocab, enc["train"], enc["valid"], enc["test"], tokens, str(data_dir))


# ----------------------------------------------------------------------------- training


def batchify(data: np.ndarray, batch_size: int) -> np.ndarray:
    """``[N]`` -> ``[N // B, B]``: column b is the b-th contiguous piece of the stream."""
    n = len(data) // batch_size
    if n < 2:
        raise UserError(
            f"the training stream ({len(data)} tokens) is too short for batch size "
            f"{batch_size}; allowed: at least 2 tokens per stream"
        )
    return np.ascontiguousarray(data[: n * batch_size].reshape(batch_size, n).T)


def segments(streams: np.ndarray, seg_len: int, start: int = 0) -> Iterator[tuple[int, Tensor, Tensor]]:
    """Consecutive training segments of a batchified stream ``[N, B]``.

    Yields ``(position, x [T, B], y [T, B])`` with ``y`` the next tokens; ``T = seg_len``
    except possibly for the last segment. ``start`` resumes at a position.
    """
    n = streams.shape[0]
    for i in range(start, n - 1, seg_len):
        T = min(seg_len, n - 1 - i)
        x = torch.from_numpy(streams[i : i + T])
        y = torch.from_numpy(streams[i + 1 : i + 1 + T])
        yield i, x, y


# ----------------------------------------------------------------------------- evaluation

# A model maps (x [T, B] long, state, reset) -> (logits [T, B, V], state).
Model = Callable[..., tuple[Tensor, tuple]]


@dataclass
class LMScore:
    nll: float  # summed negative log-likelihood (nats)
    tokens: int

    @property
    def loss(self) -> float:
        return self.nll / max(self.tokens, 1)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50.0))

    @property
    def bits_per_token(self) -> float:
        return self.loss / math.log(2)


@torch.no_grad()
def carried_blocks(
    model: Model,
    initial_state: Callable[[int], tuple],
    data: np.ndarray,
    seg_len: int,
    block: int | None = None,
    restart: bool = False,
    device: str | torch.device = "cpu",
) -> list[LMScore]:
    """Carried context, batch 1: read ``data`` in segments of ``seg_len`` with the state
    carried over, every next-token prediction scored; one score per block of ``block``
    predictions (a multiple of ``seg_len``; None: one block). With ``restart`` the state starts
    again from ``initial_state`` at every block."""
    state = initial_state(1)
    scores: list[LMScore] = []
    for pos, x, y in segments(data.reshape(-1, 1), seg_len):
        if not scores or (block is not None and pos % block == 0):
            if scores and restart:
                state = initial_state(1)
            scores.append(LMScore(0.0, 0))
        logits, state = model(x.to(device), state, None)
        scores[-1].nll += float(
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]).cpu(), y.reshape(-1), reduction="sum")
        )
        scores[-1].tokens += y.numel()
    return scores


def evaluate_carried(
    model: Model,
    initial_state: Callable[[int], tuple],
    data: np.ndarray,
    seg_len: int,
    max_tokens: int | None = None,
    device: str | torch.device = "cpu",
) -> LMScore:
    """Carried context, batch 1, over the whole of ``data`` (or its first ``max_tokens``
    predictions): see :func:`carried_blocks`."""
    data = data if max_tokens is None else data[: max_tokens + 1]
    blocks = carried_blocks(model, initial_state, data, seg_len, device=device)
    return blocks[0] if blocks else LMScore(0.0, 0)


@torch.no_grad()
def evaluate_sliding(
    model: Model,
    initial_state: Callable[[int], tuple],
    data: np.ndarray,
    seg_len: int,
    windows_per_batch: int = 64,
    max_tokens: int | None = None,
    device: str | torch.device = "cpu",
) -> LMScore:
    """Sliding window of ``seg_len`` tokens: the first window scores all its positions, each
    later window (ending one token further) scores only its last position (App. A.1)."""
    data = data if max_tokens is None else data[: max_tokens + 1]
    n = len(data) - 1  # number of predictions
    if n < 1:
        raise UserError("the evaluation text has fewer than 2 tokens")
    L = min(seg_len, n)
    x0 = torch.from_numpy(data[:L]).view(L, 1)
    logits, _ = model(x0.to(device), initial_state(1), None)
    y0 = torch.from_numpy(data[1 : L + 1])
    nll = float(F.cross_entropy(logits[:, 0].cpu(), y0, reduction="sum"))
    count = L
    ends = np.arange(L, n)  # window ends at index e (inputs data[e-L+1 .. e]), target data[e+1]
    offsets = np.arange(-L + 1, 1)
    for i in range(0, len(ends), windows_per_batch):
        e = ends[i : i + windows_per_batch]
        x = torch.from_numpy(data[e[None, :] + offsets[:, None]])  # [L, nwin]
        logits, _ = model(x.to(device), initial_state(len(e)), None)
        y = torch.from_numpy(data[e + 1])
        nll += float(F.cross_entropy(logits[-1].cpu(), y, reduction="sum"))
        count += len(e)
    return LMScore(nll, count)


# ----------------------------------------------------------------------------- the task

CONTEXTS = ("independent", "carried")
EVAL_MODES = ("auto", "carried", "sliding")


class LMTask:
    """Language modelling on a corpus: training segments and the evaluation protocols.

    Args:
        corpus: the loaded corpus.
        seg_len: training segment length (the back-propagation span) and evaluation window.
        context: "independent" segments or "carried" state (full context).
    """

    name = "lm"
    main_metric = "ppl"

    def __init__(self, corpus: Corpus, seg_len: int = 128, context: str = "independent"):
        check_choice("context", context, CONTEXTS)
        if seg_len < 1:
            raise UserError(f"seg_len {seg_len} is invalid; allowed: an integer >= 1")
        self.corpus, self.seg_len, self.context = corpus, seg_len, context
        self.field_sizes = (corpus.vocab_size,)
        self.num_classes = corpus.vocab_size
        self._streams: dict[int, np.ndarray] = {}

    def settings(self) -> dict:
        return {
            "task": "lm",
            "corpus": self.corpus.source,
            "tokens": self.corpus.tokens,
            "vocab_size": self.corpus.vocab_size,
            "train_tokens": len(self.corpus.train),
            "seg_len": self.seg_len,
            "context": self.context,
        }

    def streams(self, batch_size: int) -> np.ndarray:
        if batch_size not in self._streams:
            self._streams[batch_size] = batchify(self.corpus.train, batch_size)
        return self._streams[batch_size]

    def segments_per_epoch(self, batch_size: int) -> int:
        n = self.streams(batch_size).shape[0]
        return -(-(n - 1) // self.seg_len)

    def train_segment(self, step: int, batch_size: int) -> tuple[Tensor, Tensor, bool]:
        """Training step ``step``'s segment: x, y ``[T, B]`` and whether it starts an epoch
        (the carried state must then start from the initial state)."""
        streams = self.streams(batch_size)
        i = step % self.segments_per_epoch(batch_size)
        pos = i * self.seg_len
        T = min(self.seg_len, streams.shape[0] - 1 - pos)
        x = torch.from_numpy(streams[pos : pos + T])
        y = torch.from_numpy(streams[pos + 1 : pos + 1 + T])
        return x, y, i == 0

    def epochs(self, step: int, batch_size: int) -> float:
        return step / self.segments_per_epoch(batch_size)

    def evaluate(
        self,
        model: Model,
        initial_state: Callable[[int], tuple],
        split: str,
        mode: str = "auto",
        max_tokens: int | None = None,
        windows_per_batch: int = 64,
        device: str | torch.device = "cpu",
    ) -> dict[str, float]:
        """``{"loss", "ppl", "bpt", "tokens"}`` on ``split`` with protocol ``mode``
        ("auto": carried context if training carried it, else the sliding window)."""
        check_choice("evaluation mode", mode, EVAL_MODES)
        if mode == "auto":
            mode = "carried" if self.context == "carried" else "sliding"
        data = self.corpus.split(split)
        if mode == "carried":
            score = evaluate_carried(model, initial_state, data, self.seg_len, max_tokens, device)
        else:
            score = evaluate_sliding(model, initial_state, data, self.seg_len, windows_per_batch, max_tokens, device)
        return {"loss": score.loss, "ppl": score.perplexity, "bpt": score.bits_per_token, "tokens": score.tokens}
