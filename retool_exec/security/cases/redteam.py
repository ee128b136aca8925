"""An outside red team's round against the Docker backend: five attacks the corpus missed.

Each case sits in the class it attacks:

- data remanence (isolation): call N+1 looks through its own memory and
  Python objects for call N's code, stdin, uploaded file and output. A
  process that forks calls after handling earlier requests hands every call
  their bytes, live or freed;
- forged records (protocol): frame-, status- and record-shaped bytes written
  to every descriptor a call holds (and to the agent's attach stream) change
  neither the call's result nor the next call's;
- a reset that proves the baseline (isolation): objects kept alive only by
  descriptors in flight in unix sockets, and a directory tree too deep for a
  recursive cleaner, do not reach the next call;
- host-global per-uid limits (resources): inotify instances are counted per
  uid across the whole host, and ptys and POSIX queues draw on host-wide
  pools, so a call can neither use up a neighbouring container's share nor
  open them at all;
- agent starvation (resources): processes burning every CPU and thrashing
  memory at the limit do not delay the timeout's result.

Memory and ``/tmp`` sizes are read inside the sandbox (the cgroup's limit, or
gVisor's ``/proc/meminfo``), so the cases hold for any configured limits.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable

from retool_exec._models import Outcome
from retool_exec.security.model import (
    CallInputs,
    Case,
    CaseClass,
    Expect,
    Inconclusive,
    Observation,
    Severity,
)
from retool_exec.security.snippets import all_denied, code, on_time

__all__ = ["CASES"]

RED_TEAM = "the outside red team's round against the Docker backend"

# -- in-sandbox tools ------------------------------------------------------------

MEMORY_TOOLS = code('''
    import base64, gc, hashlib, re

    HEX = re.compile(rb"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")
    NONCE_FIELD = re.compile(rb'"nonce": ?"([0-9a-f]{32})"')


    def memory_chunks():
        """This process's own memory that data can have reached: every readable region
        except the code and constants of mapped files, 1 MB at a time (overlapping by 64
        bytes, so nothing is missed at a seam)."""
        with open("/proc/self/maps") as handle:
            regions = handle.read().splitlines()
        with open("/proc/self/mem", "rb", buffering=0) as mem:
            for line in regions:
                fields = line.split(maxsplit=5)
                low, high = (int(part, 16) for part in fields[0].split("-"))
                perms, name = fields[1], (fields[5] if len(fields) > 5 else "")
                if "r" not in perms or name.startswith("[v"):  # vdso, vvar, vsyscall
                    continue
                if "w" not in perms and name.startswith("/"):
                    continue
                address = low
                while address < high:
                    size = min(1 << 20, high - address)
                    try:
                        mem.seek(address)
                        data = mem.read(size)
                    except OSError:
                        break
                    yield data
                    address += size if address + size >= high else size - 64
''')

CONTAINER_TOOLS = code('''
    def memory_limit():
        """(limit, in use) of this container's memory in bytes: its cgroup's, or what
        /proc/meminfo shows (gVisor shows the container's limit as the machine's memory)."""
        with open("/proc/meminfo") as handle:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in handle}
        limit, used = info["MemTotal"], info["MemTotal"] - info["MemAvailable"]
        for limit_path, usage_path in (
            ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
             "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
        ):
            try:
                with open(limit_path) as limit_file, open(usage_path) as usage_file:
                    cgroup_limit, cgroup_used = int(limit_file.read()), int(usage_file.read())
            except (OSError, ValueError):
                continue
            if cgroup_limit < limit:
                limit, used = cgroup_limit, cgroup_used
            break
        return limit, used


    MB = 1 << 20


    def held():
        """What a call can leave held: listening TCP sockets (where there is IP) and unix
        sockets of this network namespace, shared memory
        (memfds, tmpfs) and the free space of /tmp, in MB."""
        inet = 0
        for path in ("/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6"):
            try:
                with open(path) as handle:
                    inet += sum(1 for line in handle.readlines()[1:]
                               if "udp" in path or line.split()[3] == "0A")
            except OSError:
                pass
        with open("/proc/net/unix") as handle:
            unix = len(handle.readlines()) - 1
        shmem = None
        for path, key in (("/sys/fs/cgroup/memory.stat", "shmem"),
                          ("/sys/fs/cgroup/memory/memory.stat", "shmem"),
                          ("/proc/meminfo", "Shmem:")):  # gVisor: the sandbox's own
            try:
                with open(path) as handle:
                    for line in handle:
                        if line.split()[0] == key:
                            shmem = int(line.split()[1]) * (1024 if key.endswith(":") else 1)
                break
            except (OSError, ValueError, IndexError):
                continue
        tmp = os.statvfs("/tmp")
        return {"inet": inet, "unix": unix, "shmem_mb": None if shmem is None else shmem // MB,
                "tmp_free_mb": tmp.f_bavail * tmp.f_frsize // MB}
''')

# -- 1. data remanence ---------------------------------------------------------------

CANARY_FILE = "canary.txt"

_PLANT = {
    "code": """
        SECRET = "C4NARY-__TOKEN__-code __NONCE_LIKE__"
        delivered.append("code")
    """,
    "stdin": """
        if sys.stdin.read().startswith("C4NARY-" + TOKEN + "-stdin "):
            delivered.append("stdin")
    """,
    "file": f"""
        try:
            with open("{CANARY_FILE}") as handle:
                if handle.read().startswith("C4NARY-" + TOKEN + "-file "):
                    delivered.append("file")
        except OSError:
            pass
    """,
    # Built at run time, so this call's code does not hold it: only its output does.
    # (The nonce-like value is CaseContext.nonce_like.)
    "stdout": """
        import hashlib
        print("C4NARY-" + TOKEN + "-std" + "out",
              hashlib.sha256(("nonce-like:" + TOKEN).encode()).hexdigest()[:32])
        delivered.append("stdout")
    """,
}
"""How call N carries its canary (and the run's nonce-like value) on each channel."""

_SCAN = MEMORY_TOOLS + code("""
    # The canary is never built here: only its prefix, and patterns that need more.
    PREFIX = ("C4NARY-" + TOKEN + "-").encode()
    CANARY = re.compile(re.escape(PREFIX) + rb"(code|stdin|file|stdout)")
    # stdin and files may travel base64-encoded; the canary opens both, so its encoded
    # form starts with the encoding of the prefix's first whole 3-byte groups.
    CUT = len(PREFIX) // 3 * 3
    ENCODED_HEAD = base64.b64encode(PREFIX[:CUT])
    ENCODED = re.compile(re.escape(ENCODED_HEAD) + rb"[A-Za-z0-9+/]{8}")
    CHANNELS = {b"code": "code", b"stdi": "stdin", b"file": "file", b"stdo": "stdout"}
    found, encoded, hexes, nonce_fields = {}, set(), set(), set()


    def look(data, place):
        for match in CANARY.finditer(data):
            found.setdefault(match.group(1).decode(), set()).add(place)
        for match in ENCODED.finditer(data):
            encoded.add((match.group(), place))


    started, scanned, error = time.monotonic(), 0, None
    try:
        for data in memory_chunks():
            scanned += len(data)
            look(data, "memory")
            for match in HEX.finditer(data):
                hexes.add(hashlib.sha256(match.group()).hexdigest()[:16])
            for match in NONCE_FIELD.finditer(data):
                nonce_fields.add(hashlib.sha256(match.group(1)).hexdigest()[:16])
    except OSError as exc:
        error = why(exc)

    # The same through Python's eyes: live objects, the frames above this code, modules.
    def strings(holder, depth):
        if isinstance(holder, dict):
            items = [*holder.keys(), *holder.values()]
        elif isinstance(holder, (list, tuple, set, frozenset)):
            items = list(holder)
        else:
            return
        for item in items:
            if isinstance(item, (str, bytes, bytearray)):
                yield item
            elif depth:
                yield from strings(item, depth - 1)


    gc.unfreeze()  # objects a fork server froze are live objects all the same
    holders = [("gc", holder, 0) for holder in gc.get_objects()]
    frame = sys._getframe()
    while frame is not None:
        holders.append(("frames", frame.f_locals, 2))
        frame = frame.f_back
    holders += [("modules", vars(module), 1) for module in list(sys.modules.values())
                if hasattr(module, "__dict__")]
    text_prefix, text_head, objects = PREFIX.decode(), ENCODED_HEAD.decode(), 0
    for place, holder, depth in holders:
        for item in strings(holder, depth):
            objects += 1
            if isinstance(item, str):
                if text_prefix in item or text_head in item:
                    look(item.encode("utf-8", "surrogatepass"), place)
            elif PREFIX in item or ENCODED_HEAD in item:
                look(bytes(item), place)
    del holders

    for blob, place in encoded:
        decoded = base64.b64decode(blob)
        channel = CHANNELS.get(decoded[len(PREFIX):len(PREFIX) + 4])
        if decoded[:len(PREFIX)] == PREFIX and channel:
            found.setdefault(channel, set()).add(place + " (base64)")
    report(found={channel: sorted(places) for channel, places in found.items()},
           nonce_like_found="__NONCE_LIKE_DIGEST__" in hexes, nonce_fields=len(nonce_fields),
           hex_strings=len(hexes), scanned_mb=round(scanned / (1 << 20), 1),
           python_strings=objects, seconds=round(time.monotonic() - started, 2), error=error)
""")


def _nothing_remains(planted: tuple[str, ...]) -> Callable[[Observation], bool]:
    """Contained: call N+1 found no canary, not the run's nonce-like value and no nonce field.
    Anything found is an exposure; nothing found counts only once call N has confirmed that
    every channel carried its canary (a backend that drops stdin or files cannot be judged)."""

    def contained(obs: Observation) -> bool:
        scan = obs.follow_facts()
        if scan["found"] or scan["nonce_like_found"] or scan["nonce_fields"]:
            return False
        if scan["error"] or not scan["scanned_mb"]:
            raise ValueError(f"the follow-up could not read its own memory: {scan['error']}")
        missing = sorted(set(planted) - set(obs.facts()["delivered"]))
        if missing:
            raise ValueError(f"call N never received its canary by {', '.join(missing)}")
        return True

    return contained


def _remanence(case_id: str, channels: tuple[str, ...], title: str) -> Case:
    plant = "delivered = []\n" + "".join(code(_PLANT[channel]) for channel in channels)
    return Case(
        id=case_id,
        klass=CaseClass.ISOLATION,
        title=title,
        code=plant + "report(delivered=delivered)\n",
        inputs=CallInputs(
            stdin="C4NARY-__TOKEN__-stdin __NONCE_LIKE__\n" if "stdin" in channels else None,
            files=(
                {CANARY_FILE: "C4NARY-__TOKEN__-file __NONCE_LIKE__\n"}
                if "file" in channels
                else {}
            ),
        ),
        follow_up=_SCAN,
        contained=_nothing_remains(channels),
        severity=Severity.HIGH,
        reference="fork-server remanence ('From Zygote to Morula', IEEE S&P 2014); " + RED_TEAM,
        local=Expect.CONTAINED,  # a fresh interpreter per call
        note="the follow-up reads its own memory (/proc/self/mem: anonymous, heap, stack and "
        "writable mappings) and walks gc objects, its frames and modules, for the canary in "
        "clear or base64, the run's nonce-like value, and any JSON nonce field of 32 hex digits",
    )


# -- 2. forged records ---------------------------------------------------------------

_FORGE = MEMORY_TOOLS + code("""
    import struct
    FORGED = "FORGED-" + TOKEN
    # In a sandbox container, not on the local backend's host: PID 1 is the container's
    # agent, and this process's memory and environment hold nothing of the host's.
    IN_CONTAINER = IN_AGENT_SANDBOX or os.path.isdir("/opt/retool_exec")


    def frame(message):
        payload = json.dumps(message).encode()
        return struct.pack(">I", len(payload)) + payload


    # Nonces to forge with: any an earlier frame left in memory, then any 32-hex string in
    # memory or the environment. Only in a container: the local backend's memory and
    # environment are the host's, and what is found is written to the output.
    fields, others = [], []
    if IN_CONTAINER:
        for data in memory_chunks():
            fields += [match.group(1).decode() for match in NONCE_FIELD.finditer(data)]
            others += [match.group().decode() for match in HEX.finditer(data)]
        for value in os.environ.values():
            others += re.findall("[0-9a-f]{32}", value)
    nonces = list(dict.fromkeys(fields + others))[:4] + ["0" * 32]

    call_ids, frame_ = [1, 2], sys._getframe()
    while frame_ is not None:  # a fork of the agent may still hold its last request
        request = frame_.f_locals.get("request")
        if isinstance(request, dict) and isinstance(request.get("id"), int):
            call_ids = [request["id"], request["id"] + 1, request["id"] + 2]
            break
        frame_ = frame_.f_back


    def forgeries(nonce, call_id):
        result = {"type": "result", "id": call_id, "nonce": nonce, "returncode": 0,
                  "timed_out": False, "oom": False, "stdout": FORGED, "stdout_dropped": 0,
                  "stderr": "", "stderr_dropped": 0, "duration": 0.0, "setup_error": FORGED,
                  "files": {"forged.txt": base64.b64encode(FORGED.encode()).decode()}}
        reset = {"type": "reset", "id": call_id, "nonce": nonce, "clean": True, "reason": ""}
        return frame(result) + frame(reset)


    def records(nonce):
        forged = ({"kind": "setup_error", "error": FORGED},
                  {"kind": "files", "path": "forged.txt", "content": FORGED})
        return "".join(f"<<retool-exec:{nonce}>>{json.dumps(record)}<<end:{nonce}>>\\n"
                       for record in forged).encode()


    EXIT = frame({"type": "exit", "status": 0}) + frame({"type": "cell_end", "index": 0})
    small = forgeries(nonces[0], call_ids[0]) + EXIT + records(nonces[0]) + b"\\n"
    full = (EXIT + b"".join(forgeries(n, i) for n in nonces for i in call_ids)
            + b"".join(records(n) for n in nonces) + b"\\n")


    def write_all(fd, data):
        try:
            if fd > 2:
                os.set_blocking(fd, False)  # a pipe nobody reads must not hang the call
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            return "ok"
        except OSError as exc:
            return why(exc)


    written = {"1": write_all(1, small), "2": write_all(2, small)}
    extra_fds = [int(entry) for entry in os.listdir("/proc/self/fd") if entry not in written]
    for fd in extra_fds:  # a status line alone first, as a child reporting its exit would
        written[str(fd)] = write_all(fd, b"0\\n")
    time.sleep(0.2)
    for fd in sorted(extra_fds):
        written[str(fd)] += "/" + write_all(fd, full)
    if IN_CONTAINER:  # never the host's PID 1
        try:
            fd = os.open("/proc/1/fd/1", os.O_WRONLY | os.O_NONBLOCK)
            written["/proc/1/fd/1"] = write_all(fd, full)
            os.close(fd)
        except OSError as exc:
            written["/proc/1/fd/1"] = why(exc)
    as_read = hashlib.sha256(small.decode("utf-8", "replace").encode()).hexdigest()
    report(in_container=IN_CONTAINER, nonces=len(nonces) - 1, call_ids=call_ids,
           written=written, sha256=as_read)
    sys.exit(3)
""")


def _result_is_its_own(obs: Observation) -> bool:
    """Exit status 3 (an error), stdout and stderr exactly the bytes written to them, nothing
    else in the result, and the next call's output exactly its own."""
    result = obs.result
    if result.outcome is not Outcome.ERROR or result.returncode != 3:
        return False
    if result.files or result.fetch_errors or result.cells or result.detail:
        return False
    facts = obs.facts()
    if obs.ctx.backend != "local" and not facts["in_container"]:
        raise ValueError("the attack could not tell it runs in a container: the agent untried")
    before, _, _ = result.stdout[:-1].rpartition("\n")

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    return (
        digest(before + "\n") == facts["sha256"]
        and digest(result.stderr) == facts["sha256"]
        and obs.follow is not None
        and obs.follow.ok
        and obs.follow.stdout == json.dumps({"genuine": obs.ctx.token}) + "\n"
    )


# -- 3. a reset that proves the baseline -------------------------------------------

_IN_FLIGHT = CONTAINER_TOOLS + code("""
    import array, socket
    baseline = held()
    limit, used = memory_limit()
    chunk = b"m" * MB

    # Memory: 8 MB memfds (a file-size limit applies to them too), most of what is free.
    target, memfds, memfd_error = min(limit * 6 // 10, limit - used - 48 * MB), [], None
    try:
        while len(memfds) * 8 * MB < target:
            memfds.append(os.memfd_create(f"{TOKEN}-{len(memfds)}"))
            for _ in range(8):
                os.write(memfds[-1], chunk)
    except OSError as exc:
        memfd_error = why(exc)

    # /tmp: unlinked 4 MB files until it is full.
    tmp_files, tmp_error = [], None
    try:
        while len(tmp_files) < 4096:
            try:
                fd = os.open("/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)
            except OSError:  # no O_TMPFILE (gVisor): a named file, unlinked at once
                path = f"/tmp/{TOKEN}-{len(tmp_files)}"
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                os.unlink(path)
            tmp_files.append(fd)
            for _ in range(4):
                os.write(fd, chunk)
    except OSError as exc:
        tmp_error = why(exc)
    tmp = os.statvfs("/tmp")

    # A cycle: b_recv waits in a_recv's queue and a_recv in b_recv's. Once this call's
    # descriptors close, only the cycle holds the two sockets and all that rides with them,
    # until the kernel's collector of in-flight cycles gets to it.
    try:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
    except PermissionError:  # no IP here (runc, by default): a unix listener rides instead
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(f"\\0{TOKEN}-listener")
        listener.listen()
    a_send, a_recv = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b_send, b_recv = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)


    def in_flight(via, fds):
        for start in range(0, len(fds), 200):  # SCM_MAX_FD is 253 per message
            rights = array.array("i", fds[start:start + 200])
            via.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])


    in_flight(a_send, [b_recv.fileno(), listener.fileno(), *memfds, *tmp_files])
    in_flight(b_send, [a_recv.fileno()])
    report(baseline=baseline, during=held(), limit_mb=limit // MB, memfd_mb=8 * len(memfds),
           memfd_error=memfd_error, tmp_mb=(tmp.f_blocks - tmp.f_bavail) * tmp.f_frsize // MB,
           tmp_total_mb=tmp.f_blocks * tmp.f_frsize // MB, tmp_error=tmp_error)
""")

_BASELINE_CHECK = CONTAINER_TOOLS + code("""
    facts = held()  # first: before anything the kernel frees late has had more time
    limit, used = memory_limit()
    want = limit * 55 // 100
    try:
        block = bytearray(want)
        block[::4096] = b"z" * len(range(0, want, 4096))
        del block
        facts["allocated_mb"] = want // MB
    except MemoryError:
        facts["allocated_mb"] = 0
    tmp = os.statvfs("/tmp")
    facts["tmp_wanted_mb"] = tmp.f_blocks * tmp.f_frsize * 3 // 4 // MB
    written, paths, facts["tmp_error"] = 0, [], None
    try:
        while written < facts["tmp_wanted_mb"]:
            paths.append(f"/tmp/{TOKEN}-check{len(paths)}")
            with open(paths[-1], "wb") as handle:
                for _ in range(min(4, facts["tmp_wanted_mb"] - written)):
                    handle.write(b"z" * MB)
                    written += 1
    except OSError as exc:
        facts["tmp_error"] = why(exc)
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
    report(**facts, tmp_written_mb=written, limit_mb=limit // MB, used_mb=used // MB)
""")


SHMEM_SLACK_MB = 8
"""Shared memory the next call may find beyond the attack's starting point."""
IN_FLIGHT_SOCKETS = 5
"""Sockets the attack holds in flight: its listener (TCP, or unix where there is no IP)
and both ends of its two unix socket pairs."""


def _back_to_baseline(obs: Observation) -> bool:
    """The next call starts with no socket, shared memory or /tmp space the attack held (as
    the attack measured before it began), and gets 55% of the memory limit and 3/4 of /tmp.
    Judged only if the attack really held more than the rest of memory in flight."""
    attack = obs.facts()
    before, during = attack["baseline"], attack["during"]
    held = attack["memfd_mb"] * 100 >= attack["limit_mb"] * 45
    sockets = during["inet"] + during["unix"] - before["inet"] - before["unix"]
    if not held or sockets < IN_FLIGHT_SOCKETS:
        raise ValueError(f"the attack could not put enough in flight to judge: {attack}")
    if obs.follow is None or not obs.follow.ok:
        return False  # e.g. killed for memory the attack still held
    after = obs.follow_facts()
    shmem_back = before["shmem_mb"] is None or (
        after["shmem_mb"] <= before["shmem_mb"] + SHMEM_SLACK_MB
    )
    return bool(
        shmem_back
        and after["inet"] <= before["inet"]
        and after["unix"] <= before["unix"]
        and after["tmp_free_mb"] >= before["tmp_free_mb"]
        and after["allocated_mb"] > 0
        and after["tmp_written_mb"] >= after["tmp_wanted_mb"]
    )


DEPTH = 1500

_DEEP_TREE = code(f"""
    made = {{}}
    for top in ("/tmp", "/dev/shm"):
        os.chdir(top)
        os.mkdir(f"{{TOKEN}}-deep")
        os.chdir(f"{{TOKEN}}-deep")
        depth = 0
        try:
            while depth < {DEPTH}:  # far deeper than PATH_MAX or a recursion limit allows
                os.mkdir("d" * 200)
                os.chdir("d" * 200)
                depth += 1
        except OSError as exc:
            made[top + " error"] = why(exc)
        made[top] = depth
    os.chdir("/")
    report(**made)
""")

_TREE_GONE = code("""
    left = {top: sorted(os.listdir(top)) for top in ("/tmp", "/dev/shm")}
    for top, names in left.items():  # where the reset left a tree, remove it, bottom up
        for name in names:
            if name.startswith(TOKEN):
                os.chdir(top)
                path = [name]
                os.chdir(name)
                while os.listdir("."):
                    path.append(os.listdir(".")[0])
                    os.chdir(path[-1])
                for part in reversed(path):
                    os.chdir("..")
                    os.rmdir(part)
    os.chdir("/")
    report(left=left)
""")


def _tree_gone(obs: Observation) -> bool:
    made = obs.facts()
    if made.get("/tmp") != DEPTH or made.get("/dev/shm") != DEPTH:
        raise ValueError(f"the attack could not build its trees: {made}")
    if obs.follow is None or not obs.follow.ok:
        return False
    return bool(obs.follow_facts()["left"] == {"/tmp": [], "/dev/shm": []})


_DEEP_WORKDIR = code("""
    with open("out.txt", "w") as handle:
        handle.write("kept")
    for _ in range(3000):  # past Python's recursion limit and PATH_MAX
        os.mkdir("d")
        os.chdir("d")
    os.chmod(".", 0)
    print("a wrong answer")
    sys.exit(3)
""")


def _own_failure_kept(obs: Observation) -> bool:
    """The code's own exit status and its file, not an infrastructure failure."""
    result = obs.result
    return (
        result.outcome is Outcome.ERROR
        and result.returncode == 3
        and result.files == {"out.txt": b"kept"}
        and result.detail == ""
    )


# -- 4. host-global per-uid limits ---------------------------------------------------

_INOTIFY_HOLD = code("""
    libc.inotify_init1.restype = ctypes.c_int
    instances, error = [], None
    while len(instances) < 4096:
        fd = libc.inotify_init1(os.O_CLOEXEC)
        if fd < 0:
            error = last_error()
            break
        instances.append(fd)
    held = [time.time()]
    time.sleep(2.5)
    held.append(time.time())
    report(instances=len(instances), error=error, held=held)
""")

_INOTIFY_NEIGHBOUR = code("""
    libc.inotify_init1.restype = ctypes.c_int
    attempts, deadline = [], time.monotonic() + 1.5
    while time.monotonic() < deadline:
        fd = libc.inotify_init1(os.O_CLOEXEC)
        attempts.append([round(time.time(), 3), "ok" if fd >= 0 else last_error()])
        if fd >= 0:
            os.close(fd)
        time.sleep(0.1)
    report(attempts=attempts)
""")


def _neighbour_unaffected(obs: Observation) -> bool:
    """Every inotify_init1 of the neighbour succeeded; some ran while the attack held all
    it could (wall-clock times: containers share the host's clock)."""
    facts = obs.facts()
    if facts["instances"] == 0 and facts["error"] == "ENOSYS":
        return True  # calls can make no instance (the calls' filter): none held, none short
    start, end = facts["held"]
    attempts = obs.neighbour_facts()["attempts"]
    if any(outcome != "ok" for _, outcome in attempts):
        return False  # refused during the hold or after it: either way the attack reached it
    if not any(start <= at <= end for at, _ in attempts):
        raise Inconclusive("the neighbour's attempts did not overlap the attack's hold")
    return True


def _local_ptys() -> Expect:
    return Expect.EXPOSED if os.access("/dev/ptmx", os.R_OK | os.W_OK) else Expect.HOST_DEPENDENT


def _local_mqueue() -> Expect:
    writable = os.path.isdir("/dev/mqueue") and os.access("/dev/mqueue", os.W_OK)
    return Expect.EXPOSED if writable else Expect.CONTAINED


# -- 5. agent starvation -------------------------------------------------------------

_CHANGED_INTERPRETER = code("""
    import builtins, sys
    def trace(frame, event, arg):
        if event == "call":
            print("traced", frame.f_code.co_name)
            raise RuntimeError("a tracer that fails")
    print("ANSWER 42")
    builtins.vars = builtins.isinstance = None
    sys.settrace(trace)
""")
"""Prints its answer, then leaves a tracer that prints and raises, and two builtins broken."""

_FILL_SOCKET_BUFFERS = code("""
    import socket
    kept = []
    for _ in range(20):  # ~170 MiB held by gVisor's kernel, of the audit's 256
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for end in (a, b):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        b.setblocking(False)
        try:
            for _ in range(400):
                b.send(b"x" * 60000)
        except OSError:
            pass
        kept.append((a, b))
    report(pairs=len(kept))
""")
_NEED_128_MIB = code("""
    block = bytearray(128 << 20)
    for index in range(0, len(block), 4096):
        block[index] = 1
    report(allocated=True)
""")

_LOOK_UP_MISSING_NAMES = code("""
    import os, time
    began, rounds = time.monotonic(), 0
    while time.monotonic() - began < 6:  # each failed lookup is cached by the kernel
        for index in range(10000):
            try:
                os.stat(f"/usr/lib/absent-{rounds}-{index}-" + "x" * 40)
            except OSError:
                pass
        rounds += 1
    report(looked_up=rounds * 10000)
""")
_KERNEL_MEMORY_HELD = code("""
    try:  # cgroup v1 (v2 has no such file: the reset reads its slab keys instead)
        with open("/sys/fs/cgroup/memory/memory.kmem.usage_in_bytes") as usage:
            report(kernel_mib=int(usage.read()) >> 20)
    except OSError:
        report(kernel_mib=None)
""")

_STARVE = CONTAINER_TOOLS + code("""
    import mmap, threading
    limit, used = memory_limit()
    # As close to the limit as stays under it; under gVisor the sandbox's own kernel (its
    # heap, up to 32 MiB over its start before the host retires it) counts there too.
    gvisor = "gVisor" in open("/proc/version").read()
    size = max(16 * MB, limit - used - (128 if gvisor else 64) * MB)


    def burn():
        while True:
            pass


    def thrash():
        while True:
            try:
                block = mmap.mmap(-1, size)
                for offset in range(0, size, 4096):
                    block[offset] = 1
                block.close()
            except (MemoryError, OSError):
                time.sleep(0.01)


    children = {}


    def spawn(kind):
        pid = os.fork()
        if pid == 0:
            try:
                thrash() if kind == "thrash" else burn()
            finally:
                os._exit(0)
        children[pid] = kind


    for kind in ("thrash", "burn", "burn"):
        spawn(kind)
    for _ in range(2):
        threading.Thread(target=burn, daemon=True).start()
    while True:  # respawn whatever the OOM killer takes; never exit
        try:
            pid, _ = os.wait()
            spawn(children.pop(pid))
        except ChildProcessError:
            time.sleep(0.01)
""")


_ENDED_NAMED = code("""
    import hashlib, resource, signal
    # Built at run time from the token; the next call looks for it as /proc/PID/stat
    # shows it: "(name) STATE", which only a copy of the kernel's line can hold.
    name = "Q" + hashlib.sha256(("comm:" + TOKEN).encode()).hexdigest()[:14]
    ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
    with open("/proc/self/comm") as handle:
        named = handle.read().strip() == name
    report(named=named)
    sys.stdout.flush()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.kill(os.getpid(), signal.SIGXCPU)  # the end whose CPU time the agent reads
""")

_FIND_ENDED_NAME = MEMORY_TOOLS + code("""
    # Only the name's digest is held here, never its text: nothing of this code matches.
    wanted = hashlib.sha256(("comm:" + TOKEN).encode()).digest()[:7]
    STAT_LINE = re.compile(rb"\\((Q[0-9a-f]{14})\\) [RSDZTtXxKWPI]")
    found, names, scanned, error = 0, 0, 0, None
    try:
        for data in memory_chunks():
            scanned += len(data)
            for match in STAT_LINE.finditer(data):
                names += 1
                found += bytes.fromhex(match.group(1)[1:].decode()) == wanted
    except OSError as exc:
        error = why(exc)
    report(found=found, names=names, scanned_mb=round(scanned / (1 << 20), 1), error=error)
""")


def _ended_name_gone(obs: Observation) -> bool:
    """Contained: the next call's memory holds no stat line with the name call N gave
    itself before its SIGXCPU end (which must have happened, or nothing is shown)."""
    scan = obs.follow_facts()
    if scan["found"]:
        return False
    if scan["error"] or not scan["scanned_mb"]:
        raise ValueError(f"the follow-up could not read its own memory: {scan['error']}")
    if not obs.facts()["named"] or obs.result.returncode != -24:
        raise ValueError("call N did not name itself and end by SIGXCPU")
    return True


CASES: tuple[Case, ...] = (
    _remanence(
        "iso-remanence-all-channels",
        ("code", "stdin", "file", "stdout"),
        "call N+1's memory and objects hold nothing of call N's code, stdin, file or output",
    ),
    _remanence(
        "iso-remanence-stdin",
        ("stdin",),
        "call N+1's memory and objects hold nothing of call N's stdin",
    ),
    _remanence(
        "iso-remanence-file",
        ("file",),
        "call N+1's memory and objects hold nothing of a file uploaded for call N",
    ),
    _remanence(
        "iso-remanence-stdout",
        ("stdout",),
        "call N+1's memory and objects hold nothing of call N's output",
    ),
    Case(
        id="iso-how-a-call-ended",
        klass=CaseClass.ISOLATION,
        title="how a call ended (its status, its name, its CPU time) stays out of the memory "
        "later calls are forked from",
        code=_ENDED_NAMED,
        follow_up=_FIND_ENDED_NAME,
        contained=_ended_name_gone,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-05 (eighteenth): the zygote read a "
        "SIGXCPU death's /proc/PID/stat, the name the call chose included, and every later "
        "call of its container found that line in its own memory",
        local=Expect.CONTAINED,  # a fresh interpreter per call
        note="A call's process is the supervisor's child, not the zygote's: the supervisor "
        "reaps it and reads its status and CPU time, and it forks nothing after its start.",
    ),
    Case(
        id="proto-forged-records",
        klass=CaseClass.PROTOCOL,
        title="frames, statuses and records written to every descriptor change no result",
        code=_FORGE,
        follow_up=code("""
            report(genuine=TOKEN)
        """),
        contained=_result_is_its_own,
        severity=Severity.CRITICAL,
        reference="in-band signalling: a status pipe, an event pipe, stdout or the attach "
        "stream a call can write must carry no authority; " + RED_TEAM,
        local=Expect.CONTAINED,
        note="frames carry every nonce-looking value found in the call's memory and "
        "environment; the result must be exit status 3 with exactly the bytes written to "
        "stdout and stderr, no files, and the next call must print exactly its own line",
    ),
    Case(
        id="iso-reset-in-flight",
        klass=CaseClass.ISOLATION,
        title="memory, /tmp space and a listener held only by SCM_RIGHTS cycles are back "
        "for the next call",
        code=_IN_FLIGHT,
        follow_up=_BASELINE_CHECK,
        contained=_back_to_baseline,
        severity=Severity.HIGH,
        reference="unix(7) SCM_RIGHTS; the kernel collects in-flight cycles only later; "
        + RED_TEAM,
        exclusive=True,
        note="the kernel collects such a cycle asynchronously, soon after the last close; a "
        "reset that neither triggers the collection nor measures the container against its "
        "baseline hands the next call a container where it may not have happened yet. The "
        "follow-up measures first thing; against such a reset under runc it saw the leak in "
        "7 of 8 runs, under gVisor (which kills the whole container for memory) in 2 of 2",
        local=Expect.HARMFUL,
        local_reason="would fill this host's /tmp and hold most of its free memory",
    ),
    Case(
        id="iso-reset-deep-tree",
        klass=CaseClass.ISOLATION,
        title=f"{DEPTH}-deep trees of long names in /tmp and /dev/shm are gone for the next "
        "call, which runs normally",
        code=_DEEP_TREE,
        follow_up=_TREE_GONE,
        contained=_tree_gone,
        severity=Severity.MEDIUM,
        reference="recursive cleaners fail past PATH_MAX and the recursion limit; " + RED_TEAM,
        local=Expect.HARMFUL,
        local_reason="would leave a tree in this host's /tmp deeper than its cleanup removes",
    ),
    Case(
        id="proto-deep-working-directory",
        klass=CaseClass.PROTOCOL,
        title="a 3000-deep tree in the working directory leaves the call its own failure and "
        "its fetched file",
        code=_DEEP_WORKDIR,
        inputs=CallInputs(fetch=("out.txt",)),
        contained=_own_failure_kept,
        severity=Severity.MEDIUM,
        reference="the thirteenth red-team round (2026-12-04): the local backend's cleanup "
        "recursed (os.walk, shutil.rmtree) and raised RecursionError out of run_code, which "
        "the server answered as a sandbox error: a wrong answer made to look like our failure",
        local=Expect.CONTAINED,
        note="Contained: the call ends in its own error (exit status 3) with out.txt fetched; "
        "the tree is removed without recursion.",
    ),
    Case(
        id="res-inotify-neighbour",
        klass=CaseClass.RESOURCES,
        title="a call holding every inotify instance it can leaves another container's "
        "call able to create them",
        code=_INOTIFY_HOLD,
        neighbour=_INOTIFY_NEIGHBOUR,
        neighbour_delay=0.5,
        contained=_neighbour_unaffected,
        severity=Severity.MEDIUM,
        reference="inotify(7): max_user_instances is counted per uid across the host; " + RED_TEAM,
        exclusive=True,
        local=Expect.HARMFUL,
        local_reason="would use up the inotify instances of this host's user for every "
        "process running as it",
    ),
    Case(
        id="res-pty-master",
        klass=CaseClass.RESOURCES,
        title="no pty can be allocated (/dev/ptmx, /dev/pts/ptmx, openpty)",
        code=code("""
            attempts = {path: try_open(path, os.O_RDWR | os.O_NOCTTY)
                        for path in ("/dev/ptmx", "/dev/pts/ptmx")}
            try:
                master, slave = os.openpty()
                os.close(master)
                os.close(slave)
                attempts["openpty"] = "ok"
            except OSError as exc:
                attempts["openpty"] = why(exc)
            report(attempts=attempts)
        """),
        contained=lambda obs: all_denied(obs.facts()["attempts"].values()),
        severity=Severity.MEDIUM,
        reference="pty(7): kernel.pty.max is one pool for the whole host; " + RED_TEAM,
        local=_local_ptys,
    ),
    Case(
        id="res-mqueue-by-open",
        klass=CaseClass.RESOURCES,
        title="no POSIX queue can be created by opening a file under /dev/mqueue "
        "(mq_open refused or not)",
        code=code("""
            path = f"/dev/mqueue/{TOKEN}"
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
                os.unlink(path)
                attempt = "opened"
            except OSError as exc:
                attempt = why(exc)
            report(attempt=attempt)
        """),
        contained=lambda obs: all_denied([obs.facts()["attempt"]]),
        severity=Severity.MEDIUM,
        reference="mq_overview(7): the mqueue filesystem creates queues on open(); "
        "RLIMIT_MSGQUEUE bytes are counted per uid across the host; " + RED_TEAM,
        local=_local_mqueue,
    ),
    Case(
        id="out-end-in-a-changed-interpreter",
        klass=CaseClass.OUTPUT,
        title="an answer printed before the code left a tracer on and a builtin replaced is "
        "the call's result, a success, as python3's",
        code=_CHANGED_INTERPRETER,
        contained=lambda obs: (
            (obs.result.outcome, obs.result.stdout) == (Outcome.SUCCESS, "ANSWER 42\n")
        ),
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-06 (twenty-ninth): the end of a call "
        "is the agent's Python, run in the interpreter the code changed; a tracer saw its "
        "functions and, raising, or a builtin set to None, ended the call with status 70 "
        "and without its answer",
        raw=True,
        local=Expect.CONTAINED,
        note="The agent's end binds its builtins and functions when it is imported, and turns "
        "the code's trace and profile functions off but where python3 has them on "
        "(zygote.CodeHooks).",
    ),
    Case(
        id="res-gvisor-kernel-memory-kept",
        klass=CaseClass.RESOURCES,
        title="socket buffers a call filled and left do not hold the next call's memory",
        code=_FILL_SOCKET_BUFFERS,
        follow_up=_NEED_128_MIB,
        contained=lambda obs: (
            obs.follow is not None
            and obs.follow.outcome is Outcome.SUCCESS
            and obs.follow_facts().get("allocated") is True
        ),
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-06 (twenty-ninth): gVisor's kernel "
        "keeps the memory of a call's socket buffers after the call; the reset, reading the "
        "sandbox's own /proc/meminfo, called the container clean, and the next call that "
        "needed 300 MiB of 1 GiB was killed as oom (here: 128 MiB of the audit's 256)",
        timeout=20.0,
        exclusive=True,
        local=Expect.CONTAINED,
        note="Under gVisor the host reads the container's memory cgroup and retires a reused "
        "container its call left grown (backends/docker/host_cgroup.py).",
    ),
    Case(
        id="res-kernel-cache-kept",
        klass=CaseClass.RESOURCES,
        title="the kernel's cache of a call's failed lookups is not left charged to the "
        "next call's container",
        code=_LOOK_UP_MISSING_NAMES,
        follow_up=_KERNEL_MEMORY_HELD,
        contained=lambda obs: (
            obs.follow is not None
            and obs.follow.outcome is Outcome.SUCCESS
            and (obs.follow_facts().get("kernel_mib") or 0) < 64
        ),
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-07 (thirty-first): a million "
        "lookups of names that do not exist left 150-600 MiB of the kernel's cache charged to "
        "a runc container; the reset, counting what processes hold, called it clean, and the "
        "next call took seconds to get memory back (2 of 5 timed out)",
        timeout=20.0,
        exclusive=True,
        local=Expect.HARMFUL,
        local_reason="would fill this host's own cache of failed lookups",
        note="Under runc the reset counts the kernel memory charged to the container and "
        "retires one a call left grown (agent/reset.py, CGROUP_V1_KERNEL); under gVisor the "
        "cache is the sandbox kernel's, which the host watches (finding 69), and the follow-up "
        "reads no cgroup file (None: contained by its success).",
    ),
    Case(
        id="res-agent-starvation",
        klass=CaseClass.RESOURCES,
        title="CPU burners and memory thrash at the limit do not delay a 3 s timeout",
        code=_STARVE,
        contained=lambda obs: obs.result.outcome is Outcome.TIMEOUT and on_time(obs, grace=1.0),
        severity=Severity.HIGH,
        reference="CFS bandwidth throttling and reclaim under a cgroup's limits; " + RED_TEAM,
        timeout=3.0,
        exclusive=True,
        local=Expect.HARMFUL,
        note="thrash stays 64 MB under the limit (128 under gVisor, whose kernel's own heap "
        "counts there and grows with the calls before): under gVisor going over kills the "
        "whole container (an OOM result, on time), which would hide whether the agent kept up",
    ),
    Case(
        id="res-memory-mb-under-every-runtime",
        klass=CaseClass.RESOURCES,
        title="an allocation past the call's own memory_mb raises MemoryError in the code, "
        "under gVisor as under runc",
        code=code("""
            try:
                block = bytearray(100 << 20)
                block[::4096] = bytes(len(block) >> 12)
                report(allocated_mb=len(block) >> 20)
            except MemoryError:
                report(allocated_mb=0)
        """),
        inputs=CallInputs(memory_mb=48),
        contained=lambda obs: obs.facts() == {"allocated_mb": 0},
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-06 (thirtieth): gVisor applies "
        "RLIMIT_DATA to brk only, so a program over a server client's memory_limit_MB was "
        "scored a success",
        local=Expect.EXPOSED,
        note="The local backend sets no memory limit: the 100 MB are allocated on this host.",
    ),
    Case(
        id="proto-memory-mb-before-the-code",
        klass=CaseClass.PROTOCOL,
        title="code padded past a small memory_mb fails as its own call, not the sandbox's",
        code=lambda: "a, b = map(int, input().split())\nprint(a - b)\n#" + "x" * (15 << 20),
        raw=True,
        inputs=CallInputs(stdin="3 4\n" + "0" * (1 << 20), memory_mb=20),
        contained=lambda obs: (
            obs.result.outcome is not Outcome.SANDBOX_ERROR and obs.result.detail == ""
        ),
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-06 (thirtieth): the call's memory "
        "limit was set before its stdin was decoded, so code large enough to fill it made "
        "its own wrong answer a sandbox failure, which trainers drop",
        local=Expect.CONTAINED,
        note="python3 itself may fail such code with MemoryError (an error): what matters is "
        "that the outcome is the code's.",
    ),
)
