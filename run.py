"""``python run.py ...``: the harness's command line, run from the clone's root (experiments/cli.py, the README)."""

from experiments.cli import run

if __name__ == "__main__":
    run()
