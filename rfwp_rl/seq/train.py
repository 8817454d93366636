"""``rfwp-rl seq``: train and evaluate a sequence model on language modelling or an
algorithmic task (RFWP paper Sec. 4.1-4.3; Secretly-FWP Sec. 6.1), with any core.

    rfwp-rl seq --task lm                                  # built-in corpus, Delta Net
    rfwp-rl seq --task lm --data ~/wikitext-103 --context carried --core delta_rnn
    rfwp-rl seq --task code_exec --num-vars 3 --core rdn --updates 20000
    rfwp-rl seq --task listops --depth 10 --core lstm --learning-rate 3e-3 --grad-norm-clip 0.1
    rfwp-rl seq --task assoc --setting 1 --num-keys 64 --core lt --num-layers 1

A run directory (``--run-dir``, default ``runs/seq/<task>_<core>_s<seed>``) holds TensorBoard
events (``tb/``), ``config.json``, checkpoints (the run resumes from the newest one when
started again with the same settings), ``best.pt`` (the weights with the best validation
score) and, at the end, ``results.json``: the settings, the final validation and test
scores of the best weights, the step counts and the wall-clock time. The budget and the
validation interval count optimizer steps (there is no env); durations are seconds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from rfwp_rl import flags
from rfwp_rl.checkpoint import add_trust_argument, atomic_torch_save, atomic_write_text
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.overrides import apply_settings
from rfwp_rl.presets import Preset
from rfwp_rl.runlog import format_duration, run_name
from rfwp_rl.safety import GracefulStop, NonFiniteGuard
from rfwp_rl.scaffold import Trainer, run_trainer
from rfwp_rl.seq import tasks as T
from rfwp_rl.seq.config import CORE_FLAGS, MODELS, NOT_SET_KEYS, POSITIONS, SeqConfig, upgrade_settings
from rfwp_rl.seq.data import builtin_corpus_dir
from rfwp_rl.seq.memory import AssocMemory
from rfwp_rl.seq.model import SeqModel, core_defaults, core_names
from rfwp_rl.seq.tasks.lm import CONTEXTS, EVAL_MODES, TOKENS, LMTask, load_corpus

# the training settings recorded in config.json and results.json (the model's come from the model)
TRAINING = ("updates", "batch_size", "learning_rate", "warmup_updates", "grad_norm_clip", "seed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_fields(parser, SeqConfig, "task")
    g = parser.add_argument_group("model")
    flags.add_fields(
        g,
        SeqConfig,
        "model",
        "core",
        "emb_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "ff_size",
        "dropout",
        "feature_map",
    )
    flags.add_set_argument(
        g,
        "a core option (core_config.fast_layers=3, core_config.backend=reference; with --model "
        "memory: core_config.dpfp_nu=2)",
        "learning_rate=1e-3",
    )
    flags.add_fields(g, SeqConfig, "positions")
    g = parser.add_argument_group("training")
    flags.add_fields(
        g,
        SeqConfig,
        "updates",
        "batch_size",
        "learning_rate",
        "warmup_updates",
        "grad_norm_clip",
        "seed",
        "eval_every_updates",
        "eval_batch_size",
        "target",
        "patience",
        "checkpoint_every",
        "log_every",
    )
    flags.add_run_dir_argument(g, "runs/seq/<task>_<core>_s<seed>")
    add_trust_argument(g)
    flags.add_fields(g, SeqConfig, "torch_threads", "device")
    g = parser.add_argument_group("lm task")
    flags.add_fields(g, SeqConfig, "data", "tokens", "min_count", "seg_len", "context", "eval_mode", "eval_max_tokens")
    g = parser.add_argument_group("algorithmic tasks")
    flags.add_fields(
        g, SeqConfig, "num_vars", "num_statements", "depth", "max_args", "num_keys", "setting", "data_sizes"
    )


# ------------------------------------------------------------------------- setup helpers


def core_config(cfg: SeqConfig, extra: dict[str, Any]) -> dict[str, Any]:
    """The core config from the flags and ``extra`` (``--set core_config.*``), checked against the core's keys."""
    defaults = core_defaults(cfg.core)
    config: dict[str, Any] = {}
    for key in CORE_FLAGS:
        value = getattr(cfg, key)
        if key == "dropout":
            if "dropout" in defaults:
                config["dropout"] = value
            continue
        if value is not None:
            if key not in defaults:
                raise UserError(
                    f"--{key.replace('_', '-')} does not apply to core {cfg.core!r}; "
                    f"its options: {', '.join(defaults) or 'none'}"
                )
            config[key] = value
    return {**config, **extra}


def make_task(cfg: SeqConfig):
    """The task object for ``cfg.task``."""
    check_choice("task", cfg.task, T.TASKS)
    if cfg.task == "lm":
        data = builtin_corpus_dir() if cfg.data == "builtin" else cfg.data
        return LMTask(load_corpus(data, cfg.tokens, cfg.min_count), cfg.seg_len, cfg.context)
    try:
        sizes = tuple(int(s) for s in cfg.data_sizes.split(","))
        assert len(sizes) == 3 and min(sizes) >= 1
    except (ValueError, AssertionError):
        raise UserError(
            f"--data-sizes {cfg.data_sizes!r} is invalid; allowed: three positive integers TRAIN,VALID,TEST"
        ) from None
    if cfg.task == "code_exec":
        return T.CodeExecTask(cfg.seed, cfg.num_vars, cfg.num_statements, sizes)
    if cfg.task == "listops":
        return T.ListOpsTask(cfg.seed, cfg.depth, cfg.max_args, sizes)
    return T.AssocTask(cfg.seed, cfg.num_keys, cfg.setting)


def make_memory(cfg: SeqConfig, task, extra: dict[str, Any]):
    """The Secretly-FWP Sec. 6.1 memory for ``--model memory`` (``extra``: its ``--set core_config.*`` options)."""
    if cfg.task != "assoc":
        raise UserError(f"--model memory is for --task assoc, not {cfg.task!r}; allowed: --model seq")
    options = {"dpfp_nu": 1, "backend": "auto"}
    for key, value in extra.items():
        check_choice("memory option (--set core_config.KEY=VALUE)", key, options)
        options[key] = value
    return AssocMemory(
        task.num_classes, cfg.core, cfg.hidden_size or 64, cfg.emb_size, cfg.feature_map or "elu_sum", **options
    )


def apply_sets(cfg: SeqConfig, overrides: list[str]) -> dict[str, Any]:
    """``--set``: settings into ``cfg``, ``core`` too; returns the ``core_config.*`` options."""
    defaults = core_defaults(cfg.core) if cfg.core in core_names() else {}
    preset = apply_settings(
        overrides,
        Preset(core=cfg.core),
        cfg,
        flags.settings_keys(SeqConfig, NOT_SET_KEYS),
        sections=("core_config",),
        core_options=defaults,
    )
    cfg.core = preset.core
    return preset.core_config


# the number settings' ranges (flags.check_ranges); NaN is in none
NUMBER_RANGES: dict[str, flags.Range] = {
    **flags.shared_ranges("learning_rate"),
    "warmup_updates": flags.Range(),
    **flags.shared_ranges("grad_norm_clip", "checkpoint_every", "log_every"),
}


def check_config(cfg: SeqConfig) -> None:
    for name in ("updates", "batch_size", "eval_every_updates", "eval_batch_size", "emb_size"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} {getattr(cfg, name)} is invalid; allowed: an integer >= 1")
    flags.check_ranges(cfg, NUMBER_RANGES)
    check_choice("model", cfg.model, MODELS)
    check_choice("positions", cfg.positions, POSITIONS)
    if cfg.model == "seq":
        check_choice("core", cfg.core, core_names())
    if cfg.task == "lm":
        check_choice("--tokens", cfg.tokens, TOKENS)
        check_choice("--context", cfg.context, CONTEXTS)
        check_choice("--eval-mode", cfg.eval_mode, EVAL_MODES)


def lr_factor(step: int, warmup: int) -> float:
    """Linear warm-up to the full learning rate over ``warmup`` steps, then constant."""
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def evaluate(model: SeqModel, task, split: str, cfg: SeqConfig, max_tokens: int | None = None) -> dict[str, float]:
    """Validation/test scores of ``model`` (eval mode, no gradients)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if task.name == "lm":
                return task.evaluate(
                    model,
                    lambda b: model.initial_state(b, cfg.device),
                    split,
                    cfg.eval_mode,
                    max_tokens,
                    device=cfg.device,
                )
            score = T.TaggingScore()
            for x, y in task.eval_batches(split, cfg.eval_batch_size):
                logits, _ = model(x.to(cfg.device))
                score.add(logits.cpu(), y, task.no_output, model.loss)
            return score.metrics(with_print=task.no_output is not None)
    finally:
        model.train(was_training)


def main_metric(task, cfg: SeqConfig) -> tuple[str, bool]:
    """(validation metric that selects the best weights, whether lower is better): perplexity
    for lm, the squared-error loss for the memory model (the paper's criterion), else
    sequence accuracy."""
    if task.name == "lm":
        return "ppl", True
    if cfg.model == "memory":
        return "loss", True
    return task.main_metric, False


def better(lower: bool, new: float, old: float | None) -> bool:
    if old is None:
        return True
    return new < old if lower else new > old


def early_stop_reason(cfg: SeqConfig, main: str, lower: bool, step: int, value: float, best_step: int) -> str | None:
    """Why training stops before ``--updates`` (``--target`` reached, ``--patience`` out)."""
    if cfg.target is not None and (value <= cfg.target if lower else value >= cfg.target):
        return f"target {main} {cfg.target} reached"
    if cfg.patience and step - best_step >= cfg.patience * cfg.eval_every_updates:
        return f"no improvement in {cfg.patience} validations"
    return None


# ------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> int:
    cfg = flags.config_from_args(SeqConfig, args)
    extra = apply_sets(cfg, args.overrides)
    check_config(cfg)
    run_dir = Path(args.run_dir) if args.run_dir else None
    trainer = SeqTrainer(cfg, extra, run_dir)
    trainer.trust_checkpoint = args.trust_checkpoint
    return run_trainer(trainer)


class SeqTrainer(Trainer):
    """Sequence-task training in the :mod:`rfwp_rl.scaffold`; at the end the best weights are
    evaluated on the full validation and test sets (``results.json``)."""

    unit = flags.OPTIMIZER_STEPS

    def __init__(self, cfg: SeqConfig, extra: dict[str, Any], run_dir: Path | None = None):
        """``run_dir``: None for ``runs/seq/<task>_<core>_s<seed>``."""
        self.cfg = cfg
        self.total, self.log_every = cfg.updates, cfg.log_every
        if cfg.torch_threads > 0:
            torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        self.task = task = make_task(cfg)
        self.model = self._make_model(cfg, task, extra).to(cfg.device)
        n_params = sum(p.numel() for p in self.model.parameters())
        self.settings = {**task.settings(), **self.model.describe(), "params": n_params}
        self.config = {**self.settings, **{k: getattr(cfg, k) for k in TRAINING}}
        self.run_dir = Path(run_dir or Path("runs") / "seq" / run_name(task.name, cfg.core, f"s{cfg.seed}"))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.learning_rate)
        self.meta = {"trainer": "seq", **{k: v for k, v in self.config.items() if k != "updates"}}
        self.main, self.lower = main_metric(task, cfg)
        self.metrics = (f"valid/{self.main}",)
        self.guard = NonFiniteGuard()
        self.steps_done, self.carried, self.best, self.best_step, self.elapsed, self.early = (
            0,
            None,
            None,
            None,
            0.0,
            None,
        )
        self.t0 = self.last_save = time.monotonic()

    def upgrade_meta(self, saved: dict) -> dict:
        return upgrade_settings(saved)

    @staticmethod
    def _make_model(cfg: SeqConfig, task, extra: dict[str, Any]) -> torch.nn.Module:
        if cfg.model == "memory":
            return make_memory(cfg, task, extra)
        positions = {"auto": None, "on": True, "off": False}[cfg.positions]
        model = SeqModel(
            cfg.core,
            task.field_sizes,
            task.num_classes,
            cfg.emb_size,
            core_config(cfg, extra),
            dropout=cfg.dropout,
            positions=positions,
        )
        if task.name == "lm" and not model.carries_state:
            if cfg.context == "carried":
                raise UserError(
                    f"--context carried needs a model that carries its state from "
                    f"segment to segment; core {cfg.core!r}"
                    f"{' with sinusoidal positions' if model.positions else ''} does not. "
                    "allowed: --context independent (evaluated with the sliding window)"
                )
            if cfg.eval_mode == "carried":
                raise UserError(f"--eval-mode carried is not possible with core {cfg.core!r}; allowed: sliding or auto")
        return model

    @property
    def step(self) -> int:
        return self.steps_done

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "carried": self.carried,
            "best": self.best,
            "best_step": self.best_step,
            "early": self.early,
            "elapsed": self.elapsed + time.monotonic() - self.t0,
            "skipped": self.guard.skipped,
        }

    def load_state_dict(self, state: dict, path: Path, step: int) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_done = step
        self.carried, self.best, self.best_step = state["carried"], state["best"], state["best_step"]
        self.elapsed, self.early = state["elapsed"], state["early"]
        self.guard.skipped = state["skipped"]
        print(f"resuming {self.run_dir} from step {self.steps_done:,}", flush=True)

    def prepare(self) -> str | None:
        n_params = self.settings["params"]
        print(
            f"seq | task {self.task.name} | core {self.cfg.core} | {n_params:,} parameters | run dir {self.run_dir}",
            flush=True,
        )
        self.t0 = time.monotonic()
        return None

    def hparams(self) -> dict:
        """Every setting, with the model's as built (its core config, parameter count)."""
        return {**dataclasses.asdict(self.cfg), **self.config}

    # ---- the loop
    def train(self, stop: GracefulStop) -> None:
        """Until ``--updates``, an early stop (``--target``, ``--patience``) or a stop request."""
        cfg = self.cfg
        self.model.train()
        while self.steps_done < cfg.updates and not self.early and not stop.requested:
            loss, grad_norm = self.update()
            self.steps_done += 1
            step = self.steps_done
            scalars = {
                "train/loss": loss,
                "train/lr": self.optimizer.param_groups[0]["lr"],
                "train/skipped_updates": self.guard.skipped,
            }
            if grad_norm is not None:
                scalars["train/grad_norm"] = grad_norm
            self.logger.log(step, scalars)
            extra = {"epoch": f"{self.task.epochs(step, cfg.batch_size):.2f}"} if hasattr(self.task, "epochs") else {}
            self.logger.progress(step, loss=loss, **extra)
            if step % cfg.eval_every_updates == 0 or step == cfg.updates:
                self.validate()
            if time.monotonic() - self.last_save >= cfg.checkpoint_every or step == cfg.updates or self.early:
                self.save()
                self.last_save = time.monotonic()
        if self.early:
            print(f"stopping early at step {self.steps_done:,}: {self.early}", flush=True)

    def update(self) -> tuple[float, float | None]:
        """One training batch and optimizer step; returns the loss and the gradient norm before clipping."""
        cfg, task, model = self.cfg, self.task, self.model
        if task.name == "lm":
            x, y, epoch_start = task.train_segment(self.steps_done, cfg.batch_size)
            state = None if (task.context == "independent" or epoch_start) else self.carried
        else:
            x, y = task.train_batch(self.steps_done, cfg.batch_size)
            state = None
        x, y = x.to(cfg.device), y.to(cfg.device)
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.learning_rate * lr_factor(self.steps_done, cfg.warmup_updates)
        logits, new_state = model(x, state)
        loss = model.loss(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_norm_clip) if cfg.grad_norm_clip > 0 else None
        )
        updated = self.guard.ok(loss, model.parameters())
        if updated:
            self.optimizer.step()
        if task.name == "lm" and task.context == "carried":
            # truncated BPTT; a skipped update restarts the context (its state may be NaN)
            self.carried = tuple(s.detach() for s in new_state) if updated else None
        return float(loss.detach()), None if grad_norm is None else float(grad_norm)

    def validate(self) -> None:
        """Validation scores; the best weights so far go to ``best.pt``; decides an early stop."""
        cfg, step, main = self.cfg, self.steps_done, self.main
        metrics = evaluate(self.model, self.task, "valid", cfg, cfg.eval_max_tokens if self.task.name == "lm" else None)
        self.logger.log(step, {f"valid/{k}": v for k, v in metrics.items()})
        if better(self.lower, metrics[main], self.best):
            self.best, self.best_step = metrics[main], step
            atomic_torch_save(
                {"model": self.model.state_dict(), "step": step, "settings": self.settings}, self.run_dir / "best.pt"
            )
        print(
            f"step {step:,} | valid "
            + " | ".join(f"{k} {v:.4g}" for k, v in metrics.items())
            + f" | best {main} {self.best:.4g} (step {self.best_step:,})",
            flush=True,
        )
        self.early = early_stop_reason(cfg, main, self.lower, step, metrics[main], self.best_step)

    # ---- the end: the best weights on the full validation and test sets
    def finish(self, code: int, saved: Path | None) -> int:
        if code != 0:
            return code
        if self.steps_done < self.cfg.updates and not self.early:
            print(f"stopped at step {self.steps_done:,}; run the same command again to resume", flush=True)
            return 0
        cfg = self.cfg
        train_time = self.elapsed + time.monotonic() - self.t0
        t1 = time.monotonic()
        final = copy.deepcopy(self.model)
        final.load_state_dict(torch.load(self.run_dir / "best.pt", map_location=cfg.device, weights_only=True)["model"])
        results = {
            "settings": self.settings,
            "training": {k: self.config[k] for k in TRAINING},
            "best_step": self.best_step,
            "steps_done": self.steps_done,
            "early_stop": self.early,
            "valid": evaluate(final, self.task, "valid", cfg),
            "test": evaluate(final, self.task, "test", cfg),
            "train_seconds": round(train_time, 1),
            "eval_seconds": round(time.monotonic() - t1, 1),
            "skipped_updates": self.guard.skipped,
            "torch_threads": torch.get_num_threads(),
        }
        if self.task.name == "lm":
            results["eval_mode"] = cfg.eval_mode
        atomic_write_text(self.run_dir / "results.json", json.dumps(results, indent=2) + "\n")
        print(
            f"done in {format_duration(train_time)} | best valid {self.main} {self.best:.4g} at step "
            f"{self.best_step:,} | test "
            + " | ".join(f"{k} {v:.4g}" for k, v in results["test"].items())
            + f" | {self.run_dir / 'results.json'}",
            flush=True,
        )
        return 0
