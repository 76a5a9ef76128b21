"""A plugin for tests/test_parallel_harness.py (``plugins=[lp_fault]``): the rank named by
``LP_KILL_RANK`` exits abruptly, as a crashed process would, at its ``LP_KILL_AT``-th split forward."""

import os

from lookahead_core.parallel import ShardedLM

if os.environ.get("RANK") == os.environ.get("LP_KILL_RANK"):
    _forward_batch, _calls = ShardedLM.forward_batch, [0]

    def forward_batch(self, *args, **kwargs):
        _calls[0] += 1
        if _calls[0] == int(os.environ["LP_KILL_AT"]):
            os._exit(3)
        return _forward_batch(self, *args, **kwargs)

    ShardedLM.forward_batch = forward_batch
