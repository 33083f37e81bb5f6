"""``python -m asyncrl.trainer.cli``: the ``asyncrl`` command."""

import sys

from asyncrl.trainer.cli.commands import main

sys.exit(main())
