"""Render ``docs/correction-metrics.md`` from the metric table: ``python -m asyncrl.trainer.correction.docs PATH``."""

import sys
from pathlib import Path

from asyncrl.trainer.correction.stats import metrics_markdown

HEADER = """# Correction metrics

<!-- The table is generated from asyncrl.trainer.correction.stats.METRICS (a test fails when it drifts). -->
<!-- Regenerate: python -m asyncrl.trainer.correction.docs docs/correction-metrics.md -->

`correction_loss(...)` returns these as 0-dim tensors in `CorrectionResult.metrics`
(`.as_dict(prefix=...)`). `r_d = pi_ref / mu_old` is the train–inference discrepancy ratio,
`r_s = pi_theta / pi_ref` the staleness ratio; every metric and log line of a run also says which
reference produced `pi_ref`. Fractions name their denominator.

"""


def render() -> str:
    """The whole document."""
    return HEADER + metrics_markdown()


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(render())
