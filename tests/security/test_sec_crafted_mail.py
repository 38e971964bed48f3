"""Crafted hostile mail: each is dead-lettered with a reason or featurized with defect tokens,
within the limits and a generous CPU ceiling, offline and through a real worker."""

from __future__ import annotations

import msgpack
import pytest

from streamnb.exceptions import MalformedMessage
from streamnb.features import DEFAULT_FEATURE_LIMITS, FeatureLimits, Featurizer, MailTokenizer
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.codec import DEFAULT_LIMITS, decode_input
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.hostile import CPU_CEILING_S, CRAFTED, RSS_CEILING_BYTES, cost
from tests.helpers.workers import fast_options, url_worker

#: What each crafted mail must show: the defect tokens of the tokenizer (any of them).
EXPECTED_DEFECTS = {
    "100k_parts": {"defect:too_many_parts"},
    "10mb_line": {"defect:truncated"},
    "nested_html": {"defect:truncated"},
    "unclosed_script": None,  # only the cost is bounded: no limit is hit
    "invalid_utf8": {"defect:undecodable"},
    "1mb_header": {"defect:truncated"},
    "encoded_word_bomb": {"defect:truncated"},
    "encoded_word_bomb_4mb": {"defect:truncated"},
    "deep_mime": {"defect:mime_depth", "defect:recursion"},
}
LIMITS = DEFAULT_FEATURE_LIMITS
#: What a worker decodes at all (mail under it is cut to LIMITS.max_message_bytes, then judged).
ENTRY_LIMIT = DEFAULT_LIMITS.max_message_bytes


@pytest.fixture(scope="module")
def crafted() -> dict[str, bytes]:
    return {name: build() for name, build in CRAFTED.items()}


@pytest.mark.parametrize("name", list(CRAFTED))
def test_tokenizer_bounds_crafted_mail(crafted: dict[str, bytes], name: str) -> None:
    raw = crafted[name]
    analysis, cpu, grown = cost(lambda: MailTokenizer().analyse(raw))
    assert cpu < CPU_CEILING_S, f"{name}: {cpu:.2f} s of CPU"
    assert grown < RSS_CEILING_BYTES, f"{name}: peak RSS grew by {grown >> 20} MiB"
    tokens = analysis.tokens
    assert 0 < len(tokens) <= LIMITS.max_tokens
    expected = EXPECTED_DEFECTS[name]
    if expected is not None:
        assert expected & set(tokens), (name, [t for t in tokens if "defect" in t])
    assert analysis.parts <= LIMITS.max_mime_parts + 1
    assert not [t for t in tokens if t.startswith("defect:error_")], tokens[:20]


@pytest.mark.parametrize("name", list(CRAFTED))
def test_wire_path_dead_letters_or_featurizes(crafted: dict[str, bytes], name: str) -> None:
    """What a worker does with it: decode (size limit) then featurize, within the ceiling."""
    raw = crafted[name]
    data = msgpack.packb({"raw": raw, "label": "spam"}, use_bin_type=True)
    f = Featurizer.from_config({"bits": 12})

    def run():
        try:
            msg = decode_input(data, "1-0")
        except MalformedMessage as exc:
            return exc
        return f.featurize(msg.as_payload())

    result, cpu, _ = cost(run)
    assert cpu < CPU_CEILING_S, f"{name}: {cpu:.2f} s of CPU"
    if len(data) > ENTRY_LIMIT:
        assert isinstance(result, MalformedMessage) and result.reason == "too_large"
        assert str(ENTRY_LIMIT) in result.detail
    else:
        assert not isinstance(result, MalformedMessage), result
        assert 0 < result.n_tokens <= LIMITS.max_tokens and result.indices.size > 0


@pytest.mark.parametrize("name", ["1mb_header", "encoded_word_bomb_4mb", "nested_html",
                                  "10mb_line", "unclosed_script", "deep_mime"])
def test_raised_size_limit_still_bounded(crafted: dict[str, bytes], name: str) -> None:
    """With a 16 MiB message limit the inner limits (decoded bytes, text chars, tokens,
    header length) still bound the cost: no parser step is quadratic in the message."""
    big = FeatureLimits(max_message_bytes=16 << 20)
    analysis, cpu, _ = cost(lambda: MailTokenizer(limits=big).analyse(crafted[name]))
    assert cpu < 4 * CPU_CEILING_S, f"{name}: {cpu:.2f} s of CPU"
    assert len(analysis.tokens) <= big.max_tokens


def test_deep_mime_keeps_headers_and_text() -> None:
    """MIME nested past Python's recursion limit: the parser's RecursionError is caught and
    the message is read headers-only, so its header tokens are not lost."""
    from tests.helpers.hostile import deep_mime

    raw = b"From: Eve <eve@evil.example>\nSubject: nested offer\n" + deep_mime()
    tokens = MailTokenizer().tokenize(raw)
    assert "defect:recursion" in tokens
    assert {"from:evil.example", "subject:nested", "subject:offer"} <= set(tokens)


def test_token_limit_cuts_and_marks() -> None:
    words = b" ".join(b"w%06d" % i for i in range(120_000))
    tokens = MailTokenizer().tokenize(b"Subject: many\n\n" + words)
    assert len(tokens) == LIMITS.max_tokens
    assert tokens[-1] == "defect:too_many_tokens"


def test_decoded_budget_caps_base64_parts() -> None:
    """Many base64 text parts: decoding stops at max_decoded_bytes in all."""
    import base64

    part = base64.encodebytes(b"ab" * 100_000)  # 200 kB decoded per part, one token
    body = b"".join(b"--b\nContent-Type: text/plain\nContent-Transfer-Encoding: base64\n\n"
                    + part for _ in range(30))
    raw = b'Content-Type: multipart/mixed; boundary="b"\n\n' + body + b"--b--\n"
    small = FeatureLimits(max_message_bytes=16 << 20, max_decoded_bytes=1 << 20)
    a = MailTokenizer(limits=small).analyse(raw)
    assert "defect:decoded_budget" in a.tokens
    assert a.text_chars <= small.max_decoded_bytes


@pytest.mark.redis
def test_crafted_mail_through_a_real_worker(redis_server, crafted: dict[str, bytes]) -> None:
    """Every crafted mail gets a prediction or a dead letter with a reason; the worker
    keeps serving, and the counts add up."""
    from prometheus_client import CollectorRegistry

    from streamnb_workers.observe.metrics import Metrics

    r = redis_server.client()
    keys = ModelKeys("mail")
    spec = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 12})
    ids = {}
    for name, raw in crafted.items():
        data = msgpack.packb({"id": name, "raw": raw[: 4 << 20], "label": "spam"}, use_bin_type=True)
        ids[r.xadd(keys.input, {"data": data}).decode()] = (name, len(data))
    r.xadd(keys.input, {"data": msgpack.packb({"id": "ok", "text": "hello friend", "label": "ham"})})
    metrics = Metrics(CollectorRegistry())
    w = url_worker(redis_server.url, [spec], fast_options("w1", batch=4), metrics)
    w.run_until_idle(timeout=60)

    outs = {decode_output(f[b"data"])["id"]: decode_output(f[b"data"])
            for _, f in r.xrange(keys.out)}
    dead = {decode_output(f[b"data"])["entry"]: decode_output(f[b"data"])
            for _, f in r.xrange(keys.dead)}
    for entry, (name, size) in ids.items():
        if size > ENTRY_LIMIT:
            assert entry in dead and dead[entry]["reason"] == "too_large", name
            assert name not in outs
        else:
            assert name in outs and outs[name]["learned"] is True, name
    assert "ok" in outs
    n_dead = sum(1 for _, s in ids.values() if s > ENTRY_LIMIT)
    assert metrics.dead_letters.labels(model="mail", worker="w1", reason="too_large")._value.get() == n_dead
    assert w.models["mail"].replica.learnt == len(crafted) - n_dead + 1
