"""uvicorn's module and logger names, for code outside ``wire/http/`` that must not import it.

The transformer's zygote imports these modules ahead of the first fork
(``webserver/zygote.py``); the transformer's app collects its start-up lines from
uvicorn's error logger (``webserver/app.py``). Importing this module imports
nothing of uvicorn.
"""

from __future__ import annotations

# What a transformer server imports of uvicorn as it starts (httptools protocol,
# websockets and lifespan auto-detection, the loop set-up).
PRELOAD = (
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
)
ERROR_LOGGER = "uvicorn.error"  # uvicorn's start-up, shutdown and error lines
