"""What every part of training shares (graphgen/training/common.py): the progress lines' clock and
the error."""

from __future__ import annotations

from graphgen.errors import GraphgenError
from graphgen.training.common import TrainError, _clock


def test_the_clock_is_minutes_and_two_digit_seconds():
    assert _clock(0) == "0:00"
    assert _clock(7) == "0:07"
    assert _clock(60) == "1:00"
    assert _clock(125) == "2:05"
    assert _clock(3600 + 59) == "60:59"  # minutes do not roll over into hours


def test_the_clock_rounds_to_the_nearest_second_and_never_goes_negative():
    assert _clock(59.4) == "0:59"
    assert _clock(59.6) == "1:00"
    assert _clock(-3) == "0:00"


def test_a_training_error_is_one_of_graphgens():
    # the command line reports GraphgenError in one line (exit 2)
    assert issubclass(TrainError, GraphgenError)
