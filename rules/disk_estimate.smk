# The hidden states' expected disk use (bytes per token x tokens), known as soon as the data
# is tokenized: logged, written to disk_estimate.json, and checked against
# hidden_states.max_disk_gb and the row count before any extraction job starts.


rule hidden_states_disk_estimate:
    input:
        summary=rules.tokenize.output.summary,
        dataset=rules.tokenize.output.dataset,  # the rows' lengths, for the max_seq_len that fits
        layer_ids=rules.layer_ids.output[0],
        target=target_input(),
    output:
        "results/hidden_states/disk_estimate.json",
    log:
        "logs/hidden_states/disk_estimate.log",
    benchmark:
        "results/benchmarks/hidden_states_disk_estimate.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.disk_estimate", "planning.config_checks", script="disk_estimate"),
        target=TARGET_IDENTITY,
        target_dir=TARGET_PATH,
        dtype=RESOLVED["engine"]["dtype"],
        shards=config["hidden_states"]["shards"],
        format=config["hidden_states"]["format"],
        # hidden_states.max_disk_gb and the lengths its error names (not compared: PLAN.disk_limit)
        limit=PLAN.disk_limit,
    script:
        "../scripts/disk_estimate.py"
