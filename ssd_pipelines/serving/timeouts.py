"""How long the server waits on a client: for a request's body (`BODY_TIMEOUT_S`, the gateway's `BodyGuard` in
serving/deployment.py), and on an idle connection (`KEEP_ALIVE_TIMEOUT_S`, Serve's proxies as `start` starts them).

Serve's proxy runs uvicorn with `keep_alive_timeout_s` as uvicorn's keep-alive timeout, and uvicorn starts that
timer only after a response: a connection idle between requests is closed, one that never sends a request is held
until the client closes it (uvicorn pull request 1192 would have started the timer on connection; it was not merged).
Neither Serve nor uvicorn has a setting for it, but Serve calls a function of ours in each proxy before uvicorn
starts (`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`, given to the Serve controller, whose proxies inherit its
environment): `time_out_idle_connections` makes uvicorn start the same timer when a connection opens.
`start` starts Serve so; on a cluster where Serve already runs, its proxies keep their settings.
"""

from __future__ import annotations

BODY_TIMEOUT_S = 10.0  # a readable request's body (4 kB for the reference model) takes well under a second to send
KEEP_ALIVE_TIMEOUT_S = 90  # Serve's default, longer than load balancers keep an idle connection (AWS's: 60 s)
CALLBACK_VARIABLE = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"


def start(host: str, port: int, keep_alive_timeout_s: int) -> None:
    """`serve.start` with proxies that close a connection idle for `keep_alive_timeout_s`, before its first request
    as between requests."""
    from ray import serve

    serve.start(
        http_options={"host": host, "port": port, "keep_alive_timeout_s": keep_alive_timeout_s},
        controller_options={"runtime_env": {"env_vars": {CALLBACK_VARIABLE: f"{__name__}:time_out_idle_connections"}}},
    )


def time_out_idle_connections() -> list:
    """Serve's proxy callback: uvicorn's protocol (the one its "auto" picks) starts its keep-alive timer on
    connection as it does after a response; the first bytes received cancel it, as they do there. Returns the
    middlewares Serve asks the callback for: none."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    opened = AutoHTTPProtocol.connection_made

    def connection_made(self, transport) -> None:
        opened(self, transport)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    AutoHTTPProtocol.connection_made = connection_made
    return []
