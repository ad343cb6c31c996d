"""The whole config (config/config.yaml with its overrides), one typed block per concern."""

from __future__ import annotations

from typing import Literal

from draftline.settings.data import PromptsBlock, RegenerateBlock, TokenizeBlock
from draftline.settings.draft import DraftBlock, TrainBlock, VocabBlock
from draftline.settings.evaluate import EvaluateBlock, PreflightBlock, SizingBlock
from draftline.settings.fields import Block, block, setting
from draftline.settings.hidden_states import HiddenStatesBlock
from draftline.settings.target import TargetBlock, VllmBlock


class DraftlineConfig(Block):
    """draftline configuration (validated at parse time; defaults filled in here)"""

    @classmethod
    def read(cls, config: dict | DraftlineConfig) -> DraftlineConfig:
        """`config` as its typed blocks: a dict (validated, a key left out its default) read, a
        DraftlineConfig as it is."""
        return config if isinstance(config, cls) else cls.model_validate(config)

    run_name: str | None = setting(
        None,
        description=(
            "The run's name, in the report's title and results/summary.md: null = the work folder's name (`--directory runs/llama-8b` -> "
            "llama-8b). Only shown, never part of staleness: renaming a run or moving its folder reruns nothing."
        ),
    )
    device: Literal["auto", "cpu", "cuda"] = setting(
        "auto",
        description=(
            "Where the jobs run: auto = cuda when the jobs go to a cluster's nodes (a non-local executor such as the Slurm profiles', "
            "whatever the planning login node has), else cuda when the machine planning the run sees an NVIDIA GPU, else cpu. It decides "
            "the `auto` settings (dtype, optimizer, loader workers, eager mode) and the pinned versions, all part of staleness; a job on "
            "another device stops. cpu with a cluster executor also needs cpu_on_cluster (docs/cluster.md)."
        ),
    )
    cpu_on_cluster: bool = setting(
        False,
        description=(
            "Allow device: cpu with a cluster executor (e.g. --workflow-profile profiles/slurm): the jobs then compute on the nodes' CPUs. "
            "Without it such a plan stops, so a `device: cpu` left in a config never runs a GPU recipe on CPUs by accident. Read at plan "
            "time only."
        ),
    )
    target: TargetBlock = block(TargetBlock)
    vllm: VllmBlock = block(VllmBlock)
    prompts: PromptsBlock = block(PromptsBlock)
    regenerate: RegenerateBlock = block(RegenerateBlock)
    tokenize: TokenizeBlock = block(TokenizeBlock)
    hidden_states: HiddenStatesBlock = block(HiddenStatesBlock)
    vocab: VocabBlock = block(VocabBlock)
    draft: DraftBlock = block(DraftBlock)
    train: TrainBlock = block(TrainBlock)
    evaluate: EvaluateBlock = block(EvaluateBlock)
    preflight: PreflightBlock = block(PreflightBlock)
    sizing: SizingBlock = block(SizingBlock)
