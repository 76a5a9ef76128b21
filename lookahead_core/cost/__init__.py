"""What a lookahead step costs on a device, and ``decoding=auto`` built on it.

* ``curve``: :func:`measure_latency` times forwards against tokens per forward and returns a
  :class:`CostModel`, which predicts a config's speedup from its step compression S or from a
  run's per-step record; the batch versions (``batch_latency``, ``predict_batch``);
  :func:`step_costs` adds the decode loop's host time per step.
* ``choice``: :func:`choose_config` calibrates a grid on a few prompts and picks the predicted
  fastest (``ChoiceReport`` says why); :func:`choose_for_batch` per batch size;
  :func:`widest_tree` the one cost-aware tree ``auto``'s online protocol decodes with.
* ``grid``: the configs ``auto`` chooses among.
"""

from .choice import (Calibration, ChoiceReport, choose_config, choose_for_batch, prefilled, step_costs,
                     survey_config, widest_tree)
from .curve import (DEFAULT_SIZES, CostModel, batch_latency, batch_seconds, bent_sizes, kv_bucket, logit_rows_for,
                    measure_latency, predict_batch, sizes_through, step_shape, upper_bound)
from .grid import (DEFAULT_LOOKAHEAD_GRID, DEFAULT_POOL_ONLY_GRID, DEFAULT_SUFFIX_ONLY_TREES,
                   DEFAULT_SUFFIX_TREE_BUDGETS, DEFAULT_TREE_BUDGETS, default_grid, tree_config)

__all__ = [
    "Calibration", "ChoiceReport", "CostModel", "DEFAULT_LOOKAHEAD_GRID", "DEFAULT_POOL_ONLY_GRID", "DEFAULT_SIZES",
    "DEFAULT_SUFFIX_ONLY_TREES", "DEFAULT_SUFFIX_TREE_BUDGETS", "DEFAULT_TREE_BUDGETS", "batch_latency",
    "batch_seconds", "bent_sizes", "choose_config", "choose_for_batch", "default_grid", "kv_bucket",
    "logit_rows_for", "measure_latency", "predict_batch", "prefilled", "sizes_through", "step_costs", "step_shape",
    "survey_config",
    "tree_config", "upper_bound", "widest_tree",
]
