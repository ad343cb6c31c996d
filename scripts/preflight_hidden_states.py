"""Preflight, hidden-state part: the regenerated rows through the extraction stage, then the
fidelity check (see draftline.preflight)."""

from dataclasses import replace

from draftline.preflight import Part, run_hidden_states
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    p = snakemake.params
    run_hidden_states(
        Part(str(p.target_dir), snakemake.input.regenerate, snakemake.output[0], snakemake.log[0]),
        snakemake.input.layer_ids,
        replace(p.engine, threads=snakemake.threads),  # the run's vLLM settings, the job's threads
        backend=p.backend,
        format=p.format,
        fidelity_min_top1=p.fidelity_min_top1,
    )
