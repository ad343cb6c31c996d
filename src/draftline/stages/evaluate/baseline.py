"""The baseline draft: a freshly initialized draft of the trained one's config and vocab maps
(make_untrained_draft)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftline import algorithms

log = logging.getLogger(__name__)


def make_untrained_draft(
    config_dir: str | Path, d2t: str | Path, t2d: str | Path, out_dir: str | Path,
    target: str | Path | None = None, seed: int = 0,
) -> Path:
    """The baseline: a freshly initialized draft of the trained one's config and vocab maps.

    Built by the code path speculators' Trainer takes for a config-only `--from-pretrained`
    folder (`build_draft_model`: random decoder, the verifier's embeddings, d2t/t2d loaded), then
    saved the way its `--dry-run` saves one, so vLLM loads it exactly like a trained checkpoint.
    """
    from argparse import Namespace

    import numpy as np
    import torch
    from speculators.train.cli import build_draft_model, set_seed
    from speculators.utils.loading import is_config_only_dir

    from draftline.runtime.atomic import atomic_dir

    config = json.loads((Path(config_dir) / "config.json").read_text())
    algorithm = algorithms.of_config(config, str(Path(config_dir) / "config.json"))
    if not is_config_only_dir(config_dir):
        raise ValueError(f"{config_dir}: holds weights; the untrained draft starts from a folder with config.json only")
    set_seed(seed)
    d2t_t = torch.from_numpy(np.load(d2t))
    t2d_t = torch.from_numpy(np.load(t2d))
    # the Trainer's arguments that path reads; the decoder's attention as the config leaves it
    args = Namespace(from_pretrained=str(config_dir), verifier_name_or_path=str(target) if target else None,
                     speculator_type=algorithm.name, draft_attn_impl=None)
    model = build_draft_model(args, algorithm.model_class(), t2d=t2d_t, d2t=d2t_t, draft_vocab_size=None)
    with atomic_dir(out_dir) as staging:
        model.save_pretrained(str(staging))
        algorithms.check_checkpoint(staging, algorithm, algorithm.config_facts(config))
        (staging / "draftline_provenance.json").write_text(
            json.dumps({"untrained": True, "algorithm": algorithm.name, "seed": seed, "config": str(config_dir),
                        "d2t": str(d2t), "t2d": str(t2d)}, indent=1) + "\n"
        )
    log.info("untrained draft (seed %d) written to %s", seed, out_dir)
    return Path(out_dir)
