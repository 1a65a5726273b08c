"""Wire: how bytes move between processes (above ``core``), in three packages.

* ``wire.http``: Sluice's servers on uvicorn: ``serving`` (uvicorn set-up on
  either event loop), ``connections`` (bounded, timed connections),
  ``zerocopy`` (sendfile answers), ``fastpath`` (hot routes before FastAPI's
  routing), ``inprotocol`` (answers written inside uvicorn's HTTP protocol,
  before any ASGI), ``wholebody``, ``splice``, ``streaming``, ``routes``,
  ``errors`` (the FastAPI handlers that answer ``core.errors`` as JSON),
  ``hooks`` (which fast paths this uvicorn allows) and ``names``. The one
  package that imports uvicorn (but the transformer's ``__main__``) or reaches
  into its and Starlette's private parts (an import-linter contract).
* ``wire.formats``: the product's own formats: ``bulk`` (many objects to a
  transformer in one request), ``tarbreak`` (the in-band break of a tar
  stream), ``shardread`` (a forward-only tar reader).
* ``wire.clients``: ``duplex`` (the streaming HTTP client a target uses to
  talk to its transformer) and ``streambuf`` (receive buffers and frames).
"""
