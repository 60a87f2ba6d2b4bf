"""One word for one thing across the commands: llama.cpp's flags mean what llama.cpp's mean, and
the diff's report and its viewer name a node's status alike."""

import argparse

from graphgen.cli import build_parser


def _commands():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_no_command_takes_p_as_a_count_of_rows():
    """llama.cpp's -p is the prompt's text, as in the commands that run a real target (-p /
    --prompt-text, tokenized by the target); graphgen's row counts are --prompt N, whose help says
    so. rpc-server's -p is the port, as llama.cpp's rpc-server spells it."""
    takes_p, prompt_helps = [], {}
    for name, p in _commands().items():
        for a in p._actions:
            if "-p" in a.option_strings:
                takes_p.append((name, a.dest))
                if name != "rpc-server":
                    assert "--prompt-text" in a.option_strings and a.metavar == "TEXT" and a.type is None, name
            if "--prompt" in a.option_strings:
                prompt_helps[name] = a.help
    assert sorted(takes_p) == [("accept", "prompt_text"), ("diff", "prompt_text"), ("draft", "prompt_text"),
                               ("dump", "prompt_text"), ("rpc-server", "port")]
    assert {"dump", "trace", "bench", "xdiff", "check-batch"} <= set(prompt_helps)
    for name, text in prompt_helps.items():
        assert "a count (not llama.cpp's -p prompt text)" in text, (name, text)


def test_diff_report_and_viewer_name_statuses_alike(tmp_path):
    """A node only ref has is 'deleted', one only ours has 'inserted', in diff's report, in the
    page's statuses, legend and summary, and in Model Explorer's diff attribute."""
    import re

    from graphgen.compare.diff import diff_dumps
    from graphgen.view.diffmap import STATUS_LABELS, diff_map
    from graphgen.view.explorer import graph_json
    from graphgen.view.html import to_html
    from .test_view import _page_data, _seeded

    ref, ours = _seeded(tmp_path)
    res = diff_dumps(ref, ours)
    text = res.format_text()
    assert re.search(r"^\s*inserted\s+1$", text, re.M) and re.search(r"^\s*deleted\s+1$", text, re.M)
    dm = diff_map(res, ref, ours)
    statuses = [r.status for r in dm.rows]
    assert statuses.count("deleted") == 1 and statuses.count("inserted") == 1
    assert STATUS_LABELS["deleted"].startswith("deleted") and STATUS_LABELS["inserted"].startswith("inserted")
    page = to_html(ref, ours, res)
    data = _page_data(page)
    f = {k: i for i, k in enumerate(data["fields"])}
    assert sorted(r[f["status"]] for r in data["rows"] if r[f["status"]] in ("deleted", "inserted")) == \
        ["deleted", "inserted"]
    assert "1 deleted, 1 inserted" in page
    for word in ("missing", "extra"):
        assert word not in data["statusLabels"] and word not in statuses
    gj = graph_json(ref, status={i: r.status for i, r in dm.ref_status.items()})
    diffs = [a["value"] for n in gj["graphs"][0]["nodes"] for a in n["attrs"] if a["key"] == "diff"]
    assert diffs.count("deleted") == 1
