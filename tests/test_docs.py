"""The docs a user reads first: the README is a front door whose quick start is the two commands
CI runs, every link in README.md and docs/ leads somewhere, and docs/results.md (the one page of
measured figures) is what benchmarks/results_page.py builds from the records today."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from workflow import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
QUICK_START = [
    "./draftline snakemake --cores all results/checkpoint/final",
    "./draftline pytest",
]


def results_page():
    spec = importlib.util.spec_from_file_location("results_page", REPO / "benchmarks" / "results_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_page_is_current():
    page = results_page()
    built = page.build(REPO)
    current = page.PAGE.read_text() if page.PAGE.exists() else ""
    assert built == current, "docs/results.md is out of date: run python benchmarks/results_page.py"


def test_results_page_has_every_record_once(tmp_path):
    """A record added to benchmarks/ gets its own section and link; the page is built from the
    records alone (the same text whatever the order the files were written in). A folder's README.md
    is its guide, not a record: its lead opens the folder's section, its links made the page's."""
    page = results_page()
    text = page.PAGE.read_text()
    records = [p for folder in ("benchmarks/results", "benchmarks/cuda/results")
               for p in sorted(REPO.glob(f"{folder}/*.md")) if p.name != "README.md"]
    assert records
    for record in records:
        rel = record.relative_to(REPO).as_posix()
        assert text.count(f"\n### {record.stem}\n") == 1, rel
        assert f"(../{rel})" in text, rel
    # A new record shows up with its headline figures: the lead's bold line and its table.
    for folder in ("benchmarks/results", "benchmarks/cuda/results", "docs"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "benchmarks/results/new_run.md").write_text(
        "# A new run\n\n**3.5 tok/s** on one core.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n## How\n\nnot headline\n"
    )
    (tmp_path / "benchmarks/results/README.md").write_text(
        "# CPU records\n\nThe [new run](new_run.md) shows it; see [gpu.md](../../docs/gpu.md#a).\n\n## How it went\n\nrun log\n"
    )
    built = page.build(tmp_path)
    assert "### new_run\n\n**A new run**\n\n**3.5 tok/s** on one core.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n" in built
    assert "not headline" not in built and "(../benchmarks/results/new_run.md)" in built
    assert "The [new run](#new_run) shows it; see [gpu.md](gpu.md#a).\n" in built
    assert "### readme" not in built and "run log" not in built


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_links_lead_somewhere():
    """Relative links in README.md and docs/**/*.md name a file that exists and, with #anchor, a
    heading in it: a section moved out of the README leaves no link pointing at its old place."""
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no heading #{anchor} in {dest.name})")
    assert not broken, "\n".join(broken)


def test_readme_is_a_front_door():
    """At most ~160 lines, and its quick start is exactly the two commands: the main job on the
    embedded default, and the tests as .ci/run runs them."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 160, len(readme.splitlines())
    quick = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in quick.strip().splitlines()]
    assert commands == QUICK_START
    assert "./draftline pytest" in (REPO / ".ci" / "run").read_text()
    assert "docs/results.md" in readme


def test_the_sizing_pages_tables_are_what_the_sizing_code_prints():
    """docs/sizing.md's tables (per 100 M tokens on H200s and H100s, the recipes) are generated
    from draftline.planning.sizing's constants and the presets: a changed rate or preset changes the page in
    the same commit, never a figure typed twice."""
    from draftline.planning import sizing

    text = (REPO / "docs" / "sizing.md").read_text()
    block = text.split("<!-- sizing tables:", 1)[1].split("-->", 1)[1].split("<!-- end of sizing tables -->", 1)[0]
    assert block.strip() == sizing.docs_tables(REPO).strip(), "run: PYTHONPATH=src python -m draftline.planning.sizing"


def test_the_sizing_page_quotes_the_sizing_codes_constants():
    """docs/sizing.md's "what is measured" table and formulas name draftline.planning.sizing's constants
    with their values: a constant changed in the code fails here until the page says the same."""
    from draftline.planning import sizing

    text = (REPO / "docs" / "sizing.md").read_text()
    quoted = [
        "`EXTRACTION_FRACTION` of the bf16 matmul limit by `hidden_states.backend`: vllm (the default) "
        "{vllm:g} on one H100".format(**sizing.EXTRACTION_FRACTION),
        "transformers {transformers:g} on one H200".format(**sizing.EXTRACTION_FRACTION),
        f"`H200_MATMUL_FLOPS`, {sizing.H200_MATMUL_FLOPS / 1e12:g} TFLOP/s",
        f"`TRAIN_TOKENS_PER_S_8B` {sizing.TRAIN_TOKENS_PER_S_8B:,} tokens/s",
        f"`DECODE_FRACTION` {sizing.DECODE_FRACTION:g} of the matmul limit",
        f"`START_S` {sizing.START_S:g} s",
        f"`LOAD_BYTES_PER_S` {sizing.LOAD_BYTES_PER_S / 1e9:g} GB/s",
        "regeneration {regeneration:g} s (one start), extraction {extraction:g} s".format(**sizing.VLLM_START_S["cuda"][1]),
        f"SmolLM2-135M, {sizing.VLLM_START_S['cpu'][1]['regeneration']:g} s",
        "(regeneration {:.1f} s + bytes / 1.5 GB/s, extraction {:.1f} s + bytes / 1.5 GB/s)".format(
            *(sizing.vllm_start_s(sizing.LLAMA_8B, stage, "cuda", float("inf")) for stage in ("regeneration", "extraction"))),
        "CPU: trained {trained:g}, untrained {untrained:g}".format(**sizing.SPECULATIVE_SPEEDUP["cpu"]),
        "CUDA: trained {trained:.1f}, untrained {untrained:.1f}".format(**sizing.SPECULATIVE_SPEEDUP["cuda"]),
        "regeneration ~{regeneration:g}, extraction ~{extraction:g}, training (AdamW) ~{training:g}".format(**sizing.CPU),
        "; ".join(f"{kind} compute {gpu.compute:g}, decoding {gpu.decoding:g}"
                  for kind, gpu in sorted(sizing.GPUS.items())),
        "regeneration {regeneration:g},\nextraction {extraction:g}, training {training:g}, evaluation {evaluation:g}".format(
            **sizing.EXPECTED_SHARE),
        "f = `EXTRACTION_FRACTION` of\n`hidden_states.backend` ({vllm:g} for vllm, {transformers:g} for "
        "transformers)".format(**sizing.EXTRACTION_FRACTION),
        f"`A / ({sizing.DECODE_FRACTION:g} R / (2 P_active)) + U C / ({sizing.EXTRACTION_FRACTION['vllm']:g} R / F)`",
        f"`E N T / ({sizing.TRAIN_TOKENS_PER_S_8B:,} x D_8B / D)`",
    ]
    missing = [q for q in quoted if q not in text]
    assert not missing, f"docs/sizing.md does not say: {missing}"


def test_the_settings_tables_defaults_are_the_schemas_and_the_configs():
    """docs/configuration.md's defaults column is what the schema and config/config.yaml say
    today (a changed default or config value changes the page in the same commit), and every key
    the table names has a default in the schema."""
    import yaml

    from draftline.settings import docs_table

    page = (REPO / "docs" / "configuration.md").read_text()
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert page == docs_table.settings_page(page, config), "run: PYTHONPATH=src python -m draftline.settings.docs_table"
    # the column follows a change: config.yaml's epochs shown beside the schema's
    changed = docs_table.settings_page(page, {**config, "train": {**config["train"], "epochs": 9}})
    assert "| `train.epochs`, `lr`, `optimizer` | 3 (config.yaml: 9), 0.001, auto |" in changed


def test_the_cluster_page_quotes_the_versions_and_profile_values_of_the_files_it_describes():
    """docs/cluster.md's Slurm plugin versions are the locks' and the MoE recipe's mem_mb is its
    profile's, read from those files: a new lock or profile fails here until the page says the same."""
    import yaml

    text = (REPO / "docs" / "cluster.md").read_text()
    pins = {}
    from draftline.planning.rule_params import gpu_locks

    for kind, lock in (("GPU", f"gpu-{gpu_locks(REPO)[0]}-py3.11.lock.txt"), ("CPU", "cpu.lock.txt")):
        found = re.search(r"^snakemake-executor-plugin-slurm==(\S+)$", (REPO / "requirements" / lock).read_text(), re.M)
        pins[kind] = found.group(1)
    assert f"snakemake-executor-plugin-slurm {pins['GPU']} in the GPU\nenvironment, {pins['CPU']} in the CPU one" in text
    profile = yaml.safe_load((REPO / "profiles" / "slurm_moe_235b" / "config.yaml").read_text())
    mem = profile["set-resources"]["regenerate_shard"]["mem_mb"]
    row = next(line for line in text.splitlines() if line.startswith("| 235B MoE (the recipe)"))
    assert f'`mem_mb: "{mem}"` (profiles/slurm_moe_235b)' in row
    assert "ShareGPT or messages JSONL" not in text  # Parquet, save_to_disk and hf: sources work too
