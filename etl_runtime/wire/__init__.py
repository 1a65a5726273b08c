"""Wire: how bytes move between processes (above ``core``).

``streambuf`` (receive buffers and frames), ``zerocopy`` (sendfile answers on
uvicorn's protocol), ``duplex`` (the streaming HTTP client a target uses to
talk to its transformer), ``serving`` (uvicorn set-up on either event loop) and
``http_errors`` (the FastAPI handlers that answer ``core.errors`` as JSON).
"""
