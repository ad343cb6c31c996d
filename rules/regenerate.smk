# The target's own answers replace the dataset's (turn by turn, greedy by default), so the
# draft learns the distribution it will have to predict. Skipped when regenerate.enabled is false.
# One GPU job per shard of the prompts (regenerate.shards), merged in the prompts file's order.
# Finished chunks survive a killed shard job in results/regenerated/.staging/<answer key>/ (not
# an output, so Snakemake does not delete it): the rerun answers only the rest, and so does a
# run with another shard count.


# What decides the answers: the params of regenerate_settings, which hashes them with the
# prompts file into the answer key. regenerate.shards and chunk_conversations are not among them.
REGENERATE_ANSWERS = dict(
    code=code("stages.regenerate", script="regenerate"),
    max_new_tokens=config["regenerate"]["max_new_tokens"],
    temperature=config["regenerate"]["temperature"],
    top_p=config["regenerate"]["top_p"],
    seed=config["regenerate"]["seed"],
    target=TARGET_IDENTITY,
    # the vLLM settings that can change answers (engine_outputs: max_model_len, prompt + answer,
    # is tokenize.max_seq_len unless vllm.max_model_len, so no generated token is cut later), and
    # device and dtype as planned (a job elsewhere stops)
    **{k: v for k, v in PLAN.vllm_engine().items() if k != "engine"},
    # how vLLM splits the target (a change reruns: float reductions change)
    parallel=PLAN.vllm_parallel,
    versions=versions("vllm", "torch", "transformers"),
    chat_template=config["target"]["chat_template"],
    chat_template_kwargs=config["target"]["chat_template_kwargs"],
    tool_call_parser=config["regenerate"]["tool_call_parser"],
    trust_remote_code=config["target"]["trust_remote_code"],
)


localrules:
    regenerate_settings,


# Cheap: tokenize reads this file (not the merged file's mtime) to know when the answers can
# have changed, so a new shard count alone plans nothing after the merge (whether its answers
# are the same is decided after the merge, by their sha256).
rule regenerate_settings:
    input:
        conversations="results/prompts/prompts.jsonl",
    output:
        "results/regenerated/settings.json",
    log:
        "logs/regenerate/settings.log",
    conda:
        "../envs/gpu.yaml"
    params:
        **REGENERATE_ANSWERS,
        # the merge's code: a fix there reruns what follows, the staged answers stay valid
        merge_code=code("stages.regenerate", script="regenerate_merge"),
    script:
        "../scripts/regenerate_settings.py"


rule regenerate_shard:
    input:
        target=target_input(),
        conversations="results/prompts/prompts.jsonl",
        settings="results/regenerated/settings.json",
    output:
        directory("results/regenerated/shard_{shard}"),
    log:
        "logs/regenerate/shard_{shard}.log",
    benchmark:
        "results/benchmarks/regenerate/shard_{shard}.tsv"
    conda:
        "../envs/gpu.yaml"
    # one vLLM rank per GPU (VLLM_RANKS, rules/common.smk); on CPU one core per rank (1 measured
    # fastest on 2 shared cores)
    threads: VLLM_RANKS
    resources:
        gpu=VLLM_RANKS,
        nodes=ONE_NODE,
    params:
        **REGENERATE_ANSWERS,
        num_shards=config["regenerate"]["shards"],
        chunk_conversations=config["regenerate"]["chunk_conversations"],
        target_dir=TARGET_PATH,
        # the one engine settings object (not compared: its output fields are engine_outputs)
        engine=ENGINE,
        # the config's `device` as written, for the environment check (not compared: DEVICE_SETTING)
        device_setting=DEVICE_SETTING,
    script:
        "../scripts/regenerate.py"


# A checkpoint: tokenize is planned again once the merge has run, and reruns only when the
# answers' sha256 changed (rules/common.smk merged_answers).
checkpoint regenerate_merge:
    input:
        shards=regeneration_shards(),
        settings="results/regenerated/settings.json",
    output:
        conversations="results/regenerated/conversations.jsonl",
        summary="results/regenerated/summary.json",
        # `<sha256>  conversations.jsonl` (sha256sum's format): changes only with the answers
        answers="results/regenerated/conversations.sha256",
    log:
        "logs/regenerate/merge.log",
    benchmark:
        "results/benchmarks/regenerate/merge.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.regenerate", script="regenerate_merge"),
    script:
        "../scripts/regenerate_merge.py"
