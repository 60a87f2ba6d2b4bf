"""The comparing side: what a run leaves and how two runs are compared.

`dump` (the graphgen-dump/1 format) and `record` (reading a computed graph's nodes) hold what an
engine leaves; `importers` reads llama.cpp's own debug outputs as dumps; `diff` pairs two sides'
graphs and compares them node by node, `xdiff` one scenario on two backends; `printed`, `probe`,
`opparams`, `nodefilter` and `layers` are the pieces a report is made of.
"""
