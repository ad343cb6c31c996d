"""draftline: a Snakemake workflow that trains EAGLE-3 draft models for a target LLM.

The importable steps live here; `scripts/` holds thin Snakemake adapters around them.
"""
