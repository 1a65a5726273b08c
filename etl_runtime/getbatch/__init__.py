"""GetBatch (AIStore 4.0's ``GET /v1/ml/moss``): many objects, and files in shards, as one archive.

Two processes run this code: the storage target the gateway designates for a
batch (``storage_target/getbatch_routes.py``, the default) or the gateway itself
(``gateway/getbatch_routes.py``, while a target is down); docstrings here say
"the gateway" for either. ``host.py`` is what each gives it (``BatchHost``),
``serve.py`` answers the request, ``request.py`` reads and checks it
(``apc.MossReq``), ``shares.py`` asks every target once for all its plain
objects (the target's ``storage_target/getbatch_share.py`` answers, the exchange is
``getbatch/exchange.py``; the assembling target reads its own share in its own
process, ``storage_target/getbatch_local.py``), ``items.py`` fetches any other
item (``archpath`` without an ETL, remote bucket) with a GET to the target
that owns it, ``archive.py`` writes the answer's TAR and reads files out of
shards, ``assemble.py`` merges both in request order with bounded memory.
docs/getbatch.md has the API.
"""
