"""Preflight, regeneration part: the target in vLLM, a few prompts answered, decoded and tokenized
by the stages' own code (see draftline.preflight)."""

from draftline.preflight import Part, PreflightSettings, RegenerationStages, run_regenerate
from draftline.runtime.devices import claim_gpus
from draftline.runtime.logs import log_to
from draftline.stages.evaluate import EvaluateSettings
from draftline.stages.regenerate import RegenerateSettings
from draftline.stages.tokenize import TokenizeSettings

if __name__ == "__main__":  # vLLM spawns worker processes that re-import this file
    log_to(snakemake.log[0])
    claim_gpus(snakemake.resources.get("gpu", 0))  # before CUDA starts: Slurm's GPUs, or a free local slot
    p = snakemake.params
    # the run's vLLM settings (draftline.runtime.vllm_engine.engine_settings) with the job's threads
    template = dict(chat_template=p.chat_template, chat_template_kwargs=p.chat_template_kwargs, threads=snakemake.threads)
    run_regenerate(
        Part(str(p.target_dir), snakemake.input.environment, snakemake.output[0], snakemake.log[0]),
        snakemake.input.prompts,
        RegenerationStages(
            p.engine.stage(
                RegenerateSettings,
                max_new_tokens=p.regenerate["max_new_tokens"],
                temperature=p.regenerate["temperature"],
                top_p=p.regenerate["top_p"],
                seed=p.regenerate["seed"],
                **template,
            ),
            p.engine.stage(
                EvaluateSettings,
                num_speculative_tokens=p.evaluate["num_speculative_tokens"],
                max_new_tokens=p.evaluate["max_new_tokens"],
                seed=p.evaluate["seed"],
                **template,
            ),
            TokenizeSettings(
                max_seq_len=p.max_seq_len,
                min_trainable_tokens=p.min_trainable_tokens,
                trust_remote_code=p.trust_remote_code,
                chat_template=p.chat_template,
                chat_template_kwargs=p.chat_template_kwargs,
            ),
            enabled=p.regenerate["enabled"],
        ),
        PreflightSettings(**p.preflight),
    )
