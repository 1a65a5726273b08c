"""Providers: buckets whose data lives in another object store, cached on the targets.

A bucket of provider ``aws`` (``?provider=aws``, ``client.bucket(b, provider="aws")``,
``sluice ls s3://b``) is a cache in front of a backend bucket of the same name:

* ``props`` — the backend props of a bucket (endpoint, region, secret, validation)
  and their checks;
* ``aws`` — ``S3Backend``, the S3 calls (obstore) and their errors mapped to
  Sluice's (``etl_runtime.core.errors``);
* ``cache`` — ``RemoteCache`` on each target: cache-on-read with one backend
  fetch per cold object however many readers wait for it, streaming to them
  while it writes the cache; warm validation; LRU eviction above a high-water
  mark; write-through PUT and DELETE.

The services mount them: the target's routes and cold reads
(``etl_runtime.storage_target.remote_routes``, ``remote_reads``), the gateway's
listing and bucket props (``etl_runtime.gateway.remote``), and the
``prefetch``/``evict`` job kinds (``etl_runtime.jobs.prefetch``). The rest of
the data path, ETLs included, does not care where the bytes came from.
See docs/remote.md.
"""
