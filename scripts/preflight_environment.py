"""Preflight, environment part: the GPU node against the plan (see draftline.preflight)."""

from draftline.preflight import EnvironmentPlan, run_environment
from draftline.runtime.devices import GpuClaimError, claim_gpus
from draftline.runtime.logs import log_to

if __name__ == "__main__":
    log_to(snakemake.log[0])
    claim_error = None
    try:
        claim_gpus(snakemake.resources.get("gpu", 0))  # as the vLLM jobs do: Slurm's GPUs, or a free local slot
    except GpuClaimError as error:
        claim_error = str(error)  # reported by the GPU count check
    run_environment(
        str(snakemake.params.target_dir),
        snakemake.output[0],
        EnvironmentPlan.for_engine(
            snakemake.params.engine,  # the run's vLLM settings (parallel sizes, memory share)
            planned=snakemake.params.planned,
            versions=snakemake.params.versions,
            setting=snakemake.params.device_setting.value,  # device: auto/cpu/cuda as configured (not compared)
        ),
        claim_error=claim_error,
        trust_remote_code=snakemake.params.trust_remote_code,
    )
