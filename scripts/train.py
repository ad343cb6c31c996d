"""Train the draft with speculators' Trainer (resuming a cut-short run) and publish final/ (see draftline.stages.train)."""

from dataclasses import replace

from draftline.lineage.provenance import write_provenance
from draftline.planning.rule_params import check_job_environment
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to
from draftline.stages.train import TrainInputs, TrainJob, TrainSettings, check_world_size, train

if __name__ == "__main__":
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    check_job_environment(  # device, torch build, pins
        snakemake.params.planned, snakemake.params.versions, snakemake.params.device_setting.value
    )
    # hidden_states.mode and, online, the server's settings, its fidelity bar and the run's vLLM
    # settings (draftline.stages.train.HiddenStateSource, built by the plan), with the job's server log
    source = replace(snakemake.params.source, server_log=snakemake.log.server)
    online = source.online
    train(
        TrainInputs(
            config_dir=snakemake.input.config,
            dataset=snakemake.input.dataset,
            hidden_states=None if online else snakemake.input.hidden_states,
            d2t=snakemake.input.d2t,
            t2d=snakemake.input.t2d,
            layer_ids=snakemake.input.layer_ids,
            target=str(snakemake.params.target_dir),
            target_identity=snakemake.params.target,  # the plan's, by content: the run key's target
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
                                  source.server_gpus if online else 0),
            trust_remote_code=snakemake.params.trust_remote_code,
            verifier_name=snakemake.params.verifier_name,  # what final/config.json names as the target
        ),
        source=source,
    )
    write_provenance(snakemake)  # provenance.json beside the artifact
