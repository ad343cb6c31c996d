"""The default target `all` on the embedded SmolLM2-135M, end to end (slow: ~25 min on 2 cores).

Real vLLM CPU regeneration and extraction, speculators' preprocessing and Trainer, the default
config; then what the README and docs (pipeline.md, evaluation.md) promise of it: the checkpoint loads in speculators, the draft
beats an untrained one in vLLM's speculative decoding on the test prompts, every speculative
output equals the target's own, and `snakemake --report` writes the five plots.

The run's config is the default with four changes no assertion reads: the hidden states are made
in one shard instead of two (one extraction engine start less; the states are the same rows; the tiny DAG,
conftest.py's tiny_run, splits its own in two and test_resume.py kills one of them), every set is measured in
one job (evaluate.sets_in_one_job: each engine starts once for all sets instead of once per set;
the per-set jobs of the default run in the tiny DAGs of test_algorithms.py, test_reruns.py and
test_slurm.py), one of its three named sets is measured (KEPT_SET), and latency at batch 1 is timed
on fewer prompts (BATCH1_PROMPTS). The other two named sets would repeat the code path on 16 other
prompts; their files are read and fitted here with the run's own tokenizer and settings instead,
test_eval_sets.py reads them as the stage does, and the dry runs of test_evaluate.py and
test_lineage.py plan a job for each set the shipped config names.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow import REPO, load_published_draft, snakemake, write_config

pytestmark = pytest.mark.slow

SHIPPED = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
KEPT_SET = "code"  # the named set this run measures; the others are LEFT_OUT
LEFT_OUT = {name: path for name, path in SHIPPED["evaluate"]["prompt_sets"].items() if name != KEPT_SET}
SETS = {"validation", "test", KEPT_SET}
# Latency at batch 1 is timed on this many prompts of each set, not the schema's 8: no figure asserted
# here reads it (they are the batched call's), and 2 still give it a paired interval.
BATCH1_PROMPTS = 2


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("embedded-default")
    shutil.copytree(REPO / "resources" / "prompts", workdir / "resources" / "prompts")
    evaluate = {**SHIPPED["evaluate"], "prompt_sets": {KEPT_SET: SHIPPED["evaluate"]["prompt_sets"][KEPT_SET]},
                "batch1_prompts": BATCH1_PROMPTS, "sets_in_one_job": True}
    hidden_states = {**SHIPPED["hidden_states"], "shards": 1}
    write_config(workdir, {**SHIPPED, "hidden_states": hidden_states, "evaluate": evaluate})
    snakemake(workdir, "--cores", "all", timeout=3600)  # the default target: all
    report = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "pipeline_wall_time.py"), str(workdir)],
        capture_output=True, text=True, check=True,
    )
    print(report.stdout)
    # CI prints this file after the tests (.ci/run): the stage times on an idle 2-core machine.
    if os.environ.get("DRAFTLINE_CI_RECORDS"):
        records = Path(os.environ["DRAFTLINE_CI_RECORDS"])
        records.mkdir(parents=True, exist_ok=True)
        (records / "pipeline_default.md").write_text(report.stdout)
    return workdir


def test_default_run_produces_a_checkpoint_speculators_loads(default_run):
    from speculators.models.eagle3 import Eagle3DraftModel

    final = default_run / "results/checkpoint/final"
    model = load_published_draft(final)
    assert isinstance(model, Eagle3DraftModel)
    config = json.loads((final / "config.json").read_text())
    assert config["draft_vocab_size"] == 8192
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert model.config.transformer_layer_config.hidden_size == 576
    provenance = json.loads((final / "draftline_provenance.json").read_text())
    epochs = SHIPPED["train"]["epochs"]
    assert provenance["epochs"] == epochs and 1 <= provenance["chosen_epoch"] <= epochs


# The trained draft must beat the untrained one by more than this on the test set: above the
# trained figure's bootstrap half-width in the record (benchmarks/results/default_acceptance.md),
# so a pass is not prompt-sampling noise, and far under the gap the record shows.
MARGIN = 0.05


def test_trained_draft_beats_the_untrained_one_on_the_test_prompts(default_run):
    acceptance = json.loads((default_run / "results/eval/acceptance.json").read_text())
    assert acceptance["headline_set"] == "test" and acceptance["lossless"] is True
    assert set(acceptance["sets"]) == SETS  # per domain too
    test = acceptance["sets"]["test"]
    assert test["prompts"] == 40
    trained, untrained = test["drafts"]["trained"], test["drafts"]["untrained"]
    assert trained["mean_acceptance_length"] > untrained["mean_acceptance_length"] + MARGIN
    # and not by luck of a few prompts: the intervals over the test prompts do not overlap
    assert trained["spread"]["bootstrap_95"][0] > untrained["spread"]["bootstrap_95"][1]
    for name in ("trained", "untrained"):
        assert test["drafts"][name]["counters"]["vllm:spec_decode_num_drafts"] > 0
    # the baseline is measured on the test set only; the trained draft on every set
    for name in SETS - {"test"}:
        assert set(acceptance["sets"][name]["drafts"]) == {"trained"}, name


def test_summary_shows_each_domain_and_no_warning_of_its_own(default_run):
    summary = json.loads((default_run / "results/summary.json").read_text())
    assert {row["set"] for row in summary["acceptance"]} == SETS
    assert summary["warnings"] == [], summary["warnings"]


def test_every_prompt_of_each_named_set_fits_the_runs_evaluation(default_run):
    """The sets this run leaves out (LEFT_OUT) as their jobs would take them: every row read as a
    first-turn prompt, and each with room for its answer in the run's context, by the run's
    tokenizer and its evaluation settings (the measured set's record); the measured sets left no
    prompt out."""
    from transformers import AutoTokenizer

    from draftline.stages.evaluate import EvaluateSettings, fitting_prompts, read_prompts
    from draftline.stages.target_model import EMBEDDED_NAME, TARGET_ROOT

    acceptance = json.loads((default_run / "results/eval/acceptance.json").read_text())
    for name in SETS:
        assert acceptance["sets"][name]["prompts_left_out"] == [], name
    used = json.loads((default_run / f"results/eval/sets/{KEPT_SET}.json").read_text())["settings"]
    settings = EvaluateSettings(max_new_tokens=used["max_new_tokens"], max_model_len=used["max_model_len"],
                                chat_template_kwargs=used["chat_template_kwargs"])
    template = Path(used["chat_template"]).read_text(encoding="utf-8") if used["chat_template"] else None
    tokenizer = AutoTokenizer.from_pretrained(default_run / TARGET_ROOT / EMBEDDED_NAME)
    assert LEFT_OUT
    for name, path in LEFT_OUT.items():
        prompts = read_prompts(default_run / path)
        kept, left_out = fitting_prompts(tokenizer, prompts, settings, template)
        assert len(kept) == len(prompts) >= 16 and not left_out, (name, left_out)


# The quality gate. The recorded default run (benchmarks/results/default_acceptance.json, made by
# benchmarks/record_run.py from `./draftline snakemake --cores all all` on this config) and its 95%
# bootstrap intervals over the 40 test prompts: this run's test-split mean acceptance length and
# position-1 acceptance must fall inside them. The run is deterministic on one machine (greedy
# answers, seeded training), so the band is the prompt-sampling spread the record measured: a
# change that costs more quality than that fails here, and a change that improves on it fails too
# until the record is made again in the same commit (docs/evaluation.md, "The quality gate").
RECORD = REPO / "benchmarks" / "results" / "default_acceptance.json"


def test_quality_gate_the_draft_is_as_good_as_the_record(default_run):
    from draftline.artifacts.acceptance import intervals

    recorded = json.loads(RECORD.read_text())["acceptance"]["sets"]["test"]["drafts"]["trained"]
    band = intervals(recorded["per_prompt"])
    now = json.loads((default_run / "results/eval/acceptance.json").read_text())["sets"]["test"]["drafts"]["trained"]
    low, high = band["bootstrap_95"]
    assert low <= now["mean_acceptance_length"] <= high, (now["mean_acceptance_length"], band)
    low, high = band["acceptance_per_position_bootstrap_95"][0]
    assert low <= now["acceptance_per_position"][0] <= high, (now["acceptance_per_position"], band)


def test_report_html_holds_the_five_plots(default_run):
    out = snakemake(default_run, "--report", "report.html", timeout=600)
    html = (default_run / "report.html").read_text(errors="replace")
    for plot in ("loss", "acceptance", "vocab_coverage", "hidden_states_disk", "wall_times"):
        embedded = re.search(rf"filename={plot}\.png;base64,([A-Za-z0-9+/=]+)", html)
        assert embedded, (plot, out.stderr[-2000:])
        assert base64.b64decode(embedded.group(1)) == (default_run / f"results/report/{plot}.png").read_bytes()
