"""What every job runs with, whatever its stage: vLLM engines and their settings (`vllm_engine`),
the GPUs a job may use (`devices`), atomic publishing of outputs (`atomic`), the job's log
(`logs`) and which shard of a sharded stage a job is (`shards`)."""
