"""A plugin for tests/test_parallel_harness.py (``plugins=[lp_fault]``): at its ``LP_FAULT_AT``-th
split forward, the rank named by ``LP_FAULT_RANK`` exits abruptly, as a crashed process would
(``LP_FAULT=die``), or stops answering, as a stuck one would (``LP_FAULT=hang``)."""

import os
import time

from lookahead_core.parallel import ShardedLM

if os.environ.get("RANK") == os.environ.get("LP_FAULT_RANK"):
    _forward_batch, _calls = ShardedLM.forward_batch, [0]

    def forward_batch(self, *args, **kwargs):
        _calls[0] += 1
        if _calls[0] == int(os.environ["LP_FAULT_AT"]):
            if os.environ.get("LP_FAULT") == "hang":
                while True:
                    time.sleep(60)
            os._exit(3)
        return _forward_batch(self, *args, **kwargs)

    ShardedLM.forward_batch = forward_batch
