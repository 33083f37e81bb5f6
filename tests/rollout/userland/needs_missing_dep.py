"""A user's module whose dependency is not installed."""

import asyncrl_no_such_dependency  # noqa: F401
