"""Featurizer: config, rows, stacking, offline API, reason codes, cross-process determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import scipy.sparse as sp

from streamnb.exceptions import FormatError, MalformedMessage
from streamnb.features import (
    N_META,
    EmailFeaturizer,
    Featurizer,
    MailTokenizer,
    Payload,
    Row,
    TextFeaturizer,
    TokenHasher,
    rows_to_bytes,
    tokenize_email,
)
from streamnb_workers.wire.codec import decode_input

MAIL = b"From: a@spam.example.com\nSubject: Cheap cheap meds\n\nBuy cheap meds at http://x.example.org now"


def msg(kind, payload, **kw) -> Payload:
    return Payload(kind, payload)


def expected_row(tokens, bits, binary=True):
    counts: dict[int, float] = {}
    h = TokenHasher(bits)
    for t in tokens:
        counts[h.bucket(t)] = counts.get(h.bucket(t), 0.0) + 1.0
    idx = sorted(counts)
    return idx, [1.0 if binary else counts[i] for i in idx]


def test_config_round_trip_and_is_msgpack_and_json_friendly():
    f = Featurizer(bits=12, ngrams=True, meta=True, counts="raw", headers=["subject", "from"])
    cfg = f.config
    assert Featurizer.from_config(json.loads(json.dumps(cfg))) == f
    assert Featurizer.from_config(msgpack.unpackb(msgpack.packb(cfg))) == f
    assert cfg["bits"] == 12 and cfg["meta"] is True and cfg["input"] == "sparse"
    assert Featurizer.from_config({}).config == Featurizer().config


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"bitz": 3}, "unknown featurizer options"),
        ({"input": "dense"}, "needs dim"),
        ({"input": "dense", "dim": 3, "meta": True}, "meta"),
        ({"dim": 3}, "dim is for dense input"),
        ({"counts": "tfidf"}, "counts must be one of"),
        ({"bits": 40}, "bits must be an int"),
        ({"min_len": 5, "max_len": 2}, "min_len"),
        ({"version": 99}, "version"),
    ],
)
def test_bad_config_is_refused(cfg, match):
    with pytest.raises(ValueError, match=match):
        Featurizer.from_config(cfg)


def test_raw_row_is_hashed_tokens_binary_by_default():
    f = Featurizer(bits=16)
    row = f.featurize(msg("raw", MAIL))
    tokens = tokenize_email(MAIL)
    idx, vals = expected_row(tokens, 16)
    assert row.indices.tolist() == idx and row.values.tolist() == vals
    assert row.n_tokens == len(tokens) and row.meta is None


def test_count_modes():
    text = "spam spam spam eggs"
    idx, raw_counts = expected_row(["spam", "spam", "spam", "eggs"], 10, binary=False)
    assert Featurizer(bits=10, counts="raw").featurize(msg("text", text)).values.tolist() == raw_counts
    logged = Featurizer(bits=10, counts="log").featurize(msg("text", text)).values
    assert np.allclose(logged, np.log1p(raw_counts))


def test_tokens_taken_as_given_and_features_values_kept():
    f = Featurizer(bits=20, counts="raw")
    row = f.featurize(msg("tokens", ["Hello", "hello", "x"]))
    idx, vals = expected_row(["Hello", "hello", "x"], 20, binary=False)
    assert row.indices.tolist() == idx and row.values.tolist() == vals
    row = f.featurize(msg("features", {"size": 2.5, "links": 3.0}))
    h = TokenHasher(20)
    assert dict(zip(row.indices.tolist(), row.values.tolist(), strict=True)) == {
        h.bucket("size"): 2.5, h.bucket("links"): 3.0}


def test_reason_codes_from_the_featurizer():
    sparse, dense = Featurizer(bits=10), Featurizer(input="dense", dim=3)
    cases = [
        (sparse, msg("x", np.array([1.0, 2.0])), "incompatible_payload"),
        (dense, msg("text", "hello"), "incompatible_payload"),
        (dense, msg("raw", b"Subject: x\n\ny"), "incompatible_payload"),
        (dense, msg("x", np.array([1.0, 2.0])), "wrong_dimension"),
        (dense, msg("x", np.array([1.0, np.nan, 2.0])), "non_finite"),
        (sparse, msg("features", {"a": -1.0}), "incompatible_payload"),
        (sparse, msg(None, None, ref="m1", label="ham"), "no_payload"),
    ]
    for f, m, reason in cases:
        with pytest.raises(MalformedMessage) as info:
            f.featurize(m)
        assert info.value.reason == reason and info.value.detail


def test_wrong_dimension_message_says_expected_and_got():
    with pytest.raises(MalformedMessage, match="x has 2 values, but this model expects 3"):
        Featurizer(input="dense", dim=3).featurize(msg("x", np.array([1.0, 2.0])))


def test_dense_rows_and_stack():
    f = Featurizer.from_config({"input": "dense", "dim": 2})
    rows = [f.featurize(msg("x", np.array([1.0, 2.0]))), f.featurize(msg("x", np.array([3.0, 4.0])))]
    X = f.stack(rows)
    assert isinstance(X, np.ndarray) and X.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert f.n_columns == 2


def test_sparse_stack_with_meta_columns_at_the_end():
    f = Featurizer(bits=8, meta=True)
    rows = [f.featurize(msg("raw", MAIL)), f.featurize(msg("text", "Hello THERE"))]
    X = f.stack(rows)
    assert sp.issparse(X) and X.format == "csr" and X.shape == (2, 256 + N_META) == (2, f.n_columns)
    dense = X.toarray()
    assert np.array_equal(dense[0, 256:], rows[0].meta)
    assert np.array_equal(dense[1, 256:], rows[1].meta)
    assert dense[0, :256].sum() == rows[0].values.sum()


def test_row_bytes_round_trip_and_validation():
    f = Featurizer(bits=12, meta=True)
    row = f.featurize(msg("raw", MAIL))
    assert Row.from_bytes(row.to_bytes()) == row
    dense = Featurizer(input="dense", dim=3).featurize(msg("x", np.array([1.0, 2.0, 3.0])))
    assert Row.from_bytes(dense.to_bytes()) == dense
    for bad in [b"\xc1", msgpack.packb({"type": "row", "v": 1}), msgpack.packb([1]),
                msgpack.packb({"type": "row", "v": 1, "n": 1, "indices": {"dtype": "<i4", "shape": [2], "data": b"\x01"}})]:
        with pytest.raises(FormatError):
            Row.from_bytes(bad)
    unsorted = Row(indices=np.array([5, 2], dtype=np.int32), values=np.array([1.0, 1.0]), n_tokens=2)
    with pytest.raises(FormatError, match="sorted"):
        Row.from_bytes(unsorted.to_bytes())
    assert rows_to_bytes([unsorted]) == [unsorted.to_bytes()]


def _binary_row(indices, n_tokens=None) -> Row:
    idx = np.asarray(indices, dtype=np.int32)
    return Row(indices=idx, values=np.ones(idx.size), n_tokens=n_tokens or idx.size, binary=True)


def test_binary_rows_are_stored_as_gaps_of_two_bytes():
    """A binary row (the mail default) is stored as its first bucket and 2-byte gaps when
    they fit; a gap of 65,536 or more, counted values, meta or no bucket at all take the
    map of arrays. Every form decodes to the same row, and the batch encoder gives the
    bytes of the one-row encoder, row by row."""
    rng = np.random.default_rng(3)
    mail = _binary_row(np.unique(rng.integers(0, 2**20, 300)), n_tokens=512)
    wide = _binary_row([0, 5, 70_000, 2**31 - 1])  # gaps too wide for 2 bytes
    edge = _binary_row([2**31 - 65_536, 2**31 - 1])  # the widest gap that fits, to int32's end
    one = _binary_row([7])
    counted = Row(indices=np.array([1, 4], dtype=np.int32), values=np.array([2.0, 1.0]), n_tokens=3)
    empty = _binary_row([])
    meta = Row(indices=np.array([1, 4], dtype=np.int32), values=np.ones(2), meta=np.ones(3), n_tokens=2)
    rows = [mail, wide, edge, one, counted, empty, meta, mail]
    for r in rows:
        assert Row.from_bytes(r.to_bytes()) == r
    assert rows_to_bytes(rows) == [r.to_bytes() for r in rows]
    assert rows_to_bytes([]) == []
    assert msgpack.unpackb(mail.to_bytes())[:3] == [2, 512, int(mail.indices[0])]
    assert len(mail.to_bytes()) <= 2 * mail.indices.size + 16
    assert isinstance(msgpack.unpackb(wide.to_bytes()), dict)
    assert isinstance(msgpack.unpackb(edge.to_bytes()), list)
    # rows from the daemon's featurizer: the whole corpus sample would do the same
    f = Featurizer(bits=20)
    batch = [f.featurize(msg("raw", MAIL)), f.featurize(msg("text", "cheap meds now")), one]
    assert [Row.from_bytes(b) for b in rows_to_bytes(batch)] == batch


def test_a_corrupt_gap_encoded_row_is_refused():
    for bad in ([2, 1, 0], [2, -1, 0, b""], [2, 1, -5, b""], [2, 1, 2**31, b""], [2, 1, 0, b"\x01"],
                [2, 1, 0, "text"], [2, 1, 3, b"\x00\x00"],  # a gap of 0: a bucket twice
                [2, 1, 2**31 - 2, b"\x05\x00"]):  # past int32
        with pytest.raises(FormatError):
            Row.from_bytes(msgpack.packb(bad, use_bin_type=True))


def test_offline_email_featurizer_matches_the_daemon_path():
    raws = [MAIL, b"Subject: lunch\n\nsee you at noon", b""]
    X = EmailFeaturizer(bits=14).transform(raws)
    f = Featurizer.from_config({"bits": 14})
    entries = [decode_input(msgpack.packb({"raw": r}), f"{i}-0") for i, r in enumerate(raws)]
    Y = f.stack([f.featurize(m.as_payload()) for m in entries])
    assert (X != Y).nnz == 0 and X.shape == (3, 2**14)


def test_offline_text_featurizer():
    X = TextFeaturizer(bits=10).transform(["cheap meds", "meeting notes"])
    idx, _ = expected_row(["cheap", "meds"], 10)
    assert X[0].indices.tolist() == idx


def test_offline_api_trains_a_model():
    from streamnb.models import MultinomialNB

    f = EmailFeaturizer(bits=12)
    X = f.transform([b"Subject: cheap meds\n\nbuy cheap meds", b"Subject: team lunch\n\nsee you at lunch"])
    model = MultinomialNB(n_features=f.n_columns, smoothing_m="seen").fit(X, ["spam", "ham"])
    assert model.predict(f.transform([b"Subject: meds\n\ncheap"])).tolist() == ["spam"]


def test_same_features_in_another_process():
    code = (
        "import sys, json; from streamnb.features import EmailFeaturizer; "
        "X = EmailFeaturizer(bits=20).transform([sys.stdin.buffer.read()]); "
        "print(json.dumps([X.indices.tolist(), X.data.tolist()]))"
    )
    env = dict(os.environ, PYTHONHASHSEED="987")
    out = subprocess.run([sys.executable, "-c", code], input=MAIL, capture_output=True, env=env, check=True)
    X = EmailFeaturizer(bits=20).transform([MAIL])
    assert json.loads(out.stdout) == [X.indices.tolist(), X.data.tolist()]


def test_hostile_inputs_end_to_end_never_raise_anything_but_malformed():
    depth = 100
    nested = b"".join(f"Content-Type: multipart/mixed; boundary=b{i}\n\n--b{i}\n".encode() for i in range(depth))
    hostile = [
        {"raw": b"Content-Type: multipart/mixed; boundary=Z\n\n--Y\nbroken"},
        {"raw": b"Content-Type: text/plain; charset=klingon\n\n\xff\xfe\xfd"},
        {"raw": b"Content-Transfer-Encoding: base64\n\n%%%%garbage%%%%"},
        {"raw": nested + b"\n"},
        {"raw": b""},
        {"raw": b"x" * (50 << 20)},
        {"x": [1.0, float("nan")]},
        {"text": "a", "raw": b"b"},
    ]
    f = Featurizer(bits=12, meta=True)
    outcomes = []
    for obj in hostile:
        try:
            row = f.featurize(decode_input(msgpack.packb(obj, use_bin_type=True), "1-0").as_payload())
            outcomes.append("ok" if row.n_tokens > 0 else "empty")
        except MalformedMessage as exc:
            outcomes.append(exc.reason)
    assert outcomes == ["ok", "ok", "ok", "ok", "ok", "too_large", "non_finite", "several_payloads"]


def test_featurize_batch_equals_featurize_one_at_a_time():
    from streamnb.exceptions import MalformedMessage
    from streamnb.features.hashing import token_hashes

    for f in (Featurizer(bits=6), Featurizer(bits=12, counts="raw"), Featurizer(bits=12, meta=True)):
        msgs = [msg("tokens", ["a", "b", "a", "c"]), msg("tokens", []), msg("x", np.array([1.0])),
                msg("text", "Hello THERE there"), msg("tokens", [f"t{i}" for i in range(200)]),
                msg("raw", MAIL),  # raw mail: what the worker sends through featurize_batch
                msg("hashes", token_hashes(["a", "b", "a"])), msg("tokens", ["x"])]
        out = f.featurize_batch(msgs)
        assert isinstance(out[2], MalformedMessage) and out[2].reason == "incompatible_payload"
        for m, row in zip(msgs, out, strict=True):
            if not isinstance(row, MalformedMessage):
                assert row == f.featurize(m)


def test_rows_that_keep_their_tokens_are_the_same_rows():
    """``keep_tokens``: the rows of raw mail and text at those positions also hold what
    ``tokens`` gives, made in the same pass; every row is the row made without it."""
    for f in (Featurizer(bits=12), Featurizer(bits=12, counts="raw"), Featurizer(bits=12, meta=True)):
        msgs = [msg("raw", MAIL), msg("text", "Hello THERE there"), msg("tokens", ["a", "b"]),
                msg("raw", MAIL + b"\nmore words here"), msg("raw", MAIL)]
        plain, kept = f.featurize_batch(msgs), f.featurize_batch(msgs, {0, 1, 2, 3})
        assert [r.tokens for r in plain] == [None] * 5
        assert [r.tokens for r in kept] == [f.tokens(m) for m in msgs[:2]] + [None, f.tokens(msgs[3]), None]
        for a, b in zip(plain, kept, strict=True):
            assert a == b and a.n_tokens == b.n_tokens and np.array_equal(a.values, b.values)


def test_hashed_word_tokens_give_the_same_analysis_as_the_tokens():
    """``analyse(hash_words=True)``: the word tokens as hashes, the others as tokens; the
    same hashes in all, the same counts and meta vector. Past the token limit it is the
    analysis with every token a str (where the limit cuts depends on their order)."""
    from streamnb.features import FeatureLimits as Limits
    from streamnb.features.hashing import token_hashes
    from streamnb.features.steps import DEFAULT_STEPS, REFERENCE_STEPS

    # ASCII text, Latin-1 text and text beyond Latin-1 (their words hashed, 8bit% tokens
    # too), many words; without the C step every token a str
    beyond = "Subject: x\nContent-Type: text/plain; charset=utf-8\n\nna\u00efve \u65e5\u672c text"
    cases = ((MAIL, 4), (MAIL + b"\n" + b"Caf\xe9 cr\xe8me " * 3, 16),
             (beyond.encode(), 3), (b"Subject: x\n\n" + b"word " * 50, 50))
    for steps, (raw, hashed_words) in [(steps, case) for steps in {DEFAULT_STEPS, REFERENCE_STEPS}
                                       for case in cases]:
        tokenizer = MailTokenizer(steps=steps)
        plain, hashed = tokenizer.analyse(raw), tokenizer.analyse(raw, hash_words=True)
        if steps.word_hashes is None:
            hashed_words = 0
        assert len(hashed.word_hashes) == 8 * hashed_words
        assert hashed.n_tokens == plain.n_tokens == len(plain.tokens)
        both = token_hashes(hashed.tokens).tolist() + np.frombuffer(hashed.word_hashes, np.uint64).tolist()
        assert sorted(both) == sorted(token_hashes(plain.tokens).tolist())
        assert np.array_equal(hashed.meta(), plain.meta())
        assert (hashed.urls, hashed.defects, hashed.parts) == (plain.urls, plain.defects, plain.parts)
    small = MailTokenizer(limits=Limits(max_tokens=40))
    hashed = small.analyse(b"Subject: x\n\n" + b"word " * 50, hash_words=True)
    assert hashed == small.analyse(b"Subject: x\n\n" + b"word " * 50) and hashed.word_hashes is None
    assert hashed.tokens[-1] == "defect:too_many_tokens" and len(hashed.tokens) == 40
    assert small.analyse(MAIL, hash_words=True).word_hashes is not None  # (below the limit)


@pytest.mark.corpus
def test_corpus_rows_in_batches_equal_the_rows_one_at_a_time(corpus_dir):
    """The worker's path (featurize_batch: word tokens hashed as found) against featurize."""
    import csv

    with open(corpus_dir / "index.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    msgs = [msg("raw", (corpus_dir / row["path"]).read_bytes()) for row in rows]
    for f in (Featurizer(), Featurizer(meta=True, bits=18)):
        batched = [row for i in range(0, len(msgs), 100) for row in f.featurize_batch(msgs[i : i + 100])]
        assert sum(row.n_tokens for row in batched) > 500_000
        assert batched == [f.featurize(m) for m in msgs]
        for m, row in zip(msgs[:300], batched, strict=False):  # against the tokens hashed one by one
            assert np.array_equal(row.indices, f.hasher.hash_counts(f.tokens(m))[0])


def test_binary_rows_are_cached_without_their_values_and_old_rows_still_read():
    f = Featurizer(bits=16, meta=True)  # counts="binary": every value is 1; meta: the map form
    row = f.featurize(msg("raw", MAIL))
    assert row.values.size > 10 and (row.values == 1.0).all()
    data = row.to_bytes()
    assert b"ones" in data and Row.from_bytes(data) == row
    # a row written with its values (a counted row, or an earlier version) reads as before
    legacy = dict(msgpack.unpackb(data), values={"dtype": "<f8", "shape": [row.values.size],
                                                 "data": row.values.tobytes()})
    del legacy["ones"]
    assert Row.from_bytes(msgpack.packb(legacy)) == row
    assert len(msgpack.packb(legacy)) - len(data) >= 8 * row.values.size  # the values' bytes
    counted = Featurizer(bits=16, counts="raw").featurize(msg("text", "spam spam eggs"))
    assert Row.from_bytes(counted.to_bytes()) == counted and b"ones" not in counted.to_bytes()
    for bad in (dict(legacy, ones=True), dict(msgpack.unpackb(data), ones=1)):
        with pytest.raises(FormatError, match="'ones'"):
            Row.from_bytes(msgpack.packb(bad))


def test_the_common_row_is_gap_encoded_and_its_map_form_still_reads():
    """The common row (binary values, int32 buckets, no meta) is stored as its first bucket
    and 2-byte gaps, whether or not it says it is binary; the map of arrays, the form of
    other rows, reads back as the same row for it too."""
    from streamnb.encoding import dumps, pack_array
    from streamnb.features.rows import FEATURIZER_FORMAT_VERSION

    f = Featurizer(bits=16)
    row = f.featurize(msg("raw", MAIL))
    assert row.binary and row.meta is None
    gaps = dumps([2, row.n_tokens, int(row.indices[0]), np.diff(row.indices).astype("<u2").tobytes()])
    assert row.to_bytes() == gaps
    unflagged = Row(indices=row.indices, values=row.values.copy(), n_tokens=row.n_tokens)
    assert unflagged.to_bytes() == gaps  # ones found by looking
    general = dumps({"type": "row", "v": FEATURIZER_FORMAT_VERSION, "n": row.n_tokens,
                     "ones": True, "indices": pack_array(row.indices)})
    back = Row.from_bytes(general)
    assert back == row and back.binary and back.to_bytes() == gaps
    assert len(gaps) < 0.55 * len(general)
    meta = Featurizer(bits=16, meta=True).featurize(msg("raw", MAIL))
    assert Row.from_bytes(meta.to_bytes()) == meta and b"meta" in meta.to_bytes()
