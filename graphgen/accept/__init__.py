"""Acceptance across engines: what llama.cpp, graphgen and the authors' loop feed a draft, measured."""

import os

# as in graphgen.authors: local files only, no Hub look-ups (a speculators config names its
# verifier by its Hub id)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
