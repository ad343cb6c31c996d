"""Acceptance of the final draft (and an untrained baseline) in vLLM (see draftline.evaluate)."""

from draftline.devices import claim_gpus
from draftline.plan import check_job_environment
from draftline.evaluate import EvaluateSettings, evaluate, make_untrained_draft
from draftline.logs import log_to
from draftline.provenance import write_provenance

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    check_job_environment(snakemake.params.planned, snakemake.params.versions, snakemake.config["device"])  # device, torch build, pins
    make_untrained_draft(
        snakemake.input.config,
        snakemake.input.d2t,
        snakemake.input.t2d,
        snakemake.output.untrained,
        target=str(snakemake.params.target_dir),
        seed=snakemake.params.seed,
    )
    evaluate(
        str(snakemake.params.target_dir),
        {
            "validation": snakemake.input.validation,
            "test": snakemake.input.test,
            **snakemake.params.prompt_sets,
        },
        {"trained": snakemake.input.draft, "untrained": snakemake.output.untrained},
        snakemake.output.acceptance,
        EvaluateSettings(
            num_speculative_tokens=snakemake.params.num_speculative_tokens,
            max_new_tokens=snakemake.params.max_new_tokens,
            max_prompts=snakemake.params.max_prompts,
            seed=snakemake.params.seed,
            max_model_len=snakemake.params.max_model_len,
            dtype=snakemake.params.planned["dtype"],
            enforce_eager=snakemake.params.planned["enforce_eager"],
            chat_template=snakemake.params.chat_template,
            chat_template_kwargs=snakemake.params.chat_template_kwargs,
            trust_remote_code=snakemake.params.trust_remote_code,
            threads=snakemake.threads,
            **snakemake.params.parallel,  # target.tensor/pipeline_parallel_size
        ),
    )
    write_provenance(snakemake)  # results/eval/provenance.json
