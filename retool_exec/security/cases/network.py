"""Network: the sandbox has no way to the host or anywhere else.

The rule for these probes: code that may run on the local backend really
runs on this host, so it only ever contacts listeners the audit itself
opened on the host's 127.0.0.1 (and an abstract unix socket it named), and
never any other address or real DNS name. That a
non-loopback destination is unreachable is shown without sending anything:
only ``lo`` exists and the routing tables are empty, so the kernel has
nowhere to send a packet. The one name looked up is
``retool-exec-probe.invalid``: ``.invalid`` is reserved (RFC 2606) and never
resolves.
"""

from __future__ import annotations

from retool_exec.security.model import Case, CaseClass, Expect, Observation, Severity
from retool_exec.security.snippets import code

__all__ = ["CASES"]


def _not_heard(obs: Observation, listener: str) -> bool:
    facts = obs.facts()
    return facts["reached"] is False and listener not in obs.ctx.host.heard(obs.ctx.token)


CASES: tuple[Case, ...] = (
    Case(
        id="net-host-tcp",
        klass=CaseClass.NETWORK,
        title="a TCP listener on the host's 127.0.0.1 is unreachable",
        code=code("""
            import socket
            try:
                with socket.create_connection(("127.0.0.1", __TCP_PORT__), timeout=2) as conn:
                    conn.sendall(TOKEN.encode() + b"\\n")
                reached, error = True, None
            except OSError as exc:
                reached, error = False, why(exc)
            report(reached=reached, error=error)
        """),
        contained=lambda obs: _not_heard(obs, "tcp"),
        severity=Severity.CRITICAL,
        reference="codejail network test; CIS Docker 5.9 (no host network namespace)",
        catalogue=(12,),
    ),
    Case(
        id="net-host-udp",
        klass=CaseClass.NETWORK,
        title="a UDP listener on the host's 127.0.0.1 receives nothing",
        code=code("""
            import socket
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                    for _ in range(3):
                        sock.sendto(TOKEN.encode(), ("127.0.0.1", __UDP_PORT__))
                        time.sleep(0.05)
                error = None
            except OSError as exc:
                error = why(exc)
            time.sleep(0.2)
            report(reached=False, error=error)  # only the host can tell whether it arrived
        """),
        contained=lambda obs: _not_heard(obs, "udp"),
        severity=Severity.HIGH,
        reference="CIS Docker 5.9 (no host network namespace); nsjail loopback-only network",
        catalogue=(12,),
    ),
    Case(
        id="net-host-abstract-unix",
        klass=CaseClass.NETWORK,
        title="an abstract unix socket the host listens on is unreachable",
        code=code("""
            import socket
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(2)
                    sock.connect("\\0__UNIX_NAME__")
                    sock.sendall(TOKEN.encode() + b"\\n")
                reached, error = True, None
            except OSError as exc:
                reached, error = False, why(exc)
            report(reached=reached, error=error)
        """),
        contained=lambda obs: _not_heard(obs, "unix"),
        severity=Severity.HIGH,
        reference="abstract unix sockets are per network namespace (unix(7)); CVE-2020-15257",
        catalogue=(12,),
    ),
    Case(
        id="net-no-routes",
        klass=CaseClass.NETWORK,
        title="no route leaves the sandbox (IPv4 table empty, IPv6 only loopback)",
        code=code("""
            v4 = [line.split()[0] for line in open("/proc/net/route").read().splitlines()[1:]
                  if line.strip()]
            try:
                v6 = [line.split()[-1] for line in open("/proc/net/ipv6_route")
                      if line.strip()]
            except OSError:
                v6 = []
            report(ipv4_routes=v4, ipv6_route_devices=sorted(set(v6)))
        """),
        contained=lambda obs: (
            obs.facts()["ipv4_routes"] == [] and set(obs.facts()["ipv6_route_devices"]) <= {"lo"}
        ),
        severity=Severity.CRITICAL,
        reference="CIS Docker 5.9; judge0/isolate loopback-only network (ENETUNREACH at once)",
        catalogue=(13,),
    ),
    Case(
        id="net-name-resolution",
        klass=CaseClass.NETWORK,
        title="name resolution fails fast and has no way to send a query",
        code=code("""
            import socket
            started = time.monotonic()
            try:
                socket.getaddrinfo("retool-exec-probe.invalid", 80)
                resolved = True
            except OSError:
                resolved = False
            elapsed = time.monotonic() - started
            try:
                local = sorted({info[4][0] for info in socket.getaddrinfo("localhost", 80)})
            except OSError:
                local = []
            routes = [line for line in open("/proc/net/route").read().splitlines()[1:]
                      if line.strip()]
            report(resolved=resolved, seconds=round(elapsed, 3), localhost=local,
                   ipv4_routes=len(routes), interfaces=sorted(os.listdir("/sys/class/net")))
        """),
        contained=lambda obs: (
            obs.facts()["resolved"] is False
            and obs.facts()["seconds"] < 1.0
            and obs.facts()["ipv4_routes"] == 0
            and obs.facts()["interfaces"] == ["lo"]
            and set(obs.facts()["localhost"]) <= {"127.0.0.1", "::1"}
        ),
        severity=Severity.HIGH,
        reference="DNS exfiltration from sandboxes; only the reserved .invalid name is looked up",
        catalogue=(14,),
    ),
    Case(
        id="net-no-resolver-address",
        klass=CaseClass.NETWORK,
        title="the name-service files name no address of the host's network (resolver, hosts)",
        code=code("""
            import ipaddress

            def addresses(path, keyword=None):
                found = []
                try:
                    lines = open(path).read().splitlines()
                except OSError:
                    return found
                for line in lines:
                    words = line.split("#")[0].split()
                    if keyword is not None:
                        words = words[1:2] if words[:1] == [keyword] else []
                    for word in words[:1]:
                        try:
                            found.append(ipaddress.ip_address(word.split("%")[0]))
                        except ValueError:
                            pass
                return found

            named = addresses("/etc/resolv.conf", "nameserver") + addresses("/etc/hosts")
            outside = {str(a) for a in named
                       if not (a.is_loopback or a.is_multicast or a.is_reserved)}
            report(outside=sorted(outside))
        """),
        contained=lambda obs: obs.facts()["outside"] == [],
        severity=Severity.LOW,
        reference="Docker copies the host's resolv.conf into containers (network none included)",
        catalogue=(14,),
    ),
    Case(
        id="net-interfaces",
        klass=CaseClass.NETWORK,
        title="only the loopback interface exists",
        code=code("""
            import socket
            try:
                by_netlink = sorted(name for _, name in socket.if_nameindex())
            except PermissionError:  # no netlink socket for calls (runc): nothing to list with
                by_netlink = None
            with open("/proc/net/dev") as handle:
                in_proc = sorted(line.split(":")[0].strip() for line in handle if ":" in line)
            report(sys_class_net=sorted(os.listdir("/sys/class/net")), proc_net_dev=in_proc,
                   if_nameindex=by_netlink)
        """),
        contained=lambda obs: (
            obs.facts()["sys_class_net"] == ["lo"]
            and obs.facts()["proc_net_dev"] == ["lo"]
            and obs.facts()["if_nameindex"] in (["lo"], None)
        ),
        severity=Severity.CRITICAL,
        reference="CIS Docker 5.9; epicbox network_disabled test",
        catalogue=(15,),
    ),
    Case(
        id="net-vsock-family",
        klass=CaseClass.NETWORK,
        title="AF_VSOCK, which no network namespace covers, cannot be used",
        code=code("""
            import socket
            try:
                vsock = socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK
                vsock.bind((0xFFFFFFFF, 0x5EC0FF0))  # VMADDR_CID_ANY: the host-wide port space
                made = "bound"
                vsock.close()
            except OSError as exc:
                made = why(exc)
            report(vsock=made)
        """),
        contained=lambda obs: obs.result.ok and obs.facts()["vsock"] != "bound",
        severity=Severity.HIGH,
        reference="retool_exec red-team round of 2026-12-03: under runc on Docker 20.10 two "
        "containers moved 32 bits a round through which vsock ports were bound, fresh included; "
        "moby's profile refuses AF_VSOCK only from Engine 23",
        local=Expect.HOST_DEPENDENT,
        note="vsock ports are one space per host (per VM), whatever the network namespace.",
    ),
    Case(
        id="net-socket-families",
        klass=CaseClass.NETWORK,
        title="only unix, inet, inet6 and netlink sockets can be made",
        code=code("""
            import socket
            made = []
            for family in range(64):
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW,
                             socket.SOCK_SEQPACKET):
                    try:
                        socket.socket(family, kind).close()
                    except OSError:
                        continue
                    made.append(family)
                    break
            report(families=made)
        """),
        contained=lambda obs: obs.result.ok and set(obs.facts()["families"]) <= {1, 2, 10, 16},
        severity=Severity.MEDIUM,
        reference="retool_exec red-team round of 2026-12-03 (AF_VSOCK); every address family "
        "beyond these is kernel surface no tool code needs",
        local=Expect.HOST_DEPENDENT,
        note="AF_UNIX 1, AF_INET 2, AF_INET6 10 (under runc only with DockerConfig("
        "loopback_ip=True)), AF_NETLINK 16 (the same).",
    ),
)
