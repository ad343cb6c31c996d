# The target's own answers replace the dataset's (turn by turn, greedy by default), so the
# draft learns the distribution it will have to predict. Skipped when regenerate.enabled is false.


rule regenerate:
    input:
        target=target_input(),
        conversations="results/prompts/prompts.jsonl",
    output:
        conversations="results/regenerated/conversations.jsonl",
        summary="results/regenerated/summary.json",
    log:
        "logs/regenerate.log",
    benchmark:
        "results/benchmarks/regenerate.tsv"
    conda:
        "../envs/gpu.yaml"
    # one vLLM rank per GPU (VLLM_RANKS, rules/common.smk); on CPU one core per rank (1 measured
    # fastest on 2 shared cores)
    threads: VLLM_RANKS
    resources:
        gpu=VLLM_RANKS,
    params:
        code=code("regenerate", script="regenerate"),
        max_new_tokens=config["regenerate"]["max_new_tokens"],
        temperature=config["regenerate"]["temperature"],
        top_p=config["regenerate"]["top_p"],
        seed=config["regenerate"]["seed"],
        # prompt + answer must fit what tokenize keeps, so no generated token is cut later
        max_model_len=config["tokenize"]["max_seq_len"],
        target=TARGET_IDENTITY,
        target_dir=TARGET_PATH,
        # device, dtype and eager mode as planned (a job elsewhere stops), and the pinned versions
        planned=RESOLVED["engine"],
        # how vLLM splits the target (a change reruns: float reductions change)
        parallel=vllm_parallel(),
        versions=versions("vllm", "torch", "transformers"),
        chat_template=config["target"]["chat_template"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/regenerate.py"
