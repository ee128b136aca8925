"""The hardening function, checked without Docker: every setting, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retool_exec import DockerConfig
from retool_exec.backends.docker.hardening import (
    BASE_ENV,
    DOCKER_MASKED_PATHS,
    HOST_PROC_PATHS,
    PROC_VISIBLE,
    container_spec,
    host_proc_paths,
    host_sys_paths,
)

MIB = 1024 * 1024


def spec(**overrides: object):  # type: ignore[no-untyped-def]
    return container_spec(DockerConfig(**overrides), image="img:tag", labels={"k": "v"})


def test_network_is_none() -> None:
    s = spec()
    assert s.host_config["network_mode"] == "none"  # a namespace with loopback only
    # Our image: no Docker network hook, no hosts/resolv.conf mounted (the image has them).
    assert s.create["network_disabled"] is True
    assert "extra_hosts" not in s.host_config


def test_a_brought_image_gets_dockers_hosts_file_with_localhost() -> None:
    s = container_spec(
        DockerConfig(), image="img:tag", labels={}, send_agent=b"agent", image_path="/usr/bin"
    )
    assert s.host_config["network_mode"] == "none"
    assert s.create["network_disabled"] is False  # Docker then writes /etc/hosts
    assert s.host_config["extra_hosts"] == {"localhost": "127.0.0.1"}
    assert s.host_config["dns"] == ["127.0.0.1"]  # not the host's name server


def test_root_is_read_only_and_tmp_is_a_capped_tmpfs() -> None:
    s = spec(tmpfs_mb=32, tmpfs_inodes=1000)
    assert s.host_config["read_only"] is True
    options = s.host_config["tmpfs"]["/tmp"].split(",")
    assert {"nosuid", "nodev", "noexec"} <= set(options)
    assert f"size={32 * MIB}" in options
    assert "nr_inodes=1000" in options
    assert list(s.host_config["tmpfs"]) == ["/tmp", "/dev/shm", "/dev", "/dev/pts"]


def test_no_read_of_dev_leaves_a_time() -> None:
    """Docker's /dev is strictatime: a read stamped its entries with the reader's time,
    which the next call read back (eighteenth red-team round). Ours is noatime, and
    /dev/pts an empty read-only one."""
    mounts = spec().host_config["tmpfs"]
    assert "noatime" in mounts["/dev"].split(",") and "dev" in mounts["/dev"].split(",")
    assert {"ro", "noatime"} <= set(mounts["/dev/pts"].split(","))


def test_memory_equals_memswap_so_there_is_no_swap() -> None:
    s = spec(memory_mb=512)
    assert s.host_config["mem_limit"] == s.host_config["memswap_limit"] == 512 * MIB


def test_pids_and_cpus_are_limited() -> None:
    s = spec(pids=50, cpus=0.5)
    assert s.host_config["pids_limit"] == 50
    assert s.host_config["nano_cpus"] == 500_000_000


def test_ulimits_cap_files_file_size_and_core() -> None:
    ulimits = {
        u["Name"]: (u["Soft"], u["Hard"])
        for u in spec(nofile=100, fsize_mb=8).host_config["ulimits"]
    }
    assert ulimits == {"nofile": (100, 100), "fsize": (8 * MIB, 8 * MIB), "core": (0, 0)}


def test_no_capabilities_no_new_privileges_not_privileged() -> None:
    hc = spec().host_config
    assert hc["cap_drop"] == ["ALL"]
    # Only what the agent needs to set calls apart; the calls drop all of it.
    assert hc["cap_add"] == ["SETGID", "SETUID", "SETPCAP"]  # no KILL: calls die by uid
    assert hc["security_opt"] == ["no-new-privileges"]
    assert hc["privileged"] is False


def test_agent_starts_as_root_and_is_told_to_split_users() -> None:
    s = spec()
    assert s.create["user"] == "0:0"
    command = s.create["command"]
    assert command[:6] == [
        "--agent-user", "65533:65533",
        "--zygote-user", "65532:65532",
        "--sandbox-user", "65534:65534",
    ]  # fmt: skip
    assert s.create["hostname"] == "sandbox"


def test_pid1_is_the_agent_not_docker_init() -> None:
    s = spec()
    assert s.host_config["init"] is False
    assert s.create["entrypoint"][:4] == ["/usr/bin/python3", "-I", "-B", "-c"]
    assert "'/opt/retool_exec/agent.pyz'" in s.create["entrypoint"][4]


def test_private_ipc_small_shm_and_no_logs() -> None:
    hc = spec(shm_mb=8).host_config
    assert hc["ipc_mode"] == "private"
    assert hc["shm_size"] == 8 * MIB
    shm = hc["tmpfs"]["/dev/shm"].split(",")  # Docker's own /dev/shm has no inode cap
    assert {"nosuid", "nodev", "noexec", f"size={8 * MIB}", "nr_inodes=8192"} <= set(shm)
    assert hc["log_config"]["Type"] == "none"


def test_environment_comes_from_the_allowlist_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETOOL_CANARY_SECRET", "hunter2")
    env = spec(env={"MY_FLAG": "1"}).create["environment"]
    assert env == {**BASE_ENV, "MY_FLAG": "1"}
    assert "RETOOL_CANARY_SECRET" not in env


def test_labels_are_passed_and_stdin_is_open_without_tty() -> None:
    s = spec()
    assert s.create["labels"] == {"k": "v"}
    assert (s.create["stdin_open"], s.create["tty"]) == (True, False)


def test_runtime_only_when_asked() -> None:
    assert "runtime" not in spec().host_config
    assert spec(runtime="runsc").host_config["runtime"] == "runsc"


def _option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_preload_goes_to_the_agent_command() -> None:
    assert _option(spec(preload=("numpy", "sympy")).create["command"], "--preload") == (
        "numpy,sympy"
    )
    assert "--preload" not in spec(preload=()).create["command"]


def test_a_light_zygote_only_beside_preloaded_modules_in_a_many_call_container() -> None:
    assert _option(spec(policy="reuse").create["command"], "--light-zygote") == "yes"
    assert "--light-zygote" not in spec(policy="reuse", light_zygote=False).create["command"]
    assert "--light-zygote" not in spec(policy="reuse", preload=()).create["command"]
    assert "--light-zygote" not in spec(policy="fresh", preload=("numpy",)).create["command"]


def test_only_a_one_call_container_skips_the_huge_page_collapse() -> None:
    fresh = spec(policy="fresh", preload=("numpy",)).create["command"]
    assert fresh[fresh.index("--huge-pages") + 1] == "no" and "--preload" in fresh
    assert "--huge-pages" not in spec(policy="reuse").create["command"]


def test_ip_is_refused_under_runc_unless_asked_for_and_allowed_under_gvisor() -> None:
    """IP sockets under runc move figures every container on the host shares."""

    def refused(**overrides: object) -> bool:
        command = spec(**overrides).create["command"]
        return "--ip" in command and command[command.index("--ip") + 1] == "no"

    assert refused()
    assert not refused(loopback_ip=True)
    assert not refused(runtime="runsc")
    assert refused(runtime="runsc", loopback_ip=False)


FORBIDDEN_HOST_CONFIG = {
    "binds",
    "mounts",
    "volumes_from",
    "devices",
    "device_requests",
    "device_cgroup_rules",
    "pid_mode",
    "userns_mode",
    "uts_mode",
    "cgroupns",
    "links",
    "dns",
    "port_bindings",
    "publish_all_ports",
    "volume_driver",
}


@pytest.mark.parametrize(
    "overrides",
    [{}, {"policy": "fresh"}, {"runtime": "runsc"}, {"env": {"A": "b"}}, {"memory_mb": 4096}],
)
def test_nothing_dangerous_is_ever_written(overrides: dict[str, object]) -> None:
    s = spec(**overrides)
    assert not FORBIDDEN_HOST_CONFIG & set(s.host_config)
    # The only kernel settings written switch off per-namespace caches a call could fill.
    assert s.host_config["sysctls"] == {
        "net.ipv4.tcp_no_metrics_save": "1",
        "net.ipv4.tcp_fastopen": "0",
    }
    assert "extra_hosts" not in s.host_config  # no name mapping: the image's /etc/hosts
    assert not {"ALL", "SYS_ADMIN", "SYS_PTRACE", "NET_ADMIN"} & set(s.host_config["cap_add"])
    assert "volumes" not in s.create
    assert s.host_config["ipc_mode"] != "host"
    assert s.host_config["network_mode"] != "host"
    assert "docker.sock" not in repr(s)


def test_user_env_cannot_override_the_sandbox_env() -> None:
    with pytest.raises(ValueError, match="set by the sandbox"):
        DockerConfig(env={"PATH": "/evil"})
    with pytest.raises(ValueError, match="not a valid identifier"):
        DockerConfig(env={"A=B": "x"})


def test_reserved_labels_are_refused() -> None:
    with pytest.raises(ValueError, match="reserved"):
        DockerConfig(labels={"org.retool_exec.owner": "me"})


def test_gvisor_gets_pids_headroom_and_an_in_sandbox_nproc_limit() -> None:
    hc = spec(runtime="runsc", pids=64).host_config
    assert hc["pids_limit"] == 64 + 4096
    assert {"Name": "nproc", "Soft": 64, "Hard": 64} in hc["ulimits"]
    # Room for the Sentry's ~7 host tasks per live task: with pids=1024, 800 sleeping
    # processes killed it at 1024 + 4096 (the thirty-fourth round's review).
    assert spec(runtime="runsc", pids=1024).host_config["pids_limit"] == 1024 + 8 * 1024


def test_runc_gets_no_nproc_limit_because_it_would_count_the_whole_host() -> None:
    hc = spec(pids=64).host_config
    assert hc["pids_limit"] == 64
    assert all(u["Name"] != "nproc" for u in hc["ulimits"])


def test_each_container_gets_its_own_calls_and_agent_uids_recorded_in_a_label() -> None:
    from retool_exec.backends.docker.hardening import with_sandbox_uid

    base = spec()
    one = with_sandbox_uid(base, 250_001, "uid-label")
    command = one.create["command"]
    assert command[command.index("--sandbox-user") + 1] == "250001:250001"
    assert command[command.index("--agent-user") + 1] == "1250001:1250001"
    assert command[command.index("--zygote-user") + 1] == "2250001:2250001"
    assert one.create["labels"]["uid-label"] == "250001"
    assert base.create["command"] != command  # the shared spec is not changed
    with pytest.raises(ValueError):
        with_sandbox_uid(base, 65534, "uid-label")


def test_the_host_s_disk_counts_are_masked_generic_places_and_each_disk(
    tmp_path: Path,
) -> None:
    """``sync()`` moved the disk's counts exactly, in any container (eighteenth round):
    the generic places are masked, and each disk's own directory, wherever its bus puts
    it, through the ``/sys/devices`` entry it is under; this machine's disks too."""
    devices = tmp_path / "devices"
    disk = devices / "pci0000:00" / "virtio1" / "block" / "vda"
    nvme = devices / "pci0000:00" / "nvme" / "nvme0" / "nvme0n1"
    loop = devices / "virtual" / "block" / "loop0"
    for place in (disk / "vda1", nvme / "nvme0n1p1", loop, devices / "virtual" / "net" / "lo"):
        place.mkdir(parents=True)
    (devices / "system" / "cpu").mkdir(parents=True)
    hidden = host_sys_paths(str(tmp_path))
    for device in (disk, disk / "vda1", nvme, nvme / "nvme0n1p1", loop):
        assert _under_one_of("/sys/" + str(device.relative_to(tmp_path)), hidden), device
    assert not _under_one_of("/sys/devices/virtual/net/lo", hidden)
    masked = spec().host_config_fields["MaskedPaths"]
    assert {"/proc/sys/fs/quota", "/sys/block", "/sys/devices/virtual/block"} <= set(masked)
    blocks = Path("/sys/class/block")
    for name in sorted(os.listdir(blocks)) if blocks.is_dir() else ():
        assert _under_one_of(os.path.realpath(blocks / name), masked), name


def _under_one_of(path: str, masked: tuple[str, ...] | list[str]) -> bool:
    return any(path == top or path.startswith(top + "/") for top in masked)


def test_every_top_level_proc_entry_but_processes_and_the_reviewed_ones_is_masked(
    tmp_path: Path,
) -> None:
    """An entry a newer kernel adds is hidden until reviewed; processes, links (self,
    mounts, net) and the reviewed entries stay; the fixed list holds without a /proc."""
    (tmp_path / "1").mkdir()
    (tmp_path / "4242").mkdir()
    (tmp_path / "fs").mkdir()
    for name in ("cpuinfo", "stat", "interrupts", "brand-new-counter"):
        (tmp_path / name).write_text("0\n")
    (tmp_path / "self").symlink_to(tmp_path / "1")
    (tmp_path / "mounts").symlink_to(tmp_path / "1")
    found = host_proc_paths(str(tmp_path))
    assert {"/proc/fs", "/proc/interrupts", "/proc/brand-new-counter"} <= set(found)
    assert not {"/proc/1", "/proc/4242", "/proc/self", "/proc/mounts", "/proc/cpuinfo"} & set(found)
    assert set(host_proc_paths(str(tmp_path / "absent"))) == set(HOST_PROC_PATHS)
    assert not {f"/proc/{name}" for name in PROC_VISIBLE} & set(HOST_PROC_PATHS)
    masked = spec().host_config_fields["MaskedPaths"]
    assert set(host_proc_paths()) <= set(masked)
    assert len(masked) == len(set(masked))  # a path mounted over once


def test_sys_is_masked_but_for_the_cpus_the_memory_nodes_and_the_cgroup(tmp_path: Path) -> None:
    for directory in (
        "kernel/irq/24",
        "devices/system/cpu/cpu0/cache",
        "devices/system/cpu/cpu0/cpuidle",
        "devices/system/cpu/cpuidle",
        "devices/system/node/node0",
        "devices/system/clocksource",
        "devices/pci0000:00",
        "fs/cgroup",
        "fs/ext4",
        "brand-new",
    ):
        (tmp_path / directory).mkdir(parents=True)
    found = set(host_sys_paths(str(tmp_path)))
    assert {
        "/sys/kernel",
        "/sys/brand-new",
        "/sys/devices/pci0000:00",
        "/sys/devices/system/clocksource",
        "/sys/devices/system/cpu/cpu0/cpuidle",
        "/sys/devices/system/cpu/cpuidle",
        "/sys/fs/ext4",
    } <= found
    kept = {"/sys/devices", "/sys/devices/system", "/sys/devices/system/cpu", "/sys/fs/cgroup"}
    assert "/sys/class/net" not in found
    assert not {*kept, "/sys/devices/system/node", "/sys/devices/system/cpu/cpu0/cache"} & found
    assert set(host_sys_paths()) <= set(spec().host_config_fields["MaskedPaths"])


def test_docker_s_masked_paths_are_kept_and_the_host_s_file_counts_are_added() -> None:
    """A container's MaskedPaths replaces Docker's list: each default stays masked, and
    the host's open-file, inode and dentry counts (a channel between containers under
    runc) are masked too."""
    masked = spec().host_config_fields["MaskedPaths"]
    assert set(DOCKER_MASKED_PATHS) <= set(masked)
    assert {"/proc/kcore", "/proc/keys", "/sys/firmware", "/proc/sys/fs/file-nr"} <= set(masked)
    assert spec(runtime="runsc").host_config_fields == spec().host_config_fields


def test_the_calls_the_supervisor_and_the_zygotes_uids_never_meet_across_containers() -> None:
    """Each container's three uids come from three disjoint ranges, so no uid of one
    container is any uid of another live one (findings 38, 39), and the benchmarks
    can tell the agent's processes apart by uid."""
    from retool_exec.backends.docker.agent import wire
    from retool_exec.backends.docker.hardening import agent_role

    low, high = wire.SANDBOX_UID_RANGE
    edges = (low, low + 1, high - 1, high)
    supervisors = {int(wire.agent_users(uid)[0].partition(":")[0]) for uid in edges}
    zygotes = {int(wire.agent_users(uid)[1].partition(":")[0]) for uid in edges}
    assert max(edges) < min(supervisors) and max(supervisors) < min(zygotes)
    assert {agent_role(uid) for uid in supervisors} == {"supervisor"}
    assert {agent_role(uid) for uid in zygotes} == {"zygote"}
    assert {agent_role(uid) for uid in edges} == {None}
    assert (agent_role(65533), agent_role(65532), agent_role(65534)) == (
        "supervisor",
        "zygote",
        None,
    )
