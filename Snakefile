# draftline: train an EAGLE-3 draft model ("speculator") for a target LLM.
#
#   ./draftline snakemake --cores all results/checkpoint/final
#   ./draftline snakemake --cores all preflight     # first: the environment and engines on a few prompts
#
# Stages, one rules file each, in the order data flows through them.

from snakemake.utils import min_version

min_version("9.27")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/target_model.smk"
include: "rules/layer_ids.smk"
include: "rules/prompts.smk"
include: "rules/regenerate.smk"
include: "rules/tokenize.smk"
include: "rules/disk_estimate.smk"
include: "rules/hidden_states.smk"
include: "rules/vocab.smk"
include: "rules/speculator_config.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/report.smk"
include: "rules/lineage.smk"
include: "rules/summary.smk"
include: "rules/preflight.smk"


rule all:
    input:
        all_outputs(),
    default_target: True
