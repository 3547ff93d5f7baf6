"""PhraseSet (a tier class's `imageWords` and label phrases) matches as its definition says: some
phrase's words occur consecutively, as whole words, in the text."""

from __future__ import annotations

import random

from webhook.policy.model import PhraseSet, has_phrase, words_of

WORDS = ["llm", "llama", "cpp", "vllm", "serve", "a", "x"]


def _by_definition(phrases: list[str], text: str) -> bool:
    have = words_of(text)
    for phrase in phrases:
        want = words_of(phrase)
        if want and any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1)):
            return True
    return False


def test_phrase_set_agrees_with_the_definition() -> None:
    r = random.Random(20261201)
    hits = 0
    for _ in range(5000):
        phrases = [" ".join(r.choice(WORDS) for _ in range(r.randint(1, 3))) for _ in range(r.randint(0, 4))]
        text = r.choice(["-", "/", ":", "."]).join(r.choice(WORDS) for _ in range(r.randint(0, 8)))
        want = _by_definition(phrases, text)
        assert PhraseSet.of(phrases)(text) is want, (phrases, text)
        assert any(has_phrase(p, text) for p in phrases) is want, (phrases, text)
        hits += want
    assert 1000 < hits < 4000  # both outcomes are exercised


def test_repeated_first_word() -> None:
    ps = PhraseSet.of(["llama cpp"])
    assert ps("ghcr.io/llama-llama.cpp:server")  # the second "llama" starts the phrase
    assert not ps("llama-x-cpp")
    assert not ps("llamacpp")
