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

import pytest

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
    import ctypes, json, os, random, sys, threading
    from retool_exec.backends.docker.agent import forking, generators

    PLAIN = sys.argv[1] == "plain"
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come here
    report_r, report_w = os.pipe()
    zygote = os.fork()
    if zygote == 0:  # as the agent's zygote: forks copies that are its parent's children
        chosen = forking.choose(["random", "threading"]) if PLAIN else False
        if not PLAIN:
            forking.Fork.plain = None
        found = generators.find()
        seen = []
        for _ in range(2):
            read_end, write_end = os.pipe()
            go_r, go_w = os.pipe()  # once fork() returned: with two forks, the middle is gone
            generators.reseed(found)  # as the zygote does before each fork
            pid = forking.fork()
            if pid == 0:
                os.read(go_r, 1)
                fact = [random.getrandbits(64), threading.main_thread().native_id,
                        threading.get_native_id(), os.getpid(), os.getppid()]
                os.write(write_end, json.dumps(fact).encode())
                os._exit(7)
            os.close(write_end)
            os.write(go_w, b"g")
            seen.append([pid, json.loads(os.read(read_end, 4096))])
        os.write(report_w, json.dumps({"chosen": chosen, "children": seen}).encode())
        os._exit(0)
    os.close(report_w)
    report = json.loads(os.read(report_r, 65536))
    os.waitpid(zygote, 0)
    report["statuses"] = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                          for pid, _fact in report["children"]]
    report["supervisor"] = os.getpid()
    print(json.dumps(report))
    """
)


@pytest.mark.parametrize("how", ["plain", "twice"])
def test_a_copy_gets_a_new_random_stream_its_thread_s_name_and_the_zygote_s_parent(
    how: str,
) -> None:
    """The copy is the zygote's parent's child (the supervisor's, which reaps it: the
    zygote never learns how a call ended), with the plain clone and with two forks."""
    done = subprocess.run(
        [sys.executable, "-c", CHILDREN, how],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["chosen"] is (how == "plain")  # a fresh interpreter: one thread, known hooks
    assert report["statuses"] == [7, 7]  # reaped by the supervisor, not the zygote
    (first_pid, first), (second_pid, second) = report["children"]
    assert first[0] != second[0]  # each child has its own stream
    for pid, (_random, main_native_id, native_id, own_pid, parent) in (
        (first_pid, first),
        (second_pid, second),
    ):
        assert main_native_id == native_id == own_pid == pid
        assert parent == report["supervisor"]
