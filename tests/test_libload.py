"""graphgen/libload.py: finding the reference's libraries (and a developer's own build), and making the
wheel's libraries loadable on a glibc older than 2.38: the GLIBC_2.38 need marked weak in copies
(checked with binutils' readelf, never with the code under test), the copies cached once, the C shim
built once."""

import os
import re
import shutil
import subprocess

import pytest

import graphgen.libload as L
from graphgen.libload import ReferenceUnavailable


def _needs(path) -> dict[str, str]:
    """readelf's version needs of an ELF file: name -> flags."""
    out = subprocess.run(["readelf", "-V", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"Name: (\S+)\s+Flags: (\S+)", out))


needs_readelf = pytest.mark.skipif(shutil.which("readelf") is None, reason="needs binutils' readelf")


def test_lib_file_takes_the_plain_then_the_shortest_versioned_name(tmp_path):
    assert L.lib_file(tmp_path, "llama") is None
    for n in ("libllama.so.0.0.1", "libllama.so.0", "libggml.dylib"):
        (tmp_path / n).write_bytes(b"")
    assert L.lib_file(tmp_path, "llama") == tmp_path / "libllama.so.0"
    assert L.lib_file(tmp_path, "ggml") == tmp_path / "libggml.dylib"
    (tmp_path / "libllama.so").write_bytes(b"")
    assert L.lib_file(tmp_path, "llama") == tmp_path / "libllama.so"


def test_a_build_chosen_with_llama_names_the_reference(monkeypatch, tmp_path):
    monkeypatch.delenv(L.ENV_LLAMA_DIR, raising=False)
    assert L.custom_llama_dir() is None and L.reference_label() == "llama.cpp b11739"
    monkeypatch.setenv(L.ENV_LLAMA_DIR, str(tmp_path / "b" / ".." / "build"))
    assert L.custom_llama_dir() == tmp_path / "build"
    assert L.reference_label() == f"llama.cpp at {tmp_path / 'build'}"


@pytest.mark.parametrize("name, version", [("glibc 2.36", (2, 36)), ("glibc 2.38.9", (2, 38)), ("musl", None),
                                           ("", None)])
def test_glibc_version(monkeypatch, name, version):
    monkeypatch.setattr(os, "confstr", lambda key: name)
    assert L.glibc_version() == version


def test_no_glibc_version_where_confstr_has_none(monkeypatch):
    def none(key):
        raise ValueError("unrecognized configuration name")
    monkeypatch.setattr(os, "confstr", none)
    assert L.glibc_version() is None and L.glibc_shim() is None


def test_no_shim_from_glibc_2_38_on(monkeypatch):
    monkeypatch.setattr(L, "glibc_version", lambda: (2, 38))
    assert L.glibc_shim() is None
    monkeypatch.setattr(L, "glibc_version", lambda: (3, 0))
    assert L.glibc_shim() is None


def test_another_version_of_the_wheel_is_named(monkeypatch):
    import importlib.metadata
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.9999")
    with pytest.raises(ReferenceUnavailable, match=r"llama-cpp-py-sync 0.9999 is installed, the reference is "
                                                   r"0.11739 \(build b11739\)"):
        L.package_dir()


@needs_readelf
def test_the_version_need_is_marked_weak_and_nothing_else(tmp_path):
    src = L.package_dir() / "libggml-base.so.0"
    before = _needs(src)
    assert before["GLIBC_2.38"] == "none"
    lib = tmp_path / "lib.so"
    shutil.copy(src, lib)
    assert L.weaken_version_need(lib, b"GLIBC_2.38") == 1
    after = _needs(lib)
    assert after == dict(before, **{"GLIBC_2.38": "WEAK"})
    assert lib.stat().st_size == src.stat().st_size
    assert L.weaken_version_need(lib, b"GLIBC_9.99") == 0 and _needs(lib) == after


def test_only_an_elf64_file_is_patched(tmp_path):
    f = tmp_path / "x.so"
    f.write_bytes(b"MZ not an ELF file at all")
    with pytest.raises(ReferenceUnavailable, match="x.so: not a little-endian ELF64 file"):
        L.weaken_version_need(f, b"GLIBC_2.38")
    assert f.read_bytes() == b"MZ not an ELF file at all"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHGEN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_wheel_missing_libraries_is_named(monkeypatch, tmp_path):
    (tmp_path / "libllama.so.0").write_bytes(b"")
    monkeypatch.setattr(L, "package_dir", lambda: tmp_path)
    with pytest.raises(ReferenceUnavailable, match=r"llama-cpp-py-sync is missing libggml-base.so.0, "
                                                   r"libggml-cpu.so.0, libggml-rpc.so.0, libggml.so.0 in "):
        L.prepare_libraries()


def test_on_a_new_glibc_the_wheels_own_folder_is_used(monkeypatch, cache_dir):
    monkeypatch.setattr(L, "glibc_shim", lambda: None)
    assert L.prepare_libraries() == (L.package_dir(), None)
    assert not cache_dir.exists()


@needs_readelf
def test_on_an_old_glibc_weakened_copies_are_cached_once(monkeypatch, cache_dir, tmp_path):
    shim = tmp_path / "libshim.so"
    monkeypatch.setattr(L, "glibc_shim", lambda: shim)
    folder, got = L.prepare_libraries()
    assert got == shim and folder.parent == cache_dir and folder.name.startswith("llama-b11739-")
    assert sorted(p.name for p in folder.iterdir()) == sorted(L.LIB_NAMES + (".complete",))
    src = L.package_dir()
    for n in L.LIB_NAMES:
        theirs, ours = _needs(src / n), _needs(folder / n)
        assert all(theirs[k] == ours[k] for k in theirs if k != "GLIBC_2.38")
        if "GLIBC_2.38" in theirs:
            assert theirs["GLIBC_2.38"] == "none" and ours["GLIBC_2.38"] == "WEAK", n
        assert (folder / n).stat().st_mode & 0o777 in (0o644, 0o755)  # readable by every user
    stamp = (folder / "libllama.so.0").stat().st_mtime_ns
    assert L.prepare_libraries() == (folder, shim) and (folder / "libllama.so.0").stat().st_mtime_ns == stamp
    assert [p.name for p in cache_dir.iterdir()] == [folder.name]  # no temporary folder left


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_a_c_library_is_built_once_by_its_source(cache_dir):
    import ctypes
    lib = L.build_c_library("t-lib", "int answer(void) { return 42; }\n", "a test")
    assert lib.name == "libt_lib.so" and ctypes.CDLL(str(lib)).answer() == 42
    stamp = lib.stat().st_mtime_ns
    assert L.build_c_library("t-lib", "int answer(void) { return 42; }\n", "a test") == lib
    assert lib.stat().st_mtime_ns == stamp
    other = L.build_c_library("t-lib", "int answer(void) { return 7; }\n", "a test")
    assert other != lib and ctypes.CDLL(str(other)).answer() == 7
    with pytest.raises(ReferenceUnavailable, match="building libt_lib.so failed: "):
        L.build_c_library("t-lib", "this is not C\n", "a test")


def test_no_compiler_is_named_with_the_need(cache_dir, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ReferenceUnavailable, match="the reason: a C compiler .cc or gcc. is required to build "
                                                   "libno_cc.so"):
        L.build_c_library("no-cc", "int x;\n", "the reason")
