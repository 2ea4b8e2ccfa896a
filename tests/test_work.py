"""`tests.work.counted_calls`, the budget the tests count work with instead of timing it: it sees
a loop of calls, whatever the machine's speed, and leaves the profiler as it found it."""
import sys

from tests.work import counted_calls


def _step(i):
    return i + 1


def test_counted_calls_grow_with_the_work_and_not_with_the_time():
    with counted_calls() as small:
        for i in range(100):
            _step(i)
    with counted_calls() as large:
        for i in range(10_000):
            _step(i)
    assert 100 <= small.n < 150 and 10_000 <= large.n < 10_050  # each call once, little else
    with counted_calls() as builtins:
        sorted(range(10))
    assert 2 <= builtins.n < 10  # a C call counts once, whatever it does (and the block's exit a few)


def test_counted_calls_put_back_the_profiler_they_found():
    seen = []

    def outer(frame, event, arg):
        seen.append(event)

    sys.setprofile(outer)
    try:
        with counted_calls() as calls:
            _step(1)
        assert sys.getprofile() is outer
    finally:
        sys.setprofile(None)
    assert calls.n >= 1 and seen  # the outer profiler ran again after the block
