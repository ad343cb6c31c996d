"""What every preflight part shares: where a part works (Part), the `preflight:` settings, the
regeneration part's stage settings, and how a step becomes a check (`attempt`: any error is
the check's reason) or is skipped because a part it needs failed (`failed_upstream`, `skip_all`)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftline.artifacts.preflight import Check, failed, not_run, read_part
from draftline.settings import DEFAULTS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreflightSettings:
    """The `preflight:` config block."""

    prompts: int = DEFAULTS.preflight.prompts  # answered by regeneration (its rate)
    rows: int = DEFAULTS.preflight.rows  # of those: extracted, decoded with the draft


@dataclass(frozen=True)
class Part:
    """Where one preflight part works: the target it loads, the folder of the part it follows
    (whose checks decide what this one can run), its own folder, and the log its errors point to."""

    target_dir: str | Path
    upstream_dir: str | Path
    out_dir: str | Path
    log_hint: str = "the job's log"


@dataclass(frozen=True)
class RegenerationStages:
    """The run's own settings of the stages the regeneration part goes through."""

    regenerate: object  # RegenerateSettings
    evaluate: object  # EvaluateSettings
    tokenize: object  # TokenizeSettings
    enabled: bool = True  # regenerate.enabled: false trains the dataset's answers


def one_line(error: BaseException, limit: int = 700) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def attempt(name: str, step: Callable[[], Check], log_hint: str) -> Check:
    """`step()`'s check, or a failed one naming the error (its traceback goes to the job's log)."""
    try:
        return step()
    except Exception as error:  # noqa: BLE001 - any failure is this check's result, reported
        log.error("%s failed:\n%s", name, traceback.format_exc())
        return failed(name, f"{one_line(error)} (traceback in {log_hint})")


def failed_upstream(folder: str | Path, part: str) -> list[str]:
    """The failed or not-run checks of an earlier part this one needs, as 'part: name' strings."""
    record = read_part(folder)
    return [f"{part}: {c.name}" for c in record["checks"] if c.failed]


def skip_all(names: list[str], why: str) -> list[Check]:
    return [not_run(name, why) for name in names]
