"""Orthogonal sparse bigrams (featurizer option ``osb``) against hand-worked examples."""

from __future__ import annotations

import numpy as np
import pytest

from streamnb.features import Featurizer, Payload
from streamnb.features.hashing import token_hashes
from streamnb.features.steps import REFERENCE_STEPS
from streamnb.features.text import WordRules


def test_siefkes_et_al_example_window_5():
    # Siefkes, Assis, Chhabra, Yerazunis (2004), "Combining Winnow and Orthogonal Sparse
    # Bigrams for Incremental Spam Filtering", table of OSB features for "Do you feel
    # lucky today?" with window 5: "lucky today?", "feel <skip> today?",
    # "you <skip> <skip> today?", "Do <skip> <skip> <skip> today?" (the distance of the
    # pair is the number of <skip> + 1; our rules strip the "?"). The paper was not in
    # the search tool's corpus (quoted from it as published); rspamd's
    # src/libstat/tokenizers/osb.c, which was, pairs each word with the window_size - 1
    # before it, the window index in the feature, the same pairs.
    tokens = WordRules(min_len=1, lowercase=False, osb=5).tokens("Do you feel lucky today?")
    assert tokens[-5:] == ["osb1:lucky today", "osb2:feel today", "osb3:you today",
                           "osb4:Do today", "today"]


def test_every_word_pairs_with_the_previous_window_minus_one():
    # Worked by hand: a b c d e f, window 3: each word with the 2 before it (fewer at the
    # start); the unigrams stay.
    tokens = WordRules(min_len=1, osb=3).tokens("a b c d e f")
    assert tokens == [
        "a",
        "osb1:a b", "b",
        "osb1:b c", "osb2:a c", "c",
        "osb1:c d", "osb2:b d", "d",
        "osb1:d e", "osb2:c e", "e",
        "osb1:e f", "osb2:d f", "f",
    ]
    # window 5 (CRM114, rspamd): 4 pairs per word once 4 words came before it
    five = WordRules(min_len=1, osb=5).tokens("a b c d e f")
    assert [t for t in five if t.endswith(" f")] == ["osb1:e f", "osb2:d f", "osb3:c f", "osb4:b f"]
    assert sum(t.startswith("osb") for t in five) == 0 + 1 + 2 + 3 + 4 + 4


def test_window_holds_word_tokens_after_the_word_rules():
    # short words are dropped before the window, a long word is its skip: token, an
    # address its email: token; 8bit% tokens (1 of 4 letters: 25%, rounded to 30) are not
    # in the window
    rules = WordRules(osb=3)
    assert rules.tokens("buy it supercalifragilistic now") == [
        "buy", "osb1:buy skip:s 20", "skip:s 20", "osb1:skip:s 20 now", "osb2:buy now", "now"]
    assert rules.tokens("mail joe@example.com café") == [
        "mail", "osb1:mail email:example.com", "email:example.com",
        "osb1:email:example.com café", "osb2:mail café", "café", "8bit%:30"]


def test_off_by_default_and_the_same_tokens_as_before():
    text = "Cheap meds now, visit http://x.example.com today"
    assert WordRules().tokens(text) == WordRules(osb=0).tokens(text)
    assert not any(t.startswith("osb") for t in WordRules().tokens(text))
    assert "osb" not in Featurizer().config  # a default model's stored config is unchanged


def test_same_tokens_with_and_without_the_c_steps():
    text = "Free PRIZE winner: claim your prize at www.example.com now!!! déjà vu"
    c = WordRules(osb=5).tokens(text)
    py = WordRules(osb=5, steps=REFERENCE_STEPS).tokens(text)
    assert c == py


def test_each_text_has_its_own_window_and_subjects_get_pairs():
    f = Featurizer(bits=20, osb=5)
    tokens = f.tokens(Payload("raw", b"Subject: cheap meds now\n\nbuy now"))
    assert "subject:osb2:cheap now" in tokens and "subject:osb1:meds now" in tokens
    assert "osb1:buy now" in tokens
    assert not any(t.startswith("osb") and "meds" in t and "buy" in t for t in tokens)


def test_the_worker_path_hashes_the_same_tokens():
    f = Featurizer(bits=20, osb=5)
    raw = b"Subject: hello there\nFrom: a@b.example\n\nwin a free cruise today, reply now"
    row = f.featurize_batch([Payload("raw", raw)])[0]
    expected = np.unique((token_hashes(f.tokens(Payload("raw", raw)))
                          & np.uint64(f.hasher.mask)).astype(np.int32))
    np.testing.assert_array_equal(row.indices, expected)
    assert row.n_tokens == len(f.tokens(Payload("raw", raw)))


def test_the_token_limit_holds():
    rules = WordRules(osb=5)
    tokens = rules.tokens(" ".join(f"word{i}" for i in range(100)), limit=37)
    assert len(tokens) == 37


def test_config_round_trip_and_bad_windows():
    f = Featurizer.from_config({"bits": 12, "osb": 5})
    assert f.config["osb"] == 5 and Featurizer.from_config(f.config) == f
    assert Featurizer.from_config({"bits": 12, "osb": 0}).config == Featurizer(bits=12).config
    for bad in (1, 9, -1, True, 2.5, "5"):
        with pytest.raises(ValueError, match="osb"):
            Featurizer(osb=bad)


@pytest.mark.corpus
def test_corpus_rows_and_tokens_with_osb(corpus_dir):
    import csv

    from streamnb.features.mail import MailTokenizer

    with open(corpus_dir / "index.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))[:300]
    raws = [(corpus_dir / row["path"]).read_bytes() for row in rows]
    f = Featurizer(bits=20, osb=5)
    got = f.featurize_batch([Payload("raw", raw) for raw in raws])
    reference = MailTokenizer(rules=WordRules(osb=5, steps=REFERENCE_STEPS), steps=REFERENCE_STEPS)
    for raw, row in zip(raws, got, strict=True):
        tokens = f.tokens(Payload("raw", raw))
        assert tokens == reference.tokenize(raw)  # the C steps (headers, HTML) change nothing
        expected = np.unique((token_hashes(tokens) & np.uint64(f.hasher.mask)).astype(np.int32))
        np.testing.assert_array_equal(row.indices, expected)
    assert sum(t.startswith("osb4:") for t in f.tokens(Payload("raw", raws[0]))) > 10
