"""Launching the server: uvicorn in this process (``mode: embedded`` or ``ray``), Ray Serve
(``mode: http``, the documents' production layout).

HTTP mode takes two lines on the server machine::

    twinkle.initialize(mode="http", groups=[DeviceGroup(name="model", ...), ...])
    twinkle.server.launch()  # or: twinkle-server launch -c config.yaml with mode: http

``initialize`` joins the Ray cluster and checks that the groups fit; ``launch`` deploys one
Serve application whose ingress replica runs the FastAPI app of ``twinkle.server.app`` and
builds the model service and the sampler service on their groups' workers (as ``mode: ray``
does in process). Serve's proxy listens on the config's host and port; ``/api/v1/healthz``
answers 503 while the model loads and 200 once it is ready. SIGINT or SIGTERM deletes the
application (the replica releases its groups) and stops Serve.

The ingress has exactly one replica: its ServerState (LoRA pool, fair scheduler, futures,
sessions) and the SQLite store each have a single writer. More replicas would need a shared
store (a Postgres or Redis backend behind ``twinkle.server.store.Store``) and one model
service that they all call.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from twinkle.server.config import (
    DeviceGroupConfig,
    ServerConfig,
    check_allow_lists,
    read_config_data,
)
from twinkle.utils import get_logger

logger = get_logger()
APP_NAME = "twinkle"
INGRESS_NAME = "TwinkleIngress"


def launch(
    config: ServerConfig | str | Path | None = None,
    *,
    host: str | None = None,
    port: int | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM.

    ``config`` is a ServerConfig, a YAML path, or None for the bundled CPU config; ``host``
    and ``port`` override it. After ``twinkle.initialize('http', groups=...)`` the service
    runs on Ray Serve with the recorded groups, whatever mode the file names; otherwise the
    config's mode decides (``http`` then joins Ray itself, with the config's groups and
    ``ray_init_kwargs``).
    """
    from twinkle.infra import get_device_groups, get_mode

    if isinstance(config, ServerConfig):
        overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
        data = {**config.model_dump(mode="json"), **overrides}
    else:
        data = read_config_data(config, host=host, port=port)
    initialized = get_mode() == "http"
    if initialized:
        data = with_recorded_groups(data, get_device_groups())
    server = ServerConfig.model_validate(data)
    problems = check_allow_lists(server)
    if problems:
        raise ValueError("the config's allow-lists name unknown components: " + "; ".join(problems))
    if server.mode != "http":
        _run_uvicorn(server)
        return
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "launch() serves until SIGINT or SIGTERM, which only the main thread receives; "
            "call it from the main thread"
        )
    if not initialized:
        _initialize_http(server)
    try:
        deploy(server)
        print(
            f"twinkle-server: serving on http://{server.host}:{server.port} (Ray Serve); "
            "/api/v1/healthz answers once the model is loaded",
            flush=True,
        )
        _wait_for_stop_signal()
    finally:
        shutdown(stop_ray=not initialized)


def with_recorded_groups(data: dict[str, Any], groups: list[Any]) -> dict[str, Any]:
    """The config mapping in http mode, with the groups ``twinkle.initialize`` recorded (the
    config may name the same groups, but not others: one place says where things run)."""
    recorded = [
        DeviceGroupConfig(name=g.name, ranks=g.ranks, device_type=g.device_type).model_dump()
        for g in groups
    ]
    declared = [
        DeviceGroupConfig.model_validate(g).model_dump() for g in data.get("device_groups") or []
    ]
    if recorded and declared and recorded != declared:
        raise ValueError(
            f"twinkle.initialize('http') recorded the groups {recorded} but the server config "
            f"declares {declared}; drop device_groups from the config or make them the same"
        )
    return {**data, "mode": "http", "device_groups": recorded or declared}


def deploy(server: ServerConfig) -> None:
    """Start Serve's proxy on the config's host and port and run the ingress (one replica)."""
    from ray import serve

    serve.start(http_options={"host": server.host, "port": server.port})
    ingress = _ingress_deployment().options(
        num_replicas=1,
        max_ongoing_requests=server.serve.max_ongoing_requests,
        ray_actor_options={"num_cpus": server.serve.num_cpus},
    )
    serve.run(ingress.bind(replica_config(server)), name=APP_NAME, route_prefix="/")


def replica_config(server: ServerConfig) -> dict[str, Any]:
    """What the ingress replica builds its state from: the components on Ray groups of the
    cluster it already joined, and absolute storage paths (a replica's working directory and
    environment, TWINKLE_HOME included, need not be this process's)."""
    storage = {
        "home": str(server.storage.home_path().resolve()),
        "database": str(server.storage.database_path().resolve()),
    }
    return {
        **server.model_dump(mode="json"),
        "mode": "ray",
        "ray_init_kwargs": {},
        "storage": storage,
    }


def _ingress_deployment() -> Any:
    """The ingress deployment class (built on first use, so uvicorn launches never import
    Ray Serve)."""
    from ray import serve

    @serve.deployment(name=INGRESS_NAME)
    @serve.ingress()
    class TwinkleIngress:
        def __init__(self, config: dict[str, Any]) -> None:
            self._config = ServerConfig.model_validate(config)

        def __serve_build_asgi_app__(self) -> Any:
            from twinkle.server.app import create_app_from_config

            return create_app_from_config(self._config)

        def __del__(self) -> None:
            # Serve runs the app's lifespan shutdown first, then this (once per replica).
            app, self._asgi_app = getattr(self, "_asgi_app", None), None
            if app is not None:
                _release(app)

    return TwinkleIngress


def _release(app: Any) -> None:
    """Stop the replica's services and release the groups' workers and placement groups."""
    from twinkle.infra.ray import runtime as ray_runtime

    app.state.twinkle.close()
    ray_runtime.shutdown()
    logger.info("twinkle-server stopped: its device groups are released")


def _initialize_http(server: ServerConfig) -> None:
    import twinkle
    from twinkle import DeviceGroup

    groups = [
        DeviceGroup(name=g.name, ranks=g.ranks, device_type=g.device_type)
        for g in server.device_groups
    ]
    twinkle.initialize("http", groups=groups, ray_init_kwargs=server.ray_init_kwargs or None)


def _wait_for_stop_signal() -> None:
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def shutdown(stop_ray: bool = False) -> None:
    """Delete the application (its replica releases the groups) and stop Serve; with
    ``stop_ray``, leave the Ray cluster this process joined too."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    serve.shutdown()
    if stop_ray:
        from twinkle.infra import reset

        ray.shutdown()
        reset()


def _run_uvicorn(server: ServerConfig) -> None:
    import uvicorn

    from twinkle.server.app import create_app_from_config

    uvicorn.run(
        create_app_from_config(server),
        host=server.host,
        port=server.port,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
