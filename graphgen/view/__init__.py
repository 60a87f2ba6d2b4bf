"""Seeing graphs: networkx conversion, DOT/SVG, a self-contained HTML viewer, Model Explorer
export, eval-callback style tracing and importers of llama.cpp's debug outputs."""
