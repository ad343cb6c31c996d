"""The plan's checks of the config (at parse time, before any job is planned), so a setting the
target cannot serve, or that cannot work for the data, fails in a second with the key named, not
hours later inside a GPU job. The target's shape and the checks jobs make too are
draftline.settings.target_shape's (imported here under their names)."""

from __future__ import annotations

import logging

from draftline.settings import DraftlineConfig, TargetBlock
from draftline.settings.target_shape import (  # noqa: F401 (the plan's and the tests' names)
    EMBEDDED_SHAPE,
    ConfigError,
    TargetShape,
    check_aux_layer_ids,
    check_draft_vocab,
    check_rows_for_shards,
    shape_from_config,
    target_shape,
)

log = logging.getLogger(__name__)


def check_config(config: dict, shape: TargetShape | None, device: str | None = None) -> None:
    """Config values the target cannot serve, or that cannot work for the data; one ConfigError.

    Only what is knowable from the config (read as its typed blocks: a key left out is its
    default), the planned device and the target's config.json: the rest (rows left after
    tokenization) is checked by the disk_estimate rule before extraction.
    """
    if shape is not None:  # first: a layer id the target lacks is named with the target's depth
        check_target_shape(config, shape)
    typed = DraftlineConfig.model_validate(config)
    hs = typed.hidden_states
    check_parallel(typed.target, hs.backend, device, shape)
    if hs.mode == "online" and hs.format != "full":
        raise ConfigError(
            f"hidden_states.format = {hs.format} with hidden_states.mode = online: the format is how "
            "offline hidden-state files are stored, and online mode stores none (its server's files are "
            "read once and deleted); drop hidden_states.format, or set hidden_states.mode: offline"
        )
    ranks = typed.target.vllm_ranks
    # 0: the server shares the Trainer's first GPUs (a one-GPU machine)
    if hs.mode == "online" and device == "cuda" and hs.online_server_gpus not in (0, ranks):
        raise ConfigError(
            f"hidden_states.online_server_gpus = {hs.online_server_gpus}, but the online server loads the "
            "target as every vLLM engine of the run does, split over target.tensor_parallel_size x "
            f"pipeline_parallel_size = {ranks} GPU(s): set hidden_states.online_server_gpus: {ranks} (or 0 to "
            "share the Trainer's GPUs, or change target.tensor_parallel_size)"
        )
    engine_len, max_seq_len = typed.vllm.max_model_len, typed.tokenize.max_seq_len
    if engine_len is not None and engine_len > max_seq_len and typed.regenerate.enabled:
        raise ConfigError(
            f"vllm.max_model_len = {engine_len} is above tokenize.max_seq_len = {max_seq_len}: regeneration would "
            "write answers that tokenization then cuts (and trains on cut conversations); set vllm.max_model_len "
            f"to at most {max_seq_len}, or null (= tokenize.max_seq_len)"
        )
    shards, max_samples = hs.shards, typed.prompts.max_samples
    if max_samples is not None and shards > max_samples:
        raise ConfigError(
            f"hidden_states.shards = {shards} is more than prompts.max_samples = {max_samples} "
            "training conversations, so some shards would have no rows; lower hidden_states.shards"
        )
    check_batch_fits_a_conversation(typed)


def check_target_shape(config: dict, shape: TargetShape) -> None:
    """Layer ids, draft vocabulary and sequence length the target cannot serve."""
    hs = config["hidden_states"]
    if hs["layer_ids"] != "auto":
        check_aux_layer_ids(hs["layer_ids"], shape.num_hidden_layers, shape.source)
    check_draft_vocab(config["vocab"]["draft_vocab_size"], shape.vocab_size, shape.source)
    max_seq_len = config["tokenize"]["max_seq_len"]
    if shape.max_position_embeddings and max_seq_len > shape.max_position_embeddings:
        raise ConfigError(
            f"tokenize.max_seq_len = {max_seq_len} is above the target's maximum of "
            f"{shape.max_position_embeddings} positions (max_position_embeddings in "
            f"{shape.source}); set it to at most {shape.max_position_embeddings}"
        )


def check_batch_fits_a_conversation(config: DraftlineConfig) -> None:
    """speculators' sampler cuts a sample longer than train.total_seq_len to its first
    total_seq_len tokens (the rest of the conversation is never trained on): below
    tokenize.max_seq_len that is only allowed with train.allow_truncated_samples."""
    total, max_seq_len = config.train.total_seq_len, config.tokenize.max_seq_len
    if total < max_seq_len and not config.train.allow_truncated_samples:
        raise ConfigError(
            f"train.total_seq_len = {total} is below tokenize.max_seq_len = {max_seq_len}: speculators' sampler "
            f"cuts every conversation longer than {total} tokens to its first {total} (their ends are never "
            f"trained on). Set train.total_seq_len to at least {max_seq_len}, or tokenize.max_seq_len to at most "
            f"{total}, or accept the cut with train.allow_truncated_samples: true (the summary counts them)"
        )


def check_parallel(target: TargetBlock, backend: str, device: str | None, shape: TargetShape | None) -> None:
    """target.tensor_parallel_size / pipeline_parallel_size that vLLM (0.32, the pinned build)
    would refuse, or fail on, in the middle of a job."""
    tp, pp = target.tensor_parallel_size, target.pipeline_parallel_size
    if pp > 1 and backend == "vllm":
        raise ConfigError(
            f"target.pipeline_parallel_size = {pp}: vLLM's extract_hidden_states method "
            "(hidden_states.backend: vllm) refuses pipeline parallelism (\"Pipeline parallelism is not "
            "supported for this model\"); split the target with target.tensor_parallel_size instead"
        )
    if pp > 1 and device == "cpu":
        raise ConfigError(
            f"target.pipeline_parallel_size = {pp}: vLLM's CPU build fails with pipeline parallelism "
            "(the second stage's worker stops in its first step); on CPU use target.tensor_parallel_size"
        )
    if shape is None:
        return
    heads, kv_heads = shape.num_attention_heads, shape.num_key_value_heads
    if heads and heads % tp:
        raise ConfigError(
            f"target.tensor_parallel_size = {tp} does not divide the target's {heads} attention heads "
            f"({shape.source}); use a divisor of {heads}"
        )
    # vLLM splits KV heads over the ranks, or replicates them when there are fewer than ranks
    if kv_heads and (kv_heads % tp if tp <= kv_heads else tp % kv_heads):
        raise ConfigError(
            f"target.tensor_parallel_size = {tp} does not fit the target's {kv_heads} key/value heads "
            f"({shape.source}): it must divide them, or be a multiple of them"
        )


def config_notes(config: dict, device: str, vllm_version: str | None = None, aux_layers: int | None = None) -> list[str]:
    """What the plan says before the first job about a config that runs but will stop later: a
    draft type vLLM serves only on GPUs, planned for CPU, trains here and its evaluation stops; a
    draft the plan's pinned vLLM (`vllm_version`, for cuda) would serve unlike it is trained, or
    not load, trains and its evaluation stops (`planned_vllm_problems`; `aux_layers`: the aux
    layers it will read)."""
    from draftline import algorithms

    algorithm = algorithms.get(config["draft"]["algorithm"])
    if device == "cpu" and getattr(algorithm, "not_served_on_cpu", None):
        return [f"note: draft.algorithm {algorithm.name} trains here, but vLLM cannot serve it on CPU "
                f"({algorithm.not_served_on_cpu}): the evaluation jobs will stop; evaluate it on a GPU (docs/cluster.md)"]
    if device == "cuda" and vllm_version and aux_layers is not None:
        settings = algorithms.DraftSettings.from_config(config["draft"])
        return [f"note: draft.algorithm {algorithm.name} trains here, but vLLM {vllm_version} (this plan's pin) would "
                f"serve it {problem}: the evaluation jobs will stop"
                for problem in algorithm.planned_vllm_problems(settings, aux_layers, vllm_version)]
    return []
