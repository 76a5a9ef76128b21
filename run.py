"""``python run.py ...`` is ``lookahead-run ...``: see experiments/cli.py and the README."""

from experiments.cli import run

if __name__ == "__main__":
    run()
