"""dSort: shuffle and reshard a bucket of tar shards, as a job kind (a feature).

``spec`` (the request, AIStore-shaped), ``records`` and ``plan`` (which record
goes to which output shard), ``job`` (the ``dsort`` job kind every target runs).
The gateway mounts its routes (``etl_runtime.gateway.dsort``).
"""
