"""llama.cpp's own flags for the commands that run a draft (dump, trace, xdiff, bench, draft):
`-m`, `-fa on|off|auto`, `-c`, `-b`, `-ub`, `-t`, `-np`, `-dev`, and (graphgen/cli/kvtypes.py)
`-ctk` / `-ctv`, with graphgen's longer spellings kept beside them.

Without --scenario, the scenario comes from the flags: every sequence (-np) injects a prompt of
--prompt rows (in chunks of the micro-batch, as llama_decode splits a batch), then --steps drafting
rounds: one block of --block tokens for all sequences in one batch, the block removed and as
many accepted rows injected, as the drafting loop does. Given a scenario file, or with
--scenario-from a dump (every dump records the whole scenario it ran), the flags that are set
override its fields.
"""

from __future__ import annotations

import argparse
import re

from ..errors import GraphgenError
from ..play.scenario import resolve_fa  # noqa: F401  (-fa auto, for the commands)

FA_CHOICES = ("on", "off", "auto")
DEFAULT_PROMPT = 6
DEFAULT_STEPS = 1
FIRST_TOKEN = 7  # a block starts with the last accepted token: any id the vocabulary has


def count_arg(lo: int):
    """An argparse type: a whole number of at least lo."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {v}")
        return v
    return parse


def add_model(p, help_text: str = "the draft GGUF") -> None:
    """The model, as a positional argument or llama.cpp's -m."""
    p.add_argument("model", nargs="?", default=None, help=f"{help_text} (or -m)")
    p.add_argument("-m", "--model", dest="model_flag", metavar="FILE", default=None,
                   help=f"{help_text}, as llama.cpp takes it (instead of the positional argument)")


def add_pair_flags(p, *, draft_help: str, prompt_help: str, file_help: str) -> None:
    """llama.cpp's speculative pair: -md the draft (with -m the target), -p the prompt's text (spelt
    --prompt-text beside graphgen's row-count --prompt), -f a file of it. `p` may be an argument group."""
    p.add_argument("-md", "--model-draft", dest="model_draft", metavar="FILE", default=None, help=draft_help)
    p.add_argument("-p", "--prompt-text", dest="prompt_text", action="append", metavar="TEXT", help=prompt_help)
    p.add_argument("-f", "--file", metavar="FILE", help=file_help)


def read_prompt_file(path) -> str:
    """A -f prompt file's text. A file that is not UTF-8 text (a model, an archive) is refused,
    naming the first offending byte, rather than read as prompts of replacement characters."""
    from pathlib import Path
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such prompt file")
    raw = path.read_bytes()
    nul = raw.find(b"\0")
    if nul >= 0:
        raise GraphgenError(f"{path}: not a text file (a NUL byte at offset {nul}); -f takes the prompt's text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GraphgenError(f"{path}: not UTF-8 text (byte {e.start}: 0x{raw[e.start]:02x}); -f takes the "
                            "prompt's text") from None


class _Removed(argparse.Action):
    """A flag llama.cpp has removed: refused with llama.cpp's own pointer to its replacement."""

    def __init__(self, option_strings, dest, use: str = "", **kw):
        self.use = use
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string}: the argument has been removed. use {self.use}")


LLAMA_DEFAULT_N_MAX = 3   # common_params_speculative_draft::n_max


def add_spec_flags(p) -> None:
    """llama.cpp's draft flags with its names and defaults: --spec-draft-n-max / -n-min / -p-min
    (also --draft-p-min, which llama.cpp keeps), and the removed --draft-max / --draft-min family,
    refused naming their replacements as llama.cpp does."""
    p.add_argument("--spec-draft-n-max", type=int, default=LLAMA_DEFAULT_N_MAX, metavar="N",
                   help="longest draft, clamped to what the trained block yields (default 3, llama.cpp's)")
    p.add_argument("--spec-draft-n-min", type=int, default=0, metavar="N",
                   help="shorter drafts are dropped (default 0)")
    p.add_argument("--spec-draft-p-min", "--draft-p-min", dest="spec_draft_p_min", type=float, default=0.0,
                   metavar="P", help="truncate the draft below this probability (DSpark: confidence), in [0, 1] "
                                     "(default 0)")
    p.add_argument("--draft", "--draft-n", "--draft-max", action=_Removed, use="--spec-draft-n-max",
                   help=argparse.SUPPRESS)
    p.add_argument("--draft-min", "--draft-n-min", action=_Removed, use="--spec-draft-n-min", help=argparse.SUPPRESS)


def check_spec_flags(args) -> None:
    """The loop's flags over llama.cpp's ranges, one check for every command that drafts: -n N
    (N >= 1, or -1: until the text ends), --spec-draft-n-max >= 0 (0 drafts nothing, which is the
    target alone: refused), --spec-draft-n-min >= 0 and at most n-max, --spec-draft-p-min in [0, 1],
    --seed in [0, 2^32-1] or -1 (llama.cpp's LLAMA_DEFAULT_SEED: a random seed, left as that value)."""
    if args.n_predict != -1 and args.n_predict < 1:
        raise GraphgenError(f"-n must be at least 1, or -1 (until the text ends), got {args.n_predict}")
    n_max = getattr(args, "spec_draft_n_max", None)
    n_min = getattr(args, "spec_draft_n_min", 0)
    p_min = getattr(args, "spec_draft_p_min", 0.0)
    if n_max is not None and n_max < 0:
        raise GraphgenError(f"--spec-draft-n-max must be >= 0, got {n_max}")
    if n_max == 0:
        raise GraphgenError("--spec-draft-n-max 0 drafts nothing: every round would be the target alone; give at "
                            "least 1 (default 3, llama.cpp's)")
    if n_min < 0:
        raise GraphgenError(f"--spec-draft-n-min must be >= 0, got {n_min}")
    if n_max is not None and n_min > n_max:
        raise GraphgenError(f"--spec-draft-n-min {n_min} is above --spec-draft-n-max {n_max}: every draft would be "
                            "dropped")
    if not 0.0 <= p_min <= 1.0:  # NaN fails too
        raise GraphgenError(f"--spec-draft-p-min must be in [0, 1], got {p_min}")
    seed = getattr(args, "seed", None)
    if seed is not None:
        from ..speculative.drafters import LLAMA_DEFAULT_SEED
        if seed == -1:
            args.seed = seed = LLAMA_DEFAULT_SEED  # llama.cpp reads -1 as 0xFFFFFFFF: draw a seed
        if not 0 <= seed <= 0xFFFFFFFF:
            raise GraphgenError(f"--seed must be in [0, 2^32-1], or -1 for a random one; got {seed}")


def model_path(args) -> str:
    given = [m for m in (args.model, getattr(args, "model_flag", None)) if m is not None]
    if not given:
        raise GraphgenError("no model: give the draft GGUF as an argument or with -m FILE")
    if len(given) == 2 and given[0] != given[1]:
        raise GraphgenError(f"two models given ({given[0]} and -m {given[1]}): give one")
    args.model = given[0]
    return given[0]


def add_device(p, default: str | None = "cpu", many: bool = False) -> None:
    """-dev with llama.cpp's device names (CPU, Vulkan0, CUDA0, Metal, RPC[host:port]), one
    option with graphgen's --backend spelling (cpu, vulkan:0, cuda:0, metal, rpc://host:port, auto)."""
    if many:
        p.add_argument("-dev", "--device", "--backends", dest="backends", metavar="DEV,DEV", default=default,
                       help="the two devices to compare, llama.cpp's names (CPU,Vulkan0; CUDA0; RPC[host:port]) "
                            "or graphgen's (cpu,vulkan:0; rpc://host:port)"
                            + (f" (default: {default})" if default else " (required)"))
    else:
        p.add_argument("-dev", "--device", "--backend", dest="backend", metavar="DEV", default=default,
                       help="where to compute: llama.cpp's device names (CPU, Vulkan0, CUDA0, Metal, "
                            "RPC[host:port]) or graphgen's (cpu, vulkan[:N], cuda[:N], metal, rpc://HOST:PORT, "
                            f"auto) (default: {default})")


_DEV = [(re.compile(r"(?i)(cpu|none)"), lambda m: "cpu"),
        (re.compile(r"(?i)vulkan(\d+)"), lambda m: f"vulkan:{m.group(1)}"),
        (re.compile(r"(?i)cuda(\d+)"), lambda m: f"cuda:{m.group(1)}"),
        (re.compile(r"(?i)(metal|mtl\d*)"), lambda m: "metal"),
        (re.compile(r"(?i)rpc\[(.+)\]"), lambda m: f"rpc://{m.group(1)}")]


def backend_of(dev: str) -> str:
    """graphgen's backend spec for a -dev value; graphgen's own specs pass through."""
    dev = dev.strip()
    for pat, to in _DEV:
        m = pat.fullmatch(dev)
        if m:
            return to(m)
    return dev


def add_context_flags(p, *, scenario: bool = True, threads_default: str = "the scenario's, else 1",
                      parallel: bool = True, default_prompt: int = DEFAULT_PROMPT, fa_default: str = "off",
                      ctx_help: str | None = None) -> None:
    """-fa, -c, -b, -ub, -t and (with `parallel`) -np; with `scenario`, also --scenario, --prompt,
    --block, --steps and --seed for a run without a scenario file. Unset flags are None: the
    scenario file's value (or the built scenario's default) stands. `fa_default` is what an unset
    -fa means without a scenario; `ctx_help`, with a -c of 0 allowed, says what -c defaults to."""
    src = "the scenario's" if scenario else None
    p.add_argument("-fa", "--flash-attn", dest="flash_attn", choices=FA_CHOICES, default=None,
                   help="flash attention; auto turns it on where the device has the kernels, as llama.cpp "
                        f"(default: {src + ', else ' + fa_default if src else fa_default})")
    if ctx_help is not None:
        p.add_argument("-c", "--ctx-size", "--n-ctx", dest="n_ctx", type=count_arg(0), default=None, metavar="N",
                       help=f"KV cache size ({ctx_help})")
    else:
        p.add_argument("-c", "--ctx-size", "--n-ctx", dest="n_ctx", type=count_arg(1), default=None, metavar="N",
                       help=f"KV cache size (default: {src + ', else what the run needs, at least 256' if src else 'what the run needs'})")
    p.add_argument("-b", "--batch-size", dest="n_batch", type=count_arg(1), default=None, metavar="N",
                   help="logical batch; the micro-batch is capped at it, as llama.cpp caps -ub at -b "
                        "(default: the micro-batch)")
    p.add_argument("-ub", "--ubatch-size", "--n-ubatch", dest="n_ubatch", type=count_arg(1), default=None, metavar="N",
                   help=f"micro-batch: the most tokens one graph takes (default: {src + ', else ' if src else ''}"
                        "64, or what one step needs)")
    p.add_argument("-t", "--threads", dest="threads", type=count_arg(1), default=None, metavar="N",
                   help=f"CPU threads (default: {threads_default})")
    if parallel:
        p.add_argument("-np", "--parallel", dest="n_parallel", type=count_arg(1), default=None, metavar="N",
                       help=f"sequences drafted together (default: {src + ', else 1' if src else '1'})")
    if scenario:
        which = p.add_mutually_exclusive_group()
        which.add_argument("--scenario", default=None, metavar="FILE",
                           help="what to run, as JSON (default: built from --prompt, --block, --steps and -np)")
        which.add_argument("--scenario-from", dest="scenario", action=_FromDump, metavar="DUMP",
                           help="rerun the scenario a dump recorded: a dump folder or one of its files; the "
                                "flags that are set override it, as with --scenario (default: none)")
        p.add_argument("--prompt", dest="n_prompt", type=count_arg(1), default=None, metavar="N",
                       help=f"without --scenario: N injected prompt rows per sequence, a count (not llama.cpp's -p "
                            f"prompt text) (default {default_prompt})")
        p.add_argument("--block", dest="block", type=count_arg(1), default=None, metavar="N",
                       help="without --scenario: block size (default: the draft's dflash.block_size, else 4)")
        p.add_argument("--steps", dest="steps", type=count_arg(1), default=None, metavar="N",
                       help=f"without --scenario: drafting rounds (default {DEFAULT_STEPS})")
        p.add_argument("--seed", dest="scenario_seed", type=count_arg(0), default=None, metavar="N",
                       help="seed of the injected features (default: the scenario's, else 1)")


class _FromDump(argparse.Action):
    """--scenario-from: a dump reads as the scenario it recorded (graphgen.play.scenario.load_scenario),
    so it fills --scenario's place, and the flag's name is kept for messages."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.scenario = values
        namespace.scenario_flag = option_string


def scenario_flag(args) -> str:
    """How the run's scenario was given, for messages: --scenario or --scenario-from."""
    return getattr(args, "scenario_flag", None) or "--scenario"


def _draft_shape(model: str) -> tuple[int, int]:
    """(block size, mask token id) of a draft, read from its GGUF keys only."""
    from pathlib import Path

    from ..runtime.model import open_reader, read_hparams
    hp = read_hparams(open_reader(Path(model)), model)[0]
    return hp.block_size or 4, max(hp.mask_token_id, 0)


def build_scenario_doc(n_prompt: int, block: int, steps: int, n_seq: int, mask_token: int,
                       n_ubatch: int | None, n_ctx: int | None, seed: int) -> dict:
    """The scenario the flags describe (see the module's docstring)."""
    ub = n_ubatch or max(64, n_seq * block)
    steps_out: list[dict] = []
    for s in range(n_seq):
        for p0 in range(0, n_prompt, ub):
            steps_out.append({"inject": {"n_tokens": min(ub, n_prompt - p0), "pos0": p0, "seq": s}})
    pos = n_prompt
    for r in range(steps):
        steps_out.append({"block": {"seqs": [{"seq": s, "pos0": pos, "tokens": [FIRST_TOKEN + s] + [mask_token] * (block - 1)}
                                             for s in range(n_seq)]}})
        if r + 1 < steps:
            # the verifier accepted the whole block: its rows replace the block's cells
            steps_out.append({"seq_rm": {"seq": -1, "p0": pos, "p1": -1}})
            steps_out += [{"inject": {"n_tokens": block, "pos0": pos, "seq": s}} for s in range(n_seq)]
            pos += block
    need = n_seq * (pos + block)
    ctx = n_ctx or max(256, -(-need // 256) * 256)
    return {"n_ctx": ctx, "n_ubatch": ub, "seed": seed, "n_seq": n_seq, "steps": steps_out}


def scenario_from_args(args, model: str):
    """The scenario a command runs: the file's, or the one the flags build, with the flags that
    are set laid over it. Errors name the flag or the scenario field."""
    from ..play.scenario import load_scenario, parse_scenario, recorded_scenario_doc
    n_parallel = getattr(args, "n_parallel", None)
    if args.scenario:
        given = f"{scenario_flag(args)} {args.scenario}"
        for flag, v in (("--prompt", args.n_prompt), ("--block", args.block), ("--steps", args.steps)):
            if v is not None:
                raise GraphgenError(f"{flag} builds a scenario; it cannot change {given}")
        if scenario_flag(args) == "--scenario-from":
            doc, where = recorded_scenario_doc(args.scenario)  # a plain scenario file is not a dump
            doc = parse_scenario(doc, where=where).to_dict()
        else:
            doc = load_scenario(args.scenario).to_dict()
            where = args.scenario
    else:
        block, mask = _draft_shape(model)
        doc = build_scenario_doc(args.n_prompt or DEFAULT_PROMPT, args.block or block, args.steps or DEFAULT_STEPS,
                                 n_parallel or 1, mask, args.n_ubatch if args.n_batch is None else
                                 min(args.n_batch, args.n_ubatch or args.n_batch), args.n_ctx,
                                 1 if args.scenario_seed is None else args.scenario_seed)
        where = "the scenario built from the flags"
    over = {"n_ctx": args.n_ctx, "n_ubatch": args.n_ubatch, "n_threads": args.threads,
            "n_seq": n_parallel, "seed": args.scenario_seed}
    for k, v in over.items():
        if v is not None:
            doc[k] = v
    if args.n_batch is not None:
        # llama.cpp caps the micro-batch at the logical batch; a graph holds one micro-batch
        doc["n_batch"] = args.n_batch
        doc["n_ubatch"] = min(args.n_batch, doc.get("n_ubatch", 64))
    if args.flash_attn is not None:
        doc["flash_attn"] = args.flash_attn
    try:
        sc = parse_scenario(doc, where=where)
    except ValueError as e:
        raise GraphgenError(_flag_names(str(e))) from None
    if args.scenario:
        # a recorded run's relative features and target paths are the scenario's folder's, not the cwd's
        from ..play.scenario import scenario_folder
        sc.features_base = scenario_folder(args.scenario)
    return sc


_FIELD_FLAG = {"n_ctx": "-c", "n_ubatch": "-ub", "n_batch": "-b", "n_seq": "-np", "n_threads": "-t",
               "flash_attn": "-fa"}


def _flag_names(msg: str) -> str:
    """A scenario error about a field a flag sets also names the flag."""
    for field, flag in _FIELD_FLAG.items():
        if f"'{field}'" in msg or f" {field} " in msg:
            return f"{msg} ({flag} sets {field})"
    return msg
