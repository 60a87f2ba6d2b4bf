"""Acceptance across engines: what llama.cpp, graphgen and the authors' loop feed a draft, measured."""
