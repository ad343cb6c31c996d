"""Build the target model folder: the embedded SmolLM2, a hub download, or a chat-template view."""

import dataclasses
from pathlib import Path

from draftline.lineage.provenance import write_provenance
from draftline.runtime.logs import log_to
from draftline.stages.target_model import build_target, resolve_target

if __name__ == "__main__":
    log_to(snakemake.log[0])
    # An empty named input is an empty list; a set one is a single path.
    chat_template = snakemake.input.get("chat_template") or None
    if isinstance(chat_template, list):
        chat_template = chat_template[0]
    # Jobs run in the Snakemake working directory: config paths are relative to it.
    spec = resolve_target(
        snakemake.params.model,
        name=snakemake.params.name,
        chat_template=chat_template,
        repo_root=Path.cwd(),
        revision=snakemake.params.spec.revision,  # target.revision, as the plan resolved the target with it
    )
    # A hub download fetches the commit the plan resolved (the rule's `identity` param), not
    # whatever the branch points at by the time this job runs.
    identity = snakemake.params.get("identity") or {}
    if spec.kind == "hub" and identity.get("revision"):
        spec = dataclasses.replace(spec, commit=identity["revision"])
    build_target(spec, snakemake.output[0], trust_remote_code=snakemake.params.trust_remote_code)
    write_provenance(snakemake)  # provenance.json beside the artifact
