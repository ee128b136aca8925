"""The zygote's choice of fork, checked without Docker.

The plain fork skips CPython's at-fork hooks, so it must only be chosen where
they have nothing to do, and the two the agent knows must be redone
(``random``'s reseed, by ``generators`` before each fork; ``threading``'s
main-thread id). The forking checks run in a fresh interpreter: pytest's own
process may have threads of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

from retool_exec.backends.docker.agent import forking


def test_registrations_are_recorded_by_module_and_still_made() -> None:
    registered: list[str] = []
    original = os.register_at_fork
    ran = []
    with forking.recording_hooks(registered):
        os.register_at_fork(after_in_child=lambda: ran.append(1))
    assert registered == [__name__]
    assert os.register_at_fork is original
    pid = os.fork()
    if pid == 0:  # the hook really was registered: the child exits 7 only if it ran
        os._exit(7 if ran else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7


def test_an_unknown_hook_keeps_os_fork() -> None:
    assert forking.choose(["random", "threading", "some_library"]) is False
    assert forking.Fork.plain is None


def test_a_second_thread_keeps_os_fork() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert forking.choose([]) is False
        assert forking.Fork.plain is None
    finally:
        stop.set()
        thread.join()


CHILDREN = textwrap.dedent(
    """
    import json, os, random, sys, threading
    from retool_exec.backends.docker.agent import forking, generators

    chosen = forking.choose(["random", "threading"])
    found = generators.find()
    seen = []
    for _ in range(2):
        read_end, write_end = os.pipe()
        generators.reseed(found)  # as the zygote does before each fork
        pid = forking.fork()
        if pid == 0:
            fact = [random.getrandbits(64), threading.main_thread().native_id,
                    threading.get_native_id(), os.getpid()]
            os.write(write_end, json.dumps(fact).encode())
            os._exit(0)
        os.close(write_end)
        seen.append(json.loads(os.read(read_end, 4096)))
        os.waitpid(pid, 0)
    print(json.dumps({"chosen": chosen, "children": seen}))
    """
)


def test_the_plain_fork_after_the_reseed_gives_random_a_new_stream_and_names_the_thread() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILDREN], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(done.stdout)
    assert report["chosen"] is True  # a fresh interpreter has one thread and known hooks
    (first_random, *first_ids), (second_random, *second_ids) = report["children"]
    assert first_random != second_random  # each child has its own stream
    for main_native_id, native_id, pid in (first_ids, second_ids):
        assert main_native_id == native_id == pid
