"""``python -m etl_runtime.local up ...``: the local cluster without the ``sluice`` CLI."""

from __future__ import annotations

import sys

from etl_runtime.local.up import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
