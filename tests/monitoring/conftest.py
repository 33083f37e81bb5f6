"""Fixtures of the monitoring end-to-end tests."""

from pathlib import Path

import pytest

from tests.support.helpers import paper_module


@pytest.fixture(scope="session")
def paper_warm_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The EWMA experiment's full-scale warm start (100 supervised steps at the harness's seed), made once and
    shared by the alert tests' jobs, as ``bench/paper/alert_evidence.py`` and ``storm_evidence.py`` share the
    experiments' cached one. Without it each of their four jobs made the same warm start itself. The warm start
    is one in-process job (``run_job`` uses the session's Ray if one is up, else a private one it ends)."""
    h = paper_module("harness")
    folder = Path(h.make_warm_start(tmp_path_factory.mktemp("paper-warm"), h.FULL))
    assert (folder / "meta.json").exists()
    return folder

