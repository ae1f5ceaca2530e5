"""Suite-wide settings.

Runs with ``--threads 0`` adapt every loop's torch thread count to the machine's load (core.perf.ThreadGovernor),
and the thread count changes float rounding: the suite keeps the adaptive count fixed at every core so that
its bit-equality tests (same seed, resume == uninterrupted) do not depend on what else runs on the machine.
tests/core/test_perf.py lifts this for the governor's own tests.

The dataset cache and the local reference-score file point into a directory of this test process, never the
user's ``~/.cache``: no test reads what an earlier test (or the user's own ``ctrl-rl data generate``) left there,
so a test that needs local references writes its own (``tests.scripts.local_references``).
"""

import atexit
import os
import shutil
import tempfile

os.environ["CTRL_RL_FIXED_THREADS"] = "1"

_CACHE = tempfile.mkdtemp(prefix="ctrl_rl-tests-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ["CTRL_RL_DATA_DIR"] = os.path.join(_CACHE, "datasets")
os.environ["CTRL_RL_REFERENCE_SCORES"] = os.path.join(_CACHE, "reference_scores_v5.json")
