"""KV cache types for the random live configurations, drawn within llama.cpp's rules: a quantized
V needs flash attention, a quantized head holds whole blocks of 32, and a K-only cache (the DSpark
backbones read V from K) takes a quantized K with flash attention only."""

from graphgen.cachetypes import KV_QUANTIZED


def draw_kv_types(rng, flash_attn: str, head: int, k_only: bool = False, quantized_only: bool = False) -> dict:
    fa = flash_attn == "on"
    k_ok = head % 32 == 0 and (fa or not k_only)
    v_ok = head % 32 == 0 and fa
    r = 1.0 if quantized_only else rng.random()
    if r < 0.45 or not k_ok:
        plain = "f16" if r < 0.45 and rng.random() < 0.7 else "f32"
        return {"type_kv": plain}
    type_k = str(rng.choice(KV_QUANTIZED))
    if not v_ok:
        return {"type_k": type_k, "type_v": str(rng.choice(["f16", "f32"]))}
    type_v = type_k if rng.random() < 0.5 else str(rng.choice(KV_QUANTIZED))
    return {"type_k": type_k, "type_v": type_v}
