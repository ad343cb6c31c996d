# Conversations rendered with the target's chat template, assistant-only loss masks, then
# speculators' own preprocessing: the arrow dataset its trainer reads and token_freq.pt.


rule tokenize:
    input:
        target=target_input(),
        conversations=conversations_to_tokenize(),
        # decide when the regenerated conversations changed (their file is ancient): the settings
        # that decide the answers, and the answers' sha256 (after the merge: not for a new shard
        # count that gives the same answers, but for one that gives other answers, as on GPUs)
        regeneration=regeneration_settings(),
        answers=merged_answers(),
    output:
        dataset=directory("results/tokenized/dataset"),
        token_freq="results/tokenized/token_freq.pt",
        summary="results/tokenized/summary.json",
    log:
        "logs/tokenize.log",
    benchmark:
        "results/benchmarks/tokenize.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.tokenize", script="tokenize"),
        target=TARGET_IDENTITY,
        target_dir=TARGET_PATH,
        versions=versions("transformers", "speculators"),
        max_seq_len=config["tokenize"]["max_seq_len"],
        min_trainable_tokens=config["tokenize"]["min_trainable_tokens"],
        reasoning=config["tokenize"]["reasoning"],
        # already baked into the target folder by rule target_model; kept so a change reruns this
        chat_template=config["target"]["chat_template"],
        chat_template_kwargs=config["target"]["chat_template_kwargs"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/tokenize.py"
