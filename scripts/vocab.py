"""Build the draft vocabulary maps d2t/t2d from assistant-token frequencies (see draftline.stages.vocab)."""

from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.vocab import write_vocab

if __name__ == "__main__":
    log_to(snakemake.log[0])
    write_vocab(
        snakemake.input.token_freq,
        str(snakemake.params.target_dir),
        snakemake.params.draft_vocab_size,
        snakemake.output.d2t,
        snakemake.output.t2d,
        snakemake.output.summary,
        trust_remote_code=snakemake.params.trust_remote_code,
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
