"""A real single-node Slurm (Debian's packages) with two fake GPUs, private to one test session.

Everything lives in one folder: munge key and socket, slurm.conf/gres.conf (found by every
Slurm command through SLURM_CONF), state, spool, logs, and the fake GPU device files.
Daemons run in the foreground as children of the test, on free ports, and are stopped by
PID. `sbatch` is wrapped (first on PATH) so the test sees every submission's arguments.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
BINARIES = ["slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "munged"]
# Job steps cannot use SLURM_CONF: the executor plugin strips SLURM_* variables before the
# `srun` inside each job, so srun reads the system path. A copy goes there while we run.
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
MARKER = "# draftline test cluster: "


class Unavailable(Exception):
    """This machine cannot run a Slurm cluster; the message says why (tests skip with it)."""


def _find(binary: str) -> str | None:
    return shutil.which(binary) or next(
        (str(p) for d in ("/usr/sbin", "/usr/bin", "/sbin") if (p := Path(d) / binary).exists()), None
    )


def ensure_packages() -> None:
    """Install Debian's Slurm and munge packages if they are missing and apt can run."""
    if all(_find(b) for b in BINARIES):
        return
    if sys.platform != "linux" or os.geteuid() != 0:
        raise Unavailable("Slurm is not installed and installing it needs root on Linux "
                          f"(apt-get install {' '.join(PACKAGES)})")
    if not shutil.which("apt-get"):
        raise Unavailable(f"Slurm is not installed and there is no apt-get to install {' '.join(PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            raise Unavailable(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    missing = [b for b in BINARIES if not _find(b)]
    if missing:
        raise Unavailable(f"installed {' '.join(PACKAGES)} but {', '.join(missing)} still missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SBATCH_WRAPPER = """#!/bin/sh
# Record each submission's arguments (one file per call, NUL-separated), then submit for real.
printf '%s\\0' "$@" > "$(mktemp "{calls}/$(date +%s%N).XXXXXX")"
exec "{sbatch}" "$@"
"""


@dataclass
class SlurmCluster:
    root: Path
    gpus: int = 2
    # Declared node size (SlurmdParameters=config_overrides lets it exceed the hardware, so
    # a profile's real GPU-node requests schedule here; nothing enforces them without cgroups).
    cpus: int | None = None
    memory_mb: int | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def sbatch_calls_dir(self) -> Path:
        return self.root / "sbatch_calls"

    def env(self, base: dict | None = None) -> dict:
        """Environment for clients (snakemake, sbatch, squeue): this cluster's conf, wrapped sbatch."""
        env = dict(base if base is not None else os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = os.pathsep.join([str(self.root / "bin"), env.get("PATH", "")])
        return env

    def sbatch_calls(self) -> list[list[str]]:
        """Arguments of every sbatch call so far, oldest first."""
        if not self.sbatch_calls_dir.exists():
            return []
        files = sorted(self.sbatch_calls_dir.iterdir(), key=lambda p: int(p.name.split(".")[0]))
        return [p.read_text().removesuffix("\0").split("\0") for p in files]

    # ------------------------------------------------------------------ start/stop

    def start(self, timeout_s: float = 60) -> None:
        ensure_packages()
        for sub in ("etc", "state", "spool", "log", "munge", "dev", "bin"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            self._write_conf()
            self._spawn("slurmctld", [_find("slurmctld"), "-D", "-c", "-f", str(self.conf)])
            self._spawn("slurmd", [_find("slurmd"), "-D", "-f", str(self.conf)])
            self._wait_idle(timeout_s)
        except Unavailable:
            self.stop()
            raise
        except Exception:
            logs = self.logs_tail()
            self.stop()
            raise Unavailable(f"Slurm did not come up here:\n{logs}") from None

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                            env=self.env(), start_new_session=True)

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        # munged refuses group/world-accessible keys and folders
        key.chmod(0o400)
        munge.chmod(0o711)  # the socket must be reachable by job users
        self._spawn("munged", [
            _find("munged"), "--foreground", "--force",
            f"--key-file={key}", f"--socket={munge / 'munge.socket'}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ])
        for _ in range(100):
            if (munge / "munge.socket").exists():
                return
            if self.procs["munged"].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("munged did not start")

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        node = subprocess.run([_find("slurmd"), "-C"], capture_output=True, text=True, check=True)
        node_line = next(line for line in node.stdout.splitlines() if line.startswith("NodeName="))
        if self.cpus or self.memory_mb:
            fields = dict(f.split("=", 1) for f in node_line.split())
            cpus = self.cpus or int(fields["CPUs"])
            node_line = (f"NodeName={fields['NodeName']} CPUs={cpus} Boards=1 SocketsPerBoard=1 "
                         f"CoresPerSocket={cpus} ThreadsPerCore=1 "
                         f"RealMemory={self.memory_mb or fields['RealMemory']}")
        dev = self.root / "dev"
        for i in range(self.gpus):
            # gres File= must name character devices; /dev/null's twins are harmless
            path = dev / f"gpu{i}"
            if not path.exists():
                os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
        r = self.root
        (r / "etc" / "slurm.conf").write_text(f"""\
{MARKER}{r}
ClusterName=draftline-test
SlurmctldHost={host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long + 1 s before it may start again (default 120)
AuthInfo=socket={r / 'munge' / 'munge.socket'},cred_expire=10
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'state' / 'slurmctld.pid'}
SlurmdPidFile={r / 'spool' / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MinJobAge=300
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
# the main scheduler looks at pending (e.g. requeued) jobs every 2 s, not every 60 s
SchedulerParameters=sched_interval=2
# as on sites that do not requeue by default: only a job submitted with --requeue (the
# profile's slurm-requeue) can be requeued
JobRequeue=0
{node_line.strip()} Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        (r / "etc" / "gres.conf").write_text(
            f"AutoDetect=off\nName=gpu File={dev}/gpu[0-{self.gpus - 1}]\n")
        self._install_system_conf()
        self.sbatch_calls_dir.mkdir(exist_ok=True)
        wrapper = r / "bin" / "sbatch"
        wrapper.write_text(SBATCH_WRAPPER.format(calls=self.sbatch_calls_dir, sbatch=_find("sbatch")))
        wrapper.chmod(0o755)

    def _install_system_conf(self) -> None:
        if SYSTEM_CONF.exists() and not SYSTEM_CONF.read_text().startswith(MARKER):
            raise Unavailable(f"{SYSTEM_CONF} already exists (a real Slurm here?): not replacing it")
        if SYSTEM_CONF.exists() and not self._ours(SYSTEM_CONF) and self._owner_alive(SYSTEM_CONF):
            raise Unavailable(f"{SYSTEM_CONF} belongs to another running test cluster")
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SYSTEM_CONF.write_text(self.conf.read_text())

    def _ours(self, path: Path) -> bool:
        return path.read_text().startswith(f"{MARKER}{self.root}\n")

    @staticmethod
    def _owner_alive(path: Path) -> bool:
        root = Path(path.read_text().splitlines()[0].removeprefix(MARKER))
        pid_file = root / "state" / "slurmctld.pid"
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
            return True
        except (OSError, ValueError):
            return False

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}")
            out = subprocess.run([_find("sinfo"), "-h", "-o", "%T"], capture_output=True,
                                 text=True, env=self.env())
            if out.stdout.strip() == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"node not idle after {timeout_s:.0f} s")

    def logs_tail(self, chars: int = 3000) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")
            if text.strip():
                parts.append(f"--- {path.name}\n{text[-chars:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel this cluster's jobs, then stop slurmd, slurmctld and munged by PID."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            jobs = subprocess.run([_find("squeue"), "-h", "-o", "%i"], capture_output=True,
                                  text=True, env=self.env()).stdout.split()
            if jobs:
                subprocess.run([_find("scancel"), *jobs], env=self.env(), check=False)
                time.sleep(2)
        if SYSTEM_CONF.exists() and self._ours(SYSTEM_CONF):
            SYSTEM_CONF.unlink()
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
