"""The KV cache types a draft's context takes, shared by the scenario format, graphgen's runtime
and the reference runner (which must not import graphgen's ggml)."""

# b11739's cache types for these drafts, by ggml type id; the quantized ones (blocks of 32 values)
# need flash attention for V and get Hadamard rotations where the head size allows
KV_TYPE_IDS = {"f32": 0, "f16": 1, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "iq4_nl": 20}
KV_TYPES = tuple(KV_TYPE_IDS)
KV_QUANTIZED = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
