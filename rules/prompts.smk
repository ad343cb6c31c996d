# Training and held-out conversations: every source read, validated, de-duplicated and split.
# Proposed for common.smk (fails at parse time, before any job, on a missing/empty source):
#   from draftline.prompts import check_sources, source_files
#   check_sources(config["prompts"]["sources"], config["regenerate"]["enabled"], config["prompts"]["on_bad_row"])


rule prompts:
    input:
        # The files themselves (a dataset folder's files too), so an edited source reruns the job.
        sources=source_files(config["prompts"]["sources"]),
        code=code("prompts"),
    output:
        prompts="results/prompts/prompts.jsonl",
        heldout="results/prompts/heldout.jsonl",
        rejects="results/prompts/rejects.jsonl",
        summary="results/prompts/summary.json",
    log:
        "logs/prompts.log",
    benchmark:
        "results/benchmarks/prompts.tsv"
    params:
        # As configured (paths relative to the workflow folder); each row's "source" is this string.
        sources=config["prompts"]["sources"],
        heldout=config["prompts"]["heldout"],
        max_samples=config["prompts"]["max_samples"],
        on_bad_row=config["prompts"]["on_bad_row"],
        regenerate_enabled=config["regenerate"]["enabled"],
        seed=config["prompts"]["seed"],
    script:
        "../scripts/prompts.py"
