"""The runtime tests' shared fixture: a ggml RPC server graphgen starts on a free local port."""

import socket
import subprocess
import sys
import time

import pytest

from .test_backends import need


@pytest.fixture
def rpc_server():
    need("rpc")
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "graphgen.cli", "rpc-server", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 3600  # stops waiting on a server that never listens; generous for a loaded machine
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("rpc-server exited: " + proc.stderr.read().decode()[-500:])
            time.sleep(0.2)
    yield f"rpc://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
