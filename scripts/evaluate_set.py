"""Acceptance of the final draft on one prompt set in vLLM (see draftline.stages.evaluate)."""

from draftline.lineage.provenance import sidecar, write_provenance
from draftline.planning.rule_params import check_job_environment
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to
from draftline.stages.evaluate import EvaluateSettings, evaluate_set

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    check_job_environment(  # device, torch build, pins
        snakemake.params.planned, snakemake.params.versions, snakemake.params.device_setting.value
    )
    evaluate_set(
        str(snakemake.params.target_dir),
        (snakemake.wildcards.prompt_set, snakemake.params.source),
        ("trained", snakemake.input.draft),
        snakemake.output.acceptance,
        EvaluateSettings.from_params(snakemake.params, snakemake.threads),
    )
    write_provenance(snakemake, sidecar(snakemake.output.acceptance))  # results/eval/sets/<set>.provenance.json
