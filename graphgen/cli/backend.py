"""`graphgen devices`, `graphgen xdiff` and `graphgen rpc-server`."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile


def _cmd_devices(args) -> int:
    import ctypes

    from ..ops.runtime import activate
    from ..runtime.backends import BUILD_HINT, devices, has_backend
    rt = activate()
    devs = devices()
    kinds = ("cpu", "vulkan", "cuda", "metal", "rpc")
    prefixes = {"vulkan": ("vulkan",), "cuda": ("cuda",), "metal": ("metal", "mtl")}

    def why_no_cuda_device() -> str:
        # a CUDA build loads without a driver (the runtime opens libcuda.so.1 only when it starts),
        # so an empty list means no driver, or a driver without a GPU or too old for the runtime
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return "no NVIDIA driver on this machine (libcuda.so.1 not found)"
        try:
            with open("/proc/self/maps") as f:
                cudart = next((ln.split()[-1] for ln in f if "/libcudart.so" in ln), None)
            if cudart is not None:
                rt_lib = ctypes.CDLL(cudart)
                rt_lib.cudaGetErrorString.restype = ctypes.c_char_p
                err = rt_lib.cudaGetDeviceCount(ctypes.byref(ctypes.c_int(0)))
                if err:
                    return f"the CUDA runtime says: {rt_lib.cudaGetErrorString(err).decode()}"
        except (OSError, AttributeError):
            pass
        return "the NVIDIA driver reports no GPU"

    # a backend built in whose kind has no device here: said so, not an error (a CUDA build made on
    # a machine without a GPU, say)
    idle = {k: (why_no_cuda_device() if k == "cuda" else "no device found")
            for k, pre in prefixes.items()
            if has_backend(k) and not any(d.name.lower().startswith(pre) for d in devs)}
    if args.json:
        print(json.dumps({"ggml": {"version": rt.version, "dir": str(rt.lib_dir), "origin": rt.origin},
                          "backends": {k: has_backend(k) for k in kinds},
                          "backends_without_device": idle,
                          "devices": [vars(d) for d in devs]}, indent=1))
        return 0
    print(f"ggml {rt.version} from {rt.lib_dir} ({rt.origin})")
    print("backends in this ggml build:")
    for kind in kinds:
        if has_backend(kind):
            state = f"yes (built in, but no {kind} device here: {idle[kind]})" if kind in idle else "yes"
        else:
            state = f"no (build with {BUILD_HINT[kind]})" if kind in BUILD_HINT else "no"
        print(f"  {kind:7s} {state}")
    print("devices (llama.cpp's names, as -dev takes them):")
    for d in devs:
        mem = (f"{d.memory_free / 2**20:,.0f} MiB free of {d.memory_total / 2**20:,.0f} MiB"
               if d.memory_total else "memory not reported")
        print(f"  {d.name:12s} {d.kind:6s} {mem:<32} {d.description}")
    for d in devs:
        if d.memory_free_source and d.kind == "cpu":
            print(f"  ({d.name}'s free memory: {d.memory_free_source})")
    for kind, why in idle.items():
        print(f"  (no {kind} devices: {why}; the backend is built in)")
    return 0


def _cmd_xdiff(args) -> int:
    from ..compare.xdiff import xdiff
    from .dump import filter_options
    from .kvtypes import apply_to_scenario
    from .llamaflags import backend_of, model_path, scenario_from_args
    model = model_path(args)
    sc = scenario_from_args(args, model)
    apply_to_scenario(args, sc)
    if not args.backends:
        raise ValueError("xdiff compares two devices: give them with -dev A,B (e.g. -dev CPU,Vulkan0)")
    backends = [backend_of(b) for b in args.backends.split(",") if b.strip()]
    filters = filter_options(args)

    from .. import progress
    out = args.out or tempfile.mkdtemp(prefix="graphgen-xdiff-")
    try:
        with progress.task(f"xdiff {','.join(backends)}") as task:
            def on_step(step):
                if step.kind != "seq_rm":
                    task.update(f"step {step.index}: {step.kind}")
            res = xdiff(model, sc, backends, out, on_step, nmse=args.nmse, local=args.local, **filters)
    except BaseException:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
        raise
    print(json.dumps(res.to_dict(), indent=1) if args.json else res.format_text())
    from ..compare.report import local_unmeasured
    unmeasured = local_unmeasured([g["local"] for g in res.graphs if g.get("local")]) if args.local else None
    if unmeasured:
        print(f"graphgen: error: {unmeasured}", file=sys.stderr)
        res.ok = None
    if not args.out:
        if args.keep:
            progress.note(f"the dumps of both runs are in {out}")
        else:
            shutil.rmtree(out, ignore_errors=True)
    return 2 if res.ok is None else 0 if res.ok else 1


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
    from .llamaflags import backend_of
    start_rpc_server(args.host, args.port, args.threads, backend_of(args.backend), on_ready=ready)
    return 0


def _nmse_arg(text: str) -> float:
    from .dump import _nmse_arg as parse
    return parse(text)


def register(sub) -> None:
    p = sub.add_parser("devices", help="list the backends and devices this build has")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p.set_defaults(fn=_cmd_devices)

    from .dump import add_filter_args
    from .kvtypes import add_kv_type_flags
    from .llamaflags import add_context_flags, add_device, add_model
    p = sub.add_parser("xdiff", help="run a scenario on two backends and graph-diff them node by node")
    add_model(p)
    add_context_flags(p)
    add_device(p, default=None, many=True)
    add_kv_type_flags(p)
    p.add_argument("--out", help="folder for the per-backend dumps (default: a temp folder, removed after "
                                 "the comparison unless --keep)")
    p.add_argument("--keep", action="store_true", help="without --out: keep the temp folder and say where")
    p.add_argument("--nmse", type=_nmse_arg, default=None,
                   help="one NMSE bound for every node instead of the per-op ones (default: matmuls 5e-4, f16 "
                        "attention 5e-3, ...); integer results (argmax, argsort, top-k) stay exact")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--local", action="store_true",
                   help="also each node's own error: every node of the second backend re-run alone on the "
                        "first backend's values of its sources, against the first's output (default: off)")
    add_filter_args(p)
    p.set_defaults(fn=_cmd_xdiff)
    from .mmapflag import add_mmap_flag
    add_mmap_flag(p)  # --no-mmap

    p = sub.add_parser("rpc-server", help="serve a ggml backend over RPC")
    p.add_argument("-H", "--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; anything else is reachable from the network, "
                        "and the RPC protocol has no authentication)")
    p.add_argument("-p", "--port", type=int, default=50052, help="TCP port (default 50052)")
    p.add_argument("-t", "--threads", type=int, default=1, help="CPU threads of the served backend (default 1)")
    p.add_argument("-dev", "--device", "--backend", dest="backend", default="cpu", metavar="DEV",
                   help="the backend to serve: CPU, Vulkan0, CUDA0 ... or cpu, vulkan:0 ... (default cpu)")
    p.set_defaults(fn=_cmd_rpc_server)
