# Training, validation and test conversations: every source read, validated, de-duplicated
# and split (validation first, then test, off one seeded order; training is the rest).


rule prompts:
    input:
        # The files themselves (a dataset folder's files too), so an edited source reruns the job.
        sources=source_files(config["prompts"]["sources"]),
    output:
        prompts="results/prompts/prompts.jsonl",
        validation="results/prompts/validation.jsonl",
        test="results/prompts/test.jsonl",
        rejects="results/prompts/rejects.jsonl",
        summary="results/prompts/summary.json",
    log:
        "logs/prompts.log",
    benchmark:
        "results/benchmarks/prompts.tsv"
    conda:
        "../envs/gpu.yaml"
    params:
        code=code("stages.prompts", script="prompts"),
        # As configured (paths relative to the workflow folder); each row's "source" is this string.
        sources=config["prompts"]["sources"],
        validation=config["prompts"]["validation"],
        test=config["prompts"]["test"],
        max_samples=config["prompts"]["max_samples"],
        on_bad_row=config["prompts"]["on_bad_row"],
        leading_assistant_turn=config["prompts"]["leading_assistant_turn"],
        regenerate_enabled=config["regenerate"]["enabled"],
        seed=config["prompts"]["seed"],
    script:
        "../scripts/prompts.py"
