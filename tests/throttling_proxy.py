"""An HTTP proxy in front of a real S3 server that answers some requests itself, as a throttled
S3 does (503 SlowDown), may slow every request down, or hold chosen ones (to stop a client at a
known moment): the faults a busy store shows, in front
of the real server that does the rest. Requests are forwarded byte for byte (the Host header
too, so the client's signature still holds), chunked bodies included."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class ThrottlingProxy:
    """``every``: answer every N-th request with 503 SlowDown (1: all of them; 0: none);
    ``delay_s``: added to each request."""

    def __init__(self, upstream_port: int, every: int = 4, delay_s: float = 0.0, hold=None):
        """``hold(method, path)``: seconds to hold that request before forwarding it (None: none);
        ``held`` is set once a request has been held."""
        self.upstream_port, self.every, self.delay_s, self.hold = upstream_port, every, delay_s, hold
        self.held = threading.Event()
        self.seen = self.throttled = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    raw = b""
                    while True:
                        line = self.rfile.readline()
                        raw += line
                        size = int(line.split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while True:  # trailers, then the blank line
                                t = self.rfile.readline()
                                raw += t
                                if t in (b"\r\n", b"\n", b""):
                                    return raw
                        raw += self.rfile.read(size + 2)
                return self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))

            def _any(self):
                body = self._body()
                with proxy._lock:
                    proxy.seen += 1
                    throttle = proxy.every and proxy.seen % proxy.every == 0
                    proxy.throttled += bool(throttle)
                if proxy.delay_s:
                    threading.Event().wait(proxy.delay_s)
                if proxy.hold is not None and (hold_s := proxy.hold(self.command, self.path)):
                    proxy.held.set()
                    threading.Event().wait(hold_s)
                if throttle:
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                up = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    up.putheader(k, v)
                up.endheaders()
                if body:
                    up.send(body)
                r = up.getresponse()
                data = r.read()
                self.send_response(r.status, r.reason)
                head = self.command == "HEAD"  # its Content-Length is the object's, with no body
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection") and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)
                up.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # a client killed mid-request
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ThrottlingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
