"""The outlier rule (docs/protocol.md §3.2, detail lines): which groups get one line per member."""

import pytest

from rasd.report import is_outlier


@pytest.mark.parametrize(
    "count, verbose, total, expected",
    [
        (1, False, None, True),  # a single member is always named
        (1, False, 100, True),
        (1, True, 2, True),  # even where 1 < 2 * 0.5 would fail
        (10, False, None, True),  # up to 10 without a total
        (11, False, None, False),
        (6, False, 32, True),  # the docs' 26/6 split: 6 <= 10 and 6 <= 8
        (26, False, 32, False),
        (9, False, 32, False),  # 9 > 32 * 0.25
        (8, False, 32, True),
        (11, True, None, True),  # verbose, no total: always
        (15, True, 32, True),  # verbose: count < total / 2
        (16, True, 32, False),
        (26, True, 32, False),
    ],
)
def test_outlier_rule(count, verbose, total, expected):
    assert is_outlier(count, verbose, total) is expected
