"""``radixserve serve --models-dir DIR``: the hub's server. Starts no engine up front; each
model's engines start on its first request (`hub.ModelHub`). Shutdown (SIGINT/SIGTERM) drains
in-flight requests as single-model ``serve`` does, then unloads every model (no process left)."""

from __future__ import annotations

import argparse
import functools
import math
import shutil
import sys
import tempfile


def serve_models_dir(args: argparse.Namespace) -> int:
    from radixserve.frontend.models_dir.catalog import Catalog

    if args.distributed_executor_backend == "ray":
        raise SystemExit("radixserve: error: --models-dir runs local engines only "
                         "(not with --distributed-executor-backend ray)")
    try:
        catalog = Catalog(args.models_dir)
    except FileNotFoundError as exc:
        raise SystemExit(f"radixserve: error: {exc}") from None
    import uvloop

    return uvloop.run(_serve(args, catalog))


async def _serve(args, catalog) -> int:
    import uvicorn

    from radixserve import serve as single
    from radixserve.frontend.http.connection_guard import guarded_protocol, raise_fd_limit
    from radixserve.frontend.http.limits import serve_limits
    from radixserve.frontend.models_dir.hub import ModelHub
    from radixserve.frontend.models_dir.memory import GIB, MemoryPolicy
    from radixserve.frontend.models_dir.routes import build_hub_app
    from radixserve.frontend.models_dir.served import start_served_model
    from radixserve.frontend.responses.store import ResponseStore

    try:
        store = ResponseStore(args.response_store, args.response_store_max)
    except ValueError as exc:
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 1
    policy = MemoryPolicy(int(args.kv_cache_memory_gb * GIB), args.data_parallel_size,
                          None if args.models_memory_gb is None
                          else int(args.models_memory_gb * GIB))
    tmp = tempfile.mkdtemp(prefix="radixserve-hub-")
    hub = ModelHub(catalog, args, tmp, policy,
                   functools.partial(start_served_model, response_store=store))
    limits = serve_limits(args)
    app = build_hub_app(hub, args.api_key, limits)
    edge = limits.connections
    raise_fd_limit((edge.max_connections or 65536) + 1024)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            loop="none", http=guarded_protocol(edge),
                            timeout_keep_alive=edge.keep_alive_timeout,
                            timeout_graceful_shutdown=args.drain_timeout + single.DRAIN_GRACE_S)
    server = single.server_class()(config, app.router.drain, args.drain_timeout)
    hub.start_reaper()
    single.settle_gc()
    names = list(catalog.entries())
    idle = "never" if math.isinf(hub.idle_s) else f"after {hub.idle_s:g} s idle"
    print(f"radixserve: serving {len(names)} models from {args.models_dir} on "
          f"http://{args.host}:{args.port} (each loaded on its first request; at most "
          f"{hub.max_loaded} at once; unloaded {idle}): {', '.join(names) or '(none yet)'}",
          file=sys.stderr, flush=True)
    try:
        await server.serve()
    finally:
        await hub.close()
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


