"""From a decoded message to a model row, identically in every worker.

A :class:`Featurizer` is built from a plain config dict (stored in Redis with the model,
so every worker featurizes alike). ``input="sparse"`` hashes tokens into ``2**bits``
buckets (raw mail, text, token lists, named features); ``input="dense"`` takes ``x``
vectors of dimension ``dim``. With ``meta=True`` a sparse row also carries the mail
meta vector, stacked as the last :data:`~streamnb.features.mail.N_META` columns (for the
hybrid model).

>>> f = Featurizer.from_config({"bits": 10})
>>> row = f.featurize(Payload("text", "cheap cheap meds"))
>>> row.n_tokens, row.values.tolist()
(3, [1.0, 1.0])
>>> f.stack([row]).shape
(1, 1024)
>>> Featurizer.from_config(f.config) == f
True
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from streamnb.exceptions import MalformedMessage
from streamnb.features.hashing import DEFAULT_HASH_BITS, TokenHasher
from streamnb.features.mail import DEFAULT_HEADERS, N_META, MailTokenizer, text_meta
from streamnb.features.payload import DEFAULT_FEATURE_LIMITS, PAYLOAD_KINDS, FeatureLimits, Payload
from streamnb.features.rows import FEATURIZER_FORMAT_VERSION, Row, binary_rows
from streamnb.features.text import MAX_OSB_WINDOW, WordRules
from streamnb.features.wire_tokens import WireTokens

__all__ = ["COUNT_MODES", "EmailFeaturizer", "Featurizer", "TextFeaturizer"]

#: How token counts become row values: as counted, clipped to 1, or log1p(count).
COUNT_MODES = ("raw", "binary", "log")


def _check_config(cfg: Any) -> dict[str, Any]:
    if not isinstance(cfg, dict):
        raise ValueError(f"featurizer config must be a dict, got {type(cfg).__name__}")
    known = {
        "version", "input", "bits", "dim", "lowercase", "ngrams", "headers",
        "header_names", "min_len", "max_len", "meta", "counts", "osb",
    }
    extra = set(cfg) - known
    if extra:
        raise ValueError(f"unknown featurizer options {sorted(extra)}; expected some of {sorted(known)}")
    version = cfg.get("version", FEATURIZER_FORMAT_VERSION)
    if version != FEATURIZER_FORMAT_VERSION:
        raise ValueError(f"featurizer config version {version!r} is not {FEATURIZER_FORMAT_VERSION}")
    return cfg


class Featurizer:
    """Decoded messages -> rows -> model input, under one config (see the module docstring).

    Options (``config`` keys): ``input`` ("sparse" | "dense"), ``bits`` (20), ``dim``
    (dense only), ``lowercase`` (True), ``ngrams`` (False: word bigrams), ``headers``
    (mail headers tokenized), ``header_names`` (True: a token per header present),
    ``min_len``/``max_len`` (3/12: the word length window), ``meta`` (False: append the
    mail meta vector), ``counts`` ("binary": how token counts become values), ``osb``
    (0: off; N in 2..8: orthogonal sparse bigrams over a window of N word tokens,
    :mod:`streamnb.features.text` rule 8; in :attr:`config` only when on, so the config
    of a model made without it stays as it was).
    """

    def __init__(
        self,
        input: str = "sparse",  # the config key (shadows the builtin on purpose)
        bits: int = DEFAULT_HASH_BITS,
        dim: int | None = None,
        *,
        lowercase: bool = True,
        ngrams: bool = False,
        headers: Sequence[str] = DEFAULT_HEADERS,
        header_names: bool = True,
        min_len: int = 3,
        max_len: int = 12,
        meta: bool = False,
        counts: str = "binary",
        osb: int = 0,
        limits: FeatureLimits = DEFAULT_FEATURE_LIMITS,
    ) -> None:
        if input not in ("sparse", "dense"):
            raise ValueError(f"input must be 'sparse' or 'dense', got {input!r}")
        if input == "dense":
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
                raise ValueError(f"a dense featurizer needs dim >= 1, got {dim!r}")
            if meta:
                raise ValueError("meta features apply to sparse (token) input only")
        elif dim is not None:
            raise ValueError("dim is for dense input; sparse input has 2**bits columns")
        if counts not in COUNT_MODES:
            raise ValueError(f"counts must be one of {COUNT_MODES}, got {counts!r}")
        if not (isinstance(min_len, int) and isinstance(max_len, int) and 1 <= min_len <= max_len):
            raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
        if isinstance(osb, bool) or not isinstance(osb, int) or not (
                osb == 0 or 2 <= osb <= MAX_OSB_WINDOW):
            raise ValueError(f"osb must be 0 (off) or a window of 2..{MAX_OSB_WINDOW} words, got {osb!r}")
        if isinstance(headers, str) or not all(isinstance(h, str) for h in headers):
            raise ValueError("headers must be a list of header names")
        self.input = input
        self.dim = dim
        self.meta = bool(meta)
        self.counts = counts
        self.limits = limits
        self.hasher = TokenHasher(bits)
        self.rules = WordRules(lowercase=bool(lowercase), min_len=min_len, max_len=max_len, ngrams=bool(ngrams),
                               osb=osb)
        self.mail = MailTokenizer(
            rules=self.rules,
            headers=tuple(h.lower() for h in headers),
            header_names=bool(header_names),
            limits=limits,
            letter_counts=self.meta,  # (only the meta vector reads them)
        )

    # ------------------------------------------------------------------ config
    @classmethod
    def from_config(cls, cfg: dict[str, Any], limits: FeatureLimits = DEFAULT_FEATURE_LIMITS) -> Featurizer:
        """Build from a config dict (as stored in Redis); unknown keys are an error."""
        cfg = dict(_check_config(cfg))
        cfg.pop("version", None)
        if "headers" in cfg and cfg["headers"] is not None:
            cfg["headers"] = list(cfg["headers"])
        return cls(**cfg, limits=limits)

    @property
    def config(self) -> dict[str, Any]:
        """The full config (msgpack/JSON friendly); ``from_config(config)`` is a clone."""
        config = {
            "version": FEATURIZER_FORMAT_VERSION,
            "input": self.input,
            "bits": self.hasher.bits,
            "dim": self.dim,
            "lowercase": self.rules.lowercase,
            "ngrams": self.rules.ngrams,
            "headers": list(self.mail.headers),
            "header_names": self.mail.header_names,
            "min_len": self.rules.min_len,
            "max_len": self.rules.max_len,
            "meta": self.meta,
            "counts": self.counts,
        }
        if self.rules.osb:
            config["osb"] = self.rules.osb
        return config

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Featurizer) and other.config == self.config

    def __repr__(self) -> str:
        return f"Featurizer.from_config({self.config!r})"

    @property
    def bits(self) -> int:
        return self.hasher.bits

    @property
    def n_meta(self) -> int:
        """Number of meta columns at the end of a sparse row (0 when meta is off)."""
        return N_META if self.meta else 0

    @property
    def n_columns(self) -> int:
        """Width of the stacked matrix: ``2**bits (+ n_meta)``, or ``dim``."""
        if self.input == "dense":
            return int(self.dim)  # type: ignore[arg-type]
        return self.hasher.n_buckets + self.n_meta

    # ------------------------------------------------------------------ tokens
    def tokens(self, payload: Payload) -> list[str]:
        """The tokens of a raw, text or tokens payload (for display and tests)."""
        kind, value = payload
        if kind == "raw":
            return self.mail.tokenize(value)
        if kind == "text":
            return self.rules.tokens(value[: self.limits.max_text_chars], self.limits.max_tokens)
        if kind == "tokens":
            return list(value)
        raise MalformedMessage("incompatible_payload", f"a {kind} payload has no tokens")

    # ------------------------------------------------------------- featurize
    def featurize(self, payload: Payload) -> Row:
        """One payload -> one :class:`Row` (:meth:`featurize_batch` of one). Raises only
        :class:`~streamnb.exceptions.MalformedMessage`."""
        row = self.featurize_batch([payload])[0]
        if isinstance(row, MalformedMessage):
            raise row
        return row

    def featurize_batch(self, payloads: Sequence[Payload], keep_tokens: Container[int] = ()
                        ) -> list[Row | MalformedMessage]:
        """Each payload -> its :class:`Row`, in order; a payload that cannot be featurized
        gets its :class:`~streamnb.exceptions.MalformedMessage` in its place (the others
        are unaffected). The rows of the raw and text payloads at the positions in
        ``keep_tokens`` also hold their tokens (:attr:`Row.tokens`: what :meth:`tokens`
        gives, made in the same pass). With binary counts, the tokens of raw mail and text
        are hashed as soon as they are made (:meth:`TokenHasher.hashes_of`, while they are
        still in the CPU's caches; the word tokens of raw mail as the tokenizer finds them,
        :meth:`MailTokenizer.analyse` with ``hash_words``), the token lists of tokens
        payloads in one pass (:meth:`TokenHasher.hash_unique_many`; tokens hashed as they
        came on the wire, :class:`~streamnb.features.wire_tokens.WireTokens`, bring their
        hashes), and every payload's hashes (for raw mail and text, joined end to end as
        bytes) masked and sorted in one (:meth:`TokenHasher.unique_buckets_many`).

        >>> f = Featurizer(bits=10)
        >>> out = f.featurize_batch([Payload("tokens", ["cheap", "meds", "cheap"]),
        ...                          Payload("x", [1.0]), Payload("text", "hi there")])
        >>> out[0].n_tokens, type(out[1]).__name__, out[2].indices.size
        (3, 'MalformedMessage', 1)
        """
        out: list[Row | MalformedMessage | None] = [None] * len(payloads)
        binary = self.input == "sparse" and self.counts == "binary"
        listed: list[tuple[int, list[str], np.ndarray | None]] = []  # tokens payloads
        hashed: list[tuple[int, np.ndarray, np.ndarray | None, int]] = []  # (i, hashes, meta, n)
        # raw mail and text: (i, string tokens' hashes, word hashes, meta, n, the tokens where kept)
        worded: list[tuple[int, np.ndarray, bytearray | None, np.ndarray | None, int, list[str] | None]] = []
        for i, (kind, value) in enumerate(payloads):
            try:
                if self.input == "dense" or kind in ("x", "features") or kind not in PAYLOAD_KINDS:
                    out[i] = self._valued_row(kind, value)
                elif kind == "hashes" or type(value) is WireTokens:  # (tokens hashed as they came)
                    n = len(value)
                    value = value.hashes if kind == "tokens" else np.asarray(value, dtype=np.uint64)
                    if binary:
                        hashed.append((i, value, text_meta("", n) if self.meta else None, n))
                    else:
                        out[i] = self._hashes_row(value)
                elif not binary:
                    tokens, meta, _, n = self._tokens_and_meta(kind, value)
                    out[i] = row = self._counted_row(*self.hasher.hash_counts(tokens), meta, n)
                    row.tokens = tokens if i in keep_tokens and kind != "tokens" else None
                elif kind == "tokens":
                    listed.append((i, value, self._no_text_meta(len(value))))
                else:
                    keep = i in keep_tokens
                    tokens, meta, more, n = self._tokens_and_meta(kind, value, hash_words=not keep)
                    worded.append((i, self.hasher.hashes_of(tokens), more, meta, n, tokens if keep else None))
            except MalformedMessage as exc:
                out[i] = exc
        if listed:
            binary_rows(out, self.hasher.hash_unique_many([tokens for _, tokens, _ in listed]),
                        [(i, meta, len(tokens), None) for i, tokens, meta in listed])
        if hashed:
            made = [(i, meta, n, None) for i, _, meta, n in hashed]
            binary_rows(out, self._unique(np.concatenate([h for _, h, _, _ in hashed]), made), made)
        if worded:  # each message's hashes: its string tokens', then its word hashes
            parts = [part for _, hashes, more, *_ in worded for part in (hashes, more) if part is not None]
            made = [(i, meta, n, kept) for i, _, _, meta, n, kept in worded]
            binary_rows(out, self._unique(np.frombuffer(bytearray().join(parts), np.uint64), made), made)
        return out  # type: ignore[return-value]

    def _unique(self, hashes: np.ndarray, made: list[tuple[int, Any, int, Any]]) -> list[np.ndarray]:
        """The sorted unique buckets of each message of ``made`` (``(i, meta, n, tokens)``):
        of the next ``n`` of ``hashes``, every message's end to end (may be modified)."""
        sizes = np.fromiter((n for _, _, n, _ in made), dtype=np.int64, count=len(made))
        return self.hasher.unique_buckets_many(hashes, sizes)

    def transform_payloads(self, payloads: Sequence[Payload]) -> Any:
        """Payloads -> the stacked matrix of their rows (:meth:`stack`); raises the first
        :class:`~streamnb.exceptions.MalformedMessage`."""
        rows = self.featurize_batch(payloads)
        bad = next((r for r in rows if isinstance(r, MalformedMessage)), None)
        if bad is not None:
            raise bad
        return self.stack(rows)

    def _valued_row(self, kind: str, value: Any) -> Row:
        """The row of an ``x`` vector (dense input) or a ``features`` map (sparse), or the
        error of any other kind the input does not take."""
        if kind is None:
            raise MalformedMessage("no_payload", "a message without a payload has no features")
        if kind not in PAYLOAD_KINDS:
            raise MalformedMessage("bad_type", f"unknown payload kind {kind!r}")
        if self.input == "dense":
            if kind != "x":
                raise MalformedMessage("incompatible_payload", f"this model takes x vectors of "
                                       f"dimension {self.dim}, got a {kind} payload")
            x = np.asarray(value, dtype=np.float64).ravel()
            if x.size != self.dim:
                raise MalformedMessage("wrong_dimension",
                                       f"x has {x.size} values, but this model expects {self.dim}")
            if not np.isfinite(x).all():
                raise MalformedMessage("non_finite", "x contains NaN or infinity")
            return Row(x=x.copy(), n_tokens=int(x.size))
        if kind == "x":
            raise MalformedMessage("incompatible_payload", "this model counts hashed tokens; an x "
                                   "vector needs a dense (gaussian/lda/qda) model")
        bad = next((k for k, v in value.items() if not (v >= 0 and math.isfinite(v))), None)
        if bad is not None:
            raise MalformedMessage("incompatible_payload", f"feature {bad[:50]!r} is {value[bad]}, "
                                   "but count models need values >= 0")
        idx, val = self.hasher.hash_values(value)
        meta = np.zeros(N_META) if self.meta else None
        return Row(indices=idx, values=val, meta=meta, n_tokens=len(value))

    def _hashes_row(self, hashes: np.ndarray) -> Row:
        """The row of a ``hashes`` payload under counted values (the tokens' 64-bit hashes,
        computed by the producer: the same row as the tokens themselves would give)."""
        idx, counts = np.unique((hashes & np.uint64(self.hasher.mask)).astype(np.int32), return_counts=True)
        return self._counted_row(idx, counts.astype(np.float64), self._no_text_meta(int(hashes.size)),
                                 int(hashes.size))

    def _no_text_meta(self, n_tokens: int) -> np.ndarray | None:
        """The meta vector of a payload that brings tokens but no text (None without meta)."""
        return text_meta("", n_tokens) if self.meta else None

    def _counted_row(self, idx: np.ndarray, counts: np.ndarray | None, meta: np.ndarray | None,
                     n_tokens: int) -> Row:
        """The row of sorted unique buckets and how many tokens fell in each (None: binary
        values), under this featurizer's ``counts`` option."""
        if self.counts == "binary":
            return Row(indices=idx, values=np.ones(idx.size), meta=meta, n_tokens=n_tokens,
                       binary=True)
        return Row(indices=idx, values=np.log1p(counts) if self.counts == "log" else counts,
                   meta=meta, n_tokens=n_tokens)

    def _tokens_and_meta(self, kind: str, value: Any, hash_words: bool = False
                         ) -> tuple[list[str], np.ndarray | None, bytearray | None, int]:
        """The tokens of a raw, text or tokens payload, its meta vector (if ``meta``), with
        ``hash_words`` the hashes of the word tokens of raw mail that are not in the list
        (:meth:`MailTokenizer.analyse`; else None), and how many tokens in all."""
        meta = word_hashes = n_tokens = None
        if kind == "raw":
            analysis = self.mail.analyse(value, hash_words=hash_words)
            tokens, word_hashes = analysis.tokens, analysis.word_hashes
            n_tokens = analysis.n_tokens
            if self.meta:
                meta = analysis.meta()
        elif kind == "text":
            tokens = self.tokens(Payload(kind, value))
            if self.meta:
                meta = text_meta(value[: self.limits.max_text_chars], len(tokens))
        else:  # tokens, taken as given
            tokens = value
            meta = self._no_text_meta(len(tokens))
        return tokens, meta, word_hashes, len(tokens) if n_tokens is None else n_tokens

    def fits(self, row: Row) -> bool:
        """True if ``row`` can be stacked by this featurizer (a cached row read back from
        Redis may come from another config, or be tampered with).

        >>> f = Featurizer(bits=4)
        >>> [f.fits(Row(indices=np.array([i], dtype=np.int32), values=np.ones(1))) for i in (3, 16)]
        [True, False]
        """
        return row.fits(self.dim if self.input == "dense" else None, self.hasher.n_buckets, self.n_meta)

    # ------------------------------------------------------------------ stack
    def stack(self, rows: Sequence[Row]) -> Any:
        """Rows -> CSR matrix ``(n, n_columns)`` (sparse input) or ndarray ``(n, dim)``."""
        n = len(rows)
        if self.input == "dense":
            if not n:
                return np.empty((0, int(self.dim)), dtype=np.float64)  # type: ignore[arg-type]
            X = np.vstack([r.x for r in rows]).astype(np.float64, copy=False)
            if X.shape[1] != self.dim:
                raise ValueError(f"rows have {X.shape[1]} values, but this featurizer expects {self.dim}")
            return X
        base = self.hasher.n_buckets
        n_meta = self.n_meta
        indptr = np.zeros(n + 1, dtype=np.int64)
        if not n_meta and n:  # the common case: concatenate, check once
            idx_rows = [r.indices for r in rows]
            val_rows = [r.values for r in rows]
            if any(a is None for a in idx_rows) or any(v is None for v in val_rows):
                raise ValueError("a dense row cannot be stacked into a sparse matrix")
            np.cumsum(np.fromiter(map(len, idx_rows), dtype=np.int64, count=n), out=indptr[1:])
            indices = np.concatenate(idx_rows)
            if indices.size and int(indices.max()) >= base:
                raise ValueError(f"row bucket {int(indices.max())} is out of range for bits={self.bits}")
            if all(r.binary for r in rows):  # (values all 1, as made: no zeros to drop)
                return sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(n, base))
            X = sp.csr_matrix((np.concatenate(val_rows), indices, indptr), shape=(n, base))
            X.eliminate_zeros()
            return X
        idx_parts: list[np.ndarray] = []
        val_parts: list[np.ndarray] = []
        for i, r in enumerate(rows):
            if r.indices is None or r.values is None:
                raise ValueError("a dense row cannot be stacked into a sparse matrix")
            if r.indices.size and int(r.indices[-1]) >= base:
                raise ValueError(f"row bucket {int(r.indices[-1])} is out of range for bits={self.bits}")
            idx_parts.append(r.indices)
            val_parts.append(r.values)
            count = r.indices.size
            if n_meta:
                m = r.meta if r.meta is not None else np.zeros(n_meta)
                if m.shape != (n_meta,):
                    raise ValueError(f"row has {m.size} meta values, expected {n_meta}")
                idx_parts.append(np.arange(base, base + n_meta, dtype=np.int32))
                val_parts.append(m)
                count += n_meta
            indptr[i + 1] = indptr[i] + count
        indices = np.concatenate(idx_parts) if idx_parts else np.empty(0, dtype=np.int32)
        data = np.concatenate(val_parts) if val_parts else np.empty(0, dtype=np.float64)
        X = sp.csr_matrix((data, indices, indptr), shape=(n, base + n_meta))
        X.eliminate_zeros()
        return X


class EmailFeaturizer(Featurizer):
    """Offline featurization of raw mail, exactly as the daemon does it.

    >>> X = EmailFeaturizer(bits=12).transform([b"Subject: hello\\n\\nhello world", b""])
    >>> X.shape, X[1].nnz > 0  # the empty message still has its defect token
    ((2, 4096), True)
    """

    def __init__(self, bits: int = DEFAULT_HASH_BITS, **options: Any) -> None:
        super().__init__("sparse", bits, **options)

    def transform(self, raws: Iterable[bytes]) -> sp.csr_matrix:
        """Raw RFC 822 messages -> CSR matrix ``(n, n_columns)``."""
        return self.transform_payloads([Payload("raw", bytes(r)) for r in raws])

    def tokenize(self, raw: bytes) -> list[str]:
        return self.mail.tokenize(raw)


class TextFeaturizer(Featurizer):
    """Offline featurization of plain text, exactly as the daemon does it.

    >>> TextFeaturizer(bits=8).transform(["spam spam eggs", "ham"]).sum(axis=1).A.ravel().tolist()
    [2.0, 1.0]
    """

    def __init__(self, bits: int = DEFAULT_HASH_BITS, **options: Any) -> None:
        super().__init__("sparse", bits, **options)

    def transform(self, texts: Iterable[str]) -> sp.csr_matrix:
        """Texts -> CSR matrix ``(n, n_columns)``."""
        return self.transform_payloads([Payload("text", str(t)) for t in texts])

    def tokenize(self, text: str) -> list[str]:
        return self.rules.tokens(text, self.limits.max_tokens)
