"""Suite-wide settings.

Runs with ``--threads 0`` adapt every loop's torch thread count to the machine's load (core.perf.ThreadGovernor),
and the thread count changes float rounding: the suite keeps the adaptive count fixed at every core so that
its bit-equality tests (same seed, resume == uninterrupted) do not depend on what else runs on the machine.
tests/core/test_perf.py lifts this for the governor's own tests.
"""

import os

os.environ["CTRL_RL_FIXED_THREADS"] = "1"
