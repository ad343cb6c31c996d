# Acceptance of the final draft in vLLM's own speculative decoding, one job per prompt set: the
# validation prompts (for choosing settings), the test prompts (the figures to report) and each
# of the user's own prompt sets; an untrained draft of the same config measured on the test set
# is the baseline (a job of its own that training never reruns). Greedy speculative outputs are
# compared with the target's own on every prompt (at most evaluate.lossless_tolerance of a set's
# may differ). `evaluate` gathers them into results/eval/acceptance.json: a new, edited or
# removed set reruns that set's job and this one.

# What every vLLM evaluation job is given (the same settings, so their numbers compare).
EVALUATION_PARAMS = dict(
    num_speculative_tokens=config["evaluate"]["num_speculative_tokens"],
    max_new_tokens=config["evaluate"]["max_new_tokens"],
    max_prompts=config["evaluate"]["max_prompts"],
    per_prompt_counts=config["evaluate"]["per_prompt_counts"],
    batch1_prompts=config["evaluate"]["batch1_prompts"],
    lossless_tolerance=config["evaluate"]["lossless_tolerance"],
    seed=config["evaluate"]["seed"],
    target=TARGET_IDENTITY,
    target_dir=TARGET_PATH,
    # the engine settings (one object; engine_outputs: those that can change outputs; device
    # and dtype as planned: a job elsewhere stops)
    **PLAN.vllm_engine(),
    # how vLLM splits the target (a change reruns: float reductions change)
    parallel=PLAN.vllm_parallel,
    versions=versions("vllm", "speculators", "torch", "transformers"),
    # the config's `device` as written, for the environment check (not compared: DEVICE_SETTING)
    device_setting=DEVICE_SETTING,
    chat_template=config["target"]["chat_template"],
    chat_template_kwargs=config["target"]["chat_template_kwargs"],
    trust_remote_code=config["target"]["trust_remote_code"],
)


wildcard_constraints:
    prompt_set="|".join(EVALUATION_SETS.names()),


localrules:
    evaluate,


if not config["evaluate"]["sets_in_one_job"]:

    rule evaluate_set:
        input:
            target=target_input(),
            # the set's file (a dataset folder's files), so an edit reruns this set only
            prompts=EVALUATION_SETS.files,
            draft=rules.train.output[0],
        output:
            acceptance="results/eval/sets/{prompt_set}.json",
        log:
            "logs/evaluate/{prompt_set}.log",
        benchmark:
            "results/benchmarks/evaluate/{prompt_set}.tsv"
        conda:
            "../envs/gpu.yaml"
        # one vLLM rank per GPU (VLLM_RANKS, rules/common.smk); on CPU one core per rank, so two sets
        # run side by side on two cores
        threads: VLLM_RANKS
        resources:
            gpu=VLLM_RANKS,
            nodes=ONE_NODE,
        params:
            code=code("stages.evaluate", script="evaluate_set"),
            # the set's file as configured (relative to the working folder)
            source=EVALUATION_SETS.source,
            **EVALUATION_PARAMS,
        script:
            "../scripts/evaluate_set.py"


else:  # evaluate.sets_in_one_job: each engine starts once for every set; the same records
    from types import SimpleNamespace  # a set's name as the per-set input functions read it

    rule evaluate_sets:
        input:
            target=target_input(),
            prompts=[EVALUATION_SETS.files(SimpleNamespace(prompt_set=name)) for name in EVALUATION_SETS.names()],
            draft=rules.train.output[0],
        output:
            acceptance=EVALUATION_SETS.records(),
        log:
            "logs/evaluate/sets.log",
        benchmark:
            "results/benchmarks/evaluate/sets.tsv"
        conda:
            "../envs/gpu.yaml"
        threads: VLLM_RANKS
        resources:
            gpu=VLLM_RANKS,
            nodes=ONE_NODE,
        params:
            code=code("stages.evaluate", script="evaluate_sets"),
            sets={name: EVALUATION_SETS.source(SimpleNamespace(prompt_set=name)) for name in EVALUATION_SETS.names()},
            **EVALUATION_PARAMS,
        script:
            "../scripts/evaluate_sets.py"


rule evaluate_baseline:
    input:
        target=target_input(),
        test=rules.prompts.output.test,
        validation=rules.prompts.output.validation,
        config=rules.speculator_config.output[0],
        d2t=rules.vocab.output.d2t,
        t2d=rules.vocab.output.t2d,
    output:
        acceptance="results/eval/untrained_draft.json",
        # the baseline: fresh weights from results/config with the same d2t/t2d
        untrained=directory("results/eval/untrained_draft"),
    log:
        "logs/evaluate/untrained_draft.log",
    benchmark:
        "results/benchmarks/evaluate_baseline.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: VLLM_RANKS
    resources:
        gpu=VLLM_RANKS,
        nodes=ONE_NODE,
    params:
        code=code("stages.evaluate", script="evaluate_baseline"),
        **EVALUATION_PARAMS,
    script:
        "../scripts/evaluate_baseline.py"


rule evaluate:
    input:
        sets=EVALUATION_SETS.records(),
        baseline=rules.evaluate_baseline.output.acceptance,
    output:
        acceptance=report(
            "results/eval/acceptance.json",
            caption="../report/acceptance_json.rst",
            category="Evaluation",
        ),
    log:
        "logs/evaluate.log",
    conda:
        "../envs/gpu.yaml"
    params:
        code=code("stages.evaluate_merge", script="evaluate_merge"),
        sets=EVALUATION_SETS.names(),
    script:
        "../scripts/evaluate_merge.py"
