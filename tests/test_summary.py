"""results/summary.md and .json: one page per run, read from a finished tiny run's files (a copy)."""

from __future__ import annotations

import json

from workflow import REPO, copy_run


def _stage(run, path):
    return json.loads((run / "results" / path).read_text())


def test_summary_of_a_finished_run(tiny_run, tmp_path):
    from draftline.stages.summary import build_summary, folder_bytes, write_summary

    run = copy_run(tiny_run, tmp_path / "my-run")
    results = run / "results"
    summary = build_summary(results, run_name="my-run", target="tiny-model", device="cpu")
    write_summary(summary, results / "summary.md", results / "summary.json")

    assert json.loads((results / "summary.json").read_text())["run"] == "my-run"
    markdown = (results / "summary.md").read_text()
    assert markdown.splitlines()[0] == "# my-run: draft for tiny-model"

    # counts are the stages' own
    prompts, tokenized = _stage(run, "prompts/summary.json"), _stage(run, "tokenized/summary.json")
    regenerated = _stage(run, "regenerated/summary.json")
    assert summary["data"]["prompts_train"] == prompts["train"]
    assert summary["data"]["tokens"] == tokenized["total_tokens"]
    share = regenerated["answers_truncated"] / regenerated["turns_generated"]
    assert summary["truncation"]["answers_cut_share"] == share
    # the tiny run answers with max_new_tokens 24: most answers are cut (a warning: raise the
    # limit), and on the CPU the trained draft is slower than the target alone (a note: nothing to
    # do on a CPU); both are said, with the file to look at
    assert share > 0.2
    assert any("regenerate.max_new_tokens" in w and f"{share:.0%}" in w for w in summary["warnings"])
    assert any("speed-up below 1" in n for n in summary["notes"])
    assert not any("speed-up" in w for w in summary["warnings"])
    assert "## Warnings" in markdown and "## Notes" in markdown

    # the published epoch, counted from 1 as in the logs
    provenance = _stage(run, "checkpoint/final/draftline_provenance.json")
    folder = provenance.get("chosen_epoch_folder", provenance["chosen_epoch"])
    assert summary["training"]["chosen_epoch"] == int(folder) + 1

    # the hidden-state fidelity the shards passed before training (the tiny run sets its bar: conftest)
    checked = provenance["hidden_states"]["fidelity"]["total"]
    assert summary["hidden_state_fidelity"]["top1_assistant"] == checked["top1_assistant"] >= checked["min_top1"] == 0.3
    assert summary["hidden_state_fidelity"]["rows"] == checked["rows"] > 0
    assert "## Hidden-state fidelity" in markdown and f"{checked['top1_assistant']:.3f} of" in markdown

    # acceptance: trained and untrained on every set, per position k values
    acceptance = _stage(run, "eval/acceptance.json")
    rows = {(r["set"], r["draft"]): r for r in summary["acceptance"]}
    for name, block in acceptance["sets"].items():
        for draft, numbers in block["drafts"].items():
            assert rows[(name, draft)]["mean_acceptance_length"] == numbers["mean_acceptance_length"]
            assert [rows[(name, draft)][f"position_{i + 1}"] for i in range(3)] == numbers["acceptance_per_position"]

    # wall times: every stage's benchmark, longest first; disk: every results folder
    seconds = list(summary["wall_seconds"].values())
    assert seconds == sorted(seconds, reverse=True)
    assert {"train", "evaluate/test", "evaluate_baseline", "regenerate/shard_0", "hidden_states/shard_0"} <= set(summary["wall_seconds"])
    assert summary["disk_bytes"]["hidden_states"] == folder_bytes(results / "hidden_states") > 0
    assert summary["disk_bytes_total"] == sum(summary["disk_bytes"].values())


def test_summary_warns_only_where_it_applies(tiny_run, tmp_path):
    from draftline.stages.summary import build_summary

    run = copy_run(tiny_run, tmp_path / "run")
    path = run / "results/regenerated/summary.json"
    regenerated = json.loads(path.read_text())
    regenerated["answers_truncated"] = regenerated["turns_generated"] // 5  # 20%: not more than
    path.write_text(json.dumps(regenerated))
    summary = build_summary(run / "results", run_name="run", target="t", device="cuda")
    assert not any("max_new_tokens" in w for w in summary["warnings"])
    assert not any("measured on the CPU" in n for n in summary["notes"])


def test_a_speed_up_below_1_is_a_note_on_the_cpu_and_a_warning_on_a_gpu(tmp_path):
    """The CPU record's trained draft decodes at 0.44-0.54 of the target alone: expected on the CPU
    (a note), a reason to act on a GPU (a warning naming each set's figure)."""
    from draftline.stages.summary import build_summary

    stored = json.loads((REPO / "benchmarks/results/default_acceptance.json").read_text())["acceptance"]
    (tmp_path / "results/eval").mkdir(parents=True)
    (tmp_path / "results/eval/acceptance.json").write_text(json.dumps(stored))
    slow = sorted(f"{d['speedup']:.2f} on the {name} set" for name, entry in stored["sets"].items()
                  for draft, d in entry["drafts"].items() if draft == "trained" and d["speedup"] < 1)
    assert slow
    on_cpu = build_summary(tmp_path / "results", run_name="r", target="t", device="cpu", benchmarks=tmp_path / "none")
    on_gpu = build_summary(tmp_path / "results", run_name="r", target="t", device="cuda", benchmarks=tmp_path / "none")
    assert any("measured on the CPU" in n for n in on_cpu["notes"])
    assert not any("speed-up" in w for w in on_cpu["warnings"])
    warning = next(w for w in on_gpu["warnings"] if w.startswith("speed-up below 1 with the trained draft"))
    assert all(figure in warning for figure in slow) and "measured on cuda" in warning
    assert not any("speed-up" in n for n in on_gpu["notes"])


def test_summary_lists_rejected_rows_per_source(tmp_path):
    """prompts.on_bad_row: skip leaves rows out; the run's summary says how many of which source,
    and why, as a warning and in a table per source (read from results/prompts/summary.json)."""
    from draftline.stages.prompts import PromptFiles, PromptsSettings, build_prompts
    from draftline.stages.summary import build_summary, to_markdown

    def source(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return str(path)

    clean = source("clean.jsonl", [{"prompt": f"question {i}"} for i in range(4)])
    scraped = source("scraped.jsonl", [{"prompt": "fine"}, {"text": "renamed"}, {"prompt": ""}, {"text": "again"}])
    results = tmp_path / "results"
    files = PromptFiles(*(results / "prompts" / f"{name}.jsonl" for name in ("prompts", "validation", "test", "rejects")),
                        summary=results / "prompts/summary.json")
    build_prompts([clean, scraped], files, PromptsSettings(validation=0, test=0, on_bad_row="skip"))
    summary = build_summary(results, run_name="r", target="t", device="cpu", benchmarks=tmp_path / "none")
    assert [(s["path"], s["rows_read"], s["kept"], s["rejected"]) for s in summary["sources"]] == [
        (clean, 4, 4, 0), (scraped, 4, 1, 3)]
    assert summary["sources"][1]["rejected_reasons"] == {"empty_content": 1, "unknown_format": 2}
    assert (f"prompts.on_bad_row: skip left out 3 rows: 3 of 4 rows of {scraped} (empty_content: 1, "
            "unknown_format: 2); each with its reason and fix in results/prompts/rejects.jsonl") in summary["warnings"]
    markdown = to_markdown(summary)
    assert "## Prompt sources" in markdown
    assert f"| {scraped} | jsonl | 4 | 1 | 0 | 3 (empty_content: 1, unknown_format: 2) |" in markdown
    assert f"| {clean} | jsonl | 4 | 4 | 0 | 0 |" in markdown


LOOP = "Hope this helps. " * 40
NUMBERED_LOOP = " ".join(f"{i}. **Cherries**" for i in range(1, 60))
PROSE = (
    "Photosynthesis is how plants make food. Leaves take in carbon dioxide from the air and water "
    "from the roots; chlorophyll captures sunlight, which powers reactions that turn these into "
    "glucose and release oxygen. The glucose feeds growth, is stored as starch, or builds cellulose "
    "for cell walls. Animals depend on it too: the oxygen we breathe and most of the energy in our "
    "food began as sunlight caught by a leaf, an alga or a bacterium somewhere in the sea."
)


def test_an_answer_that_loops_is_told_from_one_cut_mid_thought():
    from draftline.stages.summary import repeats_itself

    assert repeats_itself(LOOP) and repeats_itself(NUMBERED_LOOP)
    assert not repeats_itself(PROSE)
    assert not repeats_itself("Paris. " * 10)  # too short to tell: never counted as a loop


def test_truncation_warning_counts_answers_cut_mid_thought_not_loops(tmp_path):
    """Answers cut while looping would not end at any max_new_tokens: the summary counts them
    apart and warns only when the answers cut mid-thought are more than 20%."""
    from draftline.stages.summary import build_summary

    def run(cut_prose: int, cut_loops: int):
        results = tmp_path / f"{cut_prose}-{cut_loops}" / "results"
        (results / "regenerated").mkdir(parents=True)
        answers = [{"content": PROSE, "truncated": True}] * cut_prose + [{"content": LOOP, "truncated": True}] * cut_loops
        answers += [{"content": "Paris."}] * (10 - len(answers))
        rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", **a}]} for a in answers]
        (results / "regenerated/conversations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"turns_generated": 10, "answers_truncated": cut_prose + cut_loops, "settings": {"max_new_tokens": 64}}
        (results / "regenerated/summary.json").write_text(json.dumps(summary))
        return build_summary(results, run_name="r", target="t", device="cpu")

    looping = run(cut_prose=1, cut_loops=5)
    assert looping["truncation"]["answers_cut_repeating"] == 5
    assert looping["truncation"]["answers_cut_at_max_new_tokens"] == 6
    assert not any("max_new_tokens" in w for w in looping["warnings"])
    cut = run(cut_prose=3, cut_loops=1)
    assert any("30% of the regenerated answers (3 of 10)" in w and "1 more cut while repeating" in w for w in cut["warnings"])


def test_the_samples_the_trainer_cut_or_left_out_are_in_the_summary(tmp_path):
    """From the published checkpoint's provenance (train/sampling.py's counts)."""
    from draftline.stages.summary import build_summary, to_markdown

    final = tmp_path / "results/checkpoint/final"
    final.mkdir(parents=True)
    dropped = {"total_seq_len": 512, "world_size": 2, "epochs": 2,
               "training": {"samples": 90, "truncated": 7, "truncated_tokens": 1234, "left_over_per_epoch": [1, 0]},
               "validation": {"samples": 10, "truncated": 1, "truncated_tokens": 40, "left_over_per_epoch": [0, 1]}}
    (final / "draftline_provenance.json").write_text(json.dumps({"epochs": 2, "dropped_samples": dropped}))
    summary = build_summary(tmp_path / "results", run_name="r", target="t", device="cuda", benchmarks=tmp_path / "none")
    assert summary["training"]["dropped_samples"] == dropped
    markdown = to_markdown(summary)
    assert ("| samples cut at train.total_seq_len (512) | 7 of 90 training (1234 tokens never trained on), 1 of 10 "
            "validation |") in markdown
    assert "| samples left out per epoch (2 training process(es)) | training [1, 0], validation [0, 1] |" in markdown


def test_the_summary_names_shards_made_without_the_fidelity_check_and_each_bar(tmp_path):
    """Every shard counts (draftline.fidelity.combine): one without a record is named as not checked,
    and shards checked against different bars show each bar."""
    from draftline.fidelity import combine
    from draftline.stages.summary import build_summary, to_markdown

    def record(bar, basis):
        return {"rows": [0, 4], "assistant_tokens": 100, "top1_assistant": 0.95, "min_top1": bar, "basis": basis}

    total = combine({"results/hidden_states/shard_0": record(0.8, "auto: greedy"),
                     "results/hidden_states/shard_1": record(0.3, "set"),
                     "results/hidden_states/shard_2": None})
    final = tmp_path / "results/checkpoint/final"
    final.mkdir(parents=True)
    (final / "draftline_provenance.json").write_text(json.dumps(
        {"epochs": 1, "hidden_states": {"mode": "offline", "fidelity": {"total": total}}}))
    summary = build_summary(tmp_path / "results", run_name="r", target="t", device="cpu", benchmarks=tmp_path / "none")
    markdown = to_markdown(summary)
    assert "**Not checked** (made without the check): results/hidden_states/shard_2." in markdown
    assert "Bar of results/hidden_states/shard_0: 0.8. Bar of results/hidden_states/shard_1: 0.3." in markdown
    assert "0.950 of 200 assistant positions in 4 rows" in markdown


def _finished_draft(results, epochs=4, chosen=3):
    final = results / "checkpoint/final"
    final.mkdir(parents=True)
    (final / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    (final / "draftline_provenance.json").write_text(json.dumps(
        {"chosen_epoch": chosen, "chosen_epoch_folder": chosen - 1, "epochs": epochs}))
    return final


def test_end_of_run_lines_say_where_the_draft_is_what_it_reached_and_what_to_run_next(tmp_path):
    """The last lines of a run: the checkpoint, the summary's headline (only when the summary was
    written after this draft), and the next command (the rest of the run, or serving it)."""
    import os

    from draftline.stages.summary import end_of_run_lines

    results = tmp_path / "results"
    assert end_of_run_lines(results, "resources/target/tiny") == []  # nothing trained: nothing to say
    final = _finished_draft(results)
    lines = end_of_run_lines(results, "resources/target/tiny")
    assert lines[0] == f"the draft is in {final}/ (epoch 3 of 4, eagle3)"
    assert lines[1].startswith("next: ./draftline snakemake --cores all") and len(lines) == 2

    summary = {"num_speculative_tokens": 3, "acceptance": [
        {"set": "test", "headline": True, "prompts": 40, "draft": "trained", "mean_acceptance_length": 1.642,
         "interval_95": [1.547, 1.744]},
        {"set": "test", "headline": True, "prompts": 40, "draft": "untrained", "mean_acceptance_length": 1.0},
        {"set": "code", "headline": False, "prompts": 20, "draft": "trained", "mean_acceptance_length": 1.3},
    ]}
    (results / "summary.json").write_text(json.dumps(summary))
    lines = end_of_run_lines(results, "org/target")
    assert len(lines) == 3
    assert lines[1] == (f"the test set (40 prompts, k = 3): mean acceptance length 1.64 [1.55, 1.74] with the "
                        f"trained draft, 1.00 untrained ({results}/summary.md)")
    assert lines[2].startswith(f"next: vllm serve org/target --speculative-config '{{\"method\": \"eagle3\", "
                               f"\"model\": \"{final}\", \"num_speculative_tokens\": 3}}'")

    # the summary's warnings: the first, and how many more, before the command to serve the draft
    (results / "summary.json").write_text(json.dumps({**summary, "warnings": ["speed-up below 1 (0.44)", "w2"]}))
    lines = end_of_run_lines(results, "org/target")
    assert lines[2] == f"warning: speed-up below 1 (0.44) (and 1 more); every warning: {results}/summary.md"
    assert lines[3].startswith("next: vllm serve org/target") and len(lines) == 4

    # a summary of an earlier draft is not this one's headline
    provenance = final / "draftline_provenance.json"
    stamp = (results / "summary.json").stat().st_mtime
    os.utime(provenance, (stamp + 10, stamp + 10))
    assert end_of_run_lines(results, "org/target")[1].startswith("next: ./draftline snakemake --cores all")


def test_end_of_run_serve_command_uses_the_algorithms_vllm_method(tmp_path):
    """A P-EAGLE draft is served as vLLM's eagle3 with parallel drafting (draftline.algorithms),
    not under its speculators name."""
    from draftline.stages.summary import end_of_run_lines

    results = tmp_path / "results"
    final = _finished_draft(results)
    (final / "config.json").write_text(json.dumps({"speculators_model_type": "peagle"}))
    summary = {"num_speculative_tokens": 3, "acceptance": [
        {"set": "test", "headline": True, "prompts": 40, "draft": "trained", "mean_acceptance_length": 1.5}]}
    (results / "summary.json").write_text(json.dumps(summary))
    lines = end_of_run_lines(results, "org/target")
    assert lines[0].endswith("(epoch 3 of 4, peagle)")
    assert lines[-1].startswith(f"next: vllm serve org/target --speculative-config '{{\"method\": \"eagle3\", "
                                f"\"model\": \"{final}\", \"num_speculative_tokens\": 3, \"parallel_drafting\": true}}'")


def test_summary_counts_the_reasoning_tokens_apart_when_the_answers_think(tmp_path):
    """tokenize.reasoning: the run's page says how many assistant tokens were thinking and how
    many the rest of the answers, and whether the thinking was trained; a run whose answers
    never think shows neither."""
    from draftline.stages.summary import build_summary, to_markdown

    tokenized = tmp_path / "results" / "tokenized"
    tokenized.mkdir(parents=True)
    for reasoning, thinking in (("exclude", 120), ("train", 0)):
        counts = {"rows": 3, "total_tokens": 400, "trainable_tokens": 80, "reasoning_tokens": thinking,
                  "answer_tokens": 80, "reasoning": reasoning}
        (tokenized / "summary.json").write_text(json.dumps(counts))
        summary = build_summary(tmp_path / "results", run_name="r", target="t", device="cpu", benchmarks=tmp_path / "none")
        markdown = to_markdown(summary)
        if thinking:
            assert "| reasoning tokens (left out of the loss, tokenize.reasoning: exclude) | 120 |" in markdown
            assert "| answer tokens (besides the reasoning) | 80 |" in markdown
        else:
            assert "reasoning" not in markdown


def test_the_training_rate_says_what_the_first_steps_took(tmp_path):
    """On CUDA a short run's first step (torch.compile) took 41 of its 47 step seconds: the summary
    gives the rate over all steps and the median step's, so the first is not read as the steady rate."""
    from draftline.stages.summary import build_summary, to_markdown

    final = tmp_path / "results/checkpoint/final"
    final.mkdir(parents=True)
    throughput = {"tokens": 187824, "step_seconds": 47.43, "tokens_per_s": 3960.4, "median_step_tokens_per_s": 34001.5}
    (final / "draftline_provenance.json").write_text(json.dumps(
        {"epochs": 4, "optimizer": "muon", "device": "cuda", "world_size": 1, "throughput": throughput}))
    summary = build_summary(tmp_path / "results", run_name="r", target="t", device="cuda", benchmarks=tmp_path / "none")
    assert summary["training"]["median_step_tokens_per_s"] == 34001.5
    assert ("muon on cuda x 1, 3,960 tokens/s over all steps, 34,002 at the median step (the rest: start-up and "
            "compilation steps).") in to_markdown(summary)


def test_the_summary_says_which_sets_had_outputs_unlike_the_targets_and_from_which_token():
    """Outputs that differ within evaluate.lossless_tolerance are not hidden: the page names the
    set, the draft, how many of its prompts and the earliest differing output token."""
    from draftline.stages.summary.page import _lossless_line
    from draftline.stages.summary.records import acceptance_table

    def draft(differing):
        return {"mean_acceptance_length": 2.0, "acceptance_per_position": [0.5, 0.3, 0.2],
                "lossless": {"prompts": 74, "identical": 74 - len(differing), "tolerance": 0.05,
                             "differing": [{"id": f"p{at}", "at": at} for at in differing]}}

    acceptance = {"num_speculative_tokens": 3, "headline_set": "test", "lossless": False,
                  "sets": {"test": {"prompts": 74, "drafts": {"trained": draft([124, 90])}},
                           "validation": {"prompts": 74, "drafts": {"trained": draft([])}}}}
    line = _lossless_line({"lossless": False}, acceptance_table(acceptance))
    assert "test, trained draft: 2 of 74 prompts, first from output token 90" in line and "validation" not in line
    assert _lossless_line({"lossless": True}, acceptance_table(acceptance)).endswith(": True.")
