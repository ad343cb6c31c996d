"""Extract one shard of target hidden states with vLLM or transformers (see draftline.hidden_states)."""

import json

from draftline.devices import claim_gpus
from draftline.plan import check_job_environment
from draftline.hidden_states import extract_shard
from draftline.provenance import write_provenance
from draftline.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    check_job_environment(snakemake.params.planned, snakemake.params.versions)  # the device and pins planned
    extract_shard(
        snakemake.input.dataset,
        str(snakemake.params.target_dir),
        json.loads(open(snakemake.input.layer_ids).read()),
        int(snakemake.wildcards.shard),
        snakemake.params.num_shards,
        snakemake.output[0],
        dtype=snakemake.params.planned["dtype"],
        threads=snakemake.threads,
        enforce_eager=snakemake.params.planned["enforce_eager"],
        chunk_rows=snakemake.params.chunk_rows,
        trust_remote_code=snakemake.params.trust_remote_code,
        # hidden_states.backend: "vllm" (default) or "transformers" (draftline.hidden_states_hf)
        backend=snakemake.params.get("backend", "vllm"),
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
