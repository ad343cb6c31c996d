# Training with speculators' own Trainer: torchrun with one process per GPU on CUDA, the same
# Trainer through narrow CPU shims otherwise. Epoch checkpoints live in
# results/checkpoint/runs/<run key>/ (not an output, so Snakemake keeps them across a killed
# job's rerun, which resumes there); the key changes with any setting or input, so a changed
# run never resumes a stale one, and earlier keys' folders are removed once final/ is published
# (train.keep_old_runs keeps them). final/ is the best-validation epoch (or the last).


rule train:
    input:
        config=rules.speculator_config.output[0],
        d2t=rules.vocab.output.d2t,
        t2d=rules.vocab.output.t2d,
        dataset=rules.tokenize.output.dataset,
        # offline: the extracted files; online: none (the job's own vLLM server makes them)
        hidden_states=[] if ONLINE else rules.hidden_states_view.output[0],
        shards=[] if ONLINE else hidden_state_shards(),  # hidden_states.release_after_training: kept until training is done
        layer_ids=rules.layer_ids.output[0],
        target=target_input(),
    output:
        directory("results/checkpoint/final"),
    log:
        "logs/train.log",
        # hidden_states.mode online: the vLLM server the job starts
        server="logs/train_vllm_server.log",
    benchmark:
        "results/benchmarks/train.tsv"
    conda:
        "../envs/gpu.yaml"
    # torch threads on CPU (AdamW, 1 thread: ~240 tok/s on SmolLM2-135M)
    threads: 2
    resources:
        # 1, plus hidden_states.online_server_gpus in online mode (the server runs in this job)
        gpu=TRAIN_GPUS,
        nodes=ONE_NODE,
    params:
        code=code("stages.train", "stages.train.entry", script="train"),
        train=config["train"],
        target=TARGET_IDENTITY,
        target_dir=TARGET_PATH,
        verifier_name=VERIFIER_NAME,
        trust_remote_code=config["target"]["trust_remote_code"],
        # optimizer, loader workers and world size resolved for the planned device
        planned=RESOLVED["train"],
        versions=versions("speculators", "torch", "transformers"),
        # the config's `device` as written, for the environment check (not compared: DEVICE_SETTING)
        device_setting=DEVICE_SETTING,
        runs_dir="results/checkpoint/runs",
        # offline, or online with the server's settings: `source` (one object, not compared: its start-up
        # wait, the samples the Trainer may skip, the fidelity bar checked on rows the server makes before
        # the Trainer starts, the run's vLLM settings) and `hidden_states`, what decides the server's
        # states (hidden_state_source)
        **PLAN.hidden_state_params(),
    script:
        "../scripts/train.py"
