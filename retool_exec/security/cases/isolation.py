"""Cross-call isolation: call N+1 sees nothing of call N, under both pool policies.

Each case is an attack call that leaves something behind and a follow-up
call that looks for it (and, on a backend where it is found, removes it, so
the audit leaves nothing on the host). The audit runs a ``reuse`` pool with a
single container, so the follow-up lands in the very container the attack
used: the strongest test of the reset between calls.
"""

from __future__ import annotations

from retool_exec.security.model import Case, CaseClass, Expect, Observation, Severity
from retool_exec.security.snippets import code

__all__ = ["CASES"]


def _absent(obs: Observation) -> bool:
    return obs.follow is not None and obs.follow.ok and obs.follow_facts()["present"] == []


def _state_fresh(obs: Observation) -> bool:
    return obs.follow is not None and obs.follow.ok and obs.follow_facts()["dirty"] == []


def _random_differs(obs: Observation) -> bool:
    first, second = obs.facts(), obs.follow_facts()
    return bool(first) and all(first[key] != second.get(key) for key in first)


_RANDOM = code("""
    import random, uuid
    facts = {"random": random.random(), "getrandbits": random.getrandbits(64),
             "urandom": os.urandom(8).hex(), "uuid4": str(uuid.uuid4())}
    try:
        import numpy
        facts["numpy legacy"] = float(numpy.random.rand())
        facts["numpy generator"] = float(numpy.random.default_rng().random())
    except ImportError:
        pass
    report(**facts)
""")


_EVERY_GENERATOR = code("""
    import gc, hashlib, pickle, random, _random
    for module in ("numpy", "sympy", "scipy", "mpmath"):  # what a zygote may preload
        try:
            __import__(module)
        except ImportError:
            pass
    kinds = [_random.Random]
    if "numpy" in sys.modules:
        numpy = sys.modules["numpy"]
        kinds += [numpy.random.RandomState, numpy.random.Generator, numpy.random.BitGenerator]
    kinds = tuple(kinds)
    gc.unfreeze()  # objects the zygote froze are not listed otherwise
    found = {id(obj): obj for obj in gc.get_objects() if isinstance(obj, kinds)}
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            if isinstance(value, kinds):
                found[id(value)] = value

    def state(obj):
        if isinstance(obj, _random.Random):
            return obj.getstate()
        if hasattr(obj, "get_state"):
            return obj.get_state()
        return getattr(obj, "bit_generator", obj).state

    fingerprints = {}
    for obj in found.values():
        if isinstance(obj, random.SystemRandom):
            continue
        digest = hashlib.sha256(pickle.dumps(state(obj))).hexdigest()[:16]
        fingerprints[digest] = type(obj).__module__ + "." + type(obj).__qualname__
    report(states=fingerprints)
""")


def _no_generator_state_shared(obs: Observation) -> bool:
    if obs.follow is None or not (obs.result.ok and obs.follow.ok):
        return False
    first, second = obs.facts()["states"], obs.follow_facts()["states"]
    return bool(first) and not set(first) & set(second)


_TIME_SECRET = [0x52, 0x45, 0x44, 0x54, 0x45, 0x41, 0x4D]  # "REDTEAM"
_TIME_TOOLS = """
    PLACES = ["/dev/shm", "/dev/null", "/dev/zero", "/dev/full", "/dev/random",
              "/dev/urandom", "/dev/tty", "/tmp"]

    COARSE = 5  # CLOCK_REALTIME_COARSE: the clock the kernel stamps inodes with

    def tick():
        seen, then = [], time.clock_gettime_ns(COARSE)
        while len(seen) < 6:
            now = time.clock_gettime_ns(COARSE)
            if now != then:
                seen.append(now - then)
                then = now
        return max(min(seen), 2_000_000)
"""
_TIME_SEND = code(
    _TIME_TOOLS
    + f"""
    secret = {_TIME_SECRET!r}
    grain = tick()
    os.utime(PLACES[0], None)
    origin = os.stat(PLACES[0]).st_mtime_ns
    for path, byte in zip(PLACES[1:], secret):
        for _ in range(50):
            while round((time.clock_gettime_ns(COARSE) - origin) / grain) % 256 != byte:
                time.sleep(grain / 4e9)
            os.utime(path, None)
            if round((os.stat(path).st_mtime_ns - origin) / grain) % 256 == byte:
                break
    report(sent=secret)
"""
)
_TIME_READ = code(
    _TIME_TOOLS
    + """
    grain = tick()
    origin = os.stat(PLACES[0]).st_mtime_ns
    report(read=[round((os.stat(p).st_mtime_ns - origin) / grain) % 256 for p in PLACES[1:]])
"""
)


def _times_not_read(obs: Observation) -> bool:
    return obs.follow is not None and obs.follow.ok and obs.follow_facts()["read"] != _TIME_SECRET


_RTNETLINK_TOOLS = """
    import socket, struct

    def rtnetlink(kind, flags, body):
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
            sock.send(struct.pack("=IHHII", 16 + len(body), kind, flags, 1, 0) + body)
            messages = []
            while True:
                data, offset = sock.recv(1 << 16), 0
                while offset + 16 <= len(data):
                    length, answer = struct.unpack_from("=IH", data, offset)
                    if answer == 2:  # NLMSG_ERROR (0: an acknowledgement)
                        return struct.unpack_from("=i", data, offset + 16)[0]
                    if answer == 3:  # NLMSG_DONE
                        return messages
                    messages.append(data[offset + 16 : offset + length])
                    offset += (length + 3) & ~3

    def loopback_addresses():
        try:
            return netlink_addresses()
        except PermissionError:  # no netlink for calls (runc): the kernel's own listings
            found = []
            with open("/proc/net/fib_trie") as handle:
                previous = ""
                for line in handle:
                    if "host LOCAL" in line and "|-- " in previous:
                        found.append(previous.split("|-- ")[1].strip())
                    previous = line
            with open("/proc/net/if_inet6") as handle:
                for line in handle:
                    raw = bytes.fromhex(line.split()[0])
                    found.append(socket.inet_ntop(socket.AF_INET6, raw))
            return sorted(set(found))

    def netlink_addresses():
        found = []
        for payload in rtnetlink(22, 0x301, bytes(8)):  # RTM_GETADDR, a dump
            family, offset = payload[0], 8
            while offset + 4 <= len(payload):
                length, kind = struct.unpack_from("=HH", payload, offset)
                if length < 4:
                    break
                if kind in (1, 2):  # IFA_ADDRESS, IFA_LOCAL
                    found.append(socket.inet_ntop(family, payload[offset + 4 : offset + length]))
                offset += (length + 3) & ~3
        return sorted(set(found))
"""
_NEIGHBOUR_TOOLS = """
    def neighbour_times():
        found = {}
        answer = rtnetlink(30, 0x301, bytes(12))  # RTM_GETNEIGH, a dump
        for payload in answer if isinstance(answer, list) else ():  # (an int: refused)
            family, offset, dst, times = payload[0], 12, None, None
            while offset + 4 <= len(payload):
                length, kind = struct.unpack_from("=HH", payload, offset)
                if length < 4:
                    break
                if kind == 1:  # NDA_DST
                    dst = socket.inet_ntop(family, payload[offset + 4 : offset + length])
                if kind == 3:  # NDA_CACHEINFO: ages (confirmed, used, updated) in 1/100 s
                    times = struct.unpack_from("=III", payload, offset + 4)
                offset += (length + 3) & ~3
            if dst is not None and times is not None:  # lo's IPv4 entry is keyed by no address
                found["ipv4" if family == socket.AF_INET else dst] = times
        return found
"""
_NEIGHBOUR_GAP = 0.3
"""Seconds between the attack's IPv4 and IPv6 neighbour stamps: what the follow-up looks for."""


def _no_neighbour_gap(obs: Observation) -> bool:
    if obs.follow is None or not obs.follow.ok:
        return False
    times = obs.follow_facts()["times"]
    ipv4, ipv6 = times.get("ipv4"), times.get("::1")
    if ipv4 is None or ipv6 is None:
        return True  # no entries at all (gVisor lists none): nothing carried
    gaps = [abs(a - b) / 100 for a, b in zip(ipv4, ipv6, strict=True)]
    return all(abs(gap - _NEIGHBOUR_GAP) > 0.08 for gap in gaps)


_PORT_TABLE_TOOLS = """
    import socket, struct
    PORT = 47011  # the table's slot is keyed by (127.0.0.1, 127.0.0.1, PORT) on any host

    def listener():
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", PORT))
        server.listen(64)
        return server

    def connect_once(server):
        client = socket.create_connection(("127.0.0.1", PORT), timeout=2)
        port = client.getsockname()[1]
        peer, _ = server.accept()
        for end in (client, peer):  # a reset, not TIME_WAIT: the port is free again
            end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            end.close()
        return port
"""
_PORT_TABLE_CONNECTS = 400
"""Connects the attack makes: each moves the shared slot by 2-16 (9 on average)."""


def _port_table_unread(obs: Observation) -> bool:
    """The neighbour, in another container, could not read the attack's connects."""
    if obs.neighbour is None or not obs.neighbour.ok:
        return False
    facts = obs.neighbour_facts()
    if "refused" in facts:
        return True  # no TCP socket at all: the table is out of reach
    steps, moved = facts["steps"], facts["moved"]
    if any(step > 64 for step in steps):
        return True  # ports do not follow a table here (gVisor picks them at random)
    # its own connect moves the slot by 2-16; the attack's, ~3600
    return bool(moved < _PORT_TABLE_CONNECTS)


_MARKED_ADDRESS = "127.83.69.67"
"""The address the attack adds (127.S.E.C); the follow-up looks for it."""


def _address_gone(obs: Observation) -> bool:
    return obs.follow is not None and obs.follow.ok and obs.follow_facts()["present"] is False


def _agents_untouched(obs: Observation) -> bool:
    if obs.follow is None or not obs.follow.ok:
        return False
    return not obs.follow_facts()["marked"]


def _times_all_reset(obs: Observation) -> bool:
    if obs.follow is None or not (obs.result.ok and obs.follow.ok):
        return False
    touched, seen = obs.facts()["touched"], obs.follow_facts()["seen"]
    return bool(touched) and all(seen.get(path) != when for path, when in touched.items())


_WRITABLE_NODES = """
    import stat

    def writable_nodes():
        \"\"\"Every world-writable device node and directory under /dev, at any depth.\"\"\"
        found = []
        for root, directories, names in os.walk("/dev"):
            directories[:] = [d for d in directories if f"{root}/{d}" != "/dev/shm"]
            for name in names + directories:
                path = f"{root}/{name}"
                try:
                    mode = os.lstat(path).st_mode
                except OSError:
                    continue
                if mode & stat.S_IWOTH and (stat.S_ISCHR(mode) or stat.S_ISDIR(mode)):
                    found.append(path)
        return sorted(found)
"""

DOCKER_INIT_LAYER = frozenset(
    {"/.dockerenv", "/etc/hostname", "/etc/hosts", "/etc/mtab", "/etc/resolv.conf"}
)
"""Files Docker writes into each container's own init layer when it creates it (its
``initlayer``; ``/dev``, ``/proc`` and ``/sys`` are mount points there)."""

_MOUNT_POINTS = """
    def mount_points():
        with open("/proc/self/mountinfo") as handle:
            return [line.split()[4] for line in handle]
"""

_THIS_CONTAINER = """
    def this_container(mounts):
        \"\"\"Which container this is (its /dev, its boot, its first process's start: two
        calls in one container agree) and the inodes it alone has: its /dev (a tmpfs of its
        own) and its ``mounts`` (Docker's files for /etc/hosts and the like among them).\"\"\"
        with open("/proc/stat") as handle:
            boot = [line.split()[1] for line in handle if line.startswith("btime")]
        with open("/proc/1/stat") as handle:
            first = handle.read().rsplit(")", 1)[1].split()[19]
        return {"id": [os.stat("/dev").st_dev, boot, first], "mounts": sorted(set(mounts))}
"""

_READABLE_PLACES = """
    def readable_places(mounts):
        \"\"\"What a call can read and the reset does not own, each with its access time as
        found (10 ms ticks): everything under /dev (at any depth, /dev/shm aside), each
        of ``mounts``' top directories, and the files of /etc. Found without reading any of
        them first: a directory's time is taken before it is listed, a link's is never
        followed.\"\"\"
        tops = [m for m in mounts if not m.startswith(("/proc", "/sys", "/tmp", "/dev/shm"))]
        found = {}
        def note(path):
            try:
                found.setdefault(path, os.lstat(path).st_atime_ns // 10**7)
            except OSError:
                pass
        for path in ["/dev", "/etc", *tops]:
            note(path)
        pending = ["/dev", "/etc"]
        while pending:
            directory = pending.pop()
            note(directory)
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                if entry.path == "/dev/shm" or entry.path in found:
                    continue
                note(entry.path)
                if directory.startswith("/dev") and entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
        return found
"""


def _read_times_kept(obs: Observation) -> bool:
    """Contained: no access time the next call sees falls within call N's reads.

    When the next call runs in another container (``fresh``: the pool may have started
    it while call N read), the times of the inodes that container alone has are its own
    set-up's (Docker makes its init layer as it creates it, runc its /dev and mount
    points as it starts it), so they are not counted; those it may share with call N's
    container (the image's files) are.
    """
    if obs.follow is None or not (obs.result.ok and obs.follow.ok):
        return False
    window, follow = obs.facts(), obs.follow_facts()
    if not window["read"]:
        raise ValueError("call N read nothing")
    start, end = window["start"] // 10**7, window["end"] // 10**7
    theirs = follow["container"]
    ticks = follow["ticks"]
    if theirs["id"] != window["container"]["id"]:
        own = set(theirs["mounts"]) | DOCKER_INIT_LAYER
        ticks = {
            path: tick
            for path, tick in ticks.items()
            if not (path == "/dev" or path.startswith("/dev/") or path in own)
        }
    return not [tick for tick in ticks.values() if start <= tick <= end]


_NETLINK_TOOLS = """
    import socket, struct

    def netlink(sock, family, command, attributes=b"", flags=0x301):
        body = struct.pack("BBH", command, 1, 0) + attributes
        sock.send(struct.pack("=IHHII", 16 + len(body), family, flags, 1, 0) + body)
        messages = []
        while True:
            data, offset = sock.recv(1 << 16), 0
            while offset < len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == 3:  # NLMSG_DONE
                    return messages
                if kind == 2:  # NLMSG_ERROR (0: an acknowledgement)
                    error = struct.unpack_from("=i", data, offset + 16)[0]
                    if error:
                        raise OSError(-error, os.strerror(-error))
                    return messages
                messages.append(data[offset + 20 : offset + length])
                offset += (length + 3) & ~3
            if not flags & 0x300:
                return messages

    def attributes(data):
        found, offset = {}, 0
        while offset + 4 <= len(data):
            length, kind = struct.unpack_from("HH", data, offset)
            if length < 4:
                break
            found.setdefault(kind & 0x3FFF, []).append(data[offset + 4 : offset + length])
            offset += (length + 3) & ~3
        return found

    def attribute(kind, value):
        return struct.pack("HH", 4 + len(value), kind) + value + b"\\0" * (-len(value) % 4)

    def tcp_metrics_addresses():
        \"\"\"The IPv4 addresses the kernel keeps TCP metrics for, in this network namespace.\"\"\"
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16) as sock:  # generic netlink
            reply = netlink(sock, 0x10, 3, attribute(2, b"tcp_metrics\\0"), flags=1)
            family = struct.unpack("H", attributes(reply[0])[1][0][:2])[0]
            return family, [socket.inet_ntoa(found[1][0])
                            for found in map(attributes, netlink(sock, family, 1)) if 1 in found]
"""
"""A call's own generic-netlink client: lists (and, with privilege, deletes) TCP metrics."""

_TIME_WAIT_PORTS = """
    PORTS = [42000 + int(TOKEN[2:9], 16) % 2000 * 8 + index for index in range(8)]
"""
"""Client ports of iso-tcp-time-wait-ports: chosen by the token, known to both calls."""

_TCP_METRICS_NET = "127.77"
"""The addresses the case's connections come from (all loopback: 127.0.0.0/8)."""


def _file_left_behind(case_id: str, directory: str, reference: str) -> Case:
    """Call N writes a file in ``directory``; call N+1 must not find it."""
    return Case(
        id=case_id,
        klass=CaseClass.ISOLATION,
        title=f"a file written in {directory} by call N is absent in call N+1",
        code=code(f"""
            with open(f"{directory}/{{TOKEN}}-file", "w") as handle:
                handle.write("left by call N")
            report(written=True)
        """),
        follow_up=code(f"""
            path = f"{directory}/{{TOKEN}}-file"
            present = [path] if os.path.lexists(path) else []
            for leftover in present:
                os.unlink(leftover)
            report(present=present)
        """),
        contained=_absent,
        severity=Severity.HIGH,
        reference=reference,
        catalogue=(41,),
    )


CASES: tuple[Case, ...] = (
    _file_left_behind(
        "iso-tmp-file",
        "/tmp",
        "the seed: files written by one call stay visible to the next",
    ),
    _file_left_behind(
        "iso-shm-file",
        "/dev/shm",
        "snekbox shared-memory tests; IPC namespace per container (CIS Docker 5.16)",
    ),
    Case(
        id="iso-sysv-ipc",
        klass=CaseClass.ISOLATION,
        title="a SysV shared-memory segment made by call N is absent in call N+1",
        code=code("""
            key = int(TOKEN[2:9], 16)
            shmid = libc.shmget(key, 4096, 0o1000 | 0o600)  # IPC_CREAT
            report(created=shmid >= 0, error=None if shmid >= 0 else last_error())
        """),
        follow_up=code("""
            key = int(TOKEN[2:9], 16)
            shmid = libc.shmget(key, 0, 0)
            present = [hex(key)] if shmid >= 0 else []
            if shmid >= 0:
                libc.shmctl(shmid, 0, None)  # IPC_RMID
            report(present=present)
        """),
        contained=_absent,
        severity=Severity.MEDIUM,
        reference="CIS Docker 5.16 (no host IPC namespace); SysV objects outlive processes",
        catalogue=(41,),
    ),
    Case(
        id="iso-posix-mqueue",
        klass=CaseClass.ISOLATION,
        title="a POSIX message queue made by call N is absent in call N+1",
        code=code("""
            librt.mq_open.restype = ctypes.c_int
            mqd = librt.mq_open(f"/{TOKEN}".encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
            report(created=mqd >= 0, error=None if mqd >= 0 else last_error())
        """),
        follow_up=code("""
            librt.mq_open.restype = ctypes.c_int
            name = f"/{TOKEN}".encode()
            mqd = librt.mq_open(name, os.O_RDWR)
            present = [name.decode()] if mqd >= 0 else []
            if mqd >= 0:
                librt.mq_unlink(name)
            report(present=present)
        """),
        contained=_absent,
        severity=Severity.MEDIUM,
        reference="POSIX message queues live in the IPC namespace, not in /tmp",
        catalogue=(41,),
    ),
    Case(
        id="iso-process-in-session",
        klass=CaseClass.ISOLATION,
        title="a child left running in the call's own session is gone in call N+1",
        code=code("""
            if os.fork() == 0:
                name_process()
                time.sleep(6)
                os._exit(0)
            report(left=True)
        """),
        follow_up=code("""
            report(present=[pid for pid, state in watch_named() if state != "Z"])
        """),
        contained=_absent,
        severity=Severity.HIGH,
        reference="codejail: one process tree per run; judge0 leftover processes",
        catalogue=(42,),
        local=Expect.CONTAINED,
    ),
    Case(
        id="iso-abstract-socket",
        klass=CaseClass.ISOLATION,
        title="a socket call N left listening is unreachable from call N+1",
        code=code("""
            import socket

            def serve(deadline):
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.bind("\\0" + TOKEN)
                server.listen()
                server.settimeout(0.2)
                while time.monotonic() < deadline:
                    try:
                        conn, _ = server.accept()
                        conn.sendall(b"left behind")
                        conn.close()
                    except OSError:
                        pass
            daemon(serve, 6)
            time.sleep(0.3)
            report(listening=True)
        """),
        follow_up=code("""
            import socket
            present = []
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(1)
                    sock.connect("\\0" + TOKEN)
                    present.append(sock.recv(64).decode())
            except OSError:
                pass
            report(present=present)
        """),
        contained=_absent,
        severity=Severity.HIGH,
        reference="covert channels between calls; codejail 'can't see other sandboxes'",
        catalogue=(42,),
    ),
    Case(
        id="iso-module-state",
        klass=CaseClass.ISOLATION,
        title="monkeypatched builtins, sys.modules and numpy globals are fresh in call N+1",
        code=code("""
            import builtins, random
            report(poisoning=True)
            try:
                import numpy
                numpy.pi = 3.0
                numpy.random.seed(0)
            except ImportError:
                pass
            os.environ["RETOOL_POISON"] = TOKEN
            sys.setrecursionlimit(77)
            sys.modules["json"] = None
            random.random = lambda: 0.5
            builtins.len = lambda obj: 42
            builtins.print = lambda *args, **kwargs: None
        """),
        follow_up=code("""
            import builtins, math, random
            dirty = []
            if builtins.print.__module__ != "builtins" or len([1, 2]) != 2:
                dirty.append("builtins")
            if not hasattr(sys.modules.get("json"), "dumps"):
                dirty.append("sys.modules")
            if random.random.__module__ == "__main__" or "lambda" in repr(random.random):
                dirty.append("random")
            if "RETOOL_POISON" in os.environ:
                dirty.append("os.environ")
            if sys.getrecursionlimit() == 77:
                dirty.append("recursion limit")
            try:
                import numpy
                if numpy.pi != math.pi:
                    dirty.append("numpy.pi")
            except ImportError:
                pass
            report(dirty=dirty)
        """),
        contained=_state_fresh,
        severity=Severity.MEDIUM,
        reference="the contract: every call is an independent, fresh interpreter",
        catalogue=(43,),
        local=Expect.CONTAINED,
    ),
    Case(
        id="iso-random-reseeded",
        klass=CaseClass.ISOLATION,
        title="random numbers differ between calls (a fork server must reseed)",
        code=_RANDOM,
        follow_up=_RANDOM,
        contained=_random_differs,
        severity=Severity.MEDIUM,
        reference="a fork server shares its RNG state ('From Zygote to Morula', IEEE S&P 2014)",
        catalogue=(44,),
        local=Expect.CONTAINED,
    ),
    Case(
        id="iso-random-every-generator",
        klass=CaseClass.ISOLATION,
        title="no random generator of any module starts call N+1 where it started call N",
        code=_EVERY_GENERATOR,
        follow_up=_EVERY_GENERATOR,
        contained=_no_generator_state_shared,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-03: sympy's own generators "
        "(sympy.core.random.rng, sympy.ntheory.ecm.rgen, ...) were made once in the zygote "
        "and never reseeded, so a call replayed the next call's sympy.crypto key",
        catalogue=(44,),
        local=Expect.CONTAINED,
        note="Every generator object in the interpreter, found by class in the collector's "
        "objects and in every module's namespace, as the call finds it before drawing "
        "anything: no state of call N may be a state of call N+1.",
    ),
    Case(
        id="iso-inode-times",
        klass=CaseClass.ISOLATION,
        title="bytes written into the times of /dev nodes, /tmp and /dev/shm do not reach the "
        "next call",
        code=_TIME_SEND,
        follow_up=_TIME_READ,
        contained=_times_not_read,
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-03: any writer may set an inode's "
        "times to now; touching each node when the clock showed a chosen value moved 7 bytes "
        "a call past the reset, which emptied /tmp but kept its times",
        timeout=30.0,
        local=Expect.HOST_DEPENDENT,
        note="The reset sets the times of every inode calls may write and it keeps "
        "(reset.kept_inodes) to its own now. Locally /tmp and /dev are the host's: any "
        "other process touching them between the two calls (a test run, a shell) erases "
        "the message, so the local outcome is not asserted.",
    ),
    Case(
        id="iso-loopback-addresses",
        klass=CaseClass.ISOLATION,
        title="an address a call adds to the container's loopback is not there for the next",
        code=code(
            _RTNETLINK_TOOLS
            + f"""
    import socket
    address = socket.inet_aton({_MARKED_ADDRESS!r})
    unshared = libc.unshare(0x10000000)  # CLONE_NEWUSER: gVisor then granted net admin
    attribute = struct.pack("=HH", 8, 2) + address  # IFA_LOCAL
    body = struct.pack("=BBBBI", socket.AF_INET, 32, 0, 0, 1) + attribute
    try:
        added = rtnetlink(20, 0x605, body)  # RTM_NEWADDR, REQUEST|ACK|CREATE|EXCL, on lo
    except OSError as exc:
        added = why(exc)
    report(unshared=unshared == 0 or last_error(), added=added)
"""
        ),
        follow_up=code(
            _RTNETLINK_TOOLS
            + f"""
    report(present={_MARKED_ADDRESS!r} in loopback_addresses())
"""
        ),
        contained=_address_gone,
        severity=Severity.HIGH,
        reference="retool_exec red-team round of 2026-12-03 (seventh): under gVisor a "
        "call's own user namespace held net admin over the container's network namespace; "
        "addresses it added to lo carried 47 bytes past the reset",
        local=Expect.HARMFUL,
        note="Not run locally: as root it would add an address to this host's loopback. "
        "The calls' filter refuses new namespaces, and the reset compares the container's "
        "interfaces and addresses with its baseline.",
    ),
    Case(
        id="iso-neighbour-times",
        klass=CaseClass.ISOLATION,
        title="the times in the loopback's neighbour cache carry nothing to the next call",
        code=code(
            _RTNETLINK_TOOLS
            + f"""
    import time
    stamps = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as own, socket.socket(
                family, socket.SOCK_DGRAM
            ) as udp:
                own.bind((host, 0))  # its own listener: nothing else is contacted
                udp.sendto(b"x", own.getsockname())  # makes the entry, unless it is there
                udp.sendto(b"", 0x810, own.getsockname())  # MSG_CONFIRM | MSG_PROBE: stamps it
            stamps.append(host)
        except OSError as exc:
            stamps.append(why(exc))
        time.sleep({_NEIGHBOUR_GAP})
    report(stamps=stamps)
"""
        ),
        follow_up=code(
            _RTNETLINK_TOOLS
            + _NEIGHBOUR_TOOLS
            + """
    try:
        times = neighbour_times()
    except OSError:
        times = {}
    report(times=times)
"""
        ),
        contained=_no_neighbour_gap,
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-04 (eighth): the entries the first "
        "packets to lo made, and their times, outlived the reset; their gap carried a byte",
        local=Expect.HOST_DEPENDENT,
        local_reason="a host whose loopback has sent before keeps its entries' old times",
        note="The agent makes the loopback's entries before its baseline, and the reset "
        "compares the cache, times included, with it; a call that stamps them retires its "
        "container. gVisor lists no neighbours.",
    ),
    Case(
        id="iso-tcp-port-table",
        klass=CaseClass.ISOLATION,
        title="TCP connects in one container do not move the source ports another one gets",
        code=code(
            _PORT_TABLE_TOOLS
            + f"""
    time.sleep(1.0)  # the neighbour reads at 0.5 s, and again at 2 s
    try:
        server = listener()
    except PermissionError as exc:
        report(refused=why(exc))
    else:
        for _ in range({_PORT_TABLE_CONNECTS}):
            connect_once(server)
        server.close()
        report(connects={_PORT_TABLE_CONNECTS})
"""
        ),
        neighbour=code(
            _PORT_TABLE_TOOLS
            + """
    def source_port():
        server = listener()
        try:
            return connect_once(server)
        finally:
            server.close()

    try:
        first, second, third = source_port(), source_port(), source_port()
    except PermissionError as exc:
        report(refused=why(exc))
    else:
        time.sleep(1.5)
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        span = high - low + 1

        def step(a, b):
            return min((b - a) % span, (a - b) % span)

        report(steps=[step(first, second), step(second, third)], moved=step(third, source_port()))
"""
        ),
        contained=_port_table_unread,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-04 (ninth): under runc a TCP "
        "connect's source port comes from a table the host kernel shares between network "
        "namespaces (inet_hash_connect); bytes moved exactly between fresh containers",
        note="Calls get no IP socket under runc unless DockerConfig(loopback_ip=True) "
        "(EACCES); gVisor keeps its own table.",
        timeout=6.0,
    ),
    Case(
        id="iso-agent-priorities",
        klass=CaseClass.ISOLATION,
        title="the nice values and CPUs of the agent's processes are not the calls' to set",
        code=code("""
    mine = os.getuid()
    agents = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid != mine:
                agents.append(int(entry))
        except OSError:
            pass
    done = {}
    for pid in agents:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, 13)
            done[pid] = "nice"
        except OSError as exc:
            done[pid] = why(exc)
        try:
            os.sched_setaffinity(pid, {max(os.sched_getaffinity(pid))})
        except OSError:
            pass
    report(agents=agents, done=done)
"""),
        follow_up=code("""
    mine, marked = os.getuid(), []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid != mine:
                if os.getpriority(os.PRIO_PROCESS, int(entry)) == 13:
                    marked.append(int(entry))
        except OSError:
            pass
    report(marked=marked, own_nice=os.getpriority(os.PRIO_PROCESS, 0))
"""),
        contained=_agents_untouched,
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-03 (seventh): gVisor checks no uid "
        "for setpriority and sched_setaffinity; a call reniced the supervisor and the "
        "zygotes, values the next calls read back and inherited",
        local=Expect.HARMFUL,
        note="Not run locally: as root it would renice this host's processes. The calls' "
        "filter refuses both on any process but the caller's own, and the reset compares "
        "the agent's nice values and CPUs with its baseline.",
    ),
    Case(
        id="iso-device-times-any-depth",
        klass=CaseClass.ISOLATION,
        title="the times of every device node a call may write, at any depth under /dev, "
        "are the reset's",
        code=code(
            _WRITABLE_NODES
            + """
    touched = {}
    for path in writable_nodes():
        try:
            os.utime(path, None)
            touched[path] = os.stat(path).st_mtime_ns
        except OSError:
            pass
    report(touched=touched)
"""
        ),
        follow_up=code(
            _WRITABLE_NODES
            + """
    seen = {}
    for path in writable_nodes():
        try:
            seen[path] = os.stat(path).st_mtime_ns
        except OSError:
            pass
    report(seen=seen)
"""
        ),
        contained=_times_all_reset,
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-03 (seventh): gVisor's /dev/net/tun "
        "(0666) is one level down, where the reset did not look; its times carried bits",
        local=Expect.HOST_DEPENDENT,
        note="Any exact time a call gave an inode, found again by the next call, is a "
        "channel; the reset walks /dev at any depth (reset.kept_inodes).",
    ),
    Case(
        id="iso-read-times",
        klass=CaseClass.ISOLATION,
        title="reading what the reset does not own (/dev, mount tops, /etc) leaves no time "
        "the next call can read",
        code=code(
            _MOUNT_POINTS
            + _READABLE_PLACES
            + _THIS_CONTAINER
            + """
    mounts = mount_points()
    time.sleep(0.05)  # the reads' window stands apart from the container's own times
    start, read = time.time_ns(), 0
    for path in readable_places(mounts):
        for look in (os.lstat, os.stat, os.listdir, os.readlink):
            try:
                look(path)
                read += 1
            except OSError:
                pass
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            continue
        try:
            os.read(fd, 1)
        except OSError:
            pass
        finally:
            os.close(fd)
    end = time.time_ns()
    time.sleep(0.05)  # ... and from the reset's
    report(start=start, end=end, read=read, container=this_container(mounts))
"""
        ),
        follow_up=code(
            _MOUNT_POINTS
            + _READABLE_PLACES
            + _THIS_CONTAINER
            + """
    recent = time.time_ns() // 10**7 - 60_000  # every time of the last 10 minutes

    def read_since_made(path):
        # A read stamps an access time after the inode's last change; an inode untouched
        # since it was made (an image built minutes ago: hundreds of /etc entries, whose
        # report the output cap cut to an unreadable tail) has them equal.
        try:
            info = os.lstat(path)
        except OSError:
            return True
        return info.st_atime_ns > info.st_ctime_ns

    mounts = mount_points()
    report(
        ticks={
            path: tick
            for path, tick in readable_places(mounts).items()
            if tick > recent and read_since_made(path)
        },
        container=this_container(mounts),
    )
"""
        ),
        contained=_read_times_kept,
        severity=Severity.LOW,
        reference="retool_exec red-team round of 2026-12-05 (eighteenth): Docker's /dev is "
        "strictatime, so a stat through /dev/stdin or a listing of /dev stamped those inodes "
        "with the reader's time: 48 bits a call under runc, 64 under gVisor",
        local=Expect.HOST_DEPENDENT,
        note="/dev is a tmpfs of the container's own with noatime, /dev/pts an empty "
        "read-only one (hardening.DEVICE_MOUNTS); the root is read-only.",
    ),
    Case(
        id="iso-reset-traps",
        klass=CaseClass.ISOLATION,
        title="symlinks to /, locked and deep directories, FIFOs and sockets are cleared safely",
        code=code("""
            import socket
            base = f"/tmp/{TOKEN}-traps"
            os.makedirs(base)
            os.symlink("/", f"{base}/root-link")
            os.symlink("/proc/1/root", f"{base}/agent-root")
            os.symlink(base, f"{base}/loop")
            os.makedirs(f"{base}/locked/inner")
            open(f"{base}/locked/inner/file", "w").close()
            os.chmod(f"{base}/locked/inner", 0)
            os.chmod(f"{base}/locked", 0)
            os.mkfifo(f"{base}/fifo")
            socket.socket(socket.AF_UNIX).bind(f"{base}/socket")
            open(f"{base}/name\\nwith\\nnewlines", "w").close()
            here = os.open(".", os.O_RDONLY)
            os.chdir(base)
            for _ in range(300):
                os.mkdir("d")
                os.chdir("d")
            os.fchdir(here)
            os.symlink(base, f"/dev/shm/{TOKEN}-link")
            report(planted=True)
        """),
        follow_up=code("""
            import shutil
            base, link = f"/tmp/{TOKEN}-traps", f"/dev/shm/{TOKEN}-link"
            present = [path for path in (base, link) if os.path.lexists(path)]
            if os.path.lexists(link):
                os.unlink(link)
            if os.path.isdir(base) and not os.path.islink(base):
                for root, dirs, _ in os.walk(base):
                    for name in dirs:
                        path = os.path.join(root, name)
                        if not os.path.islink(path):
                            os.chmod(path, 0o700)
                shutil.rmtree(base)
            report(present=present)
        """),
        contained=_absent,
        severity=Severity.HIGH,
        reference="CVE-2024-28185, CVE-2024-28189 (judge0: the host followed a sandbox symlink)",
        catalogue=(41,),
    ),
    Case(
        id="iso-zygote-of-the-last-call",
        klass=CaseClass.ISOLATION,
        title="which zygote call N's code wanted does not show in call N+1's interpreter",
        code=code("""
            try:
                import numpy  # named: in a reuse container this call forks from the full zygote
            except ImportError:
                pass
            report(named=True)
        """),
        follow_up=code("""
            name = "nu" + "mpy"  # not named: this call forks from the light zygote
            present = [name] if name in sys.modules else []
            report(present=present)
        """),
        contained=_absent,
        severity=Severity.LOW,
        reference="retool_exec's light zygote (2026-12-02): a first version let a light call "
        "take the full zygote's spare forked after call N, so numpy in sys.modules told call "
        "N+1 that call N's code named a preloaded module",
        catalogue=(41,),
        local=Expect.CONTAINED,
        note="The follow-up's code names no preloaded module and imports only the standard "
        "library: under reuse it must fork from the light zygote whatever call N wanted.",
    ),
    Case(
        id="iso-tcp-metrics",
        klass=CaseClass.ISOLATION,
        title="TCP metrics saved for addresses call N connected from do not reach call N+1",
        code=code(_NETLINK_TOOLS)
        + code(f"""
            LINGER_NONE = struct.pack("ii", 1, 0)

            def plant(address):
                # The passive closer saves metrics for its peer's address; then the active
                # closer's TIME_WAIT is ended (RFC 1337), so no socket is left to count.
                listener = socket.socket()
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("127.0.0.1", 0))
                listener.listen()
                port = listener.getsockname()[1]
                client = socket.socket()
                client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                client.bind((address, 0))
                client.connect(("127.0.0.1", port))
                client_port = client.getsockname()[1]
                server, _ = listener.accept()
                server.sendall(b"x" * 100)
                client.recv(100)
                client.sendall(b"y" * 100)
                server.recv(100)
                client.close()
                server.recv(10)
                server.close()
                time.sleep(0.02)
                listener.close()
                assassin_listener = socket.socket()
                assassin_listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                assassin_listener.bind((address, client_port))
                assassin_listener.listen()
                assassin = socket.socket()
                assassin.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                assassin.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_NONE)
                assassin.bind(("127.0.0.1", port))
                assassin.setblocking(False)
                assassin.connect_ex((address, client_port))
                time.sleep(0.02)
                assassin_listener.setblocking(False)
                try:
                    accepted, _ = assassin_listener.accept()
                    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_NONE)
                    accepted.close()
                except BlockingIOError:
                    pass
                assassin.close()
                assassin_listener.close()

            secret = TOKEN.encode()[:4]
            planted = []
            for index in range(2):
                address = f"{_TCP_METRICS_NET}.{{index}}.{{secret[index]}}"
                try:
                    plant(address)
                    planted.append(address)
                except OSError as exc:
                    planted.append(why(exc))
            try:
                seen = tcp_metrics_addresses()[1]
            except (OSError, KeyError, IndexError) as exc:
                seen = why(exc)
            report(planted=planted, seen_by_call_n=seen)
        """),
        follow_up=code(_NETLINK_TOOLS)
        + code(f"""
            try:
                family, seen = tcp_metrics_addresses()
            except (OSError, KeyError, IndexError) as exc:
                family, seen = None, []
            present = [address for address in seen if address.startswith("{_TCP_METRICS_NET}.")]
            for address in present:  # remove them where they were found (needs CAP_NET_ADMIN)
                try:
                    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16) as sock:
                        netlink(sock, family, 2, attribute(1, socket.inet_aton(address)), 5)
                except OSError:
                    pass
            report(present=present)
        """),
        contained=_absent,
        severity=Severity.MEDIUM,
        reference="the second red-team round (2026-12-02): the kernel keeps a closed "
        "connection's metrics per network namespace, keyed by an address the call chose, and "
        "an unprivileged netlink dump lists them; the reset did not see them",
        note="Under runc the container's sysctls turn the cache off (net.ipv4."
        "tcp_no_metrics_save); gVisor has no tcp_metrics netlink family. All addresses are "
        "loopback: the connections go to a listener the call opens on 127.0.0.1.",
    ),
    Case(
        id="iso-ip6-flowlabel",
        klass=CaseClass.ISOLATION,
        title="an IPv6 flow label call N leaves lingering (its destination chosen by the call) "
        "is not there in call N+1",
        code=code("""
            import hashlib, socket, struct
            destination = hashlib.md5(TOKEN.encode()).digest()  # 16 bytes of the call's choice
            request = destination + struct.pack(">I", 0x5A5A5) + struct.pack(
                "=BBHHHI", 0, 255, 1, 30, 30, 0)  # get, share with anyone, create; linger 30 s
            try:
                with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
                    sock.setsockopt(socket.IPPROTO_IPV6, 32, request)  # IPV6_FLOWLABEL_MGR
                made = True
            except OSError as exc:  # no IP here (runc, by default): EACCES
                made = why(exc)
            report(made=made)
        """),
        follow_up=code("""
            import hashlib
            marker = hashlib.md5(TOKEN.encode()).hexdigest()
            try:
                with open("/proc/net/ip6_flowlabel") as handle:
                    present = [line.split()[0] for line in handle if marker in line]
            except OSError:
                present = []
            report(present=present)
        """),
        contained=_absent,
        severity=Severity.MEDIUM,
        reference="the second red-team round (2026-12-02): a flow label outlives its socket "
        "for its linger time, listed with its destination in /proc/net/ip6_flowlabel",
        note="The reset counts the namespace's flow labels against its baseline: a container "
        "holding one more is retired, so call N+1 runs elsewhere. gVisor lists none.",
    ),
    Case(
        id="iso-tcp-time-wait-ports",
        klass=CaseClass.ISOLATION,
        title="client ports call N leaves in TIME_WAIT (a secret in which ports) are free "
        "in call N+1",
        code=code(_TIME_WAIT_PORTS)
        + code("""
            import socket
            try:
                listener = socket.socket()
            except PermissionError as exc:  # no IP here (runc, by default): no TIME_WAIT
                report(made=why(exc))
                sys.exit(0)
            listener.bind(("127.0.0.1", 0))
            listener.listen(16)
            made = []
            for port in PORTS:
                try:
                    with socket.socket() as client:
                        client.bind(("127.0.0.1", port))
                        client.connect(listener.getsockname())
                        server, _ = listener.accept()
                    server.close()  # the client closed first: its port is in TIME_WAIT
                    made.append(port)
                except OSError as exc:
                    made.append(why(exc))
            listener.close()
            report(made=made)
        """),
        follow_up=code(_TIME_WAIT_PORTS)
        + code("""
            import errno, socket
            present = []
            for port in PORTS:
                try:
                    probe = socket.socket()  # no SO_REUSEADDR: a TIME_WAIT port refuses
                except PermissionError:
                    break  # no IP here: nothing to find, nothing a server could miss
                with probe:
                    try:
                        probe.bind(("127.0.0.1", port))
                    except OSError as exc:
                        if exc.errno == errno.EADDRINUSE:
                            present.append(port)
            report(present=present)
        """),
        contained=_absent,
        severity=Severity.MEDIUM,
        reference="the sixth red-team round (2026-12-02): gVisor's /proc/net/tcp lists only "
        "endpoints that still have a file, so a closed connection's TIME_WAIT (60 s) passed "
        "the reset unseen, and call N+1 read a secret bit by bit from which ports it could "
        "not bind (or an ordinary server failed to bind its port)",
        note="Under runc the reset sees the endpoints in sockstat (TCP tw); under gVisor it "
        "counts the TCP connections opened (/proc/net/snmp). Either way the container is "
        "retired. The ports come from the token; the connections go to a listener the call "
        "opens on 127.0.0.1. Nothing can remove a TIME_WAIT endpoint: on a backend where "
        "it is found it expires by itself.",
    ),
)
