"""Fixtures of the operator's tests against the real kube-apiserver (tests/conftest.py starts it)."""

from typing import Any

import pytest

from tests.support.jobs import Jobs
from tests.support.operator_proc import OperatorProcess


@pytest.fixture
def jobs(kube: Any, namespace: str, operator_process: OperatorProcess) -> Jobs:
    """The test namespace's AsyncRLJobs and their children, with the session's operator watching it."""
    return Jobs(kube, namespace)
