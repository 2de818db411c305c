"""Abort: unblock the main thread from whatever collective it waits in, called from the monitor thread.

``AbortTorchDistributed`` differs from the reference in one important way: it also unblocks *gloo*. A blocked
gloo collective ignores ``ProcessGroup.abort()`` and ``destroy_process_group()`` (torch 2.13) and would wait for
gloo's own timeout (10-60 s). Shutting down (``SHUT_RDWR``) this process's established gloo peer sockets makes
the collective fail within milliseconds, here and on the peers. The sockets are found with psutil; store
connections (any connection touching a store port) and every connection that already existed when the wrapper
call started are left alone, so a restart never cuts the wrapper's own store or unrelated sockets of the
program that predate the call.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import os
import socket
import sys
from collections.abc import Iterable
from typing import Any

from . import logs, utils  # noqa: F401 - names of the reference's module
from .state import FrozenState

log = logs.get_logger(__name__)


class Abort(abc.ABC):
    """Called from the monitor thread while the atomic lock is held; its exceptions are logged and swallowed."""

    @abc.abstractmethod
    def __call__(self, state: FrozenState | None) -> FrozenState | None:
        raise NotImplementedError


def _store_ports(store: Any) -> set[int]:
    ports = set()
    seen = 0
    while store is not None and seen < 16:
        port = getattr(store, "port", None)
        if isinstance(port, int):
            ports.add(port)
        store = getattr(store, "underlying_store", None) or getattr(store, "base_store", None)
        seen += 1
    return ports


def process_group_store_ports() -> set[int]:
    """Ports of the TCPStores behind every live process group, plus ``MASTER_PORT``."""
    ports: set[int] = set()
    if os.environ.get("MASTER_PORT", "").isdigit():
        ports.add(int(os.environ["MASTER_PORT"]))
    try:
        from torch.distributed import distributed_c10d

        for _, (_, store) in list(distributed_c10d._world.pg_map.items()):
            ports |= _store_ports(store)
    except Exception:  # private torch structures; best effort
        log.debug("cannot read the process groups' stores", exc_info=True)
    return ports


def connection_key(connection: Any) -> tuple:
    return (connection.fd, tuple(connection.laddr), tuple(connection.raddr) if connection.raddr else ())


def _ras_node_fds() -> set[int]:
    """The sockets of this process's RAS node, if rasd runs here: its mesh must outlive a restart."""
    rasd = sys.modules.get("rasd")
    node = rasd.node() if rasd is not None else None
    return node.owned_fds() if node is not None else set()


#: The connections an abort tears down: open ones, and ones whose peer has already closed its side (CLOSE_WAIT: a
#: rank whose peer aborted first). Leaving the latter alone once left a rank blocked in a gloo all-reduce after its
#: peers had aborted (docs/inprocess.md §2, item 8).
TORN_DOWN_STATES = ("ESTABLISHED", "CLOSE_WAIT")


def established_connections() -> list[Any]:
    import psutil

    process = psutil.Process()
    getter = getattr(process, "net_connections", None) or process.connections
    return [connection for connection in getter("tcp") if connection.status in TORN_DOWN_STATES]


def shutdown_peer_sockets(excluded_ports: Iterable[int], protected: Iterable[tuple] = ()) -> int:
    """``SHUT_RDWR`` every open TCP connection of this process (``TORN_DOWN_STATES``) except store and protected ones.

    Returns how many sockets were shut down. The file descriptors stay open (their owner closes them); only
    the connection is torn down, which makes any thread blocked on it return with an error.
    """
    excluded = set(excluded_ports)
    protected_keys = set(protected)
    ras_fds = _ras_node_fds()
    count = 0
    for connection in established_connections():
        if connection.fd is None or connection.fd < 0 or not connection.raddr:
            continue
        if connection.fd in ras_fds:
            continue
        if connection.laddr.port in excluded or connection.raddr.port in excluded:
            continue
        if connection_key(connection) in protected_keys:
            continue
        count += shutdown_socket(connection.fd)
    return count


def shutdown_socket(fd: int) -> bool:
    """``SHUT_RDWR`` the connection of file descriptor ``fd`` (through a duplicate: the owner keeps and closes its
    own); whether it was shut down. A thread blocked on the connection returns with an error."""
    try:
        duplicate = os.dup(fd)
    except OSError:
        return False
    try:
        with socket.socket(fileno=duplicate) as sock:
            sock.shutdown(socket.SHUT_RDWR)
            return True
    except OSError:
        return False


FR_BUFFER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def _flight_recorder_enabled() -> bool:
    for name in FR_BUFFER_VARIABLES:
        try:
            if int(os.environ.get(name, "0")) > 0:
                return True
        except ValueError:
            log.warning("%s=%r is not an integer", name, os.environ.get(name))
    return False


def dump_flight_recorder(directory: str, iteration: Any, rank: int) -> str | None:
    """Write what torch's flight recorder holds to ``directory/iter_<iteration>/_dump_<rank>.json``.

    The file layout is the reference's (one directory per restart iteration, one file per rank). torch records
    collectives of NCCL and, on torch 2.8 and later, of gloo as well, when ``TORCH_FR_BUFFER_SIZE`` (or
    ``TORCH_NCCL_TRACE_BUFFER_SIZE``) is positive when the process group is created. Returns the path written, or
    None after a log line saying why nothing was written. Never raises.
    """
    if not _flight_recorder_enabled():
        log.info(
            "flight recorder: not dumped, torch records nothing (set TORCH_FR_BUFFER_SIZE > 0 before the "
            "process group is created)"
        )
        return None
    try:
        import json
        import pickle

        from torch._C import _distributed_c10d as c10d

        dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
        if dump is None:
            log.info("flight recorder: not dumped, this torch build has no flight recorder")
            return None
        trace = pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=True))
        folder = os.path.join(directory, f"iter_{iteration}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"_dump_{rank}.json")
        with open(path, "w") as output:
            json.dump(trace, output, indent=1, default=repr)
            output.flush()
            os.fsync(output.fileno())
        log.info("flight recorder: %d entries of rank %s written to %s", len(trace.get("entries", ())), rank, path)
        return path
    except Exception:  # a trace must never stop the abort
        log.warning("flight recorder: dump failed", exc_info=True)
        return None


class AbortTorchDistributed(Abort):
    """Abort every process group (NCCL: ``abort()``, gloo: shut its peer sockets), then destroy them.

    With ``torch_fr_trace_path`` (or ``NVRX_FR_TRACE_PATH``) set, the flight recorder is dumped first, one file per
    rank and restart iteration (``dump_flight_recorder``).
    """

    def __init__(self, torch_fr_trace_path: str | None = None, shutdown_gloo_sockets: bool = True) -> None:
        self.torch_fr_trace_path = torch_fr_trace_path or os.environ.get("NVRX_FR_TRACE_PATH")
        self.shutdown_gloo_sockets = shutdown_gloo_sockets

    def collect_fr_trace(self, state: FrozenState | None) -> str | None:
        """Dump the flight recorder for this abort (None when no path is set or nothing was written)."""
        import torch.distributed as dist

        if self.torch_fr_trace_path is None:
            return None
        iteration = state.iteration if state is not None else "unknown"
        return dump_flight_recorder(self.torch_fr_trace_path, iteration, dist.get_rank())

    def __call__(self, state: FrozenState | None = None) -> FrozenState | None:
        import torch.distributed as dist

        if not dist.is_available():
            return state
        from torch.distributed import distributed_c10d

        if not dist.is_initialized():
            forget_unfinished_init(distributed_c10d)
            return state
        self.collect_fr_trace(state)

        groups = list(distributed_c10d._world.pg_map.items())
        backends = {str(backend).lower() for _, (backend, _) in groups}
        if self.shutdown_gloo_sockets and any("gloo" in backend for backend in backends):
            from .fault_source import active_call

            call = active_call()
            excluded = process_group_store_ports()
            protected: Iterable[tuple] = ()
            if call is not None:
                excluded |= call.store_ports()
                protected = call.protected_connections()
            count = shutdown_peer_sockets(excluded, protected)
            log.debug("shut down %d gloo peer sockets", count)
        nccl_groups = [group for group, (backend, _) in groups if "nccl" in str(backend).lower()]
        if nccl_groups:
            with concurrent.futures.ThreadPoolExecutor(len(nccl_groups)) as pool:
                list(pool.map(self._abort_group, nccl_groups))
        with _destroying_now():
            dist.destroy_process_group()
        return state

    @staticmethod
    def _abort_group(group: Any) -> None:
        try:
            group.abort()
        except Exception:
            log.warning("aborting a process group failed", exc_info=True)


def _destroying_now() -> Any:
    """rasd's hooks, when installed, keep destroyed gloo groups until the next init (rasd/torch/hooks.py, "gloo's
    teardown"); an abort's groups are destroyed now."""
    try:
        from rasd.torch import installed

        hooks = installed()
    except Exception:  # noqa: BLE001 - no rasd: torch's own destroy
        hooks = None
    return hooks.not_retaining() if hooks is not None else contextlib.nullcontext()


def forget_unfinished_init(distributed_c10d: Any) -> None:
    """Reset the count torch names new process groups by, as ``destroy_process_group()`` does when it destroys the
    default group, when there is no default group to destroy: an ``init_process_group`` that the restart interrupted
    (its peers never came: one rank raised before its own) has already taken a name. Left counted, this rank would
    name the next iteration's group "1" while a rank whose init never started names it "0", and their keys in the
    store would never meet: every rank waits in ``init_process_group`` until a timeout (the chaos matrix's
    ``init exception`` cell, 97 s).
    """
    world = getattr(distributed_c10d, "_world", None)
    if world is not None and world.group_count:
        log.debug(
            "an unfinished init_process_group had named %d process group(s): counted from 0 again", world.group_count
        )
        world.group_count = 0


class AbortTransformerEngine(Abort):
    """Release Transformer Engine's userbuffers and FP8 state, if Transformer Engine is installed."""

    def __call__(self, state: FrozenState | None = None) -> FrozenState | None:
        try:
            import transformer_engine.pytorch as te
        except ImportError:
            return state
        te.module.base.destroy_ub()
        te.fp8.FP8GlobalStateManager.reset()
        return state


class AbortPersistentCheckpointProcesses(Abort):
    """Stop the processes that write checkpoints in the background, so none survives into the next iteration.

    Without arguments, as in the reference: closes (with abort) every asynchronous checkpoint queue of
    nvidia-resiliency-ext's checkpointing, if that package is installed. ``workers`` adds the application's own
    persistent writers: ``multiprocessing.Process``/``subprocess.Popen``/``psutil.Process`` objects are
    terminated (then killed after ``grace`` seconds); objects with ``close(abort=True)`` are closed so.
    """

    def __init__(self, *workers: Any, grace: float = 5.0) -> None:
        self.workers = list(workers)
        self.grace = grace

    def __call__(self, state: FrozenState | None = None) -> FrozenState | None:
        try:
            from nvidia_resiliency_ext.checkpointing.async_ckpt.core import (
                abort_nvrx_checkpoint,
            )
        except Exception:  # noqa: BLE001 - not installed: no queues of it to close
            abort_nvrx_checkpoint = None
        if abort_nvrx_checkpoint is not None:
            abort_nvrx_checkpoint()
        for worker in self.workers:
            try:
                self._stop(worker)
            except Exception:  # one worker must not keep the others alive
                log.warning("cannot stop checkpoint worker %r", worker, exc_info=True)
        return state

    def _stop(self, worker: Any) -> None:
        if hasattr(worker, "close") and not hasattr(worker, "terminate"):
            worker.close(abort=True)
            return
        alive = getattr(worker, "is_alive", None) or getattr(worker, "is_running", None)
        if alive is not None and not alive():
            return
        if getattr(worker, "poll", None) is not None and worker.poll() is not None:
            return
        worker.terminate()
        waiter = getattr(worker, "join", None) or worker.wait
        try:
            waiter(self.grace)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired, psutil.TimeoutExpired
            pass
        still = getattr(worker, "is_alive", None) or getattr(worker, "is_running", None)
        if (still is not None and still()) or (getattr(worker, "poll", None) is not None and worker.poll() is None):
            worker.kill()
            try:
                waiter(self.grace)
            except Exception:  # noqa: BLE001 - a worker that outlives its kill is left behind; the abort goes on
                pass
