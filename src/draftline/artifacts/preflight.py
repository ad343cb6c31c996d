"""The preflight's files: each job's `results/preflight/<part>/checks.json`, the assembled
`results/preflight/report.json` and `report.md`, and the rates the plan's sizing reads back.

A check is one line a user acts on: its name, `pass`, `fail` or `not run`, and a one-line
reason (a failing one names what to fix); `details` keep the figures behind it. A part also
keeps what it measured (`measured`: load seconds, tokens per second). The report is `ok` when
no check failed; `not run` fails nothing by itself (a check that could not run because another
failed is named with it).

    report.json = {"ok": bool, "failed": [names], "plan": {...}, "parts": [names],
                   "checks": [{"part", "name", "status", "reason", "details"}, ...],
                   "measured": {"regeneration_tokens_per_s": ..., "extraction_tokens_per_s": ...,
                                "regeneration_load_seconds": ..., "extraction_load_seconds": ..., ...}}

`plan` is what the rates were measured under (the target's identity, the planned engine
settings, the parallel split, the pinned versions): the sizing uses them only for the same plan.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftline.runtime.atomic import atomic_file

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
STATUSES = (PASS, FAIL, NOT_RUN)
CHECKS_FILE = "checks.json"  # in each part's folder
REPORT = "results/preflight/report.json"  # where the plan's sizing looks for measured rates
# The rates the sizing can take from a report (docs/sizing.md): key -> what it replaces.
RATES = {
    "regeneration_tokens_per_s": "regeneration",
    "extraction_tokens_per_s": "extraction",
    "regeneration_load_seconds": "start-up",
    "extraction_load_seconds": "start-up",
}


@dataclass
class Check:
    name: str
    status: str
    reason: str
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status {self.status!r} is not one of {STATUSES}")

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def passed(name: str, reason: str, **details) -> Check:
    return Check(name, PASS, reason, details)


def failed(name: str, reason: str, **details) -> Check:
    return Check(name, FAIL, reason, details)


def not_run(name: str, reason: str) -> Check:
    return Check(name, NOT_RUN, reason if reason.startswith("not run") else f"not run: {reason}")


def write_part(folder: str | Path, part: str, checks: list[Check], measured: dict | None = None) -> dict:
    """`folder/checks.json` for one part (one job)."""
    record = {"part": part, "checks": [asdict(c) for c in checks], "measured": measured or {}}
    with atomic_file(Path(folder) / CHECKS_FILE, encoding="utf-8") as out:
        json.dump(record, out, indent=1, default=str)
        out.write("\n")
    return record


def read_part(folder: str | Path) -> dict:
    path = Path(folder) / CHECKS_FILE
    try:
        record = json.loads(path.read_text())
        record["checks"] = [Check(**c) for c in record["checks"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: unreadable preflight part ({err}); rerun `preflight`") from err
    return record


def part_failures(record: dict) -> list[str]:
    return [c.name for c in record["checks"] if c.failed]


def assemble(parts: dict[str, str | Path], plan: dict) -> dict:
    """The report from the parts' folders (name -> folder), in the given order."""
    checks, measured = [], {}
    for name, folder in parts.items():
        record = read_part(folder)
        for check in record["checks"]:
            checks.append({"part": name, **asdict(check)})
        measured.update(record["measured"])
    failures = [c["name"] for c in checks if c["status"] == FAIL]
    return {"ok": not failures, "failed": failures, "plan": plan, "parts": list(parts), "checks": checks,
            "measured": measured}


MARK = {PASS: "pass", FAIL: "**FAIL**", NOT_RUN: "not run"}


def markdown(report: dict) -> str:
    lines = [
        "# draftline preflight",
        "",
        ("All checks passed: the run can start." if report["ok"] else
         f"**{len(report['failed'])} check(s) failed**: fix what the reasons say, then run `preflight` again "
         "(the failed parts rerun)."),
        "",
        "| part | check | result | reason |",
        "|---|---|---|---|",
    ]
    for c in report["checks"]:
        reason = str(c["reason"]).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {c['part']} | {c['name']} | {MARK[c['status']]} | {reason} |")
    if report["measured"]:
        lines += ["", "## Measured", "", "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in sorted(report["measured"].items())]
        lines += ["", "The plan's sizing uses the regeneration and extraction rates and the start-up "
                      "seconds above in place of its assumed ones (docs/sizing.md)."]
    return "\n".join(lines) + "\n"


def write_report(report: dict, json_path: str | Path, markdown_path: str | Path) -> None:
    with atomic_file(markdown_path, encoding="utf-8") as out:
        out.write(markdown(report))
    with atomic_file(json_path, encoding="utf-8") as out:  # last: a report.json means both are there
        json.dump(report, out, indent=1, default=str)
        out.write("\n")


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def measured_rates(path: str | Path, plan: dict) -> tuple[dict | None, str]:
    """(the report's rates, where from) when `path` holds a report made under `plan`; else
    (None, why not: no report, another plan, nothing measured)."""
    path = Path(path)
    if not path.is_file():
        return None, "no preflight report"
    try:
        report = json.loads(path.read_text())
        made_under, measured = report["plan"], report["measured"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"{path} is unreadable"
    if _canonical(made_under) != _canonical(plan):
        return None, (f"{path} was measured for another target, device, dtype, parallel split, vllm: settings or versions "
                      "(run `preflight` again to measure this plan)")
    rates = {k: float(measured[k]) for k in RATES if isinstance(measured.get(k), int | float) and measured[k] > 0}
    if not rates:
        return None, f"{path} holds no measured rate (its regeneration and extraction did not run)"
    rates["prompts"] = measured.get("prompts")
    rates["rows"] = measured.get("rows")
    rates["gpus_per_job"] = measured.get("gpus_per_job") or 1
    return rates, str(path)
