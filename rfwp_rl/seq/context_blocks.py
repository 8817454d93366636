"""Perplexity of a trained language model per block of text, with the state carried through the
whole split and restarted at every block: what the carried context gives or costs each core.

    python -m rfwp_rl.seq.context_blocks runs/seq/lm_builtin_carried/delta [--block 2560]

Loads ``config.json`` and ``best.pt`` of a ``rfwp-rl seq --task lm`` run, prints a table and,
with ``--out``, writes it as CSV (rows: core, state, block, first token, tokens, ppl).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.errors import UserError
from rfwp_rl.seq.config import upgrade_settings
from rfwp_rl.seq.model import SeqModel
from rfwp_rl.seq.tasks.lm import SPLITS, carried_blocks, load_corpus

STATES = ("carried", "restarted")


def load_run(run_dir: Path, min_count: int) -> tuple[SeqModel, dict, object]:
    """The model of a language-modelling run with its best weights, its settings and corpus."""
    cfg_path, best = run_dir / "config.json", run_dir / "best.pt"
    if not cfg_path.is_file() or not best.is_file():
        raise UserError(
            f"{run_dir} has no config.json and best.pt; allowed: the run directory of an `rfwp-rl seq --task lm` run"
        )
    cfg = upgrade_settings(json.loads(cfg_path.read_text()))
    if cfg.get("task") != "lm":
        raise UserError(f"{run_dir} is a {cfg.get('task')!r} run; allowed: a --task lm run")
    corpus = load_corpus(cfg["corpus"], cfg["tokens"], min_count)
    if corpus.vocab_size != cfg["vocab_size"]:
        raise UserError(
            f"--min-count {min_count} gives a vocabulary of {corpus.vocab_size:,}, the "
            f"run was trained with {cfg['vocab_size']:,}; pass the run's --min-count"
        )
    model = SeqModel(
        cfg["core"],
        (corpus.vocab_size,),
        corpus.vocab_size,
        cfg["emb_size"],
        cfg["core_config"],
        dropout=cfg["dropout"],
        positions=cfg["positions"],
    )
    model.load_state_dict(torch.load(best, map_location="cpu", weights_only=True)["model"])
    model.eval()
    if not model.carries_state:
        raise UserError(
            f"core {cfg['core']!r} does not carry a state from segment to segment; "
            "allowed: a recurrent or fast-weight core"
        )
    return model, cfg, corpus


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rfwp_rl.seq.context_blocks", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", type=Path)
    p.add_argument("--block", type=int, default=2560, help="tokens per block (a multiple of the run's seg_len)")
    p.add_argument("--split", default="valid", help=f"one of {', '.join(SPLITS)}")
    p.add_argument("--min-count", type=int, default=3, help="the runs' --min-count (checked against their vocabulary)")
    p.add_argument("--out", type=Path, help="CSV to write")
    args = p.parse_args(argv)
    try:
        if args.split not in SPLITS:
            raise UserError(f"--split {args.split!r} is invalid; allowed: {', '.join(SPLITS)}")
        torch.set_num_threads(1)
        rows = []
        for run_dir in args.run_dirs:
            model, cfg, corpus = load_run(run_dir, args.min_count)
            if args.block < cfg["seg_len"] or args.block % cfg["seg_len"]:
                raise UserError(
                    f"--block {args.block} is invalid; allowed: a positive multiple of "
                    f"the run's segment length {cfg['seg_len']}"
                )
            data = corpus.split(args.split)
            for state in STATES:
                blocks = carried_blocks(
                    model, model.initial_state, data, cfg["seg_len"], args.block, restart=state == "restarted"
                )
                for i, score in enumerate(blocks):
                    rows.append((cfg["core"], state, i + 1, i * args.block, score.tokens, math.exp(score.loss)))
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    for r in rows:
        print(f"{r[0]:<12} {r[1]:<10} block {r[2]:>3} (tokens {r[3]:>6,}+{r[4]:>5,}) ppl {r[5]:8.1f}")
    if args.out:
        columns = ("core", "state", "block", "first_token", "tokens", "ppl")
        atomic_write_csv(args.out, [dict(zip(columns, r)) for r in rows], columns, float_format=".2f")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
