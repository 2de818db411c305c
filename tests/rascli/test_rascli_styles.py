"""How ``rascli`` shows a report on a terminal (``rascli.commands.styled``): the job's text unchanged, each line styled
by what it is. In the stacks, the rank that has not launched the collective the others are inside stands out."""

from __future__ import annotations

from rascli.commands import styled

STACKS = """\
Stacks of 4 of 4 processes (main threads), gathered in 3.1 ms; identical stacks folded

ranks 0,1,3 (3 processes on node0, thread MainThread):
    collective: inside AllReduce operation 33 of communicator bbf5000012340abc (launched, not completed), for 21.0 s
    train.py:10 (<module>)
    graph.py:829 (_engine_run_backward)

rank 2 (node0:102, thread MainThread):
    collective: not in AllReduce operation 33 of communicator bbf5000012340abc: never launched it, while ranks \
0,1,3 are inside it
    train.py:10 (<module>)
    demo_worker.py:88 (_inject)
"""


def style_of(text: str, line_start: str) -> str:
    rendered = styled(text, stacks=True)
    assert rendered.plain == text  # the text itself is never changed
    offset = text.index(line_start)
    styles = {str(span.style) for span in rendered.spans if span.start <= offset < span.end}
    return " ".join(sorted(styles))


def test_the_rank_not_in_the_collective_is_red_and_the_ranks_inside_it_are_yellow() -> None:
    assert style_of(STACKS, "    collective: not in") == "bold red"
    assert style_of(STACKS, "    collective: inside") == "yellow"
    assert style_of(STACKS, "    demo_worker.py:88") == "bold yellow"  # the innermost frame, where the rank waits
    assert style_of(STACKS, "rank 2 (node0") == "bold cyan"
