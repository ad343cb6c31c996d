"""Where the Trainer (and, online, the hidden-state server) runs: the job's GPUs, one torchrun
process each, or the CPU. Online on CUDA the server takes the first
`hidden_states.online_server_gpus` of the job's GPUs and the Trainer the rest (0: the server shares
the Trainer's first GPUs); on CPU each gets half the job's threads."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from draftline.stages.train.settings import HiddenStateSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    cuda: bool
    world_size: int  # Trainer processes (1 on the CPU)
    trainer_threads: int
    server_threads: int = 1  # online only
    trainer_devices: list[str] | None = None  # online on CUDA: CUDA_VISIBLE_DEVICES of each
    server_devices: list[str] | None = None


def check_world_size(planned: dict, gpus: int, server_gpus: int = 0) -> int:
    """The job's GPU count, whose Trainer share (all but the online server's `server_gpus`) must
    be the world size the plan resolved (it is a param)."""
    if planned.get("device") == "cuda" and gpus - server_gpus != planned["world_size"]:
        raise ValueError(
            f"this training job was given {gpus} GPU(s)"
            + (f", {server_gpus} of them for the online hidden-state server," if server_gpus else "")
            + f" but planned for world size {planned['world_size']}: set the train rule's gpu resource "
            "where the plan reads it (the profile's set-resources, or --set-resources train:gpu=N) as a "
            "plain number"
        )
    return gpus


def split_devices(devices: list[str], server_gpus: int, server_ranks: int = 1) -> tuple[list[str], list[str]]:
    """Online mode on CUDA: the first `server_gpus` devices for the server, the rest for the Trainer;
    `server_gpus` 0: the server shares the Trainer's first `server_ranks` devices."""
    if server_gpus == 0:
        if len(devices) < server_ranks:
            raise ValueError(
                f"hidden_states.mode online with online_server_gpus 0: the server shares the Trainer's GPUs "
                f"and loads the target over {server_ranks} of them, but the train job has {len(devices)} "
                f"({','.join(devices) or 'none'}): give the train rule gpu={server_ranks} or more"
            )
        return devices[:server_ranks], devices
    if len(devices) <= server_gpus:
        raise ValueError(
            f"hidden_states.mode online: the train job has {len(devices)} GPU(s) "
            f"({','.join(devices) or 'none'}) but the server takes hidden_states.online_server_gpus = "
            f"{server_gpus} and the Trainer needs at least one more: give the train rule "
            f"gpu={server_gpus + 1} or more (--set-resources train:gpu=N), or lower online_server_gpus"
        )
    return devices[:server_gpus], devices[server_gpus:]


def split_threads(threads: int) -> tuple[int, int]:
    """Online mode on CPU: (server, Trainer) threads, half each, at least one each."""
    server = max(1, threads // 2)
    return server, max(1, threads - server)


def place(gpus: int, threads: int, source: HiddenStateSource) -> Placement:
    """The Trainer's (and the online server's) devices and threads for a job given `gpus` GPUs
    (0 or no CUDA: the CPU) and `threads` threads."""
    import torch

    from draftline.runtime.devices import visible_gpus

    cuda = torch.cuda.is_available() and gpus > 0
    if gpus > 0 and not torch.cuda.is_available():
        log.info("no CUDA here (the job was given %d GPU(s)): training on the CPU", gpus)
    if not source.online:
        return Placement(cuda, min(gpus, torch.cuda.device_count()) if cuda else 1, threads)
    if cuda:
        server_devices, trainer_devices = split_devices(visible_gpus()[:gpus], source.server_gpus,
                                                       source.engine.ranks if source.engine else 1)
        log.info("online hidden states: server on GPU(s) %s, Trainer on GPU(s) %s",
                 ",".join(server_devices), ",".join(trainer_devices))
        return Placement(True, len(trainer_devices), threads, 1, trainer_devices, server_devices)
    server_threads, trainer_threads = split_threads(threads)
    log.info("online hidden states on CPU: server %d thread(s), Trainer %d", server_threads, trainer_threads)
    return Placement(False, 1, trainer_threads, server_threads)
