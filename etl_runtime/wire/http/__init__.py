"""The HTTP server side of the wire: Sluice's servers on uvicorn, and the one place
that reaches into uvicorn's and Starlette's internals (each module names the
internal and the version it was written for; ``tests/wire/test_contracts.py``
checks each one)."""
