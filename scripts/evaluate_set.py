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
        snakemake.params.engine.stage(  # the run's vLLM settings (draftline.runtime.vllm_engine.engine_settings)
            EvaluateSettings,
            num_speculative_tokens=snakemake.params.num_speculative_tokens,
            max_new_tokens=snakemake.params.max_new_tokens,
            max_prompts=snakemake.params.max_prompts,
            per_prompt_counts=snakemake.params.per_prompt_counts,
            batch1_prompts=snakemake.params.batch1_prompts,
            seed=snakemake.params.seed,
            chat_template=snakemake.params.chat_template,
            chat_template_kwargs=snakemake.params.chat_template_kwargs,
            threads=snakemake.threads,
        ),
    )
    write_provenance(snakemake, sidecar(snakemake.output.acceptance))  # results/eval/sets/<set>.provenance.json
