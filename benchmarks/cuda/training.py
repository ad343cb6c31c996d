"""Training: `draftline.stages.train.train` (what scripts/train.py calls: speculators' Trainer under
torchrun) on 1 and 2 GPUs (DDP, FSDP), against a plain forward+backward loop of the same draft on
the Trainer's own batch; the checkpoint loaded back with speculators."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from common import sync
from record_run import GpuMemoryPoller


def train_inputs(work: Path, target: Path):
    from draftline.stages.train import TrainInputs

    return TrainInputs(config_dir=work / "config", dataset=work / "dataset", hidden_states=work / "hs" / "all",
                       d2t=work / "d2t.npy", t2d=work / "t2d.npy", layer_ids=work / "layer_ids.json",
                       target=str(target))


def training(work: Path, target: Path, name: str, gpus: int, epochs: int, total_seq_len: int,
             fsdp: bool = False, num_workers: int | str = "auto") -> dict:
    """`draftline.stages.train.train` as scripts/train.py calls it, with the `train.fsdp` and
    `train.num_workers` settings."""
    import draftline.stages.train as dt
    from draftline.artifacts import metrics

    settings = dt.TrainSettings(epochs=epochs, total_seq_len=total_seq_len, train_fraction=0.9,
                                fsdp=fsdp, num_workers=num_workers)
    t0 = time.perf_counter()
    with GpuMemoryPoller() as mem:
        final = dt.train(train_inputs(work, target), settings,
                         dt.TrainJob(work / name / "runs", work / name / "final", threads=4, gpus=gpus))
    wall = time.perf_counter() - t0
    prov = json.loads((final / "draftline_provenance.json").read_text())
    run_dir = Path(prov["run_dir"])
    profiles = [r["profile"] for r in metrics.records(run_dir / "metrics.jsonl") if "profile" in r]
    steady = profiles[len(profiles) // 4:] or profiles  # without the first steps (start-up)

    def med(key):
        vals = sorted(p.get(key, 0.0) for p in steady)
        return round(vals[len(vals) // 2], 2) if vals else None

    world = prov["world_size"]
    mem_marks = [v for p in profiles for v in (p.get("memory_mb") or {}).values()]
    return {
        "gpus": gpus, "world_size": world, "fsdp_shard": fsdp, "device": prov["device"],
        "num_workers": prov["num_workers"],
        "optimizer": prov["optimizer"], "epochs": epochs, "total_seq_len": total_seq_len,
        "wall_s": round(wall, 1), "steps_logged_rank0": len(profiles),
        "throughput_rank0": prov["throughput"],
        "median_step_tokens_per_s_rank0": med("tokens_per_s"),
        # Every rank runs the same number of equally packed steps: the job's rate is world x rank 0's.
        "median_tokens_per_s_all_ranks": round(med("tokens_per_s") * world, 1) if med("tokens_per_s") else None,
        "median_ms": {k: med(k) for k in ("step_ms", "fwd_ms", "bwd_ms", "opt_ms", "fetch_ms", "h2d_ms")},
        "peak_memory_allocated_at_marks_mib_rank0": round(max(mem_marks), 1) if mem_marks else None,
        "peak_nvidia_smi_mib": mem.peak,
        "val_loss_per_epoch": prov["val_loss_per_epoch"],
        "final": str(final), "final_files": sorted(p.name for p in final.iterdir()),
        "train_command": (final / "train_command.txt").read_text()[:2000] if (final / "train_command.txt").exists() else None,
    }


def checkpoint_check(final: Path) -> dict:
    """Load the checkpoint with speculators; record its tensors (names, shapes, dtypes)."""
    from safetensors import safe_open
    from speculators.models.eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(str(final))
    with safe_open(str(final / "model.safetensors"), framework="pt") as f:
        tensors = {k: [list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()] for k in f.keys()}  # noqa: SIM118
    cfg = json.loads((final / "config.json").read_text())
    return {"loaded_class": type(model).__name__, "params": sum(p.numel() for p in model.parameters()),
            "tensors": tensors, "config_keys": sorted(cfg), "speculators_model_type": cfg.get("speculators_model_type")}


def reference_fwd_bwd(work: Path, target: Path, total_seq_len: int, steps: int) -> dict:
    """Plain forward+backward of the same draft, on the Trainer's own first batch, in a loop."""
    import speculators.train.cli as cli
    from hs_connectors import HiddenStatesBackend
    from speculators.model import SpeculatorModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.config import TrainConfig
    from speculators.train.dataloader import create_train_val_loaders

    import draftline.stages.train as dt

    if not torch.cuda.is_available():
        from draftline.stages.train.entry import apply_cpu_shims

        apply_cpu_shims()
    settings = dt.TrainSettings(epochs=1, total_seq_len=total_seq_len, train_fraction=0.9)
    inputs = train_inputs(work, target)
    facts = dt.check_inputs(inputs)
    argv = dt.speculators_args(inputs, settings, facts, dt.TrainerOptions(optimizer="adamw"), work / "ref_run")
    args = argparse.Namespace(**TrainConfig.resolve(argv).flatten())
    cls = SpeculatorModel.registry["eagle3"]
    d2t, t2d, dvs = cli.parse_vocab_mappings(args)
    model = cli.build_draft_model(args, cls, t2d, d2t, dvs)
    hs_dtype = getattr(torch, args.hidden_states_dtype)
    transfer = HiddenStatesBackend.registry[args.hidden_states_backend].from_train_args(args, args.data_path)
    loader, _ = create_train_val_loaders(
        data_path=args.data_path, total_seq_len=args.total_seq_len, hidden_states_dtype=hs_dtype,
        transfer=transfer, vllm_endpoint=args.vllm_endpoint, on_missing=args.on_missing,
        verifier_name_or_path=args.verifier_name_or_path, request_timeout=args.request_timeout,
        max_retries=args.max_retries, generation_validation_retries=args.generation_validation_retries,
        max_consecutive_generation_failures=args.max_consecutive_generation_failures,
        hidden_size=model.config.transformer_layer_config.hidden_size,
        num_target_layers=len(model.target_layer_ids), num_workers=0, prefetch_factor=args.prefetch_factor,
        preprocess=shift_batch, train_data_ratio=args.train_data_ratio, seed=args.seed,
    )
    kwargs, _ = cls.get_trainer_kwargs(**vars(args))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).train()
    batch = next(iter(loader))
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    batch.pop("error_records", None)
    tokens = int((batch["document_ids"] != -1).sum())
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast(device, dtype=hs_dtype):
            _, loss, _ = model(**batch, **(kwargs or {}))
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    sync()
    with GpuMemoryPoller() as mem:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        s = time.perf_counter() - t0
    out = {"steps": steps, "tokens_per_step": tokens, "ms_per_step": round(1000 * s / steps, 2),
           "tokens_per_s": round(tokens * steps / s, 1), "peak_nvidia_smi_mib": mem.peak}
    if device == "cuda":
        out["max_memory_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        out["max_memory_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    model = None  # free the GPU memory (step() above holds the name)
    if device == "cuda":
        torch.cuda.empty_cache()
    return out
