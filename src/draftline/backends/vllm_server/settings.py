"""How the server loads the target (ServerSettings): the run's engine settings, the layers it
extracts, the device; what provenance shows and what decides the states."""

from __future__ import annotations

from dataclasses import dataclass

from draftline.runtime.vllm_engine import EngineSettings, dtype_for, engine_kwargs, output_settings


@dataclass(frozen=True)
class ServerSettings:
    """How the server loads the target: the run's vLLM settings (`engine`, the one object every
    vLLM job gets), with the context of a row plus one token and the server's own threads."""

    target_dir: str
    extracted: tuple[int, ...]  # vLLM layer ids: the aux layers and the last one
    engine: EngineSettings  # max_model_len: the longest row + 1; threads: the server's (CPU)
    cuda: bool

    @property
    def dtype(self) -> str:
        return dtype_for(self.engine.dtype, self.cuda)

    def engine_kwargs(self) -> dict:
        """The engine arguments the server runs with (as an in-process extraction engine's)."""
        return engine_kwargs(self.engine, self.cuda, extraction=True)

    def record(self) -> dict:
        """What provenance shows: the engine arguments, the layers, the device and threads."""
        return {**self.engine_kwargs(), "extracted": list(self.extracted), "cuda": self.cuda,
                "threads": self.engine.threads, "cpu_kv_cache_gib": self.engine.cpu_kv_cache_gib}

    def key(self) -> dict:
        """What decides the states (the run key's part): not the speed-only settings."""
        e = self.engine
        return {"extracted": list(self.extracted), "dtype": self.dtype, "max_model_len": e.max_model_len,
                "seed": e.seed, "tensor_parallel_size": e.tensor_parallel_size,
                "pipeline_parallel_size": e.pipeline_parallel_size, "trust_remote_code": e.trust_remote_code,
                **output_settings(e)}
