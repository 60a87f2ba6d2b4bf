"""`graphgen devices`, `graphgen xdiff` and `graphgen rpc-server`."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile


def _cmd_devices(args) -> int:
    from ..ops.runtime import activate
    from ..runtime.backends import BUILD_HINT, devices, has_backend
    rt = activate()
    if args.json:
        print(json.dumps({"ggml": {"version": rt.version, "dir": str(rt.lib_dir), "origin": rt.origin},
                          "backends": {k: has_backend(k) for k in ("cpu", "vulkan", "cuda", "metal", "rpc")},
                          "devices": [vars(d) for d in devices()]}, indent=1))
        return 0
    print(f"ggml {rt.version} from {rt.lib_dir} ({rt.origin})")
    print("backends in this ggml build:")
    for kind in ("cpu", "vulkan", "cuda", "metal", "rpc"):
        state = "yes" if has_backend(kind) else f"no (build with {BUILD_HINT[kind]})" if kind in BUILD_HINT else "no"
        print(f"  {kind:7s} {state}")
    print("devices:")
    for d in devices():
        print(f"  {d.name:12s} {d.kind:6s} {d.description}")
    return 0


def _cmd_xdiff(args) -> int:
    from ..scenario import load_scenario
    from ..xdiff import xdiff
    from .kvtypes import apply_to_scenario
    sc = load_scenario(args.scenario)
    apply_to_scenario(args, sc)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]

    from .. import progress
    out = args.out or tempfile.mkdtemp(prefix="graphgen-xdiff-")
    try:
        with progress.task(f"xdiff {','.join(backends)}") as task:
            def on_step(step):
                if step.kind != "seq_rm":
                    task.update(f"step {step.index}: {step.kind}")
            res = xdiff(args.model, sc, backends, out, on_step, nmse=args.nmse)
    except BaseException:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
        raise
    print(json.dumps(res.to_dict(), indent=1) if args.json else res.format_text())
    if not args.out:
        if args.keep:
            progress.note(f"the dumps of both runs are in {out}")
        else:
            shutil.rmtree(out, ignore_errors=True)
    return 0 if res.ok else 1


def _cmd_rpc_server(args) -> int:
    import signal
    from ..runtime.backends import start_rpc_server
    # the server loops inside ggml, where a Python handler never runs: Ctrl-C and SIGTERM end the
    # process at once (it writes nothing that could be left half done)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"graphgen: warning: serving on {args.host}; the RPC protocol has no authentication", file=sys.stderr)
    def ready():
        print(f"ggml RPC server on {args.host}:{args.port} ({args.backend}), Ctrl-C to stop", file=sys.stderr,
              flush=True)
    start_rpc_server(args.host, args.port, args.threads, args.backend, on_ready=ready)
    return 0


def _nmse_arg(text: str) -> float:
    from .dump import _nmse_arg as parse
    return parse(text)


def register(sub) -> None:
    p = sub.add_parser("devices", help="list the backends and devices this build has")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p.set_defaults(fn=_cmd_devices)

    p = sub.add_parser("xdiff", help="run a scenario on two backends and graph-diff them node by node")
    p.add_argument("model")
    p.add_argument("--scenario", required=True)
    p.add_argument("--backends", required=True, help="two backends, e.g. cpu,vulkan")
    from .kvtypes import add_kv_type_flags
    add_kv_type_flags(p)
    p.add_argument("--out", help="folder for the per-backend dumps (default: a temp folder, removed after "
                                 "the comparison unless --keep)")
    p.add_argument("--keep", action="store_true", help="without --out: keep the temp folder and say where")
    p.add_argument("--nmse", type=_nmse_arg, default=None,
                   help="one NMSE bound for every node instead of the per-op ones (matmuls 5e-4, f16 "
                        "attention 5e-3, ...); integer results (argmax, argsort, top-k) stay exact")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=_cmd_xdiff)
    from .mmapflag import add_mmap_flag
    add_mmap_flag(p)  # --no-mmap

    p = sub.add_parser("rpc-server", help="serve a ggml backend over RPC")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50052)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--backend", default="cpu")
    p.set_defaults(fn=_cmd_rpc_server)
