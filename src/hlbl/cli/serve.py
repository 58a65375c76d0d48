"""``hlbl serve``: a trained run behind an HTTP API, with a page at ``/`` (see docs/serve.md)."""

from __future__ import annotations

import ipaddress
import socket
import sys

from ..errors import DataError
from .common import blank_lines_arg, pick_device, run_blank_lines, set_threads
from .mix import add_mixture_args, check_mixture_flags, mixing, ready_mixture


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def cmd_serve(args) -> int:
    check_mixture_flags(args)
    try:
        import uvicorn

        from ..serve.app import LOOPBACK_HOSTS, create_app
        from ..serve.server import ConnectionLimits, uvicorn_config
    except ImportError as e:
        raise DataError(f"hlbl serve needs the web stack ({e.name} is missing): pip install 'hlbl[serve]'") from None
    from ..serve.service import Limits

    if not 0 <= args.port < 65536:
        raise DataError(f"--port must be in 0..65535, got {args.port}")
    for name in ("jobs", "max_body", "max_connections", "max_queued"):
        if getattr(args, name) < 1:
            raise DataError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("header_timeout", "body_timeout", "keep_alive"):
        if not getattr(args, name) > 0:
            raise DataError(f"--{name.replace('_', '-')} must be above 0 seconds, got {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        set_threads(args.threads)  # (its one-line error, before anything is bound or read)
    # The socket is bound here rather than by uvicorn, and first: a port in use is a one-line error
    # before the model is loaded, and --port 0 can say which port the system chose.
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((args.host.strip("[]"), args.port))
        except OSError as e:
            raise DataError(f"cannot listen on {args.host} port {args.port}: {e.strerror or e}") from None
        service = load_service(args, Limits(max_body=args.max_body))
        service.warm_up()
        local = _loopback(args.host)
        app = create_app(
            service,
            allowed_hosts=LOOPBACK_HOSTS if local else None,
            jobs=args.jobs,
            predict_thread=args.predict_thread,
            max_queued=args.max_queued,
        )
        if not local:
            print(
                f"hlbl: note: serving on {args.host}: anyone who can reach this address can query the model",
                file=sys.stderr,
            )
        limits = ConnectionLimits(
            header_timeout=args.header_timeout, body_timeout=args.body_timeout, keep_alive=args.keep_alive
        )
        config = uvicorn_config(app, args.host, args.port, args.max_connections, limits)
        sock.listen(2048)  # connections wait from now on, while uvicorn starts
        shown = f"[{args.host.strip('[]')}]" if ":" in args.host else args.host
        print(
            f"hlbl: serving {service.run}{' in a mixture' if service.mixture else ''} "
            f"({service.model_info['vocab_size']:,} words) at "
            f"http://{shown}:{sock.getsockname()[1]}/ (Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        uvicorn.Server(config).run(sockets=[sock])
    return 0


def load_service(args, limits):
    """The run, or the mixture the flags name (docs/serve.md), with the blank-line rule ``hlbl score``
    reads by under the same flags: ``--blank-lines``, else the run's own (a mixture's n-gram model's)."""
    from ..serve.service import Service

    if mixing(args):
        set_threads(args.threads)
        mix, blank_lines = ready_mixture(args, pick_device(args.device))
        return Service.from_mixture(mix, limits, blank_lines)
    device = "cpu" if args.device == "cpu" else pick_device(args.device)  # (torch only where needed)
    service = Service.load(args.run, args.which, device, limits, blank_lines=run_blank_lines(args))
    if service.numpy:
        from ..numpy_model import set_numba_threads

        set_numba_threads(args.threads)
    else:
        set_threads(args.threads)
    return service


def add_commands(sub) -> None:
    s = sub.add_parser(
        "serve",
        help="an HTTP API and a page for a trained run (next words, scores, samples, tree)",
        description="Load a trained run once and answer JSON requests on /v1/... (predict, score, "
        "generate, tree); a page at / shows live next-word predictions and the learned "
        "tree. Needs the serve extra: pip install 'hlbl[serve]'.",
    )
    s.add_argument("run", nargs="?", default=None, help="run directory (none with --mixture)")
    s.add_argument(
        "--which",
        choices=("best", "last"),
        default="best",
        help="weights with the best valid perplexity, or after the last epoch",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; the default answers this machine only (0.0.0.0: every interface)",
    )
    s.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    s.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda, cuda:N or auto (the top-k search and sampling walk run on the CPU either way)",
    )
    s.add_argument("--threads", type=int, default=None, help="CPU threads for scoring")
    blank_lines_arg(s, None, "the run's own, as hlbl score")
    s.add_argument("--jobs", type=int, default=2, help="score/generate/tree requests computed at once (others wait)")
    s.add_argument(
        "--max-queued",
        type=int,
        default=64,
        help="score/generate/tree requests that may wait for --jobs (503 beyond); one whose client leaves is dropped",
    )
    s.add_argument("--max-body", type=int, default=1 << 20, help="largest request body in bytes")
    s.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="open connections and requests at once; beyond, the longest idle connections are closed, "
        "and requests get 503 when none is idle",
    )
    s.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds from connecting (or the last answer) to a complete request head (else 408)",
    )
    s.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        help="seconds from a request's head to the end of its body (else 408)",
    )
    s.add_argument("--keep-alive", type=float, default=5.0, help="seconds a connection may stay idle before a request")
    s.add_argument(
        "--predict-thread",
        action="store_true",
        help="compute each batch of predictions in a worker thread while the event loop reads the next "
        "requests (may help with cores to spare; see docs/serve.md)",
    )
    add_mixture_args(s)
    s.add_argument("--data", default=None, help="corpus whose valid split fits --weight auto (default: the run's)")
    s.set_defaults(func=cmd_serve)
