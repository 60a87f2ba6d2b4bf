"""The bench runs both engines in one run and reports ratios; the table is generated, not typed."""

import subprocess
import sys

import pytest

from graphgen.bench import multi_seq_scenario, run_bench
from graphgen.play.scenario import default_scenario
from graphgen.synth import make_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    make_model(p, "dflash", seed=1)
    return p


def test_bench_graphgen_only(tiny):
    res = run_bench(tiny, default_scenario(), repeat=3, engines=("graphgen",), warmup=1)
    labels = [st.label for st in res.steps]
    assert labels == ["inject 6", "block 4"]
    for st in res.steps:
        assert len(st.times["graphgen"]) == 3 and all(t > 0 for t in st.times["graphgen"])
    assert res.build_ms["block 4"] > 0 and res.compute_buffer_mib["graphgen"] > 0


def test_multi_seq_scenario():
    sc = multi_seq_scenario(default_scenario(), 4)
    assert sc.n_seq == 4
    assert [s.kind for s in sc.steps] == ["inject"] * 4 + ["block"]
    assert len(sc.steps[-1].blocks) == 4 and {b.seq for b in sc.steps[-1].blocks} == {0, 1, 2, 3}


@pytest.mark.reference
def test_bench_cli_against_llama_cpp(tiny, tmp_path):
    md = tmp_path / "B.md"
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "bench", str(tiny), "--repeat", "3", "--prompt", "6",
                        "--n-seq", "1,4", "--markdown", str(md)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "ratio" in p.stdout and "llama.cpp" in p.stdout
    text = md.read_text()
    assert "| block 4 |" in text and "| block 16 x4seq |" in text and "compute buffer MiB" in text
    assert "compute / overhead ms" in text and "host overhead by phase" in text


def test_step_time_splits_into_compute_and_phases(tiny):
    """graphgen's side: compute and the overhead phases are measured inside the step's wall time."""
    from graphgen.bench import PHASES
    res = run_bench(tiny, default_scenario(), repeat=4, engines=("graphgen",), warmup=1)
    for st in res.steps:
        for k, wall in enumerate(st.times["graphgen"]):
            compute = st.compute["graphgen"][k]
            phases = sum(st.phases[ph][k] for ph in PHASES)
            assert 0 < compute < wall and 0 < phases < wall
            assert compute + phases <= wall
        assert all(st.phase_median(ph) > 0 for ph in PHASES)
        assert 0 < st.overhead_median("graphgen") < st.median("graphgen")


def test_context_scenario_fills_the_cache_to_n_kv(tiny):
    from graphgen.bench import context_scenario
    from graphgen.runtime.session import Session
    base = default_scenario()
    for n_kv in (256, 768):
        sc = context_scenario(base, n_kv, chunk=100)
        injects = [st for st in sc.steps if st.kind == "inject"]
        assert all(st.n_tokens <= 100 for st in injects)
        with Session(tiny, n_ctx=sc.n_ctx, n_ubatch=sc.n_ubatch) as s:
            for st in sc.steps:
                if st.kind == "inject":
                    s.inject(sc.features(st, s.hparams.n_embd_inp_enc), st.pos0, st.seq)
                else:
                    b = st.blocks[0]
                    s.block(b.tokens, b.pos0, b.seq)
            assert s.caches["base"].get_n_kv() == n_kv
            assert s.caches["base"].used() == n_kv - 1


@pytest.mark.reference
def test_llama_cpp_compute_is_timed_inside_its_steps(tiny):
    res = run_bench(tiny, default_scenario(), repeat=3, engines=("llama.cpp",), warmup=1)
    for st in res.steps:
        for wall, compute in zip(st.times["llama.cpp"], st.compute["llama.cpp"]):
            assert 0 < compute < wall


@pytest.mark.reference
def test_bench_json_on_stdout_and_scale_plot(tiny, tmp_path):
    import json
    svg = tmp_path / "scale.svg"
    md = tmp_path / "B.md"
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "bench", str(tiny), "--repeat", "2", "--prompt", "6",
                        "--n-seq", "1,2", "--n-kv", "256,512", "--json", "--markdown", str(md), "--svg", str(svg)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [r.get("n_seq", r.get("n_kv")) for r in doc["runs"]] == [1, 2, 256, 512]
    block = [s for s in doc["runs"][3]["steps"] if s["step"].startswith("block")][0]
    assert set(block["overhead_median_s"]) == {"graphgen", "llama.cpp"}
    text = md.read_text()
    assert "Block step against context length" in text and "| 512 |" in text and "| 2 |" in text
    assert svg.read_text().count("<polyline") == 8  # 2 panels x 2 engines x (step, overhead)


def test_bench_refuses_prompt_with_scenario(tiny, tmp_path):
    scen = tmp_path / "s.json"
    scen.write_text('{"steps": [{"inject": {"n_tokens": 2, "pos0": 0}}]}')
    p = subprocess.run([sys.executable, "-m", "graphgen.cli", "bench", str(tiny), "--scenario", str(scen),
                        "--prompt", "8"], capture_output=True, text=True)
    assert p.returncode == 2 and "--prompt" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_engine_flag_as_every_command_spells_it(capsys):
    """--engine, as dump, draft and check-batch spell it, takes a comma list (or both); the old
    --engines still works and says, in one line, that it is deprecated."""
    from graphgen.cli import build_parser
    parse = build_parser().parse_args
    assert parse(["bench", "m.gguf", "--engine", "graphgen,llama.cpp"]).engines == ("graphgen", "llama.cpp")
    assert parse(["bench", "m.gguf", "--engine", "llama.cpp"]).engines == ("llama.cpp",)
    assert parse(["bench", "m.gguf", "--engine", "both"]).engines == ("graphgen", "llama.cpp")
    assert parse(["bench", "m.gguf"]).engines == ("graphgen", "llama.cpp")
    assert capsys.readouterr().err == ""
    assert parse(["bench", "m.gguf", "--engines", "graphgen"]).engines == ("graphgen",)
    assert capsys.readouterr().err == "graphgen: --engines is deprecated: use --engine (the same comma list)\n"
    text = build_parser()._subparsers._group_actions[0].choices["bench"].format_help()
    assert "--engine E[,E]" in text and "--engines" not in text
