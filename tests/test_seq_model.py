"""The sequence model and trainer: carried context equals one pass, the sliding window equals
windows computed one by one, the Transformer baseline is causal and respects resets, and
the CLI trains, writes results, resumes exactly, and refuses impossible settings."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rfwp_rl.errors import UserError
from rfwp_rl.seq import train
from rfwp_rl.seq.model import SeqModel, positions_since_reset
from rfwp_rl.seq.tasks import lm

D = torch.float64
V = 11
FW_SMALL = {"hidden_size": 8, "num_layers": 2, "num_heads": 2, "ff_size": 12}
SMALL = {
    "lstm": {"hidden_size": 8, "num_layers": 2},
    "gru": {"hidden_size": 8, "num_layers": 2},
    "transformer": FW_SMALL,
    **{c: FW_SMALL for c in ("lt", "delta", "delta_rnn", "rdn", "delta_lstm", "delta_mlp", "delta_delta")},
}
STATEFUL = ("lstm", "gru", "delta", "delta_rnn", "rdn", "delta_lstm")


def model_for(core: str, fields=(V,), classes=V, seed=0) -> SeqModel:
    torch.manual_seed(seed)
    return SeqModel(core, fields, classes, emb_size=6, core_config=SMALL[core]).to(D).eval()


def tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, size=n).astype(np.int64)


@torch.no_grad()
def one_pass_nll(model: SeqModel, data: np.ndarray) -> torch.Tensor:
    logits, _ = model(torch.from_numpy(data[:-1]).view(-1, 1))
    return F.cross_entropy(logits[:, 0], torch.from_numpy(data[1:]), reduction="none")


# ------------------------------------------------------------------------- carried context


@pytest.mark.parametrize("core", STATEFUL)
def test_carried_evaluation_equals_one_pass(core):
    model = model_for(core)
    data = tokens(41)
    score = lm.evaluate_carried(model, model.initial_state, data, seg_len=7)
    assert score.tokens == 40
    assert score.nll == pytest.approx(float(one_pass_nll(model, data).sum()), rel=1e-10)


@pytest.mark.parametrize("core", ("delta", "delta_lstm", "lstm"))
def test_carried_training_segments_equal_one_pass_per_stream(core, tmp_path):
    (tmp_path / "train.txt").write_text(" ".join(str(t) for t in tokens(200, 1)) + "\n")
    (tmp_path / "valid.txt").write_text("1 2\n")
    (tmp_path / "test.txt").write_text("1 2\n")
    task = lm.LMTask(lm.load_corpus(tmp_path), seg_len=9, context="carried")
    model = SeqModel(core, task.field_sizes, task.num_classes, 6, SMALL[core]).to(D)
    B = 3
    n_seg = task.segments_per_epoch(B)
    # exactly the trainer's rule: fresh state at an epoch start, else the detached carried one
    carried, outs, ys = None, [], []
    for step in range(n_seg):
        x, y, epoch_start = task.train_segment(step, B)
        logits, state = model(x, None if epoch_start else carried)
        carried = tuple(s.detach() for s in state)
        outs.append(logits)
        ys.append(y)
    streams = torch.from_numpy(task.streams(B))
    whole, _ = model(streams[:-1])
    torch.testing.assert_close(torch.cat(outs), whole)
    assert torch.equal(torch.cat(ys), streams[1:])
    assert task.train_segment(n_seg, B)[2]  # the next epoch starts fresh


@pytest.mark.parametrize("core", ("delta", "transformer"))
@torch.no_grad()
def test_sliding_window_equals_windows_one_by_one(core):
    model = model_for(core)
    data, L = tokens(30, 2), 6
    score = lm.evaluate_sliding(model, model.initial_state, data, L, windows_per_batch=4)
    nll = float(one_pass_nll(model, data[: L + 1]).sum())  # first window: all positions
    for e in range(L, len(data) - 1):  # then only the last one
        logits, _ = model(torch.from_numpy(data[e - L + 1 : e + 1]).view(-1, 1))
        nll += float(F.cross_entropy(logits[-1], torch.from_numpy(data[e + 1 : e + 2])))
    assert score.tokens == len(data) - 1
    assert score.nll == pytest.approx(nll, rel=1e-10)


# ------------------------------------------------------------------------- the model


def test_fields_are_summed_embeddings_and_shapes():
    model = model_for("delta", fields=(5, 7), classes=4)
    x = torch.stack([torch.randint(0, 5, (3, 2)), torch.randint(0, 7, (3, 2))], -1)
    logits, state = model(x)
    assert logits.shape == (3, 2, 4) and len(state) == 2
    e = model.embed(x)
    torch.testing.assert_close(e, model.embeddings[0](x[..., 0]) + model.embeddings[1](x[..., 1]))
    with pytest.raises(UserError, match=r"\[T, B, 2\]"):
        model(torch.zeros(3, 2, 3, dtype=torch.long))


@pytest.mark.parametrize("core", sorted(SMALL))
def test_every_core_runs_in_the_model(core):
    logits, _ = model_for(core)(torch.randint(0, V, (5, 2)))
    assert logits.shape == (5, 2, V) and torch.isfinite(logits).all()


def test_transformer_is_causal_and_resets_start_a_new_span():
    model = model_for("transformer")
    assert model.positions and not model.carries_state
    x = torch.randint(0, V, (8, 2))
    y, state = model(x)
    assert state == ()
    x2 = x.clone()
    x2[5:] = (x2[5:] + 1) % V
    torch.testing.assert_close(model(x2)[0][:5], y[:5])  # the future is not seen
    reset = torch.zeros(8, 2, dtype=torch.bool)
    reset[4, 1] = True
    yr, _ = model(x, None, reset)
    torch.testing.assert_close(yr[4:, 1], model(x[4:, 1:])[0][:, 0])  # as a fresh sequence
    torch.testing.assert_close(yr[:, 0], y[:, 0])


def test_positions_restart_at_resets():
    reset = torch.tensor([[False, False], [False, True], [True, False], [False, False]])
    assert positions_since_reset(reset, 4, 2, torch.device("cpu")).tolist() == [[0, 0], [1, 0], [0, 1], [1, 2]]


# ------------------------------------------------------------------------- the CLI


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    return parser.parse_args(argv)


ASSOC = [
    "--task",
    "assoc",
    "--num-keys",
    "4",
    "--core",
    "lt",
    "--num-layers",
    "1",
    "--num-heads",
    "1",
    "--hidden-size",
    "16",
    "--ff-size",
    "32",
    "--emb-size",
    "16",
    "--learning-rate",
    "3e-3",
    "--batch-size",
    "16",
    "--torch-threads",
    "1",
]


def test_cli_learns_assoc_and_writes_results(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train.run(parse(ASSOC + ["--updates", "300", "--eval-every-updates", "100", "--run-dir", str(run_dir)])) == 0
    res = json.loads((run_dir / "results.json").read_text())
    assert res["settings"]["task"] == "assoc" and res["settings"]["num_keys"] == 4
    assert res["training"]["updates"] == 300 and res["train_seconds"] > 0
    assert res["valid"]["seq_acc"] > 0.9 and res["test"]["seq_acc"] > 0.9  # chance: 0.25
    assert (run_dir / "tb").is_dir() and (run_dir / "best.pt").is_file()


def test_cli_resume_equals_an_uninterrupted_run(tmp_path, capsys):
    common = ASSOC + ["--eval-every-updates", "3", "--checkpoint-every", "1000"]  # checkpoints: the final ones
    train.run(parse(common + ["--updates", "6", "--run-dir", str(tmp_path / "a")]))
    train.run(parse(common + ["--updates", "3", "--run-dir", str(tmp_path / "b")]))
    train.run(parse(common + ["--updates", "6", "--run-dir", str(tmp_path / "b")]))
    assert "resuming" in capsys.readouterr().out
    a = torch.load(tmp_path / "a" / "ckpt_000000000006.pt", weights_only=False)["state"]["model"]
    b = torch.load(tmp_path / "b" / "ckpt_000000000006.pt", weights_only=False)["state"]["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    with pytest.raises(UserError, match="does not match this run"):
        train.run(parse(common + ["--updates", "6", "--learning-rate", "1e-3", "--run-dir", str(tmp_path / "b")]))


def test_a_checkpoint_with_the_settings_earlier_names_resumes(tmp_path, capsys):
    """``warmup`` (now ``warmup_updates``) in a checkpoint written before the rename is the same setting."""
    common = ASSOC + ["--eval-every-updates", "3", "--checkpoint-every", "1000", "--run-dir", str(tmp_path)]
    assert train.run(parse(common + ["--updates", "3"])) == 0
    path = tmp_path / "ckpt_000000000003.pt"
    saved = torch.load(path, weights_only=False)
    assert saved["meta"].pop("warmup_updates") == 0
    saved["meta"]["warmup"] = 0
    torch.save(saved, path)
    assert train.run(parse(common + ["--updates", "6"])) == 0
    assert "resuming" in capsys.readouterr().out and (tmp_path / "ckpt_000000000006.pt").is_file()
    saved["meta"]["warmup"] = 5  # a different value under the earlier name is a different run
    torch.save(saved, path)
    (tmp_path / "ckpt_000000000006.pt").unlink()
    with pytest.raises(UserError, match="warmup_updates"):
        train.run(parse(common + ["--updates", "6"]))


def test_cli_language_model_with_carried_context(tmp_path):
    data = tmp_path / "corpus"
    data.mkdir()
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "."]
    for split, n in (("train", 300), ("valid", 20), ("test", 20)):
        lines = [" ".join(rng.choice(words, 6)) for _ in range(n)]
        (data / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    argv = [
        "--task",
        "lm",
        "--data",
        str(data),
        "--core",
        "delta_rnn",
        "--hidden-size",
        "16",
        "--num-heads",
        "2",
        "--ff-size",
        "32",
        "--emb-size",
        "16",
        "--seg-len",
        "16",
        "--batch-size",
        "4",
        "--updates",
        "20",
        "--eval-every-updates",
        "10",
        "--context",
        "carried",
        "--torch-threads",
        "1",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    assert train.run(parse(argv)) == 0
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["settings"]["context"] == "carried" and res["eval_mode"] == "auto"
    assert res["valid"]["tokens"] == 20 * 7 - 1
    assert 1.0 < res["test"]["ppl"] < 40


@pytest.mark.parametrize("core", ("delta", "lstm"))
def test_context_blocks_carried_sum_to_one_pass_and_restarted_blocks_start_fresh(core):
    model = model_for(core)
    data = tokens(50)
    ref = one_pass_nll(model, data)  # 49 predictions, one pass
    carried = lm.carried_blocks(model, model.initial_state, data, seg_len=7, block=14)
    assert [b.tokens for b in carried] == [14, 14, 14, 7]
    assert sum(b.nll for b in carried) == pytest.approx(float(ref.sum()), rel=1e-10)
    restarted = lm.carried_blocks(model, model.initial_state, data, seg_len=7, block=14, restart=True)
    for i, b in enumerate(restarted):  # block i alone, from the zero state
        alone = one_pass_nll(model, data[14 * i : 14 * i + b.tokens + 1])
        assert b.nll == pytest.approx(float(alone.sum()), rel=1e-10)
    assert restarted[0].nll == pytest.approx(carried[0].nll, rel=1e-12)
    assert restarted[1].nll != pytest.approx(carried[1].nll, rel=1e-6)  # the state matters


def test_context_blocks_cli_reads_a_run_and_refuses_bad_blocks(tmp_path, capsys):
    from rfwp_rl.seq import context_blocks

    data = tmp_path / "corpus"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 200), ("valid", 30), ("test", 10)):
        (data / f"{split}.txt").write_text(
            "\n".join(" ".join(rng.choice(["a", "b", "c", "d"], 6)) for _ in range(n)) + "\n"
        )
    argv = [
        "--task",
        "lm",
        "--data",
        str(data),
        "--core",
        "lstm",
        "--hidden-size",
        "8",
        "--emb-size",
        "8",
        "--seg-len",
        "16",
        "--batch-size",
        "4",
        "--updates",
        "4",
        "--eval-every-updates",
        "4",
        "--context",
        "carried",
        "--torch-threads",
        "1",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    assert train.run(parse(argv)) == 0
    out = tmp_path / "blocks.csv"
    assert context_blocks.main([str(tmp_path / "run"), "--block", "64", "--min-count", "1", "--out", str(out)]) == 0
    rows = out.read_text().splitlines()
    assert rows[0] == "core,state,block,first_token,tokens,ppl"
    valid_tokens = 30 * 7 - 1
    blocks = -(-valid_tokens // 64)
    assert len(rows) == 1 + 2 * blocks
    assert sum(int(r.split(",")[4]) for r in rows[1 : 1 + blocks]) == valid_tokens
    with pytest.raises(SystemExit, match="--block 40 is invalid"):
        context_blocks.main([str(tmp_path / "run"), "--block", "40", "--min-count", "1"])
    with pytest.raises(SystemExit, match="vocabulary"):
        context_blocks.main([str(tmp_path / "run"), "--min-count", "1000"])


def test_cli_refuses_carried_context_for_the_transformer(tmp_path):
    argv = ["--task", "lm", "--data", str(tmp_path), "--core", "transformer", "--context", "carried"]
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text("a b c\n" * 20)
    with pytest.raises(UserError, match="--context carried needs a model that carries its state"):
        train.run(parse(argv + ["--run-dir", str(tmp_path / "r")]))


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--task", "nope"], "unknown task 'nope'"),
        (["--task", "assoc", "--core", "lstm", "--num-heads", "2"], "--num-heads does not apply to core 'lstm'"),
        (
            ["--task", "assoc", "--core", "delta", "--set", "core_config.fast_layers=2"],
            "unknown config key 'fast_layers'",
        ),
        (["--task", "assoc", "--core", "dleta"], "did you mean 'delta'"),
        (["--task", "code_exec", "--data-sizes", "10,1"], "--data-sizes"),
        (["--task", "lm", "--eval-mode", "slide"], "unknown --eval-mode 'slide'"),
        (["--task", "assoc", "--learning-rate", "nan"], "--learning-rate nan is invalid; allowed: a number > 0"),
        (["--task", "assoc", "--warmup-updates", "-1"], "--warmup-updates -1 is invalid; allowed: a number >= 0"),
    ],
)
def test_cli_bad_input_is_one_line_user_error(argv, match, tmp_path):
    with pytest.raises(UserError, match=match):
        train.run(parse(argv + ["--run-dir", str(tmp_path / "r"), "--updates", "1"]))


# ------------------------------------------------------------------------- the Sec. 6.1 memory


@pytest.mark.parametrize("rule", ["lt", "delta"])
@torch.no_grad()
def test_memory_model_computes_the_paper_equations(rule):
    from rfwp_rl.cores.feature_maps import elu_sum
    from rfwp_rl.seq.memory import AssocMemory

    torch.manual_seed(0)
    S, d = 3, 2
    m = AssocMemory(S, rule, d_key=d, emb_size=4, backend="reference").to(D)
    x = torch.tensor([[[0, 2]], [[2, 0]], [[1, 1]], [[2, S]]])  # 3 pairs, query key 2
    scores, state = m(x)
    W = torch.zeros(S, d, dtype=D)
    for t in range(3):
        v = F.one_hot(x[t, 0, 1], S).to(D)
        inp = torch.cat([m.embed.weight[x[t, 0, 0]], v])
        k = elu_sum(m.W_K.weight @ inp)
        if rule == "lt":
            W = W + torch.outer(v, k)  # RFWP Eq. 6
        else:
            beta = torch.sigmoid(m.W_beta.weight @ inp + m.W_beta.bias)
            W = W + beta * torch.outer(v - W @ k, k)  # RFWP Eq. 8, 10
    q = elu_sum(m.W_Q.weight @ m.embed.weight[2])
    torch.testing.assert_close(scores[-1, 0], W @ q)
    assert state == () and (scores[:-1] == 0).all()
    y = torch.tensor([[-100], [-100], [-100], [0]])
    assert float(m.loss(scores, y)) == pytest.approx(float(0.5 * ((W @ q - F.one_hot(torch.tensor(0), S)) ** 2).sum()))


def test_cli_memory_model(tmp_path):
    argv = [
        "--task",
        "assoc",
        "--model",
        "memory",
        "--core",
        "delta",
        "--num-keys",
        "4",
        "--hidden-size",
        "8",
        "--emb-size",
        "8",
        "--learning-rate",
        "1e-2",
        "--updates",
        "200",
        "--eval-every-updates",
        "50",
        "--target",
        "0.01",
        "--torch-threads",
        "1",
        "--run-dir",
        str(tmp_path / "m"),
    ]
    assert train.run(parse(argv)) == 0
    res = json.loads((tmp_path / "m" / "results.json").read_text())
    assert res["settings"]["model"] == "memory" and res["settings"]["core_config"]["rule"] == "delta"
    assert res["valid"]["seq_acc"] == 1.0 and res["valid"]["loss"] < 0.05
    with pytest.raises(UserError, match="--model memory is for --task assoc"):
        train.run(parse(["--task", "listops", "--model", "memory", "--run-dir", str(tmp_path / "x")]))


def test_results_collects_runs_into_csv_and_plot(tmp_path):
    from rfwp_rl.seq import results

    for core, S, loss in (("lt", 8, 0.001), ("lt", 16, 0.2), ("delta", 8, 0.001)):
        d = tmp_path / "runs" / f"{core}_{S}"
        d.mkdir(parents=True)
        (d / "results.json").write_text(
            json.dumps(
                {
                    "settings": {"task": "assoc", "core": core, "num_keys": S, "core_config": {"d_key": 8}},
                    "training": {"updates": 10} if core == "delta" else {"total_steps": 10},  # the earlier name
                    "best_step": 10,
                    "valid": {"loss": loss},
                    "test": {"loss": loss, "seq_acc": 1.0},
                    "train_seconds": 1.5,
                }
            )
        )
    out = tmp_path / "out.csv"
    assert (
        results.main(
            [
                str(tmp_path / "runs"),
                str(out),
                "--plot",
                str(tmp_path / "p.png"),
                "--y",
                "test_loss",
                "--xline",
                "8",
                "--logy",
            ]
        )
        == 0
    )
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and "test_loss" in lines[0] and "train_seconds" in lines[0]
    header = lines[0].split(",")
    assert "updates" in header and "total_steps" not in header
    assert all(line.split(",")[header.index("updates")] == "10" for line in lines[1:])
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert results.main([str(tmp_path / "empty"), str(out)]) == 2


def test_results_record_set_sizes_and_draw_training_curves(tmp_path):
    from rfwp_rl.seq import results

    argv = [
        "--task",
        "code_exec",
        "--num-statements",
        "5",
        "--data-sizes",
        "40,8,8",
        "--dropout",
        "0.1",
        "--core",
        "delta",
        "--num-layers",
        "1",
        "--hidden-size",
        "16",
        "--num-heads",
        "2",
        "--ff-size",
        "32",
        "--emb-size",
        "16",
        "--updates",
        "4",
        "--eval-every-updates",
        "2",
        "--torch-threads",
        "1",
        "--run-dir",
        str(tmp_path / "runs" / "delta"),
    ]
    assert train.run(parse(argv)) == 0
    out = tmp_path / "out.csv"
    assert results.main([str(tmp_path / "runs"), str(out), "--curves", str(tmp_path / "c.png")]) == 0
    header, row = out.read_text().splitlines()
    values = dict(zip(header.split(","), row.split(",")))
    assert values["data_sizes"] == "40/8/8" and values["dropout"] == "0.1"
    lines = (tmp_path / "c.csv").read_text().splitlines()
    assert lines[0] == "run,tag,step,value"
    assert [tuple(x.split(",")[:3]) for x in lines[1:]] == [
        ("delta", "valid/seq_acc", "2"),
        ("delta", "valid/seq_acc", "4"),
        ("delta", "valid/loss", "2"),
        ("delta", "valid/loss", "4"),
    ]
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert (
        results.main([str(tmp_path / "runs"), str(out), "--curves", str(tmp_path / "c.png"), "--curve-tags", "nope"])
        == 2
    )


def test_bench_seq_writes_a_row_per_core(tmp_path):
    from rfwp_rl.bench import seq as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "seq.csv"
    args = parser.parse_args(
        [
            "--cores",
            "lt,lstm,transformer",
            "--updates",
            "1",
            "--repeats",
            "1",
            "--vocab",
            "20",
            "--hidden-size",
            "8",
            "--num-heads",
            "2",
            "--seg-len",
            "6",
            "--batch-size",
            "2",
            "--out",
            str(out),
        ]
    )
    assert bench.run(args) == 0
    lines = out.read_text().splitlines()
    assert lines[0].split(",")[:4] == ["core", "backend", "params", "tokens_per_s"]
    assert [line.split(",")[0] for line in lines[1:]] == ["lt", "lstm", "transformer"]
    assert all(int(line.split(",")[3]) > 0 for line in lines[1:])
    with pytest.raises(UserError, match="unknown core"):
        bench.run(parser.parse_args(["--cores", "nope", "--out", str(out)]))
