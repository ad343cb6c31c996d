"""The train step from end to end: place the Trainer, check the inputs, open (or resume) the
run's folder, count what its sampler will leave out, run speculators' Trainer (online: against
this job's hidden-state server), check what it skipped, publish final/ and prune earlier runs."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from draftline.stages.train.args import TrainerOptions, speculators_args, train_data_ratio
from draftline.stages.train.checkpoints import describe_start, open_run, prune_old_runs
from draftline.stages.train.inputs import check_inputs
from draftline.stages.train.online import server_key, server_settings, train_online
from draftline.stages.train.placement import place
from draftline.stages.train.publish import check_skipped_samples, publish, view_fidelity
from draftline.stages.train.run import exit_on_sigterm, launch
from draftline.stages.train.sampling import describe as describe_dropped
from draftline.stages.train.sampling import dropped_count, dropped_samples
from draftline.stages.train.settings import HiddenStateSource, TrainInputs, TrainJob, TrainSettings

log = logging.getLogger(__name__)


def train(inputs: TrainInputs, settings: TrainSettings, job: TrainJob,
          source: HiddenStateSource = HiddenStateSource()) -> Path:
    """Train (or resume) and publish `job.final_dir`; return it."""
    if source.online:
        exit_on_sigterm()
    where = place(job.gpus, job.threads, source)
    server = server_settings(inputs, source, where, job.trust_remote_code) if source.online else None
    options = TrainerOptions.resolve(settings, where.cuda, source.online, job.trust_remote_code)
    facts = check_inputs(inputs, server.dtype if server else None)
    run = open_run(job.runs_dir, inputs, settings, options, where.world_size, server_key(server))
    dropped = dropped_samples(inputs.dataset, settings.total_seq_len, train_data_ratio(settings, facts.rows),
                              where.world_size, settings.epochs, settings.seed)
    (log.warning if dropped_count(dropped) else log.info)("speculators' sampler: %s", describe_dropped(dropped))
    log.info(
        "run %s: %d rows, %s hidden states (format %s), optimizer %s, %s, %s",
        run.key, facts.rows, facts.hidden_states_dtype, facts.hidden_states_format, options.optimizer,
        f"{where.world_size} GPU process(es)" if where.cuda else f"CPU with {where.trainer_threads} thread(s)",
        describe_start(run.dir, settings.epochs),
    )

    def run_trainer(run_inputs: TrainInputs, endpoint: str | None = None) -> None:
        args = speculators_args(run_inputs, settings, facts, options, run.dir, vllm_endpoint=endpoint)
        launch(args, where, run.metrics_path, source.ready_timeout_s if endpoint else None)

    started = time.monotonic()
    if server is not None:
        hidden_states = train_online(inputs, source, server, where, run.dir, run_trainer)
    else:
        # offline: the files (their fingerprint is under inputs) and their check, read before the
        # Trainer starts (a broken view stops here); online: the target (its fingerprint under
        # inputs) and the server that made them
        hidden_states = {"mode": "offline", "path": str(inputs.hidden_states),
                         "fidelity": view_fidelity(inputs.hidden_states)}
        run_trainer(inputs)
    log.info("trainer finished in %.1f s", time.monotonic() - started)
    skipped = check_skipped_samples(run.metrics_path, source, run.dir)
    record = {
        "optimizer": options.optimizer,
        "num_workers": options.num_workers,
        "fsdp": options.fsdp,
        "world_size": where.world_size,
        "device": "cuda" if where.cuda else "cpu",
        "threads": where.trainer_threads,
        "hidden_states_dtype": facts.hidden_states_dtype,
        "hidden_states_format": facts.hidden_states_format,
        "hidden_states": hidden_states,
        "rows": facts.rows,
        # sample loads the Trainer skipped without hidden states, and how many were allowed
        "skipped_samples": skipped,
        # samples its sampler cut at train.total_seq_len, and left out of each epoch (sampling.py)
        "dropped_samples": dropped,
    }
    final = publish(run, job, settings, facts, inputs.target, record, started)
    if not settings.keep_old_runs:
        prune_old_runs(Path(job.runs_dir), keep=run.key)
    return final
