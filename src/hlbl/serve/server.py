"""The HTTP connections of ``hlbl serve``: uvicorn, with the limits a server that faces its clients
directly needs and uvicorn does not have (docs/serve.md, "Limits").

uvicorn times out only a connection that is idle after an answer, caps nothing in a request head
(httptools buffers a header line of any length), and closes a connection as soon as an answer
that ends it is written, even while the client is still sending a body it will then never read
the answer for. :class:`GuardedHttpProtocol` is uvicorn's httptools protocol with:

* a head deadline: a request head must be complete ``header_timeout`` seconds after the
  connection opened or the last answer was sent (else 408 and close; a connection that sent
  nothing is closed without an answer, as uvicorn closes idle keep-alive connections);
* a body deadline: ``body_timeout`` seconds from the end of the head to the end of the body;
* a request whose Transfer-Encoding is anything but ``chunked`` (``gzip, chunked``) gets 501,
  rather than its coded bytes read as the body;
* caps on the head: the request line and each header line (``max_line`` bytes: 414 or 431), the
  number of headers and the whole head (431); while a head is still arriving, what the parser
  holds of it is bounded by the caps and a read or two (httptools keeps a header line whole until
  it ends), so a connection's head costs at most that much memory;
* a staged close (RFC 9112 section 9.6, nginx's lingering close): when an answer is sent before
  the request body has all arrived (413 over ``--max-body``, 503, 408, 431), the answer says
  ``Connection: close``, the write side is shut, and what the client still sends is read and
  dropped until it stops sending (up to ``linger_time``, or ``linger_idle`` of silence): closing
  at once would reset the connection under a client still writing, which would lose the answer;
* connections without a request in progress give way: when a request would be refused for
  ``--max-connections``, the connections that have been idle (or reading a head) longest are
  closed to make room, so that idle or slow clients cannot keep the others out.

Errors are JSON ``{"error": message}`` like the application's, malformed requests included.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import json
from dataclasses import dataclass

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection time and size limits (seconds, bytes); docs/serve.md lists them."""

    header_timeout: float = 10.0  # connection opened or last answer sent -> request head complete
    body_timeout: float = 30.0  # request head complete -> request body complete
    keep_alive: float = 5.0  # no byte at all after an answer (or after connecting) -> closed
    max_line: int = 8 * 1024  # request line, or one header line (as nginx, Apache)
    max_headers: int = 100  # header lines in a head (Apache's LimitRequestFields)
    max_head: int = 32 * 1024  # request line and all headers (nginx's 4 buffers of 8 KiB)
    linger_time: float = 30.0  # after an early answer, the most time spent draining a request
    linger_idle: float = 5.0  # ... or the most silence (nginx's lingering_time, lingering_timeout)


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request that breaks a limit."""


class _Transport:
    """The connection's transport as uvicorn's protocol and request cycles use it: ``close()``
    goes through the protocol, which stages it when a request is still arriving."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedHttpProtocol):
        self._transport = transport
        self._protocol = protocol
        self.write = transport.write  # (the per-request path: no indirection)

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.close()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines, head caps, staged close and the making of
    room described in the module's docstring.

    It adds no parser callback per header or body chunk: a head that arrived in one read no
    larger than ``max_line`` cannot break the size caps, so only the others are measured (once,
    when complete), and while a head or body is still arriving, what the parser holds is bounded
    from the reads. A connection has one timer, moved lazily: setting a deadline is a store, and
    the timer, when it fires early, sleeps again until the deadline."""

    def __init__(self, *args, limits: ConnectionLimits = ConnectionLimits(), **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.raw: asyncio.Transport = None  # type: ignore[assignment]
        self.timer: asyncio.TimerHandle | None = None
        self.deadline: float | None = None  # (loop time) when ``late`` is called
        self.late = self._head_late
        self.since = 0.0  # when the connection last had no request in progress
        self.headed = None  # the scope of the last complete head (uvicorn makes one per request)
        self.body_open = False  # a request head is complete and its body is not
        self.read_size = 0  # bytes of the current read
        self.partial_head = False  # the current head has taken more than one read
        self.head_read = 0  # bytes read for it after the read it began in
        self.unparsed = 0  # bytes read during a body in which the parser delivered nothing
        self.wanted_keep_alive = True  # what the request asked for, restored once its body is in
        self.lingering = False
        self.linger_end = self.last_read = 0.0
        self.lost = False
        self.stopping = False

    # ---- the connection --------------------------------------------------------------------------

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.raw = transport
        super().connection_made(_Transport(transport, self))
        self.since = self.loop.time()
        # A connection that never sends a byte is closed like an idle keep-alive one ...
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
        self._set_deadline(self.limits.header_timeout, self._head_late)  # ... one that trickles, here
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost, self.deadline = True, None
        if self.timer is not None:
            self.timer.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        self.stopping = True  # (the answer in progress closes the connection; keep it so)
        if self.lingering or self.idle():
            self.raw.close()  # (not staged: the server is stopping, and waits for every connection)
        else:
            super().shutdown()

    def receiving(self) -> bool:
        """The client is sending a request: a head (uvicorn makes a scope when one begins) or a body."""
        return self.scope is not self.headed or self.body_open

    def idle(self) -> bool:
        """No request in progress: closing the connection loses no work."""
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline and not self.body_open

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self.last_read = self.loop.time()  # the answer is sent; this is dropped
            return
        self._unset_keepalive_if_required()
        scope, self.read_size = self.scope, len(data)
        body = len(self.cycle.body) if self.body_open else -1
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # a server may ignore Upgrade (RFC 9110 7.8): answered as plain HTTP, and not logged
        except httptools.HttpParserError as e:  # (after a refusal in a callback, refuse() does nothing)
            self.refuse(400, f"malformed HTTP request ({str(e).rstrip('.').lower() or type(e).__name__})")
            return
        if self.scope is not self.headed:
            self._head_arriving(began=self.scope is not scope)
        elif self.body_open:
            if self.deadline is None:  # (the body began in this read; set here, not for every request)
                self._set_deadline(self.limits.body_timeout, self._body_late)
            # A read in which the parser delivered no body holds framing or trailers, which
            # httptools buffers until their line ends.
            self.unparsed = self.unparsed + len(data) if len(self.cycle.body) == body else 0
            if self.unparsed > self.limits.max_line or len(self.headers) > self.limits.max_headers:
                self.refuse(431, f"request trailers are at most {self.limits.max_line:,} bytes a line")

    def _head_arriving(self, began: bool) -> None:
        """Bounds what the parser holds of a head still arriving: the caps, and a read or two."""
        self.partial_head = True
        self.head_read = 0 if began else self.head_read + self.read_size
        limits = self.limits
        if len(self.url) > limits.max_line:
            self.refuse(414, f"the request line is over {limits.max_line:,} bytes")
        elif len(self.headers) > limits.max_headers:
            self.refuse(431, f"a request has at most {limits.max_headers} header lines")
        elif self.head_read > limits.max_head:
            self.refuse(431, f"a request head is at most {limits.max_head:,} bytes")

    def _check_head(self) -> None:
        """The size caps on a complete head (refused: parsing stops)."""
        limits = self.limits
        if len(self.url) > limits.max_line:
            self._stop(414, f"the request line is over {limits.max_line:,} bytes")
        lines = [len(name) + len(value) + 4 for name, value in self.headers]  # (": ", CRLF)
        if max(lines, default=0) > limits.max_line:
            self._stop(431, f"a request header line is over {limits.max_line:,} bytes")
        if len(self.url) + sum(lines) > limits.max_head:
            self._stop(431, f"a request head is at most {limits.max_head:,} bytes")

    def send_400_response(self, msg: str) -> None:
        self.refuse(400, "malformed HTTP request")

    # ---- the parser's callbacks ------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self.headed, self.deadline = self.scope, None
        if len(self.headers) > self.limits.max_headers:
            self._stop(431, f"a request has at most {self.limits.max_headers} header lines")
        if self.partial_head or self.read_size > self.limits.max_line:
            self.partial_head = False
            self._check_head()
        codings = [v for k, v in self.headers if k == b"transfer-encoding"]
        if codings and b",".join(codings).replace(b" ", b"").replace(b"\t", b"").lower() != b"chunked":
            # (httptools frames "gzip, chunked" as chunked and hands the coded bytes on as the body)
            self._stop(501, "the only Transfer-Encoding this server reads is chunked")
        if self.limit_concurrency is not None and len(self.connections) >= self.limit_concurrency:
            self._make_room()
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:
            # Until its body has all arrived, an answer to this request ends the connection
            # (with a staged close): what follows the answer would be the body's rest, not a request.
            self.wanted_keep_alive, self.cycle.keep_alive = self.cycle.keep_alive, False
            self.body_open, self.unparsed = True, 0

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.body_open:
            self.body_open, self.deadline = False, None
            if not self.cycle.response_started and not self.stopping:
                self.cycle.keep_alive = self.wanted_keep_alive

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # (set by uvicorn when it waits for a request)
            self.since = self._set_deadline(self.limits.header_timeout, self._head_late)

    # ---- deadlines, refusals and closing ---------------------------------------------------------

    def _set_deadline(self, seconds: float, late) -> float:
        """``late`` is called in ``seconds`` unless the deadline is cleared or moved first; returns now."""
        now = self.loop.time()
        self.deadline, self.late = now + seconds, late
        if self.timer is None or self.timer.when() > self.deadline:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_later(seconds, self._tick)
        return now

    def _tick(self) -> None:
        self.timer = None
        if self.deadline is None:
            return
        now = self.loop.time()
        if now < self.deadline:
            self.timer = self.loop.call_later(self.deadline - now, self._tick)
            return
        self.deadline = None
        self.late()

    def _head_late(self) -> None:
        if self.scope is not self.headed:
            self.refuse(408, f"the request head did not arrive within {self.limits.header_timeout:g} s")
        elif self.idle():
            self.raw.close()

    def _body_late(self) -> None:
        if self.body_open:
            self.refuse(408, f"the request body did not arrive within {self.limits.body_timeout:g} s")

    def _stop(self, status: int, message: str):
        self.refuse(status, message)
        raise _Refused(message)

    def refuse(self, status: int, message: str) -> None:
        """Answers ``{"error": message}`` in place of the application (whose answer, if it comes,
        is dropped) and closes the connection, staged."""
        if self.lingering or self.lost or self.raw.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started:  # (an answer half written cannot be replaced)
                self.raw.close()
                return
            cycle.disconnected = True
            cycle.message_event.set()
        body = json.dumps({"error": message}).encode()
        head = [STATUS_LINE[status]]
        head += [b"%s: %s\r\n" % kv for kv in self.server_state.default_headers]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.raw.write(b"".join(head) + body)
        self._linger()

    def close(self) -> None:
        """Closes the connection; staged while the client may still be sending a request."""
        if self.lost or self.lingering or not self.receiving():
            self.raw.close()
        else:
            self._linger()

    def _linger(self) -> None:
        self.lingering = True
        self.headed, self.body_open = self.scope, False
        self._unset_keepalive_if_required()
        self.raw.resume_reading()  # (the client's EOF ends it: uvicorn's eof_received lets asyncio close)
        if self.raw.can_write_eof():
            self.raw.write_eof()  # (after what is buffered: the answer, then FIN)
        now = self._set_deadline(self.limits.linger_idle, self._linger_late)
        self.linger_end, self.last_read = now + self.limits.linger_time, now

    def _linger_late(self) -> None:
        now = self.loop.time()
        end = min(self.linger_end, self.last_read + self.limits.linger_idle)
        if now >= end:
            self.raw.close()
        else:
            self._set_deadline(end - now, self._linger_late)

    def _make_room(self) -> None:
        """Below ``--max-connections``, by closing the connections without a request in progress
        that have waited longest: uvicorn answers 503 to a request when the open connections
        reach the limit, however idle they are."""
        limit = self.limit_concurrency
        if limit is None or len(self.connections) < limit:
            return
        idle = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpProtocol) and c.idle()]
        for c in heapq.nsmallest(len(self.connections) - limit + 1, idle, key=lambda c: c.since):
            self.connections.discard(c)  # (now: uvicorn counts them until connection_lost)
            if c.receiving():
                c.refuse(503, "the server is at its connection limit; this request was the slowest to arrive")
            else:
                c.raw.close()


def uvicorn_config(app, host: str, port: int, max_connections: int, limits: ConnectionLimits):
    """uvicorn's configuration for ``hlbl serve``, its connections handled by
    :class:`GuardedHttpProtocol`."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        limit_concurrency=max_connections,
        timeout_keep_alive=limits.keep_alive,  # type: ignore[arg-type]  (a float works)
        http=functools.partial(GuardedHttpProtocol, limits=limits),  # type: ignore[arg-type]
        ws="none",  # (no endpoint takes WebSockets: an upgrade is answered as plain HTTP)
    )


__all__ = ["ConnectionLimits", "GuardedHttpProtocol", "uvicorn_config"]
