"""``metrics.jsonl``, read back typed: the one reader of the run's log (the summary's totals, the report plot,
a resume's cut of the log).

A line is one of two events, told apart by its keys as :func:`~.step_report.step_line` and
:meth:`~asyncrl.trainer.driver.loop.evaluation.EvalResult.record` write them:

- a :class:`StepLine`: one actor step (``applied``, ``version`` when applied, the batch's figures and the
  correction counts, read back as :class:`CorrectionStats` by :meth:`CorrectionStats.from_record`);
- an :class:`EvalLine`: one held-out evaluation (``eval_version``; its ``step`` is the evaluated version).

Every parsed line keeps ``record``, the object as written: a resume rewrites the lines it keeps verbatim.
The file's own damage is :func:`read_records`'s: a torn last line (a kill mid-write) is cut off and said,
a damaged line before it is a :class:`MetricsFileError`.
"""

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from asyncrl.trainer.correction.stats import CorrectionStats

log = logging.getLogger(__name__)

JSON: TypeAlias = "None | bool | int | float | str | Sequence[JSON] | Mapping[str, JSON]"
JSONObject: TypeAlias = Mapping[str, JSON]
Line: TypeAlias = Mapping[str, object]  # one metrics.jsonl object, as the loop wrote it or as read back


class MetricsFileError(ValueError):
    """``metrics.jsonl`` is damaged before its last line: a resume would lose or invent steps."""


@dataclass(frozen=True)
class StepLine:
    """One actor step's line. The figures are None where the line lacks them (a log written by an older
    version, a hand-made line); ``correction`` is None when the line carries no correction counts."""

    step: int
    record: Line  # the line as written
    applied: bool
    version: int | None  # the version the step made (None: not applied)
    wall_s: float | None
    reward_mean: float | None
    success_rate: float | None
    staleness_mean: float | None
    staleness_max: float | None
    ewma_reset: int | None
    correction: CorrectionStats[float] | None


@dataclass(frozen=True)
class EvalLine:
    """One held-out evaluation's line: of ``version``, ``wall_s`` into the run, ``seconds`` long."""

    step: int  # = version
    record: Line
    version: int
    success: float
    reward: float
    wall_s: float
    seconds: float | None  # eval_s (None: the line does not say)


MetricsLine: TypeAlias = StepLine | EvalLine


def _number(record: Line, key: str) -> float | None:
    """``record[key]`` as a float: a JSON number, or the string a non-finite float is written as ("nan")."""
    v = record.get(key)
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return v  # as written (an int stays one: the summary repeats some values)
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return None


def _int(record: Line, key: str) -> int | None:
    v = record.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _required(record: Line, key: str) -> float:
    v = _number(record, key)
    if v is None:
        raise ValueError(f"an evaluation line without a number {key!r}: {dict(record)}")
    return v


def parse_line(record: Line) -> MetricsLine:
    """One ``metrics.jsonl`` object (as written, or as read back) typed."""
    step = _int(record, "step") or 0
    if "eval_version" in record:
        version = _int(record, "eval_version")
        if version is None:
            raise ValueError(f"an evaluation line whose eval_version is not an integer: {dict(record)}")
        return EvalLine(step=step, record=record, version=version, success=_required(record, "eval_success"),
                        reward=_required(record, "eval_reward"), wall_s=_required(record, "wall_s"),
                        seconds=_number(record, "eval_s"))
    applied = record.get("applied") is True
    correction = CorrectionStats.from_record(record) if "valid_tokens" in record else None
    return StepLine(step=step, record=record, applied=applied, version=_int(record, "version"),
                    wall_s=_number(record, "wall_s"), reward_mean=_number(record, "reward_mean"),
                    success_rate=_number(record, "success_rate"), staleness_mean=_number(record, "staleness_mean"),
                    staleness_max=_number(record, "staleness_max"), ewma_reset=_int(record, "ewma_reset"),
                    correction=correction)


def parse_lines(records: Sequence[Line]) -> list[MetricsLine]:
    return [parse_line(r) for r in records]


def read_metrics(path: Path, notices: list[str] | None = None) -> list[MetricsLine]:
    """The log at ``path`` typed (``[]`` when there is none); see :func:`read_records` for its damage."""
    return parse_lines(read_records(path, notices))


def read_records(path: Path, notices: list[str] | None = None) -> list[dict[str, object]]:
    """The logged objects. A torn last line (a kill mid-write) is cut off the file and said (logged,
    and appended to ``notices``); a damaged line before the last is a :class:`MetricsFileError`."""
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    # Every full record ends in a newline: the last piece is empty unless the final write was cut.
    tail = lines.pop()
    records: list[dict[str, object]] = []
    bad: tuple[int, str] | None = None
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            bad = (i, str(exc))
            break
        records.append(record)
    if bad is not None and (bad[0] < len(lines) or tail.strip()):
        raise MetricsFileError(
            f"{path}:{bad[0]}: not a JSON record ({bad[1]}); only a torn last line is repaired on resume. "
            f"Fix or delete that line (the records after it stay), or move {path.name} away to start the log afresh"
        )
    if bad is None and tail.strip():
        try:
            last = json.loads(tail)
        except ValueError:
            last = None
        if isinstance(last, dict):  # killed between the record and its newline: the record is whole
            with open(path, "ab") as f:
                f.write(b"\n")
            records.append(last)
            return records
    if bad is not None or tail.strip():
        # The torn line: the last newline-terminated line that does not parse, or an unterminated tail.
        keep = len(b"".join(line + b"\n" for line in lines[: bad[0] - 1])) if bad is not None else len(data) - len(tail)
        line_no = bad[0] if bad is not None else len(lines) + 1
        with open(path, "r+b") as f:
            f.truncate(keep)
        said = (f"{path}: line {line_no} was torn (the process was killed while writing it): cut the file "
                f"to its {len(records)} complete records ({len(data) - keep} bytes removed)")
        log.warning("%s", said)
        if notices is not None:
            notices.append(said)
    return records

