"""Give up on a fault that every restart meets again, instead of restarting it for ever.

A restart heals a fault that is gone once the job starts again: a dead or hung rank, a transient error. It does not
heal a missing dependency, a bug that raises at the same line before the first step, a rank that blocks in the
same call each time: those come back in every iteration, and restarting them for ever hides them (issue 38 saw 154
restarts of one ``AssertionError`` in 4 minutes). nvidia-resiliency-ext restarts for ever unless an ``initialize``
such as ``RetryController`` bounds it; the Wrapper here bounds it by default:

    the same fault ends ``limit`` (3) iterations in a row with no progress between them  ->  the Wrapper gives up

* **The same fault.** An exception: the same type raised at the same place (``file:line`` of the innermost frame of
  its traceback), whichever rank raised it and whatever its message says (a message often carries a count or an
  address); in a training that says nothing of its progress (below), with the same message too. Anything else that
  ends an iteration (a soft or hard timeout, a dead, hung or stuck rank, a monitor's or the mesh's verdict): the
  same kind about the same initial ranks. A verdict comes before exceptions, as in the restart's reasons: a crash
  makes its peers' collectives fail too, and those exceptions are its consequences. Restarts that are no fault
  (``JOIN_WAITING``, ``HOSTS_UPDATED``: processes join or leave at a commit) end a run.
* **Progress** (``PROGRESS_SOURCES``): the training got further than ever before in this call, on any rank. By
  default a ``step`` (``state.step`` of an ``inprocess.elastic`` state set above its highest value so far: the
  README's ``state.step += 1``, with no change to the script), a ``commit`` (``state.commit()`` above the highest
  commit count so far), ``call_wrapper.ping()`` (``ping``: see below) or ``call_wrapper.progress()`` (``call``,
  always on). Replaying the steps after the last commit is no progress: a fault at step 1000 that each restart from
  the commit at step 990 meets again is a loop.
* **Pings** count by how many an iteration makes: an iteration progressed when it pings more often than the
  iteration before it did before its fault. A script of nvidia-resiliency-ext's kind pings every step and keeps no
  ``state.step``: an iteration that trained further than the one before pinged more. A ping as such is no progress:
  the reference's own examples ping once at the top of the function, before anything that can fail, and a fault at
  the same step of every iteration meets the same number of pings each time; neither is ever more than the
  iteration before. (Against the highest count of any earlier iteration instead, a job whose restarts resume from
  its last checkpoint would have to outrun its longest iteration ever: a second fault soon after a long healthy run
  would count as a repeat of a fault that had nothing to do with it.)

How every rank leaves the same iteration. Each restarting rank writes, into the failed iteration's store and
before the iteration barrier, whether it progressed and (the first writer wins) the exception that was its fault.
After the barrier every rank computes the iteration's decision from that store and the previous iteration's
decision, and the first to write it (``compare_set``) fixes it for all: a record that comes late cannot split the
ranks, and a process that joined since reads the count where the others do. The rank whose decision was written
says, once, what the fault was, with its traceback; every rank then raises ``exception.RepeatedFault`` (a
``RestartAbort``, so ``except RestartAbort`` and the launcher's ``gave_up`` see it, and a ``SystemExit`` with
code 1, so that a script that lets it go exits with status 1 without printing it again on every rank).

Settings: ``Wrapper(repeated_faults=RepeatedFaults(limit=3, progress=("step", "commit", "ping")))``, ``None`` to turn it
off; without the keyword, ``TORCHRAS_REPEATED_FAULTS`` (the limit; ``0`` turns it off) and ``TORCHRAS_PROGRESS``
(the sources, comma-separated) apply. A bad value gets one warning and the default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import traceback as traceback_module
from collections.abc import Callable, Iterable
from typing import Any

from . import exception, fault_source, logs

log = logs.get_logger(__name__)

DEFAULT_LIMIT = 3
#: The bound for a training that says nothing of its progress (no ``inprocess.elastic`` state, no ``ping()``, no
#: ``progress()``): the same fault this many iterations in a row. Larger, since its restarts may be progress that
#: cannot be seen (the reference's example injects random faults at one line and checkpoints to disk).
SILENT_LIMIT = 10
LIMIT_ENVIRONMENT = "TORCHRAS_REPEATED_FAULTS"
PROGRESS_ENVIRONMENT = "TORCHRAS_PROGRESS"
#: What may count as progress; ``call`` (``call_wrapper.progress()``) always does.
PROGRESS_SOURCES = ("step", "commit", "ping", "call")
DEFAULT_PROGRESS = ("step", "commit", "ping")
#: Restarts that are no fault: processes join or leave the job at a commit (inprocess.elastic.joining).
NOT_FAULTS = frozenset({"JOIN_WAITING", "HOSTS_UPDATED"})

FAULT_KEY = "repeats/fault"
PROGRESS_KEY = "repeats/progress"
#: Some rank's training can say when it progresses (an ``inprocess.elastic`` state exists, or it reported a source).
SPEAKS_KEY = "repeats/speaks"
DECISION_KEY = "repeats/decision"


@dataclasses.dataclass(frozen=True)
class Fault:
    """What ended an iteration, as every rank reads it from the store."""

    kind: str  # the exception's class name, or the verdict's kind ("PEER_DEAD", "SOFT_TIMEOUT", ...)
    place: str  # an exception: "file:line"; a verdict: "initial ranks 2, 3"
    message: str = ""
    function: str = ""  # an exception: the function that raised it
    rank: int | None = None  # the initial rank that recorded it
    iteration: int = 0
    traceback: str = ""

    @classmethod
    def of_exception(cls, error: BaseException, rank: int | None, iteration: int) -> Fault:
        place, function, frame = "?", "?", error.__traceback__
        while frame is not None:  # the innermost frame: where it was raised
            code = frame.tb_frame.f_code
            place, function, frame = f"{code.co_filename}:{frame.tb_lineno}", code.co_name, frame.tb_next
        text = "".join(traceback_module.format_exception(type(error), error, error.__traceback__))
        return cls(type(error).__name__, place, str(error)[:1000], function, rank, iteration, text[-6000:])

    def same(self, other: Fault | None, message: bool = False) -> bool:
        """The same fault: kind and place; with ``message``, an exception's message too (a verdict's is not)."""
        if other is None or (self.kind, self.place) != (other.kind, other.place):
            return False
        return not (message and self.function) or self.message == other.message

    def describe(self) -> str:
        if self.function:
            return f"{self.kind}: {self.message} (raised at {self.place}, in {self.function})"
        return f"{self.kind} of {self.place}" + (f": {self.message}" if self.message else "")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Fault:
        return cls(**json.loads(text))


@dataclasses.dataclass(frozen=True)
class Decision:
    """One iteration's count, agreed by every rank (the first to write it fixes it)."""

    fault: Fault | None
    count: int  # iterations in a row this fault ended with no progress between them (0: no fault)
    give_up: bool
    by: str = ""  # who wrote it (a token of one rank's tracker): that rank reports

    def to_json(self) -> str:
        fault = dataclasses.asdict(self.fault) if self.fault else None
        return json.dumps(dict(fault=fault, count=self.count, give_up=self.give_up, by=self.by))

    @classmethod
    def from_json(cls, text: str | bytes, limit: int) -> Decision:
        data = json.loads(text)
        fault = Fault(**data["fault"]) if data.get("fault") else None
        count = int(data["count"])
        give_up = bool(data["give_up"]) if "give_up" in data else count >= limit  # the writer's bound decided
        return cls(fault, count, fault is not None and give_up, str(data.get("by", "")))


class RepeatedFaults:
    """The policy's settings: give up when the same fault ends ``limit`` iterations in a row with no progress
    (``progress``: a subset of ``PROGRESS_SOURCES``) between them."""

    def __init__(self, limit: int = DEFAULT_LIMIT, progress: Iterable[str] = DEFAULT_PROGRESS) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"RepeatedFaults(limit=...) must be an int >= 1, not {limit!r}")
        sources = frozenset(progress) | {"call"}
        unknown = sources - set(PROGRESS_SOURCES)
        if unknown:
            raise ValueError(f"unknown progress source(s) {sorted(unknown)}: choose from {PROGRESS_SOURCES}")
        self.limit = limit
        self.progress = sources

    def __repr__(self) -> str:
        return f"RepeatedFaults(limit={self.limit}, progress={sorted(self.progress - {'call'})})"

    @classmethod
    def from_environment(cls, environ: Any = None) -> RepeatedFaults | None:
        """The default policy, with ``TORCHRAS_REPEATED_FAULTS`` and ``TORCHRAS_PROGRESS`` applied (None: off)."""
        environ = os.environ if environ is None else environ
        limit, progress = DEFAULT_LIMIT, DEFAULT_PROGRESS
        text = environ.get(LIMIT_ENVIRONMENT, "").strip()
        if text:
            try:
                limit = int(text)
                if limit < 0:
                    raise ValueError(text)
            except ValueError:
                log.warning("%s=%r is not a count >= 0: %s is used", LIMIT_ENVIRONMENT, text, DEFAULT_LIMIT)
                limit = DEFAULT_LIMIT
        if limit == 0:
            return None
        text = environ.get(PROGRESS_ENVIRONMENT, "").strip()
        if text:
            names = tuple(name.strip() for name in text.split(",") if name.strip())
            if set(names) <= set(PROGRESS_SOURCES):
                progress = names
            else:
                log.warning(
                    "%s=%r names no progress source of %s: %s are used",
                    PROGRESS_ENVIRONMENT,
                    text,
                    ",".join(PROGRESS_SOURCES),
                    ",".join(DEFAULT_PROGRESS),
                )
        return cls(limit, progress)

    def tracker(self, on_first_progress: Callable[[], None] | None = None) -> Tracker:
        return Tracker(self, on_first_progress)


class Tracker:
    """The policy in one call of the wrapped function, on one rank.

    ``progress()`` is called from the training (the main thread) and must stay cheap: a comparison, and one
    callback at the first progress of an iteration (the monitor process clears its carried hang time).
    """

    def __init__(self, policy: RepeatedFaults, on_first_progress: Callable[[], None] | None = None) -> None:
        self.policy = policy
        self.on_first_progress = on_first_progress
        self.marks: dict[str, int] = {}  # the highest position each source reached in this call
        self.progressed = False  # in the current iteration, on this rank
        self.pings = 0  # ``ping()`` calls in the current iteration, on this rank
        self.pings_before = 0  # and in the iteration before (until its fault)
        self.token = f"{os.getpid()}:{id(self)}:{os.urandom(4).hex()}"  # names this tracker's decisions
        #: The training reported progress of some source in this call (whether the policy counts it or not).
        self.spoke = False

    def new_iteration(self) -> None:
        self.progressed = False
        self.pings_before, self.pings = self.pings, 0

    def ping(self) -> None:
        """``call_wrapper.ping()``: progress at the first ping beyond the count of the iteration before."""
        self.spoke = True
        self.pings += 1
        if self.pings == self.pings_before + 1:
            self.progress("ping")

    def progress(self, source: str = "call", position: int | None = None, counts: bool = True) -> None:
        """``source`` moved to ``position`` (None: progress whatever the position). ``counts=False``: a position
        loaded from a commit or another rank (a restore, a sync), which raises the mark but is no progress."""
        self.spoke = True
        if source not in self.policy.progress:
            return
        if position is not None:
            mark = self.marks.get(source)
            if mark is not None and position <= mark:
                return
            self.marks[source] = position
        if counts and not self.progressed:
            self.progressed = True
            if self.on_first_progress is not None:
                try:
                    self.on_first_progress()
                except Exception:  # never into training
                    log.debug("could not tell the monitor process about progress", exc_info=True)

    # ---- the restart's side --------------------------------------------------------------------------------

    def record(self, store: Any, error: BaseException | None, initial_rank: int | None, iteration: int) -> None:
        """Before the iteration barrier: this rank's progress and its fault (``fn_exception``) into the failed
        iteration's store. Never raises: a rank must not leave the job for a count."""
        try:
            if self.progressed:
                store.set(PROGRESS_KEY, "1")
            if self.spoke or _states:
                store.set(SPEAKS_KEY, "1")
            if error is not None:
                store.compare_set(FAULT_KEY, "", Fault.of_exception(error, initial_rank, iteration).to_json())
        except Exception:  # a rank must not leave the job for a count
            log.warning("could not record iteration %s's fault for the repeat count", iteration, exc_info=True)

    def decide(self, store: Any, previous: Any | None, reasons: list[str], iteration: int) -> Decision | None:
        """After the iteration barrier: this iteration's agreed decision (None if the store failed: no count).

        ``previous``: the store of the iteration before (None for the first); ``reasons``: the restart's reasons,
        verdicts first (``restart_info.order_reasons``)."""
        try:
            mine = self._count(store, previous, reasons, iteration)
            agreed = store.compare_set(DECISION_KEY, "", mine.to_json())
            decision = Decision.from_json(agreed, self.policy.limit)
        except Exception:  # a rank must not leave the job for a count
            log.warning("could not count iteration %s's fault for the repeat count", iteration, exc_info=True)
            return None
        if decision.give_up and decision.by == self.token:  # this rank's decision was written: it says so, once
            self._report(decision)
        return decision

    def _count(self, store: Any, previous: Any | None, reasons: list[str], iteration: int) -> Decision:
        fault = fault_of(store, reasons, iteration)
        if fault is None:
            return Decision(None, 0, False, self.token)
        # A training that says nothing of its progress (no inprocess.elastic state, no ping, no progress(): the
        # reference's examples, which checkpoint to disk) may progress where this cannot see it: a larger bound,
        # and an exception is the same only with the same message too (the reference's example raises at one line
        # at random steps, "example fault at iteration=21": each a new fault, not one met again).
        silent = not store.check([SPEAKS_KEY])
        limit = max(self.policy.limit, SILENT_LIMIT) if silent else self.policy.limit
        if store.check([PROGRESS_KEY]):
            count = 1
        else:
            last = None
            if previous is not None and previous.check([DECISION_KEY]):
                last = Decision.from_json(previous.get(DECISION_KEY), self.policy.limit)
            count = last.count + 1 if last is not None and fault.same(last.fault, message=silent) else 1
        return Decision(fault, count, count >= limit, self.token)

    def _report(self, decision: Decision) -> None:
        fault = decision.fault
        assert fault is not None
        log.error(
            "giving up: %s ended %s restart iterations in a row with no progress between them (%s): a restart "
            "does not heal it%s, so every rank leaves the wrapper now%s",
            fault.describe(),
            decision.count,
            _progress_words(self.policy),
            " (something every restart meets again: a missing dependency, a bug, a bad setting)"
            if fault.function
            else "",
            f". As initial rank {fault.rank} raised it in iteration {fault.iteration}:\n{fault.traceback.rstrip()}"
            if fault.traceback
            else "",
        )

    def give_up(self, decision: Decision) -> exception.RepeatedFault:
        fault = decision.fault
        assert fault is not None
        return exception.RepeatedFault(
            f"{fault.describe()} ended {decision.count} restart iterations in a row with no progress",
            fault=fault,
            count=decision.count,
        )


def fault_of(store: Any, reasons: list[str], iteration: int) -> Fault | None:
    """What ended ``iteration``: a verdict first (the first reason, when it is one), else the first exception
    recorded; None for a restart that is no fault, or when nothing identifies one."""
    from .attribution import Interruption

    first = reasons[0].split(" ", 1)[0].rstrip(":") if reasons else ""
    if first in NOT_FAULTS:
        return None
    if first == "COMM_STUCK":
        # Every rank reports a stuck communicator; what identifies the hang is the operation and who is behind it
        # ("AllReduce operation 5 stuck; rank 2 behind (not launched)"): a rank that wedges at random steps makes
        # other faults, the same hang met at the same operation after every restart makes the same one.
        details = reasons[0].split(": ", 1)[-1]
        return Fault(first, "; ".join(details.split("; ")[:2]), reasons[0][:300], iteration=iteration)
    if first.isupper():
        records = [
            record
            for record in store.get_interruption_records()
            if record.interruption not in (Interruption.EXCEPTION, Interruption.BASE_EXCEPTION)
        ]
        ranks = sorted({_initial_rank(store, record.rank) for record in records})
        place = "initial ranks " + ", ".join(map(str, ranks)) if ranks else "no rank"
        return Fault(first, place, reasons[0][:300], iteration=iteration)
    if store.check([FAULT_KEY]):
        return Fault.from_json(store.get(FAULT_KEY))
    return None


def _initial_rank(store: Any, rank: int) -> int:
    key = f"initial_rank_{rank}"
    return int(store.get(key)) if store.check([key]) else rank


def _progress_words(policy: RepeatedFaults) -> str:
    words = {
        "step": "no state.step above its highest",
        "commit": "no new state.commit()",
        "ping": "no more call_wrapper.ping() than the iteration before",
        "call": "no call_wrapper.progress()",
    }
    return ", ".join(words[source] for source in PROGRESS_SOURCES if source in policy.progress)


#: How many ``inprocess.elastic`` states this process holds: a training that keeps one says when it progresses.
_states = 0


def state_created() -> None:
    """An ``inprocess.elastic`` state was made (``TorchState``, ``ShardedState``): the training speaks progress."""
    global _states
    _states += 1


def report_progress(source: str, position: int | None = None, counts: bool = True) -> None:
    """Tell the active wrapped call (if any) that ``source`` moved; never raises. For ``inprocess.elastic``."""
    call = fault_source.active_call()
    tracker = getattr(call, "repeats", None)
    if tracker is None:
        return
    try:
        tracker.progress(source, position, counts)
    except Exception:  # never into training
        log.debug("progress not counted", exc_info=True)


class _FromEnvironment:
    """``Wrapper(repeated_faults=...)`` left out: the default policy with the environment's settings."""

    def __repr__(self) -> str:
        return "RepeatedFaults.from_environment()"


FROM_ENVIRONMENT = _FromEnvironment()


def resolve(setting: RepeatedFaults | None | _FromEnvironment) -> RepeatedFaults | None:
    """The policy a Wrapper uses for ``repeated_faults=setting``."""
    if isinstance(setting, _FromEnvironment):
        return RepeatedFaults.from_environment()
    if setting is not None and not isinstance(setting, RepeatedFaults):
        raise TypeError(f"repeated_faults must be an inprocess.repeated_faults.RepeatedFaults or None, not {setting!r}")
    return setting
