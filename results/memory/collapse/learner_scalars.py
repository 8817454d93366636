"""The learner's scalars of one run over a window of env steps, one row per update: how a solved task was lost.

    python results/memory/collapse/learner_scalars.py RUN_DIR FIRST_STEP LAST_STEP OUT_CSV

Reads the run's TensorBoard events (every session's, `rfwp_rl.runlog.read_all_scalars`) and writes, for every
learner update logged between FIRST_STEP and LAST_STEP env steps, the value, entropy, policy KL, trust-region
step scale, gradient norm (before clipping), advantage and return scales and the loss parts.
"""

import sys

from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.runlog import read_all_scalars

TAGS = {
    "mean_value": "learner/mean_value",
    "entropy": "learner/entropy",
    "policy_kl": "learner/policy_kl",
    "step_scale": "learner/step_scale",
    "grad_norm": "learner/grad_norm",
    "advantage_scale": "learner/advantage_scale",
    "return_scale": "learner/return_scale",
    "loss_baseline": "loss/baseline",
    "loss_policy": "loss/policy",
    "loss_recall": "loss/recall",
}


def main(run_dir: str, first: int, last: int, out: str) -> None:
    scalars = read_all_scalars(run_dir)
    by_tag = {name: dict(scalars.get(tag, [])) for name, tag in TAGS.items()}
    steps = sorted(s for s in by_tag["mean_value"] if first <= s <= last)
    rows = [{"step": s, **{name: by_tag[name].get(s, float("nan")) for name in TAGS}} for s in steps]
    atomic_write_csv(out, rows, ["step", *TAGS], float_format=".4g")
    print(f"wrote {out}: {len(rows)} updates")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
