"""The config's settings, typed: one frozen model per config block (`target:`, `train:`, ...), each
setting with its one default, its description and, where the block decides staleness by it,
whether a change can change outputs. The bottom layer: it imports no other draftline package, and
config/schema/config.schema.yaml (which Snakemake validates against) is exported from it
(`schema`). `DEFAULTS` is the config as its defaults make it: a settings object reads its defaults
there (`DEFAULTS.train.epochs`)."""

from draftline.settings.config import DraftlineConfig
from draftline.settings.data import PromptsBlock, RegenerateBlock, TokenizeBlock
from draftline.settings.draft import DraftBlock, TrainBlock, VocabBlock
from draftline.settings.evaluate import EvaluateBlock, PreflightBlock, SizingBlock
from draftline.settings.hidden_states import FORMATS, FidelityBlock, HiddenStateFormat, HiddenStatesBlock
from draftline.settings.schema import default, output_changing
from draftline.settings.target import TargetBlock, VllmBlock

DEFAULTS = DraftlineConfig()

__all__ = [
    "DEFAULTS", "FORMATS", "DraftBlock", "DraftlineConfig", "EvaluateBlock", "FidelityBlock", "HiddenStateFormat",
    "HiddenStatesBlock", "PreflightBlock", "PromptsBlock", "RegenerateBlock", "SizingBlock", "TargetBlock", "TokenizeBlock",
    "TrainBlock", "VllmBlock", "VocabBlock", "default", "output_changing",
]
