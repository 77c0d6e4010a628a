"""What /proc says about processes and their TCP sockets (tests of what a run leaves
running and of where it listens)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import time
from collections.abc import Callable
from pathlib import Path

from runtime.host_cpu import descendants as descendants  # re-exported for the tests

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def alive(pid: int) -> bool:
    """Running (a zombie does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def address(hex_address: str) -> Address:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address.split(":")[0])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def is_loopback(ip: Address) -> bool:
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def tcp_sockets(pids: list[int]) -> list[tuple[str, Address, Address]]:
    """(state, local, remote) of every TCP socket the processes hold (state hex, as in
    /proc: 0A listening, 01 established)."""
    inodes = set().union(*(socket_inodes(p) for p in pids))
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                out.append((fields[3], address(fields[1]), address(fields[2])))
    return out


def off_loopback(pids: list[int]) -> list[tuple[str, Address, Address]]:
    """The sockets of these processes that are bound to, or talk to, a non-loopback
    address (none, for a run that keeps to 127.0.0.1)."""
    return [
        (state, local, remote)
        for state, local, remote in tcp_sockets(pids)
        if not is_loopback(local) or not (remote.is_unspecified or is_loopback(remote))
    ]
