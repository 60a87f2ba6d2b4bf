"""Batch invariance: does a sequence's block come out the same whatever else is in its batch?

For each number of sequences and each block layout, every sequence's block is computed twice
in each engine: once in the batch with all the others, once alone, and the two are compared
node by node on the sequence's rows.

  plan      the cases, and the steps that compute each block batched and alone (two ways)
  engines   the steps run in graphgen and in llama.cpp b11739, one recorded graph at a time
  matching  which node is which in the two graphs, and which rows are one sequence's
  measure   a sequence batched against alone, bit for bit; graphs compared whole
  results   what was found: the table, the JSON, the exit code
  check     check_batch: the inputs checked, every case run in each engine, the engines compared
"""

from .check import DEFAULT_N_SEQ, ENGINES, FAIL_ON, THOROUGH_N_SEQ, check_batch, parse_n_seq
from .plan import CheckBatchError
from .results import Report

__all__ = ["DEFAULT_N_SEQ", "ENGINES", "FAIL_ON", "THOROUGH_N_SEQ", "CheckBatchError", "Report", "check_batch",
           "parse_n_seq"]
