"""colibri serve-experts, orchestrate and strip-experts: experts computed on another machine,
placed across edges by measured load (docs/DEVICES.md)."""
from colibri.cli.options import count_in, open_model


def cmd_serve_experts(args):
    try:
        from colibri.remote import server
    except ImportError as e:
        raise SystemExit(f"colibri serve-experts needs grpcio and protobuf: pip install 'colibri-moe[remote]' ({e})")
    args.model = open_model(args.model).path
    return server.main(args)


def cmd_orchestrate(args):
    from colibri.remote import orchestrator

    return orchestrator.run(args)


def add_orchestrate(sub):
    from colibri.remote import orchestrator

    o = sub.add_parser("orchestrate", help="place experts across edges by their measured load (heartbeats)")
    orchestrator.add_arguments(o)
    o.set_defaults(func=cmd_orchestrate)


def cmd_strip_experts(args):
    from colibri.remote.edge import strip_experts

    try:
        kept, left = strip_experts(args.src, args.out)
    except (ValueError, OSError) as e:
        raise SystemExit(f"colibri strip-experts: {e}")
    print(f"wrote {args.out}: weights.bin keeps {kept:,} B, leaves out {left:,} B of routed experts; run it with "
          f"colibri generate --model {args.out} --experts-elsewhere --remote HOST:PORT --expert-budget SIZE")
    return 0


def add_serve_experts(sub):
    se = sub.add_parser("serve-experts", help="compute a model's experts for other machines, over gRPC "
                        "(docs/DEVICES.md); needs the remote extra")
    se.add_argument("--model", help="colibri model directory (default: the bundled model)")
    se.add_argument("--listen", default="127.0.0.1:50051", metavar="HOST:PORT",
                    help="address to serve on (default 127.0.0.1:50051, loopback only; port 0: any free port); "
                         "another host needs --token and TLS, or --insecure")
    tok = se.add_mutually_exclusive_group()
    tok.add_argument("--token", help="shared secret the callers send as \"authorization: Bearer TOKEN\" "
                                     "(visible to other local users in the process list: prefer --token-file)")
    tok.add_argument("--token-file", metavar="FILE", help="read the token from FILE")
    se.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    se.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    se.add_argument("--insecure", action="store_true", help="allow a non-loopback address without a token and TLS")
    se.add_argument("--kernels", default="auto", help="kernel variant: auto (default), reference (strict: "
                    "the same bits as an edge computing with the reference kernels), or one of colibri's variants")
    se.add_argument("--threads", type=count_in(0, 256), default=0, help="compute threads (default: $COLIBRI_THREADS, else the cores)")
    se.add_argument("--batch", type=count_in(1, 4096), default=64, help="the largest prefill chunk of the edges served (default 64): "
                    "a call carries at most batch * top_k rows")
    se.add_argument("--max-message", type=float, metavar="MB",
                    help="bound on one message's MiB (default: what the largest call needs)")
    se.add_argument("--queue", type=count_in(1, 65536), default=256, metavar="N",
                    help="Computes that may wait for the compute thread (default 256: 16 connections with all "
                         "their 16 streams open); a call past it is answered RESOURCE_EXHAUSTED at once")
    se.add_argument("--no-fetch", action="store_true", help="do not serve the experts' weights (FetchExpert)")
    se.add_argument("--hold", metavar="SPEC", help="the routed experts this server computes, the same ids in every "
                    "MoE layer: ids and ranges, e.g. 0-31 or 0-3,8,12-15 (default: all); a fleet shares them out")
    fl = se.add_argument_group("fleet", "announce this server in etcd, where edges started with --fleet find it "
                               "(docs/DEVICES.md, Fleet of expert servers)")
    fl.add_argument("--etcd", metavar="HOST:PORT[,...]",
                    help="the etcd cluster's members: the control plane's store, where expert servers announce "
                         "themselves and edges find them")
    fl.add_argument("--etcd-prefix", default="/colibri", metavar="P",
                    help="the control plane's keys in etcd (default /colibri): this server is P/servers/ADDRESS")
    fl.add_argument("--lease-ttl", type=count_in(1, 3600), default=10, metavar="S",
                    help="seconds the announcement outlives this server when it dies without a stop (default 10): "
                         "an etcd lease, refreshed every S/3")
    fl.add_argument("--advertise", metavar="HOST:PORT",
                    help="the address edges reach this server at (default: the address it listens on; needed "
                         "when that is 0.0.0.0 or ::)")
    se.set_defaults(func=cmd_serve_experts)


def add_strip_experts(sub):
    sx = sub.add_parser("strip-experts", help="a copy of a model without its routed experts, for an edge that "
                        "fetches them from `colibri serve-experts` (--experts-elsewhere)")
    sx.add_argument("src", help="colibri model directory (interleaved layout: its experts written last)")
    sx.add_argument("out", help="output directory: colibri_model.json and weights.bin up to the first expert")
    sx.set_defaults(func=cmd_strip_experts)
