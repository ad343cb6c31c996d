"""hidden_states.mode online: the train job serves the target with vLLM (CPU, for real) and
speculators' Trainer asks it for every sample's hidden states; nothing is extracted to disk.

The DAG test runs on a copy of the finished tiny run: it kills the workflow mid-training,
checks that the server went with it, resumes, loads the final draft in speculators and runs it
as a draft in vLLM. The port tests use a stand-in server (no vLLM).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import yaml
from workflow import (
    AFTER_TRAIN,
    copy_run,
    load_published_draft,
    planned_jobs,
    snakemake,
    speculative_decoding_in_vllm,
    write_config,
)

from draftline.backends.vllm_server import (
    ServerError,
    ServerSettings,
    VllmServer,
    group_alive,
    server_command,
    server_env,
)
from draftline.backends.vllm_server import server as vllm_server  # where VllmServer finds its port and command
from draftline.planning.rule_params import resolved_settings
from draftline.runtime.vllm_engine import EngineSettings, engine_settings
from draftline.stages.train import check_world_size, split_devices, split_threads

SERVER_PIDS = re.compile(r"server pid (\d+) \(process group of its own\)")


def test_the_gpu_split_gives_the_server_the_first_devices_and_the_trainer_the_rest():
    assert split_devices(["3", "5", "6", "7"], 1) == (["3"], ["5", "6", "7"])
    assert split_devices(["0", "1", "2", "3"], 2) == (["0", "1"], ["2", "3"])
    with pytest.raises(ValueError, match="online_server_gpus"):
        split_devices(["0"], 1)  # nothing left for the Trainer
    # the plan's world size is the Trainer's share; the job checks it against its GPUs
    config = {"target": {"dtype": "auto"}, "train": {"optimizer": "auto", "num_workers": "auto"},
              "hidden_states": {"mode": "online", "online_server_gpus": 1}}
    planned = resolved_settings(config, "cuda", train_gpus=4)["train"]
    assert planned["world_size"] == 3
    assert check_world_size(planned, 4, server_gpus=1) == 4
    with pytest.raises(ValueError, match="online hidden-state server"):
        check_world_size(planned, 3, server_gpus=1)
    assert resolved_settings({**config, "hidden_states": {"mode": "offline"}}, "cuda", 4)["train"]["world_size"] == 4
    assert split_threads(2) == (1, 1) and split_threads(1) == (1, 1) and split_threads(8) == (4, 4)


def test_a_one_gpu_machine_trains_online_with_the_server_sharing_the_trainers_gpu():
    """online_server_gpus 0 (as the H200 run did: benchmarks/cuda/results/h200_pipeline.md): the job asks
    one GPU, the server and the Trainer both run on it, the world size is the job's GPUs."""
    assert split_devices(["0"], 0) == (["0"], ["0"])
    assert split_devices(["2", "3"], 0, server_ranks=2) == (["2", "3"], ["2", "3"])
    with pytest.raises(ValueError, match="loads the target over 2 of them, but the train job has 1"):
        split_devices(["0"], 0, server_ranks=2)
    config = {"target": {"dtype": "auto"}, "train": {"optimizer": "auto", "num_workers": "auto"},
              "hidden_states": {"mode": "online", "online_server_gpus": 0}}
    planned = resolved_settings(config, "cuda", train_gpus=1)["train"]
    assert planned["world_size"] == 1
    assert check_world_size(planned, 1, server_gpus=0) == 1


def test_the_server_command_and_environment_follow_the_device():
    cpu = ServerSettings("/m", (2, 4, 8), EngineSettings(257, "float32", enforce_eager=True, threads=3), cuda=False)
    command = server_command(cpu, 4321, "/scratch")
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    transfer = json.loads(command[command.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "CPUHiddenStatesConnector"
    assert transfer["kv_connector_extra_config"]["shared_storage_path"] == "/scratch"
    speculative = json.loads(command[command.index("--speculative-config") + 1])
    assert speculative["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 8]
    assert "--enforce-eager" in command and "--gpu-memory-utilization" not in command
    assert server_env(cpu, None)["OMP_NUM_THREADS"] == "3"
    cuda = ServerSettings("/m", (2, 4, 8), EngineSettings(257, "bfloat16", enforce_eager=False, tensor_parallel_size=2),
                          cuda=True)
    command = server_command(cuda, 4321, "/scratch")
    assert json.loads(command[command.index("--kv-transfer-config") + 1])["kv_connector"] == "ExampleHiddenStatesConnector"
    assert command[command.index("--tensor-parallel-size") + 1] == "2"
    assert "--no-enforce-eager" in command and command[command.index("--gpu-memory-utilization") + 1] == "0.85"
    assert server_env(cuda, ["2", "3"])["CUDA_VISIBLE_DEVICES"] == "2,3"



def test_the_server_keeps_its_own_log_not_the_jobs(monkeypatch):
    """A job sends vLLM's records to its log through a logging config every vLLM process reads
    (logs.log_to); the server it starts logs to a file of its own in vLLM's format instead, unless
    the user gave vLLM a logging config."""
    from draftline.runtime.logs import VLLM_LOGGING_CONFIG, send_vllm_logs_to

    settings = ServerSettings("/m", (2, 4, 8), EngineSettings(257, "float32", enforce_eager=True, threads=1), cuda=False)
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    send_vllm_logs_to("job.log")  # as log_to does
    assert os.environ["VLLM_LOGGING_CONFIG_PATH"] == str(VLLM_LOGGING_CONFIG)
    assert "VLLM_LOGGING_CONFIG_PATH" not in server_env(settings, None)
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", "/users/own.json")
    assert server_env(settings, None)["VLLM_LOGGING_CONFIG_PATH"] == "/users/own.json"


def _parsed(command: list[str]):
    """The server's command line as vLLM's own API server parses it."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()).parse_args(command[3:])


def test_the_online_server_loads_the_target_with_the_runs_vllm_settings(monkeypatch):
    """The server gets the settings every vLLM job gets (the `vllm:` block, target.tensor_parallel_size,
    the seed), engine_args included, as flags vLLM's own parser reads back; no memory share, KV
    cache size or seed of its own."""
    config = {
        "target": {"trust_remote_code": False, "tensor_parallel_size": 2, "pipeline_parallel_size": 1},
        "tokenize": {"max_seq_len": 512},
        "vllm": {"gpu_memory_utilization": 0.7, "max_num_seqs": 64, "kv_cache_dtype": "fp8", "quantization": "fp8",
                 "enable_expert_parallel": True, "cpu_kv_cache_gib": 5,
                 "engine_args": {"block_size": 32, "max_num_batched_tokens": 4096}},
    }
    engine = engine_settings(config, {"device": "cuda", "dtype": "bfloat16", "enforce_eager": False})
    from dataclasses import replace

    cuda = ServerSettings("/m", (2, 4, 8), replace(engine, max_model_len=513, threads=1), cuda=True)
    args = _parsed(server_command(cuda, 4321, "/scratch"))
    assert (args.model, args.port, args.max_model_len, args.tensor_parallel_size) == ("/m", 4321, 513, 2)
    assert (args.gpu_memory_utilization, args.max_num_seqs, args.kv_cache_dtype, args.quantization) == (0.7, 64, "fp8", "fp8")
    assert args.enable_expert_parallel is True and args.enforce_eager is False and args.seed == 0
    assert (args.block_size, args.max_num_batched_tokens) == (32, 4096)
    assert args.enable_prefix_caching is False
    # on CPU: the KV cache size of vllm.cpu_kv_cache_gib, and the 2 ranks bound to cores of their own
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    cpu = ServerSettings("/m", (2, 4, 8), replace(engine, enable_expert_parallel=False, threads=2), cuda=False)
    env = server_env(cpu, None)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "5" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert "--gpu-memory-utilization" not in server_command(cpu, 4321, "/scratch")
    # what decides the states (the run key) leaves out what only changes speed or memory
    assert cpu.key() == replace(cpu, engine=replace(cpu.engine, max_num_seqs=8, gpu_memory_utilization=0.5)).key()
    assert cpu.key() != replace(cpu, engine=replace(cpu.engine, kv_cache_dtype="auto")).key()


# A stand-in for vLLM's API server: answers /v1/models with its name; binds the way vLLM does
# (SO_REUSEADDR, which HTTPServer sets), after a delay as vLLM imports for seconds first.
STAND_IN_SERVER = r"""
import http.server, json, sys, time

port, name, delay = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
time.sleep(delay)


class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": name}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
"""
SETTINGS = ServerSettings("/m", (2, 4, 8), EngineSettings(257, "float32", enforce_eager=True, threads=1), cuda=False)


def _served_name(endpoint: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{endpoint}/models", timeout=5) as response:
        return json.load(response)["data"][0]["id"]


def test_a_port_taken_before_the_server_binds_is_retried_and_the_other_server_is_not_taken_for_ours(
    tmp_path, monkeypatch, caplog
):
    """Two jobs on one machine: the port picked for ours is taken (another job's server listens
    and answers there) before ours binds it. Ours fails with "Address already in use", the next
    attempt gets another port, and readiness is ours, never the other server's 200."""
    import logging
    import subprocess
    import sys

    script = tmp_path / "stand_in_server.py"
    script.write_text(STAND_IN_SERVER)
    taken = vllm_server.free_port()
    other = subprocess.Popen([sys.executable, str(script), str(taken), "another job", "0"])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert _served_name(f"http://127.0.0.1:{taken}/v1") == "another job"
                break
            except OSError:
                assert time.monotonic() < deadline and other.poll() is None, "the other server did not start"
                time.sleep(0.2)
        picks, os_pick = iter([taken]), vllm_server.free_port  # the taken port first, then the OS's choices
        monkeypatch.setattr(vllm_server, "free_port", lambda: next(picks, None) or os_pick())

        def ours(settings, port, storage):
            return [sys.executable, str(script), str(port), "ours", "1"]

        monkeypatch.setattr(vllm_server, "server_command", ours)
        log_path = tmp_path / "logs/train_vllm_server.log"
        with caplog.at_level(logging.WARNING), VllmServer(SETTINGS, tmp_path / "scratch", log_path, 60) as server:
            assert server.port != taken
            assert _served_name(server.endpoint) == "ours"
            pid = server.proc.pid
        assert f"port {taken} was taken before the server bound it; trying another" in caplog.text
        log = log_path.read_text()
        assert log.count("# draftline: ") == 2 and "Address already in use" in log
        assert not group_alive(pid), "the server must stop when the block ends"
        assert _served_name(f"http://127.0.0.1:{taken}/v1") == "another job"  # untouched
    finally:
        other.terminate()
        other.wait(timeout=10)


def test_a_server_that_fails_for_another_reason_is_not_retried_whatever_the_log_held(tmp_path, monkeypatch):
    """Only this attempt's lines decide: a taken port an earlier job's lines mention in the
    (appended) log is not this failure."""
    import sys

    log_path = tmp_path / "train_vllm_server.log"
    log_path.write_text("an earlier job\nOSError: [Errno 98] Address already in use\n")

    def failing(settings, port, storage):
        return [sys.executable, "-c", "raise SystemExit('no model at /m')"]

    monkeypatch.setattr(vllm_server, "server_command", failing)
    with pytest.raises(ServerError, match="exited with status 1") as failed:
        VllmServer(SETTINGS, tmp_path / "scratch", log_path, 60).start()
    assert "no model at /m" in str(failed.value) and "Address already in use" not in str(failed.value)
    assert log_path.read_text().count("# draftline: ") == 1


def _online_config(config: dict, epochs: int | None = None) -> dict:
    config = {**config, "hidden_states": {**config.get("hidden_states", {}), "mode": "online"}}
    if epochs:
        config["train"] = {**config["train"], "epochs": epochs}
    return config


def test_online_mode_plans_no_hidden_state_jobs(tiny_model, tmp_path):
    """From nothing: offline plans the extraction jobs, online none (and no disk plot)."""
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(8)))
    config = {"target": {"model": str(tiny_model)}, "prompts": {"sources": ["prompts.jsonl"], "validation": 1, "test": 1},
              "hidden_states": {"shards": 2}, "vocab": {"draft_vocab_size": 256}, "tokenize": {"max_seq_len": 256}, "train": {"epochs": 1}}
    write_config(tmp_path, config)
    offline = planned_jobs(tmp_path, "results/lineage.json")
    assert offline["hidden_states_shard"] == 2 and offline["hidden_states_view"] == 1
    write_config(tmp_path, _online_config(config))
    online = planned_jobs(tmp_path, "results/lineage.json")
    hidden = {rule for rule in online if rule.startswith(("hidden_states", "report_hidden_states"))}
    assert not hidden and online["train"] == 1
    assert set(offline) - set(online) == {"hidden_states_disk_estimate", "hidden_states_shard", "hidden_states_view",
                                          "report_hidden_states_disk"}
    # the disk plan, before anything is tokenized (from the prompt count x max_seq_len): the
    # samples in flight, not the shard files that offline would keep
    out = snakemake(tmp_path, "-n", "results/lineage.json")
    text = out.stdout + out.stderr
    assert re.search(r"expected disk use \(hidden_states.format full, mode online; .*prompts", text), text[-3000:]
    assert re.search(r"hidden states +~[\d.]+ [KMG]B working set during training \(offline would keep at most [\d.]+ [KMG]B\)", text)
    assert "hidden-state shards" not in text


def _server_pids(run: Path) -> list[int]:
    return [int(p) for p in SERVER_PIDS.findall((run / "logs/train.log").read_text())]


def _wait_gone(pgid: int, timeout: float = 90) -> bool:
    deadline = time.monotonic() + timeout
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


@pytest.mark.dag
def test_online_training_resumes_after_a_kill_and_a_preemption_leaving_no_server(tiny_run, tmp_path):
    """One run killed twice, once each way a job dies: SIGKILL (out of memory, a node lost: no
    finally runs in the job), then, in the resumed job, SIGTERM (what Slurm sends a preempted or
    timed-out job). Each time the server goes with the job and the rerun resumes where training
    stopped; the last rerun publishes a draft speculators loads and vLLM serves."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from test_resume import assert_locked_then_unlock, kill_when, start

    run = copy_run(tiny_run, tmp_path / "run")
    epochs = 3  # one epoch per job: killed after it, killed after it again, finished
    write_config(run, _online_config(yaml.safe_load((run / "config.yaml").read_text()), epochs))
    # the hidden states are not needed: they and their jobs drop out of the plan
    assert planned_jobs(run, "results/lineage.json") == AFTER_TRAIN
    runs = run / "results/checkpoint/runs"
    old_runs = {p.name for p in runs.iterdir()}
    train_log = run / "logs/train.log"

    def new_epochs() -> list[Path]:
        return sorted((d for r in runs.iterdir() if r.name not in old_runs for d in r.iterdir()
                       if d.name.isdigit() and (d / "training_state.json").exists()), key=lambda d: int(d.name))

    def start_line() -> str:
        found = re.findall(r"resuming after epoch \d+ of \d+|resuming in epoch \d+ of \d+ after its step \d+|fresh start",
                           train_log.read_text())
        return found[-1]

    # Each signal goes to snakemake's whole process group once an epoch more is saved. The server
    # is a session of its own, so it gets none: after SIGKILL it goes by PR_SET_PDEATHSIG, after
    # SIGTERM the job unwinds and stops it.
    rerun = ("--cores", "2", "--rerun-incomplete", "results/checkpoint/final")
    proc = start(run, "--cores", "2", "results/checkpoint/final")
    kill_when(proc, lambda: len(new_epochs()) >= 1, sig=signal.SIGKILL)
    killed = new_epochs()
    assert 1 <= len(killed) < epochs - 1, "the kill must leave an epoch to preempt the resumed job in, and one to finish"
    first = _server_pids(run)[-1]
    assert _wait_gone(first), f"the server's process group {first} outlived the killed job"
    assert_locked_then_unlock(run, *rerun, sig=signal.SIGKILL)

    proc = start(run, *rerun)
    kill_when(proc, lambda: len(new_epochs()) > len(killed), sig=signal.SIGTERM)
    assert start_line() == f"resuming after epoch {len(killed)} of {epochs}"
    preempted = new_epochs()
    assert len(killed) < len(preempted) < epochs, "the preemption must land between the resumed and the last epoch"
    second = _server_pids(run)[-1]
    assert second != first and _wait_gone(second), f"the server's process group {second} outlived the preempted job"
    assert "stopping the hidden-state server" in train_log.read_text()
    assert_locked_then_unlock(run, *rerun, sig=signal.SIGTERM)

    snakemake(run, *rerun)
    # speculators' own SIGTERM handler may save a step checkpoint on the way out
    assert start_line().startswith(("resuming after epoch", "resuming in epoch")), start_line()
    last = _server_pids(run)[-1]
    assert last not in (first, second) and not group_alive(last), "the server must stop when training ends"
    log = train_log.read_text()
    assert "hidden-state server ready at http://127.0.0.1:" in log

    final = run / "results/checkpoint/final"
    model = load_published_draft(final)
    assert isinstance(model, Eagle3DraftModel)
    assert list(model.config.eagle_aux_hidden_state_layer_ids) == [2, 4, 5]
    provenance = json.loads((final / "draftline_provenance.json").read_text())
    assert provenance["epochs"] == epochs
    hidden = provenance["hidden_states"]
    assert hidden["mode"] == "online" and hidden["server"]["extracted"] == [2, 4, 5, 8]
    assert hidden["server"]["dtype"] == "float32" and provenance["inputs"]["target"]
    # the server's states were checked before the Trainer started (the tiny run's bar: conftest)
    assert hidden["fidelity"]["top1_assistant"] >= hidden["fidelity"]["min_top1"] == 0.3
    assert "fidelity of the online hidden-state server" in log
    # nothing left on disk by the server: every sample's file was deleted once loaded
    run_dir = Path(provenance["run_dir"])
    run_dir = run_dir if run_dir.is_absolute() else run / run_dir
    assert not (run_dir / "online_hidden_states").exists()
    assert not list(run_dir.rglob("*.safetensors.lock"))

    # and vLLM serves it as the target's EAGLE-3 draft (the lossless comparison with plain
    # decoding is test_train's: here the draft only has to load and propose tokens)
    served = speculative_decoding_in_vllm(provenance["verifier"]["local_path"], final, tmp_path, compare_plain=False)
    assert served["metrics"]["vllm:spec_decode_num_drafts"] > 0
    assert served["metrics"]["vllm:spec_decode_num_draft_tokens"] > 0


def test_the_trainer_waits_for_a_slow_write_longer_than_hs_connectors_10_s(tmp_path, monkeypatch):
    """A sample's file whose write (its flock) outlasts hs_connectors' own timeout is still read:
    train_entry raises the wait, in the Trainer and in its spawned loader workers."""
    import fcntl
    import pickle
    import threading

    import hs_connectors.transfer as transfer
    import speculators.train.dataloader as dataloader

    from draftline.stages.train import entry as train_entry

    monkeypatch.setattr(transfer, "wait_for_lock", transfer.wait_for_lock)
    monkeypatch.setattr(dataloader, "_worker_init_fn", dataloader._worker_init_fn)
    lock = tmp_path / "hs.safetensors.lock"
    fd = os.open(lock, os.O_CREAT | os.O_WRONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the server's writer holds it until the file is written
    threading.Timer(1.0, os.close, (fd,)).start()
    with pytest.raises(TimeoutError):
        transfer.wait_for_lock(str(lock), timeout=0.2)  # speculators' wait, shortened
    train_entry.patch_lock_wait(5.0)
    transfer.wait_for_lock(str(lock), timeout=0.2)  # now waits until the writer lets go
    assert not lock.exists()
    train_entry.patch_lock_wait_in_workers()
    # spawned workers get the init function by reference: it must pickle as draftline's
    assert pickle.loads(pickle.dumps(dataloader._worker_init_fn)) is train_entry._worker_init


# A stand-in for the online server (no vLLM): vLLM's API as speculators' client uses it (GET
# /v1/models; POST /v1/completions with the row's token ids, answered with the path of a
# hidden-state file it wrote, random states of the right shape) that fails the rows listed in
# FAIL_FILE: one the way a failed connector write looks (a path with no file behind it), the
# other with an answer missing kv_transfer_params. Each request's row is appended to REQUESTS.
FAILING_SERVER = r"""
import http.server, json, sys, uuid
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

port, name, storage, fail_file, requests = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4], sys.argv[5]
hidden, layers = int(sys.argv[6]), int(sys.argv[7])
fail = {tuple(ids): how for ids, how in json.loads(Path(fail_file).read_text())}
storage.mkdir(parents=True, exist_ok=True)


class Server(http.server.BaseHTTPRequestHandler):
    def _answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer({"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "test"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = [int(i) for i in body["prompt"]]
        how = fail.get(tuple(ids))
        with open(requests, "a") as log:
            log.write(json.dumps({"ids": ids, "failed": how}) + "\n")
        path = storage / f"{uuid.uuid4().hex}.safetensors"
        if how is None:
            states = np.random.default_rng(len(ids)).standard_normal((len(ids), layers, hidden)).astype(np.float32)
            save_file({"hidden_states": states, "token_ids": np.asarray(ids, dtype=np.int64)}, str(path))
        answer = {"id": "c", "object": "text_completion", "created": 0, "model": name,
                  "choices": [{"index": 0, "text": "x", "finish_reason": "length", "logprobs": None,
                               "prompt_token_ids": ids}]}
        if how != "no_transfer_params":
            answer["kv_transfer_params"] = {"hidden_states_path": str(path)}  # no file behind it for "no_file"
        self._answer(answer)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", port), Server).serve_forever()
"""


@pytest.fixture
def online_inputs(tiny_model, tmp_path):
    """The tiny target's training inputs without hidden-state files (online mode makes them)."""
    from speculators.train.vocab_mapping import save_token_frequency_distribution
    from test_train import AUX, DRAFT_VOCAB, build_dataset

    from draftline.stages.speculator_config import write_speculator_config
    from draftline.stages.train import TrainInputs
    from draftline.stages.vocab import write_vocab

    root = tmp_path / "inputs"
    dataset = build_dataset(tiny_model, root / "tokenized" / "dataset")
    save_token_frequency_distribution(dataset, root / "tokenized" / "token_freq.pt")
    (root / "layer_ids.json").write_text(json.dumps({"aux": AUX, "extracted": [*AUX, 8], "num_hidden_layers": 8}))
    write_vocab(root / "tokenized" / "token_freq.pt", tiny_model, DRAFT_VOCAB,
                root / "vocab" / "d2t.npy", root / "vocab" / "t2d.npy", root / "vocab" / "summary.json")
    write_speculator_config(root / "config", tiny_model, root / "layer_ids.json", DRAFT_VOCAB)
    inputs = TrainInputs(config_dir=root / "config", dataset=root / "tokenized" / "dataset", hidden_states=None,
                         d2t=root / "vocab" / "d2t.npy", t2d=root / "vocab" / "t2d.npy",
                         layer_ids=root / "layer_ids.json", target=str(tiny_model))
    return inputs, dataset


@pytest.mark.dag
def test_samples_the_server_fails_are_counted_and_fail_the_run_unless_allowed(online_inputs, tmp_path, monkeypatch):
    """speculators' Trainer (online, --on-missing generate) skips a sample whose hidden states
    the server did not give after its retries, with only a warning. Here the server fails a
    training row and a validation row: with the default hidden_states.online_max_skipped_samples
    (0) the job fails before publishing, naming the count and the setting; allowing 2, the rerun
    publishes without training again and the checkpoint's provenance and the summary hold the
    count."""
    import sys

    from draftline.fidelity import FidelitySettings
    from draftline.stages.summary import build_summary, to_markdown
    from draftline.stages.train import HiddenStateSource, TrainJob, TrainSettings, train

    inputs, dataset = online_inputs
    # 16 rows, train_fraction 0.75: rows 0-11 train, 12-15 validate
    failing = {2: "no_file", 13: "no_transfer_params"}
    fail_file, requests = tmp_path / "fail.json", tmp_path / "requests.jsonl"
    fail_file.write_text(json.dumps([[dataset[row]["input_ids"].tolist(), how] for row, how in failing.items()]))
    script = tmp_path / "failing_server.py"
    script.write_text(FAILING_SERVER)

    def stand_in(settings, port, storage):
        return [sys.executable, str(script), str(port), settings.target_dir, str(storage), str(fail_file),
                str(requests), "128", str(len(settings.extracted))]

    monkeypatch.setattr(vllm_server, "server_command", stand_in)
    results = tmp_path / "results"
    runs, final = results / "checkpoint/runs", results / "checkpoint/final"
    settings = TrainSettings(epochs=1, total_seq_len=256, train_fraction=0.75, num_workers=0)

    def source(allowed: int) -> HiddenStateSource:
        # no fidelity check before training (rows 0): its sample would ask the failing rows first,
        # and the stand-in's states are not the target's; only the Trainer's skips are counted here
        return HiddenStateSource(mode="online", ready_timeout_s=60, max_seq_len=256, dtype="float32",
                                 server_log=str(tmp_path / "logs/train_vllm_server.log"), max_skipped_samples=allowed,
                                 fidelity=FidelitySettings(rows=0))

    with pytest.raises(RuntimeError) as failed:
        train(inputs, settings, TrainJob(runs, final, threads=2), source=source(0))
    message = str(failed.value)
    assert "skipped 2 sample(s) (1 in training, 1 in validation" in message, message
    assert "hidden_states.online_max_skipped_samples is 0" in message
    assert "set hidden_states.online_max_skipped_samples: 2 (or more)" in message
    assert not final.exists()
    # each failing row was asked for 3 times (speculators' generation retries) before it was skipped
    asked = [json.loads(line) for line in requests.read_text().splitlines()]
    for row, how in failing.items():
        ids = dataset[row]["input_ids"].tolist()
        assert [r["failed"] for r in asked if r["ids"] == ids] == [how] * 3, row
    assert all(r["failed"] is None for r in asked if r["ids"] not in [dataset[i]["input_ids"].tolist() for i in failing])

    # allowed: the finished epoch is published as it is (no request: nothing is trained again)
    requests.unlink()
    train(inputs, settings, TrainJob(runs, final, threads=2), source=source(2))
    assert not requests.exists()
    provenance = json.loads((final / "draftline_provenance.json").read_text())
    assert provenance["skipped_samples"] == {"total": 2, "training": 1, "validation": 1, "allowed": 2,
                                             "per_epoch": {"1": {"training": 1, "validation": 1}}}
    summary = build_summary(results, run_name="online", target="tiny", device="cpu")
    assert summary["training"]["skipped_samples"]["total"] == 2
    assert any("skipped 2 sample(s)" in w and "online_max_skipped_samples allows 2" in w for w in summary["warnings"])
    assert "Samples skipped without hidden states: 2 (1 in training, 1 in validation; 2 allowed)." in to_markdown(summary)


@pytest.mark.dag
def test_a_row_the_server_fails_in_the_fidelity_check_names_the_row_and_the_log(online_inputs, tmp_path, monkeypatch):
    """The fidelity check before training asks the server for rows as the Trainer would; when the
    server answers a row without hidden states, the job stops before any training step with the
    row, what the server answered, and its log (not speculators' bare InvalidResponseError)."""
    import sys

    from draftline.backends.vllm_server import ServerError
    from draftline.fidelity import FidelitySettings
    from draftline.stages.train import HiddenStateSource, TrainJob, TrainSettings, train

    inputs, dataset = online_inputs
    fail_file, requests = tmp_path / "fail.json", tmp_path / "requests.jsonl"
    fail_file.write_text(json.dumps([[dataset[2]["input_ids"].tolist(), "no_transfer_params"]]))
    script = tmp_path / "failing_server.py"
    script.write_text(FAILING_SERVER)
    monkeypatch.setattr(vllm_server, "server_command", lambda settings, port, storage: [
        sys.executable, str(script), str(port), settings.target_dir, str(storage), str(fail_file), str(requests),
        "128", str(len(settings.extracted))])
    log = tmp_path / "logs/train_vllm_server.log"
    source = HiddenStateSource(mode="online", ready_timeout_s=60, max_seq_len=256, dtype="float32", server_log=str(log),
                               fidelity=FidelitySettings(rows=len(dataset), min_top1=0.0))  # every row: row 2 too
    final = tmp_path / "results/checkpoint/final"
    with pytest.raises(ServerError) as failed:
        train(inputs, TrainSettings(epochs=1, total_seq_len=256, train_fraction=0.75, num_workers=0),
              TrainJob(tmp_path / "results/checkpoint/runs", final, threads=2), source=source)
    message = str(failed.value)
    assert "the fidelity check before training" in message and f"(log {log})" in message, message
    assert "dataset row 2: the server answered without hidden states (Response missing kv_transfer_params)" in message
    assert not final.exists()
