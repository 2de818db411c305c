"""What changed between two reports, for ``--watch``: items of Errors and Warnings that are new or changed,
items that went away, communicator rows that differ, and whether the job summary or the restarts moved."""

from __future__ import annotations

from dataclasses import dataclass

from .report import Report


@dataclass(frozen=True)
class Changes:
    """What differs from the previous report (``--watch``); empty for the first one."""

    new_items: frozenset[str] = frozenset()
    resolved_items: tuple[str, ...] = ()
    changed_rows: frozenset[int] = frozenset()
    summary_changed: bool = False
    #: The Restarts section differs (the job restarted again, or a process caught up).
    restarts_changed: bool = False

    @property
    def any(self) -> bool:
        return bool(
            self.new_items or self.resolved_items or self.changed_rows or self.summary_changed or self.restarts_changed
        )


NO_CHANGES = Changes()


def diff(previous: Report | None, current: Report) -> Changes:
    if previous is None:
        return NO_CHANGES
    before = {item.header: item for item in previous.errors + previous.warnings}
    now = {item.header: item for item in current.errors + current.warnings}
    new = frozenset(h for h, item in now.items() if before.get(h) != item)
    resolved = tuple(h for h in before if h not in now)
    old_rows = set(previous.comms or ())
    rows = frozenset(i for i, row in enumerate(current.comms or ()) if row not in old_rows)
    return Changes(new, resolved, rows, previous.summary != current.summary, previous.restarts != current.restarts)


def describe(changes: Changes) -> str:
    if not changes.any:
        return "no change since the last report"
    parts = []
    if changes.new_items:
        parts.append("new: " + ", ".join(sorted(changes.new_items)))
    if changes.resolved_items:
        parts.append("resolved: " + ", ".join(changes.resolved_items))
    if changes.changed_rows:
        parts.append("communicator rows changed: " + ", ".join(str(i) for i in sorted(changes.changed_rows)))
    if changes.summary_changed:
        parts.append("job summary changed")
    if changes.restarts_changed:
        parts.append("restarts changed")
    return "changed since the last report: " + "; ".join(parts)
