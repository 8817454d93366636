"""Sequence-task generators and data: they satisfy their definitions (checked by independent
interpreters written here), are deterministic under a seed, and batch correctly."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch

from rfwp_rl.errors import UserError
from rfwp_rl.seq import tasks as T
from rfwp_rl.seq.tasks import assoc, code_exec, listops, lm

# --------------------------------------------------------------------------- code_exec


def interpret(tokens: list[str]) -> tuple[list[str], list[int]]:
    """An independent interpreter of the code-execution language.

    Returns the expected output per token ("N" or the printed value) and every value any
    variable took. Parses the text statement by statement with regular expressions.
    """
    text = " ".join(tokens)
    statements = [s.strip() for s in text.split(";")]
    assert statements[-1] == "", "the program must end with ';'"
    env: dict[str, int] = {}
    outputs: list[str] = []
    taken: list[int] = []
    basic = r"(?:(\w) = (-?\d+)|(\w) (\+\+|--)|print (\w))"
    for stmt in statements[:-1]:
        m = re.fullmatch(r"(?:if (\w) (<|>|==|!=) (-?\d+) : )?" + basic, stmt)
        assert m, f"unparsable statement {stmt!r}"
        cvar, op, cval, avar, aval, ivar, iop, pvar = m.groups()
        run = True
        if cvar is not None:
            assert cvar in env, f"condition on undefined variable in {stmt!r}"
            run = eval(f"{env[cvar]} {op} {int(cval)}")  # noqa: S307 - our own tiny language
        out = "N"
        if run:
            if avar is not None:
                env[avar] = int(aval)
                taken.append(env[avar])
            elif ivar is not None:
                assert ivar in env, f"increment of undefined variable in {stmt!r}"
                env[ivar] += 1 if iop == "++" else -1
                taken.append(env[ivar])
            else:
                assert pvar in env, f"print of undefined variable in {stmt!r}"
                out = str(env[pvar])
        n_tokens = len(stmt.split()) + 1  # + ';'
        outputs += ["N"] * (n_tokens - 1) + [out]
    return outputs, taken


@pytest.mark.parametrize("num_vars", [3, 5])
def test_code_exec_targets_equal_an_independent_interpreter(num_vars):
    config = code_exec.CodeExecConfig(num_vars=num_vars)
    rng = random.Random(f"test-{num_vars}")
    executed_conditional_assignments = 0
    for _ in range(60):
        tokens, outputs = code_exec.generate_program(rng, config)
        expected, taken = interpret(tokens)
        assert outputs == expected
        assert len(tokens) == len(outputs)
        assert tokens.count(";") == 100
        # values stay in the output range, variables are among the first num_vars names
        assert all(-8 <= v <= 16 for v in taken)
        assert {t for t in tokens if t.isalpha() and len(t) == 1} <= set("xyzpr"[:num_vars])
        # the last statement is an unconditional print and yields a value
        last = " ".join(tokens).split(";")[-2].split()
        assert last[0] == "print" and outputs[-1] != "N"
        # count executed conditional assignments to existing variables (the case the
        # reference generator got wrong): the interpreter above checks their labels
        text = " ".join(tokens)
        env_before = {}
        for stmt in [s.strip() for s in text.split(";")][:-1]:
            m = re.fullmatch(r"if (\w) (<|>) (-?\d+) : (\w) = (-?\d+)", stmt)
            if m and m.group(4) in env_before and eval(f"{env_before[m.group(1)]} {m.group(2)} {m.group(3)}"):
                executed_conditional_assignments += 1
            interpret_env = interpret_prefix_env(env_before, stmt)
            env_before = interpret_env
    assert executed_conditional_assignments > 20


def interpret_prefix_env(env: dict[str, int], stmt: str) -> dict[str, int]:
    """Run one statement on a copy of ``env`` (helper for counting cases above)."""
    env = dict(env)
    m = re.fullmatch(r"(?:if (\w) (<|>|==|!=) (-?\d+) : )?(.*)", stmt)
    cvar, op, cval, body = m.groups()
    if cvar is not None and not eval(f"{env[cvar]} {op} {int(cval)}"):
        return env
    if a := re.fullmatch(r"(\w) = (-?\d+)", body):
        env[a.group(1)] = int(a.group(2))
    elif i := re.fullmatch(r"(\w) (\+\+|--)", body):
        env[i.group(1)] += 1 if i.group(2) == "++" else -1
    return env


def test_code_exec_conditional_assignment_updates_the_printed_value():
    # a program where a conditional assignment with a true condition must change the print
    rng = random.Random(0)
    config = code_exec.CodeExecConfig(num_vars=1, num_statements=3)
    found = False
    for _ in range(3000):
        tokens, outputs = code_exec.generate_program(rng, config)
        text = " ".join(tokens)
        m = re.fullmatch(r"x = (\d+) ; if x (<|>) (\d+) : x = (\d+) ; print x ;", text)
        if m and eval(f"{m.group(1)} {m.group(2)} {m.group(3)}") and m.group(1) != m.group(4):
            assert outputs[-1] == m.group(4)  # the new value, not the old one
            found = True
    assert found


def test_code_exec_is_deterministic_and_splits_differ():
    config = code_exec.CodeExecConfig()
    a = code_exec.generate(config, 5, seed=3)
    b = code_exec.generate(config, 5, seed=3)
    c = code_exec.generate(config, 5, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1]))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a[0], c[0]))


def test_code_exec_vocab_and_lengths():
    task = T.CodeExecTask(seed=1, num_vars=3, sizes=(20, 5, 5))
    vocab = task.vocab
    assert vocab.output_tokens[0] == "N" and vocab.output_tokens[1:] == [str(v) for v in range(-8, 17)]
    assert task.num_classes == 26
    lengths = [len(x) for x in task.splits["train"].xs]
    assert 330 < np.mean(lengths) < 520  # ~425 tokens for 100 statements
    x, y = task.train_batch(0, 4)
    assert x.shape[1] == 4 and y.shape == x.shape
    # targets at print positions are values, everything else "no output"
    assert ((y == task.no_output) | (y == T.IGNORE) | (y > 0)).all()


@pytest.mark.parametrize("bad", [dict(num_vars=0), dict(num_vars=6), dict(num_statements=1), dict(cond_ops=("<=",))])
def test_code_exec_bad_config(bad):
    with pytest.raises(UserError):
        code_exec.CodeExecConfig(**bad).check()


# --------------------------------------------------------------------------- listops


def parse_listops(tokens: list[str]) -> tuple[int, int, list[int]]:
    """Independent evaluator: (value, depth, argument counts) of a ListOps token list."""
    stack: list[tuple[str, list[tuple[int, int]]]] = []
    counts = []
    result = None
    for tok in tokens:
        if tok.startswith("["):
            stack.append((tok[1:], []))
        elif tok == "]":
            op, args = stack.pop()
            counts.append(len(args))
            values = [v for v, _ in args]
            value = {"MAX": max, "MIN": min, "FIRST": lambda a: a[0]}[op](values)
            item = (value, 1 + max(d for _, d in args))
            if stack:
                stack[-1][1].append(item)
            else:
                result = item
        else:
            stack[-1][1].append((int(tok), 0))
    assert not stack and result is not None
    return result[0], result[1], counts


@pytest.mark.parametrize("depth", [1, 3, 10])
def test_listops_exact_depth_and_value(depth):
    config = listops.ListOpsConfig(depth=depth)
    xs, ys = listops.generate(config, 200, seed=5)
    for x, y in zip(xs, ys):
        tokens = [listops.INPUT_TOKENS[i] for i in x]
        value, d, counts = parse_listops(tokens)
        assert d == depth
        assert all(2 <= c <= 5 for c in counts)
        assert y[-1] == value and (y[:-1] == T.IGNORE).all()


def test_listops_is_deterministic_under_a_seed():
    config = listops.ListOpsConfig(depth=4)
    a, b, c = (listops.generate(config, 20, seed=s) for s in (1, 1, 2))
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0]))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a[0], c[0]))


def test_listops_lengths_match_the_paper_roughly():
    xs, _ = listops.generate(listops.ListOpsConfig(depth=10), 1000, seed=0)
    assert 80 < np.mean([len(x) for x in xs]) < 120  # paper: mean 98 at depth 10


def test_listops_example_from_the_paper():
    tokens = "[MAX 6 1 [FIRST 2 3 ] 0 [MIN 4 7 1 ] ]".split()
    assert parse_listops(tokens)[:2] == (6, 2)


# --------------------------------------------------------------------------- assoc


def test_assoc_setting1_without_replacement():
    config = assoc.AssocConfig(num_keys=10, setting=1)
    x, y = assoc.train_batch(np.random.default_rng(0), config, 50)
    assert x.shape == (11, 50, 2) and y.shape == (11, 50)
    for b in range(50):
        keys, values = x[:10, b, 0], x[:10, b, 1]
        assert sorted(keys) == list(range(10)) and sorted(values) == list(range(10))
        q = x[10, b, 0]
        assert x[10, b, 1] == config.query_symbol
        assert y[10, b] == values[list(keys).index(q)]
        assert (y[:10, b] == T.IGNORE).all()


def test_assoc_setting2_answer_is_the_most_recent_value():
    config = assoc.AssocConfig(num_keys=5, setting=2)
    x, y = assoc.train_batch(np.random.default_rng(1), config, 200)
    assert x.shape[0] == 11
    reassigned = 0
    for b in range(200):
        keys, values, q = x[:10, b, 0], x[:10, b, 1], x[10, b, 0]
        last = max(i for i in range(10) if keys[i] == q)
        assert y[10, b] == values[last]
        reassigned += (keys == q).sum() > 1
    assert reassigned > 50


def test_assoc_eval_set_asks_every_key_of_20_sequences():
    task = T.AssocTask(seed=2, num_keys=6, setting=1)
    n = sum(y.shape[1] for _, y in task.eval_batches("valid", 1000))
    assert n == 20 * 6
    a = next(task.eval_batches("valid", 1000))[0]
    b = next(T.AssocTask(seed=2, num_keys=6, setting=1).eval_batches("valid", 1000))[0]
    assert torch.equal(a, b)
    assert not torch.equal(a, next(task.eval_batches("test", 1000))[0])
    # training batches: a deterministic function of (seed, step)
    assert torch.equal(task.train_batch(7, 4)[0], T.AssocTask(2, 6, 1).train_batch(7, 4)[0])


def test_assoc_bad_config():
    with pytest.raises(UserError, match="setting 3"):
        T.AssocTask(seed=0, setting=3)


# --------------------------------------------------------------------------- batching and metrics


def test_pad_batch_and_fixed_set_order():
    xs = [np.array([1, 2, 3]), np.array([4])]
    ys = [np.array([0, -100, 5]), np.array([7])]
    x, y = T.pad_batch(xs, ys)
    assert x.tolist() == [[1, 4], [2, 0], [3, 0]]
    assert y.tolist() == [[0, 7], [-100, -100], [5, -100]]
    seen = [len(b[0]) for b in T.FixedSet(xs, ys).batches(1)]
    assert seen == [1, 3]


def test_tagging_score_counts():
    # 2 sequences, 3 steps, 3 classes; class 0 = no output
    y = torch.tensor([[0, 0], [2, T.IGNORE], [1, 2]])
    pred = torch.tensor([[0, 0], [2, 1], [2, 2]])
    logits = torch.nn.functional.one_hot(pred, 3).float() * 10
    s = T.TaggingScore()
    s.add(logits, y, no_output=0)
    m = s.metrics(with_print=True)
    assert m["token_acc"] == pytest.approx(4 / 5)
    assert m["seq_acc"] == pytest.approx(1 / 2)  # seq 0 wrong at the last step
    assert m["print_acc"] == pytest.approx(2 / 3)  # targets 2, 1, 2 -> right, wrong, right


# --------------------------------------------------------------------------- language modelling data


def write_corpus(d, train="a b c\nb c\n", valid="a d\n", test="c\n"):
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        (d / f"{split}.txt").write_text(text)
    return d


def test_corpus_of_words_and_of_chars(tmp_path):
    c = lm.load_corpus(write_corpus(tmp_path), "word")
    assert c.vocab[:3] == ["<eos>", "b", "c"]  # most frequent first
    assert [c.vocab[i] for i in c.train] == "a b c <eos> b c <eos>".split()
    assert [c.vocab[i] for i in c.valid] == ["a", "<unk>", "<eos>"]
    ch = lm.load_corpus(tmp_path, "char")
    assert [ch.vocab[i] for i in ch.test] == ["c", "<eos>"]
    with pytest.raises(UserError, match="no valid file"):
        (tmp_path / "valid.txt").unlink()
        lm.load_corpus(tmp_path)


def test_batchify_and_segments_cover_each_stream():
    data = np.arange(23)
    streams = lm.batchify(data, 3)  # 7 tokens per stream
    assert streams.shape == (7, 3) and streams[:, 1].tolist() == list(range(7, 14))
    xs, ys = zip(*[(x, y) for _, x, y in lm.segments(streams, 4)])
    assert torch.cat(xs).tolist() == streams[:-1].tolist()
    assert torch.cat(ys).tolist() == streams[1:].tolist()


def test_builtin_corpus_builder_is_deterministic(tmp_path):
    from rfwp_rl.seq import data

    lib = tmp_path / "lib"
    (lib / "pkg").mkdir(parents=True)
    doc = "Alpha beta, gamma.\n\nSecond paragraph (with code) here." + " filler" * 40
    for i in range(45):
        (lib / "pkg" / f"m{i:02d}.py").write_text(f'"""{doc} {i}"""\ndef f():\n    """{doc} f{i}"""\n')
    (lib / "site-packages").mkdir()
    (lib / "site-packages" / "x.py").write_text(f'"""{doc} skipped"""')
    a = data.build_stdlib_corpus(tmp_path / "a", lib)
    b = data.build_stdlib_corpus(tmp_path / "b", lib)
    for split in ("train", "valid", "test"):
        assert (a / f"wiki.{split}.tokens").read_text() == (b / f"wiki.{split}.tokens").read_text()
    valid = (a / "wiki.valid.tokens").read_text().splitlines()
    assert valid[0] == "Alpha beta , gamma ."  # WikiText-style tokens, one paragraph a line
    assert "skipped" not in (a / "wiki.train.tokens").read_text()
    c = lm.load_corpus(a, "word")
    assert len(c.train) > 10 * len(c.valid) > 0
