"""Independent references for the seed-only DSpark graphs (DeepSeek-V4.1, Mistral Large 4 and
the RNN joint head), written from the seed commit's dspark.cpp and the upstream helpers it calls.

Nothing here imports graphgen: the drafts are read with the `gguf` package, the forward pass is
float64 numpy (forward.py), and the node sequence the seed's builders emit is traced with a small
symbolic stand-in for ggml (opseq.py).
"""
