# Acceptance of the final draft in vLLM's own speculative decoding (eagle3), on the validation
# prompts (for choosing settings), the test prompts (the figures to report) and the user's own
# prompt sets, against an untrained draft of the same config measured in the same job; greedy
# speculative outputs must equal the target's own (checked on every prompt).


rule evaluate:
    input:
        target=target_input(),
        validation=rules.prompts.output.validation,
        test=rules.prompts.output.test,
        prompt_sets=evaluation_prompt_set_files(),
        draft=rules.train.output[0],
        config=rules.speculator_config.output[0],
        d2t=rules.vocab.output.d2t,
        t2d=rules.vocab.output.t2d,
    output:
        acceptance=report(
            "results/eval/acceptance.json",
            caption="../report/acceptance_json.rst",
            category="Evaluation",
        ),
        # the baseline: fresh weights from results/config with the same d2t/t2d
        untrained=directory("results/eval/untrained_draft"),
    log:
        "logs/evaluate.log",
    benchmark:
        "results/benchmarks/evaluate.tsv"
    conda:
        "../envs/gpu.yaml"
    # one vLLM rank per GPU (VLLM_RANKS, rules/common.smk); on CPU one core per rank (1 measured
    # fastest on 2 shared cores)
    threads: VLLM_RANKS
    resources:
        gpu=VLLM_RANKS,
        nodes=ONE_NODE,
    params:
        code=code("stages.evaluate", script="evaluate"),
        num_speculative_tokens=config["evaluate"]["num_speculative_tokens"],
        max_new_tokens=config["evaluate"]["max_new_tokens"],
        max_prompts=config["evaluate"]["max_prompts"],
        seed=config["evaluate"]["seed"],
        # as configured (name -> path relative to the working folder); the files are inputs
        prompt_sets=config["evaluate"]["prompt_sets"],
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
    script:
        "../scripts/evaluate.py"
