"""Estimate the hidden states' disk use before extraction; stop at hidden_states.max_disk_gb."""

from draftline.disk import write_estimate
from draftline.provenance import write_provenance
from draftline.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    write_estimate(
        snakemake.input.summary,
        snakemake.input.layer_ids,
        str(snakemake.params.target_dir),
        snakemake.params.dtype,
        snakemake.params.shards,
        snakemake.output[0],
        # Read from the config, not a param: a new limit must not rerun (re-extract) the shards;
        # common.smk checks a changed limit against an existing estimate at parse time.
        max_disk_gb=snakemake.config["hidden_states"].get("max_disk_gb"),
        format=snakemake.params.format,
        dataset_dir=snakemake.input.dataset,
        # for the settings that would fit (named in the error); not params: they decide no estimate
        max_seq_len=snakemake.config["tokenize"]["max_seq_len"],
        total_seq_len=(snakemake.config["train"]["total_seq_len"]  # hidden_states.mode online's working set
                       if "mode" in snakemake.config["hidden_states"] else None),
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
