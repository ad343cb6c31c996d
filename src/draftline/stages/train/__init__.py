"""Train the draft with speculators' own Trainer and publish the chosen checkpoint.

The Trainer runs in a child process (`draftline.stages.train.entry`: speculators' entry point
plus CPU shims), through torchrun with one process per GPU on CUDA. Checkpoints go to
`runs/<run key>/`, where the key hashes the training settings and fingerprints of every
input: a retry with the same inputs resumes from the newest epoch folder (speculators'
own resume), a changed setting or input starts a new run dir instead of resuming a stale
one; once final/ is published, the run folders of earlier settings are removed unless
`train.keep_old_runs` is set. Every epoch is kept (no `--save-best`: it skips saving
non-best epochs, so a resume would repeat them); `checkpoint_best` marks the lowest
validation loss. The chosen epoch (best validation loss, or the last one with
train_fraction 1.0) is copied to `final/` in one rename, with provenance.

Hidden states come from the extracted files (`hidden_states.mode: offline`), or, online, from a
vLLM server this job starts for the target (`backends.vllm_server`): the Trainer runs with
`--on-missing generate` against it and the server is stopped when training ends or fails. On
CUDA the server takes the first `hidden_states.online_server_gpus` of the job's GPUs and the
Trainer the rest; on CPU each gets half the job's threads. The run key then holds the server's
settings in place of the files' fingerprint. A sample the server gives no hidden states for
(after speculators' retries) is skipped by the Trainer with only a warning: train.entry counts
them in metrics.jsonl, and more than `hidden_states.online_max_skipped_samples` stops the job
before publishing (`check_skipped_samples`); the count goes into draftline_provenance.json.

One module per job, as speculators splits its own `speculators.train`:
- settings: what the step is given (TrainSettings, TrainInputs, HiddenStateSource, TrainJob)
- inputs: the input checks (check_inputs -> InputFacts)
- placement: the Trainer's (and the online server's) GPUs or threads
- args: speculators' train command line (TrainerOptions, speculators_args, launch_command)
- checkpoints: the run key, the run's folder, its epoch and step checkpoints, pruning
- run: the Trainer's child process, with its signals (preemption, a killed job)
- sampling: what speculators' sampler leaves out (samples cut at total_seq_len, per-epoch leftovers)
- online: the online hidden-state server's part (its settings, the fidelity check)
- publish: the skipped samples, the chosen epoch, final/ and its provenance
- job: `train()`, the step from end to end
- speculators_patches: every attribute of speculators the Trainer's entry point replaces, and why
"""

from draftline.stages.train.args import TrainerOptions, launch_command, speculators_args
from draftline.stages.train.checkpoints import (
    INTERRUPTED,
    NOT_IN_RUN_KEY,
    Run,
    describe_start,
    discard_incomplete_epochs,
    epoch_dirs,
    finished_epochs,
    input_fingerprints,
    local_step,
    prune_old_runs,
    run_key,
)
from draftline.stages.train.inputs import InputFacts, check_inputs
from draftline.stages.train.job import train
from draftline.stages.train.online import check_online_fidelity
from draftline.stages.train.placement import Placement, check_world_size, split_devices, split_threads
from draftline.stages.train.publish import check_skipped_samples, choose_epoch, name_verifier, name_verifier_in_run_records
from draftline.stages.train.run import TRAINER_NOISE, Terminated, run_trainer
from draftline.stages.train.settings import HiddenStateSource, TrainInputs, TrainJob, TrainSettings

__all__ = [
    "INTERRUPTED", "NOT_IN_RUN_KEY", "TRAINER_NOISE", "HiddenStateSource", "InputFacts", "Placement", "Run",
    "Terminated", "TrainInputs", "TrainJob", "TrainSettings", "TrainerOptions", "check_inputs",
    "check_online_fidelity", "check_skipped_samples", "check_world_size", "choose_epoch", "describe_start",
    "discard_incomplete_epochs", "epoch_dirs", "finished_epochs", "input_fingerprints", "launch_command",
    "local_step", "name_verifier", "name_verifier_in_run_records", "prune_old_runs", "run_key", "run_trainer",
    "speculators_args", "split_devices", "split_threads", "train",
]
