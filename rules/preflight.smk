# Preflight: `snakemake ... preflight` checks the environment, every engine the run will start
# and its Trainer, on a few prompts, in jobs with the run's own GPU count and settings, before the real
# run (draftline.preflight; docs/cluster.md, "Preflight"). One job per part, each vLLM engine in
# a process of its own; each part records its checks and never fails by itself, the report rule
# gathers them, and the `preflight` rule fails (after the report is written) when one failed,
# removing the failed parts so the next `preflight` runs them again. Not part of `all`.
# The prompts, layer ids and speculator config it reads are the run's own (their rules).


localrules:
    preflight_report,
    preflight,


# What every preflight engine job loads and how: the target as the vLLM rules load it.
PREFLIGHT_TARGET = dict(
    target=TARGET_IDENTITY,
    target_dir=TARGET_PATH,
    # the run's engine settings (one object), device and dtype as planned
    **PLAN.vllm_engine(),
    # all of them, speed-only ones too: the preflight checks that the engine starts and measures its rates
    vllm=config["vllm"],
    parallel=PLAN.vllm_parallel,
    versions=versions("vllm", "torch", "transformers"),
    trust_remote_code=config["target"]["trust_remote_code"],
)
# Where the answers' settings come from (as regenerate_shard and evaluate have them).
PREFLIGHT_DECODING = dict(
    max_seq_len=config["tokenize"]["max_seq_len"],
    chat_template=config["target"]["chat_template"],
    chat_template_kwargs=config["target"]["chat_template_kwargs"],
    evaluate={k: config["evaluate"][k] for k in ("max_new_tokens", "num_speculative_tokens", "seed", "lossless_tolerance")},
)


rule preflight_environment:
    input:
        target=target_input(),
    output:
        directory("results/preflight/environment"),
    log:
        "logs/preflight/environment.log",
    benchmark:
        "results/preflight/benchmarks/environment.tsv"
    conda:
        "../envs/gpu.yaml"
    # the node and GPUs a vLLM job gets (rules/common.smk VLLM_RANKS)
    threads: VLLM_RANKS
    resources:
        gpu=VLLM_RANKS,
        nodes=ONE_NODE,
    params:
        code=code("preflight", script="preflight_environment"),
        **PREFLIGHT_TARGET,
        # the config's `device` as written (not compared: DEVICE_SETTING)
        device_setting=DEVICE_SETTING,
    script:
        "../scripts/preflight_environment.py"


rule preflight_regenerate:
    input:
        target=target_input(),
        environment=rules.preflight_environment.output[0],
        prompts=rules.prompts.output.prompts,
    output:
        directory("results/preflight/regenerate"),
    log:
        "logs/preflight/regenerate.log",
    benchmark:
        "results/preflight/benchmarks/regenerate.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: VLLM_RANKS
    resources:
        gpu=VLLM_RANKS,
        nodes=ONE_NODE,
    params:
        code=code("preflight", script="preflight_regenerate"),
        **PREFLIGHT_TARGET,
        **PREFLIGHT_DECODING,
        regenerate={k: config["regenerate"][k] for k in ("enabled", "max_new_tokens", "seed", "temperature", "top_p")},
        min_trainable_tokens=config["tokenize"]["min_trainable_tokens"],
        preflight=config["preflight"],
    script:
        "../scripts/preflight_regenerate.py"


rule preflight_hidden_states:
    input:
        target=target_input(),
        regenerate=rules.preflight_regenerate.output[0],
        layer_ids=rules.layer_ids.output[0],
    output:
        directory("results/preflight/hidden_states"),
    log:
        "logs/preflight/hidden_states.log",
    benchmark:
        "results/preflight/benchmarks/hidden_states.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: VLLM_RANKS
    resources:
        gpu=VLLM_RANKS,
        nodes=ONE_NODE,
    params:
        code=code("preflight", script="preflight_hidden_states"),
        # the run's target and engine, with extraction's engine outputs and split (as the shards')
        **{
            **PREFLIGHT_TARGET,
            **PLAN.vllm_engine(without=("max_model_len",)),
            "parallel": PLAN.extraction_parallel(config["hidden_states"]["backend"]),
        },
        backend=config["hidden_states"]["backend"],
        format=config["hidden_states"]["format"],
        # the run's fidelity bar (hidden_states.fidelity.min_top1, `auto` resolved as for the shards)
        fidelity_min_top1=PLAN.fidelity.min_top1,
    script:
        "../scripts/preflight_hidden_states.py"


rule preflight_speculative:
    input:
        target=target_input(),
        regenerate=rules.preflight_regenerate.output[0],
        config=rules.speculator_config.output[0],
    output:
        directory("results/preflight/speculative"),
    log:
        "logs/preflight/speculative.log",
    benchmark:
        "results/preflight/benchmarks/speculative.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: VLLM_RANKS
    resources:
        gpu=VLLM_RANKS,
        nodes=ONE_NODE,
    params:
        code=code("preflight", script="preflight_speculative"),
        **PREFLIGHT_TARGET,
        **PREFLIGHT_DECODING,
        draft_vocab_size=config["vocab"]["draft_vocab_size"],
    script:
        "../scripts/preflight_speculative.py"


# One training step of the run's draft config through speculators' Trainer, launched by the train
# stage's own code on the train job's GPUs and threads, on the rows the hidden-state part extracted.
rule preflight_training:
    input:
        target=target_input(),
        regenerate=rules.preflight_regenerate.output[0],
        hidden_states=rules.preflight_hidden_states.output[0],
        config=rules.speculator_config.output[0],
        layer_ids=rules.layer_ids.output[0],
    output:
        directory("results/preflight/training"),
    log:
        "logs/preflight/training.log",
    benchmark:
        "results/preflight/benchmarks/training.tsv"
    conda:
        "../envs/gpu.yaml"
    # the train job's (rules/train.smk)
    threads: 2
    resources:
        # the train job's GPUs, the profile's or --set-resources' train:gpu included (PLAN.train_gpus);
        # the Trainer takes the planned world size of them (online mode's server GPUs stay idle)
        gpu=PLAN.train_gpus,
        nodes=ONE_NODE,
    params:
        code=code("preflight", script="preflight_training"),
        target=TARGET_IDENTITY,
        target_dir=TARGET_PATH,
        train=config["train"],
        # optimizer, loader workers and world size resolved for the planned device (as the train rule's)
        planned=RESOLVED["train"],
        versions=versions("speculators", "torch", "transformers"),
        draft_vocab_size=config["vocab"]["draft_vocab_size"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/preflight_training.py"


PREFLIGHT_PARTS = dict(
    environment=rules.preflight_environment.output[0],
    regenerate=rules.preflight_regenerate.output[0],
    hidden_states=rules.preflight_hidden_states.output[0],
    speculative=rules.preflight_speculative.output[0],
    training=rules.preflight_training.output[0],
)


rule preflight_report:
    input:
        **PREFLIGHT_PARTS,
    output:
        json="results/preflight/report.json",
        markdown="results/preflight/report.md",
    log:
        "logs/preflight/report.log",
    conda:
        "../envs/gpu.yaml"
    params:
        # what the rates were measured under: the sizing uses them for this plan only
        plan=PLAN.preflight_plan,
    script:
        "../scripts/preflight_report.py"


# No output: runs every time it is asked for, prints the report and fails on a failed check.
rule preflight:
    input:
        **PREFLIGHT_PARTS,
        json=rules.preflight_report.output.json,
        markdown=rules.preflight_report.output.markdown,
    log:
        "logs/preflight/verdict.log",
    conda:
        "../envs/gpu.yaml"
    script:
        "../scripts/preflight.py"
