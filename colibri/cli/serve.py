"""colibri serve: an OpenAI-compatible HTTP server (colibri.serve; docs/SERVING.md)."""
import ipaddress
from pathlib import Path

from colibri.cli.options import INT32_MAX, count_in, open_model, stream_options, streaming_arguments


def _loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:   # a host name: it may resolve to anything
        return False


def _api_keys(path):
    """The keys of --api-key-file: one a line, blank lines skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            keys = [line.strip() for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"colibri serve: --api-key-file {path}: {getattr(e, 'strerror', None) or e}")
    if not keys:
        raise SystemExit(f"colibri serve: --api-key-file {path} holds no key")
    return keys


def seconds(text):
    value = float(text)
    if not value >= 0:
        raise ValueError(text)
    return value


def cmd_serve(args):
    keys = _api_keys(args.api_key_file) if args.api_key_file else []
    if not keys and not _loopback(args.host) and not args.insecure:
        raise SystemExit(f"colibri serve: --host {args.host} can be reached from other machines: give "
                         "--api-key-file FILE (clients send Authorization: Bearer KEY), or --insecure to serve "
                         "without a key")
    model = open_model(args.model, stream_experts=args.expert_budget is not None)
    if model.token_bytes(0) is None:
        raise SystemExit(f"colibri serve: {model.path} carries no vocabulary for the core's text: reconvert it "
                         "with colibri convert")
    from colibri.serve.app import serve

    serve(model, host=args.host, port=args.port, parallel=args.parallel, queue=args.queue,
          timeout=args.timeout or None, grace=args.grace, api_keys=keys, model_id=Path(model.path).name,
          session_options=dict(ctx=args.ctx, batch=args.batch, threads=args.threads, **stream_options(model, args)))
    return 0


def add_serve(sub):
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    s.add_argument("--model", help="colibri model directory or GGUF file (default: the bundled Shakespeare model)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; off loopback an --api-key-file is needed)")
    s.add_argument("--port", type=count_in(0, 65535), default=8080, help="port (default 8080)")
    s.add_argument("--parallel", type=count_in(1, 4096), default=4,
                   help="requests generated together: the session's sequence slots, a KV cache each (default 4)")
    s.add_argument("--ctx", type=count_in(0, INT32_MAX), default=0,
                   help="positions of each slot's context (default: the model's, at most 4096)")
    s.add_argument("--batch", type=count_in(0, 4096), default=0, help="tokens per forward chunk (default 64)")
    s.add_argument("--threads", type=count_in(0, 256), default=0,
                   help="threads (default: $COLIBRI_THREADS, else the cores)")
    s.add_argument("--queue", type=count_in(0, INT32_MAX), default=64,
                   help="requests that may wait for a slot; one more is answered 429 with Retry-After (default 64)")
    s.add_argument("--timeout", type=seconds, default=600.0, metavar="S",
                   help="a request's deadline in seconds from its arrival: a generation then ends with what it "
                        "has (finish_reason \"length\"), a request still waiting gets 503; 0 = none (default 600)")
    s.add_argument("--api-key-file", metavar="F",
                   help="the API keys, one a line: requests need Authorization: Bearer KEY (all but /health)")
    s.add_argument("--insecure", action="store_true", help="serve off loopback without an API key")
    s.add_argument("--grace", type=seconds, default=30.0, metavar="S",
                   help="on SIGTERM or SIGINT: stop accepting, let running requests finish for up to S seconds, "
                        "exit 0 (default 30)")
    streaming_arguments(s)
    s.set_defaults(func=cmd_serve)
