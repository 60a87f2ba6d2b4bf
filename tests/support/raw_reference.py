"""Run batches in llama.cpp b11739 that a scenario file cannot hold (a sequence twice in one
block batch): the steps go straight into the reference runner's run_child, in a child process.

    python tests/support/raw_reference.py MODEL STEPS.json OUT     (exit 0: every step ran; 4: refused)

`run_raw(model, steps, tmp_path, n_seq)` returns (ran, llama.cpp's error text). Steps are the
scenario's inject / seq_rm steps and {"block": {"seqs": [...]}} with any sequences.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_raw(model, steps: list, work: Path, n_seq: int = 1) -> tuple[bool, str]:
    from graphgen.reference.protocol import error_text
    from graphgen.reference.runner import ENV_ERROR_LOG
    work.mkdir(parents=True, exist_ok=True)
    doc = work / "steps.json"
    doc.write_text(json.dumps({"n_seq": n_seq, "steps": steps}))
    log = work / "errors.log"
    log.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               **{ENV_ERROR_LOG: str(log)})
    proc = subprocess.run([sys.executable, __file__, str(model), str(doc), str(work / "out")], capture_output=True,
                          text=True, errors="replace", env=env)
    if proc.returncode == 0:
        return True, ""
    return False, error_text(log, proc.stderr)[1]


def main(argv) -> int:
    from graphgen.reference.runner import ReferenceFailed, run_child
    from graphgen.play.scenario import Scenario, SeqBlock, Step
    model, doc, out = Path(argv[0]), json.loads(Path(argv[1]).read_text()), Path(argv[2])
    sc = Scenario(n_ctx=256, n_ubatch=16, n_seq=doc.get("n_seq", 1))
    for i, step in enumerate(doc["steps"]):
        (kind, body), = step.items()
        if kind in ("inject", "encode"):
            sc.steps.append(Step("inject" if kind == "inject" else "encoder", i, seq=body.get("seq", 0),
                                 n_tokens=body["n_tokens"], pos0=body["pos0"]))
        elif kind == "seq_rm":
            sc.steps.append(Step("seq_rm", i, seq=body["seq"], pos0=body["p0"], p1=body["p1"]))
        else:
            sc.steps.append(Step("block", i, blocks=[SeqBlock(e["seq"], e["tokens"], e["pos0"])
                                                     for e in body["seqs"]]))
    try:
        run_child(model, sc, out, 0)
    except ReferenceFailed as e:
        print(f"graphgen: error: {e}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
