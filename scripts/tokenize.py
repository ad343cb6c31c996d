"""Conversations -> speculators' arrow dataset with assistant-only loss masks (see draftline.stages.tokenize)."""

from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.tokenize import TokenizeSettings, tokenize

if __name__ == "__main__":
    log_to(snakemake.log[0])
    tokenize(
        str(snakemake.params.target_dir),
        snakemake.input.conversations,
        snakemake.output.dataset,
        snakemake.output.token_freq,
        snakemake.output.summary,
        TokenizeSettings(
            max_seq_len=snakemake.params.max_seq_len,
            min_trainable_tokens=snakemake.params.min_trainable_tokens,
            reasoning=snakemake.params.reasoning,
            chat_template=snakemake.params.chat_template,
            chat_template_kwargs=snakemake.params.chat_template_kwargs,
            trust_remote_code=snakemake.params.trust_remote_code,
        ),
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
