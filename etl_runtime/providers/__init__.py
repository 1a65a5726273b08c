"""Providers: buckets whose data lives in another object store, cached on the targets.

A bucket of a remote provider — ``aws`` (alias ``s3``), ``gcp`` (``gs``) or
``azure`` (``az``), listed once in ``etl_runtime.core.providers`` — is a cache
in front of a backend bucket of the same name (``?provider=gcp``,
``client.bucket(b, provider="gcp")``, ``sluice ls gs://b``):

* ``backend`` — the ``Backend`` protocol and ``backend_class(name)``, which
  imports the provider's module by name;
* ``aws``, ``gcp``, ``azure`` — one module per provider: its settings (props
  over the environment, a mounted Secret), its obstore store, and its
  backend's words for errors;
* ``objstore`` — the calls every provider makes through obstore, and the
  mapping of obstore's errors to Sluice's (``etl_runtime.core.errors``);
* ``props`` — the backend props' shared checks and mounted secrets;
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

from etl_runtime.core.providers import PROVIDERS as PROVIDERS  # the one list
