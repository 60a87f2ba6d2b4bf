"""tools/memory.py's yardstick: a tree's memory counted with its grandchildren, a page two
processes share counted once, and a run it cannot measure refused."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("memory_tool", ROOT / "tools" / "memory.py")
memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory)

MIB = 1024
# a child that touches 150 MiB of its own and holds it for a while
HOLD = "import time; b = bytearray(150 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.6)"


def test_grandchild_memory_counted():
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {HOLD!r}], check=True)"
    r = memory.run_measured([sys.executable, "-c", parent])
    assert r["processes"] >= 2 and r["samples"] > 0
    assert r["peak_rss_kib"] >= 150 * MIB, r
    assert r["max_process_hwm_kib"] >= 150 * MIB, r


def test_shared_pages_counted_once(tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(b"\1" * (120 << 20))
    # two processes mapping and reading the same 120 MiB file, at the same time
    reader = (f"import mmap, time; f = open({str(f)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); "
              "s = sum(m[i] for i in range(0, len(m), 4096)); time.sleep(0.8)")
    parent = (f"import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', {reader!r}]); "
              f"exec({reader!r}); c.wait()")
    r = memory.run_measured([sys.executable, "-c", parent])
    assert r["sampled_rss_sum_kib"] >= 240 * MIB, r     # each process shows the file resident
    assert 120 * MIB <= r["peak_rss_kib"] < 200 * MIB, r  # the tree holds it once


def test_failed_run_is_an_error_not_a_row():
    with pytest.raises(memory.MeasureError, match="exited 3"):
        memory.run_measured([sys.executable, "-c", "import sys; sys.exit(3)"])
