"""Settings of ``rfwp-rl seq``: every field is a flag and (but ``task``, ``model`` and ``core``) a
``--set`` key (:mod:`rfwp_rl.flags`). Sequence tasks have no env: the budget and the intervals
count optimizer steps (updates), durations are seconds."""

from __future__ import annotations

import dataclasses

from rfwp_rl import flags
from rfwp_rl.flags import SECONDS
from rfwp_rl.seq.tasks import TASKS

MODELS = ("seq", "memory")
POSITIONS = ("auto", "on", "off")
# core options with a flag of their own (others: --set core_config.KEY=VALUE)
CORE_FLAGS = ("hidden_size", "num_layers", "num_heads", "ff_size", "dropout", "feature_map")


@dataclasses.dataclass
class SeqConfig:
    task: str = flags.setting("lm", f"one of: {', '.join(TASKS)}")
    # model
    model: str = flags.setting(
        "seq",
        "seq: embedding + core + output layer; memory: the single-layer fast-weight "
        "memory of Secretly-FWP Sec. 6.1 (assoc only; --core lt or delta, --hidden-size "
        "= d_key)",
        choices=MODELS,
    )
    core: str = flags.setting(
        "delta", "core name (rfwp-rl info lists them; plus 'transformer', the softmax-attention baseline)"
    )
    emb_size: int = flags.setting(128, "token embedding size")
    hidden_size: int | None = flags.setting(None, "core hidden size (default: the core's)")
    num_layers: int | None = flags.setting(None, "core layers/blocks (default: the core's)")
    num_heads: int | None = flags.setting(None, "heads (default: the core's)")
    ff_size: int | None = flags.setting(None, "feed-forward inner size (default: the core's)")
    dropout: float = flags.setting(0.0, "dropout on embeddings and, if the core has it, inside the core")
    feature_map: str | None = flags.setting(None, "elu_sum, softmax, dpfp or l2 (default: the core's)")
    positions: str = flags.setting("auto", "sinusoidal positions (auto: only for the transformer)", choices=POSITIONS)
    # training
    updates: int = flags.setting(2000)
    batch_size: int = flags.setting(32, "sequences per optimizer step")
    learning_rate: float = flags.setting(3e-4, "Adam's, constant after --warmup-updates")
    warmup_updates: int = flags.setting(0, "optimizer steps of linear learning-rate warm-up")
    grad_norm_clip: float = flags.setting(1.0)
    seed: int = flags.setting(1, "of the model and the data")
    eval_every_updates: int = flags.setting(
        500, "optimizer steps between evaluations on the validation set (best.pt: the best weights so far)"
    )
    eval_batch_size: int = flags.setting(64, "sequences per validation batch")
    target: float | None = flags.setting(
        None, "stop once the validation score reaches this (seq_acc for the algorithmic tasks, perplexity for lm)"
    )
    patience: int = flags.setting(0, "stop after this many validations without improvement (0: never)")
    checkpoint_every: float = flags.setting(300.0, unit=SECONDS)
    log_every: float = flags.setting(5.0, "TensorBoard gets every optimizer step's scalars", unit=SECONDS)
    torch_threads: int = flags.setting(0, "0: torch's default")
    device: str = flags.setting("cpu")
    # lm task
    data: str = flags.setting(
        "builtin",
        "corpus directory with train/valid/test files (wiki.*.tokens or *.txt), or "
        "'builtin' (Python stdlib docstrings)",
    )
    tokens: str = flags.setting("word", "what one token is: a word or a char(acter)")
    min_count: int = flags.setting(1, "rarer training tokens -> <unk>")
    seg_len: int = flags.setting(128, "training segment length and evaluation window, in tokens")
    context: str = flags.setting(
        "independent", "independent segments, or carried state from segment to segment (full context)"
    )
    eval_mode: str = flags.setting(
        "auto", "carried, sliding, or auto (carried if training carried context, else sliding window)"
    )
    eval_max_tokens: int = flags.setting(
        5000, "tokens of the validation text scored during training (the final evaluation uses all)"
    )
    # algorithmic tasks
    num_vars: int = flags.setting(3, "code_exec: variables (3 or 5 in the paper)")
    num_statements: int = flags.setting(100, "code_exec: statements per program")
    depth: int = flags.setting(10, "listops: exact depth")
    max_args: int = flags.setting(5, "listops: max arguments per list")
    num_keys: int = flags.setting(32, "assoc: keys/values S")
    setting: int = flags.setting(1, "assoc: 1 (capacity) or 2 (updates)")
    data_sizes: str = flags.setting("10000,1000,1000", "code_exec/listops: train,valid,test sequences")


# --set keys: the settings but those that choose what is trained (core: --set core=NAME, the agent key)
NOT_SET_KEYS = ("task", "model", "core")


# Settings renamed so that no flag takes two units or meanings (``--total-steps`` counts env steps in
# the RL trainers, a level is a task's difficulty): their earlier names, as checkpoints and config.json keep them.
EARLIER_NAMES = {
    "total_steps": "updates",
    "warmup": "warmup_updates",
    "eval_every": "eval_every_updates",
    "level": "tokens",
}


def upgrade_settings(saved: dict) -> dict:
    """A saved settings dict (a checkpoint's meta, a run's config.json) with today's names."""
    return {EARLIER_NAMES.get(key, key): value for key, value in saved.items()}
