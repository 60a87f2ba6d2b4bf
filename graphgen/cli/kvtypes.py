"""-ctk / -ctv (llama.cpp's spelling; also --type-k / --type-v) and --type-kv: the KV cache types."""

from __future__ import annotations

from ..cachetypes import KV_QUANTIZED, KV_TYPES


# how each command turns flash attention on: a flag, or the scenario's field
FA_FLAG = "-fa on"
FA_SCENARIO = '"flash_attn": "on" in the scenario'


def add_kv_type_flags(p, default: str | None = None, fa_hint: str = FA_FLAG) -> None:
    """--type-kv sets both caches; --type-k and --type-v set one each and win over it.
    default None: the scenario's types stand unless a flag is given. fa_hint: how this command
    turns flash attention on, for the help text."""
    both = f" (default {default})" if default else " (default: the scenario's)"
    p.add_argument("--type-kv", choices=KV_TYPES, default=default, metavar="TYPE",
                   help=f"K and V cache type: {', '.join(KV_TYPES)}{both}")
    p.add_argument("-ctk", "--cache-type-k", "--type-k", dest="type_k", choices=KV_TYPES, default=None,
                   metavar="TYPE", help=f"K cache type (wins over --type-kv){both}")
    p.add_argument("-ctv", "--cache-type-v", "--type-v", dest="type_v", choices=KV_TYPES, default=None,
                   metavar="TYPE", help=f"V cache type (wins over --type-kv); a quantized V needs flash attention "
                                        f"({fa_hint}){both}")


def kv_types(args, type_k: str, type_v: str, flash_attn: bool, fa_hint: str = FA_FLAG) -> tuple[str, str]:
    """The flags laid over (type_k, type_v), with llama.cpp's flash-attention rule for V checked
    here so the command refuses in one line before loading anything."""
    if args.type_kv is not None:
        type_k = type_v = args.type_kv
    type_k = args.type_k or type_k
    type_v = args.type_v or type_v
    if type_v in KV_QUANTIZED and not flash_attn:
        raise ValueError(f"--type-v {type_v}: a quantized V cache requires flash attention ({fa_hint})")
    return type_k, type_v


def apply_to_scenario(args, sc, fa_hint: str = f"{FA_FLAG} or {FA_SCENARIO}") -> bool:
    """Lay the flags over a scenario; True when they changed it."""
    k, v = kv_types(args, sc.type_k, sc.type_v, sc.flash_attn, fa_hint)
    changed = (k, v) != (sc.type_k, sc.type_v)
    sc.type_k, sc.type_v = k, v
    return changed
