"""A CartPole learner's env steps/s before, during and after a minute of pre-handshake attacks.

Starts ``rfwp-rl train --listen 127.0.0.1:PORT`` with a fresh key, measures its env steps/s from
its progress lines for ``--window`` s, then attacks its port from raw sockets for ``--attack`` s
(huge declared lengths, random bytes, truncated and oversize greetings, idle connections, in a
loop), then measures again. Exits 1 if the learner ended or stopped training.

Usage: python scripts/preauth_attack_bench.py [--attack 60] [--window 30]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from preauth_wire import REQ_GREETING, SIGNATURE, RawPeer, challenge, moolib_str  # noqa: E402
from procs import free_port  # noqa: E402


class Learner:
    def __init__(self, run_dir: Path, key_file: Path):
        self.port = free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RFWP_AUTH_KEY_FILE=str(key_file))
        env.pop("RFWP_AUTH_KEY", None)
        # fmt: off
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rfwp_rl", "train", "--env", "CartPole-v1", "--core", "lstm",
             "--set", "core_config.hidden_size=16", "--run-dir", str(run_dir),
             "--listen", f"127.0.0.1:{self.port}", "--num-actors", "2", "--num-env-processes", "1",
             "--unroll-length", "5", "--batch-size", "2", "--total-steps", "1000000000", "--log-every", "0.5"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        # fmt: on
        self.samples: list[tuple[float, int]] = []  # (time, env steps) of each progress line
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if m := re.match(r"([\d,]+)/[\d,]+ ", line):
                self.samples.append((time.monotonic(), int(m.group(1).replace(",", ""))))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rate(self, seconds: float) -> float:
        """Env steps/s over the next ``seconds`` s."""
        t0 = time.monotonic()
        time.sleep(seconds)
        window = [(t, s) for t, s in self.samples if t >= t0]
        if len(window) < 2:
            return 0.0
        return (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])


def attack_once(port: int, rng: random.Random, held: list[socket.socket]) -> None:
    kind = rng.randrange(6)
    try:
        if kind == 0:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"\xff" * 8 + b"\0" * 64)
        elif kind == 1:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(rng.randbytes(rng.randrange(1, 4096)))
        elif kind == 2:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(struct.pack("<Q", 1024) + b"x" * 10)
        elif kind in (3, 4):
            peer = RawPeer(port)
            greeting = struct.pack("<IIQ", 0, REQ_GREETING, SIGNATURE) + moolib_str(b"x") + b"\0" * 16
            message = (
                dict(body=greeting + struct.pack("<Q", 1 << 40))
                if kind == 3
                else dict(body=challenge(), tensors=[1 << 40])
            )
            peer.send(**message)
            peer.close()
        else:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            if len(held) > 100:
                held.pop(0).close()
    except OSError:
        pass  # the learner closed it first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attack", type=float, default=60.0, help="seconds of attacks")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured before and after")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="preauth-bench-"))
    learner = Learner(tmp / "run", tmp / "auth.key")
    try:
        deadline = time.monotonic() + 300
        while len(learner.samples) < 3:
            if not learner.alive() or time.monotonic() > deadline:
                print("\n".join(learner.lines[-30:]))
                print("error: the learner did not start training", file=sys.stderr)
                return 1
            time.sleep(0.1)
        before = learner.rate(args.window)
        print(f"before: {before:,.0f} env steps/s", flush=True)

        stop = threading.Event()
        attacks = [0]
        held: list[socket.socket] = []

        def attacker(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                attack_once(learner.port, rng, held)
                attacks[0] += 1

        threads = [threading.Thread(target=attacker, args=(i,), daemon=True) for i in range(2)]
        for t in threads:
            t.start()
        during = []
        t_end = time.monotonic() + args.attack
        while time.monotonic() < t_end and learner.alive():
            during.append(learner.rate(min(10.0, t_end - time.monotonic())))
            print(f"under attack: {during[-1]:,.0f} env steps/s ({attacks[0]} attacks so far)", flush=True)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        for s in held:
            s.close()
        if not learner.alive():
            print("\n".join(learner.lines[-30:]))
            print("error: the learner ended under attack", file=sys.stderr)
            return 1
        after = learner.rate(args.window)
        mean = sum(during) / max(len(during), 1)
        print(f"after: {after:,.0f} env steps/s")
        print(f"summary: before {before:,.0f}, under {attacks[0]} attacks {mean:,.0f}, after {after:,.0f} env steps/s")
        return 0 if learner.alive() and after > 0 else 1
    finally:
        learner.proc.kill()
        learner.proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
