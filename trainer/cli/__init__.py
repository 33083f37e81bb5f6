"""The ``asyncrl`` command line and the pod entry points it runs.

``commands`` parses and dispatches every subcommand (``asyncrl run``, ``driver``, ``probe``, ``export`` ...);
``console`` is the local run's progress display; ``cluster`` is the driver pod's entry point; ``probe`` the
worker pods' start-up and readiness checks; ``arg_types`` the argparse number types.
"""

from asyncrl.trainer.cli.commands import main

__all__ = ["main"]
