"""Shared test settings."""

import torch

# Tiny models run fastest on one thread, and on a shared 2-core machine two threads spin-wait
# against other processes and run many times slower.
torch.set_num_threads(1)
