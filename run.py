"""Benchmark lookahead decoding against its baseline: one Hydra job = one model x dataset x decoder.

    python run.py                                        # the demo: smollm2_135m, 6 MT-Bench turns
    python run.py experiment=mtbench model=llama2_7b     # the paper's MT-Bench setting
    python run.py -m experiment=humaneval decoding.window=5,10,15 decoding.ngram=3,5
    python run.py -m sweep=smollm2_wn                    # a ready-made grid (conf/sweep/)
    python run.py -m hydra/launcher=joblib ...           # jobs in parallel processes

Parallel jobs on one machine share its cores and memory bandwidth, which skews speedups: time on
one job per device (e.g. joblib with hydra.launcher.n_jobs=1, or a Slurm array through
hydra-submitit-launcher: hydra/launcher=submitit_slurm).

Config groups live in conf/ and are typed by experiments/schema.py; results go to
results/raw/<experiment>/<model>/<config>-<settings>-s<seed>.csv, and rerunning a command resumes it.
"""

import hydra
from omegaconf import DictConfig

from experiments.runner import run
from experiments.schema import register_configs

register_configs()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
