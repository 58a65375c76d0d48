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
* caps on the head: the request line and each header line (``max_line`` bytes: 414 or 431), the
  number of headers and the whole head (431), counted as the parser delivers them and, for the
  part it still buffers, as bytes arrive: a connection's head never holds more than the caps plus
  one read;
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
    room described in the module's docstring."""

    def __init__(self, *args, limits: ConnectionLimits = ConnectionLimits(), **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.raw: asyncio.Transport = None  # type: ignore[assignment]
        self.timer: asyncio.TimerHandle | None = None  # the deadline of the current phase
        self.since = 0.0  # when the connection last had no request in progress
        self.head_open = False  # a request head has begun and is not complete
        self.body_open = False  # a request head is complete and its body is not
        self.head_bytes = 0  # bytes of the current head the parser delivered
        self.unparsed = 0  # bytes received since the parser last delivered anything (a lower bound)
        self.delivered = False  # the parser delivered something in this read
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
        self._arm(self.limits.header_timeout, self._head_late)  # ... one that trickles, here
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._disarm()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        self.stopping = True  # (the answer in progress closes the connection; keep it so)
        if self.lingering:
            self.raw.close()
        else:
            super().shutdown()

    def idle(self) -> bool:
        """No request in progress: closing the connection loses no work."""
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline and not self.body_open

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self.last_read = self.loop.time()  # the answer is sent; this is dropped
            return
        self._unset_keepalive_if_required()
        self.delivered = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # a server may ignore Upgrade (RFC 9110 7.8): answered as plain HTTP, and not logged
        except httptools.HttpParserError as e:  # (after a refusal in a callback, refuse() does nothing)
            self.refuse(400, f"malformed HTTP request ({str(e).rstrip('.').lower() or type(e).__name__})")
            return
        if self.head_open or self.body_open:
            # What the parser still holds (a header line it has not delivered) grows by reads
            # in which it delivered nothing.
            self.unparsed = 0 if self.delivered else self.unparsed + len(data)
            if self.unparsed > self.limits.max_line:
                self.refuse(431, f"a request header line is over {self.limits.max_line:,} bytes")
                return
            if self.head_bytes + self.unparsed > self.limits.max_head:
                self.refuse(431, f"a request head is at most {self.limits.max_head:,} bytes")
                return
        if self.body_open and self.timer is None:
            self._arm(self.limits.body_timeout, self._body_late)

    def send_400_response(self, msg: str) -> None:
        self.refuse(400, "malformed HTTP request")

    # ---- the parser's callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_open, self.delivered, self.head_bytes = True, True, 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self.delivered = True
        self.head_bytes += len(url)
        if len(self.url) > self.limits.max_line:
            self._stop(414, f"the request line is over {self.limits.max_line:,} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self.delivered = True
        size = len(name) + len(value) + 4  # (": ", CRLF)
        self.head_bytes += size
        limits = self.limits
        if size > limits.max_line:
            self._stop(431, f"a request header line is over {limits.max_line:,} bytes")
        if len(self.headers) > limits.max_headers:
            self._stop(431, f"a request has at most {limits.max_headers} header lines")
        if self.head_bytes > limits.max_head:
            self._stop(431, f"a request head is at most {limits.max_head:,} bytes")

    def on_headers_complete(self) -> None:
        self.head_open, self.delivered = False, True
        self._disarm()
        self._make_room()
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:
            # Until its body has all arrived, an answer to this request ends the connection
            # (with a staged close): what follows the answer would be the body's rest, not a request.
            self.wanted_keep_alive, self.cycle.keep_alive = self.cycle.keep_alive, False
            self.body_open = True

    def on_body(self, body: bytes) -> None:
        self.delivered = True
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.delivered = True
        super().on_message_complete()
        if self.body_open:
            self.body_open = False
            self._disarm()
            if not self.cycle.response_started and not self.stopping:
                self.cycle.keep_alive = self.wanted_keep_alive

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # (set by uvicorn when it waits for a request)
            self.since = self.loop.time()
            self._arm(self.limits.header_timeout, self._head_late)

    # ---- deadlines, refusals and closing ---------------------------------------------------------

    def _arm(self, delay: float, callback) -> None:
        self._disarm()
        self.timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_late(self) -> None:
        self.timer = None
        if self.head_open:
            self.refuse(408, f"the request head did not arrive within {self.limits.header_timeout:g} s")
        elif self.idle():
            self.raw.close()

    def _body_late(self) -> None:
        self.timer = None
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
        if self.lost or self.lingering or not (self.head_open or self.body_open):
            self.raw.close()
        else:
            self._linger()

    def _linger(self) -> None:
        self.lingering = True
        self.head_open = self.body_open = False
        self._unset_keepalive_if_required()
        self.raw.resume_reading()  # (the client's EOF ends it: uvicorn's eof_received lets asyncio close)
        if self.raw.can_write_eof():
            self.raw.write_eof()  # (after what is buffered: the answer, then FIN)
        now = self.loop.time()
        self.linger_end, self.last_read = now + self.limits.linger_time, now
        self._arm(self.limits.linger_idle, self._linger_check)

    def _linger_check(self) -> None:
        self.timer = None
        now = self.loop.time()
        end = min(self.linger_end, self.last_read + self.limits.linger_idle)
        if now >= end:
            self.raw.close()
        else:
            self._arm(end - now, self._linger_check)

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
            if c.head_open:
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
