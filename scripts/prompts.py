"""Read, validate, de-duplicate and split the prompt sources (see draftline.stages.prompts)."""

from draftline.logs import log_to
from draftline.provenance import write_provenance
from draftline.stages.prompts import build_prompts

if __name__ == "__main__":
    log_to(snakemake.log[0])
    build_prompts(
        snakemake.params.sources,
        prompts_path=snakemake.output.prompts,
        validation_path=snakemake.output.validation,
        test_path=snakemake.output.test,
        rejects_path=snakemake.output.rejects,
        summary_path=snakemake.output.summary,
        on_bad_row=snakemake.params.on_bad_row,
        validation=snakemake.params.validation,
        test=snakemake.params.test,
        max_samples=snakemake.params.max_samples,
        seed=snakemake.params.seed,
        regenerate_enabled=snakemake.params.regenerate_enabled,
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
