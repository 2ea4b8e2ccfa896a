"""Work budgets for tests: the work a call did, counted, instead of how long it took. A busy
machine makes a time bound miss (a shape-only trace that takes 0.1 s here took 2.08 s on a loaded
2-core machine); a count of calls is the same on any machine, and a regression that loops over
what a file claims, or walks a model once per module, multiplies it."""
from __future__ import annotations

import contextlib
import sys


class Calls:
    """The function calls counted in a `counted_calls()` block: Python functions and built-ins
    (a NumPy or C call counts once, whatever it does: bound its memory, not its calls)."""

    def __init__(self):
        self.n = 0


@contextlib.contextmanager
def counted_calls(builtins: bool = True):
    """Count the calls made on this thread inside the block (`sys.setprofile`); yields a `Calls`
    whose `n` is the count so far. `builtins=False` counts Python functions only."""
    calls = Calls()
    previous = sys.getprofile()
    events = ("call", "c_call") if builtins else ("call",)

    def profile(frame, event, arg):
        if event in events:
            calls.n += 1

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(previous)
