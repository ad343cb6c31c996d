"""One page per run: `results/summary.md` and `results/summary.json`, read from what the stages wrote.

What it holds: the run's name and target, data counts (prompts, regenerated answers, tokenized
rows and tokens), each prompt source's rows read, kept, duplicated and rejected (with the
reasons), truncation shares (answers cut at regenerate.max_new_tokens, conversations cut at
tokenize.max_seq_len), disk used per results folder, stage wall times (Snakemake's benchmark
files, longest first), the published epoch (counted from 1, as in every log) and the samples the
Trainer skipped without hidden states, acceptance per prompt set (trained vs untrained draft, per
position), the hidden-state fidelity check (draftline.fidelity, from the checkpoint's
provenance), warnings a user should act on, and notes (facts of the setup, e.g. a speed-up
below 1 on the CPU, where nothing is to be done).
Nothing here is measured again: every figure names the file it comes from.

One module per part of the page:
- records: what it reads of the stages' files (disk used, wall times, acceptance, the fidelity
  record, answers cut while repeating themselves)
- build: the summary as a dict, each section with its warnings and notes (build_summary)
- page: summary.md's lines (to_markdown) and writing both files (write_summary)
- end_of_run: what a finished run prints last (end_of_run_lines)
"""

from draftline.stages.summary.build import TRUNCATION_WARNING, SummarySettings, build_summary
from draftline.stages.summary.end_of_run import end_of_run_lines, headline
from draftline.stages.summary.page import to_markdown, write_summary
from draftline.stages.summary.records import (
    LOOP_DISTINCT,
    LOOP_WINDOW,
    acceptance_table,
    cut_answers_repeating,
    disk_used,
    folder_bytes,
    hidden_state_fidelity,
    repeats_itself,
    wall_times,
)

__all__ = [
    "LOOP_DISTINCT", "LOOP_WINDOW", "TRUNCATION_WARNING", "SummarySettings", "acceptance_table", "build_summary",
    "cut_answers_repeating", "disk_used", "end_of_run_lines", "folder_bytes", "headline", "hidden_state_fidelity",
    "repeats_itself", "to_markdown", "wall_times", "write_summary",
]
