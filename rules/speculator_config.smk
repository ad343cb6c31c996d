# The draft's architecture: an eagle3 speculator config.json built the way `speculators train`
# builds one; a folder holding only it makes the Trainer initialise fresh weights.


rule speculator_config:
    input:
        target=target_input(),
        layer_ids=rules.layer_ids.output[0],
    output:
        directory("results/config"),
    log:
        "logs/speculator_config.log",
    benchmark:
        "results/benchmarks/speculator_config.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.speculator_config", script="speculator_config"),
        target=TARGET_IDENTITY,
        target_dir=TARGET_PATH,
        versions=versions("speculators", "transformers"),
        draft_vocab_size=config["vocab"]["draft_vocab_size"],
        # the draft: settings its algorithm reads (a peagle setting does not rerun an eagle3 run)
        draft=draft_settings(config["draft"]),
        ttt_steps=config["train"]["ttt_steps"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/speculator_config.py"
