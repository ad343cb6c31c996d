"""Write results/regenerated/settings.json: what decides the answers and its hash (see draftline.stages.regenerate)."""

from draftline.lineage.provenance import sidecar, write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.regenerate import write_answer_settings

if __name__ == "__main__":
    log_to(snakemake.log[0])
    answers = dict(snakemake.params.items())
    also = {"merge_code": answers.pop("merge_code")}  # recorded, but it decides no answer
    write_answer_settings(snakemake.input.conversations, snakemake.output[0], answers, also)
    write_provenance(snakemake, sidecar(snakemake.output[0]))  # the folder's provenance.json is the merge's
