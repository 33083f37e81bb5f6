"""The refusal of a dataset file: :class:`DatasetError` and the bounded list of problems a read collects.

Every problem is one line naming the file, the line (JSONL, 1-based) or row (Parquet, 0-based), the rule and
the fix. A file with a million bad lines must not cost a million messages: :class:`Problems` keeps the first
few of each read and counts the rest.
"""

from collections.abc import Sequence

FIELD = "spec.task.dataset"
MAX_LISTED = 8  # problems listed per kind; the rest are counted


class DatasetError(ValueError):
    """A dataset that cannot be used: every problem found, each naming the file, the row and the fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class Problems:
    """The problems of one read: the first :data:`MAX_LISTED` of ``what`` (e.g. "unreadable lines") listed, the
    rest counted; :meth:`stop` adds the reason a read ended early (a cap), always listed."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._listed: list[str] = []
        self._more = 0
        self._stopped: list[str] = []

    def add(self, problem: str) -> None:
        if len(self._listed) < MAX_LISTED:
            self._listed.append(problem)
        else:
            self._more += 1

    def stop(self, problem: str) -> None:
        self._stopped.append(problem)

    def __bool__(self) -> bool:
        return bool(self._listed or self._stopped)

    def lines(self) -> list[str]:
        more = [f"... and {self._more} more {self.what}"] if self._more else []
        return self._listed + more + self._stopped
