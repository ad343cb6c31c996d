"""Read, validate, de-duplicate and split the prompt sources (see draftline.stages.prompts)."""

from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.prompts import PromptFiles, PromptsSettings, build_prompts

if __name__ == "__main__":
    log_to(snakemake.log[0])
    build_prompts(
        snakemake.params.sources,
        PromptFiles(**{name: snakemake.output[name] for name in ("prompts", "validation", "test", "rejects", "summary")}),
        PromptsSettings(
            validation=snakemake.params.validation,
            test=snakemake.params.test,
            max_samples=snakemake.params.max_samples,
            on_bad_row=snakemake.params.on_bad_row,
            leading_assistant_turn=snakemake.params.leading_assistant_turn,
            seed=snakemake.params.seed,
            regenerate_enabled=snakemake.params.regenerate_enabled,
        ),
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
