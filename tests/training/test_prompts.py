"""The prompts the target continues for the training text (graphgen/training/prompts.py): drawn
from the templates, distinct, deterministic in the seed, a share in SmolLM2's chat format, and
never a held-out prompt."""

from __future__ import annotations

import numpy as np
import pytest

from graphgen.training import prompts as P
from graphgen.training.common import TrainError

CHAT_OPEN = "<|im_start|>user\n"
CHAT_CLOSE = "<|im_end|>\n<|im_start|>assistant\n"


def test_the_prompts_are_distinct_and_as_many_as_asked():
    out = P.training_prompts(300, seed=0)
    assert len(out) == 300 == len(set(out))
    assert all(isinstance(p, str) and p and "{" not in p and "}" not in p for p in out)  # every slot filled


def test_a_seed_gives_one_list_and_another_seed_another():
    assert P.training_prompts(50, seed=3) == P.training_prompts(50, seed=3)
    assert P.training_prompts(50, seed=3) != P.training_prompts(50, seed=4)
    # a longer list begins with the shorter one
    assert P.training_prompts(80, seed=3)[:50] == P.training_prompts(50, seed=3)


def test_the_chat_share_is_the_share_in_smollm2s_chat_format():
    def chats(prompts):
        return [p for p in prompts if p.startswith(CHAT_OPEN)]
    assert chats(P.training_prompts(100, seed=1, chat_share=0.0)) == []
    every = P.training_prompts(100, seed=1, chat_share=1.0)
    assert len(chats(every)) == 100 and all(p.endswith(CHAT_CLOSE) for p in every)
    some = len(chats(P.training_prompts(1000, seed=1)))
    assert 140 < some < 260  # the default share, 0.2


def test_no_training_prompt_is_a_held_out_prompt(monkeypatch):
    # a template that makes exactly the first held-out prompt, beside one that makes another text
    monkeypatch.setattr(P, "_TEMPLATES", [P.HELD_OUT_PROMPTS[0], "{food} is good"])
    out = P.training_prompts(len(P._FOODS), seed=0, chat_share=0.0)
    assert P.HELD_OUT_PROMPTS[0] not in out
    assert sorted(out) == sorted(f"{f} is good" for f in P._FOODS)


def test_asking_more_than_the_templates_make_is_refused(monkeypatch):
    monkeypatch.setattr(P, "_TEMPLATES", ["{lang} code"])
    assert sorted(P.training_prompts(3, seed=0, chat_share=0.0)) == ["C code", "JavaScript code", "Python code"]
    with pytest.raises(TrainError, match="^the templates give only 3 distinct prompts; asked for 4$"):
        P.training_prompts(4, seed=0, chat_share=0.0)


def test_capitalised_slots_are_the_same_words_with_a_capital():
    for seed in range(20):
        text = P._fill("{topic_cap}|{topic}|{person_cap}|{person}", np.random.default_rng(seed))
        topic_cap, topic, person_cap, person = text.split("|")
        assert topic in P._TOPICS and person in P._PEOPLE
        assert topic_cap == topic[:1].upper() + topic[1:] and person_cap == person[:1].upper() + person[1:]


def test_the_held_out_prompts_are_not_made_by_any_template():
    made = set(P.training_prompts(2000, seed=5))
    assert not made & set(P.HELD_OUT_PROMPTS)
    assert len(P.HELD_OUT_PROMPTS) == 6 == len(set(P.HELD_OUT_PROMPTS))
