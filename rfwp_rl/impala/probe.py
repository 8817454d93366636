"""``rfwp-rl probe``: what a trained agent's memory does over an episode.

Plays full episodes with a saved IMPALA agent (sampled actions, as in training, unless
``--greedy``) and reports, against the step index within the episode (in bins of ``--bin``
steps): the policy's entropy, the value estimate and the norm of each core-state tensor per
env (for a fast-weight core its fast weight matrices, for an LSTM h and c). A memory that
grows through an episode, a value that drifts with time, a policy that loses its certainty
late in an episode: each shows in one table. Writes the table as CSV next to the run
(``probe_<step>_<sample|greedy>.csv``, atomically).

Examples::

    rfwp-rl probe runs/memory/rfwp-PositionOnlyCartPole-easy-v0/rdn_s3
    rfwp-rl probe RUN --checkpoint best --episodes 40 --bin 20
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
import torch

from rfwp_rl.errors import UserError


class StepStats:
    """Sums per time bin of entropy, value and each state tensor's per-env norm, fed by
    :func:`rfwp_rl.impala.evaluate.play`'s observer."""

    def __init__(self, agent: torch.nn.Module, bin_steps: int):
        self.agent, self.bin = agent, bin_steps
        self.count: dict[int, int] = {}
        self.sums: dict[int, np.ndarray] = {}

    def __call__(self, steps: list[int], out: dict, state: tuple) -> None:
        entropy = self.agent.action_dist.entropy(out["policy_params"][0]).float().cpu()  # [n]
        value = out["baseline"][0].float().cpu()  # [n]
        norms = [s.float().flatten(1).norm(dim=1).cpu() for s in state]  # each [n]
        columns = torch.stack([entropy, value, *norms], dim=1).numpy()  # [n, 2 + states]
        for j, t in enumerate(steps):
            b = t // self.bin
            self.count[b] = self.count.get(b, 0) + 1
            self.sums[b] = self.sums.get(b, 0.0) + columns[j]

    def table(self) -> list[dict]:
        """One row per bin: ``first_step``, ``last_step``, ``samples``, ``entropy``, ``value``, ``state<k>_norm``."""
        rows = []
        for b in sorted(self.count):
            mean = self.sums[b] / self.count[b]
            row = {"first_step": b * self.bin, "last_step": (b + 1) * self.bin - 1, "samples": self.count[b],
                   "entropy": float(mean[0]), "value": float(mean[1])}
            row.update({f"state{k}_norm": float(v) for k, v in enumerate(mean[2:])})
            rows.append(row)
        return rows


def probe(path: str | Path, episodes: int = 20, bin_steps: int = 10, greedy: bool = False, num_envs: int = 8,
          seed: int = 12345, which: str = "latest", trust_checkpoint: bool = False,
          env_overrides: dict | None = None) -> dict:
    """Play ``episodes`` full episodes of the checkpoint at ``path`` and return
    ``{"rows": StepStats.table(), "lengths": [...], "returns": [...], "truncated": int, "step": int,
    "checkpoint": str, "env": str, "core": str, "state_shapes": [...]}``."""
    from rfwp_rl import envs as envs_mod
    from rfwp_rl.impala.evaluate import _check_envs, eval_env_options, load_agent, play, quotas

    if episodes < 1 or bin_steps < 1 or num_envs < 1:
        raise UserError(f"--episodes {episodes} / --bin {bin_steps} / --num-envs {num_envs}: each must be >= 1")
    agent, meta, step, file = load_agent(path, which=which, trust=trust_checkpoint)
    env_id = str(meta["env"])
    options = eval_env_options(meta, dict(env_overrides or {}), envs_mod.resolve_env_id(env_id).kind)
    n = min(num_envs, episodes)
    torch.manual_seed(seed)
    stats = StepStats(agent, bin_steps)
    env_list = []
    try:
        for i in range(n):
            env_list.append(envs_mod.make_env(env_id, seed=seed + i, **options))
        _check_envs(env_list[0], env_id, meta, file)
        played = play(agent, env_list, quotas(episodes, n), greedy=greedy, observer=stats)
    finally:
        for e in env_list:
            e.close()
    return {"rows": stats.table(), "lengths": [e.length for e in played], "returns": [e.score for e in played],
            "truncated": sum(e.truncated for e in played), "step": step, "checkpoint": str(file), "env": env_id,
            "core": meta["core"], "state_shapes": [list(s.shape[1:]) for s in agent.initial_state(1)]}


def format_table(record: dict) -> str:
    rows = record["rows"]
    keys = list(rows[0])
    lines = [["steps", *keys[2:]]] + [[f"{r['first_step']}-{r['last_step']}", str(r["samples"]),
                                       *(f"{r[k]:.3f}" for k in keys[3:])] for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:" + __doc__.split("Examples::", 1)[1]
    from rfwp_rl.impala.evaluate import add_checkpoint_arguments

    add_checkpoint_arguments(parser)
    parser.add_argument("--episodes", type=int, default=20, help="full episodes to play (default 20)")
    parser.add_argument("--bin", type=int, default=10, help="steps per row of the table (default 10)")
    parser.add_argument("--greedy", action="store_true", help="take the policy's mode instead of sampling")
    parser.add_argument("--num-envs", type=int, default=8, help="environments stepped together (default 8)")
    parser.add_argument("--seed", type=int, default=12345, help="env i is seeded with SEED + i")
    parser.add_argument("--env-option", dest="env_options", action="append", default=[], metavar="KEY=VALUE",
                        help="override an env option of the training run")
    parser.add_argument("--out", default=None, help="CSV path (default: probe_<step>_<mode>.csv in the run directory)")
    from rfwp_rl.checkpoint import add_trust_argument

    add_trust_argument(parser)


def run(args: argparse.Namespace) -> int:
    from rfwp_rl.checkpoint import atomic_write_text
    from rfwp_rl.impala.setup import parse_env_options

    torch.set_num_threads(1)  # one env batch of a small agent: one thread is fastest
    record = probe(args.run, episodes=args.episodes, bin_steps=args.bin, greedy=args.greedy, num_envs=args.num_envs,
                   seed=args.seed, which=args.checkpoint, trust_checkpoint=args.trust_checkpoint,
                   env_overrides=parse_env_options(args.env_options, "max_episode_steps=500"))
    lengths, returns = np.array(record["lengths"]), np.array(record["returns"])
    mode = "greedy" if args.greedy else "sample"
    print(f"probe {record['checkpoint']} (step {record['step']:,}, core {record['core']}) on {record['env']}, "
          f"{len(lengths)} episodes ({mode}): return {returns.mean():.3f} ± {returns.std():.3f}, length median "
          f"{np.median(lengths):.0f} (min {lengths.min()}, max {lengths.max()}), {record['truncated']} hit the "
          f"time limit; state tensors per env {record['state_shapes']}")
    print(format_table(record))
    out = Path(args.out) if args.out else Path(record["checkpoint"]).parent / f"probe_{record['step']:012d}_{mode}.csv"
    buf = io.StringIO()
    keys = list(record["rows"][0])
    buf.write(",".join(keys) + "\n")
    for r in record["rows"]:
        buf.write(",".join(str(r[k]) if isinstance(r[k], int) else f"{r[k]:.6g}" for k in keys) + "\n")
    atomic_write_text(out, buf.getvalue())
    print(f"wrote {out}")
    return 0
