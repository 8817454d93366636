"""``rfwp-rl seq``: train and evaluate a sequence model on language modelling or an
algorithmic task (RFWP paper Sec. 4.1-4.3; Secretly-FWP Sec. 6.1), with any core.

    rfwp-rl seq --task lm                                  # built-in corpus, Delta Net
    rfwp-rl seq --task lm --data ~/wikitext-103 --context carried --core delta_rnn
    rfwp-rl seq --task code_exec --num-vars 3 --core rdn --steps 20000
    rfwp-rl seq --task listops --depth 10 --core lstm --lr 3e-3 --clip 0.1
    rfwp-rl seq --task assoc --setting 1 --num-keys 64 --core lt --num-layers 1

A run directory (``--run-dir``, default ``runs/seq/<task>_<core>_s<seed>``) holds TensorBoard
events (``tb/``), ``config.json``, checkpoints (the run resumes from the newest one when
started again with the same settings), ``best.pt`` (the weights with the best validation
score) and, at the end, ``results.json``: the settings, the final validation and test
scores of the best weights, the step counts and the wall-clock time.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import torch

from rfwp_rl.checkpoint import atomic_torch_save, atomic_write_text
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.runlog import format_duration, run_name
from rfwp_rl.safety import GracefulStop, NonFiniteGuard
from rfwp_rl.scaffold import Trainer, run_trainer
from rfwp_rl.seq import tasks as T
from rfwp_rl.seq.model import SeqModel, core_defaults, core_names

# core config keys settable with their own flag (others: --set core_config.KEY=VALUE)
CORE_FLAGS = ("hidden_size", "num_layers", "num_heads", "ff_size", "dropout", "feature_map")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("--task", default="lm", help=f"one of: {', '.join(T.TASKS)}")
    g = parser.add_argument_group("model")
    g.add_argument("--model", default="seq", choices=("seq", "memory"),
                   help="seq: embedding + core + output layer; memory: the single-layer fast-weight "
                   "memory of Secretly-FWP Sec. 6.1 (assoc only; --core lt or delta, "
                   "--hidden-size = d_key)")
    g.add_argument("--core", default="delta", help="core name (rfwp-rl info lists them; "
                   "plus 'transformer', the softmax-attention baseline)")
    g.add_argument("--emb-size", type=int, default=128, help="token embedding size")
    g.add_argument("--hidden-size", type=int, help="core hidden size (default: the core's)")
    g.add_argument("--num-layers", type=int, help="core layers/blocks (default: the core's)")
    g.add_argument("--num-heads", type=int, help="heads (default: the core's)")
    g.add_argument("--ff-size", type=int, help="feed-forward inner size (default: the core's)")
    g.add_argument("--dropout", type=float, default=0.0,
                   help="dropout on embeddings and, if the core has it, inside the core")
    g.add_argument("--feature-map", help="elu_sum, softmax, dpfp or l2 (default: the core's)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a core option (core_config.fast_layers=3, core_config.backend=reference; with --model "
                        "memory: core_config.dpfp_nu=2) or a training setting (lr=1e-3); TOML values; repeatable")
    g.add_argument("--core-option", action="append", default=[], help=argparse.SUPPRESS)  # replaced by --set
    g.add_argument("--positions", choices=("auto", "on", "off"), default="auto",
                   help="sinusoidal positions (auto: only for the transformer)")
    g = parser.add_argument_group("training")
    g.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    g.add_argument("--batch-size", type=int, default=32)
    g.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate")
    g.add_argument("--warmup", type=int, default=0, help="linear learning-rate warm-up steps")
    g.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip (0: off)")
    g.add_argument("--seed", type=int, default=1, help="model and data seed")
    g.add_argument("--eval-every", type=int, default=500, help="steps between validations")
    g.add_argument("--eval-batch-size", type=int, default=64)
    g.add_argument("--target", type=float, help="stop once the validation score reaches this "
                   "(seq_acc for the algorithmic tasks, perplexity for lm)")
    g.add_argument("--patience", type=int, default=0, help="stop after this many validations "
                   "without improvement (0: never)")
    g.add_argument("--checkpoint-every", type=int, default=500, help="steps between checkpoints")
    g.add_argument("--run-dir", help="run directory (default: runs/seq/<task>_<core>_s<seed>)")
    from rfwp_rl.checkpoint import add_trust_argument

    add_trust_argument(g)
    g.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    g.add_argument("--device", default="cpu")
    g = parser.add_argument_group("lm task")
    g.add_argument("--data", default="builtin", help="corpus directory with train/valid/test "
                   "files (wiki.*.tokens or *.txt), or 'builtin' (Python stdlib docstrings)")
    g.add_argument("--level", default="word", help="word or char")
    g.add_argument("--min-count", type=int, default=1, help="rarer training tokens -> <unk>")
    g.add_argument("--seg-len", type=int, default=128, help="training segment length and "
                   "evaluation window")
    g.add_argument("--context", default="independent", help="independent segments, or "
                   "carried state from segment to segment (full context)")
    g.add_argument("--eval-mode", default="auto", help="carried, sliding, or auto (carried if "
                   "training carried context, else sliding window)")
    g.add_argument("--eval-max-tokens", type=int, default=5000,
                   help="tokens of the validation text scored during training (the final "
                   "evaluation uses all)")
    g = parser.add_argument_group("algorithmic tasks")
    g.add_argument("--num-vars", type=int, default=3, help="code_exec: variables (3 or 5 in the paper)")
    g.add_argument("--num-statements", type=int, default=100, help="code_exec: statements per program")
    g.add_argument("--depth", type=int, default=10, help="listops: exact depth")
    g.add_argument("--max-args", type=int, default=5, help="listops: max arguments per list")
    g.add_argument("--num-keys", type=int, default=32, help="assoc: keys/values S")
    g.add_argument("--setting", type=int, default=1, help="assoc: 1 (capacity) or 2 (updates)")
    g.add_argument("--data-sizes", default="10000,1000,1000",
                   help="code_exec/listops: train,valid,test sequences")


# ------------------------------------------------------------------------- setup helpers

def core_config(args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    """The core config from the flags and ``extra`` (``--set core_config.*``), checked against the core's keys."""
    defaults = core_defaults(args.core)
    config: dict[str, Any] = {}
    for key in CORE_FLAGS:
        value = getattr(args, key)
        if key == "dropout":
            if "dropout" in defaults:
                config["dropout"] = value
            continue
        if value is not None:
            if key not in defaults:
                raise UserError(f"--{key.replace('_', '-')} does not apply to core {args.core!r}; "
                                f"its options: {', '.join(defaults) or 'none'}")
            config[key] = value
    return {**config, **extra}


def make_task(args: argparse.Namespace):
    """The task object for ``args.task``."""
    check_choice("task", args.task, T.TASKS)
    if args.task == "lm":
        from rfwp_rl.seq.data import builtin_corpus_dir
        from rfwp_rl.seq.tasks.lm import LMTask, load_corpus

        data = builtin_corpus_dir() if args.data == "builtin" else args.data
        return LMTask(load_corpus(data, args.level, args.min_count), args.seg_len, args.context)
    try:
        sizes = tuple(int(s) for s in args.data_sizes.split(","))
        assert len(sizes) == 3 and min(sizes) >= 1
    except (ValueError, AssertionError):
        raise UserError(f"--data-sizes {args.data_sizes!r} is invalid; allowed: three positive "
                        "integers TRAIN,VALID,TEST") from None
    if args.task == "code_exec":
        return T.CodeExecTask(args.seed, args.num_vars, args.num_statements, sizes)
    if args.task == "listops":
        return T.ListOpsTask(args.seed, args.depth, args.max_args, sizes)
    return T.AssocTask(args.seed, args.num_keys, args.setting)


def make_memory(args: argparse.Namespace, task, extra: dict[str, Any]):
    """The Secretly-FWP Sec. 6.1 memory for ``--model memory`` (``extra``: its ``--set core_config.*`` options)."""
    from rfwp_rl.seq.memory import AssocMemory

    if args.task != "assoc":
        raise UserError(f"--model memory is for --task assoc, not {args.task!r}; allowed: --model seq")
    options = {"dpfp_nu": 1, "backend": "auto"}
    for key, value in extra.items():
        check_choice("memory option (--set core_config.KEY=VALUE)", key, options)
        options[key] = value
    return AssocMemory(task.num_classes, args.core, args.hidden_size or 64, args.emb_size,
                       args.feature_map or "elu_sum", **options)


def apply_sets(args: argparse.Namespace) -> dict[str, Any]:
    """``--set``: trainer keys into ``args``; returns the ``core_config.*`` options. The old
    ``--core-option`` is a one-line error naming its replacement."""
    from rfwp_rl.overrides import apply_settings, namespace_keys
    from rfwp_rl.presets import Preset

    if args.core_option:
        key, _, value = args.core_option[0].partition("=")
        raise UserError(f"--core-option {args.core_option[0]!r}: core options are set as --set core_config.KEY=VALUE, "
                        f"e.g. --set core_config.{key.strip() or 'fast_layers'}={value.strip() or 3}")
    keys = namespace_keys(vars(args), ("core", "model", "overrides", "core_option", "run_dir", "task"))
    defaults = core_defaults(args.core) if args.core in core_names() else {}
    preset = apply_settings(args.overrides, Preset(core=args.core), args, keys, sections=("core_config",),
                            core_options=defaults)
    args.core = preset.core
    return preset.core_config


def check_args(args: argparse.Namespace) -> None:
    for name in ("steps", "batch_size", "eval_every", "eval_batch_size", "checkpoint_every", "emb_size"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid; "
                            "allowed: an integer >= 1")
    if not args.lr > 0:
        raise UserError(f"--lr {args.lr} is invalid; allowed: a positive number")
    if args.warmup < 0 or args.clip < 0:
        raise UserError("--warmup and --clip must be >= 0")
    if args.model == "seq":
        check_choice("core", args.core, core_names())
    if args.task == "lm":
        from rfwp_rl.seq.tasks.lm import CONTEXTS, EVAL_MODES, LEVELS

        check_choice("--level", args.level, LEVELS)
        check_choice("--context", args.context, CONTEXTS)
        check_choice("--eval-mode", args.eval_mode, EVAL_MODES)


def lr_factor(step: int, warmup: int) -> float:
    """Linear warm-up to the full learning rate over ``warmup`` steps, then constant."""
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def evaluate(model: SeqModel, task, split: str, args: argparse.Namespace,
             max_tokens: int | None = None) -> dict[str, float]:
    """Validation/test scores of ``model`` (eval mode, no gradients)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if task.name == "lm":
                return task.evaluate(model, lambda b: model.initial_state(b, args.device), split,
                                     args.eval_mode, max_tokens, device=args.device)
            score = T.TaggingScore()
            for x, y in task.eval_batches(split, args.eval_batch_size):
                logits, _ = model(x.to(args.device))
                score.add(logits.cpu(), y, task.no_output, model.loss)
            return score.metrics(with_print=task.no_output is not None)
    finally:
        model.train(was_training)


def main_metric(task, args: argparse.Namespace) -> tuple[str, bool]:
    """(validation metric that selects the best weights, whether lower is better): perplexity
    for lm, the squared-error loss for the memory model (the paper's criterion), else
    sequence accuracy."""
    if task.name == "lm":
        return "ppl", True
    if args.model == "memory":
        return "loss", True
    return task.main_metric, False


def better(lower: bool, new: float, old: float | None) -> bool:
    if old is None:
        return True
    return new < old if lower else new > old


def early_stop_reason(args: argparse.Namespace, main: str, lower: bool, step: int, value: float,
                      best_step: int) -> str | None:
    """Why training stops before ``--steps`` (``--target`` reached, ``--patience`` out)."""
    if args.target is not None and (value <= args.target if lower else value >= args.target):
        return f"target {main} {args.target} reached"
    if args.patience and step - best_step >= args.patience * args.eval_every:
        return f"no improvement in {args.patience} validations"
    return None


# ------------------------------------------------------------------------- the run

def run(args: argparse.Namespace) -> int:
    extra = apply_sets(args)
    check_args(args)
    trainer = SeqTrainer(args, extra)
    trainer.trust_checkpoint = args.trust_checkpoint
    return run_trainer(trainer)


class SeqTrainer(Trainer):
    """Sequence-task training in the :mod:`rfwp_rl.scaffold`; at the end the best weights are
    evaluated on the full validation and test sets (``results.json``)."""

    def __init__(self, args: argparse.Namespace, extra: dict[str, Any]):
        self.args = args
        self.total, self.print_every = args.steps, 5.0
        if args.threads:
            torch.set_num_threads(args.threads)
        torch.manual_seed(args.seed)
        self.task = task = make_task(args)
        self.model = self._make_model(args, task, extra).to(args.device)
        n_params = sum(p.numel() for p in self.model.parameters())
        self.settings = {**task.settings(), **self.model.describe(), "params": n_params}
        self.config = {**self.settings, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                       "warmup": args.warmup, "clip": args.clip, "seed": args.seed}
        self.run_dir = Path(args.run_dir or Path("runs") / "seq" / run_name(task.name, args.core, f"s{args.seed}"))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr)
        self.meta = {"trainer": "seq", **{k: v for k, v in self.config.items() if k != "steps"}}
        self.main, self.lower = main_metric(task, args)
        self.metrics = (f"valid/{self.main}",)
        self.guard = NonFiniteGuard()
        self.steps_done, self.carried, self.best, self.best_step, self.elapsed, self.early = 0, None, None, None, 0.0, None
        self.t0 = time.monotonic()

    @staticmethod
    def _make_model(args: argparse.Namespace, task, extra: dict[str, Any]) -> torch.nn.Module:
        if args.model == "memory":
            return make_memory(args, task, extra)
        positions = {"auto": None, "on": True, "off": False}[args.positions]
        model = SeqModel(args.core, task.field_sizes, task.num_classes, args.emb_size, core_config(args, extra),
                         dropout=args.dropout, positions=positions)
        if task.name == "lm" and not model.carries_state:
            if args.context == "carried":
                raise UserError(f"--context carried needs a model that carries its state from "
                                f"segment to segment; core {args.core!r}"
                                f"{' with sinusoidal positions' if model.positions else ''} does not. "
                                "allowed: --context independent (evaluated with the sliding window)")
            if args.eval_mode == "carried":
                raise UserError(f"--eval-mode carried is not possible with core {args.core!r}; "
                                "allowed: sliding or auto")
        return model

    @property
    def step(self) -> int:
        return self.steps_done

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "carried": self.carried,
                "best": self.best, "best_step": self.best_step, "early": self.early,
                "elapsed": self.elapsed + time.monotonic() - self.t0, "skipped": self.guard.skipped}

    def load_state_dict(self, state: dict, path: Path, step: int) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_done = step
        self.carried, self.best, self.best_step = state["carried"], state["best"], state["best_step"]
        self.elapsed, self.early = state["elapsed"], state["early"]
        self.guard.skipped = state.get("skipped", 0)
        print(f"resuming {self.run_dir} from step {self.steps_done:,}", flush=True)

    def prepare(self) -> str | None:
        n_params = self.settings["params"]
        print(f"seq | task {self.task.name} | core {self.args.core} | {n_params:,} parameters | run dir "
              f"{self.run_dir}", flush=True)
        self.t0 = time.monotonic()
        return None

    def hparams(self) -> dict:
        return self.config

    # ---- the loop
    def train(self, stop: GracefulStop) -> None:
        """Until ``--steps``, an early stop (``--target``, ``--patience``) or a stop request."""
        args = self.args
        self.model.train()
        while self.steps_done < args.steps and not self.early and not stop.requested:
            loss, grad_norm = self.update()
            self.steps_done += 1
            step = self.steps_done
            scalars = {"train/loss": loss, "train/lr": self.optimizer.param_groups[0]["lr"],
                       "train/skipped_updates": self.guard.skipped}
            if grad_norm is not None:
                scalars["train/grad_norm"] = grad_norm
            self.logger.log(step, scalars)
            extra = ({"epoch": f"{self.task.epochs(step, args.batch_size):.2f}"}
                     if hasattr(self.task, "epochs") else {})
            self.logger.progress(step, loss=loss, **extra)
            if step % args.eval_every == 0 or step == args.steps:
                self.validate()
            if step % args.checkpoint_every == 0 or step == args.steps or self.early:
                self.save()
        if self.early:
            print(f"stopping early at step {self.steps_done:,}: {self.early}", flush=True)

    def update(self) -> tuple[float, float | None]:
        """One training batch and optimizer step; returns the loss and the gradient norm before clipping."""
        args, task, model = self.args, self.task, self.model
        if task.name == "lm":
            x, y, epoch_start = task.train_segment(self.steps_done, args.batch_size)
            state = None if (task.context == "independent" or epoch_start) else self.carried
        else:
            x, y = task.train_batch(self.steps_done, args.batch_size)
            state = None
        x, y = x.to(args.device), y.to(args.device)
        for group in self.optimizer.param_groups:
            group["lr"] = args.lr * lr_factor(self.steps_done, args.warmup)
        logits, new_state = model(x, state)
        loss = model.loss(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip) if args.clip > 0 else None
        updated = self.guard.ok(loss, model.parameters())
        if updated:
            self.optimizer.step()
        if task.name == "lm" and task.context == "carried":
            # truncated BPTT; a skipped update restarts the context (its state may be NaN)
            self.carried = tuple(s.detach() for s in new_state) if updated else None
        return float(loss.detach()), None if grad_norm is None else float(grad_norm)

    def validate(self) -> None:
        """Validation scores; the best weights so far go to ``best.pt``; decides an early stop."""
        args, step, main = self.args, self.steps_done, self.main
        metrics = evaluate(self.model, self.task, "valid", args, args.eval_max_tokens if self.task.name == "lm" else None)
        self.logger.log(step, {f"valid/{k}": v for k, v in metrics.items()})
        if better(self.lower, metrics[main], self.best):
            self.best, self.best_step = metrics[main], step
            atomic_torch_save({"model": self.model.state_dict(), "step": step, "settings": self.settings},
                              self.run_dir / "best.pt")
        print(f"step {step:,} | valid " + " | ".join(f"{k} {v:.4g}" for k, v in metrics.items()) +
              f" | best {main} {self.best:.4g} (step {self.best_step:,})", flush=True)
        self.early = early_stop_reason(args, main, self.lower, step, metrics[main], self.best_step)

    # ---- the end: the best weights on the full validation and test sets
    def finish(self, code: int, saved: Path | None) -> int:
        if code != 0:
            return code
        if self.steps_done < self.args.steps and not self.early:
            print(f"stopped at step {self.steps_done:,}; run the same command again to resume", flush=True)
            return 0
        args = self.args
        train_time = self.elapsed + time.monotonic() - self.t0
        t1 = time.monotonic()
        final = copy.deepcopy(self.model)
        final.load_state_dict(torch.load(self.run_dir / "best.pt", map_location=args.device,
                                         weights_only=True)["model"])
        results = {"settings": self.settings,
                   "training": {k: self.config[k] for k in ("steps", "batch_size", "lr", "warmup", "clip", "seed")},
                   "best_step": self.best_step, "steps_done": self.steps_done, "early_stop": self.early,
                   "valid": evaluate(final, self.task, "valid", args), "test": evaluate(final, self.task, "test", args),
                   "train_seconds": round(train_time, 1), "eval_seconds": round(time.monotonic() - t1, 1),
                   "skipped_updates": self.guard.skipped, "torch_threads": torch.get_num_threads()}
        if self.task.name == "lm":
            results["eval_mode"] = args.eval_mode
        atomic_write_text(self.run_dir / "results.json", json.dumps(results, indent=2) + "\n")
        print(f"done in {format_duration(train_time)} | best valid {self.main} {self.best:.4g} at step "
              f"{self.best_step:,} | test " + " | ".join(f"{k} {v:.4g}" for k, v in results["test"].items())
              + f" | {self.run_dir / 'results.json'}", flush=True)
        return 0
