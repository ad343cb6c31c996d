# Target hidden states for training: vLLM's extract_hidden_states method, one job per shard
# of contiguous dataset rows, then one folder of links the Trainer reads as a whole.
# Validated files survive a killed shard job in results/hidden_states/.staging/ (not an
# output, so Snakemake does not delete it before the rerun).


rule hidden_states_shard:
    input:
        dataset=rules.tokenize.output.dataset,
        target=target_input(),
        layer_ids=rules.layer_ids.output[0],
        disk_estimate=rules.hidden_states_disk_estimate.output[0],  # stops here when over max_disk_gb
    output:
        hidden_states_output("results/hidden_states/shard_{shard}"),
    log:
        "logs/hidden_states/shard_{shard}.log",
    benchmark:
        "results/benchmarks/hidden_states/shard_{shard}.tsv"
    conda:
        "../envs/gpu.yaml"
    # one vLLM rank per GPU (VLLM_RANKS, rules/common.smk); on CPU one core per rank, so two
    # unsplit shards run side by side on a 2-core machine
    threads: VLLM_RANKS
    resources:
        gpu=VLLM_RANKS,
        nodes=ONE_NODE,
    params:
        code=code("stages.hidden_states", script="hidden_states"),
        backend=config["hidden_states"]["backend"],
        format=config["hidden_states"]["format"],  # full or fp8 (speculators' FP8 layout)
        num_shards=config["hidden_states"]["shards"],
        target=TARGET_IDENTITY,
        target_dir=TARGET_PATH,
        # the engine settings (one object; engine_outputs: those that can change the states; device
        # and dtype as planned). The engine's context is the longest row's, not vllm.max_model_len.
        **PLAN.vllm_engine(without=("max_model_len",)),
        # how vLLM splits the target (a change re-extracts: float reductions change)
        parallel=PLAN.extraction_parallel(config["hidden_states"]["backend"]),
        versions=versions("vllm", "torch", "transformers"),
        # the config's `device` as written, for the environment check (not compared: DEVICE_SETTING)
        device_setting=DEVICE_SETTING,
        trust_remote_code=config["target"]["trust_remote_code"],
        chunk_rows=64,
        # checked before the shard is published (draftline.fidelity); not part of staleness
        fidelity=PLAN.fidelity,
    script:
        "../scripts/hidden_states.py"


rule hidden_states_view:
    input:
        shards=hidden_state_shards(),
    output:
        hidden_states_output("results/hidden_states/all"),
    log:
        "logs/hidden_states/view.log",
    benchmark:
        "results/benchmarks/hidden_states_view.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.hidden_states", script="hidden_states_view"),
    script:
        "../scripts/hidden_states_view.py"
