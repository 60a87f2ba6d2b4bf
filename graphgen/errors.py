"""Exceptions graphgen raises for bad input; each message names the key, tensor or shape."""


class GraphgenError(Exception):
    """Base class of graphgen's input errors."""


class GGUFModelError(GraphgenError, ValueError):
    """A GGUF that graphgen (or upstream's loader) would not accept."""


class BatchError(GraphgenError, ValueError):
    """A batch whose size, positions or sequences cannot be run."""


class KVCacheFullError(GraphgenError, RuntimeError):
    """The KV cache has no room for a batch; the cache is left as it was."""


class ContextError(GraphgenError, ValueError):
    """Context settings llama.cpp would not create a context with (or abort on)."""


class PairError(GraphgenError, ValueError):
    """A target and a draft that cannot run together: one problem a line, each naming both files."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class AuthorsLoopError(GraphgenError, ValueError):
    """A target, draft folder or prompt the authors' loop cannot take (accept/authors_loop.py,
    accept/speculators_loop.py); the message names it."""
