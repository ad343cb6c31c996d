"""Extract one shard of target hidden states with vLLM or transformers (see draftline.hidden_states)."""

import json
import logging

from draftline.devices import claim_gpus
from draftline.hidden_states import extract_shard
from draftline.provenance import write_provenance

if __name__ == "__main__":
    logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    extract_shard(
        snakemake.input.dataset,
        snakemake.input.target,
        json.loads(open(snakemake.input.layer_ids).read()),
        int(snakemake.wildcards.shard),
        snakemake.params.num_shards,
        snakemake.output[0],
        dtype=snakemake.params.dtype,
        threads=snakemake.threads,
        enforce_eager=snakemake.params.enforce_eager,
        chunk_rows=snakemake.params.chunk_rows,
        trust_remote_code=snakemake.params.trust_remote_code,
        # hidden_states.backend: "vllm" (default) or "transformers" (draftline.hidden_states_hf)
        backend=snakemake.params.get("backend", "vllm"),
    )
    write_provenance(snakemake)  # provenance.json in the artifact folder (issue 4)
