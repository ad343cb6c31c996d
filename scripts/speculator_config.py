"""Write the eagle3 speculator config.json the Trainer starts from (see draftline.speculator_config)."""

from draftline.provenance import write_provenance
from draftline.speculator_config import write_speculator_config
from draftline.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    write_speculator_config(
        snakemake.output[0],
        str(snakemake.params.target_dir),
        snakemake.input.layer_ids,
        snakemake.params.draft_vocab_size,
        num_layers=snakemake.params.num_layers,
        ttt_steps=snakemake.params.ttt_steps,
        trust_remote_code=snakemake.params.trust_remote_code,
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
