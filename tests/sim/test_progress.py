"""The progress bar draws on a terminal and stays silent otherwise."""

from __future__ import annotations

import io

from gpufair.sim.progress import ProgressBar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_draws_each_percent_once_on_a_terminal_and_ends_its_line() -> None:
    stream = Terminal()
    bar = ProgressBar("week", stream)
    for fraction in (0.0, 0.001, 0.5, 0.5, 1.0):
        bar(fraction)
    bar.close()
    frames = stream.getvalue().split("\r")[1:]
    assert frames[0] == "week [------------------------------]   0%"
    assert frames[1] == "week [###############---------------]  50%"
    assert frames[2] == "week [##############################] 100%\n"


def test_the_bar_is_silent_when_the_stream_is_not_a_terminal() -> None:
    stream = io.StringIO()
    bar = ProgressBar("week", stream)
    bar(0.5)
    bar.close()
    assert stream.getvalue() == ""
