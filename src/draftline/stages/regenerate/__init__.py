"""Regenerate every assistant turn with the target itself (vLLM), turn by turn.

The draft learns to predict the *target's* tokens, so the training answers must be the
target's own: for turn t each conversation is sent as system + user turns + the target's own
answers to turns < t (never the dataset's), and the answer replaces the dataset's assistant
turn t. A trailing user turn gets an answer too. Turns are batched across the conversations of
a chunk (all first turns in one `LLM.chat` call, then all second turns, ...), which is what
keeps vLLM busy.

Sharded and resumable, in three rules:
- `write_answer_settings` (rule regenerate_settings, cheap): what decides the answers (target
  identity, generation settings, code, versions, the prompts file by content) and its hash, the
  *answer key*, in `results/regenerated/settings.json`. Tokenization follows this file rather
  than the merged file's mtime, so a new shard count (the same answers) reruns nothing after
  the merge.
- `regenerate_shard` (rule regenerate_shard, one GPU job per shard): the conversations
  `shard_rows(rows, k, shards)` of the prompts file, answered `chunk_conversations` at a time
  through all their turns. Each finished chunk is kept, checked, in
  `results/regenerated/.staging/<answer key>/` (no output, so Snakemake never deletes it): a
  killed job's rerun answers only the conversations no chunk holds, and so does a job of a new
  shard count. Staging of other keys is removed.
- `merge_shards` (checkpoint regenerate_merge, CPU): the shards' rows, streamed in the prompts
  file's order, into `results/regenerated/conversations.jsonl`, their statistics summed, and
  the merged file's sha256 in `conversations.sha256`. Tokenization follows that file (and the
  answer key), so it reruns when the merge wrote other answers and not when it wrote the same.

An answer is meant not to depend on the shard or chunk its conversation lands in: each request's
seed is a function of the conversation's index in the prompts file and the turn, and greedy
decoding on CPU gives the same tokens in any batch. On GPUs vLLM's answers can change with the
batch's composition, so conversations answered again in other batches (a new shard count or
chunk size without their staged chunks) can get other answers: the sha256 then differs and
tokenization reruns.

One module per idea:
- settings: what the step is given (RegenerateSettings)
- conversation: a prompts-stage row being answered (parse_conversation, read_conversations)
- tool_calls: the target's tool calls, read with vLLM's tool parser (ToolCalls)
- answering: the rounds of `LLM.chat`, each prompt rendered to fit max_model_len (answer_conversations)
- counters: each conversation's counters and their sums, the progress in the log (COUNTERS, Answered)
- files: a shard folder's files, JSON published atomically (SHARD_CONVERSATIONS, SHARD_SUMMARY)
- answer_key: settings.json and its hash (write_answer_settings, read_answer_settings)
- staging: the finished chunks kept across a killed job (Staging, StagedChunkError)
- shard: one shard answered and published (regenerate_shard)
- merge: the shards merged, the merged file's sha256 (merge_shards, write_answers_digest)
- unsharded: every conversation in one process, nothing staged (regenerate)
"""

from draftline.stages.regenerate.answer_key import read_answer_settings, write_answer_settings
from draftline.stages.regenerate.answering import END_OF_TURN_ROOM, answer_conversations
from draftline.stages.regenerate.conversation import ROLES, Conversation, parse_conversation, read_conversations
from draftline.stages.regenerate.counters import COUNTERS, Answered
from draftline.stages.regenerate.files import SHARD_CONVERSATIONS, SHARD_SUMMARY
from draftline.stages.regenerate.merge import merge_shards, write_answers_digest
from draftline.stages.regenerate.settings import RegenerateSettings
from draftline.stages.regenerate.shard import regenerate_shard
from draftline.stages.regenerate.staging import StagedChunkError, Staging
from draftline.stages.regenerate.tool_calls import ToolCalls
from draftline.stages.regenerate.unsharded import regenerate

__all__ = [
    "COUNTERS", "END_OF_TURN_ROOM", "ROLES", "SHARD_CONVERSATIONS", "SHARD_SUMMARY", "Answered", "Conversation",
    "RegenerateSettings", "StagedChunkError", "Staging", "ToolCalls", "answer_conversations", "merge_shards",
    "parse_conversation", "read_answer_settings", "read_conversations", "regenerate", "regenerate_shard",
    "write_answer_settings", "write_answers_digest",
]
