"""Python loads this module at start when its folder is on PYTHONPATH: the process's wall clock
(``time.time``) then runs ``QUOTA_CLOCK_SKEW_S`` seconds ahead, as on a machine whose clock is
wrong. The machine's edge, not our code: libfaketime would do the same from outside, but it hangs
Python's timed waits (``threading.Event.wait``) on this platform."""

import os
import time

_skew = float(os.environ.get("QUOTA_CLOCK_SKEW_S") or 0)
if _skew:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _skew
    time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
