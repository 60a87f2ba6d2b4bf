"""Where two engines' loops part (graphgen/accept/compare.py first_divergence, and attribute's
first_parting over it): each kind of parting on hand-made rounds, the verified positions only where
asked, and runs that agree."""

from graphgen.accept.attribute import first_parting
from graphgen.accept.compare import EngineRun, first_divergence


def _round(pos0, id_last, draft, n_acc, bonus):
    return {"pos0": pos0, "id_last": id_last, "draft": list(draft), "n_drafted": len(draft),
            "n_accepted": n_acc, "bonus": bonus}


def _run(engine, rounds):
    return EngineRun(engine, 3, ["p"], [rounds])


BASE = [_round(5, 10, [1, 2, 3], 3, 4), _round(9, 4, [6, 7, 8], 1, 9), _round(11, 9, [1, 1, 1], 0, 2)]


def _with(k, **changes):
    rounds = [dict(r) for r in BASE]
    rounds[k].update(changes)
    return rounds


def test_runs_that_agree_do_not_part():
    assert first_divergence(_run("a", BASE), _run("b", [dict(r) for r in BASE])) is None
    assert first_parting(_run("a", BASE), _run("b", BASE)) is None


def test_each_kind_of_parting_is_named_where_it_happens():
    a = _run("llama.cpp", BASE)
    cases = [
        (_with(1, n_accepted=2), ("accepted", 1, 2), "llama.cpp accepted 1, graphgen 2"),
        (_with(1, bonus=5), ("target", 1, 2), "the target's token is 9 in llama.cpp, 5 in graphgen"),
        (_with(1, draft=[6, 0, 8]), ("draft", 1, 2), "llama.cpp drafted token 7, graphgen token 0"),
        (_with(2, id_last=3), ("anchor", 2, None), "the round starts from token 9 at 11 in llama.cpp, 3 at 11"),
        (_with(2, pos0=12), ("anchor", 2, None), "from token 9 at 11 in llama.cpp, 9 at 12 in graphgen"),
        (BASE[:2], ("round", 2, None), "only llama.cpp ran this round"),
        (_with(0, draft=[1, 2]), ("draft", 0, 3), "llama.cpp drafted token 3, graphgen nothing"),
    ]
    for rounds, (kind, rnd, pos), text in cases:
        d = first_divergence(a, _run("graphgen", rounds))
        assert (d.kind, d.round, d.position) == (kind, rnd, pos), (kind, d)
        assert text in d.what, d.what
        assert d.describe().startswith(f"prompt 0, round {rnd}")


def test_the_attribution_compares_drafted_tokens_only_where_both_targets_verified():
    a = _run("llama.cpp", BASE)
    # round 1 accepted one token: its third drafted token was never verified, nor the second's
    # successor; a difference there is no parting for the attribution, but is one for accept
    late = _run("authors", _with(1, draft=[6, 7, 0]))
    assert first_parting(a, late) is None
    assert first_divergence(a, late).kind == "draft"
    # a block shrunk to what -n leaves is compared on its common length
    short = _run("authors", _with(1, draft=[6, 7], n_drafted=2))
    assert first_parting(a, short) is None
    # a difference at a verified position still parts them, and so does the count
    assert first_parting(a, _run("authors", _with(1, draft=[6, 0, 8]))).kind == "draft"
    assert first_parting(a, _run("authors", _with(1, n_accepted=0))).kind == "accepted"


def test_rounds_recorded_as_counts_alone_are_compared_by_their_counts():
    doc = {"n_max": 3, "prompts": ["p"], "tokens": [[]], "text": [""], "seconds": 0.0}
    a = {**doc, "engine": "x", "rounds": [[{"n_drafted": 3, "n_accepted": 1}]]}
    b = {**doc, "engine": "y", "rounds": [[{"n_drafted": 2, "n_accepted": 1}]]}
    d = first_divergence(a, b)   # documents, as accept --json writes them
    assert (d.kind, d.position) == ("draft", 3) and "x drafted 3 tokens, y 2" in d.what
