"""Where ``inprocess`` logs: the ``inprocess.<module>`` loggers, which sit under the reference's ``nvrx`` logger.

nvidia-resiliency-ext's ``inprocess`` logs on the logger ``nvrx``; code and tests written against it attach their
handlers and set their levels there (``logging.getLogger("nvrx").addHandler(...)``). Here every record comes from
the logger of the module that writes it (``inprocess.wrap``, ``inprocess.monitor_thread``, ...), and the
``inprocess`` logger's parent is ``nvrx``, so a record goes::

    inprocess.wrap  ->  inprocess  ->  nvrx  ->  (root)

Handlers and levels set on ``nvrx`` (the reference's way) and on ``inprocess`` (ours) both apply, and without either
the records reach the root logger as any library's do. Nothing is configured here: no handler, no level, no
``propagate`` change (the reference adds a stderr handler to ``nvrx`` and stops it propagating; a library that does
that behind its user's back is what "nothing outlives a call" rules out).

Record fields. The reference's log format names four fields of its own, ``%(workload_rank)s``,
``%(workload_local_rank)s``, ``%(infra_rank)s`` and ``%(infra_local_rank)s`` (RANK, LOCAL_RANK, SLURM_PROCID and
SLURM_LOCALID; ``?`` where unset). Every record of an ``inprocess`` logger carries them, so a formatter written for
the reference's records formats ours.

Records hold no exception. A handler may keep its records (pytest's log capture, ``logging.handlers.MemoryHandler``,
a queue): a record's exception would keep its traceback, whose frames keep the wrapper call's stores, sockets and
threads' objects alive long after the call ended ("nothing outlives a call"). So, as the record is made, its
traceback becomes text (``exc_text``, which every ``logging.Formatter`` prints as it would have printed
``exc_info``) and an exception among its arguments becomes its ``str`` and ``repr``. The reference formats its
exceptions into the message text (``utils.log_exc``) for the same effect.
"""

from __future__ import annotations

import logging
import os

#: The reference's logger: every ``inprocess`` record passes through it.
REFERENCE_LOGGER = "nvrx"
#: The package's logger, the parent of every module's.
PACKAGE_LOGGER = "inprocess"
#: The fields the reference's format reads, with what each is taken from.
RANK_FIELDS = ("workload_rank", "workload_local_rank", "infra_rank", "infra_local_rank")


def _integer(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _infra_rank() -> int | None:
    """SLURM_PROCID, counted across the tasks of a SLURM job array as the reference counts it."""
    procid = _integer("SLURM_PROCID")
    task, nodes = _integer("SLURM_ARRAY_TASK_ID"), _integer("SLURM_NNODES")
    if nodes is None:
        nodes = _integer("SLURM_JOB_NUM_NODES")
    if procid is not None and task is not None and nodes is not None:
        return task * nodes + procid
    return procid


def rank_fields() -> dict[str, int | str]:
    """The reference's four rank fields, now (``?`` where the variable is unset or not a number)."""
    values = (_integer("RANK"), _integer("LOCAL_RANK"), _infra_rank(), _integer("SLURM_LOCALID"))
    return {name: "?" if value is None else value for name, value in zip(RANK_FIELDS, values, strict=True)}


class _Text:
    """An exception among a record's arguments, as text: formats as it would with ``%s`` and ``%r``."""

    __slots__ = ("text", "representation")

    def __init__(self, value: object) -> None:
        self.text, self.representation = str(value), repr(value)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.representation


_FORMATTER = logging.Formatter()


def detach(record: logging.LogRecord) -> None:
    """Turn what ``record`` holds of an exception into text (its traceback into ``exc_text``)."""
    if record.exc_info:
        if not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        record.exc_info = None
    if isinstance(record.msg, BaseException):
        record.msg = str(record.msg)
    if isinstance(record.args, tuple) and any(isinstance(arg, BaseException) for arg in record.args):
        record.args = tuple(_Text(arg) if isinstance(arg, BaseException) else arg for arg in record.args)


class InprocessRecords(logging.Filter):
    """On every record of an ``inprocess`` logger: adds the reference's rank fields (never overwriting a field the
    record has) and detaches its exception (``detach``). Drops nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not all(hasattr(record, name) for name in RANK_FIELDS):
            for name, value in rank_fields().items():
                if not hasattr(record, name):
                    setattr(record, name, value)
        detach(record)
        return True


_FILTER = InprocessRecords()


def _link_to_reference() -> None:
    """Make ``nvrx`` the parent of ``inprocess`` (once the ``inprocess`` logger exists, its children find it)."""
    package = logging.getLogger(PACKAGE_LOGGER)
    reference = logging.getLogger(REFERENCE_LOGGER)
    if package.parent is not reference:
        package.parent = reference


def get_logger(name: str) -> logging.Logger:
    """The logger of ``name`` (a module of this package), under ``nvrx``, whose records carry the rank fields and
    hold no exception."""
    _link_to_reference()
    logger = logging.getLogger(name)
    adopt(logger)
    return logger


def adopt(logger: logging.Logger) -> None:
    """Give ``logger``'s records the rank fields and detach their exceptions (idempotent)."""
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


def adopt_existing() -> None:
    """Adopt every logger of this package that exists already (those made with ``logging.getLogger`` by modules
    that must not import this one, such as ``inprocess.monitor_process``, which also runs as the monitor's script)."""
    _link_to_reference()
    prefix = PACKAGE_LOGGER + "."
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == PACKAGE_LOGGER or name.startswith(prefix)) and isinstance(logger, logging.Logger):
            adopt(logger)


_link_to_reference()
