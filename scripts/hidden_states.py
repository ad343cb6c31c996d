"""Extract one shard of target hidden states with the configured backend (see draftline.stages.hidden_states)."""

from dataclasses import replace

from draftline.lineage.provenance import write_provenance
from draftline.planning.rule_params import check_job_environment
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to
from draftline.runtime.shards import ShardJob
from draftline.stages.hidden_states import ExtractionSettings, extract_shard

if __name__ == "__main__":
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    check_job_environment(  # device, torch build, pins
        snakemake.params.planned, snakemake.params.versions, snakemake.params.device_setting.value
    )
    extract_shard(
        snakemake.input.dataset,
        str(snakemake.params.target_dir),
        snakemake.input.layer_ids,
        ShardJob(int(snakemake.wildcards.shard), snakemake.params.num_shards, snakemake.output[0]),
        replace(snakemake.params.engine, threads=snakemake.threads),  # the run's vLLM settings, the job's threads
        ExtractionSettings(
            backend=snakemake.params.backend,  # hidden_states.backend: a draftline.backends entry
            rows_per_call=snakemake.params.chunk_rows,
            format=snakemake.params.format,  # hidden_states.format: full or fp8
            fidelity=snakemake.params.fidelity,  # hidden_states.fidelity, its bar resolved
            # for the staging key: what the plan hashed (the rest of the rule's params it reads itself)
            plan_key={"code": snakemake.params.code, "target": snakemake.params.target},
        ),
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
