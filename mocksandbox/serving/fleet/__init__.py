"""A fleet of mock sandboxes on a Ray cluster: ``mocksandbox serve --ray``, ``deploy(...)``.

verl runs on Ray: rollout and reward workers on many nodes call the sandbox at once. The fleet is
the mock as a Ray Serve application on that cluster:

* **N replicas**, each a whole mock server (:mod:`mocksandbox.serving.fleet.replica`), anywhere on the
  cluster, restarted by Serve when they die;
* **an HTTP proxy on every node** with a replica (``proxy_location="EveryNode"``), so a client on
  any node calls its own node's proxy at the same URL (``HeadOnly``: one proxy, on the head);
* **one control state** (:mod:`mocksandbox.control.ray_state`): a named actor holding the journal,
  the in-flight count and the cap, the fault rules and their schedules, the stats, the leases of
  the replicas' cap permits and the swedev session index. Every guarantee of one server holds for
  the fleet: ``max_in_flight`` is what the whole fleet saw, a rule with ``first: 3`` fails three
  requests fleet-wide, ``/_mock/reset`` resets every replica.

Ray is optional: ``pip install 'mocksandbox[fleet]'`` brings Ray Serve and a2wsgi. Nothing is
imported from Ray before :func:`deploy` is called.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Literal

from mocksandbox.control.handle import ControlHandle
from mocksandbox.control.state import CapacityPolicy
from mocksandbox.extras import MissingExtraError, is_installed
from mocksandbox.settings import Settings, load_settings

if TYPE_CHECKING:
    from mocksandbox.control.ray_state import RayControlState
    from mocksandbox.serving.fleet.replica import MemberConfig

__all__ = ["Fleet", "FleetError", "deploy", "require_fleet_extra"]

#: What the fleet imports, each from the ``fleet`` extra.
FLEET_MODULES = ("ray", "starlette", "uvicorn", "a2wsgi")
#: How long replicas and proxies may take to be ready (each replica builds a whole sandbox).
READY_TIMEOUT_S = 300.0
#: Consecutive answers, each on a new connection, that show every proxy routes to the app (the
#: kernel spreads new connections over the proxies sharing the port).
READY_PINGS = 30
ProxyLocation = Literal["EveryNode", "HeadOnly"]


class FleetError(RuntimeError):
    """The fleet could not be deployed; the message says why."""


def require_fleet_extra() -> None:
    """Raise :class:`~mocksandbox.extras.MissingExtraError` (one line) without Ray Serve."""
    for module in FLEET_MODULES:
        if not is_installed(module):
            raise MissingExtraError("the Ray fleet (serve --ray)", module, "fleet")


def _free_port(host: str) -> int:
    # Serve's proxies need a port known in advance (every node's proxy binds the same one).
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _check_port_free(host: str, port: int) -> None:
    """A :class:`FleetError` if something on this machine listens on ``host:port`` already. The
    node servers share their port (``SO_REUSEPORT``), so another server that set it too (another
    fleet of this user) would silently take half the connections instead of failing to bind."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise FleetError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


class Fleet(ControlHandle):
    """A running fleet: its URL, its control state, and :meth:`stop`. The control methods are
    those of :class:`~mocksandbox.core.MockSandbox` (what the pytest fixtures call), read from the
    control actor directly: exact, and no HTTP."""

    control: RayControlState
    #: A reset goes through a replica, which resets every replica's sessions.
    reset_timeout_s = 120

    def __init__(
        self,
        url: str,
        name: str,
        namespace: str,
        settings: Settings,
        control: RayControlState,
        replicas: int,
        owns_ray: bool,
        owns_serve: bool,
        temporary_state: str | None = None,
        node_servers: list[Any] | None = None,
    ) -> None:
        #: Base URL clients use on this node (``http://127.0.0.1:8080``): the replicas' own port
        #: (ingress ``node``), or Serve's proxy (ingress ``serve``).
        self.url = url
        #: The Serve application's name (its control actor is ``<name>-control``).
        self.name = name
        self.namespace = namespace
        self.settings = settings
        self.control = control
        #: How many replicas it was deployed with.
        self.replica_count = replicas
        self._owns_ray = owns_ray
        self._owns_serve = owns_serve
        #: The sessions' state root made for this fleet (no ``state_dir`` configured): removed by
        #: :meth:`stop` where it is on this machine (each replica removes its own slot on the way).
        self._temporary_state = temporary_state
        self._baseline_capacity = CapacityPolicy(
            settings.max_in_flight, settings.overload, settings.queue_timeout_s, settings.retry_after_s
        )
        self.stopped = False
        #: With ``ingress="node"``: the replicas' Ray actors (no Serve application then).
        self.node_servers = node_servers

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Delete the application and its control actor; then Serve and Ray where
        :func:`deploy` started them."""
        if self.stopped:
            return
        self.stopped = True
        import ray
        from ray import serve

        if not ray.is_initialized():
            return  # the cluster went first: nothing is left to stop
        try:
            if self.node_servers is not None:
                _stop_node_servers(self.node_servers)
            else:
                serve.delete(self.name)  # replicas stop gracefully: their slots' dirs go
        finally:
            if self._temporary_state is not None:
                shutil.rmtree(self._temporary_state, ignore_errors=True)
            try:
                ray.kill(self.control.actor)
            except Exception:
                pass  # already gone
            if self._owns_ray:
                ray.shutdown(wait_for_processes=True)  # Serve with it; its raylet and GCS gone
            elif self._owns_serve:
                serve.shutdown()

    # -- replicas --------------------------------------------------------------------------------

    def replicas(self, alive_only: bool = True) -> list[dict[str, Any]]:
        """The replicas the control actor knows: ``key``, ``node_id``, ``slot``, ``alive``,
        ``held`` (cap permits), ``url`` (peer port) and ``handle`` (the Ray actor)."""
        return [r for r in self.control.replicas() if r["alive"] or not alive_only]

    def wait_replicas(
        self, count: int | None = None, timeout: float = READY_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` (default: as deployed) replicas are alive; they are returned."""
        wanted = self.replica_count if count is None else count
        deadline = time.monotonic() + timeout
        while True:
            alive = self.replicas()
            if len(alive) >= wanted:
                return alive
            if time.monotonic() > deadline:
                raise FleetError(f"{len(alive)} of {wanted} replicas alive after {timeout:g} s")
            time.sleep(0.1)

    # -- the same names and meanings as MockSandbox's ------------------------------------------------


def _stop_node_servers(members: list[Any]) -> None:
    """Each member stops answering and releases its slot, then its actor goes (not restarted)."""
    import ray

    stops = [member.stop.remote() for member in members]
    try:
        ray.wait(stops, num_returns=len(stops), timeout=30)
    finally:
        for member in members:
            try:
                ray.kill(member, no_restart=True)
            except Exception:
                pass  # already gone


def _connect(address: str | None, namespace: str) -> bool:
    """Connect this process to Ray (the cluster at ``address``, ``auto``, or a new local one on
    127.0.0.1); whether it started Ray itself."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        ray.init(address=address, namespace=namespace, log_to_driver=False)
        return False
    from mocksandbox.ratelimit.ray_limiter import start_local_ray

    # address="local": a new instance, even where another cluster (or a stale record of one) exists.
    start_local_ray(num_cpus=max(2, os.cpu_count() or 2), namespace=namespace, address="local")
    return True


def deploy(
    settings: Settings | None = None,
    *,
    address: str | None = None,
    replicas: int = 2,
    proxy_location: ProxyLocation = "EveryNode",
    host: str | None = None,
    port: int | None = None,
    name: str = "mocksandbox",
    namespace: str = "mocksandbox",
    max_ongoing_requests: int = 256,
    max_replicas_per_node: int | None = None,
    ingress: Literal["serve", "node"] = "node",
) -> Fleet:
    """Deploy the mock as a Ray Serve application of ``replicas`` replicas; the running
    :class:`Fleet` (``fleet.url``; ``fleet.stop()``, or use it as a context manager).

    ``address``: the Ray cluster to join (``"auto"``, ``"ray://..."``, ``"host:6379"``); without
    it, the cluster this process is connected to, or a new local one on 127.0.0.1. ``host`` and
    ``port`` (default: the settings', 8080 there; ``0`` picks a free one) are where every node's
    proxy listens. ``max_replicas_per_node=1`` spreads the replicas over distinct nodes.
    Settings are read here and sent to the replicas: fault files are read here too; instance
    and dataset dirs must exist on every node.

    ``ingress="node"`` (the default): each replica is a Ray actor pinned to a node that serves
    HTTP itself on ``host:port`` (:class:`~mocksandbox.serving.fleet.replica.NodeServer`), so a
    request is served on the node it enters, on the path of ``mocksandbox serve``: no proxy hop,
    no ASGI bridge. Ray places the replicas (round robin over the alive nodes,
    ``max_replicas_per_node`` at most on each) and restarts a dead one on its node.
    ``ingress="serve"``: a Ray Serve application behind Serve's proxies (``proxy_location``),
    about 10 ms of CPU more per request (``benchmarks/bench_fleet.py --ingress serve``).
    """
    require_fleet_extra()
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    if proxy_location not in ("EveryNode", "HeadOnly"):
        raise ValueError("proxy_location must be 'EveryNode' or 'HeadOnly'")
    if ingress not in ("serve", "node"):
        raise ValueError("ingress must be 'serve' or 'node'")
    if address is None and "ray" not in sys.modules:
        # Ray reads this once, at its first import: "0" keeps a local instance's addresses on
        # loopback (otherwise it registers the machine's own address even with 127.0.0.1 asked).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray import serve

    from mocksandbox.control.ray_state import RayControlState, start_control_actor
    from mocksandbox.core import MockSandbox, capacity_from_settings
    from mocksandbox.serving.fleet.replica import FleetReplica, MemberConfig

    settings = settings or load_settings()
    # Fault files are read here: the replicas' nodes may not have them.
    baseline = MockSandbox.configured_faults(settings)
    token = secrets.token_hex(16)
    owns_ray = _connect(address, namespace)
    control = None
    temporary_state: str | None = None  # made here: removed again if the deploy fails
    try:
        owns_serve = ingress == "serve" and not _serve_running()
        host = host or settings.host
        port = settings.port if port is None else port
        if port == 0 and ingress == "node":
            port = _free_port(host)  # every node's members bind the same one
        elif ingress == "node":
            _check_port_free(host, port)
        elif port == 0:  # Serve's proxies need a port known in advance; a running Serve has one
            port = _serve_http_address()[1] if not owns_serve else _free_port(host)
        settings = settings.replace(
            faults=[spec.model_dump(mode="json") for spec in baseline],
            faults_file=None,
            host=host,
            port=port,
            workers=1,
        )
        keep_state = settings.state_dir is not None
        state_root = settings.state_dir or os.path.join(
            settings.tmp_root or tempfile.gettempdir(), f"mocksandbox-fleet-{name}-{token[:8]}"
        )
        temporary_state = None if keep_state else state_root
        control_name = f"{name}-control"
        try:
            ray.get_actor(control_name, namespace=namespace)
        except ValueError:
            pass
        else:
            raise FleetError(
                f"a fleet named {name!r} is running in Ray namespace {namespace!r}: stop it, or deploy "
                "with another name"
            )
        actor = start_control_actor(
            control_name, namespace, settings.journal_limit, capacity_from_settings(settings), baseline
        )
        control = RayControlState(actor)
        config = MemberConfig(
            settings.model_dump_json(),
            control_name,
            namespace,
            token,
            state_root,
            keep_state,
            max_ongoing_requests,
            # A local instance of ours: peers meet on loopback. On a cluster: the node's address.
            "127.0.0.1" if owns_ray else None,
        )
        members = None
        if ingress == "node":
            members = _start_node_servers(config, host, port, replicas, max_replicas_per_node)
        else:
            serve.start(proxy_location=proxy_location, http_options={"host": host, "port": port})
            bound = _serve_http_address()
            if bound != (host, port):
                raise FleetError(
                    f"Ray Serve already runs on this cluster with its proxies on {bound[0]}:{bound[1]}, "
                    f"not {host}:{port}: deploy with host={bound[0]!r}, port={bound[1]}, or shut it down "
                    "first"
                )
            deployment = serve.deployment(serve.ingress()(FleetReplica)).options(
                name="MockSandbox",
                num_replicas=replicas,
                max_ongoing_requests=max_ongoing_requests,
                ray_actor_options={"num_cpus": 0},
                max_replicas_per_node=max_replicas_per_node,
                graceful_shutdown_timeout_s=5,
            )
            # At the root: SandboxFusion's paths are absolute (one fleet per Serve instance).
            serve.run(deployment.bind(config), name=name, route_prefix="/")
        shown = f"[{host}]" if ":" in host else host
        fleet = Fleet(
            f"http://{shown}:{port}",
            name,
            namespace,
            settings,
            control,
            replicas,
            owns_ray,
            owns_serve,
            None if keep_state else state_root,
            node_servers=members,
        )
        try:
            fleet.wait_replicas()
        except BaseException:
            if members is not None:
                _stop_node_servers(members)
            raise
        if members is None:
            _wait_proxies(fleet, proxy_location)
        # The fleet starts as one server does: an empty journal (no readiness pings in it).
        control.reset(baseline, capacity_from_settings(settings))
        return fleet
    except BaseException:
        if control is not None:
            try:
                serve.delete(name)
            except Exception:
                pass
            ray.kill(control.actor)
        if temporary_state is not None:
            shutil.rmtree(temporary_state, ignore_errors=True)
        if owns_ray:
            ray.shutdown()
        raise


def _start_node_servers(
    config: MemberConfig, host: str, port: int, replicas: int, max_per_node: int | None
) -> list[Any]:
    """``replicas`` node servers, round robin over the alive nodes; each ready (serving) when this
    returns."""
    import ray
    from ray.exceptions import RayActorError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from mocksandbox.serving.fleet.replica import NodeServer

    nodes = sorted(node["NodeID"] for node in ray.nodes() if node.get("Alive"))
    if max_per_node is not None and replicas > max_per_node * len(nodes):
        raise FleetError(
            f"{replicas} replicas at most {max_per_node} per node need more than {len(nodes)} nodes"
        )
    actor_class = ray.remote(NodeServer)
    members = []
    for index in range(replicas):
        node_id = nodes[index % len(nodes)]
        members.append(
            actor_class.options(
                num_cpus=0,
                max_restarts=-1,  # Ray restarts a dead one on its node; it takes the dead one's slot
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(config, host, port)
        )
    try:
        ray.get([member.ready.remote() for member in members], timeout=READY_TIMEOUT_S)
    except BaseException as exc:
        for member in members:
            ray.kill(member, no_restart=True)
        if isinstance(exc, RayActorError):  # its __init__ failed: say why, in one line
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            cause = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "")
            raise FleetError(f"a replica could not start: {cause}") from None
        raise
    return members


def _serve_running() -> bool:
    from ray import serve

    try:
        serve.status()
    except Exception:
        return False
    from ray.serve.context import _get_global_client

    return _get_global_client(raise_if_no_controller_running=False) is not None


def _serve_http_address() -> tuple[str, int]:
    from ray.serve.context import _get_global_client

    config = _get_global_client().http_config
    return str(config.host), int(config.port)


def _wait_proxies(fleet: Fleet, proxy_location: ProxyLocation) -> None:
    """Wait until every node with a replica has a healthy proxy, and the URL answers /v1/ping
    ``READY_PINGS`` times in a row, each on a new connection."""
    import requests
    from ray import serve

    deadline = time.monotonic() + READY_TIMEOUT_S
    in_a_row = 0
    while in_a_row < READY_PINGS:
        if time.monotonic() > deadline:
            raise FleetError(f"{fleet.url}/v1/ping did not answer within {READY_TIMEOUT_S:g} s")
        proxies = serve.status().proxies
        nodes = {r["node_id"] for r in fleet.replicas()}
        healthy = {
            node for node, status in proxies.items() if str(getattr(status, "value", status)) == "HEALTHY"
        }
        ready = bool(healthy) if proxy_location == "HeadOnly" else nodes <= healthy
        if not ready:
            in_a_row = 0
            time.sleep(0.2)
            continue
        try:
            reply = requests.get(f"{fleet.url}/v1/ping", timeout=10, proxies={"http": "", "https": ""})
            ok = reply.status_code == 200
        except requests.RequestException:
            ok = False
        in_a_row = in_a_row + 1 if ok else 0
        if not ok:
            time.sleep(0.2)


def serve_fleet(
    settings: Settings,
    address: str | None,
    replicas: int | None,
    proxy_location: Literal["EveryNode", "HeadOnly"] | None,
    ingress: Literal["serve", "node"] = "node",
) -> int:
    """``serve --ray [ADDRESS]``: the mock as a Ray Serve fleet in the foreground (``address``
    ``None``: a new local Ray instance), until Ctrl-C or SIGTERM; the exit status."""
    from mocksandbox import __version__
    from mocksandbox.faults import FaultError
    from mocksandbox.serving.banner import stop_on_signals

    require_fleet_extra()  # one line naming the extra, from main()
    if settings.worker_count() > 1:
        print("mocksandbox: --workers and --ray do not combine: use --replicas N", file=sys.stderr)
        return 2
    if address is None:
        # A local Ray instance is this process's: its raylet's workers are handed to it, not to
        # init, when the raylet goes first, so that the stop below can end and reap every one.
        from mocksandbox.execution.launcher import become_subreaper

        become_subreaper()
    try:
        fleet = deploy(
            settings,
            address=address,
            replicas=replicas or 2,
            proxy_location=proxy_location or "EveryNode",
            ingress=ingress,
        )
    except (FleetError, FaultError, ValueError, ConnectionError) as exc:
        print(f"mocksandbox: {exc}", file=sys.stderr)
        return 2
    stop_requested = stop_on_signals()
    try:
        alive = fleet.replicas()
        nodes = sorted({r["node_id"] for r in alive})
        kind = "Ray Serve replicas" if ingress == "serve" else "replicas"
        print(
            f"mocksandbox {__version__} serving on {fleet.url} with {len(alive)} {kind} on "
            f"{len(nodes)} node(s)",
            flush=True,
        )
        if ingress == "serve":
            where = "every node with a replica" if proxy_location != "HeadOnly" else "the head node"
            print(f"  ingress: Ray Serve's proxies on {where}, each at {fleet.url}", flush=True)
        else:
            print(f"  ingress: each replica's own server on its node, at {fleet.url}", flush=True)
        print("  control state: one Ray actor (journal, cap, faults, leases, sessions)", flush=True)
        print("  press Ctrl-C to stop", flush=True)
        known = {r["key"] for r in alive}
        while not stop_requested.wait(1.0):  # say when Serve replaces a replica
            now = {r["key"] for r in fleet.replicas()}
            for key in sorted(known - now):
                print(f"mocksandbox: {key} is gone", flush=True)
            for key in sorted(now - known):
                print(f"mocksandbox: {key} joined", flush=True)
            known = now
    except KeyboardInterrupt:
        pass
    finally:
        print("\nmocksandbox: stopping the fleet", flush=True)
        fleet.stop()
        if address is None:
            end_descendants()
    return 0


def end_descendants(grace_s: float = 5.0, kill_s: float = 10.0) -> list[int]:
    """End and reap every process this one started that is still there (the pids it found); a
    process that ``kill_s`` seconds of SIGKILL do not end (stuck in the kernel) is left.

    ``ray.shutdown`` stops the raylet and GCS gracefully and waits for them, but not for the
    raylet's workers: an actor's worker can still be exiting, or be a zombie nobody reaped, when
    the driver returns. As their subreaper (see :func:`serve_fleet`), this process waits
    ``grace_s`` for them to exit, kills what is left, and reaps them all, so that a stopped local
    fleet leaves no process behind, not even a zombie of the host's init.
    """
    import psutil

    me = psutil.Process()
    found: set[int] = set()
    deadline = time.monotonic() + grace_s
    while True:
        left = me.children(recursive=True)
        if not left or time.monotonic() > deadline + kill_s:
            return sorted(found)
        found.update(p.pid for p in left)
        if time.monotonic() > deadline:
            for process in left:
                try:
                    process.kill()  # psutil checks the pid is still that process first
                except psutil.Error:
                    pass
        # A child's wait reaps it; a grandchild becomes a child when its parent dies.
        psutil.wait_procs(left, timeout=0.1)
