"""Remote buckets: a bucket whose data lives in an S3-compatible store, cached on the targets.

A bucket of provider ``aws`` (``?provider=aws``, ``client.bucket(b, provider="aws")``,
``sluice ls s3://b``) is a cache in front of a backend bucket of the same name:

* ``props`` — the backend props of a bucket (endpoint, region, secret, validation)
  and their checks;
* ``backend`` — ``S3Backend``, the S3 calls (obstore) and their errors mapped to
  Sluice's (``errors``);
* ``cache`` — ``RemoteCache`` on each target: cache-on-read with one backend
  fetch per cold object however many readers wait for it, streaming to them
  while it writes the cache; warm validation; LRU eviction above a high-water
  mark; write-through PUT and DELETE;
* ``routes`` — the target's internal remote routes (cached names, prefetch, evict);
* ``listing`` — the gateway's listing of a remote bucket (backend names plus a
  ``cached`` flag from the owners).

The rest of the data path, ETLs included, does not care where the bytes came from.
See docs/remote.md.
"""

# The target package imports this one (its data path calls ``serving``), and
# this one imports the target's errors and store: load the target package
# first, whichever of the two a program imports first.
import etl_runtime.target  # noqa: E402, F401
