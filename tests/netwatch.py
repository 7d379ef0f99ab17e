"""What a process tree listens on: TCP sockets in LISTEN state, read from /proc (no tool needed),
each with the pid that holds it. For the tests that fail on a port open beyond loopback."""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from pathlib import Path

LISTEN = "0A"


def _listening_inodes() -> dict[str, str]:
    """inode -> "address:port" of every listening TCP socket in this network namespace."""
    found = {}
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[3] != LISTEN:
                continue
            hexaddr, hexport = parts[1].split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = ipaddress.ip_address(raw) if width == 8 else ipaddress.IPv6Address(raw)
            addr = getattr(addr, "ipv4_mapped", None) or addr  # a v6 socket bound to a v4 address
            found[parts[9]] = f"{addr}:{int(hexport, 16)}"
    return found


def _tree(root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree


def listening(pids: set[int]) -> set[str]:
    """"address:port" of every socket the processes ``pids`` listen on."""
    inodes = _listening_inodes()
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = target[8:-1]
                if inode in inodes:
                    found.add(inodes[inode])
    return found


def beyond_loopback(addresses: set[str]) -> set[str]:
    """The addresses that are not loopback (a wildcard among them)."""
    out = set()
    for a in addresses:
        if not ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback:
            out.add(a)
    return out


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return "?"


class Watch:
    """Samples what the trees under ``pid`` (a pid, or a function giving pids) listen on every
    ``every`` seconds until stopped: ``seen``, and ``by_name`` (address -> the command that held it)."""

    def __init__(self, pid, every: float = 0.1):
        self.pids = pid if callable(pid) else (lambda: [pid])
        self.every, self.seen, self.by_name = every, set(), {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for root in self.pids():
                for pid in _tree(root):
                    for addr in listening({pid}) - self.seen:
                        self.seen.add(addr)
                        self.by_name[addr] = _name(pid)
            time.sleep(self.every)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
