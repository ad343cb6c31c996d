"""Answer one shard of the prompts with the target, resuming from staged chunks (see draftline.stages.regenerate)."""

from draftline.lineage.provenance import write_provenance
from draftline.planning.rule_params import check_job_environment
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to
from draftline.runtime.shards import ShardJob
from draftline.stages.regenerate import RegenerateSettings, regenerate_shard

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    check_job_environment(  # device, torch build, pins
        snakemake.params.planned, snakemake.params.versions, snakemake.params.device_setting.value
    )
    regenerate_shard(
        str(snakemake.params.target_dir),
        snakemake.input.conversations,
        snakemake.input.settings,
        ShardJob(int(snakemake.wildcards.shard), snakemake.params.num_shards, snakemake.output[0]),
        snakemake.params.engine.stage(  # the run's vLLM settings (draftline.runtime.vllm_engine.engine_settings)
            RegenerateSettings,
            max_new_tokens=snakemake.params.max_new_tokens,
            temperature=snakemake.params.temperature,
            top_p=snakemake.params.top_p,
            seed=snakemake.params.seed,
            chat_template=snakemake.params.chat_template,
            chat_template_kwargs=snakemake.params.chat_template_kwargs,
            tool_call_parser=snakemake.params.tool_call_parser,
            threads=snakemake.threads,
            chunk_conversations=snakemake.params.chunk_conversations,
        ),
    )
    write_provenance(snakemake)  # provenance.json inside the shard folder
