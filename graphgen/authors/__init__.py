"""The draft authors' own PyTorch models beside llama.cpp's graphs.

graphgen proves its graphs identical to llama.cpp's; this package checks both against what the
drafts' authors trained: their checkpoint formats (`checkpoint`), llama.cpp's own converter
(`convert`), their forward recorded under llama.cpp's node names (`forward`, `tensormap`) and the
comparison by relative error (`compare`). It needs the `graphgen[torch]` extra; nothing else in
graphgen imports it.
"""

from __future__ import annotations

import os

from ..errors import GraphgenError

# graphgen reads checkpoints and targets from local folders only; a speculators config names its
# verifier by its Hub id, which speculators would otherwise look up (retrying for half a minute
# offline). Set before transformers and huggingface_hub are imported; HF_HUB_OFFLINE=0 overrides.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXTRA_HINT = "pip install 'graphgen[torch]' (and speculators==0.9.0 with --no-deps; tools/setup.sh torch does both)"


class AuthorsError(GraphgenError, ValueError):
    """A checkpoint, config or comparison the authors' side cannot take; the message names the
    file and key."""


# GRAPHGEN_HIDE_TORCH=1: require_torch fails as if the extra were missing, so that where it is
# installed (CI) what must skip without it can still be seen skipping
HIDE_ENV = "GRAPHGEN_HIDE_TORCH"


def torch_hidden() -> bool:
    return os.environ.get(HIDE_ENV) == "1"


def require_torch() -> None:
    """Import what the authors' models need, or fail in one line naming the extra."""
    if torch_hidden():
        raise AuthorsError(f"the authors' models need the graphgen[torch] extra: hidden by {HIDE_ENV}=1; "
                           + EXTRA_HINT)
    missing = []
    for mod in ("torch", "transformers", "safetensors", "dflash.model",
                "speculators.models.dspark.core", "speculators.models.dflash2.core"):
        try:
            __import__(mod)
        except ImportError as e:
            missing.append(f"{mod} ({e.name or e})")
        except RuntimeError as e:  # a torchvision built for another torch breaks transformers' imports
            raise AuthorsError(f"importing {mod} failed: {' '.join(str(e).split())[:200]}; a torchvision "
                               "built for another torch is installed? (pip uninstall torchvision)") from e
    if missing:
        raise AuthorsError(f"the authors' models need the graphgen[torch] extra: missing {', '.join(missing)}; "
                           + EXTRA_HINT)


def quiet_transformers() -> None:
    """transformers' (and loguru's) logging and progress bars off: graphgen says what it loads and writes."""
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        from loguru import logger
        logger.remove()
    except ImportError:
        pass
