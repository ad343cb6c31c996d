# The draft's reduced vocabulary: the most frequent assistant tokens (speculators' builder).


rule vocab:
    input:
        token_freq="results/tokenized/token_freq.pt",
        target=target_input(),
        code=code("vocab"),
    output:
        d2t="results/vocab/d2t.npy",
        t2d="results/vocab/t2d.npy",
        summary="results/vocab/summary.json",
    log:
        "logs/vocab.log",
    benchmark:
        "results/benchmarks/vocab.tsv"
    threads: 1
    params:
        draft_vocab_size=config["vocab"]["draft_vocab_size"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/vocab.py"
