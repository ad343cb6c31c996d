"""Every place draftline reaches past speculators' public API (and hs_connectors', torch's), in
one table: each attribute replaced at run time (`PATCHES`) and each private name relied on
(`PRIVATE`), with the draftline function that does it, why, and the versions it is written for
(the locks pin speculators and hs-connectors 0.9.0 everywhere; torch 2.11-2.13).

speculators 0.9.0 has a public hook for none of them: its Trainer, checkpointer and loader take no
device (they assume an accelerator), `setup_metric_logger` replaces the handlers of its metric
logger, `create_train_val_loaders` takes no worker-init function, and the Trainer, the batch
recovery and the signal handler take no callback. Where it has one, draftline uses it: the
untrained baseline is built by `cli.build_draft_model` (the Trainer's own path for a config-only
`--from-pretrained` folder), the DFlash-family and P-EAGLE configs by the model classes'
`from_training_args` (draftline.algorithms.eagle3.training_config).

`replace(target, new)` is the one way `entry` and `preflight.training_entry` swap an attribute:
a target not in PATCHES is refused, so each one is named here first. After a speculators
upgrade, tests/test_train.py checks every target is still there.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

SPECULATORS = "speculators 0.9.0"


@dataclass(frozen=True)
class Patch:
    target: str  # "module:attribute" or "module:Class.attribute"
    by: str  # the draftline function that does it
    why: str
    versions: str  # what it is written for; "only ..." when it applies to some runs


PATCHES = (
    Patch("speculators.train.trainer:get_local_rank", "stages.train.entry.apply_cpu_shims",
          "the Trainer moves the model and every batch to get_local_rank() (0 = cuda:0): 'cpu'",
          f"{SPECULATORS}; only without an accelerator"),
    Patch("speculators.train.checkpointer:get_current_device", "stages.train.entry.apply_cpu_shims",
          "a resumed checkpoint loads onto get_current_device(), 'cuda:0' without an accelerator: 'cpu'",
          f"{SPECULATORS}; only without an accelerator"),
    Patch("torch:accelerator.synchronize", "stages.train.entry.apply_cpu_shims",
          "speculators' step timer synchronizes the accelerator, which raises where there is none: a no-op then",
          f"{SPECULATORS} with torch 2.11-2.13; only without an accelerator"),
    Patch("hs_connectors.transfer:wait_for_lock", "stages.train.entry.patch_lock_wait",
          "the file transfer waits a fixed 10 s for each sample's write lock; on a loaded CPU machine the "
          "server's write took longer for 10 of 61 samples, each then recomputed: $DRAFTLINE_HS_LOCK_TIMEOUT_S "
          "(the connector drops the lock when its process dies, so a longer wait cannot hang on a dead server)",
          "hs-connectors 0.9.0; only online hidden states"),
    Patch("speculators.train.dataloader:_worker_init_fn", "stages.train.entry.patch_lock_wait_in_workers",
          "the loader's workers are spawned (a fresh import, without the lock wait above): they get it through "
          "the worker-init function, which runs speculators' own first",
          f"{SPECULATORS}; only online hidden states with loader workers"),
    Patch("speculators.train.cli:setup_metric_logger", "stages.train.entry.install_metrics_recorder",
          "its dictConfig replaces the metric logger's handlers: metrics.jsonl's recorder is attached after it, "
          "and the records are kept off the console (five lines a step)", SPECULATORS),
    Patch("speculators.train.cli:Trainer", "stages.train.entry.install_step_counts",
          "a subclass that reads the steps per epoch, the epochs and the epoch under way for the progress lines, "
          "then runs speculators' own loops", SPECULATORS),
    Patch("speculators.train.recovery:BatchRecoveryCoordinator.consume", "stages.train.entry.install_skip_counter",
          "the one call every training and validation batch makes before it is used: the samples the collator "
          "dropped (the batch's error_records; the Trainer only warns) are counted there, then its own consume runs",
          SPECULATORS),
    Patch("speculators.train.graceful_shutdown:GracefulShutdownHandler.__init__",
          "stages.train.entry.ignore_repeated_sigterm",
          "its signal handler logs under a plain Lock (private _lock): a second SIGTERM re-entering on the same "
          "thread hung the Trainer in a futex; an RLock lets it see _interrupted and return", SPECULATORS),
    Patch("speculators.train.graceful_shutdown:GracefulShutdownHandler.restore",
          "stages.train.entry.ignore_repeated_sigterm",
          "restore() puts the default SIGTERM back before the interrupt save: once interrupted (private "
          "_interrupted), SIGTERM is ignored so Slurm's second signal cannot cut the save", SPECULATORS),
    Patch("speculators.train.cli:maybe_setup_distributed", "preflight.training_entry.record_backend",
          "the process group's backend and world size, read right after speculators sets the group up (it "
          "destroys it when training ends)", SPECULATORS),
)

PRIVATE = (
    Patch("speculators.models.dflash:DFlashDraftModel._build_base_config_kwargs",
          "algorithms.eagle3.config_from_training_args",
          "a draft's config without its weights: each model class's from_training_args runs on a stand-in class "
          "that keeps the config (its __init__, load_vocab_mappings and load_verifier_weights), and the DFlash "
          "family's calls this staticmethod through the class, so the stand-in carries it", SPECULATORS),
)

_BY_TARGET = {patch.target: patch for patch in PATCHES}


def _owner(target: str) -> tuple[object, str]:
    module, _, path = target.partition(":")
    owner = importlib.import_module(module)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, name


def current(target: str):
    """What `target` ("module:attribute") holds now."""
    return getattr(*_owner(target))


def replace(target: str, new):
    """Put `new` in `target`'s place (an entry of PATCHES) and return what was there."""
    if target not in _BY_TARGET:
        raise KeyError(f"{target}: not in draftline.stages.train.speculators_patches.PATCHES: name it there, with why")
    owner, name = _owner(target)
    real = getattr(owner, name)
    setattr(owner, name, new)
    return real
