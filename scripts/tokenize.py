"""Conversations -> speculators' arrow dataset with assistant-only loss masks (see draftline.tokenization)."""

import logging

from draftline.provenance import write_provenance
from draftline.tokenization import TokenizeSettings, tokenize

if __name__ == "__main__":
    logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    tokenize(
        snakemake.input.target,
        snakemake.input.conversations,
        snakemake.output.dataset,
        snakemake.output.token_freq,
        snakemake.output.summary,
        TokenizeSettings(
            max_seq_len=snakemake.params.max_seq_len,
            min_trainable_tokens=snakemake.params.min_trainable_tokens,
            chat_template=snakemake.params.chat_template,
            trust_remote_code=snakemake.params.trust_remote_code,
        ),
    )
    write_provenance(snakemake)  # provenance.json in the artifact folder (issue 4)
