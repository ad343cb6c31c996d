"""Acceptance of the final draft on every prompt set in one job, each engine started once
(evaluate.sets_in_one_job; see draftline.stages.evaluate)."""

from draftline.lineage.provenance import sidecar, write_provenance
from draftline.planning.rule_params import check_job_environment
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to
from draftline.stages.evaluate import EvaluateSettings, evaluate_sets

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    check_job_environment(  # device, torch build, pins
        snakemake.params.planned, snakemake.params.versions, snakemake.params.device_setting.value
    )
    sets = dict(snakemake.params.sets)  # name -> file, in the configured order (the outputs' order)
    evaluate_sets(
        str(snakemake.params.target_dir),
        sets,
        ("trained", snakemake.input.draft),
        dict(zip(sets, snakemake.output.acceptance, strict=True)),
        EvaluateSettings.from_params(snakemake.params, snakemake.threads),
    )
    for out in snakemake.output.acceptance:
        write_provenance(snakemake, sidecar(out))  # results/eval/sets/<set>.provenance.json
