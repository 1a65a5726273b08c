"""The cluster's stores on one machine: ETL records as files, a fixed target list.

* ``registry.FileRegistry`` -- ETL records as JSON files (targets read them);
* ``discovery.StaticTargets`` -- the gateway's fixed target list with health.
"""
