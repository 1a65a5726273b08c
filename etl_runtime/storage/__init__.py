"""Storage: objects on a target's disks (above ``cluster``).

``store`` (atomic object files, versions, listing), ``ranges``, ``copies``
(placement of replicas), ``peers`` (target-to-target calls), ``rebalance``
and ``decommission`` (moving objects when membership changes).
"""
