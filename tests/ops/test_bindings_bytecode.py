"""ggml-python's bindings are imported from bytecode written once into the cache, even by a process
that may not write bytecode: compiling their 15,000 lines at each start left about 15 MB in
every graphgen process."""

import json
import os
import subprocess
import sys

from graphgen import cache

PROBE = r"""
import json, sys
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
from graphgen.ops import runtime
rt = runtime.activate()
import numpy  # noqa: F401  before the baseline: the bindings import it
before = rss()
import ggml.ggml as b
print(json.dumps({"kib": rss() - before, "cached": b.__cached__, "package": str(rt.package_dir)}))
"""


def probe(env) -> dict:
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_bindings_load_from_bytecode(tmp_path):
    # a fresh cache, holding what graphgen fetched and built already (linked, not copied)
    for name in os.listdir(cache.configured_root()):
        if name.startswith(("ggml-python-", "llama-b", "glibc-shim-")):
            os.symlink(cache.configured_root() / name, tmp_path / name)
    env = dict(os.environ, GRAPHGEN_CACHE=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    env.pop("GRAPHGEN_GGML_DIR", None)
    first = probe(env)      # lays out the package and writes its bytecode
    assert first["package"].startswith(str(tmp_path))
    assert os.path.isfile(first["cached"]) and first["cached"].startswith(first["package"])
    second = probe(env)     # loads it
    # compiling the bindings' source costs about 16 MiB; their bytecode under 2 MiB
    assert second["kib"] < 6 * 1024, second
