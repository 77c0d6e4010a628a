"""Ray for one command: connect to a cluster, or start one on this machine on 127.0.0.1.

``ray`` is imported only here, when a command asks for ``--ray`` (the ``ray`` extra).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from runtime.errors import MissingExtra

LOCAL_RAY = "local"  # --ray without an address: a Ray instance of the command's own
LOOPBACK = "127.0.0.1"
RAY_INSTALL_HINT = "pip install 'tandem-rl[ray]'"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
logger = logging.getLogger(__name__)


def require_ray() -> ModuleType:
    """The ``ray`` module, imported now; a ``MissingExtra`` naming the extra if absent."""
    try:
        import ray
    except ImportError:
        raise MissingExtra(
            f"--ray needs Ray, which is not installed; install it with: {RAY_INSTALL_HINT}"
        ) from None
    return ray


@contextlib.contextmanager
def ray_session(address: str, num_cpus: int | None = None) -> Iterator[ModuleType]:
    """Ray, connected for the block. ``address`` :data:`LOCAL_RAY`: an instance started
    on 127.0.0.1 with ``num_cpus`` (default: this machine's cores), shut down after;
    ``auto`` or ``host:port``: that cluster, disconnected after. A Ray that this process
    has initialised already is used as it is, and left running."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    try:
        with keeps_sigterm_handler():
            if address == LOCAL_RAY:
                start_local_ray(num_cpus)
            else:
                connect(ray, address)
        yield ray
    finally:
        ray.shutdown()


ADDRESS_FORMS = "auto, HOST:PORT or ray://HOST:PORT (or --ray alone for a Ray of the command's own)"


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The host and port that ``--ray ADDRESS`` names (``None`` for ``auto``); a
    ``ValueError`` naming ``--ray`` for any other form. Ray's own parser fails on these
    with a logged traceback (``:6379``), a bare ``Invalid address format`` or advice about
    ``RAY_ADDRESS`` (``http://...``)."""
    if address == "auto":
        return None
    scheme, sep, rest = address.partition("://")
    if sep and scheme != "ray":
        raise ValueError(f"--ray {address}: not a Ray address ({scheme}://); give {ADDRESS_FORMS}")
    host, _, port = (rest if sep else address).rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--ray {address}: not a Ray address; give {ADDRESS_FORMS}")
    return host, int(port)


def connect(ray: ModuleType, address: str) -> None:
    """``ray.init`` on the cluster at ``address``; a ``ValueError`` naming ``--ray`` at once
    for an address of no form Ray takes, or where nothing answers (Ray itself retries a
    dead ``host:port`` for minutes, and a dead ``ray://`` for half a minute)."""
    hint = NO_CLUSTER_HINT
    endpoint = check_reachable(address)
    client = "://" in address  # a Ray client connects over its own protocol, not the GCS's
    # a Ray client (ray://) connects over its own protocol: no node address to keep
    with loopback_stays_loopback(_is_loopback(endpoint) and not client):
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except ConnectionError as err:
            found = str(err).split(". ")[0]
            if client and endpoint is not None and not not_a_gcs(endpoint):
                host, port = endpoint
                hint = (
                    "that is a Ray cluster's GCS address, not a Ray Client server's: give it "
                    f"without ray:// (--ray {host}:{port})"
                )
            elif endpoint is not None and os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
                # something answered: a cluster that wants a token (ray start's default)
                # refuses a driver without one, and Ray sends its token to a named address
                # only when asked to
                hint = (
                    "a cluster started with token authentication (ray start's default) needs "
                    "RAY_AUTH_MODE=token here, with its token in ~/.ray/auth_token or "
                    "RAY_AUTH_TOKEN"
                )
            raise ValueError(f"--ray {address}: {found}; {hint}") from None


GCS_PROBE_TIMEOUT_S = 5.0
NO_CLUSTER_HINT = (
    "start one (ray start --head), or give --ray without an address for a Ray instance of "
    "the command's own"
)


def check_reachable(address: str) -> tuple[str, int] | None:
    """The host and port ``--ray ADDRESS`` names (None for ``auto``), or a ``ValueError``
    naming ``--ray`` where nothing listens there or, for ``HOST:PORT``, what listens is no
    Ray GCS: checked in seconds, where Ray retries either for minutes."""
    endpoint = ray_endpoint(address)
    if endpoint is None:
        return None
    try:
        socket.create_connection(endpoint, timeout=5.0).close()
    except OSError as err:
        raise ValueError(
            f"--ray {address}: no Ray cluster answers there ({err}); {NO_CLUSTER_HINT}"
        ) from None
    if "://" not in address and (other := not_a_gcs(endpoint)):
        raise ValueError(f"--ray {address}: {other}; give the address ray start printed")
    return endpoint


def not_a_gcs(endpoint: tuple[str, int]) -> str | None:
    """None where a Ray cluster's GCS answers at ``endpoint`` (one that wants a token too);
    else what answered instead. ``ray.init`` retries any address for minutes, so a port of
    another service (the dashboard's, an HTTP server) hung the command."""
    require_ray()
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    host, port = endpoint
    with grpc.insecure_channel(f"[{host}]:{port}" if ":" in host else f"{host}:{port}") as ch:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(ch).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=GCS_PROBE_TIMEOUT_S
            )
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]  # a grpc.Call's
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                return None  # a GCS that wants a token: ray.init says so
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return (
                    "a gRPC server answers there, but no Ray GCS (a Ray Client server is "
                    "given as ray://HOST:PORT)"
                )
            return (
                f"something listens there but does not answer as a Ray GCS ({code.name.lower()}; "
                "the dashboard's or another service's port?)"
            )
    return None


def start_local_ray(num_cpus: int | None = None) -> None:
    """Start a Ray instance for this process on this machine: every server bound to
    127.0.0.1, no dashboard, its processes in a session of their own
    (:func:`ray_in_its_own_session`). A ``RuntimeError`` (and no instance) if Ray bound
    elsewhere."""
    ray = require_ray()
    with loopback_stays_loopback(True), _quiet(_TOKEN_NOTICE), ray_in_its_own_session():
        ray.init(
            address=LOCAL_RAY,  # a new instance, even with RAY_ADDRESS set or another running
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address=LOOPBACK,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    addresses = {node["NodeManagerAddress"] for node in ray.nodes()}
    if addresses != {LOOPBACK}:
        ray.shutdown()
        raise RuntimeError(f"the local Ray instance bound to {sorted(addresses)}, not {LOOPBACK}")


# Ray turns token authentication on for every new local instance and says so on the
# console each time ("Token authentication is enabled for this Ray cluster. ...")
_TOKEN_NOTICE = "ray._private.authentication.authentication_token_setup"


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """The logger's warnings left unprinted for the block (its errors still shown)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


OWN_SESSION_LOST = (
    "Ray %s has no ray._private.services.ConsolePopen (tandem pins ray==2.60.0): its "
    "processes stay in this command's process group, so a SIGTERM to the group (timeout, "
    "Slurm, systemd) reaches them and the run may stop without its checkpoint"
)


@contextlib.contextmanager
def ray_in_its_own_session() -> Iterator[None]:
    """While active, each process Ray starts (``ray._private.services.start_ray_process``:
    the GCS server, the raylet, the log monitor; the raylet's workers and agents are its
    children) starts in a session of its own, out of reach of a signal to this process's
    group (``kill -TERM -PGID``, ``timeout``, Slurm, systemd). Such a SIGTERM killed the
    GCS under the driver, whose stop then hung for 60 s and exited 1 (``Failed to connect
    to GCS``) before it had checkpointed. Only the driver gets it now: it stops the run as
    SIGTERM to it alone does, then shuts Ray down. Ray already blocks SIGINT in these
    processes, and a driver killed outright still takes them with it (``PR_SET_PDEATHSIG``,
    Ray's fate sharing on Linux; Ray gives them a process group of their own on Windows
    for the same reason)."""
    import ray

    try:
        from ray._private import services
    except ImportError:
        services = None
    popen = getattr(services, "ConsolePopen", None)
    if not (isinstance(popen, type) and issubclass(popen, subprocess.Popen)):
        # a private class of the pinned Ray (2.60): another Ray still starts, as before
        logger.warning(OWN_SESSION_LOST, ray.__version__)
        yield
        return

    class OwnSessionPopen(popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "start_new_session": True})

    services.ConsolePopen = OwnSessionPopen
    try:
        yield
    finally:
        services.ConsolePopen = popen


@contextlib.contextmanager
def keeps_sigterm_handler() -> Iterator[None]:
    """SIGTERM is handled after the block as before it. ``ray.init`` replaces the
    handler of the main thread: a driver's SIGTERM becomes ``sys.exit(15)``, and a node
    it starts drains for up to 30 s first, and its core worker prints a stack dump. The
    command's own handler unwinds it as Ctrl-C does, and the session then shuts Ray down."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sets handlers, ray.init's included
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler not set from Python, left as it is
            signal.signal(signal.SIGTERM, previous)


def _is_loopback(endpoint: tuple[str, int] | None) -> bool:
    return endpoint is not None and endpoint[0] in _LOOPBACK_HOSTS


@contextlib.contextmanager
def loopback_stays_loopback(active: bool) -> Iterator[None]:
    """While active, Ray keeps a loopback address as it is. ``ray.init`` resolves a
    loopback address to the host's outward one (``services.resolve_ip_for_localhost``)
    except where Ray runs single-node only, as on Windows and macOS; that switch is on
    for the block (a local instance, or a cluster this machine reaches on 127.0.0.1)."""
    if not active:
        yield
        return
    from ray._private import ray_constants

    multi_node = getattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = multi_node
