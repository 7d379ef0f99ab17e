"""Loopback ports of this machine that lead into a network namespace: how the launcher (in the
machine's own namespace) reaches the hosts cluster's JobManager and S3 server, which listen on a
project-made namespace's private address that this namespace has no route to.

    python scripts/netns_forward.py NETNS 127.0.0.1:8091=10.77.0.10:8081 [LISTEN=TARGET ...]

Every LISTEN socket is bound here, in the namespace this process starts in (loopback only); the
process then enters NETNS (setns(2), as root) before it opens any connection, so every TARGET is
reached from inside NETNS. Each accepted connection is piped to a new connection to its target,
both ways, until either side closes. Standard library only (scripts/cluster.sh runs it)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys

CLONE_NEWNET = 0x40000000


def enter_netns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name}")
    finally:
        os.close(fd)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()


def _handler(target: tuple[str, int]):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_writer = None
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*target), 10)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.close()

    return handle


async def serve(pairs: list[tuple[socket.socket, tuple[str, int]]]) -> None:
    servers = [await asyncio.start_server(_handler(target), sock=sock) for sock, target in pairs]
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    netns, specs = argv[0], argv[1:]
    pairs = []
    try:
        for spec in specs:
            listen, _, target = spec.partition("=")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(_split(listen))
            sock.listen(128)
            pairs.append((sock, _split(target)))
        enter_netns(netns)  # single-threaded still: the whole process moves; the listeners stay here
    except (OSError, ValueError) as e:
        print(f"netns_forward: {spec if len(pairs) < len(specs) else netns}: {e}", file=sys.stderr)
        return 1
    print(f"netns_forward: {' '.join(specs)} (into {netns})", file=sys.stderr, flush=True)
    asyncio.run(serve(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
