# Which target layers feed the draft: resolved once, read by extraction, config and training.


rule layer_ids:
    input:
        target=target_input(),
    output:
        "results/target/layer_ids.json",
    log:
        "logs/layer_ids.log",
    benchmark:
        "results/benchmarks/layer_ids.tsv"
    conda:
        "../envs/gpu.yaml"
    params:
        code=code("stages.layer_ids", script="layer_ids"),
        target=TARGET_IDENTITY,
        target_dir=TARGET_PATH,
        versions=versions("transformers"),
        layer_ids=config["hidden_states"]["layer_ids"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/layer_ids.py"
