"""A multi-turn tool loop: each turn's code builds on the turns before it.

    python docs/examples/multi_turn.py                  # Docker sandbox (the default)
    python docs/examples/multi_turn.py --backend local  # host subprocess, NOT isolated

A real rollout asks a model for the next cell; here a scripted "model" plays
its part, so the example runs anywhere. The tool is
``SessionCodeInterpreter``: one interpreter per trajectory, the shape TRL's
``GRPOTrainer(environment_factory=...)`` takes (``session_environment_factory``).
Turn 2 uses the function turn 1 defined, turn 3 the list turn 2 built; a
stateless tool would have to re-run every earlier turn each time.
"""

from __future__ import annotations

import argparse

from retool_exec import Sandbox
from retool_exec.adapters import SessionCodeInterpreter

# What a model might write over five turns of one trajectory.
SCRIPTED_TURNS = [
    "def collatz(n):\n"
    "    steps = 0\n"
    "    while n != 1:\n"
    "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
    "        steps += 1\n"
    "    return steps\n"
    "print(collatz(27))",
    "lengths = [collatz(n) for n in range(1, 10_000)]\nprint(max(lengths))",
    "best = lengths.index(max(lengths)) + 1\nbest",
    "print(undefined_name)",  # a mistake: its error is the observation, the state survives
    "print(f'{best} takes {collatz(best)} steps')",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="docker", help="docker (default) or local")
    args = parser.parse_args()
    with Sandbox(args.backend, timeout=10.0) as sandbox, SessionCodeInterpreter(sandbox) as tool:
        for turn, code in enumerate(SCRIPTED_TURNS, 1):
            observation = tool.code_interpreter(code)
            print(f"--- turn {turn}\n{code}\n>>> {observation.strip()}")
        print(f"--- {len(tool.results)} cells, outcomes: {[r.outcome.value for r in tool.results]}")


if __name__ == "__main__":
    main()
