"""The prompts the target continues to make the training text: templates and word lists, and the
held-out prompts no template makes."""

from __future__ import annotations


import numpy as np

from .common import TrainError


_TOPICS = [
    "the ocean", "volcanoes", "the Roman Empire", "photosynthesis", "black holes", "honey bees", "the printing press",
    "jazz music", "the human heart", "glaciers", "the stock market", "electric cars", "ancient Egypt", "coffee",
    "the moon", "rain forests", "the internet", "chess", "vaccines", "the French Revolution", "earthquakes",
    "solar panels", "dinosaurs", "the immune system", "bread baking", "climate change", "the Silk Road", "whales",
    "quantum computers", "the Olympic Games", "democracy", "mountains", "rivers", "the brain", "tea", "bicycles",
    "deserts", "trains", "birds", "mathematics", "poetry", "libraries", "robots", "the weather", "gardening",
    "sleep", "friendship", "music theory", "the alphabet", "money", "cities", "farming", "islands", "bridges",
]
_PEOPLE = ["a young doctor", "an old fisherman", "a curious cat", "a lonely robot", "two sisters", "a baker",
           "a schoolteacher", "a detective", "a king", "a farmer", "a student", "an astronaut", "a painter",
           "a small dragon", "a group of friends", "a shy boy", "a brave girl", "a musician"]
_PLACES = ["in a small village", "on a distant planet", "in the mountains", "by the sea", "in a big city",
           "in a dark forest", "on a train", "in an old castle", "at school", "in the desert", "on an island"]
_THINGS = ["a computer", "a rainbow", "gravity", "a cell", "an atom", "a verb", "a volcano", "a budget", "a poem",
           "an algorithm", "a hurricane", "a vitamin", "an election", "a telescope", "a battery", "a fraction"]
_FOODS = ["pancakes", "tomato soup", "apple pie", "fried rice", "lemonade", "banana bread", "pasta salad",
          "vegetable curry", "chocolate cookies", "guacamole", "omelette", "pizza dough"]
_ACTIONS = ["learn a new language", "save money", "sleep better", "write an essay", "start running",
            "plant a tree", "study for an exam", "make friends", "cook rice", "fix a flat tire", "stay focused",
            "prepare for an interview", "clean a kitchen", "train a puppy"]
_LANGS = ["Python", "JavaScript", "C"]
_FUNCS = ["add two numbers", "reverse a string", "find the largest element of a list", "count the vowels in a word",
          "check whether a number is prime", "compute the factorial of n", "sort a list", "sum a list of numbers"]

_TEMPLATES = [
    "The history of {topic} begins",
    "Here are three facts about {topic}:\n1.",
    "Q: What is {thing}?\nA:",
    "Once upon a time, {person} lived {place}.",
    "How to {action}: a step-by-step guide.\n\nStep 1:",
    "Recipe for {food}\n\nIngredients:\n-",
    "{topic_cap} is important because",
    "Write a short poem about {topic}.\n\n",
    "In this essay, I will explain {topic}.",
    "Dear friend,\n\nI am writing to tell you about {topic}.",
    "The main difference between {topic} and {topic2} is",
    "# A {lang} function to {func}\n",
    "A list of tips to {action}:\n\n1.",
    "{person_cap} was walking {place} when",
    "Scientists have discovered that {topic}",
    "Explain {thing} to a five-year-old.\n\n",
    "Chapter 1\n\nIt was a cold morning {place}, and {person}",
    "The best way to learn about {topic} is",
    "Summary: {topic_cap} and its effects on everyday life.\n\n",
    "Question: Why do people enjoy {topic}?\nAnswer:",
    "I have always wondered how {thing} works.",
    "The teacher asked the class to describe {topic}.",
    "Last summer, {person} decided to {action}.",
    "Most people do not know that {topic}",
    "Here is a simple explanation of {thing}:",
    "When I was a child, I loved {food}, and",
    "The museum had a new exhibition about {topic}.",
    "There are many reasons to {action}.",
    "{person_cap} opened the door and saw",
    "According to experts, the future of {topic}",
    "Notes from today's lecture on {topic}:\n\n-",
    "If you want to {action}, you should",
    "The old book on the shelf was about {topic}.",
    "Breaking news: a new study about {topic} shows",
    "My grandmother's recipe for {food} is simple.",
    "Let me tell you a story about {person} {place}.",
    "Pros and cons of {topic}:\n\nPros:\n-",
    "It is easy to confuse {thing} with",
    "Every morning, {person} would",
    "The word \"{topic}\" comes from",
]

_CHAT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
_CHAT_QUESTIONS = ["What is {thing}?", "Tell me about {topic}.", "How do I {action}?", "Give me a recipe for {food}.",
                   "Write a story about {person} {place}.", "Why is {topic} interesting?"]


def _fill(template: str, rng: np.random.Generator) -> str:
    def pick(words):
        return words[int(rng.integers(len(words)))]
    topic, topic2 = pick(_TOPICS), pick(_TOPICS)
    person = pick(_PEOPLE)
    return template.format(topic=topic, topic2=topic2, topic_cap=topic[:1].upper() + topic[1:], thing=pick(_THINGS),
                           person=person, person_cap=person[:1].upper() + person[1:], place=pick(_PLACES),
                           food=pick(_FOODS), action=pick(_ACTIONS), lang=pick(_LANGS), func=pick(_FUNCS))


def training_prompts(n: int, seed: int, chat_share: float = 0.2) -> list[str]:
    """`n` distinct prompts drawn from the templates above (a share of them in SmolLM2's chat
    format), deterministic in `seed`; none equals a held-out prompt."""
    rng = np.random.default_rng(seed)
    out, seen = [], set(HELD_OUT_PROMPTS)
    for _ in range(n * 50):
        if len(out) == n:
            break
        if rng.random() < chat_share:
            text = _CHAT.format(q=_fill(_CHAT_QUESTIONS[int(rng.integers(len(_CHAT_QUESTIONS)))], rng))
        else:
            text = _fill(_TEMPLATES[int(rng.integers(len(_TEMPLATES)))], rng)
        if text not in seen:
            seen.add(text)
            out.append(text)
    if len(out) < n:
        raise TrainError(f"the templates give only {len(out)} distinct prompts; asked for {n}")
    return out


# written apart from the templates (no template or word list above makes them): the measurement's
HELD_OUT_PROMPTS = [
    "The capital of France is",
    "My favourite season of the year is autumn, because",
    "A good breakfast should include",
    "The three primary colors are",
    "Yesterday I went to the market and bought",
    "Water boils at 100 degrees Celsius, which means that",
]
