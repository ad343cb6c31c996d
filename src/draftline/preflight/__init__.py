"""Preflight: the run's first minutes on its cluster, before hours of GPU time are spent.

`snakemake ... preflight` runs, in jobs with the run's own GPU count and engine settings
(rules/preflight.smk), one part per job; each writes its checks (`artifacts.preflight`) and
never fails by itself, so the report names every problem at once. A part whose inputs failed
records its checks as `not run`, naming what failed. Each part also records what it measured:
load seconds and tokens per second, which the plan's sizing uses in place of its assumed rates
(draftline.planning.sizing).

One module per part, as the stages it checks:
- environment: the GPU node against the plan, no engine (EnvironmentPlan, environment_checks,
  run_environment), from node (what the job sees: Node, probe, driver_versions, import_vllm)
  and target (the target's files: read_target, TargetFacts)
- regeneration: the target in vLLM, a few prompts answered, decoded greedily (the reference)
  and tokenized by the stages' own code (run_regenerate)
- hidden_states: those rows through the extraction stage, then the fidelity check
  (run_hidden_states, fidelity_check)
- speculative: an untrained draft of the run's config in vLLM's speculative decoding, lossless
  against the reference (run_speculative)
- training: one step of the run's draft config through speculators' Trainer, launched by the
  train stage's own code on the run's training GPUs (run_training, TrainingStep); its Trainer
  process is training_entry (the train stage's entry, plus each rank's backend and peak memory)
- report: the `preflight` target's verdict (verdict, PreflightFailed)
- common: what the parts share (Part, PreflightSettings, RegenerationStages, attempt, skip_all)
"""

from draftline.preflight.common import Part, PreflightSettings, RegenerationStages
from draftline.preflight.environment import (
    CORES,
    DRIVER,
    GPU_MEMORY,
    GPUS,
    HOST_MEMORY,
    TARGET,
    TORCH,
    VERSIONS,
    VLLM,
    EnvironmentPlan,
    environment_checks,
    run_environment,
)
from draftline.preflight.hidden_states import EXTRACTION, FIDELITY, fidelity_check, run_hidden_states
from draftline.preflight.node import Node, cuda_version, driver_versions, import_vllm, module_version, probe
from draftline.preflight.regeneration import LOAD, REFERENCE, REGENERATION, TOKENIZATION, first_rows, run_regenerate
from draftline.preflight.report import PreflightFailed, verdict
from draftline.preflight.speculative import DRAFT, LOSSLESS, run_speculative
from draftline.preflight.target import TargetFacts, TargetUnreadable, read_target
from draftline.preflight.training import TRAINING, TrainingStep, failing_line, run_training

__all__ = [
    "CORES", "DRAFT", "DRIVER", "EXTRACTION", "FIDELITY", "GPUS", "GPU_MEMORY", "HOST_MEMORY", "LOAD", "LOSSLESS",
    "REFERENCE", "REGENERATION", "TARGET", "TOKENIZATION", "TORCH", "TRAINING", "VERSIONS", "VLLM", "EnvironmentPlan", "Node",
    "Part", "PreflightFailed", "PreflightSettings", "RegenerationStages", "TargetFacts", "TargetUnreadable", "TrainingStep",
    "cuda_version", "driver_versions", "environment_checks", "failing_line", "fidelity_check", "first_rows", "import_vllm",
    "module_version", "probe", "read_target", "run_environment", "run_hidden_states", "run_regenerate",
    "run_speculative", "run_training", "verdict",
]
