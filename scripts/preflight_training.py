"""Preflight, training part: one step of the run's draft config through speculators' Trainer, launched
by the train stage's own code with the run's training GPUs (see draftline.preflight.training)."""

from draftline.preflight import Part, TrainingStep, run_training
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to
from draftline.stages.train import TrainSettings

if __name__ == "__main__":
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    p = snakemake.params
    run_training(
        Part(str(p.target_dir), snakemake.input.hidden_states, snakemake.output[0], snakemake.log[0]),
        snakemake.input.regenerate,
        snakemake.input.config,
        snakemake.input.layer_ids,
        TrainingStep(
            # the run's train block with the optimizer and loader workers the plan resolved (as the train job)
            TrainSettings.from_config({**p.train, **{k: p.planned[k] for k in ("optimizer", "num_workers")}}),
            draft_vocab_size=p.draft_vocab_size,
            gpus=p.planned["world_size"] if p.planned["device"] == "cuda" else 0,  # the Trainer's GPUs; 0: the CPU
            threads=snakemake.threads,
            trust_remote_code=p.trust_remote_code,
        ),
    )
