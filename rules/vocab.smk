# The draft's reduced vocabulary: the most frequent assistant tokens (speculators' builder).


rule vocab:
    input:
        token_freq=rules.tokenize.output.token_freq,
        target=target_input(),
    output:
        d2t="results/vocab/d2t.npy",
        t2d="results/vocab/t2d.npy",
        summary="results/vocab/summary.json",
    log:
        "logs/vocab.log",
    benchmark:
        "results/benchmarks/vocab.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.vocab", script="vocab"),
        target=TARGET_IDENTITY,
        target_dir=TARGET_PATH,
        versions=versions("speculators", "torch"),
        draft_vocab_size=config["vocab"]["draft_vocab_size"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/vocab.py"
