"""``mocksandbox record``: run a recording proxy in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "record",
        help="record a SandboxFusion-compatible deployment through a proxy into a cassette",
        description=(
            "Forward every request to --upstream and write each exchange to --cassette (one JSON "
            "line each); clients get exactly what the upstream answered. Replay the cassette with "
            "'mocksandbox serve --replay FILE'."
        ),
    )
    parser.add_argument("--upstream", required=True, metavar="URL", help="base URL of the deployment")
    parser.add_argument("--cassette", required=True, metavar="FILE", help="where to write the exchanges")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to bind (default 8080; 0: a free one)")
    parser.add_argument(
        "--redact",
        action="append",
        default=[],
        metavar="FIELD",
        help="JSON key (at any depth, in requests and answers) or answer header never stored (repeatable)",
    )
    parser.add_argument(
        "--append", action="store_true", help="add to the cassette instead of replacing what it holds"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from mocksandbox.recording.cassette import CassetteWriter
    from mocksandbox.recording.forward import Forwarder
    from mocksandbox.recording.proxy import create_proxy_server
    from mocksandbox.recording.recorder import Recorder
    from mocksandbox.serving.banner import stop_on_signals

    # A new run replaces the cassette's old lines at its first exchange (not before: a proxy that
    # records nothing leaves the cassette as it was).
    writer = CassetteWriter(args.cassette, None if args.append else uuid.uuid4().hex)
    recorder = Recorder(Forwarder(args.upstream), writer, args.redact)
    try:
        server = create_proxy_server(recorder, args.host, args.port)
    except OSError as exc:
        print(f"mocksandbox: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"mocksandbox record: serving on {server.url}", flush=True)
    print(f"  upstream: {recorder.upstream}", flush=True)
    print(
        f"  cassette: {args.cassette} ({'appending' if args.append else 'replaced at the first exchange'})",
        flush=True,
    )
    if args.redact:
        print(f"  redacted: {', '.join(args.redact)}", flush=True)
    server.stop_requested = stop_on_signals()
    try:
        print("  press Ctrl-C to stop", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        print("\nmocksandbox record: stopping", flush=True)
        server.server_close()
        recorder.forwarder.close()
    return 0
