"""``rfwp-rl probe``: what a trained agent's memory does over an episode.

Plays full episodes with a saved IMPALA agent (sampled actions, as in training, unless
``--actions greedy``) and reports, against the step index within the episode (in bins of ``--bin``
steps): the policy's entropy, the value estimate and the norm of each core-state tensor per
env (for a fast-weight core its fast weight matrices, for an LSTM h and c). A memory that
grows through an episode, a value that drifts with time, a policy that loses its certainty
late in an episode: each shows in one table. With ``--shift LR``, also how far one optimizer
step of size LR moves the policy at each step of the episode (a policy that is far more
sensitive to its parameters late in an episode than early, or than another core's, is one that
a fixed learning rate can throw off a solved task). With ``--span K``, also how far back the memory
reaches: for lags 0..K, how much of what the agent saw that many steps back a linear read-out recovers
from the core's output, from its state, and from the present observation alone
(:mod:`rfwp_rl.impala.memory_span`). With ``--saliency K``, also what the decisions draw on: for lags 0..K,
the share of the gradient of the log-probability of the action taken (and of the value) that falls on the
features seen that many steps back, and by step of the episode the share drawn from memory
(:mod:`rfwp_rl.impala.saliency`). Writes the tables as CSV next to the run (``probe_<step>_<sample|greedy>.csv``,
``span_...``, ``saliency_...``, atomically).

Examples::

    rfwp-rl probe runs/memory/rfwp-PositionOnlyCartPole-easy-v0/rdn_s3
    rfwp-rl probe RUN --checkpoint best --episodes 40 --bin 20
    rfwp-rl probe RUN --shift 5e-4 --bin 40
    rfwp-rl probe RUN --span 30 --episodes 100
    rfwp-rl probe RUN --saliency 20
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch

from rfwp_rl import envs as envs_mod
from rfwp_rl import flags
from rfwp_rl.checkpoint import add_trust_argument, atomic_write_csv
from rfwp_rl.errors import UserError
from rfwp_rl.impala.evaluate import _check_envs, add_checkpoint_arguments, eval_env_options, load_agent, play, quotas
from rfwp_rl.impala.memory_span import MemorySpan, state_width
from rfwp_rl.impala.run_spec import parse_env_options
from rfwp_rl.impala.saliency import Saliency
from rfwp_rl.impala.trust_region import kl_terms
from rfwp_rl.texttable import format_columns


class StepStats:
    """Sums per time bin of entropy, value and each state tensor's per-env norm, fed by
    :func:`rfwp_rl.impala.evaluate.play`'s observer.

    With ``shift`` > 0 also the policy's sensitivity to its parameters: a twin of the agent whose
    every parameter is moved by ``±shift`` (a random sign each: the size of one Adam step at
    learning rate ``shift``) steps on the same inputs, and ``shift_kl`` is KL(pi || pi_twin),
    estimated on an action drawn from pi with E[(r - 1) - log r], r = pi_twin(a) / pi(a), the
    trust region's estimator."""

    def __init__(self, agent: torch.nn.Module, bin_steps: int, shift: float = 0.0, num_envs: int = 1, seed: int = 0):
        self.agent, self.bin = agent, bin_steps
        self.count: dict[int, int] = {}
        self.sums: dict[int, np.ndarray] = {}
        self.twin = None
        if shift > 0:
            self.twin = copy.deepcopy(agent)
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in self.twin.parameters():
                    p.add_(shift * torch.randint(0, 2, p.shape, generator=gen).to(p) * 2 - shift)
            self.twin_state = [
                s.clone() for s in self.twin.initial_state(num_envs, device=next(agent.parameters()).device)
            ]

    def _shift_kl(self, envs: list[int], inputs: dict, out: dict) -> torch.Tensor:
        """KL(pi || pi_twin) per active env ``[n]``; steps the twin's state of those envs."""
        idx = torch.tensor(envs)
        sub = tuple(s.index_select(0, idx.to(s.device)) for s in self.twin_state)
        with torch.inference_mode():
            twin_out, new_sub = self.twin(
                inputs["x"], inputs["reward"], inputs["done"], sub, prev_action=inputs["prev_action"], greedy=True
            )
            dist, params = self.agent.action_dist, out["policy_params"]
            a = dist.sample(params)
            log_r = (dist.log_prob(twin_out["policy_params"], a) - dist.log_prob(params, a)).float()[0]
        for s, ns in zip(self.twin_state, new_sub):
            s.index_copy_(0, idx.to(s.device), ns)
        return kl_terms(log_r).cpu()

    def __call__(self, envs: list[int], steps: list[int], inputs: dict, out: dict, state: tuple) -> None:
        with torch.no_grad():  # a Gaussian's entropy reads its log-std parameter
            entropy = self.agent.action_dist.entropy(out["policy_params"][0]).float().cpu()  # [n]
            value = out["baseline"][0].float().cpu()  # [n]
            norms = [s.float().flatten(1).norm(dim=1).cpu() for s in state]  # each [n]
            shift = [self._shift_kl(envs, inputs, out)] if self.twin is not None else []
            columns = torch.stack([entropy, value, *shift, *norms], dim=1).numpy()  # [n, 2 (+1) + states]
        for j, t in enumerate(steps):
            b = t // self.bin
            self.count[b] = self.count.get(b, 0) + 1
            self.sums[b] = self.sums.get(b, 0.0) + columns[j]

    def table(self) -> list[dict]:
        """One row per bin: ``first_step``, ``last_step``, ``samples``, ``entropy``, ``value``,
        (``shift_kl``,) ``state<k>_norm``."""
        rows = []
        for b in sorted(self.count):
            mean = self.sums[b] / self.count[b]
            row = {
                "first_step": b * self.bin,
                "last_step": (b + 1) * self.bin - 1,
                "samples": self.count[b],
                "entropy": float(mean[0]),
                "value": float(mean[1]),
            }
            rest = mean[2:]
            if self.twin is not None:
                row["shift_kl"], rest = float(rest[0]), rest[1:]
            row.update({f"state{k}_norm": float(v) for k, v in enumerate(rest)})
            rows.append(row)
        return rows


def probe(
    path: str | Path,
    episodes: int = 20,
    bin_steps: int = 10,
    greedy: bool = False,
    num_envs: int = 8,
    seed: int = 12345,
    which: str = "latest",
    trust_checkpoint: bool = False,
    env_overrides: dict | None = None,
    shift: float = 0.0,
    env: str | None = None,
    span: int = 0,
    saliency: int = 0,
) -> dict:
    """Play ``episodes`` full episodes of the checkpoint at ``path`` and return
    ``{"rows": StepStats.table(), "lengths": [...], "returns": [...], "truncated": int, "step": int,
    "checkpoint": str, "env": str, "core": str, "state_shapes": [...]}``, with ``span`` > 0 also
    ``"span": MemorySpan.table()`` over lags 0..``span`` and ``"state_width"``, with ``saliency`` > 0 also
    ``"saliency": Saliency.table()`` over lags 0..``saliency`` and the columns ``policy_past_share`` and
    ``value_past_share`` in the rows (NaN in a bin with no scored step). ``env``: see
    :func:`rfwp_rl.impala.evaluate.load_agent` (names an env module or file the checkpoint's env needs)."""
    if episodes < 1 or bin_steps < 1 or num_envs < 1:
        raise UserError(f"--episodes {episodes} / --bin {bin_steps} / --num-actors {num_envs}: each must be >= 1")
    if not shift >= 0:
        raise UserError(f"--shift {shift}: must be >= 0 (a parameter step size such as the learning rate; 0: off)")
    if span < 0:
        raise UserError(f"--span {span} is invalid; allowed: an integer >= 0 (the longest lag; 0: off)")
    if saliency < 0:
        raise UserError(f"--saliency {saliency} is invalid; allowed: an integer >= 0 (the longest lag; 0: off)")
    if span and episodes < 2:
        raise UserError(
            f"--span needs --episodes 2 or more (read-outs are fitted on half the episodes), not {episodes}"
        )
    agent, meta, step, file = load_agent(path, env=env, which=which, trust=trust_checkpoint)
    env_id = str(meta["env"])
    options = eval_env_options(meta, dict(env_overrides or {}), envs_mod.resolve_env_id(env_id).kind)
    n = min(num_envs, episodes)
    torch.manual_seed(seed)
    stats = StepStats(agent, bin_steps, shift=shift, num_envs=n, seed=seed)
    spans = MemorySpan(span, seed) if span else None
    uses = Saliency(agent, saliency, bin_steps) if saliency else None

    def observe(*seen: object) -> None:
        stats(*seen)
        for observer in (spans, uses):
            if observer is not None:
                observer(*seen)

    env_list = []
    try:
        for i in range(n):
            env_list.append(envs_mod.make_env(env_id, seed=seed + i, **options))
        _check_envs(env_list[0], env_id, meta, file)
        played = play(
            agent, env_list, quotas(episodes, n), greedy=greedy, observer=observe, with_features=spans is not None
        )
    finally:
        for e in env_list:
            e.close()
    extra = {"span": spans.table(), "state_width": state_width(agent.initial_state(1))} if spans is not None else {}
    rows = stats.table()
    if uses is not None:
        extra["saliency"] = uses.table()
        past = uses.past_share_by_bin()
        for row in rows:
            policy, value = past.get(row["first_step"] // bin_steps, (float("nan"), float("nan")))
            row.update(policy_past_share=policy, value_past_share=value)
    return {
        **extra,
        "rows": rows,
        "lengths": [e.length for e in played],
        "returns": [e.score for e in played],
        "truncated": sum(e.truncated for e in played),
        "step": step,
        "checkpoint": str(file),
        "env": env_id,
        "core": meta["core"],
        "state_shapes": [list(s.shape[1:]) for s in agent.initial_state(1)],
    }


def format_table(record: dict) -> str:
    rows = record["rows"]
    keys = list(rows[0])
    return format_columns(
        ["steps", *keys[2:]],
        [
            [
                f"{r['first_step']}-{r['last_step']}",
                str(r["samples"]),
                *(f"{r[k]:.3g}" if k == "shift_kl" else f"{r[k]:.3f}" for k in keys[3:]),
            ]
            for r in rows
        ],
    )


def format_span(record: dict) -> str:
    return format_columns(
        ["lag", "pairs (fit/scored)", "from the core output", "from the core state", "from the present"],
        [
            [
                str(r["lag"]),
                f"{r['pairs_fit']}/{r['pairs_scored']}",
                *(f"{r[f'r2_{source}']:.2f}" for source in ("output", "state", "present")),
            ]
            for r in record["span"]
        ],
    )


def format_saliency(record: dict) -> str:
    return format_columns(
        ["lag", "steps scored", "policy share", "value share"],
        [
            [str(r["lag"]), str(r["steps"]), f"{r['policy_share']:.3f}", f"{r['value_share']:.3f}"]
            for r in record["saliency"]
        ],
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:" + __doc__.split("Examples::", 1)[1]
    add_checkpoint_arguments(parser)
    parser.add_argument("--episodes", type=int, default=20, help="full episodes to play (default %(default)s)")
    parser.add_argument("--bin", type=int, default=10, help="env steps per row of the table (default %(default)s)")
    flags.add_actions_argument(parser, "sample")  # what the memory does while the agent acts as it learned to
    parser.add_argument(
        "--shift",
        type=float,
        default=0.0,
        metavar="LR",
        help="add a column shift_kl: KL from the policy to that of the agent with every parameter "
        "moved by +-LR (random signs; one Adam step's size), per step within the episode "
        "(e.g. 5e-4, the vector profile's learning rate; default 0: off)",
    )
    parser.add_argument(
        "--span",
        type=int,
        default=0,
        metavar="K",
        help="also how far back the memory reaches: for lags 0..K, the R² of a linear read-out of the features "
        "seen that many steps back, from the core output, from the core state and from the present features "
        "alone (fitted on the even episodes, scored on the odd ones; default 0: off)",
    )
    parser.add_argument(
        "--saliency",
        type=int,
        default=0,
        metavar="K",
        help="also what the decisions draw on: for lags 0..K, the share of the gradient of the log-probability of "
        "the action taken (and of the value) that falls on the features seen that many steps back, and by step "
        "the share drawn from memory (lags above 0) (default 0: off)",
    )
    flags.add_shared(parser, "num_actors", 8)
    flags.add_shared(parser, "seed", 12345, "env i is seeded with SEED + i")
    flags.add_shared(
        parser, "torch_threads", 1, "one env batch of a small agent: one thread is fastest; 0: torch's default"
    )
    parser.add_argument(
        "--env-option",
        dest="env_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an env option of the training run",
    )
    parser.add_argument(
        "--env",
        default=None,
        help="expected env; needed to confirm an env of the form MODULE:ID or FILE.py:ID (importing it runs its code)",
    )
    parser.add_argument("--out", default=None, help="CSV path (default: probe_<step>_<mode>.csv in the run directory)")
    add_trust_argument(parser)


def run(args: argparse.Namespace) -> int:
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    record = probe(
        args.run,
        episodes=args.episodes,
        bin_steps=args.bin,
        greedy=args.actions == "greedy",
        num_envs=args.num_actors,
        seed=args.seed,
        which=args.checkpoint,
        trust_checkpoint=args.trust_checkpoint,
        env_overrides=parse_env_options(args.env_options, "max_episode_steps=500"),
        shift=args.shift,
        env=args.env,
        span=args.span,
        saliency=args.saliency,
    )
    lengths, returns = np.array(record["lengths"]), np.array(record["returns"])
    mode = args.actions
    print(
        f"probe {record['checkpoint']} (step {record['step']:,}, core {record['core']}) on {record['env']}, "
        f"{len(lengths)} episodes ({mode}): return {returns.mean():.3f} ± {returns.std():.3f}, length median "
        f"{np.median(lengths):.0f} (min {lengths.min()}, max {lengths.max()}), {record['truncated']} hit the "
        f"time limit; state tensors per env {record['state_shapes']}"
    )
    print(format_table(record))
    out = Path(args.out) if args.out else Path(record["checkpoint"]).parent / f"probe_{record['step']:012d}_{mode}.csv"
    atomic_write_csv(out, record["rows"])
    print(f"wrote {out}")
    if "span" in record:
        width = record["state_width"]
        state = f"the core state through {width} numbers" if width else "the core has no state"
        print(
            "\nhow far back the memory reaches: R² of the features seen `lag` steps back, read linearly at each "
            f"step ({state}; 'from the present': no memory)"
        )
        print(format_span(record))
        span_out = out.with_name(f"span_{record['step']:012d}_{mode}.csv" if not args.out else f"{out.stem}_span.csv")
        atomic_write_csv(span_out, record["span"])
        print(f"wrote {span_out}")
    if "saliency" in record:
        print(
            "\nwhat the decisions draw on: the share of the gradient of log pi(action taken) and of the value that "
            "falls on the features seen `lag` steps back (lag 0: the present; the rest comes through memory)"
        )
        print(format_saliency(record))
        name = f"saliency_{record['step']:012d}_{mode}.csv" if not args.out else f"{out.stem}_saliency.csv"
        saliency_out = out.with_name(name)
        atomic_write_csv(saliency_out, record["saliency"])
        print(f"wrote {saliency_out}")
    return 0
