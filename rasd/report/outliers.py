"""The outlier rule: which groups of a distribution get one detail line per member.

A report about thousands of ranks must not print thousands of lines. The largest groups are taken to be the norm
and summarised by a count; only small groups, the outliers, are listed member by member. NCCL's rule, used for every
listing in the report (outlier nodes, missing and dead processes, missing ranks, errors, mismatches)::

    count == 1                         always an outlier (a single rank is always worth naming)
    verbose, with a total              count < total * 0.5
    verbose, no total                  always
    otherwise                          count <= 10 and (no total or count <= total * 0.25)

So a 32-rank communicator split 26/6 lists the 6 ranks only (6 <= 10 and 6 <= 8); a 2-rank communicator split 1/1
lists both ranks.
"""

from __future__ import annotations

#: Above this many members a group is summarised by its count alone (outside verbose mode).
DETAIL_THRESHOLD = 10
#: Outside verbose mode, a group larger than this fraction of the total is not an outlier.
OUTLIER_FRACTION = 0.25
#: In verbose mode, a group smaller than this fraction of the total is an outlier.
VERBOSE_OUTLIER_FRACTION = 0.5


def is_outlier(count: int, verbose: bool, total: int | None = None) -> bool:
    """Whether a group of ``count`` members (out of ``total``, when there is one) gets per-member detail lines."""
    if count == 1:
        return True
    if verbose:
        return count < total * VERBOSE_OUTLIER_FRACTION if total is not None else True
    return count <= DETAIL_THRESHOLD and (total is None or count <= total * OUTLIER_FRACTION)
