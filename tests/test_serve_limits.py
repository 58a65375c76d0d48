"""hlbl serve's connections against hostile or broken clients: deadlines for idle and slow
connections, caps on request heads, the staged close after an early answer, JSON for malformed
HTTP, and room made for new requests at --max-connections. Each runs a real server (uvicorn with
hlbl.serve.server's protocol) in a thread, with small limits, and talks to it over sockets."""

import contextlib
import http.client
import json
import select
import socket
import threading
import time
import tracemalloc
import urllib.error
import urllib.request

import pytest
import torch

from conftest import toy_record
from hlbl.data import Vocab
from hlbl.model import LBL, LBLConfig
from hlbl.serve import Limits, Service, create_app

uvicorn = pytest.importorskip("uvicorn")
from hlbl.serve.server import ConnectionLimits, uvicorn_config  # noqa: E402


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The real application over a 6-word model (no training), bodies up to 1,000 bytes."""
    vocab = Vocab(("the", "<eos>", "<unk>", "a", "cat", "dog"), (50, 40, 30, 20, 10, 5))
    model = LBL(LBLConfig(vocab_size=6, dim=4, context=2, output="flat"), None, torch.Generator().manual_seed(0))
    run = tmp_path_factory.mktemp("toy")
    return create_app(Service(model, vocab, toy_record(model.config), run, limits=Limits(max_body=1000)))


@contextlib.contextmanager
def serving(app, max_connections=64, **limits):
    """A server on a free localhost port, in a thread: yields the port."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, max_connections, ConnectionLimits(**limits)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def connect(port) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def read_all(s: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def split(answer: bytes) -> tuple[int, dict, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def assert_json_error(answer: bytes, status: int, words: str = "") -> None:
    got, headers, body = split(answer)
    assert got == status, answer[:300]
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert words in json.loads(body)["error"]


def health(port, timeout=5.0) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# ---- the staged close -------------------------------------------------------------------------------


def test_a_body_over_the_limit_sent_with_connection_close_gets_the_413(app):
    """urllib sends all of a body before it reads the answer: closing at once would reset the
    connection under it (it saw a broken pipe, not the 413)."""
    body = b'{"context": "' + b"a" * (20 << 20) + b'"}'
    with serving(app) as port:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/predict", data=body, headers={"Connection": "close"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 413 and "limit is 1,000" in json.load(e.value)["error"]
        # HTTP/1.0, and a body with no length announced (chunked): the same.
        s = connect(port)
        s.sendall(b"POST /v1/predict HTTP/1.0\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        assert split(read_all(s))[0] == 413
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/score", body=iter([body[i : i + 65536] for i in range(0, len(body), 65536)]))
        r = conn.getresponse()
        assert r.status == 413 and r.headers["connection"] == "close" and "over the limit" in json.load(r)["error"]
        assert health(port) == 200


def test_the_staged_close_is_bounded(app):
    """A client that goes on sending after the answer is read from, then cut off at the linger
    time; one that stops sending without closing, after the linger silence."""
    with serving(app, linger_time=1.5, linger_idle=0.5) as port:
        s = connect(port)
        s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
        t, sent = time.monotonic(), 0
        with contextlib.suppress(OSError):
            while time.monotonic() - t < 10:  # an endless body, 1 KiB every 10 ms
                s.sendall(b"400\r\n" + b"a" * 1024 + b"\r\n")
                sent += 1
                time.sleep(0.01)
        assert 1.2 < time.monotonic() - t < 5 and sent > 50
        s = connect(port)
        s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000\r\n\r\n")
        t = time.monotonic()
        assert split(read_all(s))[0] == 413  # (the FIN follows the answer at once ...)
        s.settimeout(3)
        with pytest.raises(OSError):  # (... and the connection is closed 0.5 s on, reset as data arrives)
            time.sleep(1)
            s.sendall(b"x" * 5000)
            time.sleep(0.2)
            s.sendall(b"x" * 5000)


def test_keep_alive_goes_on_after_a_body_read_whole(app):
    """A body in several reads: the connection is kept once it has all arrived."""
    with serving(app) as port:
        s = connect(port)
        body = b'{"sentences": ["the cat"]}'
        for _ in range(3):
            s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(body))
            time.sleep(0.05)
            s.sendall(body)
            answer = s.recv(65536)
            status, headers, _ = split(answer)
            assert status == 200 and headers.get("connection") != "close"
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\nGET /v1/model HTTP/1.1\r\nHost: localhost\r\n\r\n")
        time.sleep(0.5)
        assert s.recv(65536).count(b"HTTP/1.1 200 OK") == 2  # (pipelined)


def test_an_upgrade_is_answered_as_plain_http(app):
    """No endpoint takes WebSockets or h2c: the Upgrade header is ignored, the connection kept."""
    with serving(app) as port:
        s = connect(port)
        for upgrade in (
            b"websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13",
            b"h2c",
        ):
            s.sendall(
                b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: " + upgrade + b"\r\n\r\n"
            )
            status, headers, body = split(s.recv(65536))
            assert status == 200 and json.loads(body)["status"] == "ok" and "connection" not in headers


# ---- deadlines ------------------------------------------------------------------------------------------


def test_idle_connections_are_closed_without_an_answer(app):
    with serving(app, keep_alive=0.3, header_timeout=5) as port:
        fresh, used = connect(port), connect(port)
        used.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert split(used.recv(65536))[0] == 200
        t = time.monotonic()
        assert read_all(fresh) == b"" and read_all(used) == b""
        assert time.monotonic() - t < 3


def test_a_trickled_head_gets_408(app):
    with serving(app, keep_alive=0.2, header_timeout=0.6) as port:
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\n")
        t = time.monotonic()
        for i in range(50):  # a line every 0.1 s: each keeps it from being idle, none completes it
            if select.select([s], [], [], 0.1)[0]:  # (an answer)
                break
            s.sendall(b"X-%d: y\r\n" % i)
        assert_json_error(read_all(s), 408, "request head did not arrive within 0.6 s")
        assert time.monotonic() - t < 4


def test_a_slow_body_gets_408(app):
    with serving(app, body_timeout=0.5) as port:
        s = connect(port)
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{")
        t = time.monotonic()
        assert_json_error(read_all(s), 408, "request body did not arrive within 0.5 s")
        assert time.monotonic() - t < 4
        assert health(port) == 200


def test_idle_and_slow_connections_do_not_keep_other_clients_out(app):
    """More idle and trickling connections than --max-connections: each new request is answered,
    at once (the longest idle connections make room), not 503 until they time out."""
    with serving(app, max_connections=8, keep_alive=30, header_timeout=30) as port:
        idle = [connect(port) for _ in range(24)]
        slow = [connect(port) for _ in range(24)]
        for s in slow:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        t = time.monotonic()
        assert [health(port) for _ in range(10)] == [200] * 10
        assert time.monotonic() - t < 5
        answers = [answer_or_none(s, 0.2) for s in idle + slow]
        closed = [a for a in answers if a is not None]
        assert len(closed) >= len(answers) - 8
        for a in closed:  # closed idle, or refused half-way through a head
            assert a == b"" or split(a)[0] == 503
    with serving(app, max_connections=2, keep_alive=30, header_timeout=30) as port:
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        time.sleep(0.3)
        assert health(port) == 200
        assert_json_error(read_all(s), 503, "connection limit")


def answer_or_none(s: socket.socket, wait: float) -> bytes | None:
    """What the server sent before closing the connection; None if it is still open. A reset
    counts as closed with nothing sent: a server that closes a socket holding bytes it has not
    read (a head it refused half-way) makes the kernel send a reset, which may overtake its answer."""
    s.settimeout(wait)
    try:
        return read_all(s)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return b""
    finally:
        s.close()


# ---- request heads ----------------------------------------------------------------------------------------

FIELD = b"X-A: " + b"b" * 8000 + b"\r\n"  # (a header line under the line cap)
HEADS = [
    # (request head after the request line's method, status, words in the message)
    (b"/health?" + b"q" * 9000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414, "request line is over 8,192 bytes"),
    (b"/health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"v" * 9000 + b"\r\n\r\n", 431, "over 8,192 bytes"),
    (b"/health HTTP/1.1\r\nHost: localhost\r\n" + b"X-A: b\r\n" * 100 + b"\r\n", 431, "at most 100 header lines"),
    (b"/health HTTP/1.1\r\nHost: localhost\r\n" + FIELD * 5 + b"\r\n", 431, "at most 32,768 bytes"),
]


@pytest.mark.parametrize("head,status,message", HEADS, ids=["url", "line", "count", "total"])
def test_request_heads_over_the_caps_get_a_json_431(app, head, status, message):
    with serving(app) as port:
        s = connect(port)
        s.sendall(b"GET " + head)
        assert_json_error(read_all(s), status, message)


def test_heads_within_the_caps_are_answered(app):
    with serving(app) as port:
        s = connect(port)
        lines = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 240) for i in range(98))  # 99 lines, ~30.6 KiB in all
        s.sendall(b"GET /health?" + b"q" * 7000 + b" HTTP/1.1\r\nHost: localhost\r\n" + lines + b"\r\n")
        assert split(s.recv(65536))[0] == 200


def test_request_trailers_are_capped_as_heads_are(app):
    body = b'{"sentences": ["the cat"]}'
    with serving(app) as port:
        s = connect(port)
        s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
        s.sendall(b"%x\r\n%s\r\n0\r\nX-Trailer: " % (len(body), body))
        with contextlib.suppress(OSError):
            for _ in range(64):
                s.sendall(b"t" * 4096)
                time.sleep(0.005)
        assert_json_error(read_all(s), 431, "trailers")


def test_a_flood_of_header_bytes_costs_the_server_a_bounded_memory(app):
    """4 connections each send an 8 MiB header line: each gets its 431, and the server's memory
    grows by far less than what they sent (httptools would hold each line whole)."""
    per = 8 << 20
    answers = []

    def flood(port):
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Flood: ")
        chunk = b"a" * 65536
        with contextlib.suppress(OSError):
            for _ in range(per // len(chunk)):
                s.sendall(chunk)
        answers.append(read_all(s))

    with serving(app) as port:
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            threads = [threading.Thread(target=flood, args=(port,)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert len(answers) == 4
        for a in answers:
            assert_json_error(a, 431, "request head is at most 32,768 bytes")  # (the line has not ended)
        assert peak < 4 << 20, f"{peak / 2**20:.1f} MiB"  # (32 MiB and more before: each line held whole)
        assert health(port) == 200


def test_stopping_does_not_wait_for_idle_or_slow_connections(app):
    with serving(app, keep_alive=30, header_timeout=30) as port:
        idle, slow = connect(port), connect(port)
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        time.sleep(0.2)
        t = time.monotonic()
    assert time.monotonic() - t < 3
    assert read_all(idle) == b"" and read_all(slow) == b""


def test_malformed_http_gets_a_json_400(app):
    with serving(app) as port:
        for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n"):
            s = connect(port)
            s.sendall(junk)
            assert_json_error(read_all(s), 400, "malformed HTTP request")


def test_the_serve_command_checks_its_timeouts(tmp_path, capsys):
    from hlbl.cli import main

    for flag in ("--header-timeout", "--body-timeout", "--keep-alive"):
        assert main(["serve", str(tmp_path), "--port", "0", flag, "0"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"hlbl: error: {flag} must be above 0 seconds") and len(err.splitlines()) == 1


def test_requests_of_clients_that_left_are_not_computed_and_waiting_work_is_bounded(tmp_path):
    """jobs=1: one score request computes (held on an event) while others wait. Those whose client
    closed the connection are dropped before they run; beyond max_queued waiting, 503 at once."""
    vocab = Vocab(("the", "<eos>", "<unk>", "a", "cat", "dog"), (50, 40, 30, 20, 10, 5))
    model = LBL(LBLConfig(vocab_size=6, dim=4, context=2, output="flat"), None, torch.Generator().manual_seed(0))
    service = Service(model, vocab, toy_record(model.config), tmp_path, limits=Limits(max_body=1000))
    release, calls = threading.Event(), []
    real_score = service.score

    def held_score(sentences):
        calls.append(sentences[0])
        release.wait(20)
        return real_score(sentences)

    service.score = held_score
    app = create_app(service, jobs=1, max_queued=3)

    def send(port, tag: str) -> socket.socket:
        body = json.dumps({"sentences": [tag]}).encode()
        s = connect(port)
        s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        return s

    def until(cond, wait=10.0):
        end = time.monotonic() + wait
        while not cond():
            assert time.monotonic() < end
            time.sleep(0.01)

    with serving(app) as port:
        first = send(port, "the cat")
        until(lambda: calls == ["the cat"])
        for tag in ("a cat", "a dog", "the dog", "a a"):  # sent, then the client leaves
            send(port, tag).close()
        time.sleep(0.5)
        kept = [send(port, tag) for tag in ("cat", "dog", "the")]  # max_queued of them wait
        time.sleep(0.3)
        over = send(port, "a")
        over.settimeout(5)
        status, _, body = split(over.recv(65536))
        assert status == 503 and "busy" in json.loads(body)["error"]
        release.set()
        for s in [first] + kept:
            s.settimeout(20)
            assert split(s.recv(65536))[0] == 200
            s.close()
        assert calls == ["the cat", "cat", "dog", "the"]  # none of the clients that left
        assert health(port) == 200


def test_the_uvicorn_internals_the_guarded_protocol_builds_on_are_there():
    """hlbl.serve.server subclasses uvicorn's httptools protocol, which is not public API
    (pyproject.toml bounds uvicorn below its next minor release): this fails, rather than the
    limits silently lapsing, when a release renames or reshapes what the subclass overrides or uses."""
    import inspect
    import re

    from uvicorn.protocols.http import httptools_impl as impl

    methods = {  # name -> parameters after self
        "__init__": ["config", "server_state", "app_state", "_loop"],
        "connection_made": ["transport"],
        "connection_lost": ["exc"],
        "data_received": ["data"],
        "eof_received": [],
        "shutdown": [],
        "on_headers_complete": [],
        "on_message_complete": [],
        "on_response_complete": [],
        "send_400_response": ["msg"],
        "_unset_keepalive_if_required": [],
        "timeout_keep_alive_handler": [],
    }
    for name, params in methods.items():
        got = list(inspect.signature(getattr(impl.HttpToolsProtocol, name)).parameters)[1:]
        assert got == params, (name, got)
    # Attributes the subclass reads or sets, each assigned by uvicorn's own code.
    protocol_src = inspect.getsource(impl.HttpToolsProtocol)
    for attr in (
        "loop", "parser", "scope", "cycle", "pipeline", "url", "headers", "connections", "limit_concurrency",
        "timeout_keep_alive", "timeout_keep_alive_task", "server_state", "transport",
    ):  # fmt: skip
        assert re.search(rf"self\.{attr}(: [^=]+)? = ", protocol_src), attr
    cycle_src = inspect.getsource(impl.RequestResponseCycle)
    for attr in ("body", "keep_alive", "response_started", "response_complete", "disconnected", "message_event"):
        assert re.search(rf"self\.{attr}(: [^=]+)? = ", cycle_src), attr
    assert impl.STATUS_LINE[503].startswith(b"HTTP/1.1 503")
    from uvicorn.server import ServerState

    assert isinstance(ServerState().default_headers, list)  # (refuse() writes them)


def test_a_mixtures_predictions_run_off_the_event_loop_in_capped_batches(tmp_path):
    """A mixture's top-k looks every word up in its n-gram model (slow): it runs in a worker thread,
    a capped batch at a time, and /health answers meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    vocab = Vocab(("the", "<eos>", "<unk>", "a", "cat", "dog"), (50, 40, 30, 20, 10, 5))
    model = LBL(LBLConfig(vocab_size=6, dim=4, context=2, output="flat"), None, torch.Generator().manual_seed(0))
    service = Service(model, vocab, toy_record(model.config), tmp_path, limits=Limits(max_body=1000))
    batches = []

    def slow_topk(contexts, k):  # as long as a large mixture's
        batches.append((threading.current_thread().name, len(contexts)))
        time.sleep(0.4)
        return [[0.5, 0.25]] * len(contexts), [[0, 3]] * len(contexts)

    service.topk = slow_topk
    service.mixture = object()  # (what create_app looks at; the top-k above stands for the mixture's)
    app = create_app(service)

    def predict(port):
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/predict", data=json.dumps({"context": "the cat", "k": 2}).encode()
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status

    with serving(app) as port, ThreadPoolExecutor(40) as pool:
        jobs = [pool.submit(predict, port) for _ in range(40)]
        time.sleep(0.2)
        slowest = 0.0
        for _ in range(5):
            t0 = time.monotonic()
            assert health(port, timeout=60) == 200
            slowest = max(slowest, time.monotonic() - t0)
        assert all(j.result() == 200 for j in jobs)
    assert slowest < 0.3, slowest
    assert all(name.startswith("hlbl-predict") for name, _ in batches)
    assert max(n for _, n in batches) <= 16


def test_two_host_headers_and_an_unknown_transfer_coding_are_refused(tmp_path):
    vocab = Vocab(("the", "<eos>", "<unk>", "a", "cat", "dog"), (50, 40, 30, 20, 10, 5))
    model = LBL(LBLConfig(vocab_size=6, dim=4, context=2, output="flat"), None, torch.Generator().manual_seed(0))
    service = Service(model, vocab, toy_record(model.config), tmp_path, limits=Limits(max_body=1000))
    from hlbl.serve.app import LOOPBACK_HOSTS

    app = create_app(service, allowed_hosts=LOOPBACK_HOSTS)
    with serving(app) as port:
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        status, _, body = split(read_all(s))
        assert status in (400, 421) and "Host" in json.loads(body)["error"]
        body = b'{"sentences": ["the cat"]}'
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        s = connect(port)
        s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked)
        assert_json_error(read_all(s), 501, "Transfer-Encoding")
        s = connect(port)  # plain chunked is read as ever
        s.sendall(
            b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + chunked
        )
        assert split(read_all(s))[0] == 200
