"""Acceptance of an untrained draft of the same config on the headline set in vLLM, the
baseline (see draftline.stages.evaluate)."""

from draftline.lineage.provenance import sidecar, write_provenance
from draftline.planning.rule_params import check_job_environment
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to
from draftline.stages.evaluate import EvaluateSettings, evaluate_baseline, make_untrained_draft

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    check_job_environment(  # device, torch build, pins
        snakemake.params.planned, snakemake.params.versions, snakemake.params.device_setting.value
    )
    make_untrained_draft(
        snakemake.input.config,
        snakemake.input.d2t,
        snakemake.input.t2d,
        snakemake.output.untrained,
        target=str(snakemake.params.target_dir),
        seed=snakemake.params.seed,
    )
    evaluate_baseline(
        str(snakemake.params.target_dir),
        {"test": snakemake.input.test, "validation": snakemake.input.validation},  # the first with prompts
        snakemake.output.untrained,
        snakemake.output.acceptance,
        EvaluateSettings.from_params(snakemake.params, snakemake.threads),
    )
    write_provenance(snakemake, sidecar(snakemake.output.acceptance))  # results/eval/untrained_draft.provenance.json
