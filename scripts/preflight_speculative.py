"""Preflight, speculative part: an untrained draft of the run's config in vLLM's speculative
decoding, lossless against the target's greedy outputs (see draftline.preflight)."""

from draftline.preflight import Part, run_speculative
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to
from draftline.stages.evaluate import EvaluateSettings

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    p = snakemake.params
    run_speculative(
        Part(str(p.target_dir), snakemake.input.regenerate, snakemake.output[0], snakemake.log[0]),
        snakemake.input.config,
        p.engine.stage(  # the run's vLLM settings (draftline.runtime.vllm_engine.engine_settings)
            EvaluateSettings,
            num_speculative_tokens=p.evaluate["num_speculative_tokens"],
            max_new_tokens=p.evaluate["max_new_tokens"],
            seed=p.evaluate["seed"],
            lossless_tolerance=p.evaluate["lossless_tolerance"],
            chat_template=p.chat_template,
            chat_template_kwargs=p.chat_template_kwargs,
            threads=snakemake.threads,
        ),
        draft_vocab_size=p.draft_vocab_size,
        trust_remote_code=p.trust_remote_code,
    )
