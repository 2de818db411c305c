"""``rasd launch``'s command line: torchrun's, so that a user swaps the word ``torchrun`` and nothing else.

What belongs here: the parser (every option of torch 2.13's ``torch.distributed.run``, with the same names, the
same underscore spellings, the same defaults and the same ``PET_<NAME>`` environment fallbacks) and ``resolve``,
which turns parsed arguments into a ``Plan``: the facts the launcher acts on, decided the way torchrun decides
them. Nothing here starts a process or opens a socket, so tests compare it with torchrun's own parser
(``torch.distributed.run.get_args_parser()``) option by option.

How torchrun decides what the workers get (torch/distributed/run.py, ``run`` and ``config_from_args``):

==============================================  ====================================================================
command line                                    rendezvous
==============================================  ====================================================================
``--standalone``                                c10d on ``localhost:0``: a store on a free port, a fresh uuid run id
no endpoint, no ``--master-port``, 1 node       the same as ``--standalone``
``--master-addr A --master-port P`` (static)    node rank ``--node-rank``; node 0's launcher hosts a TCPStore on
                                                ``A:P``; workers get ``MASTER_ADDR=A``, ``MASTER_PORT=P``
``--rdzv-backend c10d --rdzv-endpoint H:P``     node ranks in order of arrival at the store on ``H:P``
==============================================  ====================================================================

The options rasd launch adds are its own words: ``--max-respawns``, ``--respawn-backoff`` and ``--no-rasd``.
``--max-restarts`` means torchrun's (a whole-group restart, ``torchras.launch.restarts``) for a job without
inprocess.Wrapper on one node; a Wrapper's job respawns its dead worker instead, and on several nodes it is not used.
torchrun's options for what rasd launch does differently are accepted and read as near as they can be:
``--start-method``, ``--monitor-interval``,
``--event-log-handler``, ``--logs-specs``, ``--numa-binding``, ``--duplicate-*-filters`` are accepted and ignored
(``resolve`` says which, once, in ``Plan.ignored``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import Any

#: torchrun's ``Std``: which of a worker's streams go to a file (``--redirects``) or to a file and the console
#: (``--tee``). A bit mask: 1 stdout, 2 stderr, 3 both.
NONE, OUT, ERR, ALL = 0, 1, 2, 3
_STD_VALUE = re.compile(r"^[0-3]$")
_STD_MAPPING = re.compile(r"^(\d:[0-3],)*(\d:[0-3])$")
#: torchrun's default port for a c10d endpoint without one, and for static rendezvous without ``--master-port``.
C10D_PORT = 29400
MASTER_PORT = 29500
DEFAULT_MAX_RESPAWNS = 3
DEFAULT_RESPAWN_BACKOFF = 1.0
DEFAULT_SHUTDOWN_TIMEOUT = 30


class _FromEnvironment(argparse.Action):
    """torchrun's ``env`` action: an option left out takes ``PET_<DEST>`` from the environment, else its default."""

    def __init__(self, dest: str, default: Any = None, required: bool = False, **kwargs: Any) -> None:
        name = f"PET_{dest.upper()}"
        default = os.environ.get(name, default)
        if default is not None:
            required = False
        super().__init__(dest=dest, default=default, required=required, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)


class _FlagFromEnvironment(argparse.Action):
    """torchrun's ``check_env``: a flag, also set by ``PET_<DEST>`` holding a non-zero integer."""

    def __init__(self, dest: str, default: bool = False, **kwargs: Any) -> None:
        value = os.environ.get(f"PET_{dest.upper()}", "0")
        default = bool(int(value)) if value.lstrip("-").isdigit() else default
        super().__init__(dest=dest, const=True, default=default, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const)


def _option(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """``--a-b`` and torchrun's older spelling ``--a_b``, reading ``PET_A_B`` when left out."""
    names = [f"--{name}"] + ([f"--{name.replace('-', '_')}"] if "-" in name else [])
    parser.add_argument(*names, action=_FromEnvironment, **kwargs)


def _flag(parser: argparse.ArgumentParser, *names: str, help: str) -> None:
    spelled = list(names)
    for name in names:
        if name.startswith("--") and "-" in name[2:]:
            spelled.append("--" + name[2:].replace("-", "_"))
    parser.add_argument(*spelled, action=_FlagFromEnvironment, help=help)


def parser() -> argparse.ArgumentParser:
    """torchrun's options, then rasd launch's own."""
    p = argparse.ArgumentParser(
        prog="rasd launch",
        description="Launch a distributed PyTorch job as torchrun does, but keep it alive: a worker that exits "
        "never takes the others down, and a dead worker is respawned and joins the running job (inprocess.Wrapper "
        "with inprocess.elastic state: the model comes from the survivors' memory). Same command line as "
        "torchrun: replace the word torchrun with rasd launch.",
    )
    _option(p, "nnodes", type=str, default="1:1", help="number of nodes, or a range MIN:MAX (torchrun's)")
    _option(
        p,
        "nproc-per-node",
        type=str,
        default="1",
        help="workers per node: an integer, or auto, cpu, gpu (torchrun's)",
    )
    _option(p, "rdzv-backend", type=str, default="static", help="static (the default) or c10d")
    _option(p, "rdzv-endpoint", type=str, default="", help="host:port of the c10d rendezvous store")
    _option(p, "rdzv-id", type=str, default="none", help="the job's id (TORCHELASTIC_RUN_ID)")
    _option(p, "rdzv-conf", type=str, default="", help="key=value,... (accepted; 'timeout' is read)")
    _flag(p, "--standalone", help="a single-node job with a store on a free port and a fresh run id")
    _option(
        p,
        "max-restarts",
        type=int,
        default=0,
        help="torchrun's whole-group restarts, for a job without inprocess.Wrapper on one node: a worker that fails, "
        "or a verdict of the RAS mesh (a dead, hung or stuck rank), stops every worker and starts the group again, "
        "at most this many times (a Wrapper's job respawns the dead worker instead: --max-respawns)",
    )
    _option(p, "monitor-interval", type=float, default=0.1, help="seconds between looks at the workers")
    _option(
        p,
        "start-method",
        type=str,
        default="spawn",
        choices=["spawn", "fork", "forkserver"],
        help="accepted for compatibility: every worker is a new process",
    )
    _option(p, "event-log-handler", type=str, default="null", help="accepted for compatibility")
    _option(p, "role", type=str, default="default", help="the workers' role (ROLE_NAME, the output prefix)")
    _flag(p, "-m", "--module", help="run the script as a module, as python -m does")
    _flag(p, "--no-python", help="run the script as an executable, without python in front")
    _flag(p, "--run-path", help="run the script with runpy.run_path (read as the plain script: a new process)")
    _option(p, "log-dir", type=str, default=None, help="base folder for the workers' log files")
    p.add_argument(
        "-r",
        "--redirects",
        action=_FromEnvironment,
        type=str,
        default="0",
        help="streams to a log file only: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank, 0:1,1:2",
    )
    p.add_argument(
        "-t",
        "--tee",
        action=_FromEnvironment,
        type=str,
        default="0",
        help="streams to a log file and the console (as --redirects)",
    )
    _option(p, "local-ranks-filter", type=str, default="", help="show only these local ranks' output: 0,1,2")
    _option(p, "duplicate-stdout-filters", type=str, default=None, help="accepted for compatibility")
    _option(p, "duplicate-stderr-filters", type=str, default=None, help="accepted for compatibility")
    _option(p, "node-rank", type=int, default=0, help="this node's rank (static rendezvous)")
    _option(p, "master-addr", type=str, default="127.0.0.1", help="node 0's address (static rendezvous)")
    _option(p, "master-port", type=int, default=None, help="node 0's store port (static rendezvous; default 29500)")
    _option(p, "local-addr", type=str, default=None, help="this node's address (default: its fully qualified name)")
    _option(p, "logs-specs", type=str, default=None, help="accepted for compatibility")
    _option(p, "numa-binding", type=str, default=None, help="accepted for compatibility")
    _option(
        p,
        "signals-to-handle",
        type=str,
        default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        help="signals passed on to every worker (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)",
    )
    _option(
        p,
        "shutdown-timeout",
        type=int,
        default=None,
        help="seconds the workers get to exit after a signal before SIGKILL (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30)",
    )
    _flag(p, "--virtual-local-rank", help="LOCAL_RANK 0 for every worker, CUDA_VISIBLE_DEVICES one GPU each")
    own = p.add_argument_group("rasd launch (not in torchrun)")
    own.add_argument(
        "--max-respawns",
        type=int,
        default=DEFAULT_MAX_RESPAWNS,
        help=f"replacements started per local rank when its worker dies (default {DEFAULT_MAX_RESPAWNS}; 0: "
        "never respawn, the job goes on smaller)",
    )
    own.add_argument(
        "--respawn-backoff",
        type=float,
        default=DEFAULT_RESPAWN_BACKOFF,
        help="seconds before a local rank's second replacement, doubled for each one after (the first starts at "
        f"once; default {DEFAULT_RESPAWN_BACKOFF})",
    )
    own.add_argument(
        "--no-rasd",
        action="store_true",
        help="start no RAS node in the workers (by default every Python worker runs one, as under "
        "python -m rasd.run; TORCHRAS_ENABLE=0 turns it off too)",
    )
    p.add_argument("training_script", type=str, help="the script (or module, or executable) every worker runs")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    return p


# ---- what the launcher acts on ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the launcher does, decided once from the command line (and the environment, as torchrun reads it)."""

    command: tuple[str, ...]
    nproc_per_node: int
    nnodes: int
    node_rank: int | None  # None: given by the order of arrival at the c10d store
    backend: str  # "static" or "c10d"
    store_host: str  # where the launchers' store is (static: MASTER_ADDR)
    store_port: int  # 0: a free port (standalone)
    run_id: str
    local_addr: str | None
    role: str
    log_dir: str | None
    redirects: dict[int, int]  # local rank -> NONE/OUT/ERR/ALL
    tee: dict[int, int]
    local_ranks_filter: frozenset[int] | None
    max_respawns: int
    respawn_backoff: float
    shutdown_timeout: float
    signals: tuple[str, ...]
    virtual_local_rank: bool
    join_timeout: float
    ignored: tuple[str, ...] = ()
    max_restarts: int = 0  # torchrun's group restarts, for a job without the Wrapper on one node
    ras_node: bool = True  # a RAS node in every Python worker (``torchras.launch.ras_node``)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def parse_std(value: str, local_world_size: int) -> dict[int, int]:
    """torchrun's ``Std.from_str`` then ``to_map``: ``3`` -> every local rank both streams; ``0:1,1:2`` -> per rank."""
    if _STD_VALUE.match(value):
        return dict.fromkeys(range(local_world_size), int(value))
    if _STD_MAPPING.match(value):
        mapping = {int(rank): int(std) for rank, std in (item.split(":") for item in value.split(","))}
        return {rank: mapping.get(rank, NONE) for rank in range(local_world_size)}
    raise ValueError(f"{value} does not match: <{_STD_VALUE.pattern}> or <{_STD_MAPPING.pattern}>")


def parse_nnodes(value: str) -> tuple[int, int]:
    """torchrun's ``parse_min_max_nnodes``: ``N`` or ``MIN:MAX``."""
    parts = value.split(":")
    if len(parts) == 1:
        low = high = int(parts[0])
    elif len(parts) == 2:
        low, high = int(parts[0]), int(parts[1])
    else:
        raise ValueError(f'nnodes={value} is not in "MIN:MAX" format')
    if not 0 < low <= high:
        raise ValueError(f"min_nodes must be > 0 and <= max_nodes, got min_nodes={low}, max_nodes={high}")
    return low, high


def local_world_size(value: str) -> int:
    """torchrun's ``determine_local_world_size``: an integer, or ``cpu``, ``gpu``, ``xpu``, ``auto``."""
    try:
        return int(value)
    except ValueError:
        pass
    if value == "cpu":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if value in ("gpu", "xpu", "auto"):
        import torch

        if value == "gpu":
            if not torch.cuda.is_available():
                raise ValueError("Cuda is not available.")
            return torch.cuda.device_count()
        if value == "xpu":
            if not torch.xpu.is_available():
                raise ValueError("Xpu is not available.")
            return torch.xpu.device_count()
        if torch.accelerator.is_available():
            return torch.accelerator.device_count()
        return local_world_size("cpu")
    raise ValueError(f"Unsupported nproc_per_node value: {value}")


def parse_endpoint(endpoint: str, default_port: int) -> tuple[str, int]:
    """torchrun's ``parse_rendezvous_endpoint``: ``host[:port]``, IPv6 in brackets; ``localhost`` when empty."""
    endpoint = endpoint.strip()
    if not endpoint:
        return "localhost", default_port
    if endpoint.startswith("[") and endpoint.endswith("]"):
        host, rest = endpoint, ""
    else:
        host, _, rest = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
    if len(host) > 1 and host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = default_port
    if rest:
        if not rest.isdigit() or int(rest) >= 2**16:
            raise ValueError(
                f"The port number of the rendezvous endpoint '{endpoint}' must be an integer between 0 and 65536."
            )
        port = int(rest)
    if not re.match(r"^[\w\.:-]+$", host):
        raise ValueError(f"The hostname of the rendezvous endpoint '{endpoint}' must be a dot-separated list of labels")
    return host, port


def command(args: argparse.Namespace) -> tuple[str, ...]:
    """The worker's command line, as torchrun builds it: ``python -u [-m] script args`` or the executable itself."""
    if args.no_python and not args.run_path:
        if args.module:
            raise ValueError("Don't use both the '--no-python' flag and the '--module' flag at the same time.")
        return (args.training_script, *args.training_script_args)
    python = os.environ.get("PYTHON_EXEC", sys.executable)
    return (python, "-u", *(["-m"] if args.module and not args.run_path else []), args.training_script) + tuple(
        args.training_script_args
    )


def _rendezvous_timeout(conf: str) -> float:
    """torchrun's ``--rdzv-conf timeout=S`` (join timeout of the launchers; torch's default 900 s)."""
    for item in filter(None, conf.split(",")):
        key, _, value = item.partition("=")
        if key.strip() in ("timeout", "join_timeout") and value.strip():
            return float(value)
    return 900.0


def resolve(args: argparse.Namespace) -> Plan:
    """Decide what torchrun would decide (torch/distributed/run.py ``run``), without starting anything.

    ``ValueError`` for what torchrun refuses too (an nnodes range the wrong way round, ``--no-python`` with ``-m``,
    a bad ``--redirects``).
    """
    low, high = parse_nnodes(args.nnodes)
    nproc = local_world_size(args.nproc_per_node)
    if nproc < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, got {nproc}")
    if args.max_restarts < 0:
        raise ValueError("max_restarts must be >= 0")
    if args.max_respawns < 0:
        raise ValueError("--max-respawns must be >= 0")
    if args.respawn_backoff < 0:
        raise ValueError("--respawn-backoff must be >= 0")
    backend, endpoint, run_id = args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id
    if args.standalone or (backend == "static" and not endpoint and args.master_port is None and high == 1):
        backend, endpoint, run_id = "c10d", "localhost:0", str(uuid.uuid4())
    if backend not in ("static", "c10d"):
        raise ValueError(f"--rdzv-backend {backend}: rasd launch knows static and c10d (etcd: use c10d)")
    if backend == "static":
        if endpoint:
            host, port = parse_endpoint(endpoint, -1)
            if port == -1:
                raise ValueError(f"Port is absent in endpoint: {endpoint}. Try launching with --master-port")
        else:
            host, port = args.master_addr, args.master_port if args.master_port is not None else MASTER_PORT
        node_rank: int | None = args.node_rank
        if not 0 <= args.node_rank < high:
            raise ValueError(f"--node-rank {args.node_rank} is not in 0..{high - 1}")
    else:
        host, port = parse_endpoint(endpoint, C10D_PORT)
        node_rank = 0 if high == 1 else None
    filtered: frozenset[int] | None = None
    if args.local_ranks_filter:
        try:
            filtered = frozenset(int(item) for item in args.local_ranks_filter.split(","))
        except ValueError as error:
            raise ValueError(
                "--local_ranks_filter must be a comma-separated list of integers e.g. --local_ranks_filter=0,1,2"
            ) from error
    timeout = args.shutdown_timeout
    if timeout is None:
        timeout = int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT))
    ignored = [
        name
        for name, value, default in (
            ("--max-restarts", args.max_restarts if high > 1 else 0, 0),
            ("--start-method", args.start_method, "spawn"),
            ("--monitor-interval", args.monitor_interval, 0.1),
            ("--event-log-handler", args.event_log_handler, "null"),
            ("--logs-specs", args.logs_specs, None),
            ("--numa-binding", args.numa_binding, None),
            ("--duplicate-stdout-filters", args.duplicate_stdout_filters, None),
            ("--duplicate-stderr-filters", args.duplicate_stderr_filters, None),
        )
        if value != default
    ]
    if low != high:
        ignored.append(f"--nnodes {args.nnodes} (the job starts with {high} nodes)")
    return Plan(
        command=command(args),
        nproc_per_node=nproc,
        nnodes=high,
        node_rank=node_rank,
        backend=backend,
        store_host=host,
        store_port=port,
        run_id=run_id,
        local_addr=args.local_addr,
        role=args.role,
        log_dir=args.log_dir,
        redirects=parse_std(args.redirects, nproc),
        tee=parse_std(args.tee, nproc),
        local_ranks_filter=filtered,
        max_respawns=args.max_respawns,
        respawn_backoff=args.respawn_backoff,
        shutdown_timeout=float(timeout),
        signals=tuple(name.strip() for name in args.signals_to_handle.split(",") if name.strip()),
        virtual_local_rank=bool(args.virtual_local_rank),
        join_timeout=_rendezvous_timeout(args.rdzv_conf),
        ignored=tuple(ignored),
        max_restarts=args.max_restarts if high == 1 else 0,
        ras_node=not args.no_rasd,
    )


def this_host(plan: Plan) -> str:
    """This node's address as torchrun's c10d rendezvous gives it to the workers: ``--local-addr``, else the
    fully qualified name."""
    return plan.local_addr or socket.getfqdn()


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, Plan]:
    """Parse and resolve; a refusal exits with argparse's usage message, as torchrun's parser does."""
    p = parser()
    args = p.parse_args(list(argv))
    try:
        return args, resolve(args)
    except ValueError as error:
        p.error(str(error))
        raise  # never reached: error() exits
