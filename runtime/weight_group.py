"""Setting up the weight group: rank 0's store, the other ranks' connection to it, gloo.

The trainer (rank 0) hosts the group's ``TCPStore``; every server connects to it, then
all build a ``ProcessGroupGloo`` (or NCCL) on it. A server reaches the store first,
within ``connect_s`` (short, a few seconds; :data:`runtime.joining.JOIN_CONNECT_S`):

1. a TCP connection to ``host:port``, tried again every ``CONNECT_RETRY_S`` until then
   (the trainer may post the join before its store listens);
2. the store's own handshake, in a thread of its own (torch's ``TCPStore`` client waits
   for the ping's answer without a timeout: a port whose listener accepts and never
   answers held the join for ever). A handshake past the deadline is left to that thread.

Only then is the group built, with the long ``timeout_s``: gloo's rendezvous (every rank
posting its address) and the group's default collective timeout. A store that goes away
meanwhile (the trainer died) fails it at once ("Failed to recv"). So a join whose master
never answers, or answers as something else, fails within ``connect_s`` with
:class:`MasterUnreachable`; before, gloo's store client tried twice for up to ``timeout_s``
each (83 s measured at the default 60 s), or for ever against a silent listener.
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import torch

from runtime.joining import JOIN_CONNECT_S

CONNECT_RETRY_S = 0.1  # between two TCP connection tries to a master not yet listening


class MasterUnreachable(RuntimeError):
    """The weight group's master (rank 0's store) did not answer within the deadline."""


def master_store(host: str, port: int, world_size: int, timeout: timedelta):
    """Rank 0's ``TCPStore``, listening on ``host`` only (TCPStore's own socket listens on
    every interface whatever host it is given)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return torch.distributed.TCPStore(
        host, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )  # fmt: skip


def connect_store(
    host: str, port: int, world_size: int, connect_s: float, timeout: timedelta
) -> torch.distributed.TCPStore:
    """A client of rank 0's store, reached within ``connect_s`` (else
    :class:`MasterUnreachable`); its later waits use ``timeout``."""
    deadline = time.monotonic() + connect_s
    where = f"the weight group's master {host}:{port}"
    _wait_listening(host, port, deadline, f"{where} accepted no connection within {connect_s:g} s")
    store = _handshake(
        host, port, world_size, deadline,
        f"{where} accepted a connection but did not answer as the trainer's store (a torch "
        f"TCPStore) within {connect_s:g} s",
    )  # fmt: skip
    store.set_timeout(timeout)
    return store


def _wait_listening(host: str, port: int, deadline: float, failure: str) -> None:
    last = "none tried"
    while (left_s := deadline - time.monotonic()) > 0:
        try:
            socket.create_connection((host, port), timeout=left_s).close()
            return
        except OSError as err:
            last = f"{type(err).__name__}: {err}"
        time.sleep(max(0.0, min(CONNECT_RETRY_S, deadline - time.monotonic())))
    raise MasterUnreachable(f"{failure} (last try: {last})")


def _handshake(
    host: str, port: int, world_size: int, deadline: float, failure: str
) -> torch.distributed.TCPStore:
    """TCPStore's connect and ping, run in a daemon thread (it releases the GIL) so that a
    listener that never answers costs that thread only, not the join."""
    out: list = []

    def connect() -> None:
        left = timedelta(seconds=max(deadline - time.monotonic(), 0.001))
        try:
            out.append(torch.distributed.TCPStore(
                host, port, world_size, is_master=False, timeout=left, wait_for_workers=False
            ))  # fmt: skip
        except Exception as err:  # noqa: BLE001 - said below, in the joining thread
            out.append(err)

    thread = threading.Thread(target=connect, name="tandem-store-handshake", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not out:
        raise MasterUnreachable(failure)
    if isinstance(out[0], Exception):
        raise MasterUnreachable(f"{failure}: {_first_line(out[0])}")
    return out[0]


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _gloo_options(bind_host: str | None, timeout: timedelta):
    options = torch.distributed.ProcessGroupGloo._Options()
    options._timeout = timeout
    if bind_host and bind_host not in ("0.0.0.0", "::", ""):
        options._devices = [torch.distributed.ProcessGroupGloo.create_device(hostname=bind_host)]
    else:
        options._devices = [torch.distributed.ProcessGroupGloo.create_default_device()]
    return options


def make_group(
    host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float,
    bind_host: str | None = None, connect_s: float = JOIN_CONNECT_S,
    store: torch.distributed.TCPStore | None = None,
) -> torch.distributed.ProcessGroup:  # fmt: skip
    """Join the weight group (rank 0 hosts its store on ``host``); blocks until every rank
    has joined, within ``timeout_s``, also the group's collective timeout. A rank above 0
    reaches the store within ``min(connect_s, timeout_s)`` (:func:`connect_store`).
    Gloo's own sockets listen on ``bind_host`` (rank 0: ``host``). ``store``: rank 0's,
    already listening (:func:`master_store`)."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}")
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        store = master_store(host, port, world_size, timeout) if store is None else store
        bind_host = host if bind_host is None else bind_host
    else:
        store = connect_store(host, port, world_size, min(connect_s, timeout_s), timeout)
    if backend == "nccl":
        return torch.distributed.ProcessGroupNCCL(store, rank, world_size)
    return torch.distributed.ProcessGroupGloo(
        store, rank, world_size, _gloo_options(bind_host, timeout)
    )
