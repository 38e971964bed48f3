"""streamnb's own header fields (X-Streamnb-*) are never features: a mail and its delivered
copy give the same tokens, hashes, meta vector and learn-once key, on the C and the Python
paths; and a mail cut to the size limit reports only ``defect:truncated``."""

from __future__ import annotations

import base64
import random

import numpy as np
import pytest

from streamnb.features import Featurizer
from streamnb.features.mail import MailTokenizer
from streamnb.features.mail_meta import CUT_DEFECTS
from streamnb.features.own_headers import is_own_header, strip_own_headers
from streamnb.features.steps import C_STEPS, REFERENCE_STEPS
from streamnb.features.truncate import cut_mail, truncated_size
from streamnb_workers.cli.demo import load_sample
from streamnb_workers.wire.learn_keys import mail_key

STEPS = [REFERENCE_STEPS] + ([C_STEPS] if C_STEPS is not None else [])
#: What the milter and ``predict -p`` add, and the same in other spellings.
OURS = [
    [b"X-Streamnb-Verdict: spam", b"X-Streamnb-Score: 4.21", b"X-Streamnb-Id: pipe-1f3a"],
    [b"x-streamnb-verdict: not-scored (timeout)"],
    [b"X-STREAMNB-SCORE:\t-0.48", b"X-StreamNB-Id:", b"  milter-17", b"\tmore"],
    [b"X-Streamnb-Tokens: cheap=1.2,", b" meds=0.9", b"X-Streamnb-Verdict:ham"],
]


def delivered(mail: bytes, fields: list[bytes], where: str) -> bytes:
    """``mail`` with our header ``fields`` added at the top, at the end of its header
    block, or after its first field; in the mail's own line end."""
    eol = b"\r\n" if b"\r\n" in mail.split(b"\n\n", 1)[0] + b"\n" else b"\n"
    added = b"".join(f + eol for f in fields)
    if where == "top":
        return added + mail
    end = mail.find(eol + eol)
    if where == "end":
        return mail[:end + len(eol)] + added + mail[end + len(eol):]
    first = mail.find(eol) + len(eol)  # after the first field (no continuation in these)
    while mail[first:first + 1] in (b" ", b"\t"):
        first = mail.find(eol, first) + len(eol)
    return mail[:first] + added + mail[first:]


BASE = (b"From: Bob <bob@example.com>\nTo: ann@example.org, cy@example.net\n"
        b"Subject: Cheap meds\nMessage-ID: <m1@example.com>\n"
        b"Received: from relay.example.com ([10.1.2.3]) by mx.example.org\n"
        b"Content-Type: text/plain\n\nBuy cheap meds now! $$$\nX-Streamnb-Verdict: body text\n")
NO_ID = BASE.replace(b"Message-ID: <m1@example.com>\n", b"")


def _sample() -> list[bytes]:
    return [m.raw for m in load_sample(limit=40)]


def _cases() -> list[bytes]:
    mails = [BASE, NO_ID, BASE.replace(b"\n", b"\r\n"), b"From bob Thu Jan 1 00:00:00 2002\n" + NO_ID]
    return mails + _sample()


def test_strip_takes_out_only_our_fields_with_their_continuations():
    mail = (b"From: a@b\r\nX-STREAMNB-Verdict: spam\r\n (forged)\r\n\tagain\r\nSubject: s\r\n"
            b"  folded subject\r\nx-streamnb-id: 1\r\n\r\nX-Streamnb-Score: in the body\r\n")
    assert strip_own_headers(mail) == (b"From: a@b\r\nSubject: s\r\n  folded subject\r\n\r\n"
                                       b"X-Streamnb-Score: in the body\r\n")
    # a header-like name that is not ours, and a line that ends the header block
    same = b"X-Streamnbx: 1\nX-Spam-Score: 2\nnot a header line\nX-Streamnb-Id: 3\n\nbody\n"
    assert strip_own_headers(same) is same
    assert strip_own_headers(b"") == b"" and strip_own_headers(b"X-Streamnb-Id: 1") == b""
    assert is_own_header(" x-StreamNB-Score") and not is_own_header("X-Streamnb")


@pytest.mark.parametrize("steps", STEPS, ids=lambda s: s.name)
def test_a_delivered_copy_has_the_tokens_and_meta_of_its_mail(steps):
    tok = MailTokenizer(steps=steps)
    checked = 0
    for mail in _cases():
        want = tok.analyse(mail)
        slow = tok.analyse(mail, fast=False)
        assert not any("streamnb" in t for t in want.tokens)
        for i, fields in enumerate(OURS):
            for where in ("top", "end", "second"):
                copy = delivered(mail, fields, where)
                assert copy != mail and strip_own_headers(copy) == mail, (where, fields)
                for fast, ref in ((True, want), (False, slow)):
                    got = tok.analyse(copy, fast=fast)
                    assert got.tokens == ref.tokens, (i, where, fast)
                    assert np.array_equal(got.meta(), ref.meta()), (i, where, fast)
                hashed = tok.analyse(copy, hash_words=True)
                assert hashed.word_hashes == tok.analyse(mail, hash_words=True).word_hashes
                checked += 1
    assert checked == len(_cases()) * len(OURS) * 3


def test_the_c_and_python_paths_agree_on_delivered_copies():
    if C_STEPS is None:
        pytest.skip("the C steps are not built")
    c, py = MailTokenizer(steps=C_STEPS), MailTokenizer(steps=REFERENCE_STEPS)
    for mail in _cases()[:12]:
        copy = delivered(mail, OURS[2] + OURS[0], "second")
        a, b = c.analyse(copy), py.analyse(copy)
        assert a.tokens == b.tokens and np.array_equal(a.meta(), b.meta())


def test_a_delivered_copy_has_the_row_of_its_mail():
    f = Featurizer(bits=18, meta=True)
    mails = _cases()[:10]
    copies = [delivered(m, OURS[i % len(OURS)], ("top", "end", "second")[i % 3])
              for i, m in enumerate(mails)]
    a = f.transform_payloads([("raw", m) for m in mails])
    b = f.transform_payloads([("raw", m) for m in copies])
    assert (a != b).nnz == 0 if hasattr(a, "nnz") else np.array_equal(a, b)


def test_a_delivered_copy_has_the_learn_once_key_of_its_mail():
    for mail in (BASE, NO_ID, NO_ID.replace(b"\n", b"\r\n"), *_sample()[:10]):
        key = mail_key(mail)
        for fields in OURS:
            for where in ("top", "end", "second"):
                assert mail_key(delivered(mail, fields, where)) == key
    assert mail_key(BASE) == "mid:m1@example.com" and mail_key(NO_ID).startswith("raw:")
    assert mail_key(NO_ID) != mail_key(NO_ID.replace(b"cheap meds", b"cheap pills"))


# ------------------------------------------------------------------------- the cut
def big_multipart(size: int = 5 << 20, nested: bool = False, seed: int = 0) -> bytes:
    """A multipart mail of about ``size`` bytes: a text part, then 1 MB base64 attachments."""
    rng = random.Random(seed)
    blob = base64.encodebytes(rng.randbytes(750_000))
    parts = [b"--inner\nContent-Type: text/plain\n\ncheap meds for you, friend\n"]
    total, i = 0, 0
    while total < size:
        parts.append(b"--inner\nContent-Type: application/pdf; name=\"f%d.pdf\"\n"
                     b"Content-Transfer-Encoding: base64\n"
                     b"Content-Disposition: attachment; filename=\"f%d.pdf\"\n\n" % (i, i) + blob)
        total += len(blob)
        i += 1
    body = b"".join(parts) + b"--inner--\n"
    ctype = b"multipart/mixed; boundary=\"inner\""
    if nested:
        body = (b"--outer\nContent-Type: " + ctype + b"\n\n" + body
                + b"--outer\nContent-Type: text/plain\n\nbye\n--outer--\n")
        ctype = b"multipart/mixed; boundary=\"outer\""
    return (b"From: a@example.com\nSubject: the files\nMIME-Version: 1.0\nContent-Type: "
            + ctype + b"\n\n" + body)


@pytest.mark.parametrize("steps", STEPS, ids=lambda s: s.name)
@pytest.mark.parametrize("nested", [False, True])
def test_a_cut_5mb_multipart_mail_reports_only_truncated(steps, nested):
    mail = big_multipart(nested=nested)
    assert len(mail) > 5 << 20
    tok = MailTokenizer(steps=steps)
    for fast in (True, False):
        a = tok.analyse(mail, fast=fast)
        defects = [t for t in a.tokens if t.startswith("defect:")]
        assert defects == ["defect:truncated"] and a.defects == 1, (fast, defects)
        assert "part:text/plain" in a.tokens and "cheap" in a.tokens
        assert a.size == len(mail)
    # a cut with the first boundary gone (the first part alone is over the limit)
    head_only = mail.replace(b"cheap meds for you, friend\n", b"x" * (2 << 20) + b"\n", 1)
    a = tok.analyse(head_only)
    assert [t for t in a.tokens if t.startswith("defect:")] == ["defect:truncated"]


def test_the_missing_boundary_defects_still_count_in_a_mail_not_cut():
    mail = big_multipart(size=1000).replace(b"--inner--\n", b"")
    a = MailTokenizer().analyse(mail)
    assert "defect:closeboundarynotfounddefect" in a.tokens
    assert "closeboundarynotfounddefect" in CUT_DEFECTS


def test_a_delivered_copy_of_a_big_mail_is_cut_as_the_mail_was():
    mail = big_multipart()
    copy = delivered(mail, OURS[0] + OURS[2], "second")
    cut = cut_mail(mail, 1 << 20)
    assert cut_mail(copy, 1 << 20) == cut and truncated_size(cut) == len(mail)
    # the milter's reader: the first bytes, and the whole size
    assert cut_mail(copy[:(1 << 20) + 500], 1 << 20, size=len(copy)) == cut
    tok = MailTokenizer()
    a, b, c = tok.analyse(mail), tok.analyse(copy), tok.analyse(cut)
    assert a.tokens == b.tokens == c.tokens
    assert np.array_equal(a.meta(), b.meta()) and np.array_equal(a.meta(), c.meta())
    assert mail_key(cut) == mail_key(cut_mail(copy, 1 << 20))
