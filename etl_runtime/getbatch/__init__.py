"""GetBatch (AIStore 4.0's ``GET /v1/ml/moss``): many objects, and files in shards, as one archive.

``routes.py`` is the gateway's route, ``request.py`` reads and checks the
request (``apc.MossReq``), ``shares.py`` asks every target once for all its
plain objects (the target's ``storage_target/batch.py`` answers, the exchange
is ``wire/batchshare.py``), ``items.py`` fetches any other item (ETL,
``archpath``, remote bucket) with a GET to the target that owns it,
``archive.py`` writes the answer's TAR and reads files out of shards,
``assemble.py`` merges both in request order with bounded memory.
docs/architecture.md, "AIStore compatibility", has the API.
"""
