"""The one GPU command: losslessness, step-time curves and host cost on random-weight models of the
mission's shapes, and a projection of the speedups, in at most 8 files (experiments/tools/gpu/, whose
docstring says what each part does).

    python3 scripts/gpu_run.py --out $OUT             # one GPU (H100 80 GB): at most --budget 450 s
    python3 scripts/gpu_run.py --tiny --out /tmp/gpu   # the same code on tiny shapes on the CPU (tests)

Imports torch, transformers, the standard library and the project's modules that need nothing else
(``lookahead_core``, ``experiments.tools.gpu`` and its stdlib-only helpers): none of the harness's
packages (hydra, pandas, datasets, ...).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.tools.gpu import record  # noqa: E402, F401  - first: the budget's clock starts with it
from experiments.tools.gpu.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
