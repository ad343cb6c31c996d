"""The training data a user brings: prompt and conversation files in the formats users have.

A source is a JSONL file, a `.json` list, a `.parquet` file, a `datasets.save_to_disk` folder,
or a hub dataset already in the local `datasets` cache (`hf:ORG/NAME[/CONFIG][:SPLIT]`, read
offline), with rows in one of three shapes: OpenAI `messages`, ShareGPT `conversations`, or a
plain `prompt`, any of them with tools, tool calls and results, and an assistant's thinking.
Read by the prompts stage (training data), by evaluation (`evaluate.prompt_sets`) and by the
plan (the first rows checked, the rows counted).

One module per idea:
- spec: what a `prompts.sources` entry names (a path, `hf:ORG/NAME[/CONFIG][:SPLIT]`), whether it is there
- errors: a row as read (RawRow) and the errors that name the source, row and fix (PromptError, BadRow)
- formats: the formats and which one a source is (Format, format_of); a new format goes there
- json_files: JSONL and `.json` lists, draftline's own reader (line-numbered errors, a file's head)
- parquet: Parquet files (pyarrow)
- datasets_library: `datasets`, imported only for the two sources below, quiet and offline
- dataset_folder: save_to_disk folders (`datasets.load_from_disk`)
- hub: `hf:` datasets from the local cache (`datasets.load_dataset`, the hub offline)
- conversation: a row in any shape as validated messages + tools, its id (normalize_conversation, conversation_id)
- tools: `tools` and `tool_calls` validated; turn_order: the order of the turns
- check: the plan's check of the first rows (check_sources)
- read: rows, files and counts for the stages and the plan (read_source, source_files, count_rows, read_first_turns)
- stats: what the prompts stage counts per source (SourceStats)
"""

from draftline.sources.check import CHECKED_ROWS, check_sources
from draftline.sources.conversation import (
    ROLES,
    ROW_FIELDS,
    Conversation,
    conversation_id,
    normalize_conversation,
    normalize_row,
)
from draftline.sources.errors import BadRow, PromptError, RawRow, row_error, where
from draftline.sources.formats import Format, format_of
from draftline.sources.read import count_rows, read_first_turns, read_source, source_files
from draftline.sources.spec import HUB_PREFIX, HubSource, hub_source
from draftline.sources.stats import SourceStats

__all__ = [
    "CHECKED_ROWS", "HUB_PREFIX", "ROLES", "ROW_FIELDS", "BadRow", "Conversation", "Format", "HubSource",
    "PromptError", "RawRow", "SourceStats", "check_sources", "conversation_id", "count_rows", "format_of",
    "hub_source", "normalize_conversation", "normalize_row", "read_first_turns", "read_source", "row_error",
    "source_files", "where",
]
