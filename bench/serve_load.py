"""Load check of ``hlbl serve``: requests/s and latency of ``POST /v1/predict`` under concurrent clients.

    python bench/serve_load.py --run runs/ptb-random              # 8 clients, k = 10, 10 s
    python bench/serve_load.py --run runs/ptb-random --clients 1 --seconds 5
    python bench/serve_load.py --run runs/ptb-random --compare-thread --repeat 3 --seconds 5
    python bench/serve_load.py --quick           # a check of the script: a tiny model, 2 clients, 1 s

Starts ``hlbl serve RUN`` in a child process on a free localhost port (as a user would), waits
for ``/health``, then runs ``--clients`` connections in this process, each sending one request
at a time (keep-alive) for ``--seconds`` after ``--warmup`` seconds: a closed loop, so the
latency a client sees includes the queueing behind the other clients. The contexts are prefixes
of the corpus's validation sentences (the run's corpus), each request a different one, cycled.
The client is asyncio on raw sockets with the requests encoded in advance, so that it takes as
little of the CPU the server shares with it as it can.

Then the same load on a do-nothing ASGI application on uvicorn (same options, an answer of the
same size, no model): the floor that the HTTP server, the client and the machine set, without
hlbl. ``--compare-thread`` also measures ``hlbl serve --predict-thread`` (the search in a worker
thread instead of on the event loop). ``--repeat N`` measures every variant N times, in turn (the
load of a shared machine drifts), and reports each one's run of median requests/s.

Next to it, in this process: the in-process time of the model's exact top-k for one context
(``model.topk``, batch of 1) and per context in batches of 8 (what the server's batching does),
and the same for the server's own call (``Service.topk``), median over the same contexts.

The reference load: 8 clients, k = 10, on a PTB
model. The figures depend on what else the machine runs: the output records its load average.
Writes one JSON object (``--out``, and the last line of stdout). ``--quick`` trains a model of one
epoch on the synthetic corpus of ``bench/_common.py`` (no ``--run``), loads it with 2 clients for
1 s after 0.2 s, and writes the JSON to a temporary directory; without the serve extra
(uvicorn) it measures only the in-process search, with a message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from _common import add_common, finish_args, loadavg, machine, quick_run, write_json


def contexts_from(run: Path, count: int, seed: int) -> list[str]:
    """Prefixes (0 to 8 words) of the run corpus's validation sentences."""
    from hlbl.run import Run

    corpus = Run.open(run).record.corpus.directory()
    lines = [ln.split() for ln in (corpus / "valid.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = rng.choice(lines)
        cut = rng.randint(0, min(8, len(words)))
        out.append(" ".join(words[:cut]))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FLOOR_BODY = json.dumps(
    {
        "context": ["<eos>", "<eos>", "the", "company", "said"],
        "oov": 0,
        "words": ["it", "the", "that", "<eos>", "he", "its", "a", "mr.", "they", "<unk>"],
        "probs": [0.20561453305298952] * 10,
    },
    separators=(",", ":"),
).encode()


async def floor_app(scope, receive, send):
    """Reads the request and answers a fixed prediction-sized body: uvicorn's own cost."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(FLOOR_BODY)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": FLOOR_BODY})


def serve_floor(port: int) -> None:
    """The floor on the connections ``hlbl serve`` has (its protocol and limits), without hlbl's app."""
    import uvicorn

    from hlbl.serve.server import ConnectionLimits, uvicorn_config

    uvicorn.Server(uvicorn_config(floor_app, "127.0.0.1", port, 256, ConnectionLimits())).run()


def start_server(run: Path | None, port: int, extra: list[str]) -> subprocess.Popen:
    """``hlbl serve RUN`` on ``port``, or with ``run`` None the do-nothing floor application."""
    if run is None:
        cmd = [sys.executable, __file__, "--floor-port", str(port)]
    else:
        cmd = [sys.executable, "-m", "hlbl", "serve", str(run), "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with status {proc.returncode}: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not answer /health within 120 s")


def request_bytes(port: int, context: str, k: int) -> bytes:
    body = json.dumps({"context": context, "k": k}).encode()
    return (
        f"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def client(
    port: int, requests: list[bytes], start: int, t_measure: float, t_end: float, lat: list[float], errors: list[str]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = start
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                break
            writer.write(requests[i % len(requests)])
            i += 1
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            t1 = time.perf_counter()
            if status != b"200":
                errors.append(f"{status.decode()} {body[:200]!r}")
            elif t0 >= t_measure:
                lat.append(t1 - t0)
    finally:
        writer.close()


async def load(port: int, requests: list[bytes], clients: int, warmup: float, seconds: float, server_pid: int):
    """Latencies and errors of the measured period, and the CPU seconds the server and this
    client used in it."""
    lat: list[float] = []
    errors: list[str] = []
    now = time.perf_counter()
    t_measure, t_end = now + warmup, now + warmup + seconds
    spread = len(requests) // clients
    cpu = {}

    async def meter():
        await asyncio.sleep(warmup)
        cpu["start"] = (cpu_seconds(server_pid), time.process_time())
        await asyncio.sleep(seconds)
        cpu["end"] = (cpu_seconds(server_pid), time.process_time())

    await asyncio.gather(
        meter(), *(client(port, requests, c * spread, t_measure, t_end, lat, errors) for c in range(clients))
    )
    return lat, errors, [b - a for a, b in zip(cpu["start"], cpu["end"])]


def in_process_topk(run: Path, contexts: list[str], k: int, threads: int | None) -> dict:
    """Median time of the model's top-k per context, one at a time and in batches of 8: the
    library's ``model.topk`` and the server's ``Service.topk`` (probabilities, as lists)."""
    import torch

    from hlbl.run import load_model
    from hlbl.scoring import encode_context
    from hlbl.serve.service import Service

    if threads:
        torch.set_num_threads(threads)
    model, vocab, _ = load_model(run)
    model.eval()
    n = model.config.context
    ctx = torch.tensor([encode_context(vocab, c.split(), n)[0] for c in contexts[:2000]])
    for i in range(50):  # compile and warm up
        model.topk(ctx[i : i + 1], k)
    # What the server calls: the same search with its arrays and scratch kept between calls.
    service = Service.load(run)
    ids = ctx.tolist()
    service.topk(ids[:8], k)
    one, eight, s_one, s_eight = [], [], [], []
    for i in range(0, len(ctx) - 8, 8):
        t0 = time.perf_counter()
        model.topk(ctx[i : i + 1], k)
        t1 = time.perf_counter()
        model.topk(ctx[i : i + 8], k)
        t2 = time.perf_counter()
        service.topk(ids[i : i + 1], k)
        t3 = time.perf_counter()
        service.topk(ids[i : i + 8], k)
        t4 = time.perf_counter()
        one.append(t1 - t0)
        eight.append((t2 - t1) / 8)
        s_one.append(t3 - t2)
        s_eight.append((t4 - t3) / 8)

    def us(ts):
        return round(1e6 * statistics.median(ts), 1)

    return {
        "batch_1_us": us(one),
        "batch_8_per_context_us": us(eight),
        "service_batch_1_us": us(s_one),
        "service_batch_8_per_context_us": us(s_eight),
        "contexts": len(one),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def measure(run: Path | None, requests_of, args) -> dict:
    """Start a server (``hlbl serve RUN``, or the floor application), load it, stop it."""
    port = free_port()
    server = start_server(run, port, args.server_args.split() if run is not None else [])
    try:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        lat, errors, (server_cpu, client_cpu) = runner(
            load(port, requests_of(port), args.clients, args.warmup, args.seconds, server.pid)
        )
        health = {}
        if run is not None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                health = json.load(r)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    if not lat:
        raise SystemExit(f"no request answered in the measured time; errors: {errors[:3]}")
    lat.sort()

    def q(x):
        return round(1e3 * lat[min(len(lat) - 1, int(x * len(lat)))], 3)

    out = {
        "requests": len(lat),
        "errors": len(errors),
        "first_errors": errors[:3],
        "requests_per_s": round(len(lat) / args.seconds, 1),
        "latency_ms": {
            "p50": q(0.50),
            "p90": q(0.90),
            "p99": q(0.99),
            "max": round(1e3 * lat[-1], 3),
            "mean": round(1e3 * statistics.fmean(lat), 3),
        },
        # CPU time per answered request: less sensitive than the rates to what else the machine
        # runs. The server is one process, so 1e6 / server_cpu_us_per_request bounds its rate on a free core.
        "server_cpu_us_per_request": round(1e6 * server_cpu / len(lat), 1),
        "client_cpu_us_per_request": round(1e6 * client_cpu / len(lat), 1),
    }
    if "batches" in health:
        out["server_mean_batch"] = round(health["predictions"] / max(1, health["batches"]), 2)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", help="run directory (a PTB model for the reference load)")
    p.add_argument("--floor-port", type=int, help=argparse.SUPPRESS)  # (the child process of the floor measurement)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seconds", type=float, default=10.0, help="measured time (after --warmup)")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--contexts", type=int, default=5000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-args", default="", help="extra arguments for hlbl serve (one string)")
    p.add_argument(
        "--repeat", type=int, default=1, help="measure each variant this many times, in turn (median reported)"
    )
    p.add_argument(
        "--compare-thread",
        action="store_true",
        help="also measure hlbl serve --predict-thread (the search in a worker thread)",
    )
    add_common(p, out="serve.json", optional_out=True, out_help="also write the JSON result here")
    args = p.parse_args(argv)
    if args.floor_port:
        serve_floor(args.floor_port)
        return {}
    finish_args(args, clients=2, seconds=1.0, warmup=0.2, contexts=200, repeat=1)
    if args.quick and not args.run:
        args.run = str(quick_run("serve")[0])
    if not args.run:
        p.error("--run is required")
    if args.clients < 1 or args.seconds <= 0 or args.warmup < 0 or args.repeat < 1:
        p.error("--clients and --repeat must be at least 1 and --seconds positive")
    run = Path(args.run)
    contexts = contexts_from(run, args.contexts, args.seed)

    def requests_of(port: int) -> list[bytes]:
        return [request_bytes(port, c, args.k) for c in contexts]

    load_before = loadavg()
    # Variants measured in turn, --repeat times (the machine's load drifts: alternating spreads it).
    variants = {"hlbl_serve": run, "floor_do_nothing_app": None}
    if args.compare_thread:
        variants["hlbl_serve_predict_thread"] = run
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        if not args.quick:
            raise SystemExit('hlbl serve needs the serve extra: pip install -e ".[serve]"')
        print("uvicorn/starlette are not installed: the quick run measures the in-process search only", file=sys.stderr)
        variants = {}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, target in variants.items():
            saved = args.server_args
            if name == "hlbl_serve_predict_thread":
                args.server_args = (saved + " --predict-thread").strip()
            runs[name].append(measure(target, requests_of, args))
            args.server_args = saved
    load_after = loadavg()

    def median_run(rs: list[dict]) -> dict:  # the run of median requests/s, with every run's rate
        best = sorted(rs, key=lambda r: r["requests_per_s"])[len(rs) // 2]
        return {**best, "requests_per_s_each_run": [r["requests_per_s"] for r in rs]} if len(rs) > 1 else best

    served = median_run(runs.pop("hlbl_serve")) if "hlbl_serve" in runs else {"latency_ms": None}
    others = {name: median_run(rs) for name, rs in runs.items()}
    inproc = in_process_topk(run, contexts, args.k, None)
    result = {
        "command": "python bench/serve_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "run": run.name,
        "clients": args.clients,
        "k": args.k,
        "seconds": args.seconds,
        **served,
        **others,
        "in_process_topk": inproc,
        "targets": {"p50_ms_below": 2.0, "requests_per_s_at_least": 1000},
        "machine": {**machine(), "loadavg_before": load_before, "loadavg_after": load_after},
    }
    result["meets_targets"] = bool(served["latency_ms"]) and (
        served["latency_ms"]["p50"] < 2.0 and served["requests_per_s"] >= 1000
    )
    text = json.dumps(result)
    if args.out:
        write_json(args.out, result)
    print(text)
    return result


if __name__ == "__main__":
    main()
