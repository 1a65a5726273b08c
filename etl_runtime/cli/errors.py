"""The CLI's own error: a usage problem found before talking to the cluster.

``main`` prints it as ``sluice: error: <message>`` with exit code 1, like the
SDK's errors.
"""

from __future__ import annotations


class CliError(Exception):
    """A usage problem found before talking to the cluster."""
