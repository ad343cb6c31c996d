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
    folder (random decoder, the verifier's embeddings, d2t/t2d loaded), then saved the way
    its `--dry-run` saves one, so vLLM loads it exactly like a trained checkpoint.
    """
    import numpy as np
    import torch
    from speculators.train.cli import _build_from_config_only, set_seed

    from draftline.runtime.atomic import atomic_dir

    config = json.loads((Path(config_dir) / "config.json").read_text())
    algorithm = algorithms.of_config(config, str(Path(config_dir) / "config.json"))
    set_seed(seed)
    d2t_t = torch.from_numpy(np.load(d2t))
    t2d_t = torch.from_numpy(np.load(t2d))
    model = _build_from_config_only(
        algorithm.model_class(), str(config_dir), t2d=t2d_t, d2t=d2t_t,
        verifier_name_or_path=str(target) if target else None,
    )
    with atomic_dir(out_dir) as staging:
        model.save_pretrained(str(staging))
        algorithms.check_checkpoint(staging, algorithm, algorithm.config_facts(config))
        (staging / "draftline_provenance.json").write_text(
            json.dumps({"untrained": True, "algorithm": algorithm.name, "seed": seed, "config": str(config_dir),
                        "d2t": str(d2t), "t2d": str(t2d)}, indent=1) + "\n"
        )
    log.info("untrained draft (seed %d) written to %s", seed, out_dir)
    return Path(out_dir)
