"""A tiny HTTP proxy for the tests: answers ``CONNECT`` with a fixed status, and either forwards
plain-HTTP requests (absolute URIs, any host) to one local server or answers them with that status.
Binds 127.0.0.1 on a free port; ``with FakeProxy(...) as p: p.url``."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP = {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "transfer-encoding"}


class _Handler(BaseHTTPRequestHandler):
    status = 200
    forward_to: tuple[str, int] | None = None
    seen: list[tuple[str, str, dict]] = []

    def log_message(self, *args):
        pass

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_CONNECT(self):
        self.seen.append(("CONNECT", self.path, dict(self.headers)))
        self._answer(self.status)  # no tunnel: the probe only reads the status line

    def _forward(self):
        self.seen.append((self.command, self.path, dict(self.headers)))
        if self.forward_to is None:
            return self._answer(self.status)
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
        conn = http.client.HTTPConnection(*self.forward_to, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            conn.request(self.command, url.path + (f"?{url.query}" if url.query else ""), body, headers)
            r = conn.getresponse()
            data = r.read()
        finally:
            conn.close()
        self.send_response(r.status)
        head = self.command == "HEAD"  # no body, but the upstream's Content-Length
        for k, v in r.getheaders():
            if k.lower() not in HOP and (head or k.lower() != "content-length"):
                self.send_header(k, v)
        if not head:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_POST = _forward


class FakeProxy:
    def __init__(self, status: int = 200, forward_to: tuple[str, int] | None = None):
        self.seen: list[tuple[str, str, dict]] = []
        handler = type("H", (_Handler,), {"status": status, "forward_to": forward_to, "seen": self.seen})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    def __enter__(self) -> FakeProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self._thread.join(5)
        self.httpd.server_close()
