"""The web layer of ``hlbl serve``: a Starlette application over a :class:`~hlbl.serve.service.Service`.

Every request body is read with a size limit and checked field by field (types, ranges, unknown
fields) before the model sees it; every error is a JSON object ``{"error": message}`` with the
status that fits (400 bad input, 404 unknown node, word or path, 405, 413 body too large,
500 a fault of ours, without the traceback). The page and its script are read from the package
once, at start; no request names a file.

Concurrent ``/v1/predict`` requests are answered in batches: a request puts its context on a
queue and waits; the first one schedules the start of a batch on the event loop, which runs after
every request already read in that turn of the loop has queued its own, and one exact top-k call
answers them all (a batch of contexts costs far less than as many calls; bench/serve_load.py). The
search is short and bounded (``k`` is), so by default it runs on the loop itself. ``predict_thread``
computes each batch in a worker thread instead, while the loop reads the requests of the next one
(the numba search releases the GIL); the hand-off costs CPU per request and pays only where a core
is free for the thread, so it is an option. Scoring, sampling and tree queries can take longer and
run in other worker threads, a few at a time (``jobs``); at most ``max_queued`` more wait for a
thread (a request beyond gets 503 at once), and one whose client closes the connection while it
waits is dropped without being computed: work and memory stay bounded however many clients send a
request and leave.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

import anyio
import anyio.lowlevel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import HlblError
from .service import Limits, NotFound, Service

log = logging.getLogger("hlbl.serve")

STATIC = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}  # file -> media type
# The page loads only its own script and style and talks only to this server.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
MIXTURE_BATCH = 16  # contexts a batch of a mixture's predictions holds at most
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


# ---- reading and checking requests ---------------------------------------------------------------


async def read_body(scope, receive, limit: int) -> bytes:
    """A request's body, read up to ``limit`` bytes (413 beyond, before it is all read)."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            if not value.isdigit() or len(value) > 18:
                raise ApiError(400, "bad Content-Length header")
            if int(value) > limit:
                raise ApiError(413, f"request body is {int(value):,} bytes; the limit is {limit:,}")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body is over the limit of {limit:,} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_object(raw: bytes) -> dict:
    """The JSON object a request body holds (400 for anything else)."""
    if not raw.strip():
        raise ApiError(400, "the request needs a JSON object body")
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError:
        raise ApiError(400, "request body is not UTF-8 text") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, digits limits, deep nesting
        raise ApiError(400, f"request body is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ApiError(400, f"request body must be a JSON object, not {type(obj).__name__}")
    return obj


async def json_body(request: Request, limit: int) -> dict:
    return parse_object(await read_body(request.scope, request.receive, limit))


class Fields:
    """Typed, bounded access to a request's fields; unknown fields are an error (a typo would
    otherwise be silently ignored)."""

    def __init__(self, obj: dict, allowed: tuple[str, ...]):
        unknown = sorted(set(obj) - set(allowed))
        if unknown:
            raise ApiError(400, f"unknown field {unknown[0]!r} (this endpoint takes {', '.join(allowed)})")
        self.obj = obj

    def text(self, key: str, max_len: int, default: str | None = None) -> str:
        v = self.obj.get(key, default)
        if v is None:
            raise ApiError(400, f"missing field {key!r}")
        if not isinstance(v, str):
            raise ApiError(400, f"{key!r} must be a string, not {type(v).__name__}")
        if len(v) > max_len:
            raise ApiError(400, f"{key!r} is {len(v):,} characters; the limit is {max_len:,}")
        return v

    def integer(self, key: str, default: int, lo: int, hi: int) -> int:
        v = self.obj.get(key, default)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ApiError(400, f"{key!r} must be a whole number, not {json.dumps(v)[:40]}")
        if not lo <= v <= hi:
            raise ApiError(400, f"{key!r} must be in {lo}..{hi}, got {v}")
        return v

    def number(self, key: str, default: float, lo_exclusive: float, hi: float) -> float:
        v = self.obj.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ApiError(400, f"{key!r} must be a finite number, not {json.dumps(v)[:40]}")
        if not lo_exclusive < v <= hi:
            raise ApiError(400, f"{key!r} must be above {lo_exclusive} and at most {hi}, got {v}")
        return float(v)

    def flag(self, key: str, default: bool = False) -> bool:
        v = self.obj.get(key, default)
        if not isinstance(v, bool):
            raise ApiError(400, f"{key!r} must be true or false")
        return v

    def strings(self, key: str, max_items: int, max_len: int) -> list[str]:
        v = self.obj.get(key)
        if v is None:
            raise ApiError(400, f"missing field {key!r}")
        if not isinstance(v, list):
            raise ApiError(400, f"{key!r} must be a list of strings")
        if not 1 <= len(v) <= max_items:
            raise ApiError(400, f"{key!r} must hold 1..{max_items:,} items, got {len(v):,}")
        for i, s in enumerate(v):
            if not isinstance(s, str):
                raise ApiError(400, f"{key}[{i}] must be a string, not {type(s).__name__}")
            if len(s) > max_len:
                raise ApiError(400, f"{key}[{i}] is {len(s):,} characters; the limit is {max_len:,}")
        return v


def ascii_int(raw: str, max_digits: int = 12) -> int | None:
    """``raw`` as a whole number when it is 1..``max_digits`` ASCII digits, else None.

    ``str.isdigit`` alone is not the test: it takes superscripts and circled digits, which
    ``int`` refuses (a 500), and ``int`` reads other scripts' digits (fullwidth, Arabic-Indic),
    which no client means as a number in a URL."""
    if 0 < len(raw) <= max_digits and raw.isascii() and raw.isdigit():
        return int(raw)
    return None


def query_int(request: Request, key: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    v = ascii_int(raw)
    if v is None:
        raise ApiError(400, f"query parameter {key!r} must be a whole number in {lo}..{hi}")
    if not lo <= v <= hi:
        raise ApiError(400, f"query parameter {key!r} must be in {lo}..{hi}, got {v}")
    return v


def path_node(request: Request) -> int:
    raw = request.path_params["node"]
    v = ascii_int(raw)
    if v is None:
        raise ApiError(404, f"no internal node {raw[:40]!r}")
    return v


# ---- batching predictions --------------------------------------------------------------------


class PredictBatcher:
    """Collects the predictions asked while the model is busy (or in one turn of the event loop)
    and answers them together.

    ``threaded``: the searches run in one worker thread, so that the event loop reads and answers
    requests while a batch is computed (the numba search releases the GIL), and the requests that
    arrive meanwhile form the next batch. Otherwise they run on the loop itself. ``max_batch``
    caps a batch (the rest wait for the next): a mixture's top-k costs a look-up of every word in
    its n-gram model per context, so a batch of them takes long."""

    def __init__(self, service: Service, threaded: bool = False, max_batch: int | None = None):
        self.service = service
        self.max_batch = max_batch
        self.pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.scheduled = False  # a start is queued on the loop
        self.busy = False  # a batch is being computed in the worker thread
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="hlbl-predict") if threaded else None
        self.batches = 0  # (counted for the tests and the bench)
        self.answered = 0

    async def topk(self, context: list[int], k: int) -> tuple[list[float], list[int]]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.pending.append((context, k, fut))
        if not self.scheduled and not self.busy:
            self.scheduled = True
            loop.call_soon(self.start)  # after the requests already read in this turn have queued theirs
        return await fut

    def start(self) -> None:
        self.scheduled = False
        live = [item for item in self.pending if not item[2].done()]  # (a client that went away)
        batch, self.pending = live[: self.max_batch], live[len(live) if self.max_batch is None else self.max_batch :]
        if not batch:
            return
        if self.executor is None:
            self.finish(batch, self.compute(batch))
            return
        self.busy = True
        loop = asyncio.get_running_loop()
        job = self.executor.submit(self.compute, batch)
        job.add_done_callback(
            lambda j: loop.call_soon_threadsafe(
                self.finish, batch, [j.exception()] * len(batch) if j.exception() else j.result()
            )
        )

    def compute(self, batch) -> list:
        """(probs, ids) or the exception, per request; one exact search per k asked (the top-k of
        a larger k would cost more)."""
        by_k: dict[int, list[int]] = {}
        for i, (_, k, _) in enumerate(batch):
            by_k.setdefault(k, []).append(i)
        out: list = [None] * len(batch)
        for k, rows in by_k.items():
            try:
                probs, ids = self.service.topk([batch[i][0] for i in rows], k)
            except Exception as e:  # reaches each waiting request as a 500, not the loop
                for i in rows:
                    out[i] = e
                continue
            for i, p, w in zip(rows, probs, ids):
                out[i] = (p, w)
        return out

    def finish(self, batch, results) -> None:
        self.busy = False
        for (_, _, fut), res in zip(batch, results):
            if fut.done():
                continue
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)
        self.batches += 1
        self.answered += len(batch)
        if self.pending and not self.scheduled:  # what arrived meanwhile is the next batch
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.start)


def encode_json(obj) -> bytes:
    """As Starlette's JSONResponse writes it (compact, UTF-8, no NaN)."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


class Predict:
    """``POST /v1/predict``, answered before the router: the endpoint that has to be fast skips
    Starlette's request objects, routing and exception middleware; its checks and errors are the
    same as the other endpoints'. Other requests pass through to ``app``."""

    def __init__(self, app, service: Service, batcher: PredictBatcher):
        self.app = app
        self.state = app.state
        self.service = service
        self.batcher = batcher

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/predict" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        service, limits = self.service, self.service.limits
        try:
            try:
                f = Fields(parse_object(await read_body(scope, receive, limits.max_body)), ("context", "k"))
                text = f.text("context", limits.max_text, default="")
                k = f.integer("k", 10, 1, limits.max_k)
                ids, oov = service.context(text)
                probs, idx = await self.batcher.topk(ids, k)
                status, body = 200, service.prediction_json(ids, oov, probs, idx)
            except ApiError as e:
                status, body = e.status, encode_json({"error": e.message})
        except Exception as e:
            log.exception("error answering POST /v1/predict")
            status, body = (
                500,
                encode_json({"error": f"internal error ({type(e).__name__}); the server log has the details"}),
            )
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


# ---- the application -------------------------------------------------------------------------


def _static_files() -> dict[str, bytes]:
    root = resources.files(__package__) / "static"
    return {name: (root / name).read_bytes() for name in ("index.html", *STATIC)}


class HostCheck:
    """Refuses requests whose Host header is not one of ``hosts`` (421): a server bound to
    localhost should not answer pages that reach it through a rebinding DNS name."""

    def __init__(self, app, hosts: tuple[str, ...]):
        self.app = app
        self.state = app.state
        self.hosts = {h.lower() for h in hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            hosts = [v for k, v in scope["headers"] if k == b"host"]
            if len(hosts) > 1:  # (RFC 9112 3.2: 400; the first alone could pass a check the second defeats)
                await error(400, "a request has one Host header")(scope, receive, send)
                return
            host = hosts[0].decode("latin-1").lower() if hosts else ""
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host  # strip a port
            if name not in self.hosts:
                await error(421, f"this server answers requests to {', '.join(sorted(self.hosts))} only")(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)


class Endpoints:
    """The routed endpoints over one service (``POST /v1/predict`` is answered before the router,
    by :class:`Predict`). ``jobs``: how many score, generate and tree requests are computed at once
    in worker threads, so that long requests cannot take every thread; ``max_queued``: how many
    more may wait for one (503 beyond)."""

    def __init__(self, service: Service, batcher: PredictBatcher, jobs: int, max_queued: int = 64):
        self.service = service
        self.limits: Limits = service.limits
        self.batcher = batcher
        self.files = _static_files()
        self.limiter = anyio.CapacityLimiter(jobs)
        self.max_queued = max_queued
        self.queued = 0  # requests waiting for a worker thread

    def routes(self) -> list[Route]:
        return [
            Route("/", self.page, methods=["GET"]),
            Route("/static/{name}", self.static, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/model", self.model, methods=["GET"]),
            # POST is answered by Predict
            Route("/v1/predict", self.method_not_allowed, methods=["GET", "HEAD", "PUT", "PATCH", "DELETE"]),
            Route("/v1/score", self.score, methods=["POST"]),
            Route("/v1/generate", self.generate, methods=["POST"]),
            Route("/v1/tree", self.tree, methods=["GET"]),
            Route("/v1/tree/node/{node}", self.node, methods=["GET"]),
            Route("/v1/tree/node/{node}/words", self.node_words, methods=["GET"]),
            Route("/v1/tree/word/{word:path}", self.word, methods=["GET"]),
            Route("/v1/tree/path", self.path, methods=["POST"]),
            Route("/v1/tree/decisions", self.decisions, methods=["POST"]),
        ]

    async def in_thread(self, request: Request, fn, *args):
        """``fn(*args)`` in a worker thread once one of the ``jobs`` is free; 503 when ``max_queued``
        requests already wait, and not at all if the client leaves while this one waits."""
        if self.queued >= self.max_queued:
            raise ApiError(503, f"the server is busy ({self.queued} requests wait to be computed); try again later")
        self.queued += 1
        try:
            acquired = await self._slot_unless_gone(request.receive)
        finally:
            self.queued -= 1
        if not acquired:
            raise ApiError(400, "the client went away")  # (nobody reads this answer)
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        finally:
            self.limiter.release()

    async def _slot_unless_gone(self, receive) -> bool:
        """Waits for a free job; False (and none taken) if the client disconnects first. The request's
        body has been read, so ``receive`` now answers only ``http.disconnect``, when the client leaves."""
        gone = acquired = False

        async def watch(scope: anyio.CancelScope) -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            await self.limiter.acquire()
            acquired = True
            await anyio.lowlevel.checkpoint()  # (a client already gone is seen here, before any work)
            tg.cancel_scope.cancel()
        if acquired and gone:
            self.limiter.release()
        return acquired and not gone

    async def page(self, request: Request) -> Response:
        return Response(self.files["index.html"], media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            raise ApiError(404, f"no file {name[:60]!r}")
        return Response(self.files[name], media_type=STATIC[name], headers=PAGE_HEADERS)

    async def health(self, request: Request) -> Response:
        # How many predictions were answered in how many batches (their ratio: the mean batch size).
        return JSONResponse({"status": "ok", "predictions": self.batcher.answered, "batches": self.batcher.batches})

    async def model(self, request: Request) -> Response:
        return JSONResponse(self.service.model_info)

    async def method_not_allowed(self, request: Request) -> Response:
        raise HTTPException(405, headers={"Allow": "POST"})

    async def score(self, request: Request) -> Response:
        limits = self.limits
        f = Fields(await json_body(request, limits.max_body), ("sentences",))
        sentences = f.strings("sentences", limits.max_sentences, limits.max_body)
        return JSONResponse(await self.in_thread(request, self.service.score, sentences))

    async def generate(self, request: Request) -> Response:
        service, limits = self.service, self.limits
        f = Fields(
            await json_body(request, limits.max_body),
            ("prompt", "tokens", "seed", "temperature", "per_node_temperature"),
        )
        prompt = f.text("prompt", limits.max_text, default="")
        tokens = f.integer("tokens", 20, 0, limits.max_tokens)
        seed = f.integer("seed", 0, 0, 2**63 - 1)
        temperature = f.number("temperature", 1.0, 0.0, limits.max_temperature)
        per_node = f.flag("per_node_temperature")
        if per_node and service.index is None:
            raise ApiError(
                400, f"per_node_temperature needs a tree model; this one has {service.model.config.output} output"
            )
        return JSONResponse(
            await self.in_thread(request, service.generate, prompt, tokens, seed, temperature, per_node)
        )

    async def tree(self, request: Request) -> Response:
        return JSONResponse(self.service.tree_summary())

    async def node(self, request: Request) -> Response:
        node = path_node(request)
        text = request.query_params.get("context")
        context = None
        if text is not None:
            if len(text) > self.limits.max_text:
                raise ApiError(400, f"'context' is {len(text):,} characters; the limit is {self.limits.max_text:,}")
            context = self.service.context_ids(text)[0]
        return JSONResponse(await self.in_thread(request, self.service.node, node, context))

    async def node_words(self, request: Request) -> Response:
        node = path_node(request)
        offset = query_int(request, "offset", 0, 0, 10**12)
        limit = query_int(request, "limit", 100, 1, self.limits.max_page)
        return JSONResponse(await self.in_thread(request, self.service.node_words, node, offset, limit))

    async def word(self, request: Request) -> Response:
        w = request.path_params["word"]
        if len(w) > self.limits.max_text:
            raise ApiError(400, "word too long")
        return JSONResponse(self.service.word(w))

    async def path(self, request: Request) -> Response:
        limits = self.limits
        f = Fields(await json_body(request, limits.max_body), ("context", "word"))
        text = f.text("context", limits.max_text, default="")
        w = f.text("word", limits.max_text)
        return JSONResponse(self.service.path(self.service.context_ids(text)[0], w))

    async def decisions(self, request: Request) -> Response:
        limits = self.limits
        f = Fields(await json_body(request, limits.max_body), ("context", "nodes"))
        text = f.text("context", limits.max_text, default="")
        nodes = f.obj.get("nodes")
        if not isinstance(nodes, list) or len(nodes) > limits.max_page:
            raise ApiError(400, f"'nodes' must be a list of at most {limits.max_page} node ids")
        if not all(type(j) is int for j in nodes):
            raise ApiError(400, "'nodes' must hold whole numbers (node ids)")
        return JSONResponse(self.service.decisions(self.service.context_ids(text)[0], nodes))


# ---- errors as JSON ----------------------------------------------------------------------------


async def _api_error(request: Request, e: ApiError) -> Response:
    return error(e.status, e.message)


async def _not_found(request: Request, e: NotFound) -> Response:
    return error(404, str(e))


async def _library_error(request: Request, e: HlblError) -> Response:
    return error(400, str(e))


async def _http_error(request: Request, e: HTTPException) -> Response:
    text = {
        404: f"no such endpoint: {request.method} {request.url.path[:100]}",
        405: f"{request.method} is not allowed on {request.url.path[:100]}",
    }.get(e.status_code, e.detail)
    return JSONResponse({"error": text}, status_code=e.status_code, headers=e.headers)


async def _internal(request: Request, e: Exception) -> Response:
    log.exception("error answering %s %s", request.method, request.url.path)
    return error(500, f"internal error ({type(e).__name__}); the server log has the details")


def _exception_handlers() -> dict:
    """Every error as ``{"error": message}`` with its status; anything unexpected a 500 whose
    details go to the server log, not to the client."""
    return {
        ApiError: _api_error,
        NotFound: _not_found,
        HlblError: _library_error,
        HTTPException: _http_error,
        Exception: _internal,
    }


def create_app(
    service: Service,
    allowed_hosts: tuple[str, ...] | None = None,
    jobs: int = 2,
    predict_thread: bool = False,
    max_queued: int = 64,
):
    """The ASGI application answering for ``service``. ``allowed_hosts``: Host header names to
    accept (None: any); ``jobs``: how many score, generate and tree requests are computed at once;
    ``max_queued``: how many more may wait (503 beyond); ``predict_thread``: compute predictions in
    a worker thread (see :class:`PredictBatcher`)."""
    # A mixture's predictions take long (its n-gram model looks up every word): off the event loop,
    # in capped batches, so that every other endpoint goes on answering.
    mixture = getattr(service, "mixture", None) is not None
    batcher = PredictBatcher(service, threaded=predict_thread or mixture, max_batch=MIXTURE_BATCH if mixture else None)
    endpoints = Endpoints(service, batcher, jobs, max_queued)
    app = Starlette(routes=endpoints.routes(), exception_handlers=_exception_handlers())
    app.state.service = service
    app.state.batcher = batcher
    app = Predict(app, service, batcher)
    if allowed_hosts is not None:
        return HostCheck(app, tuple(allowed_hosts))
    return app


__all__ = ["LOOPBACK_HOSTS", "ApiError", "PredictBatcher", "create_app"]
