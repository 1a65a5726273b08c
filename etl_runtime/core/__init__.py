"""Core: the building blocks every Sluice server shares (the bottom layer).

``errors`` (the one server error tree), ``names`` and ``params`` (what a request
may name and ask), ``jsonbody``, ``access`` and ``auth`` (tokens, signed
redirects), ``spec`` (the ETL spec), ``durable`` (atomic writes), ``eventloop``,
``metrics`` and ``procs`` (child processes). Imports only the standard library
and third-party libraries, never another layer of Sluice.
"""
