"""ETL on the data path: a target's side of its transformers (beside ``storage``).

``forward`` (``EtlForwarder``: hpush to the local transformer, the 307 to it,
streaming its answer back), ``pipeline`` (``etl_pipeline=a,b``: one
transformer's output streamed into the next, never stored) and the output
cache of ``cache: true`` ETLs: ``outcache`` (``OutputCache``: hits from disk,
misses relayed and kept) and ``cacheindex`` (its entries, budget and LRU).
"""
