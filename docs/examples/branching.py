"""Branching: run a shared prefix once, then N continuations, each in a fork of its state.

    python docs/examples/branching.py                  # Docker sandbox (the default)
    python docs/examples/branching.py --backend local  # host subprocess, NOT isolated

GRPO-style rollouts and tree search share a prefix (the setup every sample
starts from) and differ after it. ``run_branches`` runs the prefix once in a
session and gives every continuation its own ``fork()`` of that state, so no
branch re-runs the prefix and no branch sees another's changes. The example
times that against the stateless way: every sample re-running the prefix.
"""

from __future__ import annotations

import argparse
import time

from retool_exec import Sandbox
from retool_exec.adapters import run_branches

# The shared prefix: slow to compute, needed by every branch.
PREFIX = """
limit = 6_000_000
sieve = bytearray([1]) * (limit + 1)
sieve[0:2] = b"\\x00\\x00"
for i in range(2, int(limit ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i :: i] = bytes(len(range(i * i, limit + 1, i)))
primes = [i for i, is_prime in enumerate(sieve) if is_prime]
"""

# What N sampled continuations might try next (one mutates the shared list: only its own copy).
CONTINUATIONS = [
    "print(len(primes))",
    "print(sum(primes) % 1_000_007)",
    "twins = sum(1 for a, b in zip(primes, primes[1:]) if b - a == 2)\nprint(twins)",
    "primes.reverse()\nprint(primes[0])",
    "print(primes[-1], primes[0])",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="docker", help="docker (default) or local")
    args = parser.parse_args()
    with Sandbox(args.backend, timeout=60.0) as sandbox:
        sandbox.start()  # warm the backend first: time the work, not the start-up
        started = time.perf_counter()
        outcome = run_branches(sandbox, PREFIX, CONTINUATIONS)
        branched = time.perf_counter() - started
        for code, results in zip(CONTINUATIONS, outcome.branches, strict=True):
            print(f"{code.splitlines()[-1]:<40} -> {results[-1].stdout.strip()}")

        started = time.perf_counter()
        replayed = [sandbox.run_code(PREFIX + "\n" + code) for code in CONTINUATIONS]
        stateless = time.perf_counter() - started
        same = [r.stdout for r in replayed] == [b[-1].stdout for b in outcome.branches]
        print(f"prefix once + {len(CONTINUATIONS)} forks: {branched:.2f} s")
        print(f"prefix re-run for each sample:  {stateless:.2f} s  (same answers: {same})")


if __name__ == "__main__":
    main()
