"""The meta vector of a mail or text: what the tokenizer counts in one message
(:class:`MailAnalysis`: tokens, defects, sizes, parts, URLs, letters, recipients) and the
dense vector of :data:`META_FEATURES` those counts give (:meth:`MailAnalysis.meta`,
:func:`text_meta` for a plain-text payload). Counts are ``log1p``-transformed, shares are
in [0, 1].

>>> a = MailAnalysis(tokens=["subject:hello", "hello"], size=40, parts=1)
>>> a.meta()[[0, 1, 6]].round(3).tolist()
[3.714, 0.693, 1.099]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields

import numpy as np

from streamnb.features.steps import DEFAULT_STEPS, TokenizerSteps

__all__ = ["CUT_DEFECTS", "META_FEATURES", "N_META", "MailAnalysis", "text_meta"]

#: Names of the meta-feature columns, in order. Counts are ``log1p``-transformed.
META_FEATURES = (
    "log_size",  # log1p(raw bytes)
    "log_parts",  # log1p(MIME parts)
    "log_urls",  # log1p(URLs in the text)
    "html_share",  # share of body text that came from HTML parts
    "log_recipients",  # log1p(To + Cc addresses)
    "upper_share",  # share of upper-case letters among letters of the body text
    "log_tokens",  # log1p(tokens)
    "log_defects",  # log1p(defects)
    "log_attachments",  # log1p(non-text parts with a file name)
    "log_received",  # log1p(Received headers)
    "non_ascii_share",  # share of non-ASCII characters in the body text
    "log_exclaim",  # log1p('!' and '$' in the body text)
)
N_META = len(META_FEATURES)

#: Latin-1 byte -> 2 for str.isupper, 1 for the other str.isalpha, 0 for the rest.
_LATIN1_LETTER_CLASS = bytes(2 if chr(i).isupper() else int(chr(i).isalpha()) for i in range(256))
_LATIN1_RUNS = re.compile(r"[\x00-\xff]+")


def _python_text_counts(text: str, letters: bool = True) -> tuple[int, int, int, int]:
    """``(upper, letters, non_ascii, exclaim)`` characters of ``text`` (str.isupper,
    str.isalpha, above U+007F, ``!`` or ``$``), as the C ``text_counts`` step counts them.
    ``letters=False`` skips the first two (0).

    >>> _python_text_counts("H\xe9llo WORLD! $")
    (6, 10, 1, 2)
    """
    upper = n_letters = 0
    if letters:  # Latin-1 characters (ASCII, often U+00A0 of &nbsp;): one bytes.translate
        # to letter classes, then two C counts
        classes = text.encode("latin-1", "ignore").translate(_LATIN1_LETTER_CLASS)
        upper = classes.count(2)
        n_letters = classes.count(1) + upper
        if len(classes) < len(text):  # the others: map() over str methods counts in C
            rest = _LATIN1_RUNS.sub("", text)
            n_letters += sum(map(str.isalpha, rest))
            upper += sum(map(str.isupper, rest))
    high = 0 if text.isascii() else len(text) - len(text.encode("ascii", "ignore"))
    return upper, n_letters, high, text.count("!") + text.count("$")


#: What the parser reports when a MIME boundary is not found by the end of the mail: in a
#: cut mail (:attr:`MailAnalysis.cut`) the end is the cut, and the boundary may well come
#: after it, so these are not its defects (``defect:truncated`` says what happened).
CUT_DEFECTS = frozenset({"closeboundarynotfounddefect", "startboundarynotfounddefect",
                         "multipartinvariantviolationdefect"})


@dataclass(slots=True)
class MailAnalysis:
    """What the tokenizer found in one message: tokens, defects and the raw meta counts.
    With ``word_hashes`` (a bytearray;
    :meth:`~streamnb.features.mail.MailTokenizer.analyse` with ``hash_words``) the body's
    word tokens are there as their stable hashes (uint64) instead of in ``tokens``, where
    only the others are (:attr:`n_tokens` counts both)."""

    tokens: list[str] = field(default_factory=list)
    defects: int = 0
    size: int = 0
    parts: int = 0
    urls: int = 0
    html_chars: int = 0
    text_chars: int = 0
    upper: int = 0
    letters: int = 0
    non_ascii: int = 0
    exclaim: int = 0
    recipients: int = 0
    attachments: int = 0
    received: int = 0
    word_hashes: bytearray | None = None
    #: The message was cut to the size limit: the :data:`CUT_DEFECTS` are not counted.
    cut: bool = False

    @property
    def n_tokens(self) -> int:
        """How many tokens: those in :attr:`tokens` and those hashed in :attr:`word_hashes`."""
        return len(self.tokens) + (0 if self.word_hashes is None else len(self.word_hashes) // 8)

    def rewind(self, n_tokens: int, defects: int) -> None:
        """Back to the first ``n_tokens`` tokens and ``defects`` defects, with no other
        count, no word hash (size and cut kept): what a parser that gave up had added is
        gone.

        >>> a = MailAnalysis(tokens=["defect:truncated"], defects=1, size=9, cut=True)
        >>> a.tokens.append("part:text/plain"); a.parts = 1
        >>> a.rewind(1, 1); (a.tokens, a.parts, a.size, a.cut)
        (['defect:truncated'], 0, 9, True)
        """
        del self.tokens[n_tokens:]
        self.defects = defects
        for f in fields(self):
            if f.name not in _KEPT_ON_REWIND:
                setattr(self, f.name, f.default)
        if self.word_hashes is not None:
            del self.word_hashes[:]

    def defect(self, name: str) -> None:
        if self.cut and name in CUT_DEFECTS:
            return
        self.defects += 1
        self.tokens.append(f"defect:{name}")

    def add_text_stats(self, text: str, from_html: bool, letter_counts: bool = True,
                       steps: TokenizerSteps = DEFAULT_STEPS) -> None:
        """Count the characters of one piece of body text (:func:`_python_text_counts`, or
        the C ``text_counts`` step). From 200,000 characters on, every character counts as
        a letter (and none as upper-case): a bound on the work, kept as it was for the same
        meta vectors. ``letter_counts=False`` counts only its length (upper-case, letters,
        non-ASCII and ``!``/``$`` stay as they are)."""
        n = len(text)
        self.text_chars += n
        if from_html:
            self.html_chars += n
        if not letter_counts:
            return
        if n < 200_000:
            upper, letters, high, exclaim = (steps.text_counts or _python_text_counts)(text)
        else:
            _, _, high, exclaim = _python_text_counts(text, letters=False)
            upper, letters = 0, n
        self.upper += upper
        self.letters += letters
        self.non_ascii += high
        self.exclaim += exclaim

    def meta(self) -> np.ndarray:
        """The dense meta vector, in :data:`META_FEATURES` order."""
        log1p = math.log1p
        text = max(self.text_chars, 1)
        return np.array(
            [
                log1p(self.size),
                log1p(self.parts),
                log1p(self.urls),
                self.html_chars / text,
                log1p(self.recipients),
                self.upper / max(self.letters, 1),
                log1p(self.n_tokens),
                log1p(self.defects),
                log1p(self.attachments),
                log1p(self.received),
                self.non_ascii / text,
                log1p(self.exclaim),
            ],
            dtype=np.float64,
        )


#: What :meth:`MailAnalysis.rewind` keeps or sets itself (the other fields: counts, 0).
_KEPT_ON_REWIND = frozenset({"tokens", "defects", "size", "cut", "word_hashes"})


def text_meta(text: str, n_tokens: int) -> np.ndarray:
    """The meta vector of a plain-text payload (mail-only columns are 0).

    >>> text_meta("FREE money!", 2)[[5, 6]].round(3).tolist()
    [0.444, 1.099]
    """
    a = MailAnalysis(size=len(text.encode("utf-8", "surrogatepass")))
    a.add_text_stats(text, from_html=False)
    a.urls = len(re.findall(r"(?i)https?://|www\.", text))
    a.tokens = [""] * n_tokens
    return a.meta()
