"""Time spent inside ggml's scheduler compute, measured inside a libllama process.

`graphgen bench` splits a step's wall time into compute (the scheduler running the graph's
kernels) and host overhead (everything else a driver pays). graphgen times its own
`ggml_backend_sched_graph_compute` call; libllama calls the scheduler from C, so its side is
timed by a small library loaded with RTLD_GLOBAL before libllama: it defines
`ggml_backend_sched_graph_compute_async` and `ggml_backend_sched_synchronize`, which libllama
then binds to, and forwards each call to libggml-base's own function (found by soname once
libllama has loaded it), adding the time to a counter.
"""

from __future__ import annotations

import ctypes

from ..libload import build_c_library

TIMER_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*compute_fn)(void *, void *);
typedef void (*sync_fn)(void *);
static compute_fn real_compute;
static sync_fn real_sync;
static uint64_t total_ns, n_calls;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t) t.tv_sec * 1000000000ull + (uint64_t) t.tv_nsec;
}

static void bind(void) {
    void *h = dlopen("libggml-base.so.0", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libggml-base.so", RTLD_NOW | RTLD_NOLOAD);
    if (h) {
        real_compute = (compute_fn) dlsym(h, "ggml_backend_sched_graph_compute_async");
        real_sync = (sync_fn) dlsym(h, "ggml_backend_sched_synchronize");
    }
    if (!real_compute || !real_sync) {
        fprintf(stderr, "graphgen compute timer: libggml-base is not loaded\n");
        abort();
    }
}

int ggml_backend_sched_graph_compute_async(void *sched, void *graph) {
    if (!real_compute) bind();
    uint64_t t0 = now_ns();
    int status = real_compute(sched, graph);
    total_ns += now_ns() - t0;
    n_calls++;
    return status;
}

void ggml_backend_sched_synchronize(void *sched) {
    if (!real_sync) bind();
    uint64_t t0 = now_ns();
    real_sync(sched);
    total_ns += now_ns() - t0;
}

uint64_t graphgen_compute_ns(void) { return total_ns; }
uint64_t graphgen_compute_calls(void) { return n_calls; }
"""


class ComputeTimer:
    """Load before libllama; `ns()` is the total time spent in the scheduler's compute so far."""

    def __init__(self):
        path = build_c_library("compute-timer", TIMER_SOURCE, "timing libllama's graph compute")
        self._lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        self._lib.graphgen_compute_ns.restype = ctypes.c_uint64
        self._lib.graphgen_compute_calls.restype = ctypes.c_uint64

    def ns(self) -> int:
        return int(self._lib.graphgen_compute_ns())

    def calls(self) -> int:
        return int(self._lib.graphgen_compute_calls())
