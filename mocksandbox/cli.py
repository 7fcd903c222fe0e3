"""The ``mocksandbox`` command: serve a mock SandboxFusion, and the tools around it."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mocksandbox import __version__

if TYPE_CHECKING:
    pass


#: The settings ``serve``'s options set: setting name -> the option's ``dest``. The reference pages
#: of the docs read this too, to name each setting's option.
SERVE_OPTIONS: dict[str, str] = {
    "host": "host",
    "port": "port",
    "python": "python",
    "runtime_dir": "runtime_dir",
    "confinement": "confinement",
    "isolation": "isolation",
    "run_network": "run_network",
    "run_as": "run_as",
    "idmapped_mounts": "idmapped_mounts",
    "run_env_keep": "run_env_keep",
    "exec_mode": "exec_mode",
    "max_output_bytes": "max_output_bytes",
    "output_mode": "output_mode",
    "access_log": "access_log",
    "allowed_hosts": "allow_host",
    "allow_any_host": "allow_any_host",
    "workers": "workers",
    "pin_workers": "pin_workers",
    "starting_runs": "starting_runs",
    "faults_file": "faults",
    "max_in_flight": "max_in_flight",
    "overload": "overload",
    "queue_timeout_s": "queue_timeout",
    "control_api": "no_control_api",
    "datasets_dirs": "datasets",
    "max_runner_concurrency": "max_runner_concurrency",
    "dataset_assets_dir": "dataset_assets",
    "jupyter_pool_size": "jupyter_pool_size",
    "jupyter_prewarm": "jupyter_prewarm",
    "jupyter_launcher": "jupyter_launcher",
    "instances_dirs": "instances",
    "state_dir": "state_dir",
    "swedev_backend": "swedev_backend",
    "swedev_backend_python": "swedev_backend_python",
    "session_ttl_s": "session_ttl",
    "max_sessions": "max_sessions",
    "reward_mode": "reward_mode",
    "session_isolation": "session_isolation",
    "replay_file": "replay",
    "replay_mode": "replay_mode",
    "replay_timing": "replay_timing",
}
#: ``store_true`` flags among them: given, a flag sets its setting to this; not given, it leaves the
#: setting to the config file and the environment.
SERVE_FLAGS: dict[str, bool] = {
    "access_log": True,
    "allow_any_host": True,
    "no_control_api": False,
    "jupyter_prewarm": True,
    "replay_timing": True,
}


def serve_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The settings ``serve``'s command line sets (``None``: not given)."""
    overrides: dict[str, object] = {}
    for setting, dest in SERVE_OPTIONS.items():
        value = getattr(args, dest)
        if dest in SERVE_FLAGS:
            value = SERVE_FLAGS[dest] if value else None
        overrides[setting] = value
    return overrides


def _doctor(args: argparse.Namespace) -> int:
    """``mocksandbox doctor``: the engine ``serve`` would start, its protections table, and stop."""
    from mocksandbox.execution.engine import IsolationError, create_engine
    from mocksandbox.execution.launcher import LauncherError
    from mocksandbox.execution.protections import format_table, protections
    from mocksandbox.serving.banner import host_lines
    from mocksandbox.settings import SettingsError, load_settings

    overrides = {
        name: getattr(args, name)
        for name in ("isolation", "run_as", "idmapped_mounts", "run_network", "confinement")
    }
    try:
        settings = load_settings(args.config, overrides=overrides)
        engine, confinement, launcher = create_engine(settings)
    except (SettingsError, IsolationError, LauncherError) as exc:
        print(f"mocksandbox: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mocksandbox: cannot set up execution: {exc}", file=sys.stderr)
        return 2
    try:
        rows = protections(engine.isolation, confinement, engine.proofs)
        # The rest of what `serve --verbose` says of runs here (the table stands for its summary).
        details = [line for line in host_lines(engine, confinement, settings) if "protections:" not in line]
    finally:
        launcher.close()
        engine.close()
        confinement.close()
    print(f"mocksandbox {__version__} on this host, as `serve` would start (uid {os.geteuid()}):")
    print(format_table(rows))
    print("\nwhat runs get here (as `serve --verbose` says it):")
    print("\n".join(details))
    return 0 if all(row.holds == "yes" for row in rows) else 1


def _serve(args: argparse.Namespace) -> int:
    from mocksandbox.serving.single import is_loopback
    from mocksandbox.settings import SettingsError, load_settings

    try:
        settings = load_settings(
            args.config,
            overrides=serve_overrides(args),
        )
    except SettingsError as exc:
        print(f"mocksandbox: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(settings.host):
        bar = "!" * 78
        print(
            f"{bar}\nWARNING: binding {settings.host}: mocksandbox runs any program it is sent, as "
            f"this user, with no authentication.\nAnyone who can reach this address can run code "
            f"on this machine. Bind 127.0.0.1 unless you mean it.\nRequests must name a loopback host or "
            f"{settings.host}: add --allow-host NAME for each name or address clients use.\n{bar}",
            file=sys.stderr,
        )
    if settings.allow_any_host:
        bar = "!" * 78
        print(
            f"{bar}\nWARNING: --allow-any-host: requests naming any host, and requests from any web "
            f"page, are answered.\nA page the user visits can then make this server run code "
            f"(DNS rebinding, cross-site requests).\nUse it only behind a proxy that checks Host "
            f"and Origin itself; prefer --allow-host NAME.\n{bar}",
            file=sys.stderr,
        )
    if settings.jupyter_prewarm:
        jupyter_missing = _jupyter_missing(settings.python)
        if jupyter_missing:
            print(f"mocksandbox: --jupyter-prewarm: {jupyter_missing}", file=sys.stderr)
            return 2
    if settings.replay_file:  # a cassette that cannot be read stops start-up (each worker reads it too)
        from mocksandbox.recording import CassetteError, player_from_settings

        try:
            player_from_settings(settings)
        except CassetteError as exc:
            print(f"mocksandbox: {exc}", file=sys.stderr)
            return 2
    if args.ray is not None:
        from mocksandbox.serving.fleet import serve_fleet

        address = None if args.ray == LOCAL_RAY else args.ray
        return serve_fleet(settings, address, args.replicas, args.proxy_location, args.ingress)
    if args.replicas is not None or args.proxy_location is not None:
        print("mocksandbox: --replicas and --proxy-location go with --ray", file=sys.stderr)
        return 2
    if settings.worker_count() > 1:
        from mocksandbox.serving.workers import serve_workers

        return serve_workers(settings, verbose=args.verbose)
    from mocksandbox.serving.single import serve_single

    return serve_single(settings, verbose=args.verbose)


#: ``--ray`` without an address: a new local Ray instance on 127.0.0.1.
LOCAL_RAY = "local"


def _jupyter_missing(python: str) -> str | None:
    from mocksandbox.extras import jupyter_missing

    return jupyter_missing(python)


#: Where the documentation is: the site is not published at an address, so its source and how to
#: build it (every setting is on its generated Reference > Settings page).
DOCS_HINT = (
    "Documentation: the docs/ pages of the source tree; from a checkout, make docs builds the site into "
    "site/ and make docs-serve serves it on http://127.0.0.1:8000 (every setting: Reference > Settings). "
    "The options: mocksandbox COMMAND --help."
)

#: Modules that add a subcommand with ``register(subparsers)``; absent ones are skipped.
EXTRA_COMMAND_MODULES = (
    "mocksandbox.contract.command",  # mocksandbox contract
    "mocksandbox.stress.command",  # mocksandbox stress
    "mocksandbox.tools.command",  # mocksandbox rollout
    "mocksandbox.runtime.command",  # mocksandbox runtime install, mocksandbox languages
    "mocksandbox.recording.command",  # mocksandbox record
    "mocksandbox.datasets.command",  # mocksandbox datasets
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mocksandbox",
        description=__doc__,
        epilog=DOCS_HINT,
    )
    parser.add_argument("--version", action="version", version=f"mocksandbox {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run a SandboxFusion-compatible server in the foreground")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8080; 0 picks a free one)")
    serve.add_argument("--config", metavar="FILE", help="settings file (.toml, .yaml or .json)")
    serve.add_argument(
        "--verbose",
        action="store_true",
        help="say everything at start-up (budgets, hidden paths, each dataset, ...), not a screenful",
    )
    serve.add_argument(
        "--python",
        metavar="PATH",
        help="interpreter for user Python code and Jupyter kernels "
        "(default: the runtime dir's Python venv if installed, else this one)",
    )
    serve.add_argument(
        "--runtime-dir", metavar="DIR", help="toolchain shims and runtime libraries (`runtime install`)"
    )
    serve.add_argument(
        "--confinement",
        choices=["auto", "cgroup", "cgroup-v2", "process-group"],
        help="how runs are confined (default auto: cgroup v1, else v2, where writable)",
    )
    serve.add_argument(
        "--isolation",
        choices=["auto", "lite", "none"],
        help="what a run can see and touch (default auto: lite where this host allows it: every run "
        "in a world of its own; none: the host's files, processes and network, as SandboxFusion's none)",
    )
    serve.add_argument(
        "--run-network",
        choices=["private", "host"],
        help="a lite run's network (default private: its own loopback only; host: the host's network)",
    )
    serve.add_argument(
        "--run-as",
        choices=["auto", "user", "root"],
        help="who a lite run is on the host (default auto: an unprivileged uid, root only in a user "
        "namespace of its own, where this host allows it; user: that or do not start; root: the host's root)",
    )
    serve.add_argument(
        "--idmapped-mounts",
        choices=["auto", "off"],
        help="how a root server's runs are an unprivileged uid (default auto: through idmapped mounts where "
        "the kernel takes them, else without; off: always without, the host root's files read-only to runs)",
    )
    serve.add_argument(
        "--run-env-keep",
        action="append",
        metavar="NAME",
        help="pass this environment variable to runs although its name looks like a credential (repeatable)",
    )
    serve.add_argument(
        "--exec-mode",
        choices=["fork", "spawn"],
        help="fork (default): Python runs in a forked warm interpreter; spawn: a new process per run",
    )
    serve.add_argument("--max-output-bytes", type=int, metavar="N", help="cap per output stream")
    serve.add_argument(
        "--output-mode",
        choices=["complete", "sandboxfusion"],
        help="complete: drain every stream (default; answers SandboxFusion would cut get a divergence "
        "note); sandboxfusion: SandboxFusion's reader, which stalls programs past ~128 KiB of output",
    )
    serve.add_argument("--access-log", action="store_true", help="log each request line")
    serve.add_argument("--faults", metavar="FILE", help="fault rules to apply (.json, .yaml or .toml)")
    serve.add_argument(
        "--max-in-flight",
        type=int,
        metavar="K",
        help="answer requests beyond K at once with 429 (or queue them)",
    )
    serve.add_argument(
        "--overload", choices=["reject", "queue"], help="over the cap: reject with 429 (default) or queue"
    )
    serve.add_argument(
        "--queue-timeout", type=float, metavar="S", help="with --overload queue: 429 after S seconds"
    )
    serve.add_argument("--no-control-api", action="store_true", help="do not serve the /_mock/ endpoints")
    serve.add_argument(
        "--workers",
        metavar="N|auto",
        help="server processes answering from one address over one control state (default 1; "
        "auto: one per usable core)",
    )
    serve.add_argument(
        "--pin-workers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep each relay to one core (a run to a relay on its server thread's core) and, with "
        "--workers N, each worker, its launcher and relays to its share of the usable cores "
        "(default: on; user programs always get every core)",
    )
    serve.add_argument(
        "--starting-runs",
        type=int,
        metavar="N",
        help="runs that may be starting at once (their first 20 ms, starting_run_ms), the others "
        "waiting their turn: less CPU a run under load (default: one per usable core; 0: no limit)",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="also answer requests for this host name (repeatable; *.example.com for all under it); "
        "others than loopback names and --host get 403",
    )
    serve.add_argument(
        "--allow-any-host",
        action="store_true",
        help="answer any Host and Origin (only behind a proxy that checks them: web pages could run code)",
    )
    fleet = serve.add_argument_group("Ray fleet (pip install 'mocksandbox[fleet]')")
    fleet.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL_RAY,
        metavar="ADDRESS",
        help="serve as a fleet of replicas on a Ray cluster: join the cluster at ADDRESS (auto: the one "
        "`ray start` began here), or start a local one on 127.0.0.1 when no ADDRESS is given",
    )
    fleet.add_argument("--replicas", type=int, metavar="N", help="replicas of the fleet (default 2)")
    fleet.add_argument(
        "--ingress",
        choices=["node", "serve"],
        default="node",
        help="node: each replica serves HTTP itself on its node (default); serve: behind Ray Serve's proxies",
    )
    fleet.add_argument(
        "--proxy-location",
        choices=["EveryNode", "HeadOnly"],
        help="with --ingress serve: an HTTP proxy on every node with a replica (default) or on the head "
        "node only",
    )
    swedev = serve.add_argument_group("swedev sessions")
    swedev.add_argument(
        "--instances",
        action="append",
        metavar="DIR",
        help="instance dir, dir of them, or JSONL of SWE-bench rows; added to the shipped ones (repeatable)",
    )
    swedev.add_argument("--state-dir", metavar="DIR", help="keep session records and work dirs here")
    swedev.add_argument(
        "--swedev-backend", metavar="URL", help="run session commands and tests on this SandboxFusion"
    )
    swedev.add_argument(
        "--swedev-backend-python", metavar="PATH", help="interpreter for tests on the backend (python3)"
    )
    swedev.add_argument("--session-ttl", type=float, metavar="S", help="reclaim sessions idle this long")
    swedev.add_argument("--max-sessions", type=int, metavar="N", help="live sessions at once (1024)")
    swedev.add_argument(
        "--reward-mode", choices=["f2p", "resolved"], help="reward: F2P pass fraction (default) or 0/1"
    )
    swedev.add_argument(
        "--session-isolation",
        choices=["auto", "world", "namespace", "paths"],
        help="/workspace per session: a world of its own (needs --isolation lite), mount namespace, "
        "path translation, or auto (default: the first of these this server can give)",
    )
    extras = serve.add_argument_group("datasets and Jupyter")
    extras.add_argument(
        "--datasets",
        action="append",
        metavar="DIR",
        help="directory of dataset JSONL files (code_eval_<id>.jsonl), repeatable",
    )
    extras.add_argument(
        "--max-runner-concurrency",
        type=int,
        metavar="N",
        help="online-judge cases of one /submit run at once (3; 0: all)",
    )
    extras.add_argument(
        "--dataset-assets",
        metavar="DIR",
        help="SandboxFusion's assets/ dir (RepoBench-P tokenizer, CRUXEval-X examples); default ./assets",
    )
    extras.add_argument(
        "--jupyter-pool-size", type=int, metavar="N", help="kernels kept ready for /run_jupyter (2; 0: none)"
    )
    extras.add_argument(
        "--jupyter-prewarm", action="store_true", help="start the kernels now, not at the first request"
    )
    extras.add_argument(
        "--jupyter-launcher",
        choices=["fork", "spawn"],
        help="kernels forked from a template (default) or spawned",
    )
    replay = serve.add_argument_group("cassettes (see mocksandbox record)")
    replay.add_argument(
        "--replay", metavar="FILE", help="answer requests that match a recording from this cassette"
    )
    replay.add_argument(
        "--replay-mode",
        choices=["strict", "fallback", "prefer-local"],
        help="unmatched requests: strict (default) answers 404 naming the nearest recording; fallback "
        "runs them here; prefer-local runs every language this host has here and replays the rest",
    )
    replay.add_argument(
        "--replay-timing", action="store_true", help="hold replayed answers for their recorded durations"
    )
    serve.set_defaults(handler=_serve)

    doctor = commands.add_parser(
        "doctor",
        help="say which protections of a run hold on this host (proved by a real run), why not, "
        "and what would give them; exit 0 when all hold, 1 when some do not, 2 when what was asked "
        "for cannot be had",
    )
    doctor.add_argument("--config", metavar="FILE", help="settings file (YAML or TOML), as for serve")
    doctor.add_argument("--isolation", choices=["auto", "lite", "none"], help="as for serve")
    doctor.add_argument("--run-as", choices=["auto", "user", "root"], help="as for serve")
    doctor.add_argument("--idmapped-mounts", choices=["auto", "off"], help="as for serve")
    doctor.add_argument("--run-network", choices=["private", "host"], help="as for serve")
    doctor.add_argument(
        "--confinement", choices=["auto", "cgroup", "cgroup-v2", "process-group"], help="as for serve"
    )
    doctor.set_defaults(handler=_doctor)

    # Other commands live beside the code they drive; each module offers register(subparsers)
    # and must stay cheap to import (heavy imports go inside its handler).
    for module_name in EXTRA_COMMAND_MODULES:
        package = module_name.rpartition(".")[0]
        if all(importlib.util.find_spec(name) is not None for name in (package, module_name)):
            importlib.import_module(module_name).register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mocksandbox`` console script."""
    from mocksandbox.extras import MissingExtraError, missing_extra_message

    args = build_parser().parse_args(argv)
    what = f"'mocksandbox {args.command}'"
    try:
        return int(args.handler(args))
    except MissingExtraError as exc:
        print(f"mocksandbox: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # An optional module imported deep inside a command: one line naming the extra, not a
        # traceback. Other missing modules are real errors and keep theirs.
        message = missing_extra_message(what, exc)
        if message is None:
            raise
        print(f"mocksandbox: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`mocksandbox datasets | head`): as a shell tool ends, quietly, and
        # with nothing more written to the closed pipe at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
