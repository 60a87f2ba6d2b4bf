"""`graphgen reduce`: a failure shrunk to the smallest draft and scenario that still show it.

A failure is a case (a draft, as settings or kept whole: a GGUF, or an authors' checkpoint; and
a scenario) and what goes wrong when it runs: graphgen against a llama.cpp build, one backend
against another, or an authors' checkpoint in `graphgen check`.
What goes wrong is summed up as a signature (the first parting node's graph, kind and op; a side's
refusal; a side's crash), and the reducer keeps a smaller case only when it fails with the same
signature, as Polygraphy's `debug reduce` and torch._dynamo's minifier do for their graphs.

    case     Case: the draft's settings and the scenario, their sizes, the smaller cases one edit away
    failure  running a case in fresh processes, and the signature of what went wrong
    shrink   the greedy loop: every smaller case, kept while the failure persists, to a fixpoint
    repro    the folder a llama.cpp issue can carry, written whole or not at all, rerun once
"""

from .case import Case
from .failure import Failure, Mode, run_case
from .repro import write_repro
from .shrink import reduce

__all__ = ["Case", "Failure", "Mode", "reduce", "run_case", "write_repro"]
