"""The listening socket, bound before the model loads: a port already in use is reported in a
second, not after the weights are read. The HTTP server (server/http_server.py) takes the bound
socket by its descriptor."""
from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass

from prelude.contract.config import Config


@dataclass(frozen=True, slots=True)
class Listener:
    fd: int  # bound, not yet listening: connections are refused until the HTTP server listens
    url: str  # what the banner shows: http://host:port, or unix:PATH
    uds: str | None = None  # the socket file to remove on exit
    port: int | None = None  # the TCP port bound (the kernel's pick when asked for port 0)
    uds_file: tuple[int, int] | None = None  # the socket file's (device, inode), to know it is still ours

    def close(self) -> None:
        """Gives the socket up before the HTTP server took it (startup failed after binding)."""
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.cleanup()

    def cleanup(self) -> None:
        """Removes the Unix socket file (the HTTP server closes the socket itself), if it is still
        the one this server bound: a server started at the path since (after a script removed
        ours) lost its socket to our exit and was unreachable from then on."""
        if self.uds is not None:
            try:
                found = os.stat(self.uds)
                if (found.st_dev, found.st_ino) == self.uds_file:
                    os.unlink(self.uds)
            except OSError:
                pass


def bind(config: Config) -> Listener:
    """A socket bound to --uds or --host/--port. Raises OSError (EADDRINUSE, EACCES, ...)."""
    if config.uds is not None:
        return _bind_unix(config.uds)
    return bind_tcp(config.host, config.port)


def bind_tcp(host: str, port: int) -> Listener:
    """A TCP socket bound to host:port; port 0 binds a free port, held from then on (a port
    found free and bound again later may be taken in between)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restarts do not wait out TIME_WAIT
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return Listener(sock.detach(), f"http://{shown}:{port}", port=port)


def _bind_unix(path: str) -> Listener:
    # A socket file left by a previous run is stale once nothing listens on it; any other file
    # at that path is not ours to remove. One a live server listens on is that server's: removing
    # it left the running server unreachable for good (and its exit later removed ours).
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        if _listening(path):
            raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE), path)
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        # Anyone who can reach the path may connect, as with uvicorn's --uds: under the usual
        # umask the socket was the owner's alone, and a sidecar's application, another user in
        # another container, could not connect. The directory is where access is controlled.
        os.chmod(path, 0o666)
        bound = os.stat(path)
    except OSError:
        sock.close()
        raise
    return Listener(sock.detach(), f"unix:{path}", path, uds_file=(bound.st_dev, bound.st_ino))


def _listening(path: str) -> bool:
    """Whether a server accepts connections on the Unix socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:  # ECONNREFUSED: nothing listens; the file is left over
            return False
    return True
