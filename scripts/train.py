"""Train the draft with speculators' Trainer (resuming a cut-short run) and publish final/ (see draftline.train)."""

from draftline.devices import claim_gpus
from draftline.plan import check_job_environment
from draftline.provenance import write_provenance
from draftline.train import HiddenStateSource, TrainInputs, TrainJob, TrainSettings, check_world_size, train
from draftline.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    check_job_environment(snakemake.params.planned, snakemake.params.versions, snakemake.config["device"])  # device, torch build, pins
    hidden = snakemake.params.hidden_states
    online = hidden["mode"] == "online"
    source = HiddenStateSource(
        mode=hidden["mode"],
        **(
            {"server_gpus": hidden["server_gpus"], "max_seq_len": hidden["max_seq_len"], "dtype": hidden["dtype"],
             # read from the config, not params: neither changes a published checkpoint
             "ready_timeout_s": snakemake.config["hidden_states"]["online_server_timeout_s"],
             "max_skipped_samples": snakemake.config["hidden_states"]["online_max_skipped_samples"],
             "server_log": snakemake.log.server,
             "engine": snakemake.params.engine,  # the run's vLLM settings, as every vLLM job's
             "fidelity": snakemake.params.fidelity}  # hidden_states.fidelity, its bar resolved
            if online else {}
        ),
    )
    train(
        TrainInputs(
            config_dir=snakemake.input.config,
            dataset=snakemake.input.dataset,
            hidden_states=None if online else snakemake.input.hidden_states,
            d2t=snakemake.input.d2t,
            t2d=snakemake.input.t2d,
            layer_ids=snakemake.input.layer_ids,
            target=str(snakemake.params.target_dir),
        ),
        # the optimizer and loader workers the plan resolved (they are params: they decide staleness)
        TrainSettings.from_config(
            {**snakemake.params.train, **{k: snakemake.params.planned[k] for k in ("optimizer", "num_workers")}}
        ),
        TrainJob(
            runs_dir=snakemake.params.runs_dir,
            final_dir=snakemake.output[0],
            threads=snakemake.threads,
            # GPUs the job was given (one torchrun process each, less the online server's); 0 or no CUDA -> CPU
            gpus=check_world_size(snakemake.params.planned, int(snakemake.resources.get("gpu", 0)),
                                  hidden.get("server_gpus", 0) if online else 0),
            trust_remote_code=snakemake.params.trust_remote_code,
            verifier_name=snakemake.params.verifier_name,  # what final/config.json names as the target
        ),
        source=source,
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
