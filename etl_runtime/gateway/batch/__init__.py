"""GetBatch (AIStore 4.0's ``GET /v1/ml/moss``): many objects, and files in shards, as one archive.

``routes.py`` is the gateway's route, ``request.py`` reads and checks the
request (``apc.MossReq``), ``items.py`` fetches each item from the target that
owns it, ``archive.py`` writes the answer's TAR and reads files out of shards,
``assemble.py`` keeps a bounded window of items in flight and writes them in
request order. docs/architecture.md, "AIStore compatibility", has the API.
"""
