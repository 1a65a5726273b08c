"""``python -m etl_runtime.cli``: the ``sluice`` command."""

from __future__ import annotations

import sys

from etl_runtime.cli import main

sys.exit(main())
