"""Each private part of uvicorn (and FastAPI, Starlette, CPython) that ``wire/http/`` uses.

Each names the internal and the module that uses it, and fails with the
installed versions when the internal is gone or changed shape, so a new
uvicorn that breaks the fast paths says which and why before any server runs
(``make canary`` runs these against the newest releases). The behaviour behind
them is tested with real servers in the rest of ``tests/wire/``.
"""

from __future__ import annotations

import ctypes
import inspect
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import fastapi.routing
import httptools
import pytest
import uvicorn
from starlette.responses import Response
from uvicorn.protocols.http import flow_control, httptools_impl
from uvicorn.server import ServerState

from etl_runtime.wire.http import inprotocol
from etl_runtime.wire.http.wholebody import Whole

VERSIONS = (
    f"uvicorn {uvicorn.__version__}, httptools {version('httptools')}, "
    f"starlette {version('starlette')}, fastapi {version('fastapi')}"
)


def _fail(hook: str, user: str, what: str) -> str:
    return f"{hook} (used by {user}): {what} in {VERSIONS}"


def _params(hook: str, user: str, func: Callable[..., Any] | None, expected: list[str]) -> None:
    assert func is not None and callable(func), _fail(hook, user, "gone")
    got = list(inspect.signature(func).parameters)
    assert got == expected, _fail(hook, user, f"signature is ({', '.join(got)}), not {expected}")


def _assigns(hook: str, user: str, code: Any, attrs: list[str]) -> None:
    """``code`` (a class or a method) sets every one of ``attrs`` on ``self``."""
    source = inspect.getsource(code)
    missing = [a for a in attrs if f"self.{a} =" not in source and f"self.{a}:" not in source]
    assert not missing, _fail(hook, user, f"no longer sets {', '.join(missing)}")


PROTOCOL = httptools_impl.HttpToolsProtocol


def test_protocol_shutdown() -> None:
    """uvicorn's ``Server.shutdown`` calls each connection's ``shutdown()``; ours drops an
    idle TLS one instead of closing it (wire/http/connections.py)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    user = "wire/http/connections.py"
    for cls in (PROTOCOL, H11Protocol):
        hook = f"{cls.__module__}.{cls.__name__}.shutdown"
        _params(hook, user, getattr(cls, "shutdown", None), ["self"])
    source = inspect.getsource(uvicorn.Server.shutdown)
    assert "connection.shutdown()" in source, _fail(
        "uvicorn.Server.shutdown", user, "no longer calls connection.shutdown()"
    )


def test_httptools_protocol_start_asgi_task() -> None:
    hook = "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol._start_asgi_task"
    user = "wire/http/zerocopy.py, wire/http/inprotocol.py"
    _params(hook, user, getattr(PROTOCOL, "_start_asgi_task", None), ["self", "cycle", "app"])


def test_httptools_protocol_parser_callbacks() -> None:
    user = "wire/http/wholebody.py, wire/http/inprotocol.py, wire/http/connections.py"
    for name, expected in [
        ("on_headers_complete", ["self"]),
        ("on_body", ["self", "body"]),
        ("on_message_complete", ["self"]),
        ("on_response_complete", ["self"]),
    ]:
        hook = f"uvicorn.protocols.http.httptools_impl.HttpToolsProtocol.{name}"
        _params(hook, user, getattr(PROTOCOL, name, None), expected)


def test_httptools_protocol_state() -> None:
    hook = "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol.__init__"
    user = "wire/http/wholebody.py, wire/http/inprotocol.py, wire/http/connections.py"
    _params(hook, user, PROTOCOL.__init__, ["self", "config", "server_state", "app_state", "_loop"])
    fields = ["parser", "flow", "server_state", "app", "loop", "transport", "scope", "cycle"]
    _assigns("uvicorn.protocols.http.httptools_impl.HttpToolsProtocol", user, PROTOCOL, fields)


def test_request_response_cycle_fields() -> None:
    hook = "uvicorn.protocols.http.httptools_impl.RequestResponseCycle"
    user = "wire/http/zerocopy.py, wire/http/splice.py, wire/http/inprotocol.py"
    cycle = getattr(httptools_impl, "RequestResponseCycle", None)
    assert cycle is not None, _fail(hook, user, "gone")
    fields = ["scope", "transport", "flow", "keep_alive", "disconnected", "body"]
    fields += ["response_started", "response_complete", "chunked_encoding"]
    fields += ["expected_content_length", "on_response"]  # splice.py's together
    _assigns(hook, user, cycle.__init__, fields)
    _params(f"{hook}.send", user, getattr(cycle, "send", None), ["self", "message"])


def test_status_line_table() -> None:
    hook = "uvicorn.protocols.http.httptools_impl.STATUS_LINE"
    user = "wire/http/inprotocol.py (answers written inside the protocol)"
    table = getattr(httptools_impl, "STATUS_LINE", None)
    assert isinstance(table, dict), _fail(hook, user, "gone")
    assert table.get(200) == b"HTTP/1.1 200 OK\r\n", _fail(hook, user, f"200 is {table.get(200)!r}")
    assert inprotocol.has_hook(PROTOCOL), _fail(hook, user, "inprotocol.has_hook is false")


def test_flow_control() -> None:
    user = "wire/http/inprotocol.py, wire/http/connections.py, wire/http/zerocopy.py"
    hook = "uvicorn.protocols.http.flow_control.HIGH_WATER_LIMIT"
    limit = getattr(flow_control, "HIGH_WATER_LIMIT", None)
    assert limit == inprotocol.BODY_MAX, _fail(hook, user, f"is {limit}, not {inprotocol.BODY_MAX}")
    hook = "uvicorn.protocols.http.flow_control.service_unavailable"
    app = getattr(flow_control, "service_unavailable", None)
    _params(hook, user, app, ["scope", "receive", "send"])
    assert inspect.iscoroutinefunction(app), _fail(hook, user, "no longer an ASGI app")
    hook = "uvicorn.protocols.http.flow_control.FlowControl"
    _params(f"{hook}.drain", user, getattr(flow_control.FlowControl, "drain", None), ["self"])
    _assigns(hook, user, flow_control.FlowControl.__init__, ["write_paused"])


def test_server_state_default_headers() -> None:
    hook = "uvicorn.server.ServerState.default_headers"
    _assigns(hook, "wire/http/inprotocol.py", ServerState.__init__, ["default_headers"])


def test_server_signal_handling() -> None:
    user = "wire/http/serving.py (drain before exit)"
    hook = "uvicorn.Server.handle_exit"
    _params(hook, user, getattr(uvicorn.Server, "handle_exit", None), ["self", "sig", "frame"])
    hook = "uvicorn.Server.capture_signals"
    _params(hook, user, getattr(uvicorn.Server, "capture_signals", None), ["self"])
    _assigns("uvicorn.Server.should_exit", user, uvicorn.Server.__init__, ["should_exit"])


def test_fastapi_route_regex() -> None:
    hook = "fastapi.routing.APIRoute.path_regex"
    user = "wire/http/fastpath.py"
    route = fastapi.routing.APIRoute("/v1/objects/{bucket}/{name:path}", lambda: None)
    regex = getattr(route, "path_regex", None)
    assert regex is not None, _fail(hook, user, "gone")
    found = regex.match("/v1/objects/bkt/a/b.txt")
    assert found and found.groupdict() == {"bucket": "bkt", "name": "a/b.txt"}, _fail(
        hook, user, f"matches {found}"
    )


def test_httptools_parser_should_upgrade() -> None:
    hook = "httptools.HttpRequestParser.should_upgrade"
    assert callable(getattr(httptools.HttpRequestParser, "should_upgrade", None)), _fail(
        hook, "wire/http/wholebody.py", "gone"
    )


def test_starlette_response_parts() -> None:
    hook = "starlette.responses.Response(content, status_code, headers, media_type, background)"
    user = "wire/http/zerocopy.py (FileRangeResponse)"
    _params(
        hook,
        user,
        Response.__init__,
        ["self", "content", "status_code", "headers", "media_type", "background"],
    )
    response = Response(None, 206, {"content-length": "5"}, "text/plain")
    assert (b"content-length", b"5") in response.raw_headers, _fail(
        "starlette.responses.Response.raw_headers", user, f"is {response.raw_headers}"
    )
    assert response.background is None and response.status_code == 206


def test_cpython_bytes_to_fill() -> None:
    hook = "ctypes.pythonapi.PyBytes_FromStringAndSize(NULL, n) / PyBytes_AsString"
    whole = Whole(4)
    whole.add(b"ab")
    whole.add(b"cd")
    assert whole.take() == b"abcd", _fail(hook, "wire/http/wholebody.py", "fills no bytes")
    assert hasattr(ctypes.pythonapi, "PyBytes_FromStringAndSize"), _fail(hook, "wholebody", "gone")


def test_a_changed_hook_fails_naming_it_and_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    def renamed(self: Any, cycle: Any, app: Any, context: Any = None) -> None: ...

    monkeypatch.setattr(PROTOCOL, "_start_asgi_task", renamed)
    with pytest.raises(AssertionError) as failed:
        test_httptools_protocol_start_asgi_task()
    message = str(failed.value)
    assert "HttpToolsProtocol._start_asgi_task (used by wire/http/zerocopy.py" in message
    assert "signature is (self, cycle, app, context)" in message
    assert f"uvicorn {uvicorn.__version__}" in message
    monkeypatch.delattr(PROTOCOL, "_start_asgi_task")
    with pytest.raises(AssertionError, match=r"_start_asgi_task .*: gone in uvicorn"):
        test_httptools_protocol_start_asgi_task()
