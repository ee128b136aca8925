"""The agent's pure parts without Docker: the wire rules, the bounded reset, the baseline."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retool_exec.backends.base import RunRequest
from retool_exec.backends.docker.agent import reset, trees, wire


@given(st.text(max_size=300))
def test_a_checked_path_never_leaves_the_working_directory(path: str) -> None:
    try:
        checked = wire.check_relative_path(path)
    except ValueError:
        return
    assert not checked.startswith("/")
    assert ".." not in checked.split("/")
    assert "" not in checked.split("/")
    assert os.path.normpath(os.path.join("/w", checked)).startswith("/w/")


@pytest.mark.parametrize(
    "bad",
    ["", "/etc/passwd", "../x", "a/../../x", "a\x00b", "a\nb", ".", "x" * 2000, "a/" + "b" * 300],
)
def test_bad_paths_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        wire.check_relative_path(bad)


def test_uploads_are_validated_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="both a file and a directory"):
        RunRequest(code="", timeout=1, files={"a": b"1", "a/b": b"2"})
    with pytest.raises(ValueError, match="at most"):
        RunRequest(code="", timeout=1, files={f"f{i}": b"" for i in range(wire.MAX_FILES + 1)})
    with pytest.raises(ValueError, match="either code or cells"):
        RunRequest(code="x", timeout=1, cells=("y",))
    request = RunRequest(code="", timeout=1, files={"./a//b": b"1"}, fetch=["x", "./x"])
    assert dict(request.files) == {"a/b": b"1"} and request.fetch == ("x",)


def test_frames_round_trip_and_refuse_garbage() -> None:
    message = {"type": "run", "code": "print('\udcff')", "n": 1}
    decoder = wire.FrameDecoder()
    frame = wire.encode_frame(message)
    assert decoder.feed(frame[:3]) == [] and decoder.feed(frame[3:]) == [message]
    with pytest.raises(wire.WireError):
        wire.FrameDecoder(max_frame=10).feed(b"\x00\x00\x01\x00")
    with pytest.raises(wire.WireError):
        wire.FrameDecoder().feed(b"\x00\x00\x00\x02[]")


def _deep_tree(root: Path, depth: int, name: str) -> None:
    fd = os.open(root, os.O_RDONLY)
    for index in range(depth):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
        if index % 250 == 0:
            os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)


def test_reset_empties_a_1500_deep_tree_of_long_names_without_recursion(tmp_path: Path) -> None:
    _deep_tree(tmp_path, 1500, "d" * 200)  # 300,000 characters of path: past PATH_MAX
    (tmp_path / "link").symlink_to("/etc")
    trees.empty_directory(str(tmp_path), time.monotonic() + 30)
    assert os.listdir(tmp_path) == []
    assert Path("/etc/hostname").exists() or Path("/etc").is_dir()  # the link was not followed


def test_removal_lists_each_directory_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each directory emptied below restarted its parent's listing: every directory was
    listed twice, the reset's and the local backend's removal doing twice the work they
    need (150 chains of 400 nested directories took minutes on a loaded host, the
    thirty-fourth red-team round). Counted, not timed: one listing a directory, chains
    moved up past ``MAX_DEPTH`` included, plus one of the root a pass."""
    for index in range(200):
        (tmp_path / f"d{index}").mkdir()
        (tmp_path / f"d{index}" / "f").touch()
    _deep_tree(tmp_path / "d0", 3 * trees.MAX_DEPTH, "c")
    directories = sum(len(dirs) for _, dirs, _ in os.walk(tmp_path))
    listings = 0
    real_scandir = os.scandir

    def counted(*args: Any) -> Any:
        nonlocal listings
        listings += 1
        return real_scandir(*args)

    monkeypatch.setattr(trees.os, "scandir", counted)
    trees.empty_directory(str(tmp_path), time.monotonic() + 60)
    assert os.listdir(tmp_path) == []
    assert listings <= directories + 10, (listings, directories)


def test_reset_gives_up_at_its_budget(tmp_path: Path) -> None:
    _deep_tree(tmp_path, 300, "d")
    with pytest.raises(trees.BudgetExceeded):
        trees.empty_directory(str(tmp_path), time.monotonic() - 1)


def test_reset_looks_at_the_clock_inside_one_flat_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flat directory of many names (millions of hard links to one inode, seventeenth
    red-team round) must not keep the removal going past its deadline: the clock is read
    every ``CHECK_EVERY`` entries, not only between directories."""
    for index in range(3000):
        (tmp_path / f"f{index}").touch()
    ticks = iter(range(1_000_000))
    monkeypatch.setattr(trees.time, "monotonic", lambda: float(next(ticks)))
    with pytest.raises(trees.BudgetExceeded):
        trees.empty_directory(str(tmp_path), 5.0)  # five looks at the clock
    assert len(os.listdir(tmp_path)) > 3000 - 6 * trees.CHECK_EVERY


def test_the_reset_names_a_directory_its_removal_left_not_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reset lists each scratch directory once: what the removal's last listing saw is
    what it reports (no second listing after it)."""
    scratch, queues = tmp_path / "tmp", tmp_path / "mqueue"
    scratch.mkdir()
    (scratch / "left").mkdir()
    (scratch / "left" / "file").touch()
    monkeypatch.setattr(wire, "SCRATCH_DIRS", (str(scratch), str(tmp_path / "absent")))
    monkeypatch.setattr(wire, "MQUEUE_DIR", str(queues))
    monkeypatch.setattr(reset, "remove_sysv_ipc", list)
    assert trees.empty_directory(str(scratch), time.monotonic() + 5) == []
    assert reset.clean(time.monotonic() + 5) == []
    (scratch / "stays").touch()
    monkeypatch.setattr(trees, "_one_pass", lambda root_fd, deadline: None)  # removes nothing
    assert trees.empty_directory(str(scratch), time.monotonic() + 5) == ["stays"]
    assert reset.clean(time.monotonic() + 5) == [f"{scratch} not empty"]


def test_a_kept_file_is_read_again_from_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``keep_open``: each read is the file as it is now, from its first byte; a kept
    descriptor that fails is dropped and the file opened as before."""
    monkeypatch.setattr(reset._Kept, "fds", {})
    counter, absent = tmp_path / "pids.current", tmp_path / "absent"
    counter.write_text("3\n")
    monkeypatch.setattr(reset, "TASK_COUNTERS", (str(absent), str(counter)))
    reset.keep_open([str(counter), str(absent)])
    assert list(reset._Kept.fds) == [str(counter)]
    assert reset.tasks_counted() == 3
    counter.write_text("12\n")  # the same file, rewritten in place
    assert reset.read_text(str(counter)) == "12\n"
    assert reset.tasks_counted() == 12
    os.close(reset._Kept.fds[str(counter)])  # a descriptor that no longer reads
    assert reset.read_text(str(counter)) == "12\n"
    assert reset._Kept.fds == {}
    counter.write_text("not a number")
    assert reset.tasks_counted() is None


def test_nothing_is_kept_open_under_a_low_descriptor_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container given few descriptors (``nofile``) keeps them for the removal of a deep
    tree: the agent started at 20 before descriptors were kept, and must still."""
    monkeypatch.setattr(reset._Kept, "fds", {})
    (tmp_path / "counter").write_text("3\n")
    monkeypatch.setattr(reset.resource, "getrlimit", lambda which: (64, 64))
    reset.keep_open([str(tmp_path / "counter")])
    assert reset._Kept.fds == {}


def test_an_entry_gone_during_the_removal_is_reported_not_taken_for_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = str(tmp_path)
    monkeypatch.setattr(wire, "SCRATCH_DIRS", (scratch,))
    monkeypatch.setattr(wire, "MQUEUE_DIR", str(tmp_path / "mqueue"))
    monkeypatch.setattr(reset, "remove_sysv_ipc", list)

    def vanished(root: str, deadline: float) -> list[str]:
        raise FileNotFoundError(2, "No such file or directory", f"{root}/entry")

    monkeypatch.setattr(reset, "empty_directory", vanished)
    queues = str(tmp_path / "mqueue")
    assert reset.clean(time.monotonic() + 5) == [
        f"{directory}: [Errno 2] No such file or directory: '{directory}/entry'"
        for directory in (scratch, queues)
    ]


def test_baseline_comparison_names_what_is_not_back() -> None:
    baseline: dict[str, object] = {
        "space:/tmp": (100 << 20, 1000),
        "space:/dev/shm": (64 << 20, 500),
        "net:tcp": 0,
        "net:unix": 2,
        "memory": ("cgroup1", 50 << 20),
        "fds": 8,
    }
    assert reset.compare(baseline, dict(baseline)) == []
    degraded = {
        **baseline,
        "space:/tmp": (60 << 20, 1000),
        "net:unix": 6,
        "net:tcp": 1,
        "memory": ("cgroup1", 250 << 20),
        "fds": 9,
    }
    problems = " ".join(reset.compare(baseline, degraded))
    for expected in ("/tmp", "unix", "tcp", "MiB of memory", "descriptor"):
        assert expected in problems
    within = {**baseline, "memory": ("cgroup1", (50 << 20) + reset.MEMORY_TOLERANCE)}
    assert reset.compare(baseline, within) == []


def test_tcp_connections_opened_count_where_closed_endpoints_are_not_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snmp = (
        "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
        "Tcp: RtoAlgorithm ActiveOpens PassiveOpens CurrEstab\nTcp: 1 5 3 0\n"
    )
    monkeypatch.setattr(reset, "read_text", lambda path: snmp)
    assert reset._tcp_opens() == 8
    monkeypatch.setattr(reset, "read_text", lambda path: "Tcp: ActiveOpens\n")
    assert reset._tcp_opens() is None  # a header without values: unreadable, not zero
    problems = reset.compare({"net:tcp opens": 8}, {"net:tcp opens": 9})
    assert problems[0].startswith("1 TCP connection(s) opened") and len(problems) == 1


def test_measure_reads_this_machine() -> None:
    facts = reset.measure()
    assert isinstance(facts["fds"], int) and facts["fds"] > 0
    assert isinstance(facts["net:unix"], int | None)


def test_the_supervisor_keeps_a_bounded_tail_and_counts_what_fell_off() -> None:
    from retool_exec.backends.docker.agent.supervisor import Tail

    tail = Tail(8)
    tail.feed("é".encode() * 10)  # 20 bytes, 10 characters
    assert tail.text() == "éééé" and tail.dropped == 6


def test_cell_records_from_the_child_are_bounded_and_typed() -> None:
    from retool_exec.backends.docker.agent.supervisor import _display, _errors

    caps = wire.text_caps({})  # the bounds; a request's text_cap only lowers them
    assert _display([{"text/plain": "x" * 100_000}, {"text/plain": "second"}], caps) == [
        {"text/plain": "[... truncated 34464 chars ...]\n" + "x" * 65536}
    ]
    marked = wire.cut_tail("y" * 100_000, 65536)  # as the child cut it: kept as it is
    assert _display([{"text/plain": marked}], caps) == [{"text/plain": marked}]
    assert _display("not a list", caps) == [] and _errors({"ename": 1}, caps) == []
    lines = [f"line {n}\n" for n in range(300)]
    [error] = _errors([{"ename": "E" * 1000, "evalue": 5, "traceback": lines}], caps)
    assert len(error["ename"]) == 200 and error["evalue"] == "5"
    assert error["traceback"] == lines[-203:]  # the newest: the exception's own line last
    [error] = _errors([{"evalue": "v" * 20_000 + "END"}], wire.text_caps({"text_cap": 10}))
    assert error["evalue"] == "[... truncated 19993 chars ...]\n" + "v" * 7 + "END"
    # Nested values (which str() cannot always render: recursion) become empty text.
    deep: object = "bottom"
    for _ in range(2000):
        deep = [deep]
    assert _display([{"text/plain": deep}], caps) == [{"text/plain": ""}]
    [error] = _errors([{"ename": deep, "evalue": {"a": deep}, "traceback": [deep]}], caps)
    assert error == {"ename": "", "evalue": "", "traceback": [""]}


def test_a_cells_last_expression_is_its_display_value() -> None:
    from retool_exec.backends.docker.agent.zygote import CodeHooks, _run_cell

    namespace: dict[str, object] = {}
    hooks = CodeHooks()
    assert _run_cell("x = 2\nx * 21", namespace, 0, hooks) == 42
    assert _run_cell("y = x", namespace, 1, hooks) is None and namespace["y"] == 2
    with pytest.raises(ZeroDivisionError):
        _run_cell("1/0", namespace, 2, hooks)


def test_the_network_setup_and_the_agents_settings_are_part_of_the_baseline() -> None:
    facts = reset.measure([os.getpid()])
    setup, settings = facts["network setup"], facts["agent settings"]
    assert isinstance(setup, tuple) and any(item[0] == "link" for item in setup)
    assert settings == (
        (os.getpid(), os.getpriority(os.PRIO_PROCESS, 0), tuple(sorted(os.sched_getaffinity(0)))),
    )
    moved = dict(facts, **{"agent settings": ((os.getpid(), 19, (0,)),)})
    assert reset.compare(facts, moved)[0].startswith("agent settings changed: new [")
    added = dict(facts, **{"network setup": (*setup, ("address", 1, 2, 32, 254, b"call"))})
    assert reset.compare(facts, added)[0].startswith("network setup changed: new [('address'")
    assert reset.compare(facts, dict(facts, **{"network setup": None})) == [
        "network setup changed: unreadable"
    ]
    assert reset.compare(facts, facts) == []


def test_the_neighbour_cache_and_its_times_are_part_of_the_baseline() -> None:
    """Entries no process holds, stamped with when they were made or confirmed: a new
    entry or a moved time is a change; the clock's own jitter is not."""
    entry = (2, 1, b"\0\0\0\0", 0x40, 0, 1)
    baseline = {"neighbours": ((*entry, (1000, 1000, 1000)),)}
    same = {"neighbours": ((*entry, (1000 + reset.NEIGHBOUR_TICK_TOLERANCE, 999, 1000)),)}
    assert reset.compare(baseline, same) == []
    stamped = {"neighbours": ((*entry, (1030, 1000, 1000)),)}
    assert reset.compare(baseline, stamped)[0].startswith("neighbour cache changed: the times")
    new = {
        "neighbours": (*baseline["neighbours"], (10, 1, b"\0" * 15 + b"\1", 0x40, 0, 1, (5,) * 3))
    }
    assert reset.compare(baseline, new)[0].startswith("neighbour cache changed: new entry")
    assert reset.compare(baseline, {"neighbours": ()})[0].startswith(
        "neighbour cache changed: entries gone"
    )
    assert reset.compare(baseline, {"neighbours": None}) == ["neighbour cache changed: unreadable"]
    assert reset.compare({"neighbours": None}, {"neighbours": None}) == []
    facts = reset.measure()
    assert facts["neighbours"] is None or isinstance(facts["neighbours"], tuple)


def test_measurements_after_the_baseline_open_no_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel frees a closed netlink socket an RCU grace period late, and counts it in
    ``sockets.used`` until then: a reset that opened its own kept finding sockets above
    the baseline and slept (a third of resets under load). One socket, kept, opens none."""
    reset.measure()
    opened: list[tuple[object, ...]] = []
    real = reset.socket.socket

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            opened.append(args)
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reset.socket, "socket", Counting)
    for _ in range(3):
        facts = reset.measure()
    assert opened == [] and isinstance(facts["network setup"], tuple)


def test_a_half_read_dump_cannot_answer_the_next() -> None:
    """A dump abandoned midway (a timeout) leaves replies queued on the kept socket: the
    next dump takes only its own sequence number's."""
    setup = reset.network_setup()
    assert setup is not None and reset._Netlink.sock is not None
    stale = struct.pack("=IHHII", 28, reset._RTM_GETNEIGH, reset._NETLINK_DUMP, 0, 0) + bytes(12)
    reset._Netlink.sock.send(stale)
    assert reset.network_setup() == setup
    assert reset.neighbours() is not None


def test_a_failed_dump_drops_the_socket_and_the_next_opens_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reset.network_setup()
    broken = reset._Netlink.sock
    assert broken is not None

    def fail(*args: object) -> object:
        raise OSError("netlink: no answer")

    monkeypatch.setattr(reset, "_dump_on", fail)
    assert reset.network_setup() is None and reset._Netlink.sock is None
    assert broken.fileno() == -1  # closed, not leaked
    monkeypatch.undo()
    assert reset.network_setup() is not None and reset._Netlink.sock is not None


def test_a_status_reaped_before_a_fork_of_that_pid_is_not_the_new_child_s() -> None:
    """A status left unclaimed (here, or planted through a process the call orphaned) is
    never taken by a later child that drew the same pid."""
    import socket

    from retool_exec.backends.docker.agent import supervisor, zygote

    class Server:
        control: socket.socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        supervisor.record_exit(4242, 0, 0.0)
        supervisor.record_exit(4243, 24, 3.0)
        theirs.send(b"P" + zygote.FORKED_PID.pack(4242))
        server = Server()
        server.control = ours
        assert supervisor.wait_for_fork(server) == 4242  # type: ignore[arg-type]
    assert 4242 not in supervisor.exits and 4243 in supervisor.exits
    supervisor.forget_unclaimed_exits()  # what the reset does once no call is left
    assert supervisor.exits == {} and supervisor.xcpu_seconds == {}


def test_the_supervisor_reaps_its_children_and_the_zygote_learns_nothing() -> None:
    """In a fresh interpreter: the supervisor keeps each watched child's status (and a
    SIGXCPU death's own CPU), and reaps any other child keeping nothing; the zygote reaps
    its own children (two forks' middles) and keeps nothing of how they ended."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os, resource, signal
        from retool_exec.backends.docker.agent import supervisor, zygote
        plain = os.fork()
        if plain == 0:
            os._exit(3)
        xcpu = os.fork()
        if xcpu == 0:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.kill(os.getpid(), signal.SIGXCPU)
        orphan = os.fork()  # one nobody watches: reaped, nothing of it kept
        if orphan == 0:
            os._exit(9)
        for pid in (plain, xcpu):
            supervisor.watch(pid)
        for pid in (plain, xcpu, orphan):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        supervisor.reap_children()
        assert supervisor.exits == {plain: 3 << 8, xcpu: signal.SIGXCPU}, supervisor.exits
        assert supervisor.xcpu_seconds == {xcpu: 0.0}, supervisor.xcpu_seconds
        assert supervisor.watched == set()
        try:
            os.waitpid(orphan, os.WNOHANG)
            raise AssertionError("the orphan was not reaped")
        except ChildProcessError:
            pass
        middle = os.fork()
        if middle == 0:
            os._exit(0)
        os.waitid(os.P_PID, middle, os.WEXITED | os.WNOWAIT)
        assert zygote._reap_quietly() is None
        try:
            os.waitpid(middle, os.WNOHANG)
        except ChildProcessError:
            print("reaped")
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout == "reaped\n", done


def test_a_tracing_stop_reaches_the_supervisor_s_wait_as_no_end() -> None:
    """A child that made its parent its tracer and signalled itself stops; the tracer's
    wait reports the stop unasked, and it read as the child's exit with the signal's
    number (finding 54). In a fresh interpreter: the stop is no end; the kill that
    follows is the one recorded."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import ctypes, os, signal, time
        from retool_exec.backends.docker.agent import supervisor
        child = os.fork()
        if child == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.ptrace(0, 0, None, None) != 0:  # PTRACE_TRACEME
                os._exit(70)
            os.kill(os.getpid(), signal.SIGUSR1)
            os._exit(3)
        supervisor.watch(child)
        give_up = time.monotonic() + 10
        while open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] != "t":
            assert time.monotonic() < give_up, "the child never reached a tracing stop"
            time.sleep(0.01)
        supervisor.reap_children()
        assert supervisor.exits == {}, supervisor.exits
        assert supervisor.reap(child) is None
        os.kill(child, signal.SIGKILL)
        os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)
        supervisor.reap_children()
        assert supervisor.exits == {child: signal.SIGKILL}, supervisor.exits
        print("ended")
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout == "ended\n", done


@pytest.mark.parametrize(
    "code",
    [
        "None",
        "0",
        "3",
        "-1",
        "256",
        "2**32 + 300",
        "2**40 + 7",
        "2**63 - 1",
        "2**63",
        "-(2**63)",
        "-(2**63) - 1",
        "-2**64",
        "True",
        "'a message'",
        "3.0",
        "Code(7)",
        "Unreadable(5)",
    ],
)
def test_the_zygote_s_exit_status_is_python3_s(code: str) -> None:
    """``zygote.exit_status`` against a real python3 exiting on the same SystemExit."""
    import subprocess
    import sys

    from retool_exec.backends.docker.agent import zygote

    classes = (
        "import sys\n"
        "class Code(int):\n"
        "    def __and__(self, other): return 0\n"
        "    def __index__(self): return 0\n"
        "class Unreadable(SystemExit):\n"
        "    @property\n"
        "    def code(self): raise ValueError('no code')\n"
    )
    namespace: dict[str, object] = {}
    exec(classes, namespace)
    value = eval(code, namespace)
    exc = value if isinstance(value, SystemExit) else SystemExit(value)
    raised = "raise " + code if code.startswith("Unreadable") else f"sys.exit({code})"
    real = subprocess.run(
        [sys.executable, "-c", classes + raised], check=False, capture_output=True
    )
    assert zygote.exit_status(exc) == real.returncode


@given(
    text=st.text(max_size=64),
    repeat=st.integers(min_value=1, max_value=400_000),
    lines=st.integers(min_value=1, max_value=60),
)
def test_a_cell_s_end_always_fits_the_events_pipe(text: str, repeat: int, lines: int) -> None:
    """Whatever a cell's error and display hold, its end is one frame the supervisor reads
    (over ``EVENT_FRAME_LIMIT`` it took the stream for broken and killed the session:
    twenty-eighth red-team round); a frame that fits is sent as it is."""
    from retool_exec.backends.docker.agent import zygote

    long = (text or "\U0001f600") * repeat
    event = {
        "type": "cell_end",
        "index": 3,
        "token": "ab" * 16,
        "display": [{"text/plain": long[: 1 << 16]}],
        "error": [{"ename": long[:5000], "evalue": long[:4096], "traceback": [long] * lines}],
    }
    frame = zygote.fitted_frame(event)
    assert len(frame) <= wire.FRAME_HEADER.size + wire.EVENT_FRAME_LIMIT
    [sent] = wire.FrameDecoder(max_frame=wire.EVENT_FRAME_LIMIT).feed(frame)
    assert (sent["type"], sent["index"], sent["token"]) == ("cell_end", 3, "ab" * 16)
    small = zygote._characters(event) <= wire.EVENT_FRAME_LIMIT  # (else no need to encode)
    if small and len(wire.encode_payload(event)) <= wire.EVENT_FRAME_LIMIT:
        assert sent == event
    else:
        assert sent["error"][0]["traceback"][0].endswith(" characters cut]")


CELL_CUT_SHORT_AT_ITS_END = """
import os, signal, sys
from retool_exec.backends.docker.agent import zygote
os.dup2(os.open(sys.argv[1], os.O_WRONLY), 3)  # the events pipe: where the cell's end goes
signal.signal(signal.SIGINT, signal.SIG_IGN)

def interrupted_as_it_began(cls):
    raise KeyboardInterrupt  # as the cell's interrupt raises at its first instruction
zygote.Interrupts.between_cells = classmethod(interrupted_as_it_began)
zygote._one_cell("x = 1", {}, 0, "token", zygote.CodeHooks(), caps=(100, 100))
os._exit(0 if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else 3)
"""


def test_a_cell_interrupted_at_its_end_leaves_sigint_ignored_for_the_next(
    tmp_path: Path,
) -> None:
    """``signal.signal`` handles a pending signal before it replaces the handler: a cell
    interrupted right at its end raised from ``between_cells`` with SIGINT still armed,
    and the next cell's interrupt, landing in the session's loop before that cell began,
    ended the session (status 70; once in a contract run under gVisor). The cell's end
    is sent with SIGINT ignored, the interrupt its error. Its own process: it sets
    SIGINT, and its stdout and stderr become /dev/null."""
    import subprocess
    import sys

    events = tmp_path / "events"
    events.touch()
    done = subprocess.run(
        [sys.executable, "-c", CELL_CUT_SHORT_AT_ITS_END, str(events)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert b'"ename":"KeyboardInterrupt"' in events.read_bytes()  # the cell's error
