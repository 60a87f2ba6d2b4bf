"""What the graph builders' tests share: a reference case's scenario run in graphgen, each graph
beside b11739's committed dump of it, and a node's structure as the diff compares it."""

from conftest import REF_DIR
from make_references import build_model

from graphgen.dump.format import dump_files, load_dump
from graphgen.play.engine import run_scenario
from graphgen.play.scenario import load_scenario


def structure(nodes):
    return [(n.name, n.op, n.type, n.ne, n.src, n.view_src, n.op_params) for n in nodes]


def built(case, tmp_path, models_dir):
    """{file name: (graphgen's nodes, b11739's)} for a reference case's scenario."""
    case_dir = REF_DIR / case
    run_scenario(build_model(case_dir, models_dir), load_scenario(case_dir / "scenario.json"), tmp_path)
    return {p.name: (load_dump(p).nodes, load_dump(case_dir / p.name).nodes) for p in dump_files(tmp_path)}


def block(case, tmp_path, models_dir):
    """The case's block graph: (graphgen's nodes, b11739's)."""
    [pair] = [v for k, v in built(case, tmp_path, models_dir).items() if k.endswith("-block.json")]
    return pair
