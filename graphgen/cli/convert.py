"""`graphgen convert`: a HuggingFace draft checkpoint to GGUF with llama.cpp's own converter."""

from __future__ import annotations

from pathlib import Path


def _cmd_convert(args) -> int:
    # graphgen.authors needs nothing beyond graphgen's own dependencies to import; convert() itself
    # refuses in one line, naming the graphgen[torch] extra, when torch and the rest are missing
    from ..authors.convert import convert
    from ..errors import GraphgenError

    res = convert(args.hf_dir, args.out, target_dir=args.target, target_gguf=args.target_gguf,
                  outtype=args.outtype, force=args.force)
    try:
        from gguf import GGUFReader
        n_tensors = str(len(GGUFReader(res.out).tensors))
    except (OSError, ValueError, KeyError, GraphgenError):
        n_tensors = "?"
    print(f"converted {args.hf_dir} -> {args.out} (llama.cpp converter {res.commit}, {n_tensors} tensors, "
          f"{res.seconds:.1f} s)")
    if res.target_out is not None:
        print(f"converted its target -> {res.target_out} ({res.target_arch})")
    beside = res.beside_line()
    if beside is not None:
        print(beside)
    return 0


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert a HuggingFace draft (z-lab, speculators) to GGUF with llama.cpp's "
                                       "own converter (needs graphgen[torch])")
    p.add_argument("hf_dir", metavar="HF_DIR", type=Path, help="the draft's folder (config.json, model.safetensors)")
    p.add_argument("out", metavar="OUT.gguf", type=Path, help="GGUF file to write (replaced only when complete)")
    p.add_argument("--target", metavar="DIR", type=Path, default=None,
                   help="the target model's folder (config.json, tokenizer, embeddings); default HF_DIR/target")
    p.add_argument("--target-gguf", metavar="TARGET.gguf", type=Path, default=None,
                   help="also convert the target's folder with the same converter, into this GGUF: the target a "
                        "draft without embeddings or lm head runs beside (-m TARGET.gguf -md OUT.gguf)")
    p.add_argument("--outtype", choices=("f32", "f16", "bf16", "q8_0"), default="f32",
                   help="weight type the converter writes, for the target too (default f32)")
    p.add_argument("--force", action="store_true", help="replace OUT even when it is not a GGUF file")
    p.set_defaults(fn=_cmd_convert)
