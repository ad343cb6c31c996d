"""Acceptance evaluation (real vLLM CPU on the tiny model) and the report plots/HTML."""

from __future__ import annotations

import base64
import json
import re
import shutil
from collections import Counter as Tally
from pathlib import Path

import numpy as np
import pytest
import yaml
from workflow import REPO, planned_jobs, snakemake, write_config

from draftline.stages.evaluate import (
    ACCEPTED,
    ACCEPTED_PER_POS,
    DRAFT_TOKENS,
    DRAFTS,
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    EvaluateSettings,
    LosslessError,
    Prompt,
    acceptance,
    check_lossless,
    counter_delta,
    read_counters,
)
from draftline.stages.train import name_verifier

K = 3
DRAFT_VOCAB = 64
CANDIDATES = [
    "Why is the sky blue?", "Translate 'cat' to French.", "Hello there, how are you?", "Name a color.",
    "What is 2 + 2?", "Tell me a joke.", "Describe the sea.", "Count to five.", "List three fruits.",
    "What does a CPU do?", "Say hello in Spanish.", "Write a haiku about rain.", "Explain gravity.",
    "How do I boil an egg?", "What is a hash table?", "Give me a tip for sleeping well.",
]


# ---------------------------------------------------------------- no engine


def test_lossless_check_names_the_prompt_whose_output_differs():
    prompts = [Prompt("a1", []), Prompt("b2", []), Prompt("c3", [])]
    reference = [[5, 6, 7], [8, 9, 10, 11], [1]]
    report = check_lossless(prompts, reference, [list(r) for r in reference], "trained")  # identical: passes
    assert report["identical"] == 3 and report["differing"] == []
    with pytest.raises(LosslessError, match=r"trained draft.* 1 of 3 .*'b2', at output token 2"):
        check_lossless(prompts, reference, [[5, 6, 7], [8, 9, 99, 11], [1]], "trained")
    with pytest.raises(LosslessError, match=r"'c3', at output token 1"):  # one output longer
        check_lossless(prompts, reference, [[5, 6, 7], [8, 9, 10, 11], [1, 2]], "untrained")


def test_a_few_differing_outputs_within_the_tolerance_are_counted_and_more_stop_the_job():
    """bfloat16 verification may flip a near-tie: evaluate.lossless_tolerance lets that share of a
    set differ, each one named with the output token it first differs at; more stop the job."""
    prompts = [Prompt(f"p{i}", []) for i in range(20)]
    reference = [[1, 2, 3, 4]] * 20
    one_late = [[1, 2, 3, 4]] * 19 + [[1, 2, 3, 9]]
    report = check_lossless(prompts, reference, one_late, "trained", tolerance=0.05)
    assert report["identical"] == 19 and [(d["id"], d["at"]) for d in report["differing"]] == [("p19", 3)]
    two = [[1, 2, 3, 4]] * 18 + [[1, 9, 3, 4], [1, 2, 3, 9]]
    with pytest.raises(LosslessError, match=r"2 of 20 .*lossless_tolerance 0.05 allows 1.*'p18', at output token 1"):
        check_lossless(prompts, reference, two, "trained", tolerance=0.05)
    with pytest.raises(LosslessError, match="allows 0"):
        check_lossless(prompts, reference, one_late, "trained", tolerance=0.0)


def test_counters_are_read_from_vllm_metric_objects_and_summed_over_engines():
    from vllm.v1.metrics.reader import Counter, Gauge, Vector

    def snapshot(drafts, draft_tokens, accepted, per_pos):
        metrics = [Gauge("vllm:num_requests_running", {}, 1.0)]
        for engine in ("0", "1"):  # two engines: each label set holds half
            labels = {"engine": engine, "model_name": "m"}
            metrics += [
                Counter(DRAFTS, labels, drafts // 2), Counter(DRAFT_TOKENS, labels, draft_tokens // 2),
                Counter(ACCEPTED, labels, accepted // 2), Counter(PROMPT_TOKENS, labels, 10),
                Counter(GENERATION_TOKENS, labels, 20), Vector(ACCEPTED_PER_POS, labels, [p // 2 for p in per_pos]),
            ]
        return read_counters(metrics)

    before = snapshot(10, 30, 8, [6, 2, 0])
    after = snapshot(50, 150, 48, [30, 14, 4])
    assert before[DRAFTS] == 10 and before[ACCEPTED_PER_POS] == [6, 2, 0]
    delta = counter_delta(before, after)
    assert delta[DRAFTS] == 40 and delta[DRAFT_TOKENS] == 120 and delta[ACCEPTED] == 40
    assert delta[ACCEPTED_PER_POS] == [24, 12, 4]
    numbers = acceptance(delta, K)
    assert numbers["mean_acceptance_length"] == pytest.approx(1 + 40 / 40)
    assert numbers["acceptance_rate"] == pytest.approx(40 / 120)
    assert numbers["acceptance_per_position"] == pytest.approx([24 / 40, 12 / 40, 4 / 40])


@pytest.mark.parametrize(
    "bad, message",
    [
        ({DRAFTS: 0, DRAFT_TOKENS: 0, ACCEPTED: 0, ACCEPTED_PER_POS: []}, "no drafts"),
        ({DRAFTS: 10, DRAFT_TOKENS: 30, ACCEPTED: 31, ACCEPTED_PER_POS: [10, 10, 11]}, "disagree"),
        ({DRAFTS: 10, DRAFT_TOKENS: 30, ACCEPTED: 12, ACCEPTED_PER_POS: [8, 3, 0]}, "disagree"),
    ],
)
def test_inconsistent_counters_stop_the_evaluation(bad, message):
    with pytest.raises(RuntimeError, match=message):
        acceptance(bad, K)


def test_both_evaluation_jobs_take_the_evaluate_block_on_the_runs_engine_settings():
    """scripts/evaluate_set.py, evaluate_sets.py and evaluate_baseline.py build their settings with one call."""
    from types import SimpleNamespace

    from draftline.runtime.vllm_engine import EngineSettings

    engine = EngineSettings(dtype="float32", enforce_eager=True)
    params = SimpleNamespace(engine=engine, num_speculative_tokens=3, max_new_tokens=17, max_prompts=5,
                             per_prompt_counts="separate_calls", batch1_prompts=None, lossless_tolerance=0.1, seed=9,
                             chat_template="t.jinja", chat_template_kwargs={"enable_thinking": False})
    settings = EvaluateSettings.from_params(params, threads=4)
    assert (settings.num_speculative_tokens, settings.max_new_tokens, settings.max_prompts, settings.per_prompt_counts,
            settings.batch1_prompts, settings.lossless_tolerance, settings.seed, settings.chat_template,
            settings.chat_template_kwargs, settings.threads) == (
        3, 17, 5, "separate_calls", None, 0.1, 9, "t.jinja", {"enable_thinking": False}, 4)
    assert (settings.dtype, settings.enforce_eager) == ("float32", True)


def test_loss_per_epoch_and_benchmarks(tmp_path):
    from draftline.artifacts.metrics import loss_per_epoch
    from draftline.stages.report import read_benchmarks

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in [
        {"epoch": 0, "global_step": 0, "train": {"loss": 3.0}}, {"epoch": 0, "global_step": 1, "train": {"loss": 1.0}},
        {"epoch": 0, "val": {"loss_epoch": 1.5}}, {"epoch": 1, "global_step": 2, "train": {"loss": 0.5}},
    ]) + "\n{\"epoch\": 1, \"val\": {\"loss_ep")  # a line cut by a kill
    assert loss_per_epoch(metrics) == {0: {"train": 2.0, "val": 1.5}, 1: {"train": 0.5}}
    (tmp_path / "bench" / "report").mkdir(parents=True)
    (tmp_path / "bench" / "hidden_states").mkdir()
    for name, s in [("train", 12.5), ("hidden_states/shard_0", 3.0), ("report/loss", 1.0)]:
        (tmp_path / "bench" / f"{name}.tsv").write_text(f"s\th:m:s\tmax_rss\n{s}\t0:00:{s}\t100\n")
    assert read_benchmarks(tmp_path / "bench") == {"hidden_states/shard_0": 3.0, "train": 12.5}


# ---------------------------------------------------------------- real vLLM, tiny model


def _greedy_first_tokens(model_dir: Path, prompts: list[str]) -> list[int]:
    """The tiny random target repeats its first greedy token; find it per prompt (transformers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    firsts = []
    for prompt in prompts:
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            firsts.append(int(model(ids).logits[0, -1].argmax()))
    return firsts


def _oracle_draft(untrained: Path, out: Path, token: int) -> Path:
    """A draft that always proposes `token`: every draft index maps to it (vLLM scatters the draft
    logits onto target ids and takes the argmax there), zero lm_head so no index is preferred."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(untrained, out)
    tensors = load_file(out / "model.safetensors")
    tensors["lm_head.weight"].zero_()
    tensors["d2t"] = token - torch.arange(tensors["d2t"].numel(), dtype=tensors["d2t"].dtype)  # id = index + d2t
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def evaluation(tiny_model, tmp_path_factory):
    """One evaluate() call: target alone, an oracle draft as "trained", the untrained baseline.

    vLLM's get_metrics() and the engines created are recorded, so tests can compare the JSON
    with what vLLM itself reported.
    """
    import vllm

    import draftline.stages.evaluate as ev
    from draftline.stages.evaluate import measure
    from draftline.stages.speculator_config import write_speculator_config

    tmp = tmp_path_factory.mktemp("evaluate")
    (tmp / "layer_ids.json").write_text(json.dumps({"aux": [2, 4, 5], "extracted": [2, 4, 5, 8], "num_hidden_layers": 8}))
    config = write_speculator_config(tmp / "config", tiny_model, tmp / "layer_ids.json", DRAFT_VOCAB)
    np.save(tmp / "d2t.npy", np.zeros(DRAFT_VOCAB, dtype=np.int64))
    np.save(tmp / "t2d.npy", np.arange(512) < DRAFT_VOCAB)
    untrained = ev.make_untrained_draft(config, tmp / "d2t.npy", tmp / "t2d.npy", tmp / "untrained", target=tiny_model)

    firsts = _greedy_first_tokens(tiny_model, CANDIDATES)
    token, _ = Tally(firsts).most_common(1)[0]
    chosen = [p for p, t in zip(CANDIDATES, firsts, strict=True) if t == token][:4]
    assert len(chosen) >= 2, f"the tiny target's first tokens are all different: {firsts}"
    heldout = tmp / "heldout.jsonl"
    heldout.write_text("".join(
        json.dumps({"id": f"p{i}", "source": "t", "messages": [{"role": "user", "content": p}]}) + "\n"
        for i, p in enumerate(chosen)
    ))
    # a user's own prompt set, in another format (plain prompts), measured beside the test set
    mine = tmp / "mine.jsonl"
    mine.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in chosen[:2]))
    oracle = _oracle_draft(untrained, tmp / "oracle", token)
    # named as a published draft names its target (train.name_verifier): a hub id, not resolvable
    # here; evaluation passes the target itself to vLLM
    name_verifier(oracle / "config.json", PUBLISHED_TARGET)

    readings, engines = [], []
    real_get_metrics, real_create = vllm.LLM.get_metrics, ev.engine_for

    def get_metrics(self):
        metrics = real_get_metrics(self)
        readings.append(metrics)
        return metrics

    def engine_for(target, settings, draft=None):
        engines.append(draft)
        return real_create(target, settings, draft)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm.LLM, "get_metrics", get_metrics)
        mp.setattr(measure, "engine_for", engine_for)  # where evaluate() loads each engine
        summary = ev.evaluate(
            tiny_model, {"test": heldout, "mine": mine}, {"trained": oracle, "untrained": untrained}, tmp / "acceptance.json",
            EvaluateSettings(num_speculative_tokens=K, max_new_tokens=16, max_model_len=256, threads=1),
        )
    written = json.loads((tmp / "acceptance.json").read_text())
    return {"summary": summary, "json": written, "readings": readings, "engines": engines, "target": tiny_model,
            "oracle": oracle, "untrained": untrained, "prompts": chosen, "config": config, "tmp": tmp}


PUBLISHED_TARGET = "acme/not-on-this-machine"


@pytest.mark.dag
def test_a_draft_naming_its_target_by_hub_id_is_served_beside_the_local_target(evaluation):
    config = json.loads((evaluation["oracle"] / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == PUBLISHED_TARGET
    trained = evaluation["json"]["drafts"]["trained"]
    assert trained["counters"][DRAFTS] > 0 and trained["mean_acceptance_length"] > 1


def _sum(metrics, name):
    """Independent of draftline's reader: the plain sum of one vLLM counter over its label sets."""
    values = [m for m in metrics if m.name == name]
    if name == ACCEPTED_PER_POS:
        return [sum(v) for v in zip(*(m.values for m in values), strict=True)] if values else []
    return sum(m.value for m in values)


@pytest.mark.dag
def test_numbers_are_deltas_of_vllm_counters_read_in_this_run(evaluation):
    result, readings = evaluation["json"], evaluation["readings"]
    # in each engine (target alone, then each draft): before/after each set's timed generate (test,
    # then mine), then before/after each of the sets' first evaluate.batch1_prompts prompts alone
    batch1 = sum(min(EvaluateSettings().batch1_prompts, s["prompts"]) for s in result["sets"].values())
    per_engine = 4 + 2 * batch1
    assert len(readings) == 3 * per_engine
    test = result["sets"]["test"]
    runs = [test["target_alone"], test["drafts"]["trained"], test["drafts"]["untrained"]]
    for i, run in enumerate(runs):
        before, after = readings[per_engine * i], readings[per_engine * i + 1]
        for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED, GENERATION_TOKENS, PROMPT_TOKENS):
            assert run["counters"][name] == _sum(after, name) - _sum(before, name), (i, name)
    for name, (b, a) in {"trained": (per_engine, per_engine + 1), "untrained": (2 * per_engine, 2 * per_engine + 1)}.items():
        draft, c = result["drafts"][name], result["drafts"][name]["counters"]
        before = _sum(readings[b], ACCEPTED_PER_POS) or [0] * K
        per_pos = [x - y for x, y in zip(_sum(readings[a], ACCEPTED_PER_POS), before, strict=True)]
        assert c[ACCEPTED_PER_POS] == per_pos
        assert draft["mean_acceptance_length"] == pytest.approx(1 + c[ACCEPTED] / c[DRAFTS])
        assert draft["acceptance_rate"] == pytest.approx(c[ACCEPTED] / c[DRAFT_TOKENS])
        assert draft["acceptance_per_position"] == pytest.approx([n / c[DRAFTS] for n in per_pos])


@pytest.mark.dag
def test_counters_agree_with_independent_relations(evaluation):
    result = evaluation["json"]
    test = result["sets"]["test"]
    outputs = test["output_tokens"]
    assert result["prompts"] == test["prompts"] == len(evaluation["prompts"]) and test["prompt_tokens"] > 0
    assert test["target_alone"]["counters"][DRAFTS] == 0  # no speculation without a draft
    for draft in result["drafts"].values():
        c = draft["counters"]
        assert 0 < c[DRAFTS] and c[ACCEPTED] <= c[DRAFT_TOKENS] <= K * c[DRAFTS]
        assert sum(c[ACCEPTED_PER_POS]) == c[ACCEPTED]
        # lossless: the same tokens come out, and each target step emits 1 + accepted of them
        assert c[GENERATION_TOKENS] == outputs == draft["output_tokens"]
        assert c[PROMPT_TOKENS] == test["prompt_tokens"]
        assert draft["output_tokens_per_s"] > 0
    trained, untrained = result["drafts"]["trained"], result["drafts"]["untrained"]
    # the oracle always proposes the token the tiny target repeats: nearly every draft accepted
    assert trained["mean_acceptance_length"] > 3.0
    assert trained["acceptance_per_position"][0] > 0.9
    assert untrained["mean_acceptance_length"] < trained["mean_acceptance_length"]


@pytest.mark.dag
def test_named_prompt_sets_are_measured_in_the_same_job_and_reported_apart(evaluation):
    result = evaluation["json"]
    assert list(result["sets"]) == ["test", "mine"] and result["headline_set"] == "test"
    mine = result["sets"]["mine"]
    assert mine["prompts"] == 2 and mine["source"].endswith("mine.jsonl")
    assert mine["drafts"]["trained"]["counters"] != result["sets"]["test"]["drafts"]["trained"]["counters"]
    # one engine per draft served both sets (loaded once, not per set)
    assert evaluation["engines"] == [None, evaluation["oracle"], evaluation["untrained"]]
    assert mine["drafts"]["trained"]["mean_acceptance_length"] > 3.0


@pytest.mark.dag
def test_spread_comes_from_vllm_per_request_metrics(evaluation):
    """Each prompt's own acceptance (vLLM's per-request metrics) sums to the set's counters, and
    the bootstrap interval brackets the set's figure."""
    for draft in evaluation["json"]["drafts"].values():
        spread = draft["spread"]
        assert spread is not None and spread["prompts"] == len(evaluation["prompts"])
        low, high = spread["bootstrap_95"]
        assert low <= draft["mean_acceptance_length"] <= high
        per_prompt = spread["per_prompt_mean_acceptance_length"]
        assert per_prompt["min"] <= per_prompt["median"] <= per_prompt["max"]
        assert per_prompt["min"] <= draft["mean_acceptance_length"] <= per_prompt["max"]


@pytest.fixture(scope="module")
def evaluation_in_separate_calls(evaluation):
    """The same evaluation with evaluate.per_prompt_counts: separate_calls: no engine is asked for
    vLLM's per-request metrics; each prompt is counted in a call of its own after the set's batch."""
    import draftline.stages.evaluate as ev

    tmp = evaluation["tmp"]
    out = tmp / "separate_calls" / "acceptance.json"
    out.parent.mkdir()
    ev.evaluate(
        evaluation["target"], {"test": tmp / "heldout.jsonl", "mine": tmp / "mine.jsonl"},
        {"trained": evaluation["oracle"], "untrained": evaluation["untrained"]}, out,
        EvaluateSettings(num_speculative_tokens=K, max_new_tokens=16, max_model_len=256, threads=1,
                         per_prompt_counts="separate_calls"),
    )
    return json.loads(out.read_text())


@pytest.mark.dag
def test_prompts_counted_in_calls_of_their_own_equal_vllms_per_request_metrics(evaluation, evaluation_in_separate_calls):
    """For a vLLM that keeps no per-request metrics (vLLM < 0.29, the vllm0.26 GPU lock): each
    prompt's counts from the counters around its own call are what vLLM's per-request metrics say
    (the same rows, so the same interval and the same paired comparisons), and the set's figure
    is still the batched call's."""
    apart = evaluation_in_separate_calls
    for name, data in evaluation["json"]["sets"].items():
        for draft, block in data["drafts"].items():
            other = apart["sets"][name]["drafts"][draft]
            assert other["per_prompt"] == block["per_prompt"], (name, draft)
            assert other["spread"] == block["spread"] and other["counters"] == block["counters"], (name, draft)
            assert other["per_prompt_counts"] == {"source": "separate_calls", "same_counts_as_batched": True,
                                                  "outputs_unlike_batched": 0}
            assert "per_prompt_counts" not in block  # vLLM's own metrics: nothing to say
        assert apart["sets"][name]["trained_minus_untrained"] == data["trained_minus_untrained"]


def test_one_calls_counters_take_the_shape_of_vllms_per_request_metrics():
    """A call's counter deltas as vLLM's per-request metrics (its acceptance histogram): read back
    by the per-prompt record, they are the same counts."""
    from draftline.artifacts.acceptance import per_prompt, totals
    from draftline.stages.evaluate.counters import request_metrics

    delta = {DRAFTS: 10, DRAFT_TOKENS: 30, ACCEPTED: 13, ACCEPTED_PER_POS: [7, 4, 2], GENERATION_TOKENS: 23, PROMPT_TOKENS: 9}
    metrics = request_metrics(delta, K)
    # 3 steps accepted nothing, 3 one token, 2 two, 2 all three
    assert metrics == {"num_spec_steps": 10, "num_draft_tokens": 30, "num_accepted_draft_tokens": 13,
                       "acceptance_histogram": [3, 3, 2, 2]}
    assert totals(per_prompt(["p0"], [metrics], K)) == {"drafts": 10, "draft_tokens": 30, "accepted": 13,
                                                        "accepted_per_position": [7, 4, 2]}
    # vLLM leaves the per-position counter short when no step reached the later positions
    short = request_metrics({**delta, ACCEPTED: 5, ACCEPTED_PER_POS: [5]}, K)
    assert short["acceptance_histogram"] == [5, 5, 0, 0]


def test_spread_bootstrap_is_seeded_and_brackets_the_pooled_ratio():
    rows = [{"num_accepted_draft_tokens": a, "num_spec_steps": n} for a, n in [(3, 10), (9, 10), (0, 5), (12, 12)]]
    one, two = ev_spread(rows, seed=1), ev_spread(rows, seed=1)
    assert one == two
    pooled = 1 + 24 / 37
    assert one["bootstrap_95"][0] < pooled < one["bootstrap_95"][1]
    assert one["per_prompt_mean_acceptance_length"] == {"min": 1.0, "median": 1.9, "max": 2.0}
    assert ev_spread([None, rows[0]]) is None  # a single prompt has no spread


def ev_spread(rows, seed=0):
    from draftline.stages.evaluate import spread

    return spread(rows, seed=seed)


# ---------------------------------------------------------------- per-prompt counts, paired comparison


def _vllm_request(histogram):
    """vLLM's per-request summary (RequestSpecDecodeMetrics.to_dict) for an acceptance histogram."""
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    metrics = RequestSpecDecodeMetrics.new(len(histogram) - 1)
    for accepted, steps in enumerate(histogram):
        for _ in range(steps):
            metrics.observe(num_draft_tokens=len(histogram) - 1, num_accepted=accepted)
    return metrics.to_dict()


def _rows(spec):
    """A per-prompt block from (id, drafts, accepted per position) triples."""
    from draftline.artifacts.acceptance import COLUMNS

    return {"columns": COLUMNS, "rows": [[i, d, K * d, sum(pos), list(pos)] for i, d, pos in spec]}


def test_per_prompt_counts_are_vllm_per_request_metrics_one_line_each():
    from draftline.artifacts.acceptance import dumps, per_prompt, totals

    requests = [_vllm_request([5, 2, 1, 0]), _vllm_request([0, 0, 0, 4]), _vllm_request([3, 0, 0, 0])]
    block = per_prompt(["a1", "b2", "c3"], requests, K)
    # position i: the steps that accepted more than i drafts
    assert block["rows"] == [["a1", 8, 24, 4, [3, 1, 0]], ["b2", 4, 12, 12, [4, 4, 4]], ["c3", 3, 9, 0, [0, 0, 0]]]
    assert totals(block) == {"drafts": 15, "draft_tokens": 45, "accepted": 16, "accepted_per_position": [7, 5, 4]}
    assert per_prompt(["a1", "b2"], [requests[0], None], K) is None  # one prompt without metrics: no rows
    text = dumps({"sets": {"test": {"drafts": {"trained": {"mean_acceptance_length": 2.0, "per_prompt": block}}}}})
    assert '\n       ["b2", 4, 12, 12, [4, 4, 4]],\n' in text  # a row per line
    assert json.loads(text)["sets"]["test"]["drafts"]["trained"]["per_prompt"] == block


def test_paired_bootstrap_of_identical_drafts_is_zero():
    from draftline.artifacts.acceptance import paired_difference

    block = _rows([("p0", 10, [4, 1, 0]), ("p1", 30, [20, 9, 2]), ("p2", 6, [0, 0, 0]), ("p3", 12, [12, 12, 11])])
    difference = paired_difference(block, json.loads(json.dumps(block)))
    assert difference["prompts"] == 4 and difference["mean_acceptance_length"] == 0.0
    assert difference["bootstrap_95"] == [0.0, 0.0]
    assert difference["acceptance_per_position_bootstrap_95"] == [[0.0, 0.0]] * K
    assert "2000 paired resamples" in difference["bootstrap"]
    one = paired_difference(_rows([("p0", 10, [4, 1, 0])]), _rows([("p0", 10, [2, 0, 0])]))
    assert one["mean_acceptance_length"] == 0.3 and one["bootstrap_95"] is None  # one prompt: no interval


def test_paired_bootstrap_of_a_constant_shift_is_that_shift():
    """B accepts a quarter token more per step on every prompt (at the first position): the
    paired interval is exactly +0.25, however different the prompts are, while the two drafts'
    separate intervals overlap."""
    from draftline.artifacts.acceptance import paired_difference
    from draftline.stages.evaluate import spread

    spec = [("p0", 8, [0, 0, 0]), ("p1", 40, [28, 20, 12]), ("p2", 4, [0, 0, 0]), ("p3", 12, [8, 4, 0]),
            ("p4", 20, [2, 0, 0]), ("p5", 16, [4, 4, 0])]
    a = _rows(spec)
    b = _rows([(i, d, [pos[0] + d // 4, *pos[1:]]) for i, d, pos in reversed(spec)])  # another order: paired by id
    difference = paired_difference(b, a, seed=3)
    assert difference["mean_acceptance_length"] == 0.25 and difference["bootstrap_95"] == [0.25, 0.25]
    assert difference["acceptance_per_position"] == [0.25, 0.0, 0.0]
    assert difference["acceptance_per_position_bootstrap_95"] == [[0.25, 0.25], [0.0, 0.0], [0.0, 0.0]]

    def unpaired(block):
        return spread([{"num_accepted_draft_tokens": r[3], "num_spec_steps": r[1]} for r in block["rows"]], seed=3)["bootstrap_95"]

    (low_a, high_a), (low_b, _) = unpaired(a), unpaired(b)
    assert low_b < high_a and high_a - low_a > 1.0  # the separate intervals cannot tell


def test_one_drafts_intervals_match_the_sets_spread_and_bracket_each_position():
    """The quality gate's band: one draft's intervals over its prompts, the mean's equal to the
    evaluation's own `spread` (the same resamples), each position's around its pooled figure."""
    from draftline.artifacts.acceptance import intervals
    from draftline.stages.evaluate import spread

    spec = [("p0", 8, [1, 0, 0]), ("p1", 40, [28, 20, 12]), ("p2", 4, [0, 0, 0]), ("p3", 12, [8, 4, 0]),
            ("p4", 20, [2, 0, 0]), ("p5", 16, [4, 4, 0]), ("p6", 0, [0, 0, 0])]
    block = _rows(spec)
    result = intervals(block, seed=2)
    assert result["prompts"] == 6  # p6 drafted nothing: no acceptance to count
    assert result["mean_acceptance_length"] == round(1 + 83 / 100, 4)
    assert result["acceptance_per_position"] == [0.43, 0.28, 0.12]
    per_request = [{"num_accepted_draft_tokens": r[3], "num_spec_steps": r[1]} for r in block["rows"]]
    assert result["bootstrap_95"] == spread(per_request, seed=2)["bootstrap_95"]
    for value, (low, high) in zip(result["acceptance_per_position"], result["acceptance_per_position_bootstrap_95"], strict=True):
        assert low < value < high
    with pytest.raises(ValueError, match="too few"):
        intervals(_rows([("p0", 8, [1, 0, 0])]))


def test_paired_comparison_refuses_sets_of_different_prompts():
    from draftline.artifacts.acceptance import paired_difference

    a = _rows([("p0", 10, [1, 0, 0]), ("p1", 10, [1, 0, 0]), ("p2", 10, [1, 0, 0])])
    b = _rows([("p0", 10, [1, 0, 0]), ("p1", 10, [1, 0, 0]), ("q9", 10, [1, 0, 0])])
    with pytest.raises(ValueError, match=r"not measure the same prompts.*only in run A: p2; only in run B: q9"):
        paired_difference(a, b, names=("run A", "run B"))


@pytest.mark.dag
def test_per_prompt_counts_add_up_to_each_sets_counters(evaluation):
    """Every set's every draft keeps its prompts' own counts (vLLM's per-request metrics), in the
    set's prompt order, summing to the set's counters; the trained - untrained difference is
    the paired bootstrap of those rows."""
    from draftline.artifacts.acceptance import paired_difference, totals

    result = evaluation["json"]
    text = (evaluation["tmp"] / "acceptance.json").read_text()
    for name, data in result["sets"].items():
        for draft, block in data["drafts"].items():
            rows, c = block["per_prompt"]["rows"], block["counters"]
            assert [r[0] for r in rows] == data["prompt_ids"], (name, draft)
            assert totals(block["per_prompt"]) == {
                "drafts": c[DRAFTS], "draft_tokens": c[DRAFT_TOKENS], "accepted": c[ACCEPTED],
                "accepted_per_position": c[ACCEPTED_PER_POS],
            }, (name, draft)
            for row in rows:
                assert json.dumps(row) in text  # one line per prompt
        paired = data["trained_minus_untrained"]
        trained, untrained = data["drafts"]["trained"], data["drafts"]["untrained"]
        assert paired == paired_difference(trained["per_prompt"], untrained["per_prompt"], seed=0)
        assert paired["mean_acceptance_lengths"] == [
            round(trained["mean_acceptance_length"], 4), round(untrained["mean_acceptance_length"], 4)
        ]
        low, high = paired["bootstrap_95"]
        assert 0 < low <= paired["mean_acceptance_length"] <= high  # the oracle beats the untrained draft on every resample


@pytest.mark.dag
def test_compare_acceptance_pairs_two_evaluations_and_refuses_other_prompts(evaluation, tmp_path):
    import subprocess
    import sys

    tmp, result = evaluation["tmp"], evaluation["json"]
    script = [sys.executable, str(REPO / "benchmarks" / "compare_acceptance.py")]
    one = tmp / "acceptance.json"
    run = subprocess.run([*script, str(one), str(one), "--draft-b", "untrained", "--json", str(tmp_path / "d.json")],
                         capture_output=True, text=True, check=True)
    paired = result["sets"]["test"]["trained_minus_untrained"]
    low, high = paired["bootstrap_95"]
    assert f"A - B: {paired['mean_acceptance_length']:+.4f}, paired 95% bootstrap [{low}, {high}]" in run.stdout
    assert "position 0:" in run.stdout and f"{len(evaluation['prompts'])} prompts paired by id" in run.stdout
    assert json.loads((tmp_path / "d.json").read_text())["bootstrap_95"] == paired["bootstrap_95"]
    same = subprocess.run([*script, str(one), str(one)], capture_output=True, text=True, check=True)
    assert "A - B: +0.0000, paired 95% bootstrap [0.0, 0.0]" in same.stdout
    # an evaluation whose test set held another prompt in place of the last one
    other = json.loads(one.read_text())
    last = other["sets"]["test"]["drafts"]["trained"]["per_prompt"]["rows"][-1]
    left_out, last[0] = last[0], "another-prompt"
    (tmp_path / "other.json").write_text(json.dumps(other))
    refused = subprocess.run([*script, str(one), str(tmp_path / "other.json")], capture_output=True, text=True)
    assert refused.returncode == 1 and "did not measure the same prompts" in refused.stderr
    assert f"(trained): {left_out}; only in" in refused.stderr and refused.stderr.rstrip().count("another-prompt") == 1


@pytest.mark.dag
def test_baseline_is_measured_in_the_same_run(evaluation):
    result = evaluation["json"]
    # one evaluate() call loaded the target alone, then with each draft, in that order
    assert evaluation["engines"] == [None, evaluation["oracle"], evaluation["untrained"]]
    assert set(result["drafts"]) == {"trained", "untrained"}
    assert result["checkpoints"]["untrained"]["path"] == str(evaluation["untrained"])
    assert len(result["checkpoints"]["trained"]["model_sha256"]) == 64
    assert result["lossless"] is True and result == evaluation["summary"]
    assert result["headline_set"] == "test"
    from draftline.sources import conversation_id

    assert result["sets"]["test"]["prompt_ids"] == [
        conversation_id([{"role": "user", "content": p}]) for p in evaluation["prompts"]
    ]


@pytest.mark.dag
def test_tensor_parallel_evaluation_counts_the_same(evaluation, tiny_model):
    """target.tensor_parallel_size 2 (target and draft split over two vLLM CPU workers): the
    target alone and with the oracle draft, on the test set (two engines)."""
    from draftline.stages.evaluate import evaluate

    tmp = evaluation["tmp"]
    summary = evaluate(
        tiny_model, {"test": tmp / "heldout.jsonl"}, {"trained": evaluation["oracle"]}, tmp / "acceptance_tp2.json",
        EvaluateSettings(num_speculative_tokens=K, max_new_tokens=16, max_model_len=256, threads=2, tensor_parallel_size=2),
    )
    assert summary["lossless"] is True and summary["settings"]["tensor_parallel_size"] == 2
    split, whole = summary["sets"]["test"], evaluation["json"]["sets"]["test"]
    counters = split["drafts"]["trained"]["counters"]
    assert counters[DRAFTS] > 0 and len(counters[ACCEPTED_PER_POS]) == K
    # the same prompts, output tokens and acceptance as the unsplit run
    assert split["prompt_ids"] == whole["prompt_ids"] and split["output_tokens"] == whole["output_tokens"]
    assert counters == whole["drafts"]["trained"]["counters"]
    assert split["drafts"]["trained"]["mean_acceptance_length"] == whole["drafts"]["trained"]["mean_acceptance_length"]


@pytest.mark.dag
def test_untrained_draft_is_a_fresh_draft_of_the_same_config(evaluation):
    import torch
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel

    untrained = evaluation["untrained"]
    model = Eagle3DraftModel.from_pretrained(str(untrained))
    config = json.loads((evaluation["config"] / "config.json").read_text())
    assert model.config.draft_vocab_size == config["draft_vocab_size"] == DRAFT_VOCAB
    assert model.config.eagle_aux_hidden_state_layer_ids == config["eagle_aux_hidden_state_layer_ids"]
    tensors = load_file(untrained / "model.safetensors")
    assert tensors["d2t"].tolist() == [0] * DRAFT_VOCAB
    assert tensors["t2d"].tolist() == (np.arange(512) < DRAFT_VOCAB).tolist()
    assert torch.isfinite(tensors["fc.weight"]).all() and tensors["fc.weight"].std() > 0


# ---------------------------------------------------------------- report (Snakemake)

PLOTS = ["loss", "acceptance", "vocab_coverage", "hidden_states_disk", "wall_times"]


def _fabricate_results(workdir: Path) -> None:
    """What the stages leave for the report rules (small, hand-made, in their formats)."""
    import torch

    r = workdir / "results"
    (r / "checkpoint" / "final").mkdir(parents=True)
    (r / "checkpoint" / "final" / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [
        {"epoch": 0, "global_step": 0, "train": {"loss": 2.0}}, {"epoch": 0, "val": {"loss_epoch": 1.8}},
        {"epoch": 1, "global_step": 1, "train": {"loss": 1.2}}, {"epoch": 1, "val": {"loss_epoch": 1.4}},
    ]))
    (r / "checkpoint" / "final" / "draftline_provenance.json").write_text(
        json.dumps({"run_dir": "results/checkpoint/runs/abc", "chosen_epoch": 1, "val_loss_per_epoch": {"0": 1.8, "1": 1.4}})
    )
    (r / "eval").mkdir()
    drafts = {
        "trained": {"acceptance_per_position": [0.4, 0.2, 0.05], "mean_acceptance_length": 1.65,
                    "spread": {"bootstrap_95": [1.5, 1.8]}},
        "untrained": {"acceptance_per_position": [0.0, 0.0, 0.0], "mean_acceptance_length": 1.0, "spread": None},
    }
    (r / "eval" / "acceptance.json").write_text(json.dumps({
        "num_speculative_tokens": 3, "prompts": 5, "drafts": drafts, "headline_set": "test",
        "sets": {"validation": {"prompts": 4, "drafts": drafts}, "test": {"prompts": 5, "drafts": drafts}},
    }))
    (r / "tokenized").mkdir()
    torch.save({5: 40, 9: 30, 11: 20, 300: 10}, r / "tokenized" / "token_freq.pt")
    (r / "vocab").mkdir()
    (r / "vocab" / "summary.json").write_text(json.dumps({
        "draft_vocab_size": 2, "target_vocab_size": 512, "assistant_tokens": 100, "coverage": 0.7,
    }))
    for shard in (0, 1):
        d = r / "hidden_states" / f"shard_{shard}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({
            "shard": shard, "num_rows": 3, "tokens": 100 + shard, "bytes": 2048 * (100 + shard), "dtype": "float32",
        }))
    (r / "benchmarks").mkdir()
    for name, s in [("regenerate", 30.5), ("train", 12.0), ("evaluate", 40.0)]:
        (r / "benchmarks" / f"{name}.tsv").write_text(f"s\th:m:s\tmax_rss\n{s}\t0:00:30\t100\n")


def test_report_rules_draw_the_plots_and_snakemake_writes_the_html(tmp_path, tiny_model):
    workdir = tmp_path
    (workdir / "prompts.jsonl").write_text(json.dumps({"prompt": "Hi"}) + "\n")
    write_config(workdir, {
        "target": {"model": str(tiny_model)}, "prompts": {"sources": ["prompts.jsonl"], "validation": 0, "test": 1},
        "tokenize": {"max_seq_len": 256}, "vocab": {"draft_vocab_size": 2},
    })
    _fabricate_results(workdir)
    targets = [f"results/report/{p}.png" for p in PLOTS]
    # only the report rules: the fabricated results stand in for the stages' outputs
    snakemake(workdir, "--cores", "1", "--allowed-rules", *[f"report_{p}" for p in PLOTS], "--", *targets)
    for target in targets:
        assert (workdir / target).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", target
    assert not list((workdir / "results" / "report").glob(".*tmp*"))  # published atomically
    snakemake(workdir, "--report", str(workdir / "report.html"), "--", *targets)
    html = (workdir / "report.html").read_text()
    for plot in PLOTS:  # each plot is embedded in the page, byte for byte
        embedded = re.search(rf"filename={plot}\.png;base64,([A-Za-z0-9+/=]+)", html)
        assert embedded, plot
        assert base64.b64decode(embedded.group(1)) == (workdir / f"results/report/{plot}.png").read_bytes()
    assert "Mean acceptance length = 1 + accepted / drafts" in html  # the acceptance caption
    # titled with the run's name (the work folder's by default) and the target
    assert f"draftline run {workdir.name}: eagle3 draft for {tiny_model.name}" in html
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    write_config(workdir, {**config, "run_name": "llama-8b-sharegpt"})
    snakemake(workdir, "--report", str(workdir / "report.html"), "--", *targets)
    assert f"draftline run llama-8b-sharegpt: eagle3 draft for {tiny_model.name}" in (workdir / "report.html").read_text()


def test_default_target_plans_evaluation_and_report(tmp_path):


    shutil.copytree(REPO / "resources" / "prompts", tmp_path / "resources" / "prompts")

    write_config(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    jobs = planned_jobs(tmp_path)
    assert jobs["train"] == 1 and jobs["evaluate_baseline"] == 1 and jobs["evaluate"] == 1
    # one evaluation job per set: validation, test and the default's named sets
    assert jobs["evaluate_set"] == 2 + len(yaml.safe_load((REPO / "config" / "config.yaml").read_text())["evaluate"]["prompt_sets"])
    for plot in PLOTS:
        assert jobs[f"report_{plot}"] == 1
    # evaluate.sets_in_one_job: one job for every set (each engine starts once), the same records after it
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["evaluate"]["sets_in_one_job"] = True
    write_config(tmp_path, config)
    together = planned_jobs(tmp_path)
    assert together["evaluate_sets"] == 1 and "evaluate_set" not in together
    assert together["evaluate"] == 1 and together["evaluate_baseline"] == 1


def test_report_plots_stay_readable_with_many_prompt_sets_and_long_titles(tmp_path, monkeypatch):
    """Six prompt sets (validation, test and four named ones) make a grid of two columns, not six
    panels in one row; the vocab-coverage title fits inside its figure."""
    from draftline.stages import report

    drawn = []
    monkeypatch.setattr(report, "_save", lambda fig, out: (fig.tight_layout(), fig.canvas.draw(), drawn.append(fig)))
    drafts = {d: {"mean_acceptance_length": 1.5, "acceptance_per_position": [0.3, 0.15, 0.05]}
              for d in ("trained", "untrained")}
    names = ["validation", "test", "code", "math", "chat", "long"]
    (tmp_path / "acceptance.json").write_text(json.dumps({
        "num_speculative_tokens": 3, "headline_set": "test",
        "sets": {name: {"prompts": 40, "drafts": drafts} for name in names}}))
    report.plot_acceptance(tmp_path / "acceptance.json", tmp_path / "acceptance.png")
    visible = [ax for ax in drawn[0].axes if ax.get_visible()]
    assert len(visible) == 6 and len({round(ax.get_position().x0, 3) for ax in visible}) == report.ACCEPTANCE_COLUMNS
    width, height = drawn[0].get_size_inches()
    assert width < 2 * height

    (tmp_path / "vocab.json").write_text(json.dumps({"draft_vocab_size": 8192, "coverage": 0.97,
                                                     "assistant_tokens": 1_234_567, "target_vocab_size": 151_936}))
    monkeypatch.setattr(report.token_freq_file, "read", lambda path: {i: 1000 - i for i in range(900)})
    report.plot_vocab_coverage(tmp_path / "token_freq.pt", tmp_path / "vocab.json", tmp_path / "vocab.png")
    fig = drawn[1]
    title = fig.axes[0].title.get_window_extent(fig.canvas.get_renderer())
    assert 0 <= title.x0 and title.x1 <= fig.bbox.width, (title, fig.bbox)


# ---------------------------------------------------------------- gathering the sets (evaluate_merge)


def _set_record(path: Path, name: str, draft: str, rows: list[list]) -> Path:
    """A one-set, one-draft record as evaluate_set writes it (only the fields the gathering reads)."""
    block = {"columns": ["id", "drafts", "draft_tokens", "accepted", "accepted_per_position"], "rows": rows}
    numbers = {"mean_acceptance_length": 1 + sum(r[3] for r in rows) / sum(r[1] for r in rows), "per_prompt": block}
    path.write_text(json.dumps({
        "num_speculative_tokens": 2, "headline_set": name, "prompts": len(rows), "drafts": {draft: numbers},
        "sets": {name: {"prompts": len(rows), "prompt_ids": [r[0] for r in rows], "drafts": {draft: numbers},
                        "trained_minus_untrained": None}},
        "empty_sets": [], "checkpoints": {draft: {"path": draft, "model_sha256": None}}, "lossless": True,
        "settings": {"seed": 0}, "seconds": 10.0,
    }))
    return path


def test_gathered_sets_keep_the_configured_order_with_the_baseline_beside_the_headline(tmp_path):
    """results/eval/acceptance.json from one record per set and the baseline's: the format one
    evaluation of every set wrote (the report, the summary and compare_acceptance read it)."""
    from draftline.stages.evaluate_merge import merge

    trained = [["a", 4, 8, 6, [4, 2]], ["b", 4, 8, 2, [2, 0]]]
    untrained = [["a", 4, 8, 0, [0, 0]], ["b", 4, 8, 1, [1, 0]]]
    sets = {"validation": _set_record(tmp_path / "validation.json", "validation", "trained", trained),
            "test": _set_record(tmp_path / "test.json", "test", "trained", trained),
            "mine": tmp_path / "mine.json"}
    (tmp_path / "mine.json").write_text(json.dumps({"sets": {}, "empty_sets": ["mine"], "lossless": True, "seconds": 0.0}))
    baseline = _set_record(tmp_path / "untrained.json", "test", "untrained", untrained)
    result = merge(sets, baseline, tmp_path / "acceptance.json")
    assert json.loads((tmp_path / "acceptance.json").read_text()) == result
    assert list(result["sets"]) == ["validation", "test"] and result["empty_sets"] == ["mine"]
    assert result["headline_set"] == "test" and result["baseline"] == {"draft": "untrained", "sets": ["test"]}
    assert list(result["drafts"]) == ["trained", "untrained"] and list(result["sets"]["validation"]["drafts"]) == ["trained"]
    difference = result["sets"]["test"]["trained_minus_untrained"]
    assert difference["mean_acceptance_lengths"] == [2.0, 1.125] and difference["mean_acceptance_length"] == 0.875
    assert set(result["checkpoints"]) == {"trained", "untrained"} and result["seconds"] == 20.0
    assert result["records"]["untrained"] == str(baseline)


# ---------------------------------------------------------------- latency at batch 1


def _latency_rows(seconds_per_prompt, tokens=10, steps=5):
    return [{"id": f"p{i}", "seconds": s, "output_tokens": tokens, "steps": steps, "token_ids": [1] * tokens}
            for i, s in enumerate(seconds_per_prompt)]


def test_batch1_speed_up_is_time_per_token_alone_over_with_the_draft_with_a_paired_interval():
    from draftline.stages.evaluate.latency import batch1_latency, where_the_time_goes

    alone = _latency_rows([1.0, 2.0, 3.0, 4.0])
    faster = _latency_rows([0.5, 1.0, 1.5, 2.0])  # every prompt twice as fast
    latency = batch1_latency(alone, faster)
    assert latency["speedup"] == 2.0 and latency["bootstrap_95"] == [2.0, 2.0]  # paired: no spread left
    assert latency["ms_per_output_token"] == {"target_alone": 250.0, "with_draft": 125.0}
    assert latency["per_prompt_speedup"] == {"min": 2.0, "median": 2.0, "max": 2.0}
    assert latency["speculative_step"]["in_target_steps"] == 1.0  # 5 steps for 10 tokens: 2 tokens a step
    assert where_the_time_goes(latency) is None
    slower = batch1_latency(alone, _latency_rows([2.0, 3.0, 5.0, 6.0], steps=8))
    low, high = slower["bootstrap_95"]
    assert low <= slower["speedup"] <= high < 1
    assert "yielded 1.25 tokens" in where_the_time_goes(slower)
    with pytest.raises(ValueError, match="not the same prompts"):
        batch1_latency(alone, list(reversed(faster)))


@pytest.mark.dag
def test_each_set_records_its_latency_at_batch_1_in_the_same_engines(evaluation, evaluation_in_separate_calls):
    """The first evaluate.batch1_prompts prompts of each set, each alone, with and without the
    draft: the draft's steps are the prompts' own spec-decode steps (vLLM's per-request metrics,
    or the separate calls, which are those calls), and no engine is started for it."""
    settings = EvaluateSettings()
    for result in (evaluation["json"], evaluation_in_separate_calls):
        for name, data in result["sets"].items():
            for draft, block in data["drafts"].items():
                latency = block["batch1"]
                n = min(settings.batch1_prompts, data["prompts"])
                assert latency["prompts"] == n, (name, draft)
                assert latency["speculative_step"]["steps"] == sum(row[1] for row in block["per_prompt"]["rows"][:n])
                assert latency["outputs_unlike_target_alone"] == 0  # greedy and lossless, each prompt alone
                low, high = latency["bootstrap_95"]
                assert low <= latency["speedup"] <= high
    assert evaluation["engines"] == [None, evaluation["oracle"], evaluation["untrained"]]


@pytest.mark.dag
def test_every_set_in_one_job_writes_the_records_each_sets_own_job_would(evaluation):
    """evaluate.sets_in_one_job: one engine per draft for all sets; each set's record holds that
    set alone, in the format evaluate_set writes, and the merge gathers them as it gathers those."""
    import draftline.stages.evaluate as ev
    from draftline.stages import evaluate_merge

    tmp = evaluation["tmp"]
    outs = {name: tmp / "one_job" / f"{name}.json" for name in ("test", "mine")}
    ev.evaluate_sets(evaluation["target"], {"test": tmp / "heldout.jsonl", "mine": tmp / "mine.jsonl"},
                     ("trained", evaluation["oracle"]), outs,
                     EvaluateSettings(num_speculative_tokens=K, max_new_tokens=16, max_model_len=256, threads=1))
    records = {name: json.loads(path.read_text()) for name, path in outs.items()}
    for name in ("test", "mine"):
        assert list(records[name]["sets"]) == [name] and records[name]["headline_set"] == name
        trained = records[name]["sets"][name]["drafts"]["trained"]
        assert trained["counters"] == evaluation["json"]["sets"][name]["drafts"]["trained"]["counters"]
    assert records["mine"]["seconds"] == 0.0 < records["test"]["seconds"]  # the job's seconds, counted once
    gathered = evaluate_merge.gather(outs)
    assert list(gathered["sets"]) == ["test", "mine"] and gathered["lossless"]
