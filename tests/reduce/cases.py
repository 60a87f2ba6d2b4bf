"""The scenario the reducer's tests start from: three sequences, each injected, then one block
step holding all three (30 tokens, 256 cells)."""

THREE_SEQUENCES = {"n_ctx": 256, "n_ubatch": 64, "flash_attn": "on", "type_kv": "f16", "seed": 1, "n_seq": 3,
                   "steps": [{"inject": {"n_tokens": 6, "pos0": 0, "seq": 0}},
                             {"inject": {"n_tokens": 5, "pos0": 0, "seq": 1}},
                             {"inject": {"n_tokens": 7, "pos0": 0, "seq": 2}},
                             {"block": {"seqs": [{"seq": 0, "tokens": [7, 255, 255, 255], "pos0": 6},
                                                 {"seq": 1, "tokens": [9, 255, 255, 255], "pos0": 5},
                                                 {"seq": 2, "tokens": [11, 255, 255, 255], "pos0": 7}]}}]}
