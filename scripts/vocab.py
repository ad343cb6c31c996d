"""Build the draft vocabulary maps d2t/t2d from assistant-token frequencies (see draftline.vocab)."""

import logging

from draftline.provenance import write_provenance
from draftline.vocab import write_vocab

if __name__ == "__main__":
    logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    write_vocab(
        snakemake.input.token_freq,
        snakemake.input.target,
        snakemake.params.draft_vocab_size,
        snakemake.output.d2t,
        snakemake.output.t2d,
        snakemake.output.summary,
        trust_remote_code=snakemake.params.trust_remote_code,
    )
    write_provenance(snakemake)  # provenance.json in the artifact folder (issue 4)
