"""Write the speculator config.json the Trainer starts from (see draftline.stages.speculator_config)."""

from draftline.algorithms import DraftSettings
from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.speculator_config import write_speculator_config

if __name__ == "__main__":
    log_to(snakemake.log[0])
    write_speculator_config(
        snakemake.output[0],
        str(snakemake.params.target_dir),
        snakemake.input.layer_ids,
        snakemake.params.draft_vocab_size,
        DraftSettings.from_config(snakemake.params.draft, ttt_steps=snakemake.params.ttt_steps),
        algorithm=snakemake.params.draft["algorithm"],
        trust_remote_code=snakemake.params.trust_remote_code,
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
