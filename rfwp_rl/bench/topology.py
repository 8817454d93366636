"""``rfwp-rl bench impala --topologies local,remote,group``: env steps/s of IMPALA's topologies on one machine.

For each core and device, each topology runs as ``rfwp-rl`` processes on loopback, one topology at a time,
all timed the same way:

- ``local``: one learner (``rfwp-rl train``) that steps all ``--num-actors`` N envs itself;
- ``remote``: one learner with ``--listen 127.0.0.1:PORT`` and no envs of its own, fed by ``--remote-actors``
  K ``rfwp-rl actor --connect`` processes of N/K envs each;
- ``group``: a ``rfwp-rl broker`` and two learners joined by ``--broker`` into one group, N/2 envs each.

Every learner has the same env, agent (``--set``), batch size (in the group each learner's: a round averages
up to two batches), unroll, device and precision, and ``--max-kl 0`` (the trust region needs one learner, so no
topology has it). The ``--num-env-processes`` P env worker
processes are split like the envs (P/K per actor, P/2 per learner of the group, at least one each).
Remote actors act on the learner's device (``--actor-device cpu`` or ``cuda``: there), eagerly: the CUDA
graph of ``--acting-graph`` is the learners' own actors' only.

Timing: a learner reports every :data:`LOG_SECONDS` to its TensorBoard events: its step counter (env steps
trained) and its own clock (``perf/train_minutes``). The warm-up starts at the first report with trained
steps and the whole topology in place (K remote actors connected, both learners in the group); after
``--warmup-seconds`` the window runs from a report to the first report ``--seconds`` later, and ``env_sps``
is the env steps trained in the window per second of it. In a group every learner's counter is the
group's (the env steps of all its learners' batches), read here from the first learner. The benchmark
waits on the learners' console progress lines with generous deadlines, then stops every process
(:mod:`rfwp_rl.bench.child_processes`) and reads the events. Runs, logs and a fresh auth key (mode 600)
live in a temporary directory that is removed.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import rfwp_rl
from rfwp_rl.bench.child_processes import ChildProcess, ChildProcesses, interrupt_on_sigterm
from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.impala.net import free_port
from rfwp_rl.impala.wire import create_key_file
from rfwp_rl.perf import available_cores
from rfwp_rl.runlog import read_all_scalars
from rfwp_rl.texttable import format_columns

TOPOLOGIES = ("local", "remote", "group")
OUT = "results/bench/impala_topology.csv"
GROUP_LEARNERS = 2
COLUMNS = (
    "agent",
    "device",
    "topology",
    "envs",
    "processes",
    "env_processes",
    "env_sps",
    "vs_local",
    "env_steps",
    "window_seconds",
    "load_avg",
    "env",
    "batch_size",
    "unroll_length",
    "env_backend",
    "cpu_cores",
)
LOG_SECONDS = 0.5  # the learners' report interval: the window's ends fall on reports
START_SECONDS = 600.0  # deadline for a topology to be in place: processes started, connected, first update
LINE_SECONDS = 120.0  # deadline for a learner's next progress line once it trains
STOP_SECONDS = 60.0  # SIGTERM to SIGKILL: a learner saves a checkpoint and ends its env workers first
TOTAL_STEPS = 10**12  # never reached: the benchmark stops the learners
GROUP_NAME = "bench-topology"
PROGRESS = re.compile(r"([\d,]+)/[\d,]+ env steps \(")


def parse_topologies(args: argparse.Namespace) -> list[str]:
    """The ``--topologies`` named, checked against the envs and remote actors they need; one-line errors."""
    names = list(dict.fromkeys(args.topologies))
    if not names:
        raise UserError(f"--topologies names none; allowed: a list of {', '.join(TOPOLOGIES)}")
    for name in names:
        check_choice("topology", name, TOPOLOGIES)
    n, b, k = args.num_actors, args.num_env_batches, args.remote_actors
    if k < 1:
        raise UserError(f"--remote-actors {k} is invalid; allowed: an integer >= 1")
    if n < 1 or n % b:
        raise UserError(f"--num-actors {n} is invalid; allowed: a multiple of --num-env-batches {b}")
    if "remote" in names and n % (k * b):
        raise UserError(
            f"--num-actors {n} cannot be split among --remote-actors {k} in batches of --num-env-batches {b}; "
            f"allowed: a multiple of {k} x {b} = {k * b}"
        )
    if "group" in names and n % (GROUP_LEARNERS * b):
        raise UserError(
            f"--num-actors {n} cannot be split between the group's {GROUP_LEARNERS} learners in batches of "
            f"--num-env-batches {b}; allowed: a multiple of {GROUP_LEARNERS} x {b} = {GROUP_LEARNERS * b}"
        )
    return names


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def child_env() -> dict[str, str]:
    """The children's environment: this process's, with this very package first on the path (the children
    run ``python -m rfwp_rl`` in a temporary directory)."""
    root = str(Path(rfwp_rl.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


class Plan:
    """The commands of one topology for one core and device."""

    def __init__(self, args: argparse.Namespace, core: str, device: str, key: Path, runs: Path):
        self.args, self.core, self.device, self.key, self.runs = args, core, device, key, runs

    def _agent(self) -> list[str]:
        """What learners and actors must share (checked when they meet), and how they step envs."""
        a = self.args
        sets = [x for item in a.overrides for x in ("--set", item)]
        return [
            *("--env", a.env, "--core", self.core, *sets),
            *("--env-backend", a.env_backend, "--num-env-batches", str(a.num_env_batches)),
            *("--precision", a.precision, "--torch-threads", str(a.torch_threads), "--auth-key-file", str(self.key)),
        ]

    def learner(self, name: str, seed: int, envs: int, env_processes: int, *extra: str) -> list[str]:
        a = self.args
        return [
            *(sys.executable, "-m", "rfwp_rl", "train", *self._agent(), "--seed", str(seed)),
            *("--total-steps", str(TOTAL_STEPS), "--num-actors", str(envs), "--num-env-processes", str(env_processes)),
            *("--batch-size", str(a.batch_size), "--unroll-length", str(a.unroll_length), "--device", self.device),
            *("--actor-device", a.actor_device, "--acting-graph" if a.acting_graph else "--no-acting-graph"),
            *("--max-kl", "0", "--checkpoint-every", "inf", "--log-every", str(LOG_SECONDS)),
            *("--run-dir", str(self.runs / name), *extra),
        ]

    def actor(self, index: int, address: str, envs: int, env_processes: int) -> list[str]:
        # remote actors act on the learner's device unless --actor-device says otherwise (eagerly: no CUDA graph)
        device = self.device if self.args.actor_device == "auto" else self.args.actor_device
        return [
            *(sys.executable, "-m", "rfwp_rl", "actor", "--connect", address, "--name", f"bench-actor-{index}"),
            *self._agent(),
            *("--seed", str(1000 + index), "--num-actors", str(envs), "--num-env-processes", str(env_processes)),
            *("--device", device, "--log-every", "30"),
        ]

    def broker(self, address: str) -> list[str]:
        return [
            *(sys.executable, "-m", "rfwp_rl", "broker", "--address", address, "--auth-key-file", str(self.key)),
            "--quiet",
        ]


def _said(child: ChildProcess, text: str) -> bool:
    return any(text in line for line in child.lines)


def progress(line: str) -> dict[str, float] | None:
    """A learner's console progress line as ``{"step": ..., "remote_actors": ..., "learners": ...}`` (the
    fields it has); None for other lines."""
    match = PROGRESS.match(line)
    if not match:
        return None
    fields = {"step": float(match.group(1).replace(",", ""))}
    for part in line.split(" | ")[1:]:
        key, _, value = part.partition(" ")
        if key in ("remote_actors", "learners"):
            fields[key] = float(value)
    return fields


def timed_window(
    scalars: dict[str, list[tuple[int, float]]], needs: dict[str, float], warmup: float, seconds: float
) -> tuple[int, float]:
    """``(env steps, seconds)`` of the window in a learner's TensorBoard scalars (:func:`read_all_scalars`):
    from the first report ``warmup`` s after the first one with trained steps and every ``needs`` tag at
    least its value, to the first report ``seconds`` later. :class:`UserError` if the events do not reach."""
    minutes = dict(scalars.get("perf/train_minutes", []))
    values = {tag: dict(scalars.get(tag, [])) for tag in needs}
    reports = sorted((60.0 * m, step) for step, m in minutes.items())  # (learner clock s, env steps)

    def in_place(step: int) -> bool:
        return step > 0 and all(values[tag].get(step, 0.0) >= v for tag, v in needs.items())

    ready = next((t for t, step in reports if in_place(step)), None)
    start = next(((t, s) for t, s in reports if ready is not None and t >= ready + warmup), None)
    end = next(((t, s) for t, s in reports if start is not None and t >= start[0] + seconds), None)
    if end is None:
        when = "with the topology in place" if ready is None else f"{warmup + seconds:g} s after that"
        raise UserError(f"the learner's TensorBoard events hold no report {when}")
    return end[1] - start[1], end[0] - start[0]


class Topology:
    """One topology's processes for one core and device: started, waited on until in place, timed."""

    def __init__(self, name: str, plan: Plan, procs: ChildProcesses):
        self.name, self.plan, self.procs = name, plan, procs
        self.learners: list[ChildProcess] = []
        self.processes = self.env_processes = 0
        self.needs: dict[str, float] = {}  # TensorBoard tag -> the value that says the topology is in place

    @property
    def first_run_dir(self) -> Path:
        """The run directory of the learner whose reports are timed."""
        return self.plan.runs / self.learners[0].name

    def start(self) -> None:
        """Start the processes, each once the one it connects to listens."""
        a, plan = self.plan.args, self.plan
        n, p = a.num_actors, a.num_env_processes
        workers = 0 if a.env_backend == "local" else 1  # env worker processes per process asked for
        if self.name == "local":
            _say(f"  starting 1 learner with {n} envs")
            self.learners = [self.procs.start("learner", plan.learner("learner", 1, n, p))]
            self.processes, self.env_processes = 1, workers * p
            return
        address = f"127.0.0.1:{free_port()}"
        if self.name == "remote":
            k = a.remote_actors
            share, per_actor = n // k, max(1, p // k)
            _say(f"  starting 1 learner listening on {address}, then {k} actors of {share} envs each")
            learner = self.procs.start("learner", plan.learner("learner", 1, 0, 1, "--listen", address))
            self.learners = [learner]
            self.wait(lambda: _said(learner, "listening for remote actors"), "the learner listening")
            for i in range(k):
                self.procs.start(f"actor-{i}", plan.actor(i, address, share, per_actor))
            self.processes, self.env_processes = 1 + k, workers * k * per_actor
            self.needs = {"remote/actors": float(k)}
            return
        share, per_learner = n // GROUP_LEARNERS, max(1, p // GROUP_LEARNERS)
        _say(f"  starting a broker on {address}, then {GROUP_LEARNERS} learners of {share} envs each")
        broker = self.procs.start("broker", plan.broker(address))
        self.wait(lambda: _said(broker, "broker listening on"), "the broker listening")
        joined = ("--broker", address, "--group", GROUP_NAME)
        self.learners = [
            self.procs.start(f"learner-{i}", plan.learner(f"learner-{i}", 1 + i, share, per_learner, *joined))
            for i in range(GROUP_LEARNERS)
        ]
        self.processes, self.env_processes = 1 + GROUP_LEARNERS, workers * GROUP_LEARNERS * per_learner
        self.needs = {"group/size": float(GROUP_LEARNERS)}

    def wait(self, done: Callable[[], bool], what: str, timeout: float = START_SECONDS) -> None:
        """Read every child's new lines until ``done()``; a child that ends, or ``timeout`` s without it, is a
        one-line :class:`UserError` (the child's last lines printed first)."""
        deadline = time.monotonic() + timeout
        while True:
            for child in self.procs.children:
                child.read()
            if done():
                return
            for child in self.procs.children:
                code = child.exit_code()
                if code is not None:
                    print(child.tail(), file=sys.stderr, flush=True)
                    raise UserError(f"{self.name}: the {child.name} exited (code {code}) while waiting for {what}")
            if time.monotonic() > deadline:
                print(self.learners[0].tail() if self.learners else "", file=sys.stderr, flush=True)
                raise UserError(f"{self.name}: {timeout:g} s passed without {what}")
            time.sleep(0.1)

    def reports(self) -> list[dict[str, float]]:
        """The first learner's progress lines so far."""
        return [f for f in map(progress, self.learners[0].lines) if f is not None]

    def in_place(self) -> bool:
        """The first learner's newest progress line shows trained steps and the whole topology."""
        lines = self.reports()
        keys = {"remote/actors": "remote_actors", "group/size": "learners"}
        return (
            bool(lines)
            and lines[-1]["step"] > 0
            and all(lines[-1].get(keys[tag], 0) >= v for tag, v in self.needs.items())
        )

    def run(self, warmup: float, seconds: float) -> None:
        """Start the topology and let it run through the warm-up and the timed window."""
        self.start()
        what = {
            "local": "the first update of the learner",
            "remote": f"{self.plan.args.remote_actors} connected remote actors and a first update",
            "group": f"a group of {GROUP_LEARNERS} learners and its first update",
        }[self.name]
        _say(f"  waiting for {what} (up to {START_SECONDS:g} s)")
        self.wait(self.in_place, what)
        _say(f"  in place: warm-up {warmup:g} s, then {seconds:g} s timed")
        # the reports that bound the window come at most LOG_SECONDS apart: wait past the window's end
        end = time.monotonic() + warmup + seconds + 2 * LOG_SECONDS
        self.wait(lambda: time.monotonic() >= end, "the end of the timed window", warmup + seconds + LINE_SECONDS)
        # TensorBoard keeps one report per step (the last), so the window's reports are those of steps: where an
        # update takes longer than a report interval, the window's ends move by up to an update each (the
        # first step's last report, the start's, the end's). Three more updates after `end` cover them.
        last = self.reports()[-1]["step"]
        self.wait(
            lambda: len({r["step"] for r in self.reports() if r["step"] > last}) >= 3,
            "the learner's next updates",
            LINE_SECONDS,
        )


def run(args: argparse.Namespace, names: list[str], cores: list[str], devices: list[str], envs: dict[str, str]) -> int:
    """Each topology of ``names`` (``--topologies``, as :func:`parse_topologies` returns them) for each core and
    device; a table and ``--out``. ``envs``: each core's env id, as resolved."""
    if importlib.util.find_spec("moolib") is None and set(names) - {"local"}:
        skipped = [t for t in names if t != "local"]
        print(f"moolib is not installed: {' and '.join(skipped)} need it (bash scripts/setup.sh); skipping them")
        names = [t for t in names if t == "local"]
    if not names:
        return 0
    _say(
        f"IMPALA topologies {', '.join(names)}: {args.env}, {args.num_actors} envs in all "
        f"[{args.env_backend}, {args.num_env_processes} env processes in all], batch {args.batch_size} x unroll "
        f"{args.unroll_length}, {args.remote_actors} remote actor processes, {available_cores()} cores"
    )
    rows: list[dict] = []
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory(prefix="rfwp-topology-") as tmp:
        key = Path(tmp) / "auth.key"
        create_key_file(key)  # fresh, mode 600: every process of every topology proves it
        for core in cores:
            for device in devices:
                mine = []
                for name in names:
                    _say(f"{core} on {device}, {name}:")
                    row = measure(args, name, Plan(args, core, device, key, Path(tmp) / f"{core}-{device}-{name}"))
                    row.update(agent=core, device=device, env=envs[core], vs_local=math.nan)
                    mine.append(row)
                    local = [r["env_sps"] for r in mine if r["topology"] == "local"]
                    for r in mine:
                        r["vs_local"] = r["env_sps"] / local[0] if local else math.nan
                    rows.append(row)
                    _say(
                        f"{core} on {device}, {name}: {row['env_sps']:,.0f} env steps/s "
                        f"({row['env_steps']:,} in {row['window_seconds']:.1f} s)"
                    )
                    atomic_write_csv(args.out, rows, COLUMNS)  # partial tables survive a time limit
    print(format_table(rows))
    print(f"wrote {args.out}")
    return 0


def measure(args: argparse.Namespace, name: str, plan: Plan) -> dict:
    """One topology, started, timed and stopped: its row but for agent, device, env and vs_local."""
    with ChildProcesses(plan.runs, child_env(), STOP_SECONDS) as procs:
        topology = Topology(name, plan, procs)
        topology.run(args.warmup_seconds, args.seconds)
        load = os.getloadavg()[0]
        _say("  stopping")
        killed = procs.stop()
    if killed:
        _say(f"  warning: killed {', '.join(killed)}: not ended {STOP_SECONDS:g} s after SIGTERM")
    scalars = read_all_scalars(topology.first_run_dir)
    try:
        steps, seconds = timed_window(scalars, topology.needs, args.warmup_seconds, args.seconds)
    except UserError as e:
        raise UserError(f"{name}: {e}") from None
    return {
        "topology": name,
        "envs": args.num_actors,
        "processes": topology.processes,
        "env_processes": topology.env_processes,
        "env_sps": steps / seconds,
        "env_steps": steps,
        "window_seconds": seconds,
        "load_avg": load,
        "batch_size": args.batch_size,
        "unroll_length": args.unroll_length,
        "env_backend": args.env_backend,
        "cpu_cores": available_cores(),
    }


def format_table(rows: list[dict]) -> str:
    head = ["agent", "device", "topology", "envs", "processes", "env SPS", "vs local", "window s", "load"]
    cells = [
        [
            r["agent"],
            r["device"],
            r["topology"],
            str(r["envs"]),
            str(r["processes"]),
            f"{r['env_sps']:,.0f}",
            f"{r['vs_local']:.2f}",
            f"{r['window_seconds']:.1f}",
            f"{r['load_avg']:.1f}",
        ]
        for r in rows
    ]
    return format_columns(head, cells)
