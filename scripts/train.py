"""Train the draft with speculators' Trainer (resuming a cut-short run) and publish final/ (see draftline.train)."""

from draftline.devices import claim_gpus
from draftline.provenance import write_provenance
from draftline.train import TrainInputs, TrainSettings, train
from draftline.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    train(
        TrainInputs(
            config_dir=snakemake.input.config,
            dataset=snakemake.input.dataset,
            hidden_states=snakemake.input.hidden_states,
            d2t=snakemake.input.d2t,
            t2d=snakemake.input.t2d,
            layer_ids=snakemake.input.layer_ids,
            target=snakemake.input.target,
        ),
        TrainSettings.from_config(snakemake.params.train),
        runs_dir=snakemake.params.runs_dir,
        final_dir=snakemake.output[0],
        threads=snakemake.threads,
        # GPUs the job was given (one torchrun process each); 0 or no CUDA -> CPU
        gpus=int(snakemake.resources.get("gpu", 0)),
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
