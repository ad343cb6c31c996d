"""What a config costs before it runs: GPU-hours per stage and hidden-state bytes, from the number of
training conversations and the configured lengths (an upper bound: every conversation is taken as
`tokenize.max_seq_len` tokens, every user turn answered at `regenerate.max_new_tokens`).

Rates come from measurements where there are some and are scaled by FLOPs per token elsewhere;
`RATES` says which is which (docs/sizing.md has the table and the formulas):

- extraction, H200: measured 29.5k tokens/s on an 8B-shaped target = 0.54 of the bf16 matmul
  limit (787.8 TFLOP/s / 14.5 GFLOP per token; benchmarks/cuda/results/h200_8b_extraction_recheck.md);
  other targets: the same fraction of the same limit with their own FLOPs per token.
- training, H200: measured 28.1k tokens/s for the 8B target's draft (1 layer, draft vocab 32k,
  8k-token batches, 4 loader workers; benchmarks/cuda/results/h200x2_8b_loader_workers.md); other
  targets: scaled by the draft's linear parameters (its layer, fc and lm_head).
- regeneration and evaluation, H200: vLLM NOT measured (none on the GPU machine): batched greedy
  decoding is taken to run at 0.3 of the matmul limit with 2 x active parameters FLOPs per token;
  transformers' own generate on the 8B shape measured 14.0k tokens/s = 0.25 of it at batch 1024, a
  lower bound (benchmarks/cuda/results/h200_8b_decode_transformers.md).
- H100: assumed from the H200 (GPUS): the same compute, 0.70 of its memory bandwidth for decoding.
- regeneration answers every user turn and prefills each turn's prompt (the conversation so far)
  at the extraction rate: `regenerated_tokens` bounds both by the turns and the context.
- CPU (1 core, float32, SmolLM2-135M; NOTES.md, benchmarks/results/pipeline_default.md):
  regeneration ~120 tok/s, extraction ~250 tok/s, training ~240 tok/s (AdamW); other targets on
  the CPU scaled by FLOPs per token the same way.
- measured by this run's preflight (results/preflight/report.json, draftline.preflight) for the
  same plan: its regeneration and extraction rates and engine start-up seconds replace the ones
  above (`measured`), on the target and GPUs the run will use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# bf16 8192^3 matmul on one H200, short bursts (h200_8b_extraction_recheck.json)
H200_MATMUL_FLOPS = 787.8e12
EXTRACTION_FRACTION = 0.54  # measured: warm extraction / the limit (8B-shaped target)
DECODE_FRACTION = 0.3  # assumed for vLLM; transformers generate measured 0.25 (batch 1024)
TRAIN_TOKENS_PER_S_8B = 28_138  # measured, 1 x H200, the 8B target's draft
DRAFT_LINEAR_8B = None  # filled below from the 8B shape
LOAD_BYTES_PER_S = 1.5e9  # measured: 16 GB bf16 from disk in 10.6 s (page cache dropped)
START_S = 12.0  # measured: imports before the load, per job
# CPU, 1 core, float32, SmolLM2-135M (30 layers, hidden 576): measured rates and its FLOPs/token
CPU = {"regeneration": 120.0, "extraction": 250.0, "training": 240.0}
# Evaluation's rate with each draft over the target alone's (speculative decoding's speed-up).
# CPU, measured: the embedded default's evaluation, the lowest over its sets, rounded down (trained
# 0.439-0.535, untrained 0.322; benchmarks/results/default_acceptance.md): on the CPU decoding is
# compute-bound and the draft's and the verification's work costs more than it saves.
# CUDA, assumed (no vLLM on the GPU machine): a trained draft no slower than the target alone; an
# untrained one, which accepts next to nothing, at 0.8 of it (k small draft steps per verification).
SPECULATIVE_SPEEDUP = {"cpu": {"trained": 0.43, "untrained": 0.32}, "cuda": {"trained": 1.0, "untrained": 0.8}}

# What to plan by, beside the bound: each stage's recorded wall time over its bound's, for the
# embedded default's fresh-clone run (benchmarks/results/default_acceptance.json, the longest job of
# each stage; tests/test_presets.py recomputes them). Its conversations filled about a quarter of
# tokenize.max_seq_len, most answers stopped before regenerate.max_new_tokens: data like it take
# about this share of each bound; data that fill the lengths take the bound.
EXPECTED_SHARE = {"regeneration": 0.17, "extraction": 0.27, "training": 0.1, "evaluation": 0.55}


@dataclass(frozen=True)
class Gpu:
    """A GPU kind's rates as multiples of the H200's, on which the CUDA rates above were measured."""

    name: str
    compute: float  # extraction, training: matmul-bound
    decoding: float  # regeneration, evaluation: batched decoding, memory-bandwidth-bound
    basis: str


GPUS = {
    "H200": Gpu("H200", 1.0, 1.0, "the rates above"),
    # assumed: the H100 SXM is the same GH100 chip at the same clocks (NVIDIA's data sheets give both
    # 989 TFLOP/s of dense bf16), with 3.35 TB/s of memory bandwidth against the H200's 4.8 TB/s;
    # 80 GB instead of 141 GB, which the config's tensor_parallel_size must fit (preflight checks it)
    "H100": Gpu("H100", 1.0, 3.35 / 4.8, "assumed: the H200's compute, 0.70 of its memory bandwidth for decoding"),
}


@dataclass(frozen=True)
class Shape:
    """What the estimate needs from a target's config.json."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (the draft's layer uses it too)
    vocab: int
    experts: int = 0  # routed experts (0 = dense)
    experts_per_token: int = 0
    expert_intermediate: int = 0
    total_params: float | None = None  # for the weights' bytes; None = from the linear layers

    @property
    def attention_linear(self) -> int:
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def active_linear(self) -> float:
        """Weights each token multiplies through in the decoder layers (no embedding, no lm_head)."""
        if self.experts:
            mlp = self.experts_per_token * 3 * self.hidden * self.expert_intermediate + self.hidden * self.experts
        else:
            mlp = 3 * self.hidden * self.intermediate
        return self.layers * (self.attention_linear + mlp)

    @property
    def weights_bytes(self) -> float:
        if self.total_params:
            return 2 * self.total_params
        mlp = (self.experts * 3 * self.hidden * self.expert_intermediate) if self.experts else 3 * self.hidden * self.intermediate
        return 2 * (self.layers * (self.attention_linear + mlp) + 2 * self.vocab * self.hidden)

    def forward_flops(self, seq_len: int) -> float:
        """FLOPs per token of a forward over conversations of seq_len tokens (causal attention)."""
        return 2 * self.active_linear + 2 * self.layers * self.heads * self.head_dim * (seq_len + 1)

    def draft_linear(self, draft_vocab: int) -> float:
        """An EAGLE-3 draft layer (q, k, v read 2 x hidden), fc (3 x hidden -> hidden), lm_head."""
        h = self.hidden
        attention = 2 * h * (self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim) + self.heads * self.head_dim * h
        return attention + 3 * h * self.intermediate + 3 * h * h + h * draft_vocab


def shape_of(config_path: str | Path, name: str | None = None) -> Shape:
    """A Shape from a Hugging Face config.json (Llama, Qwen, Mistral style; MoE with num_experts
    or n_routed_experts)."""
    raw = json.loads(Path(config_path).read_text())
    c = {**raw, **raw.get("text_config", {})} if isinstance(raw.get("text_config"), dict) else raw
    heads = c["num_attention_heads"]
    experts = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts") or 0
    return Shape(
        name=name or Path(config_path).parent.name,
        layers=c["num_hidden_layers"], hidden=c["hidden_size"], heads=heads,
        kv_heads=c.get("num_key_value_heads") or heads, head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        intermediate=c.get("intermediate_size") or 4 * c["hidden_size"], vocab=c["vocab_size"],
        experts=experts, experts_per_token=c.get("num_experts_per_tok", 0) if experts else 0,
        expert_intermediate=c.get("moe_intermediate_size", 0) if experts else 0,
    )


# The targets of the docs' table (their published config.json values).
LLAMA_8B = Shape("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256)
LLAMA_70B = Shape("Llama-3.3-70B", 80, 8192, 64, 8, 128, 28672, 128256)
# Weights from the linear layers, as the plan has them from the target's config.json (235.0e9 params).
QWEN3_235B = Shape("Qwen3-235B-A22B (MoE)", 94, 4096, 64, 4, 128, 12288, 151936, experts=128,
                   experts_per_token=8, expert_intermediate=1536)
SMOLLM2_135M = Shape("SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152)
DRAFT_LINEAR_8B = LLAMA_8B.draft_linear(32000)


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
        extract = kind.compute * EXTRACTION_FRACTION * H200_MATMUL_FLOPS / shape.forward_flops(plan.max_seq_len)
        train = kind.compute * TRAIN_TOKENS_PER_S_8B * DRAFT_LINEAR_8B / shape.draft_linear(plan.draft_vocab)
        load_s = START_S + shape.weights_bytes / LOAD_BYTES_PER_S
    else:  # 1-core rates of SmolLM2-135M, scaled by FLOPs per token
        ref = SMOLLM2_135M
        decode = CPU["regeneration"] * ref.active_linear / shape.active_linear
        extract = CPU["extraction"] * ref.forward_flops(1024) / shape.forward_flops(plan.max_seq_len)
        train = CPU["training"] * ref.draft_linear(8192) / shape.draft_linear(plan.draft_vocab)
        load_s = START_S + shape.weights_bytes / LOAD_BYTES_PER_S
    start_regeneration = start_extraction = load_s
    if measured:
        # a job's rate over its GPUs, per GPU (the work below is in one-device seconds)
        per_gpu = measured.get("gpus_per_job") or plan.gpus_per_vllm_job
        decode = measured.get("regeneration_tokens_per_s", decode * per_gpu) / per_gpu
        extract = measured.get("extraction_tokens_per_s", extract * per_gpu) / per_gpu
        start_regeneration = measured.get("regeneration_load_seconds", load_s)
        start_extraction = measured.get("extraction_load_seconds", load_s)
    if plan.filesystem_bytes_per_s:
        load_s = START_S + shape.weights_bytes / plan.filesystem_bytes_per_s
        if not measured or "regeneration_load_seconds" not in measured:
            start_regeneration = load_s
        if not measured or "extraction_load_seconds" not in measured:
            start_extraction = load_s
    vllm = plan.gpus_per_vllm_job
    # seconds of work on one device (a job of n GPUs is taken to run n times as fast), the jobs
    # the config splits it into, GPUs per job, and each job's fixed start (imports, weights)
    work = {
        "regeneration": generated / decode + prefilled / extract,  # prefill at the forward's rate
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
        # each vLLM job's start: imports and the weights' load (the preflight's where it measured one)
        "vllm_start_seconds": max(start_regeneration, start_extraction),
        "vllm_start_measured": bool(measured) and any(f"{k}_load_seconds" in measured for k in ("regeneration", "extraction")),
        "basis": _basis(device, measured),
    }


def _evaluation_work(plan: Plan, decode: float, speedup: dict[str, float]) -> float:
    """One-device seconds of the evaluation (every evaluate_set job and evaluate_baseline
    together): the target alone and the trained draft on every set, the untrained draft on the
    headline set only (draftline.stages.evaluate), every answer at evaluate.max_new_tokens, each
    draft at its speculative-decoding rate."""
    headline = plan.eval_prompts if plan.eval_headline_prompts is None else plan.eval_headline_prompts
    tokens = plan.eval_new_tokens
    return tokens * (plan.eval_prompts / decode + plan.eval_prompts / (decode * speedup["trained"])
                     + headline / (decode * speedup["untrained"]))


def _basis(device: str, measured: dict | None) -> str:
    if not measured:
        return (
            "H200: extraction and training measured on the 8B shape, scaled by FLOPs per token; "
            "regeneration and evaluation assumed (0.3 of the matmul rate, not measured; speculative decoding "
            "assumed no slower than the target alone with a trained draft)"
            if device == "cuda" else
            "CPU: 1-core rates measured on SmolLM2-135M, scaled by FLOPs per token; evaluation at the "
            "speculative-decoding rates measured on it"
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
                "training: the 1-core rate measured on SmolLM2-135M, scaled by FLOPs per token")
    rest = [s for s in ("regeneration", "extraction") if f"{s}_tokens_per_s" not in measured]
    assumed = f"; {' and '.join(rest)} as without it" if rest else ""
    jobs = f", jobs of {gpus} GPU(s)" if device == "cuda" else ""
    return (f"measured by this run's preflight ({measured.get('source', 'results/preflight/report.json')}{jobs}): "
            f"{', '.join(figures)}{assumed}; {training}")


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def plan_from_config(config: dict, conversations: int, train_gpus: int = 1, device: str = "cuda",
                     user_turns: int | None = None) -> Plan:
    aux = config["hidden_states"]["layer_ids"]
    dtype = config["target"].get("dtype", "auto")
    if dtype == "auto":  # draftline.planning.rule_params: float32 on the CPU, bfloat16 on CUDA
        dtype = "float32" if device == "cpu" else "bfloat16"
    prompts = config["prompts"]
    held_out = (prompts["validation"] or 0) + (prompts["test"] or 0)
    return Plan(
        conversations=conversations,
        max_seq_len=config["tokenize"]["max_seq_len"],
        max_new_tokens=config["regenerate"]["max_new_tokens"],
        epochs=config["train"]["epochs"],
        eval_prompts=held_out + named_set_prompts(config["evaluate"]),
        eval_headline_prompts=prompts["test"] or prompts["validation"] or 0,
        eval_new_tokens=config["evaluate"]["max_new_tokens"],
        aux_layers=3 if aux == "auto" else len(aux),
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        draft_vocab=config["vocab"]["draft_vocab_size"],
        regenerate=config["regenerate"]["enabled"],
        gpus_per_vllm_job=config["target"]["tensor_parallel_size"] * config["target"]["pipeline_parallel_size"],
        train_gpus=train_gpus,
        regenerate_shards=config["regenerate"]["shards"],
        hidden_state_shards=config["hidden_states"]["shards"],
        filesystem_bytes_per_s=(config.get("sizing") or {}).get("filesystem_gb_per_s", 1.0) * 1e9,
        hidden_state_files=config["hidden_states"].get("mode", "offline") == "offline",
        user_turns=user_turns,
        context_len=(config.get("vllm") or {}).get("max_model_len") or config["tokenize"]["max_seq_len"],
    )


def config_estimate(shape: Shape, config: dict, conversations: int, train_gpus: int, device: str = "cuda",
                    measured: dict | None = None, user_turns: int | None = None, gpu: str = "H200") -> dict:
    """`estimate` for a validated config: what the plan's sizing line prints (for_config) and what
    docs/sizing.md's recipes table shows (recipes_table), one computation for both."""
    return estimate(shape, plan_from_config(config, conversations, train_gpus, device, user_turns), device, measured, gpu)


def named_set_prompts(evaluate: dict) -> int:
    """The prompts evaluation reads from the named sets (evaluate.prompt_sets), each capped at
    evaluate.max_prompts; a set that cannot be counted cheaply counts as its cap (or 0 without one:
    the plan checked its first rows, the job reads it)."""
    from draftline.sources import count_rows

    cap = evaluate.get("max_prompts")
    total = 0
    for path in (evaluate.get("prompt_sets") or {}).values():
        rows, _ = count_rows([str(path)])
        rows = cap if rows is None else rows
        total += min(rows, cap) if rows is not None and cap is not None else rows or 0
    return total


def planned_training_rows(config: dict, prompts_summary: str | Path | None = None) -> tuple[int | None, str | None]:
    """(training conversations, None) before tokenization, or (None, why they cannot be counted).
    The prompts job's count once it ran; before, the sources' rows (sources.count_rows) less the
    held-out prompts, capped at prompts.max_samples: an upper bound, since duplicates and
    rejected rows are known only to the prompts job."""
    if prompts_summary is not None and Path(prompts_summary).is_file():
        try:
            return int(json.loads(Path(prompts_summary).read_text())["train"]), None
        except (OSError, ValueError, KeyError, TypeError):
            pass  # being rewritten or damaged: count as before the prompts job
    from draftline.sources import count_rows

    prompts = config["prompts"]
    cap = prompts["max_samples"]
    rows, why_not = count_rows(prompts["sources"])
    if rows is None:
        if cap is None:
            return None, f"{why_not}; set prompts.max_samples to size the run before the prompts job"
        return int(cap), None
    rows = max(rows - (prompts["validation"] or 0) - (prompts["test"] or 0), 0)
    return (rows if cap is None else min(rows, int(cap))), None


def planned_user_turns(prompts_summary: str | Path | None) -> int | None:
    """The training conversations' user turns, as the prompts job counted them (None before it
    ran, or from a summary written before it counted them)."""
    try:
        return int(json.loads(Path(prompts_summary).read_text())["train_user_turns"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class SizedTarget:
    """What sizing reads of the target: its kind (local, hub, embedded), the folder holding its
    config.json, and the name the line gives it (else the folder's name, which for a cached hub
    snapshot is a commit)."""

    kind: str
    dir: str | Path
    name: str | None = None


def for_config(config: dict, target: SizedTarget, device: str, train_gpus: int,
               planned: tuple[int | None, str | None],
               measured: tuple[dict | None, str] = (None, "no preflight report"), user_turns: int | None = None) -> str:
    """The plan's one-line estimate for `planned` (planned_training_rows), or a line saying what
    it waits for: the target's config.json (a hub model still to download) or the count of
    training conversations (a source that cannot be counted cheaply, without prompts.max_samples).
    `measured` is `artifacts.preflight.measured_rates`' answer: the preflight's rates (and where
    from), or None and why there are none; the line says which rates it used."""
    target_dir = target.dir
    config_json = Path(target_dir) / "config.json"
    if config_json.is_file():
        shape = shape_of(config_json, target.name)
    elif target.kind == "embedded":
        shape = SMOLLM2_135M
    else:
        return (f"no sizing estimate before the first job: the target's config.json is not in {target_dir} "
                "yet (the target_model job downloads it; the next dry run prints the estimate)")
    conversations, why_not = planned
    if conversations is None:
        return f"no sizing estimate before the first job: {why_not}"
    if not conversations:
        return "no sizing estimate: no training conversations are left after the held-out prompts"
    rates, source = measured
    if rates is not None:
        rates = {**rates, "source": source}
    text = describe(config_estimate(shape, config, conversations, train_gpus, device, rates, user_turns))
    if rates is None and device == "cuda":
        h100 = config_estimate(shape, config, conversations, train_gpus, device, user_turns=user_turns, gpu="H100")
        text += f"; on H100s total {_hours(sum(h100['device_hours'].values()))} ({GPUS['H100'].basis})"
    if rates is None:
        text += f"; no preflight rates ({source}): `preflight` measures this plan's on its GPUs (docs/cluster.md)"
    if shape.experts and device == "cuda":
        on = (config.get("vllm") or {}).get("enable_expert_parallel")
        text += (f"; MoE with expert parallelism {'on' if on else 'off'} (vllm.enable_expert_parallel), which the "
                 "assumed rates do not model (docs/cluster.md)")
    return text


def _hours(h: float) -> str:
    return f"{h * 3600:.0f} s" if h < 1 / 30 else f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def describe(est: dict) -> str:
    unit = "GPU" if est["device"] == "cuda" else "CPU-core"
    stages = ", ".join(
        f"{k} {_hours(v)} ({_hours(est['wall_hours'][k])} wall)" for k, v in est["device_hours"].items() if v
    )
    kind = f" on {est['gpu']}s" if est["device"] == "cuda" and not est["basis"].startswith("measured") else ""
    if est["user_turns"] is None:
        turns = "; regeneration: one answer per conversation until the prompts job counts the user turns"
    else:
        turns = f"; regeneration: {est['user_turns']:,} user turns answered"
    return (
        f"sizing for {est['target']} on {est['device']}: {est['conversations']:,} training conversations x "
        f"<= {est['tokens'] // max(est['conversations'], 1):,} tokens = <= {est['tokens']:,} tokens{turns}; {unit} time per "
        f"stage{kind}: "
        f"{stages}; total {_hours(sum(est['device_hours'].values()))} (a bound; {_expected(est)}); hidden states <= "
        f"{_bytes(est['hidden_state_bytes'])} ({est['bytes_per_token']:,} B/token){_io(est)}{_load(est)}. Upper bounds from the "
        f"configured lengths; {est['basis']} (docs/sizing.md)"
    )


def _expected(est: dict) -> str:
    """The figure to plan by: each stage's bound x the share of it the embedded default took."""
    device = sum(v * EXPECTED_SHARE[k] for k, v in est["device_hours"].items())
    wall = sum(v * EXPECTED_SHARE[k] for k, v in est["wall_hours"].items())
    return (f"expected about {_hours(device)}, {_hours(wall)} wall, for data that fill the lengths as the "
            "embedded default's do: EXPECTED_SHARE")


def _load(est: dict) -> str:
    """Each vLLM job's start: the weights' load at the filesystem's rate (or the local disk's)."""
    start = est["vllm_start_seconds"]
    if est["vllm_start_measured"]:
        return f"; each vLLM job starts in {_hours(start / 3600)} (measured by the preflight)"
    rate = est.get("filesystem_bytes_per_s") or LOAD_BYTES_PER_S
    source = "sizing.filesystem_gb_per_s" if est.get("filesystem_bytes_per_s") else "LOAD_BYTES_PER_S"
    return (f"; each vLLM job starts in {_hours(start / 3600)} (included above): the weights "
            f"({_bytes(est['weights_bytes'])}) load at {rate / 1e9:g} GB/s ({source}), after {START_S:g} s of imports")


def _io(est: dict) -> str:
    rate = est.get("filesystem_bytes_per_s")
    if not rate:
        return ""
    parts = ", ".join(f"{k} {_hours(v)}" for k, v in est["io_hours"].items())
    if not parts:
        return ""
    return (f"; at {rate / 1e9:g} GB/s (sizing.filesystem_gb_per_s; set it to your filesystem's rate): "
            f"hidden-state I/O {parts} (included above)")


def table(gpu: str = "H200", tokens: int = 100_000_000, seq_len: int = 2048, new_tokens_share: float = 0.5) -> str:
    """The docs' table: per 100 M tokens (conversations of seq_len, half of them generated, one
    user turn each), on `gpu` (a GPUS kind)."""
    conversations = tokens // seq_len
    rows = [
        "| target | GPUs per vLLM job | regeneration | extraction | training (per epoch) | evaluation | hidden states |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, gpus in ((LLAMA_8B, 1), (LLAMA_70B, 4), (QWEN3_235B, 8)):
        plan = Plan(conversations, seq_len, int(seq_len * new_tokens_share), 1, 100, 128, gpus_per_vllm_job=gpus,
                    eval_headline_prompts=50)
        est = estimate(shape, plan, gpu=gpu)
        h, r = est["device_hours"], est["rates_tokens_per_s"]
        rows.append(
            f"| {shape.name} | {gpus} | {h['regeneration']:.1f} ({r['regeneration']:,.0f} tok/s/GPU, assumed) | "
            f"{h['extraction']:.1f} ({r['extraction']:,.0f} tok/s/GPU) | {h['training']:.1f} "
            f"({r['training']:,.0f} tok/s/GPU) | {h['evaluation']:.2f} | {_bytes(est['hidden_state_bytes'])} "
            f"({est['bytes_per_token']:,} B/token) |"
        )
    return "\n".join(rows)


@dataclass(frozen=True)
class Recipe:
    """A preset for a real target, the target's shape, and the Slurm profile it runs with."""

    shape: Shape
    profile: str


RECIPES = {"config/presets/dense_8b.yaml": Recipe(LLAMA_8B, "profiles/slurm_dense_8b"),
           "config/presets/moe_235b.yaml": Recipe(QWEN3_235B, "profiles/slurm_moe_235b")}


def recipe_config(repo: Path, preset: str) -> dict:
    """config/config.yaml with the preset over it and the schema's defaults, as a run reads them."""
    import yaml
    from snakemake.utils import update_config, validate

    config = yaml.safe_load((repo / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load((repo / preset).read_text()))
    validate(config, str(repo / "config/schema/config.schema.yaml"), set_default=True)
    return config


def gpu_overrides(settings: dict) -> dict[str, int | str | None]:
    """{rule: the `gpu` a profile or --set-resources sets (a Resource in Snakemake 9, or a plain
    value)} as plain values: an int, None when unset, the text of an expression only the job knows
    (e.g. "2 * attempt")."""
    out = {}
    for rule, gpu in settings.items():
        value = getattr(gpu, "value", gpu)
        try:
            out[rule] = None if value in (None, "") else int(value)
        except (TypeError, ValueError):
            out[rule] = str(value)
    return out


def planned_train_gpus(config: dict, gpu_overrides: dict[str, int | str | None]) -> tuple[int, int]:
    """(the train rule's own `gpu`: the Trainer's, plus the online server's; what it asks for with
    the profile's or --set-resources' setting). The plan and docs/sizing.md's recipes table read it
    here, so the two size the same training job."""
    hs = config["hidden_states"]
    default = 1 + (hs["online_server_gpus"] if hs["mode"] == "online" else 0)
    asked = gpu_overrides.get("train")
    return default, asked if isinstance(asked, int) else default  # an expression: checked in the job


def recipe_train_gpus(repo: Path, preset: str) -> int:
    """The GPUs the recipe's train job asks for with its profile (its set-resources' `gpu`), as the
    plan counts them (planned_train_gpus)."""
    import yaml

    profile = yaml.safe_load((repo / RECIPES[preset].profile / "config.yaml").read_text())
    train = (profile.get("set-resources") or {}).get("train") or {}
    return planned_train_gpus(recipe_config(repo, preset), gpu_overrides({"train": train.get("gpu")}))[1]


def recipe_estimates(repo: Path, preset: str) -> dict[str, dict]:
    """The recipe's estimates as its dry run with its profile computes them (config_estimate):
    {"H200", "H100": for prompts.max_samples conversations, "shipped": for the shipped prompts}."""
    import os

    config, shape, train_gpus = recipe_config(repo, preset), RECIPES[preset].shape, recipe_train_gpus(repo, preset)
    cwd = os.getcwd()
    try:
        os.chdir(repo)  # the preset's relative paths: its sources, the evaluated sets
        shipped, _ = planned_training_rows(config)
        sized = {gpu: config_estimate(shape, config, config["prompts"]["max_samples"], train_gpus, gpu=gpu)
                 for gpu in GPUS}
        return {**sized, "shipped": config_estimate(shape, config, shipped, train_gpus)}
    finally:
        os.chdir(cwd)


def recipes_table(repo: Path) -> str:
    """The recipes' cost on H200s (and H100s) for the data they are sized for (prompts.max_samples
    single-turn conversations at tokenize.max_seq_len) and for the shipped prompts as they stand,
    each with its profile's training GPUs: what the dry run prints (tests/test_presets.py checks it)."""
    rows = [
        "| preset | target | GPUs per vLLM job | data | H200 GPU-hours | H100 GPU-hours | training (H200) | "
        "hidden states | with the shipped prompts (H200) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for preset, recipe in RECIPES.items():
        config, est = recipe_config(repo, preset), recipe_estimates(repo, preset)
        h200, train_gpus = est["H200"], recipe_train_gpus(repo, preset)
        gpus = config["target"]["tensor_parallel_size"] * config["target"]["pipeline_parallel_size"]
        data = (f"{est['H200']['conversations']:,} conversations, {config['tokenize']['max_seq_len']:,} tokens, "
                f"answers <= {config['regenerate']['max_new_tokens']:,}, {config['train']['epochs']} epochs")
        # the GPU-hours its GPUs wait on the hidden states' reads (sizing.filesystem_gb_per_s)
        reading = h200["io_hours"].get("training", 0.0) * train_gpus
        training = (f"{train_gpus} GPU{'s' if train_gpus > 1 else ''} (its profile's): "
                    f"{h200['device_hours']['training']:.1f} GPU-hours, {reading:.1f} of them reading the hidden states")
        rows.append(
            f"| `{preset}` | {recipe.shape.name} | {gpus} | {data} | {sum(h200['device_hours'].values()):.1f} | "
            f"{sum(est['H100']['device_hours'].values()):.1f} | {training} | "
            f"<= {_bytes(h200['hidden_state_bytes'])} | "
            f"{est['shipped']['conversations']:,} conversations: {sum(est['shipped']['device_hours'].values()):.1f} "
            "GPU-hours |"
        )
    return "\n".join(rows)


def docs_tables(repo: Path) -> str:
    """What docs/sizing.md shows between its `sizing tables` marks (tests/test_docs.py checks it)."""
    return "\n\n".join([f"On H200s:\n\n{table('H200')}", f"On H100s ({GPUS['H100'].basis}):\n\n{table('H100')}",
                        f"Recipes:\n\n{recipes_table(repo)}"])


if __name__ == "__main__":
    print(docs_tables(Path(__file__).resolve().parents[3]))
