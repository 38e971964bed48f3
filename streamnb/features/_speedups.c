/* streamnb.features._speedups: the per-character and per-token steps of streamnb.features, in C.
 *
 * Each function is the C step of a rule whose Python code (its reference) is named here;
 * streamnb.features.steps lists the tokenizer's steps, and the functions decline the input
 * they do not take (None or False), which the Python code then reads:
 *
 * - the word rules of streamnb.features.text (word_tokens, below; value_words for header
 *   values);
 * - the token hash table of streamnb.features.hashing (further down), the word hashes of
 *   WordRules.hash_words (word_hashes) and the sorted distinct buckets of each message's
 *   token hashes for TokenHasher.unique_buckets_many (unique_buckets);
 * - the letter counts of MailAnalysis.add_text_stats (text_counts);
 * - the URL rule of WordRules.urls on Latin-1 text (url_scan);
 * - markup.strip_html: its comment, declaration and script/style passes, its tag split and
 *   its tag tokens, in one call on Latin-1 markup (html_strip, at the end), and the tag
 *   tokens alone (tag_tokens);
 * - the tokens of a Received header of mail_headers._received_tokens (received_tokens);
 * - the header stage of the mail tokenizer: mime._header_block_end and
 *   mime._plain_headers on the raw bytes (header_block_end, plain_headers), the field
 *   split of a plain header block (header_fields), mime.Part's names and index
 *   (header_index), HeaderTokenizer.add (header_tokens) and the address lists of
 *   mail_headers._address_matches (addresses).
 *
 * word_tokens(text, min_len, max_len, out) appends to the list `out`
 * exactly the tokens that WordRules.words' list comprehensions give for `text` (already
 * lower-cased when the rules lower-case); ASCII text takes a loop over its bytes:
 *
 *   - split on white space as str.split() does (Py_UNICODE_ISSPACE; for ASCII:
 *     \t \n \v \f \r, \x1c-\x1f, space);
 *   - strip the characters of text._PUNCT from both ends of each word;
 *   - drop words shorter than min_len;
 *   - a word of at most max_len characters without '@' is kept as it is;
 *   - otherwise WordRules._odd_word: "email:<domain>" for one '@' (long words also need a
 *     '.' and fewer than 60 characters), "skip:<first character> <length // 10 * 10>" for
 *     the other long words, the word itself for the rest;
 *   - a word with non-ASCII characters also gives "8bit%:<share of them, rounded to 10>",
 *     except a short e-mail address (WordRules._odd_tokens).
 *
 * The module's PUNCT must equal text._PUNCT (tests/streamnb/features/test_speedups.py checks it). The Python
 * code stays the path for bigrams and the token limit; tests/streamnb/features/test_speedups.py compares
 * each function with it on generated input and on the whole corpus, and the hash table
 * with the dict. Building this module is optional: without a C compiler the package
 * installs and runs the Python code alone.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "../_buffers.h"

/* str.split()'s white space among the ASCII characters (Py_UNICODE_ISSPACE). */
static unsigned char is_space[128];
static unsigned char is_space1[256]; /* \s among the Latin-1 characters */
/* text._PUNCT: stripped from both ends of a word. */
static const char PUNCT[] = "\"'.,;:!?()[]{}<>*`~|^_=+-/\\#&";
static unsigned char is_punct[128];

/* An ASCII letter lower-cased (other characters as they are). */
static inline Py_UCS1
lower1(Py_UCS1 c)
{
    return (c >= 'A' && c <= 'Z') ? (Py_UCS1)(c + 32) : c;
}

/* Bits of word_class: what word_hashes needs to know of each character of a word. */
#define WC_SPACE 1 /* is_space1 */
#define WC_AT 2    /* '@' */
#define WC_HIGH 4  /* beyond ASCII */
static unsigned char word_class[256];

static inline uint64_t load_le64(const unsigned char *p);

/* Which of 8 bytes (little-endian, byte 0 lowest) holds the lowest high bit of the nonzero
 * x (each byte's high bit a flag). */
static inline int
first_flagged_byte(uint64_t x)
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(x) >> 3;
#else
    int k = 0;
    while (!(x & 0x80)) {
        x >>= 8;
        k++;
    }
    return k;
#endif
}

/* The next word of the one-byte text s[*i:len] as word_tokens splits and strips it:
 * white space skipped (str.split()'s, is_space1), the run up to the next white space,
 * text._PUNCT stripped from both ends, into [*start, *end) (empty for a run of
 * punctuation only); *i moves past the run; *flags the word_class bits of the run's
 * characters ORed: WC_AT and WC_HIGH of the word itself (text._PUNCT, stripped, is ASCII
 * and holds no '@'). 0 once the text is done. */
static inline int
next_word_flags(const Py_UCS1 *s, Py_ssize_t len, Py_ssize_t *i, Py_ssize_t *start, Py_ssize_t *end,
                unsigned *flags)
{
    Py_ssize_t j = *i;
    while (j < len && is_space1[s[j]]) {
        j++;
    }
    if (j >= len) {
        *i = j;
        return 0;
    }
    Py_ssize_t a = j;
    unsigned f = 0, c;
    while (len - j >= 8) { /* 8 characters at a time up to the first below '!' or beyond ASCII */
        uint64_t w = load_le64(s + j), at = w ^ 0x4040404040404040ULL;
        uint64_t stop = ((w - 0x2121212121212121ULL) & ~w & 0x8080808080808080ULL) | (w & 0x8080808080808080ULL);
        at = (at - 0x0101010101010101ULL) & ~at & 0x8080808080808080ULL; /* '@' (the first exact) */
        if (stop == 0) {
            f |= at ? WC_AT : 0;
            j += 8;
            continue;
        }
        int before = first_flagged_byte(stop);
        f |= at & ((((uint64_t)1) << (8 * before)) - 1) ? WC_AT : 0;
        j += before;
        break;
    }
    while (j < len && !((c = word_class[s[j]]) & WC_SPACE)) {
        f |= c;
        j++;
    }
    Py_ssize_t b = j;
    while (a < b && s[a] < 128 && is_punct[s[a]]) {
        a++;
    }
    while (b > a && s[b - 1] < 128 && is_punct[s[b - 1]]) {
        b--;
    }
    *i = j, *start = a, *end = b, *flags = f;
    return 1;
}

/* next_word_flags without the flags. */
static inline int
next_word(const Py_UCS1 *s, Py_ssize_t len, Py_ssize_t *i, Py_ssize_t *start, Py_ssize_t *end)
{
    unsigned flags;
    return next_word_flags(s, len, i, start, end, &flags);
}

/* next_word over the characters of a str of any kind (white space: str.split()'s, also
 * beyond ASCII; text._PUNCT, ASCII, stripped from both ends). */
static inline int
next_wide_word(int kind, const void *data, Py_ssize_t len, Py_ssize_t *i, Py_ssize_t *start,
               Py_ssize_t *end)
{
#define WIDE_SPACE(c) ((c) < 128 ? is_space[(c)] : Py_UNICODE_ISSPACE(c))
#define WIDE_PUNCT(j) (PyUnicode_READ(kind, data, (j)) < 128 && is_punct[PyUnicode_READ(kind, data, (j))])
    Py_ssize_t j = *i;
    while (j < len && WIDE_SPACE(PyUnicode_READ(kind, data, j))) {
        j++;
    }
    if (j >= len) {
        *i = j;
        return 0;
    }
    Py_ssize_t a = j;
    while (j < len && !WIDE_SPACE(PyUnicode_READ(kind, data, j))) {
        j++;
    }
    Py_ssize_t b = j;
    while (a < b && WIDE_PUNCT(a)) {
        a++;
    }
    while (b > a && WIDE_PUNCT(b - 1)) {
        b--;
    }
#undef WIDE_SPACE
#undef WIDE_PUNCT
    *i = j, *start = a, *end = b;
    return 1;
}

static PyObject *
ascii_str(const Py_UCS1 *data, Py_ssize_t n)
{
    PyObject *s = PyUnicode_New(n, 127);
    if (s != NULL && n > 0) {
        memcpy(PyUnicode_1BYTE_DATA(s), data, (size_t)n);
    }
    return s;
}

/* Append the tokens of the stripped word text[start:end] (any str kind) to out: the word
 * token, then "8bit%:<share>" for a word with non-ASCII characters (WordRules._odd_tokens). */
static int
append_word_tokens(PyObject *text, int kind, const void *data, Py_ssize_t start, Py_ssize_t end,
                   Py_ssize_t max_len, PyObject *out)
{
    Py_ssize_t n = end - start, ats = 0, first_at = -1, high = 0;
    int dot = 0;
    for (Py_ssize_t i = start; i < end; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c == '@') {
            if (ats++ == 0) {
                first_at = i;
            }
        }
        else if (c == '.') {
            dot = 1;
        }
        else if (c >= 128) {
            high++;
        }
    }
    PyObject *token;
    int email = ats == 1 && (n <= max_len || (dot && n < 60));
    if (email) {
        PyObject *domain = PyUnicode_Substring(text, first_at + 1, end);
        if (domain == NULL) {
            return -1;
        }
        token = PyUnicode_FromFormat("email:%U", domain);
        Py_DECREF(domain);
    }
    else if (n > max_len) {
        token = PyUnicode_FromFormat("skip:%c %zd", (int)PyUnicode_READ(kind, data, start),
                                     n / 10 * 10);
    }
    else {
        token = PyUnicode_Substring(text, start, end);
    }
    if (token == NULL) {
        return -1;
    }
    int rc = PyList_Append(out, token);
    Py_DECREF(token);
    if (rc < 0 || high == 0 || (n <= max_len && ats == 1)) {
        return rc;
    }
    /* int(high * 10 / len(w) + 0.5) * 10, in the same double arithmetic as Python's */
    long share = (long)((double)(high * 10) / (double)n + 0.5) * 10;
    token = PyUnicode_FromFormat("8bit%%:%ld", share);
    if (token == NULL) {
        return -1;
    }
    rc = PyList_Append(out, token);
    Py_DECREF(token);
    return rc;
}

static PyObject *
word_tokens(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "word_tokens(text, min_len, max_len, out) takes 4 arguments");
        return NULL;
    }
    PyObject *text = args[0], *out = args[3];
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "word_tokens: text must be a str");
        return NULL;
    }
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "word_tokens: out must be a list");
        return NULL;
    }
    Py_ssize_t min_len = PyLong_AsSsize_t(args[1]);
    if (min_len == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t max_len = PyLong_AsSsize_t(args[2]);
    if (max_len == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(text), i = 0;
    /* Two loops over the same rules: ASCII text (the common case) as bytes, with the
     * common word made in place; any other text through PyUnicode_READ. */
    if (PyUnicode_IS_ASCII(text)) {
        const Py_UCS1 *s = PyUnicode_1BYTE_DATA(text);
        Py_ssize_t start, end;
        while (next_word(s, len, &i, &start, &end)) {
            Py_ssize_t n = end - start;
            if (n == 0 || n < min_len) {
                continue;  /* (an empty word: only white space or punctuation) */
            }
            if (n > max_len || memchr(s + start, '@', (size_t)n) != NULL) {
                /* long, or an address: the rules for any word (rare) */
                if (append_word_tokens(text, PyUnicode_1BYTE_KIND, s, start, end, max_len, out) < 0) {
                    return NULL;
                }
                continue;
            }
            PyObject *token = ascii_str(s + start, n);  /* kept as it is: the common case */
            if (token == NULL) {
                return NULL;
            }
            int rc = PyList_Append(out, token);
            Py_DECREF(token);
            if (rc < 0) {
                return NULL;
            }
        }
        Py_RETURN_NONE;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t start, end;
    while (next_wide_word(kind, data, len, &i, &start, &end)) {
        if (end == start || end - start < min_len) {
            continue;
        }
        if (append_word_tokens(text, kind, data, start, end, max_len, out) < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ value_words
 *
 * value_words(text, prefix, min_len, max_len, lower, separators) -> tuple, or None: the
 * word tokens of a header value after mail_headers._SUBJECT_SPLIT made each run of its
 * separators (`separators`, ASCII, and white space) one space, each with `prefix` in
 * front: HeaderTokenizer.value_tokens' rules for subjects and the like (lower: the text
 * lower-cased first, which keeps Latin-1 text Latin-1). A run of spaces splits words as
 * one does, so the separators are simply made spaces here and word_tokens does the rest.
 * None for text beyond Latin-1 (the caller runs the regex). */
static unsigned char latin1_lower[256];

static PyObject *
value_words(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1]) || !PyUnicode_Check(args[5])
            || !PyUnicode_IS_ASCII(args[5])) {
        PyErr_SetString(PyExc_TypeError, "value_words(text, prefix, min_len, max_len, lower, separators): "
                        "two str, two ints, a bool and an ASCII str");
        return NULL;
    }
    int lower = PyObject_IsTrue(args[4]);
    if (lower < 0) {
        return NULL;
    }
    PyObject *text = args[0];
    if (PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND) {
        Py_RETURN_NONE;
    }
    unsigned char sep[128] = {0};
    const Py_UCS1 *sp = PyUnicode_1BYTE_DATA(args[5]);
    for (Py_ssize_t k = 0; k < PyUnicode_GET_LENGTH(args[5]); k++) {
        sep[sp[k]] = 1;
    }
    const Py_UCS1 *p = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_UCS1 small[512], *buf = n <= (Py_ssize_t)sizeof small ? small : PyMem_Malloc((size_t)n + 1);
    if (buf == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS1 c = p[i];
        buf[i] = (c < 128 && sep[c]) || is_space1[c] ? ' ' : (lower ? latin1_lower[c] : c);
    }
    PyObject *spaced = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, buf, n);
    if (buf != small) {
        PyMem_Free(buf);
    }
    PyObject *words = spaced == NULL ? NULL : PyList_New(0);
    if (words == NULL) {
        Py_XDECREF(spaced);
        return NULL;
    }
    PyObject *argv[4] = {spaced, args[2], args[3], words};
    PyObject *r = word_tokens(module, argv, 4);
    Py_DECREF(spaced);
    if (r == NULL) {
        Py_DECREF(words);
        return NULL;
    }
    Py_DECREF(r);
    Py_ssize_t count = PyList_GET_SIZE(words);
    PyObject *out = PyTuple_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *token = PyUnicode_Concat(args[1], PyList_GET_ITEM(words, i));
        if (token == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, token);
    }
    Py_DECREF(words);
    return out;
}

/* ------------------------------------------------------------------ token hash cache
 *
 * token -> its 64-bit stable hash, for streamnb.features.hashing; a token not in the
 * table is hashed by the Python function given to hash_cache_init (hashing._blake64,
 * hashlib's keyed BLAKE2b), the one definition of the hash. The Python table is a dict:
 * a lookup of a token that arrives as a fresh str object reads the dict's index, its
 * entry, the stored key (to compare the text) and the stored int, four places in memory,
 * and numpy then converts the int. Here a slot holds a 64-bit key of the token and its
 * stable hash side by side: 16 bytes in one place in memory (8 MB for the default
 * capacity, at most half full), and the result goes straight into a uint64 array.
 * Bounded like the Python cache: emptied when it holds `capacity` tokens.
 *
 * The key (table_key) is computed on the characters as a str stores them (one byte a
 * character for Latin-1 text, 2 or 4 for the rest; a str always takes the narrowest), so
 * that a str token and the same token's bytes give the same key without making a str:
 * an ASCII token's UTF-8 bytes are its one-byte characters. A token of at most 7 one-byte
 * characters is its key, exactly (its bytes and its length packed in 64 bits): about 60%
 * of a mail's tokens, no two alike. Any other token's key is a polynomial hash modulo
 * the prime 2**61 - 1 of its 7-byte chunks, its length and width in front, at a point
 * drawn per process: two distinct tokens of at most L chunks get the same key with a
 * probability of at most L / 2**61 (far below the 2**-bits of two tokens sharing a bucket,
 * which feature hashing accepts). Both are then multiplied by an odd number drawn per
 * process and rotated (a bijection, so keys stay distinct), so that a key's low bits,
 * its slot, are the high bits of that product: multiply-shift hashing, whose slots
 * another process's keys do not predict (the two numbers are drawn from the process's
 * str hash secret: random per process, fixed by PYTHONHASHSEED as str hashes are).
 * Two tokens are taken for the same one only if their keys are equal. A key takes a few
 * instructions a short token, where SipHash (the str hash) would take about a hundred.
 */
typedef struct {
    uint64_t key; /* table_key of the token (never 0); 0: empty slot */
    uint64_t value;
} slot_t;

static slot_t *slots = NULL;
static size_t n_slots = 0, n_used = 0, capacity = 0;
static PyObject *miss_fn = NULL;

/* The str hash of the bytes p[0:n] (SipHash keyed by the process's secret). Python 3.14
 * names the function Py_HashBuffer; 3.11-3.13 export it as _Py_HashBytes. */
#if PY_VERSION_HEX >= 0x030E0000
#define STR_HASH_OF_BYTES(p, n) Py_HashBuffer((p), (n))
#else
#define STR_HASH_OF_BYTES(p, n) _Py_HashBytes((p), (n))
#endif

#define P61 ((((uint64_t)1) << 61) - 1)
#define LOW56 ((((uint64_t)1) << 56) - 1)
#define HIGH_BITS7 0x0080808080808080ULL /* the high bit of each of 7 bytes */
/* The process's draws (hash_cache_init): the odd multiplier, the polynomial's point in
 * 1..2**61-2, and the rotation (log2 of the number of slots). */
static uint64_t key_mul = 0x9E3779B97F4A7C15ULL, key_point = 0x1234567ULL;
static int key_rot = 1;

static inline uint64_t
load_le64(const unsigned char *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static inline uint64_t
load_le32(const unsigned char *p)
{
    uint32_t w;
    memcpy(&w, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap32(w);
#endif
    return w;
}

/* p[0:n], n <= 7, as a little-endian integer (two overlapping loads: the bytes they
 * share are the same). */
static inline uint64_t
load_small(const unsigned char *p, Py_ssize_t n)
{
    if (n >= 4) {
        return load_le32(p) | (load_le32(p + n - 4) << (8 * (n - 4)));
    }
    if (n > 0) {
        return (uint64_t)p[0] | ((uint64_t)p[n >> 1] << (8 * (n >> 1))) | ((uint64_t)p[n - 1] << (8 * (n - 1)));
    }
    return 0;
}

/* a * b modulo 2**61 - 1, a < 2**62 and b < 2**61, reduced to below 2**62. */
static inline uint64_t
mul_mod61(uint64_t a, uint64_t b)
{
#ifdef __SIZEOF_INT128__
    __uint128_t m = (__uint128_t)a * b;
    uint64_t lo = (uint64_t)m & P61, hi = (uint64_t)(m >> 61);
#else
    uint64_t a0 = a & 0xFFFFFFFFULL, a1 = a >> 32, b0 = b & 0xFFFFFFFFULL, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (p01 & 0xFFFFFFFFULL) + (p10 & 0xFFFFFFFFULL);
    uint64_t low = (mid << 32) | (p00 & 0xFFFFFFFFULL);
    uint64_t high = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
    uint64_t lo = low & P61, hi = (low >> 61) | (high << 3);
#endif
    uint64_t r = lo + hi;
    return (r & P61) + (r >> 61);
}

/* The polynomial key's value reduced modulo 2**61 - 1, its top bit set (a long token's
 * key: a short token's has the top bit clear). */
static inline uint64_t
long_key(uint64_t acc)
{
    acc = (acc & P61) + (acc >> 61);
    acc = acc >= P61 ? acc - P61 : acc;
    return acc | ((uint64_t)1 << 63);
}

/* A key mixed by the process's multiplier and rotation; never 0 (which marks an empty
 * slot) nor ~0 (an odd word). */
static inline uint64_t
mixed_key(uint64_t x)
{
    x *= key_mul;
    x = (x << key_rot) | (x >> (64 - key_rot));
    return x == 0 || x == ~(uint64_t)0 ? 2 : x;
}

/* The table's key of a token whose characters, `kind` bytes each, are p[0:n] (n bytes);
 * with *seen, the bytes read ORed (their high bits say whether the token is ASCII). */
static inline uint64_t
table_key(const unsigned char *p, Py_ssize_t n, int kind, uint64_t *seen)
{
    uint64_t x;
    if (kind == 1 && n <= 7) {
        x = load_small(p, n);
        *seen = x;
        x |= (uint64_t)n << 56;  /* (the top bit stays 0) */
    }
    else {
        uint64_t acc = ((uint64_t)n << 2) | (uint64_t)kind, bits = 0, w;
        Py_ssize_t i = 0;
        for (; n - i > 7; i += 7) {
            w = load_le64(p + i) & LOW56;
            bits |= w;
            acc = mul_mod61(acc, key_point) + w;
        }
        w = n >= 8 ? load_le64(p + n - 8) >> (8 * (8 - (n - i))) : load_small(p + i, n - i);
        bits |= w;
        acc = mul_mod61(acc, key_point) + w;
        *seen = bits;
        x = long_key(acc);
    }
    return mixed_key(x);
}

/* The key of one str token into *key; -1 with an exception set if it is not a str. */
static inline int
str_key(PyObject *token, uint64_t *key)
{
    if (!PyUnicode_Check(token)) {
        PyErr_Format(PyExc_TypeError, "tokens must be str, got %.100s", Py_TYPE(token)->tp_name);
        return -1;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(token) < 0) {
        return -1;
    }
#endif
    int kind = PyUnicode_KIND(token);
    uint64_t seen;
    *key = table_key((const unsigned char *)PyUnicode_DATA(token), PyUnicode_GET_LENGTH(token) * kind,
                     kind, &seen);
    return 0;
}

/* The table's key of the one-byte characters p[0:n] (a Latin-1 str's data, or an ASCII
 * token's bytes). */
static inline uint64_t
bytes_key(const unsigned char *p, Py_ssize_t n)
{
    uint64_t seen;
    return table_key(p, n, 1, &seen);
}

/* The 8 bytes of x with their ASCII upper-case letters lowered, all at once (no carry
 * crosses a byte: each sum below stays under 0x100). */
static inline uint64_t
lower_bytes8(uint64_t x)
{
    uint64_t low7 = x & 0x7F7F7F7F7F7F7F7FULL;
    uint64_t from_a = low7 + 0x3F3F3F3F3F3F3F3FULL;  /* high bit: low7 >= 'A' */
    uint64_t past_z = low7 + 0x2525252525252525ULL;  /* high bit: low7 > 'Z' */
    uint64_t upper = from_a & ~past_z & ~x & 0x8080808080808080ULL;
    return x | (upper >> 2);  /* (0x80 >> 2 is 0x20) */
}

/* bytes_key of p[0:n] lower-cased (the ASCII letters), without a copy: table_key's loads,
 * each lowered as it is read (lowering a byte does not move it, and 0 stays 0). */
static inline uint64_t
lower_bytes_key(const unsigned char *p, Py_ssize_t n)
{
    uint64_t x;
    if (n <= 7) {
        x = lower_bytes8(load_small(p, n)) | (uint64_t)n << 56;
    }
    else {
        uint64_t acc = ((uint64_t)n << 2) | 1, w;
        Py_ssize_t i = 0;
        for (; n - i > 7; i += 7) {
            w = lower_bytes8(load_le64(p + i) & LOW56);
            acc = mul_mod61(acc, key_point) + w;
        }
        w = lower_bytes8(load_le64(p + n - 8) >> (8 * (8 - (n - i))));
        acc = mul_mod61(acc, key_point) + w;
        x = long_key(acc);
    }
    return mixed_key(x);
}

static PyObject *
hash_cache_init(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "hash_cache_init(capacity, miss) takes 2 arguments");
        return NULL;
    }
    Py_ssize_t cap = PyLong_AsSsize_t(args[0]);
    if (cap == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (cap < 1 || cap > ((Py_ssize_t)1 << 28)) {
        PyErr_SetString(PyExc_ValueError, "hash_cache_init: capacity must be in 1..2**28");
        return NULL;
    }
    if (!PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "hash_cache_init: miss must be callable");
        return NULL;
    }
    size_t want = 2;
    int rot = 1;
    while (want < 2 * (size_t)cap) {
        want <<= 1; /* a power of two, at most half full */
        rot++;
    }
    slot_t *fresh = PyMem_Calloc(want, sizeof(slot_t));
    if (fresh == NULL) {
        return PyErr_NoMemory();
    }
    PyMem_Free(slots);
    slots = fresh;
    n_slots = want;
    n_used = 0;
    capacity = (size_t)cap;
    key_rot = rot;
    key_mul = (uint64_t)STR_HASH_OF_BYTES("streamnb table: multiplier", 26) | 1;
    key_point = (uint64_t)STR_HASH_OF_BYTES("streamnb table: point", 21) % (P61 - 2) + 1;
    Py_INCREF(args[1]);
    Py_XSETREF(miss_fn, args[1]);
    Py_RETURN_NONE;
}

static PyObject *
hash_cache_clear(PyObject *module, PyObject *unused)
{
    if (slots != NULL) {
        memset(slots, 0, n_slots * sizeof(slot_t));
    }
    n_used = 0;
    Py_RETURN_NONE;
}

static PyObject *
hash_cache_len(PyObject *module, PyObject *unused)
{
    return PyLong_FromSize_t(n_used);
}

/* The slot that holds `key`, or the empty one where it would go. */
static inline size_t
find_slot(uint64_t key)
{
    size_t mask = n_slots - 1, i = (size_t)key & mask;
    while (slots[i].key != 0 && slots[i].key != key) {
        i = (i + 1) & mask;
    }
    return i;
}

/* A token's stable hash, computed by the miss function (hashing._blake64: hashlib's
 * keyed BLAKE2b). -1 with an exception set on error. */
static int
stable_hash(PyObject *token, uint64_t *value)
{
    PyObject *r = PyObject_CallOneArg(miss_fn, token);
    if (r == NULL) {
        return -1;
    }
    uint64_t v = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (v == (uint64_t)-1 && PyErr_Occurred()) {
        return -1;
    }
    *value = v;
    return 0;
}

/* The stable hash of the str `token`, whose table key is `key`, into *value. */
static int
cached_hash_of(PyObject *token, uint64_t key, uint64_t *value)
{
    size_t i = find_slot(key);
    if (slots[i].key == key) {
        *value = slots[i].value;
        return 0;
    }
    uint64_t v;
    if (stable_hash(token, &v) < 0) {
        return -1;
    }
    /* The miss function ran Python code (another thread may have used the table, or a
     * test re-made it): find the slot again. */
    if (n_used >= capacity) { /* full: start again (hot tokens come back) */
        memset(slots, 0, n_slots * sizeof(slot_t));
        n_used = 0;
    }
    i = find_slot(key);
    if (slots[i].key == key) {
        *value = v;
        return 0;
    }
    slots[i].key = key;
    slots[i].value = v;
    n_used++;
    *value = v;
    return 0;
}

/* The stable hash of one str token into *value; -1 with an exception set on error. */
static int
cached_hash(PyObject *token, uint64_t *value)
{
    uint64_t key;
    return str_key(token, &key) < 0 ? -1 : cached_hash_of(token, key, value);
}

/* The stable hash of the token whose characters are the Latin-1 s[0:n] (one byte each:
 * the str's key is computed on them), into *value; a str is made only on a miss. */
static int
latin1_hash(const Py_UCS1 *s, Py_ssize_t n, uint64_t *value)
{
    uint64_t key = bytes_key(s, n);
    size_t k = find_slot(key);
    if (slots[k].key == key) {
        *value = slots[k].value;
        return 0;
    }
    PyObject *token = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, s, n);
    int rc = token == NULL ? -1 : cached_hash_of(token, key, value);
    Py_XDECREF(token);
    return rc;
}

static PyObject *
hash_one(PyObject *module, PyObject *token)
{
    uint64_t value;
    if (slots == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "hash_one: call hash_cache_init first");
        return NULL;
    }
    if (cached_hash(token, &value) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(value);
}

#define HASH_BLOCK 16
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif

/* s[0:n] (ASCII) as a str, its upper-case letters lowered (str.lower on ASCII text). */
static PyObject *
ascii_lower_str(const Py_UCS1 *s, Py_ssize_t n)
{
    PyObject *out = PyUnicode_New(n, 127);
    if (out != NULL) {
        Py_UCS1 *q = PyUnicode_1BYTE_DATA(out);
        for (Py_ssize_t i = 0; i < n; i++) {
            q[i] = lower1(s[i]);
        }
    }
    return out;
}

/* "lower" (interned at import, with the other names the functions below call by). */
static PyObject *S_lower;

/* The end of word_hashes and wide_word_hashes: `out` cut to the `count` hashes appended
 * after its first `before` bytes, their count returned; or, `failed` (an exception set),
 * `out` back to `before` bytes (nothing appended) and NULL. `odd` (or NULL) released. */
static PyObject *
hashes_appended(PyObject *out, Py_ssize_t before, Py_ssize_t count, PyObject *odd, int failed)
{
    Py_XDECREF(odd);
    if (!failed) {
        if (PyByteArray_Resize(out, before + 8 * count) < 0) {
            return NULL;
        }
        return PyLong_FromSsize_t(count);
    }
    if (PyByteArray_GET_SIZE(out) >= before) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (PyByteArray_Resize(out, before) < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(type, value, traceback);
    }
    return NULL;
}

/* word_hashes of a str beyond Latin-1 (two or four bytes a character): the same tokens,
 * hashed, as WordRules.words gives (text.lower() then word_tokens) and hash_lists hashes.
 * Words are split at white space and stripped as word_tokens does; an ASCII word is
 * lower-cased and hashed on its bytes (its str's hash), any other word goes through
 * str.lower alone and append_word_tokens, its length (min_len) taken after lower-casing
 * (one character may lower-case to two). str.lower of the whole text is that of each word:
 * white space neither is nor becomes another character, and the final sigma's context
 * ends at white space. One word at a time (these texts are rare: no block prefetching). */
static PyObject *
wide_word_hashes(PyObject *text, Py_ssize_t min_len, Py_ssize_t max_len, PyObject *out, int lower)
{
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t len = PyUnicode_GET_LENGTH(text), i = 0, count = 0;
    Py_ssize_t before = PyByteArray_GET_SIZE(out);
    Py_ssize_t most = len / 2 + 1; /* as in word_hashes */
    if (most > (PY_SSIZE_T_MAX - before) / 16 || PyByteArray_Resize(out, before + 16 * most) < 0) {
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    PyObject *odd = PyList_New(0);
    if (odd == NULL) {
        goto fail;
    }
    Py_UCS1 lowered[64];
    Py_ssize_t start, end;
    while (next_wide_word(kind, data, len, &i, &start, &end)) {
        Py_ssize_t n = end - start;
        if (n == 0) {
            continue;
        }
        int plain = n <= max_len && n <= (Py_ssize_t)sizeof lowered;
        for (Py_ssize_t k = 0; plain && k < n; k++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, start + k);
            if (c >= 128 || c == '@') {
                plain = 0;
            }
            else {
                lowered[k] = lower ? lower1((Py_UCS1)c) : (Py_UCS1)c;
            }
        }
        if (plain) { /* ASCII, no '@', not too long: the word itself, hashed on its bytes */
            if (n < min_len) {
                continue;
            }
            uint64_t key = bytes_key(lowered, n), value;
            size_t k = find_slot(key);
            if (slots[k].key == key) {
                value = slots[k].value;
            }
            else {
                PyObject *token = ascii_str(lowered, n);
                int rc = token == NULL ? -1 : cached_hash_of(token, key, &value);
                Py_XDECREF(token);
                if (rc < 0) {
                    goto fail;
                }
            }
            ((uint64_t *)(void *)(PyByteArray_AS_STRING(out) + before))[count++] = value;
            continue;
        }
        PyObject *word = PyUnicode_Substring(text, start, end);
        PyObject *low = word == NULL || !lower ? word : PyObject_CallMethodNoArgs(word, S_lower);
        if (low != word) {
            Py_XDECREF(word);
        }
        if (low == NULL) {
            goto fail;
        }
        int rc = PyUnicode_GET_LENGTH(low) < min_len ? 0
            : append_word_tokens(low, PyUnicode_KIND(low), PyUnicode_DATA(low), 0, PyUnicode_GET_LENGTH(low),
                                 max_len, odd);
        Py_DECREF(low);
        if (rc < 0) {
            goto fail;
        }
        for (Py_ssize_t t = 0; t < PyList_GET_SIZE(odd); t++) {
            uint64_t value;
            if (cached_hash(PyList_GET_ITEM(odd, t), &value) < 0) {
                goto fail;
            }
            ((uint64_t *)(void *)(PyByteArray_AS_STRING(out) + before))[count++] = value;
        }
        if (PyList_SetSlice(odd, 0, PyList_GET_SIZE(odd), NULL) < 0) {
            goto fail;
        }
    }
    return hashes_appended(out, before, count, odd, 0);
fail:
    return hashes_appended(out, before, count, odd, 1);
}

/* ------------------------------------------------------------------ word_hashes
 *
 * word_hashes(text, min_len, max_len, out[, lower]) -> int: the stable hashes of the
 * tokens word_tokens gives for a str (of text.lower() with `lower`), in order, appended
 * to the bytearray `out` as native uint64; returns how many. The same values as
 * hash_lists over those tokens, without making a str of the common word (one kept as it
 * is, all ASCII): its table key is computed on its bytes (which are the one-byte str's
 * characters) and looked up in the table, a block of words at a time with
 * their slots fetched ahead as hash_lists does; a str is made only on a miss, and for
 * the odd words (long, with an '@' or with characters beyond ASCII). Text beyond Latin-1
 * takes wide_word_hashes (above), the same tokens. With `lower`, the tokens of the text lower-cased
 * (str.lower, which keeps Latin-1 text Latin-1, one character for one): the common word
 * lower-cased as it is hashed (lower_bytes_key), the odd ones by str.lower. */
/* The tokens of an odd word of Latin-1 text, w[0:n] (too long, with an '@' or beyond
 * ASCII), hashed into values[0:2] on their
 * characters as append_word_tokens makes them (WordRules._odd_tokens of the word, lower-cased
 * first with `lower`: str.lower keeps Latin-1 text Latin-1, one character for one): the
 * word token ("email:<domain>", "skip:<first> <length>" or the word), then "8bit%:<share>"
 * for a word with non-ASCII characters. Returns how many (1 or 2), or 0 when a token is
 * longer than the buffer here (the caller makes the word a str). */
static int
odd_word_hashes(const Py_UCS1 *w, Py_ssize_t n, Py_ssize_t max_len, int lower, uint64_t values[2])
{
    Py_UCS1 t[96];
    Py_ssize_t ats = 0, first_at = -1, high = 0, len;
    int dot = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS1 c = w[i];
        if (c == '@') {
            if (ats++ == 0) {
                first_at = i;
            }
        }
        else if (c == '.') {
            dot = 1;
        }
        else if (c >= 128) {
            high++;
        }
    }
    if (ats == 1 && (n <= max_len || (dot && n < 60))) {
        Py_ssize_t d = n - first_at - 1;
        if (6 + d > (Py_ssize_t)sizeof t) {
            return 0;
        }
        memcpy(t, "email:", 6);
        for (Py_ssize_t k = 0; k < d; k++) {
            t[6 + k] = lower ? latin1_lower[w[first_at + 1 + k]] : w[first_at + 1 + k];
        }
        len = 6 + d;
    }
    else if (n > max_len) {
        char digits[24];
        int nd = 0;
        size_t tens = (size_t)(n / 10 * 10);
        do {
            digits[nd++] = (char)('0' + tens % 10);
            tens /= 10;
        } while (tens > 0);
        memcpy(t, "skip:", 5);
        t[5] = lower ? latin1_lower[w[0]] : w[0];
        t[6] = ' ';
        for (int k = 0; k < nd; k++) {
            t[7 + k] = (Py_UCS1)digits[nd - 1 - k];
        }
        len = 7 + nd;
    }
    else {
        if (n > (Py_ssize_t)sizeof t) {
            return 0;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            t[k] = lower ? latin1_lower[w[k]] : w[k];
        }
        len = n;
    }
    if (latin1_hash(t, len, &values[0]) < 0) {
        return -1;
    }
    if (high == 0 || (n <= max_len && ats == 1)) {
        return 1;
    }
    /* int(high * 10 / len(w) + 0.5) * 10, in the same double arithmetic as Python's */
    long share = (long)((double)(high * 10) / (double)n + 0.5) * 10;
    char buf[32];
    int m = snprintf(buf, sizeof buf, "8bit%%:%ld", share);
    return latin1_hash((const Py_UCS1 *)buf, m, &values[1]) < 0 ? -1 : 2;
}

static PyObject *
word_hashes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if ((nargs != 4 && nargs != 5) || !PyUnicode_Check(args[0]) || !PyByteArray_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "word_hashes(text, min_len, max_len, out[, lower]): a str, two "
                        "ints and a bytearray");
        return NULL;
    }
    int lower = nargs == 5 ? PyObject_IsTrue(args[4]) : 0;
    if (lower < 0) {
        return NULL;
    }
    if (slots == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "word_hashes: call hash_cache_init first");
        return NULL;
    }
    PyObject *text = args[0], *out = args[3];
    Py_ssize_t min_len = PyLong_AsSsize_t(args[1]), max_len = PyLong_AsSsize_t(args[2]);
    if ((min_len == -1 || max_len == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (min_len < 1) {
        PyErr_SetString(PyExc_ValueError, "word_hashes: min_len must be at least 1");
        return NULL;
    }
    if (PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND) {
        return wide_word_hashes(text, min_len, max_len, out, lower);
    }
    const Py_UCS1 *s = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t len = PyUnicode_GET_LENGTH(text), i = 0, count = 0;
    Py_ssize_t before = PyByteArray_GET_SIZE(out);
    /* room for every token: a word that gives tokens and the white space after it take
     * min_len + 1 characters at least, and a word gives at most two tokens (the second,
     * 8bit%, only for a word with a character beyond ASCII) */
    Py_ssize_t most = (PyUnicode_IS_ASCII(text) ? 1 : 2) * ((len + 1) / (min_len + 1) + 1);
    if (most > (PY_SSIZE_T_MAX - before) / 8 || PyByteArray_Resize(out, before + 8 * most) < 0) {
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    PyObject *odd = NULL;
    Py_ssize_t w_start[HASH_BLOCK], w_end[HASH_BLOCK];
    Py_hash_t w_hash[HASH_BLOCK];
    while (i < len) {
        int b = 0;
        Py_ssize_t start, end;
        unsigned flags;
        while (b < HASH_BLOCK && next_word_flags(s, len, &i, &start, &end, &flags)) {  /* the next block */
            Py_ssize_t n = end - start;
            if (n < min_len) {
                continue;
            }
            w_start[b] = start;
            w_end[b] = end;
            if (n > max_len || (flags & (WC_AT | WC_HIGH))) {
                w_hash[b] = -1;  /* an odd word (no table key is -1) */
            }
            else {
                w_hash[b] = (Py_hash_t)(lower ? lower_bytes_key(s + start, n) : bytes_key(s + start, n));
                PREFETCH(&slots[(size_t)w_hash[b] & (n_slots - 1)]);
            }
            b++;
        }
        for (int w = 0; w < b; w++) {  /* their lookups, in order */
            /* (a miss runs Python code, which could resize `out`: its address is read
             * again after one) */
            uint64_t *dst = (uint64_t *)(void *)(PyByteArray_AS_STRING(out) + before);
            Py_ssize_t start = w_start[w], n = w_end[w] - start;
            Py_hash_t h = w_hash[w];
            if (h == -1) {
                uint64_t values[2];
                int made = odd_word_hashes(s + start, n, max_len, lower, values);
                if (made < 0) {
                    goto fail;
                }
                for (int t = 0; t < made; t++) { /* (a miss ran Python code: `out` read again) */
                    ((uint64_t *)(void *)(PyByteArray_AS_STRING(out) + before))[count++] = values[t];
                }
                if (made > 0) {
                    continue;
                }
                if (odd == NULL && (odd = PyList_New(0)) == NULL) {
                    goto fail;
                }
                if (lower) {  /* the word lower-cased by str.lower, then its tokens */
                    PyObject *word = PyUnicode_Substring(text, start, w_end[w]);
                    PyObject *low = word == NULL ? NULL : PyObject_CallMethodNoArgs(word, S_lower);
                    Py_XDECREF(word);
                    int rc = low == NULL ? -1 : append_word_tokens(low, PyUnicode_KIND(low), PyUnicode_DATA(low), 0,
                                                                   PyUnicode_GET_LENGTH(low), max_len, odd);
                    Py_XDECREF(low);
                    if (rc < 0) {
                        goto fail;
                    }
                }
                else if (append_word_tokens(text, PyUnicode_1BYTE_KIND, s, start, w_end[w], max_len, odd) < 0) {
                    goto fail;
                }
                for (Py_ssize_t t = 0; t < PyList_GET_SIZE(odd); t++) {
                    uint64_t value;
                    if (cached_hash(PyList_GET_ITEM(odd, t), &value) < 0) {
                        goto fail;
                    }
                    ((uint64_t *)(void *)(PyByteArray_AS_STRING(out) + before))[count++] = value;
                }
                if (PyList_SetSlice(odd, 0, PyList_GET_SIZE(odd), NULL) < 0) {
                    goto fail;
                }
                continue;
            }
            uint64_t key = (uint64_t)h;
            size_t k = find_slot(key);
            if (slots[k].key == key) {
                dst[count++] = slots[k].value;
                continue;
            }
            /* a miss: the token as a str, which the miss function hashes */
            PyObject *token = lower ? ascii_lower_str(s + start, n) : ascii_str(s + start, n);
            uint64_t value;
            int rc = token == NULL ? -1 : cached_hash_of(token, key, &value);
            Py_XDECREF(token);
            if (rc < 0) {
                goto fail;
            }
            ((uint64_t *)(void *)(PyByteArray_AS_STRING(out) + before))[count++] = value;
        }
    }
    return hashes_appended(out, before, count, odd, 0);
fail:
    return hashes_appended(out, before, count, odd, 1);
}

/* hash_lists(lists, out): the stable hashes of the str tokens of every list (or tuple) in
 * the list `lists` (each a sequence), one after the other, written into `out` (a writable buffer of exactly
 * that many uint64). */
static PyObject *
hash_lists(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "hash_lists(lists, out) takes 2 arguments");
        return NULL;
    }
    if (slots == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "hash_lists: call hash_cache_init first");
        return NULL;
    }
    PyObject *lists = args[0];
    if (!PyList_Check(lists)) {
        PyErr_SetString(PyExc_TypeError, "hash_lists: lists must be a list");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    uint64_t *out = (uint64_t *)view.buf;
    Py_ssize_t room = view.len / (Py_ssize_t)sizeof(uint64_t), k = 0;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(lists); j++) {
        PyObject *tokens = PySequence_Fast(PyList_GET_ITEM(lists, j),
                                           "hash_lists: each item must be a sequence of str");
        if (tokens == NULL) {
            goto fail;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
        PyObject **items = PySequence_Fast_ITEMS(tokens);
        if (n > room - k) {
            Py_DECREF(tokens);
            PyErr_SetString(PyExc_ValueError, "hash_lists: out is too small");
            goto fail;
        }
        /* A block of tokens at a time: their table keys first, each slot's cache line
         * fetched meanwhile, then the lookups (the table is larger than the CPU caches:
         * one memory access per token, overlapped this way). */
        uint64_t h[HASH_BLOCK];
        for (Py_ssize_t b = 0; b < n; b += HASH_BLOCK) {
            Py_ssize_t len = n - b < HASH_BLOCK ? n - b : HASH_BLOCK;
            for (Py_ssize_t t = 0; t < len; t++) {
                if (str_key(items[b + t], &h[t]) < 0) {
                    Py_DECREF(tokens);
                    goto fail;
                }
                PREFETCH(&slots[(size_t)h[t] & (n_slots - 1)]);
            }
            for (Py_ssize_t t = 0; t < len; t++) {
                if (cached_hash_of(items[b + t], h[t], &out[k++]) < 0) {
                    Py_DECREF(tokens);
                    goto fail;
                }
            }
        }
        Py_DECREF(tokens);
    }
    PyBuffer_Release(&view);
    if (k != room) {
        PyErr_SetString(PyExc_ValueError, "hash_lists: out is larger than the tokens");
        return NULL;
    }
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------ unique_buckets
 *
 * unique_buckets(hashes, sizes, bits, out, counts): TokenHasher.unique_buckets_many in
 * one pass. `hashes` holds lists of 64-bit token hashes end to end (uint64), `sizes[i]`
 * (int64) of them for list i. Each list's buckets (hash & (2**bits - 1)) are sorted and
 * made distinct, and written one list after the other into `out` (int32, room for all
 * the hashes); `counts[i]` (int64) gets the number of distinct buckets of list i.
 * numpy sorts the whole batch (list number << bits | bucket) at about 30 ns a key; here a
 * list's distinct buckets are found first (a set of open addressing), and only those,
 * about a third of a mail's tokens, are sorted: a short list by insertion, a list of up
 * to SORT_BUCKETS_MAX keys by one counting pass on its top bits (about one key a bucket:
 * buckets are hash bits, spread evenly) and an insertion sort of the nearly sorted result,
 * a longer one (or one whose keys crowd into a few buckets) by a radix sort of 8-bit digits (a digit shared by the whole list is
 * skipped), a few ns a key. The numpy code is the reference
 * (tests/streamnb/features/test_speedups.py). */
#define SORT_BUCKETS_MAX 2048
/* The most keys a bucket may hold for the insertion sort (each moves past fewer than that
 * many): more (keys chosen to share their top bits) take the radix sort, linear anyway. */
#define SORT_BUCKET_MOST 16

/* a[0:n] sorted by insertion, the keys taken in the order of src[0:n] (src may be a). */
static inline void
insertion_sort_u32(uint32_t *a, const uint32_t *src, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v = src[i];
        Py_ssize_t j = i;
        while (j > 0 && a[j - 1] > v) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

/* a[0:n], keys below 2**bits, sorted (tmp has room for n keys). */
static void
sort_u32(uint32_t *a, uint32_t *tmp, Py_ssize_t n, int bits)
{
    if (n <= 32) {
        insertion_sort_u32(a, a, n);
        return;
    }
    if (n <= SORT_BUCKETS_MAX) {
        /* 2**top buckets (top >= log2(n)) on the top bits: the keys in bucket order into
         * tmp, then sorted into a by insertion, each moving past the few of its bucket */
        int top = 5;
        while (((Py_ssize_t)1 << top) < n && top < bits) {
            top++;
        }
        top = top > bits ? bits : top;
        int shift = bits - top;
        uint32_t start[SORT_BUCKETS_MAX + 1];
        memset(start, 0, (((size_t)1 << top) + 1) * sizeof(uint32_t));
        for (Py_ssize_t i = 0; i < n; i++) {
            start[(a[i] >> shift) + 1]++;
        }
        uint32_t fullest = 0;
        for (size_t d = 0; d < ((size_t)1 << top); d++) {
            fullest = start[d + 1] > fullest ? start[d + 1] : fullest;
            start[d + 1] += start[d];
        }
        if (fullest <= SORT_BUCKET_MOST) {
            for (Py_ssize_t i = 0; i < n; i++) {
                tmp[start[a[i] >> shift]++] = a[i];
            }
            insertion_sort_u32(a, tmp, n);
            return;
        }
    }
    uint32_t *src = a, *dst = tmp;
    for (int shift = 0; shift < bits; shift += 8) {
        Py_ssize_t count[257] = {0};
        for (Py_ssize_t i = 0; i < n; i++) {
            count[((src[i] >> shift) & 0xFF) + 1]++;
        }
        if (count[((src[0] >> shift) & 0xFF) + 1] == n) {
            continue; /* one digit for the whole list: already in order on it */
        }
        for (int d = 0; d < 256; d++) {
            count[d + 1] += count[d];
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            dst[count[(src[i] >> shift) & 0xFF]++] = src[i];
        }
        uint32_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) {
        memcpy(a, src, (size_t)n * sizeof(uint32_t));
    }
}

/* The hash bits argument of `fn` into *bits (1..31); -1 with an exception set if not. */
static int
bits_argument(PyObject *arg, const char *fn, long *bits)
{
    *bits = PyLong_AsLong(arg);
    if (*bits == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*bits < 1 || *bits > 31) {
        PyErr_Format(PyExc_ValueError, "%s: bits must be in 1..31", fn);
        return -1;
    }
    return 0;
}

static PyObject *
unique_buckets(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "unique_buckets(hashes, sizes, bits, out, counts) takes 5 arguments");
        return NULL;
    }
    long bits;
    if (bits_argument(args[2], "unique_buckets", &bits) < 0) {
        return NULL;
    }
    /* hashes, sizes, out, counts */
    static const int which[4] = {0, 1, 3, 4}, writable[4] = {0, 0, 1, 1};
    Py_buffer v[4];
    if (get_buffers(args, 4, which, writable, v) < 0) {
        return NULL;
    }
    Py_buffer hv = v[0], sv = v[1], ov = v[2], cv = v[3];
    PyObject *result = NULL;
    uint32_t *work = NULL;
    const uint64_t *hashes = hv.buf;
    const int64_t *sizes = sv.buf;
    int32_t *out = ov.buf;
    int64_t *counts = cv.buf;
    Py_ssize_t n_hashes = hv.len / 8, n_lists = sv.len / 8, room = ov.len / 4;
    if (hv.itemsize != 8 || sv.itemsize != 8 || ov.itemsize != 4 || cv.itemsize != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "unique_buckets: hashes, sizes and counts take 8-byte items, out 4-byte ones");
        goto done;
    }
    if (cv.len / 8 != n_lists) {
        PyErr_SetString(PyExc_ValueError, "unique_buckets: counts must have one item per list");
        goto done;
    }
    Py_ssize_t total = 0, longest = 0;
    for (Py_ssize_t i = 0; i < n_lists; i++) {
        if (sizes[i] < 0 || sizes[i] > n_hashes - total) {
            PyErr_SetString(PyExc_ValueError, "unique_buckets: sizes do not add up to the hashes");
            goto done;
        }
        total += sizes[i];
        longest = sizes[i] > longest ? sizes[i] : longest;
    }
    if (total != n_hashes || room < total) {
        PyErr_SetString(PyExc_ValueError,
                        total != n_hashes ? "unique_buckets: sizes do not add up to the hashes"
                                          : "unique_buckets: out is too small");
        goto done;
    }
    /* the distinct buckets of a list first, in a set of open addressing (buckets are bits of
     * a hash already: the low ones pick the slot), then the sort of those alone: a message's
     * tokens repeat (a mail of 1,300 tokens has about 200 distinct buckets) */
    size_t set_size = 16;
    while (set_size < 2 * (size_t)longest) {
        set_size <<= 1;
    }
    work = PyMem_Malloc((2 * (size_t)(longest + 1) + set_size) * sizeof(uint32_t));
    if (work == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint32_t *set = work + 2 * (longest + 1);
    memset(set, 0xFF, set_size * sizeof(uint32_t));  /* 0xFFFFFFFF: an empty slot (no bucket) */
    uint32_t mask = (uint32_t)((1UL << bits) - 1), set_mask = (uint32_t)(set_size - 1);
    Py_ssize_t at = 0, written = 0;
    for (Py_ssize_t i = 0; i < n_lists; i++) {
        Py_ssize_t n = (Py_ssize_t)sizes[i], m = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            uint32_t b = (uint32_t)(hashes[at + k] & mask), j = b & set_mask;
            while (set[j] != b && set[j] != 0xFFFFFFFFu) {
                j = (j + 1) & set_mask;
            }
            if (set[j] != b) {
                set[j] = b;
                work[m++] = b;
            }
        }
        at += n;
        for (Py_ssize_t k = m - 1; k >= 0; k--) {  /* the set emptied for the next list, the
            * last inserted first (the slots before each on its probe path are still taken) */
            uint32_t j = work[k] & set_mask;
            while (set[j] != work[k]) {
                j = (j + 1) & set_mask;
            }
            set[j] = 0xFFFFFFFFu;
        }
        sort_u32(work, work + longest + 1, m, (int)bits);
        memcpy(out + written, work, (size_t)m * sizeof(uint32_t));
        counts[i] = m;
        written += m;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(work);
    release_buffers(4, v);
    return result;
}

/* ------------------------------------------------------------------ text_counts
 *
 * text_counts(text) -> (upper, letters, non_ascii, exclaim): the characters of `text`
 * for which str.isupper() and str.isalpha() are true (Py_UNICODE_ISUPPER / ISALPHA, the
 * same tests those methods make on one character), those above U+007F, and the '!' and
 * '$' characters: what MailAnalysis.add_text_stats counts in Python (its reference).
 * Latin-1 text (the common kind) takes a table of the 256 characters' classes. */
static unsigned char latin1_class[256];  /* 1: alphabetic, 2: upper-case (and alphabetic) */

static PyObject *
text_counts(PyObject *self, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "text_counts: text must be a str");
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), upper = 0, letters = 0, high = 0, exclaim = 0;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *p = (const Py_UCS1 *)data;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS1 c = p[i];
            unsigned char cls = latin1_class[c];
            letters += cls != 0;
            upper += cls >> 1;
            high += c >> 7;
            exclaim += (c == '!') | (c == '$');
        }
    }
    else {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c < 256) {
                unsigned char cls = latin1_class[c];
                letters += cls != 0;
                upper += cls >> 1;
                high += c >> 7;
                exclaim += (c == '!') | (c == '$');
            }
            else {
                letters += Py_UNICODE_ISALPHA(c) != 0;
                upper += Py_UNICODE_ISUPPER(c) != 0;
                high++;
            }
        }
    }
    return Py_BuildValue("(nnnn)", upper, letters, high, exclaim);
}

/* ------------------------------------------------------------------ url_scan
 *
 * url_scan(text, out) -> str or None: WordRules.urls for a text whose characters are all
 * Latin-1, and for any other text through a Latin-1 stand-in (latin1_stand_in; None for a
 * text it declines: the caller runs the Python code, the reference). It
 * is text._URL_SCAN.sub on the whole text, each URL replaced by one space, with its
 * "proto:<scheme>" and host_tokens("url", host) appended to out in order:
 *
 *   (?i)([hfmw])(?<!\w.)(?:((?<=h)ttps?|(?<=f)tp|(?<=m)ailto)://|(?<=w)(?=ww\.))
 *       ([^\s"'<>()\[\]{}]+)
 *
 * On Latin-1 text IGNORECASE folds only the ASCII letters (the other characters it folds
 * onto h, t, p, s, f, m, a, i, l, o, w are beyond U+00FF), \w is Py_UNICODE_ISALNUM or
 * '_' and \s is Py_UNICODE_ISSPACE, as in the re module. The host is text._HOST_RE's
 * group: after an optional user part (a run without / ? # @ or white space, then '@'),
 * an ASCII letter or digit, then letters, digits, '.' and '-'. The caller has checked
 * that the text holds "://", "www." or "WWW." (WordRules.urls looks no further otherwise). */
static unsigned char is_word1[256];  /* \w among the Latin-1 characters */
static unsigned char url_stop[256];  /* what ends a URL: \s and "'<>()[]{} */
static unsigned char url_user_stop[256];  /* what ends a URL's user part: \s and /?#@ */
static unsigned char link_user_stop[256]; /* what ends a link's user part: \s, /?#@ and "'> */
static unsigned char url_first[256];  /* where url_scan's URL can start: h f m w, either case */

static inline int
is_alnum_ascii(Py_UCS1 c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Whether text[i:] starts with `word` (lower-case ASCII), ignoring case. */
static int
ci_at(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i, const char *word)
{
    for (; *word; word++, i++) {
        if (i >= n || lower1(p[i]) != (Py_UCS1)*word) {
            return 0;
        }
    }
    return 1;
}

static int
append_new(PyObject *out, PyObject *token)
{
    if (token == NULL) {
        return -1;
    }
    int rc = PyList_Append(out, token);
    Py_DECREF(token);
    return rc;
}

/* A direct-mapped memo of the recent short ASCII tokens the steps below make (html:<tag>,
 * url:<host>): a repeated token is the same str, whose str hash (what the token table is
 * looked up by) is then computed once. Which str holds a token's characters changes no
 * token. */
#define TOKEN_MEMO_SLOTS 1024
#define TOKEN_MEMO_MAX 64
static PyObject *token_memo[TOKEN_MEMO_SLOTS];

/* The str of the ASCII characters s[0:n]: the memo's, or a new one (a new reference). */
static PyObject *
ascii_token(const Py_UCS1 *s, Py_ssize_t n)
{
    PyObject **slot = NULL, *t;
    if (n <= TOKEN_MEMO_MAX) {
        uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ULL, chunk; /* 8 bytes a step */
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) {
            memcpy(&chunk, s + i, 8);
            h = (h ^ chunk) * 0xff51afd7ed558ccdULL;
        }
        if (i < n) {
            chunk = 0;
            memcpy(&chunk, s + i, (size_t)(n - i));
            h = (h ^ chunk) * 0xff51afd7ed558ccdULL;
        }
        h ^= h >> 29;
        slot = &token_memo[(h ^ (h >> 32)) & (TOKEN_MEMO_SLOTS - 1)];
        t = *slot;
        if (t != NULL && PyUnicode_GET_LENGTH(t) == n && memcmp(PyUnicode_1BYTE_DATA(t), s, (size_t)n) == 0) {
            return Py_NewRef(t);
        }
    }
    t = PyUnicode_New(n, 127);
    if (t == NULL) {
        return NULL;
    }
    memcpy(PyUnicode_1BYTE_DATA(t), s, (size_t)n);
    if (slot != NULL) {
        Py_XSETREF(*slot, Py_NewRef(t));
    }
    return t;
}

/* Where the steps below put the ASCII tokens they make: a list of str (ascii_token), or,
 * with `list` NULL, an array of their stable hashes, each looked up in the token table by
 * the token's bytes (its str's key: table_key), a str made only on a miss. */
typedef struct {
    PyObject *list;
    uint64_t *hashes;
    Py_ssize_t n, room;
} sink_t;

static inline Py_ssize_t
sink_len(const sink_t *sink)
{
    return sink->list != NULL ? PyList_GET_SIZE(sink->list) : sink->n;
}

/* Append the token of the ASCII characters s[0:n]. */
static int
sink_ascii(sink_t *sink, const Py_UCS1 *s, Py_ssize_t n)
{
    if (sink->list != NULL) {
        return append_new(sink->list, ascii_token(s, n));
    }
    if (sink->n == sink->room) {
        Py_ssize_t room = sink->room < 64 ? 64 : 2 * sink->room;
        uint64_t *more = PyMem_Realloc(sink->hashes, (size_t)room * sizeof(uint64_t));
        if (more == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        sink->hashes = more, sink->room = room;
    }
    uint64_t key = bytes_key(s, n), value;
    size_t k = find_slot(key);
    if (slots[k].key == key) {
        value = slots[k].value;
    }
    else {
        PyObject *token = ascii_str(s, n);
        int rc = token == NULL ? -1 : cached_hash_of(token, key, &value);
        Py_XDECREF(token);
        if (rc < 0) {
            return -1;
        }
    }
    sink->hashes[sink->n++] = value;
    return 0;
}

/* The sink's tokens cut to the first n. */
static int
sink_truncate(sink_t *sink, Py_ssize_t n)
{
    if (sink->list != NULL) {
        return PyList_SetSlice(sink->list, n, PyList_GET_SIZE(sink->list), NULL);
    }
    sink->n = n;
    return 0;
}

/* Append text.host_tokens(prefix, host) for the host u[0:n] (ASCII letters, digits, '.'
 * and '-', starting with a letter or digit): "<prefix>:<host>" lower-cased, its trailing
 * dots stripped, and "<prefix>:<last two labels>" when it has more than two. */
static int
append_host(const char *prefix, const Py_UCS1 *u, Py_ssize_t n, sink_t *out)
{
    Py_ssize_t pre = (Py_ssize_t)strlen(prefix), dots = 0, last = -1, second = -1;
    while (n > 1 && u[n - 1] == '.') { /* host.strip("."): it starts with a letter or digit */
        n--;
    }
    Py_UCS1 stack[TOKEN_MEMO_MAX], *w = stack;
    if (pre + n > TOKEN_MEMO_MAX && (w = PyMem_Malloc((size_t)(pre + n))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(w, prefix, (size_t)pre);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS1 c = lower1(u[i]);
        w[pre + i] = c;
        if (c == '.') {
            dots++;
            second = last;
            last = i;
        }
    }
    int rc = sink_ascii(out, w, pre + n);
    if (rc == 0 && dots >= 2) { /* more than two labels: the last two too */
        Py_ssize_t from = second + 1;
        memmove(w + pre, w + pre + from, (size_t)(n - from));
        rc = sink_ascii(out, w, pre + n - from);
    }
    if (w != stack) {
        PyMem_Free(w);
    }
    return rc;
}

/* The host at the start of u[0:len], after an optional user part (a run of characters
 * not in user_stop, then '@'): an ASCII letter or digit, then letters, digits, '.' and
 * '-' (text._HOST_RE, and the end of markup._LINK). Its start goes to *start; returns its
 * end, or -1 when there is none. A user part with no host after it is not one: the
 * regexes backtrack and look for the host at the start. */
static inline int
is_host_char(Py_UCS1 c)
{
    return is_alnum_ascii(c) || c == '.' || c == '-';
}

static Py_ssize_t
find_host(const Py_UCS1 *u, Py_ssize_t len, const unsigned char *user_stop, Py_ssize_t *start)
{
    Py_ssize_t run = 0, k, from = 0, end;
    while (run < len && is_host_char(u[run])) { /* the host without a user part (if u[0] is one) */
        run++;
    }
    k = run; /* (a host character never ends a user part: the run is the user part's start) */
    while (k < len && !user_stop[u[k]]) {
        k++;
    }
    if (k < len && u[k] == '@' && k + 1 < len && is_alnum_ascii(u[k + 1])) {
        from = k + 1;
    }
    if (from >= len || !is_alnum_ascii(u[from])) {
        return -1;
    }
    if (from == 0) {
        end = run;
    }
    else {
        end = from + 1;
        while (end < len && is_host_char(u[end])) {
            end++;
        }
    }
    *start = from;
    return end;
}

/* Append host_tokens("url", host) of the URL text u[0:len] (text._url_host, then host_tokens). */
static int
append_url_host_tokens(const Py_UCS1 *u, Py_ssize_t len, PyObject *out)
{
    Py_ssize_t start, end = find_host(u, len, url_user_stop, &start);
    sink_t sink = {out, NULL, 0, 0};
    /* no host: host_tokens("url", "") is empty */
    return end < 0 ? 0 : append_host("url:", u + start, end - start, &sink);
}

/* The arguments (text, out) of a step appending tokens to the list out: 1 with p and n
 * the Latin-1 characters of text, 0 when text is not Latin-1 (the caller's Python code
 * takes it), -1 with an exception set when they are not a str and a list. */
static int
latin1_text_and_list(PyObject *const *args, Py_ssize_t nargs, const char *usage,
                     const Py_UCS1 **p, Py_ssize_t *n)
{
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "%s: a str and a list", usage);
        return -1;
    }
    if (PyUnicode_KIND(args[0]) != PyUnicode_1BYTE_KIND) {
        return 0;
    }
    *p = PyUnicode_1BYTE_DATA(args[0]);
    *n = PyUnicode_GET_LENGTH(args[0]);
    return 1;
}

/* Whether the k bytes of `needle` occur in p[0:n] (k >= 1). */
static int
contains_bytes(const Py_UCS1 *p, Py_ssize_t n, const char *needle, Py_ssize_t k)
{
    const Py_UCS1 *end = p + n, *at = p;
    while (end - at >= k && (at = memchr(at, needle[0], (size_t)(end - at - k + 1))) != NULL) {
        if (memcmp(at, needle, (size_t)k) == 0) {
            return 1;
        }
        at++;
    }
    return 0;
}

/* A Latin-1 stand-in for a str beyond Latin-1, for the scans of url_scan: each character
 * beyond U+00FF becomes one that the scans' character classes take alike (\s, \w, or
 * neither: U+0085, U+00AA, U+00A4), every other is kept. NULL with no exception set when
 * the str holds a character beyond U+00FF that IGNORECASE folds onto an ASCII letter
 * (U+0130, U+0131, U+017F, U+212A: the Python code takes that text). */
/* The stand-in of one character beyond U+00FF (latin1_stand_in), or 0 for one that
 * IGNORECASE folds onto an ASCII letter. */
static Py_UCS1
stand_in_char(Py_UCS4 c)
{
    if (c == 0x130 || c == 0x131 || c == 0x17F || c == 0x212A) {
        return 0;
    }
    return Py_UNICODE_ISSPACE(c) ? 0x85 : Py_UNICODE_ISALNUM(c) ? 0xAA : 0xA4;
}

/* The stand-ins of the n characters of s into p, one loop for each width of character
 * (Latin-1 characters copied as they are); 0 at a character stand_in_char declines. */
#define STAND_IN_LOOP(name, type)                                  \
    static int                                                    \
    name(const type *s, Py_ssize_t n, Py_UCS1 *p)                 \
    {                                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                      \
            type c = s[i];                                        \
            if (c < 256) {                                        \
                p[i] = (Py_UCS1)c;                                \
            }                                                     \
            else if ((p[i] = stand_in_char((Py_UCS4)c)) == 0) {   \
                return 0;                                         \
            }                                                     \
        }                                                         \
        return 1;                                                 \
    }
STAND_IN_LOOP(stand_in_chars, Py_UCS2)
STAND_IN_LOOP(stand_in_chars4, Py_UCS4)
#undef STAND_IN_LOOP

static Py_UCS1 *
latin1_stand_in(PyObject *text)
{
    int kind = PyUnicode_KIND(text), stand = 1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_UCS1 *p = PyMem_Malloc((size_t)n + 1);
    if (p == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (kind == PyUnicode_1BYTE_KIND) {
        memcpy(p, PyUnicode_1BYTE_DATA(text), (size_t)n);
    }
    else {
        stand = kind == PyUnicode_2BYTE_KIND ? stand_in_chars(PyUnicode_2BYTE_DATA(text), n, p)
                                             : stand_in_chars4(PyUnicode_4BYTE_DATA(text), n, p);
    }
    if (!stand) {
        PyMem_Free(p);
        return NULL;
    }
    return p;
}

/* The URL of url_scan's pattern at p[i] (i < n): 1 with its proto: token, where its rest
 * starts (past the scheme, or the "www." itself) and its end; 0 if none starts there. */
static int
url_at(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i, const char **proto, Py_ssize_t *rest, Py_ssize_t *end)
{
    if (!url_first[p[i]] || (i > 0 && is_word1[p[i - 1]])) { /* (?<!\w.): a word character before */
        return 0;
    }
    Py_UCS1 c = lower1(p[i]);
    *proto = NULL;
    if (c == 'h' && ci_at(p, n, i + 1, "ttps://")) {
        *proto = "proto:https", *rest = i + 8;
    }
    else if (c == 'h' && ci_at(p, n, i + 1, "ttp://")) {
        *proto = "proto:http", *rest = i + 7;
    }
    else if (c == 'f' && ci_at(p, n, i + 1, "tp://")) {
        *proto = "proto:ftp", *rest = i + 6;
    }
    else if (c == 'm' && ci_at(p, n, i + 1, "ailto://")) {
        *proto = "proto:mailto", *rest = i + 9;
    }
    else if (c == 'w' && ci_at(p, n, i + 1, "ww.")) {
        *proto = "proto:http", *rest = i + 1;
    }
    if (*proto == NULL) {
        return 0;
    }
    Py_ssize_t e = *rest;
    while (e < n && !url_stop[p[e]]) {
        e++;
    }
    *end = e;
    return e > *rest; /* the URL needs one character after its scheme */
}

/* The first "://" in p[from:n], or n + 8 if there is none. */
static Py_ssize_t
find_scheme_separator(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t from)
{
    const Py_UCS1 *q = p + from, *end = p + n;
    while (end - q >= 3 && (q = memchr(q, ':', (size_t)(end - q - 2))) != NULL) {
        if (q[1] == '/' && q[2] == '/') {
            return q - p;
        }
        q++;
    }
    return n + 8;
}

/* The first "www." of any case in p[from:n], or n + 8 if there is none: found by its dot. */
static Py_ssize_t
find_www(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t from)
{
    const Py_UCS1 *q = p + from + 3, *end = p + n;
    while (q < end && (q = memchr(q, '.', (size_t)(end - q))) != NULL) {
        if ((q[-1] | 0x20) == 'w' && (q[-2] | 0x20) == 'w' && (q[-3] | 0x20) == 'w') {
            return q - 3 - p;
        }
        q++;
    }
    return n + 8;
}

static PyObject *
url_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const Py_UCS1 *p;
    Py_ssize_t n, copied = 0;
    int latin1 = latin1_text_and_list(args, nargs, "url_scan(text, out)", &p, &n);
    if (latin1 < 0) {
        return NULL;
    }
    PyObject *text = args[0], *out = args[1], *pieces = NULL; /* pieces: of a wide text */
    Py_UCS1 *stand_in = NULL;
    if (latin1 == 0) { /* beyond Latin-1: the same scan on a stand-in, the text cut by Python */
        stand_in = latin1_stand_in(text);
        if (stand_in == NULL) {
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        p = stand_in, n = PyUnicode_GET_LENGTH(text);
    }
    /* WordRules.urls' first test: without "://", "www." or "WWW." the text is kept as is */
    if (!contains_bytes(p, n, "://", 3) && !contains_bytes(p, n, "www.", 4) &&
            !contains_bytes(p, n, "WWW.", 4)) {
        PyMem_Free(stand_in);
        Py_INCREF(text);
        return text;
    }
    Py_UCS1 *buf = NULL; /* the text with its URLs replaced by spaces, once one is found */
    Py_ssize_t used = 0, from = 0, i, rest, end;
    Py_ssize_t sep = -1, www = -1; /* the next "://" and "www." (any case); n + 8: no more */
    const char *proto;
    while (from < n) {
        /* the next place a URL can start (url_at): 3 to 6 characters before a "://"
         * (the schemes), or at a "www." */
        if (sep < from + 3) {
            sep = find_scheme_separator(p, n, from + 3);
        }
        if (www < from) {
            www = find_www(p, n, from);
        }
        i = sep - 6 > from ? sep - 6 : from;
        i = www < i ? www : i;
        if (i >= n) {
            break;
        }
        if (!url_at(p, n, i, &proto, &rest, &end)) {
            from = i + 1;
            continue;
        }
        Py_UCS1 c = lower1(p[i]);
        Py_ssize_t host_from = c == 'w' ? i : rest; /* www.: the first letter belongs to the host */
        if (append_new(out, PyUnicode_FromString(proto)) < 0
            || append_url_host_tokens(p + host_from, end - host_from, out) < 0) {
            goto fail;
        }
        if (stand_in != NULL) {
            if ((pieces == NULL && (pieces = PyList_New(0)) == NULL)
                || append_new(pieces, PyUnicode_Substring(text, copied, i)) < 0) {
                goto fail;
            }
        }
        else {
            if (buf == NULL && (buf = PyMem_Malloc((size_t)n + 1)) == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            memcpy(buf + used, p + copied, (size_t)(i - copied));
            used += i - copied;
            buf[used++] = ' ';
        }
        copied = end;
        from = end;
    }
    PyMem_Free(stand_in);
    if (pieces != NULL) { /* " ".join of the pieces between the URLs, as WordRules.urls */
        PyObject *space = NULL, *result = NULL;
        if (append_new(pieces, PyUnicode_Substring(text, copied, n)) == 0
            && (space = PyUnicode_FromOrdinal(' ')) != NULL) {
            result = PyUnicode_Join(space, pieces);
        }
        Py_XDECREF(space);
        Py_DECREF(pieces);
        return result;
    }
    if (buf == NULL) {
        Py_INCREF(text);
        return text;
    }
    memcpy(buf + used, p + copied, (size_t)(n - copied));
    used += n - copied;
    PyObject *result = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, buf, used);
    PyMem_Free(buf);
    return result;
fail:
    PyMem_Free(stand_in);
    PyMem_Free(buf);
    Py_XDECREF(pieces);
    return NULL;
}

/* ------------------------------------------------------------------ the tags of strip_html
 *
 * next_tag finds the tags of markup._TAG.split on Latin-1 markup (for html_strip, below):
 *
 *   <\s*(/?)\s*([a-zA-Z][a-zA-Z0-9]{0,15})([^>]{0,2000})>?
 *
 * the slash, the name and the attributes of each. Every part of the pattern after the name is
 * greedy and may be empty, so a '<' starts a tag exactly when white space, an optional
 * '/' and white space lead to an ASCII letter (no backtracking can change that), and the
 * tag takes the longest name, then the longest attribute run, then a '>' if one follows. */
static PyObject *
latin1_str(const Py_UCS1 *p, Py_ssize_t n)
{
    return PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, p, n);
}

static inline int
is_letter_ascii(Py_UCS1 c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* One tag of markup._TAG: the slash, name and attribute runs (pointers into the markup). */
typedef struct {
    const Py_UCS1 *slash, *name, *attr;
    Py_ssize_t slash_len, name_len, attr_len;
} tag_t;

/* The first tag of p[i:n]: its '<' position (tag->... filled, *end after its '>' if any),
 * or -1 if there is none. */
static Py_ssize_t
next_tag(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i, tag_t *tag, Py_ssize_t *end)
{
    const Py_UCS1 *lt;
    while (i < n && (lt = memchr(p + i, '<', (size_t)(n - i))) != NULL) {
        i = lt - p;
        Py_ssize_t j = i + 1, name_end, attr_end;
        while (j < n && is_space1[p[j]]) {
            j++;
        }
        tag->slash = p + j;
        tag->slash_len = 0;
        if (j < n && p[j] == '/') {
            tag->slash_len = 1;
            j++;
        }
        while (j < n && is_space1[p[j]]) {
            j++;
        }
        if (j >= n || !is_letter_ascii(p[j])) {
            i++;
            continue;
        }
        name_end = j + 1;
        while (name_end < n && name_end - j < 16 && is_alnum_ascii(p[name_end])) {
            name_end++;
        }
        /* the attributes: up to the first '>' within 2000 characters */
        Py_ssize_t limit = n - name_end < 2000 ? n : name_end + 2000;
        const Py_UCS1 *gt = memchr(p + name_end, '>', (size_t)(limit - name_end));
        attr_end = gt == NULL ? limit : gt - p;
        tag->name = p + j;
        tag->name_len = name_end - j;
        tag->attr = p + name_end;
        tag->attr_len = attr_end - name_end;
        *end = attr_end < n && p[attr_end] == '>' ? attr_end + 1 : attr_end;
        return i;
    }
    return -1;
}

/* ------------------------------------------------------------------ received_tokens
 *
 * received_tokens(text, out) -> bool: mail_headers._received_tokens for a Received value whose
 * characters are all Latin-1 (False for any other value, and nothing appended: the
 * caller runs the Python code, the reference). Appended to out: host_tokens("received",
 * host) of the first 4 relay hosts of mail_headers._RECEIVED_HOST,
 *
 *   [fFbB](?<!\w.)(?:(?<=[fF])[rR][oO][mM]|(?<=[bB])[yY])\s+([ALNUM][ALNUM.-]*[ALNUM])
 *
 * (on Latin-1 text ALNUM is the ASCII letters and digits; the host is the longest run of
 * them, '.' and '-' that starts with one, cut after its last letter or digit, at least two
 * characters), then "received:<a.b.c>" for the first 2 IPv4 literals of mail_headers._IPV4,
 * \[(\d{1,3}\.\d{1,3}\.\d{1,3})\.\d{1,3}\] (\d: the ASCII digits, on Latin-1 text). */

/* Length of a run of 1 to 3 ASCII digits at p[i:] followed by `after` (0: none). */
static Py_ssize_t
digits_then(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i, Py_UCS1 after)
{
    Py_ssize_t k = i;
    while (k < n && k - i < 3 && p[k] >= '0' && p[k] <= '9') {
        k++;
    }
    return (k > i && k < n && p[k] == after) ? k - i : 0;
}

static PyObject *
received_tokens(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const Py_UCS1 *p;
    Py_ssize_t n;
    int latin1 = latin1_text_and_list(args, nargs, "received_tokens(text, out)", &p, &n);
    if (latin1 <= 0) {
        if (latin1 < 0) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    PyObject *out = args[1];
    int hosts = 0;
    for (Py_ssize_t i = 0; i < n && hosts < 4; i++) {
        Py_UCS1 c = p[i];
        Py_ssize_t j;
        if (c == 'f' || c == 'F') {
            if (!ci_at(p, n, i + 1, "rom")) {
                continue;
            }
            j = i + 4;
        }
        else if (c == 'b' || c == 'B') {
            if (!ci_at(p, n, i + 1, "y")) {
                continue;
            }
            j = i + 2;
        }
        else {
            continue;
        }
        if (i > 0 && is_word1[p[i - 1]]) { /* (?<!\w.) */
            continue;
        }
        Py_ssize_t blanks = j;
        while (j < n && is_space1[p[j]]) {
            j++;
        }
        if (j == blanks || j >= n || !is_alnum_ascii(p[j])) {
            continue;
        }
        Py_ssize_t end = j + 1, last = -1;
        while (end < n && (is_alnum_ascii(p[end]) || p[end] == '.' || p[end] == '-')) {
            if (is_alnum_ascii(p[end])) {
                last = end;
            }
            end++;
        }
        if (last < 0) { /* a host has two letters or digits at least */
            continue;
        }
        sink_t sink = {out, NULL, 0, 0};
        if (append_host("received:", p + j, last + 1 - j, &sink) < 0) {
            return NULL;
        }
        hosts++;
        i = last; /* findall goes on after the match */
    }
    const Py_UCS1 *bracket = memchr(p, '[', (size_t)n);
    if (bracket != NULL) {
        int ips = 0;
        for (Py_ssize_t i = bracket - p; i + 8 < n && ips < 2; i++) {
            const Py_UCS1 *next = memchr(p + i, '[', (size_t)(n - 8 - i));
            if (next == NULL) {
                break;
            }
            i = next - p;
            Py_ssize_t a = digits_then(p, n, i + 1, '.'), b, c, d;
            if (!a || !(b = digits_then(p, n, i + 2 + a, '.')) || !(c = digits_then(p, n, i + 3 + a + b, '.'))
                || !(d = digits_then(p, n, i + 4 + a + b + c, ']'))) {
                continue;
            }
            Py_ssize_t m = a + b + c + 2;
            PyObject *tok = PyUnicode_New(9 + m, 127);
            if (tok == NULL) {
                return NULL;
            }
            memcpy(PyUnicode_1BYTE_DATA(tok), "received:", 9);
            memcpy(PyUnicode_1BYTE_DATA(tok) + 9, p + i + 1, (size_t)m);
            if (append_new(out, tok) < 0) {
                return NULL;
            }
            ips++;
            i += 4 + a + b + c + d; /* at the closing bracket */
        }
    }
    Py_RETURN_TRUE;
}

/* ------------------------------------------------------------------ tag_tokens
 *
 * tag_tokens(slashes, names, attributes, max_tag_tokens) -> list or None: the tokens
 * markup.strip_html makes of the tags of _TAG.split (the lists of their slashes, names and
 * attributes): "html:<name>" lower-cased for each opening tag, and after the html: token
 * of each tag with links, host_tokens("url", host) of the hosts of markup._LINK,
 *
 *   [hHsSaA](?<!\w.)(?:(?<=[hH])[rR][eE][fF]|(?<=[sS])[rR][cC]|(?<=[aA])[cC][tT][iI][oO][nN])
 *   \s*=\s*["']?\s*(?:[hH][tT][tT][pP][sS]?|[fF][tT][pP])://(?:[^/?#@\s"'>]*@)?([ALNUM][ALNUM.-]*)
 *
 * (the pattern as it reads on Latin-1 text: its other letters are beyond U+00FF), with the
 * same cut at max_tag_tokens (a tag's tokens are not split). None when an attribute with
 * "://" is not Latin-1: the caller runs the Python code, the reference. */

/* Where the attribute name of markup._LINK (href, src or action, any case) that ends
 * before the '=' at p[eq] (after white space) starts, at or after `from`; -1 if none does. */
static Py_ssize_t
link_name_before(const Py_UCS1 *p, Py_ssize_t from, Py_ssize_t eq)
{
    Py_ssize_t e = eq;
    while (e > from && is_space1[p[e - 1]]) {
        e--;
    }
    if (e - 4 >= from && ci_at(p, e, e - 4, "href")) {
        return e - 4;
    }
    if (e - 3 >= from && ci_at(p, e, e - 3, "src")) {
        return e - 3;
    }
    if (e - 6 >= from && ci_at(p, e, e - 6, "action")) {
        return e - 6;
    }
    return -1;
}

/* Append the url: tokens of the links in the Latin-1 attributes p[0:n] (markup._LINK),
 * found from their '=': the name before it, the URL after it. */
static int
append_link_hosts(const Py_UCS1 *p, Py_ssize_t n, sink_t *out)
{
    Py_ssize_t from = 0; /* where the next match may start (findall goes on after one) */
    const Py_UCS1 *q = p, *stop = p + n;
    while (q < stop && (q = memchr(q, '=', (size_t)(stop - q))) != NULL) {
        Py_ssize_t eq = q - p, i = link_name_before(p, from, eq), j = eq + 1;
        q++;
        if (i < 0 || (i > 0 && is_word1[p[i - 1]])) { /* (?<!\w.) */
            continue;
        }
        while (j < n && is_space1[p[j]]) {
            j++;
        }
        if (j < n && (p[j] == '"' || p[j] == '\'')) {
            j++;
        }
        while (j < n && is_space1[p[j]]) {
            j++;
        }
        if (ci_at(p, n, j, "https://")) {
            j += 8;
        }
        else if (ci_at(p, n, j, "http://")) {
            j += 7;
        }
        else if (ci_at(p, n, j, "ftp://")) {
            j += 6;
        }
        else {
            continue;
        }
        Py_ssize_t start, end = find_host(p + j, n - j, link_user_stop, &start);
        if (end < 0) {
            continue;
        }
        if (append_host("url:", p + j + start, end - start, out) < 0) {
            return -1;
        }
        from = j + end;
        q = p + from;
    }
    return 0;
}

/* Whether p[0:n] holds "://". */
static int
has_scheme_separator(const Py_UCS1 *p, Py_ssize_t n)
{
    const Py_UCS1 *q = p, *end = p + n;
    while (end - q >= 3 && (q = memchr(q, ':', (size_t)(end - q - 2))) != NULL) {
        if (q[1] == '/' && q[2] == '/') {
            return 1;
        }
        q++;
    }
    return 0;
}

/* The tokens of one tag of Latin-1 markup (tag_tokens, below) into `out`, the tokens of the
 * tags before it there (out holds only those): its html: token if it opens, then the
 * url: tokens of its links. *cut: where the tokens are to end (the limit, or past it the
 * end of the tokens of the tag reaching it: a tag's tokens are not split), set once no
 * tag after this one can add tokens; then 1 is returned (0 to go on, -1 on error). */
static int
tag_tokens_of(const tag_t *tag, Py_ssize_t limit, sink_t *out, Py_ssize_t *cut)
{
    int opening = tag->slash_len == 0;
    Py_ssize_t first = sink_len(out); /* where this tag's tokens start */
    if (first >= limit) {
        *cut = limit;
        return 1;
    }
    if (opening) {
        Py_ssize_t m = tag->name_len; /* (at most 16) */
        Py_UCS1 t[5 + 16];
        memcpy(t, "html:", 5);
        for (Py_ssize_t k = 0; k < m; k++) {
            t[5 + k] = lower1(tag->name[k]);
        }
        if (sink_ascii(out, t, 5 + m) < 0) {
            return -1;
        }
    }
    if (!has_scheme_separator(tag->attr, tag->attr_len)) { /* no "://": no link */
        return 0;
    }
    if (append_link_hosts(tag->attr, tag->attr_len, out) < 0) {
        return -1;
    }
    Py_ssize_t end = sink_len(out);
    if (end > first + opening && first < limit && limit < end) { /* hosts, reaching the limit */
        *cut = end;
        return 1;
    }
    return 0;
}

/* The tokens of n tags of Latin-1 markup (tag_tokens, below), cut at limit >= 0, into
 * `out` (empty at the start). */
static int
tokens_of_tags(const tag_t *tags, Py_ssize_t n, Py_ssize_t limit, sink_t *out)
{
    Py_ssize_t cut = limit;
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = tag_tokens_of(&tags[i], limit, out, &cut);
        if (rc < 0) {
            return -1;
        }
        if (rc > 0) {
            break;
        }
    }
    return sink_len(out) > cut ? sink_truncate(out, cut) : 0;
}

/* tokens_of_tags into a new list. */
static PyObject *
list_of_tags(const tag_t *tags, Py_ssize_t n, Py_ssize_t limit)
{
    PyObject *tokens = PyList_New(0);
    sink_t sink = {tokens, NULL, 0, 0};
    if (tokens != NULL && tokens_of_tags(tags, n, limit, &sink) < 0) {
        Py_CLEAR(tokens);
    }
    return tokens;
}

static PyObject *
tag_tokens(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])
        || !PyLong_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "tag_tokens(slashes, names, attributes, max_tag_tokens): "
                        "three lists and an int");
        return NULL;
    }
    PyObject *slashes = args[0], *names = args[1], *attributes = args[2];
    Py_ssize_t n = PyList_GET_SIZE(names), limit = PyLong_AsSsize_t(args[3]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "tag_tokens: max_tag_tokens must be >= 0");
        return NULL;
    }
    if (PyList_GET_SIZE(slashes) != n || PyList_GET_SIZE(attributes) != n) {
        PyErr_SetString(PyExc_ValueError, "tag_tokens: the three lists differ in length");
        return NULL;
    }
    tag_t *tags = PyMem_Malloc(((size_t)n + 1) * sizeof(tag_t));
    if (tags == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyList_GET_ITEM(attributes, i), *name = PyList_GET_ITEM(names, i);
        PyObject *slash = PyList_GET_ITEM(slashes, i);
        if (!PyUnicode_Check(a) || !PyUnicode_Check(name) || !PyUnicode_Check(slash)) {
            PyMem_Free(tags);
            PyErr_SetString(PyExc_TypeError, "tag_tokens: the lists must hold str");
            return NULL;
        }
        if (PyUnicode_KIND(a) != PyUnicode_1BYTE_KIND || !PyUnicode_IS_ASCII(name)
            || PyUnicode_GET_LENGTH(name) > 16) {
            PyMem_Free(tags);
            Py_RETURN_NONE; /* (tag names are ASCII, at most 16 characters: markup._TAG) */
        }
        tags[i].slash = NULL; /* (only its length is read) */
        tags[i].slash_len = PyUnicode_GET_LENGTH(slash);
        tags[i].name = PyUnicode_1BYTE_DATA(name);
        tags[i].name_len = PyUnicode_GET_LENGTH(name);
        tags[i].attr = PyUnicode_1BYTE_DATA(a);
        tags[i].attr_len = PyUnicode_GET_LENGTH(a);
    }
    PyObject *tokens = list_of_tags(tags, n, limit);
    PyMem_Free(tags);
    return tokens;
}

/* ------------------------------------------------------------------ header_fields
 *
 * header_fields(text, strip_crlf) -> list of (name, value): for an ASCII str, the pairs
 * of mime._FIELD_START.split(text), \n([\x21-\x39\x3b-\x7e]+):[ \t]* (the name between a
 * line break and a colon, the blanks after the colon dropped; a value runs to the next
 * match), that is list(zip(pieces[1::2], pieces[2::2])); with strip_crlf, each value
 * with its trailing \r and \n characters stripped (str.rstrip("\r\n")). None for a str
 * that is not ASCII (the caller runs the regex, the reference). */
static inline int
is_field_name_char(Py_UCS1 c)
{
    return c >= 0x21 && c <= 0x7e && c != ':';
}

/* The pairs of header_fields over the ASCII characters p[0:n] (a new list). */
static PyObject *
fields_of(const Py_UCS1 *p, Py_ssize_t n, int strip_crlf)
{
    Py_ssize_t i = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    PyObject *name = NULL; /* the field whose value is being read */
    Py_ssize_t value_from = 0;
    for (;;) {
        /* the next match: a line break, a name, a colon */
        Py_ssize_t j = i, name_end = -1;
        const Py_UCS1 *nl;
        while (j < n && (nl = memchr(p + j, '\n', (size_t)(n - j))) != NULL) {
            j = nl - p;
            Py_ssize_t k = j + 1;
            while (k < n && is_field_name_char(p[k])) {
                k++;
            }
            if (k > j + 1 && k < n && p[k] == ':') {
                name_end = k;
                break;
            }
            j++;
        }
        Py_ssize_t match = name_end < 0 ? n : j; /* where the current value ends */
        if (name != NULL) {
            Py_ssize_t end = match;
            while (strip_crlf && end > value_from && (p[end - 1] == '\r' || p[end - 1] == '\n')) {
                end--;
            }
            PyObject *value = ascii_str(p + value_from, end - value_from);
            PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, name, value);
            Py_XDECREF(value);
            Py_CLEAR(name);
            if (append_new(out, pair) < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
        if (name_end < 0) {
            break;
        }
        name = ascii_str(p + j + 1, name_end - j - 1);
        if (name == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        value_from = name_end + 1;
        while (value_from < n && (p[value_from] == ' ' || p[value_from] == '\t')) {
            value_from++;
        }
        i = value_from;
    }
    return out;
}

static PyObject *
header_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "header_fields(text, strip_crlf): a str and a bool");
        return NULL;
    }
    PyObject *text = args[0];
    int strip_crlf = PyObject_IsTrue(args[1]);
    if (strip_crlf < 0) {
        return NULL;
    }
    if (!PyUnicode_IS_ASCII(text)) {
        Py_RETURN_NONE;
    }
    return fields_of(PyUnicode_1BYTE_DATA(text), PyUnicode_GET_LENGTH(text), strip_crlf);
}

/* ------------------------------------------------------------------ header blocks
 *
 * header_block_end(buf, start, end) and plain_headers(buf, start, end): mime's
 * _header_block_end and _plain_headers on a bytes object, their reference (the regexes
 * _HEADER_LINE, _HEADER_BLOCK_END, _LONE_CR and _ODD_LINE, and header_fields). */

/* Whether a header line may start at p[i] (i < n): "From ", any run of field name
 * characters then ':', a tab or a space (mime._HEADER_LINE). */
static int
header_line_at(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i)
{
    if (p[i] == ' ' || p[i] == '\t') {
        return 1;
    }
    if (n - i >= 5 && memcmp(p + i, "From ", 5) == 0) {
        return 1;
    }
    while (i < n && is_field_name_char(p[i])) {
        i++;
    }
    return i < n && p[i] == ':';
}

/* The bytes object args[0] and the bounds args[1:3], clipped as a slice clips them. */
static int
bytes_and_bounds(PyObject *const *args, Py_ssize_t nargs, const char *usage, const Py_UCS1 **p,
                 Py_ssize_t *start, Py_ssize_t *end)
{
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *start = PyLong_AsSsize_t(args[1]);
    *end = PyLong_AsSsize_t(args[2]);
    if ((*start == -1 || *end == -1) && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if (*start < 0 || *end > n || *start > *end) {
        PyErr_SetString(PyExc_ValueError, "bounds out of range");
        return -1;
    }
    *p = (const Py_UCS1 *)PyBytes_AS_STRING(args[0]);
    return 0;
}

static PyObject *
header_block_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const Py_UCS1 *p;
    Py_ssize_t start, end;
    if (bytes_and_bounds(args, nargs, "header_block_end(buf, start, end): bytes and two ints", &p,
                         &start, &end) < 0) {
        return NULL;
    }
    if (start < end && !header_line_at(p, end, start)) {
        return PyLong_FromSsize_t(start);
    }
    Py_ssize_t block_end = end, i = start;
    const Py_UCS1 *nl;
    while (i < end && (nl = memchr(p + i, '\n', (size_t)(end - i))) != NULL) {
        i = nl - p + 1;
        if (i >= end || !header_line_at(p, end, i)) {
            block_end = i;
            break;
        }
    }
    /* a lone carriage return (one not followed by a line break before block_end, as the
     * regex sees it): the block ends before its line */
    const Py_UCS1 *cr = p + start;
    while ((cr = memchr(cr, '\r', (size_t)(p + block_end - cr))) != NULL) {
        Py_ssize_t k = cr++ - p;
        if (k + 1 >= block_end || p[k + 1] != '\n') {
            Py_ssize_t line = k;
            while (line > start && p[line - 1] != '\n') {
                line--;
            }
            block_end = line;
            break;
        }
    }
    return PyLong_FromSsize_t(block_end);
}

/* ------------------------------------------------------------------ message_id_value
 *
 * message_id_value(raw, scan) -> bytes or None: learn_keys._message_id (workers/wire) on
 * the bytes raw[:scan]: the raw value of the first Message-ID field (its name in any
 * case, up to 63 blanks, a colon) at the start or after a line break, None when there is
 * none or an empty line ("\n\n" or "\n\r\n") comes before it; the value runs to the line
 * break of the last of its lines (a line starting with a blank goes on), or without one
 * before scan to the first empty line or scan. One pass over the lines, nothing copied
 * but the value. The Python code is its reference; tests compare both with a line-by-line
 * reading of the header. */

/* After "message-id", blanks and ':' at s[i:scan]: the index past the colon, or -1. */
static Py_ssize_t
message_id_field_end(const unsigned char *s, Py_ssize_t scan, Py_ssize_t i)
{
    if (scan - i < 11 || !ci_at(s, scan, i, "message-id")) {
        return -1;
    }
    Py_ssize_t j = i + 10;
    while (j < scan && j - (i + 10) < 63 && (s[j] == ' ' || s[j] == '\t')) {
        j++;
    }
    return j < scan && s[j] == ':' ? j + 1 : -1;
}

static PyObject *
message_id_value(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "message_id_value(raw, scan): bytes and an int");
        return NULL;
    }
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]), scan = PyLong_AsSsize_t(args[1]);
    if (scan == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (scan < 0 || scan > len) {
        PyErr_SetString(PyExc_ValueError, "message_id_value: scan must be in 0..len(raw)");
        return NULL;
    }
    Py_ssize_t start = message_id_field_end(s, scan, 0), q = 0;
    while (start < 0) { /* the lines after the first, up to an empty one */
        const unsigned char *nl = q < scan ? memchr(s + q, '\n', (size_t)(scan - q)) : NULL;
        if (nl == NULL) {
            Py_RETURN_NONE;
        }
        q = nl - s;
        if ((q + 1 < len && s[q + 1] == '\n') || (q + 2 < len && s[q + 1] == '\r' && s[q + 2] == '\n')) {
            Py_RETURN_NONE; /* an empty line: a field after it is in the body */
        }
        start = message_id_field_end(s, scan, q + 1);
        q++;
    }
    Py_ssize_t end = start;
    for (;;) { /* the field goes on over lines that start with a blank */
        const unsigned char *nl = end < scan ? memchr(s + end, '\n', (size_t)(scan - end)) : NULL;
        if (nl == NULL) {
            end = -1;
            break;
        }
        end = nl - s;
        if (end + 1 >= scan || (s[end + 1] != ' ' && s[end + 1] != '\t')) {
            break;
        }
        end++;
    }
    if (end < 0) { /* no line break before scan: the header lines end at an empty line or there */
        Py_ssize_t lf = -1, crlf = -1;
        for (Py_ssize_t k = 0; k + 1 < scan; k++) {
            if (s[k] == '\n' && s[k + 1] == '\n') {
                lf = k;
                break;
            }
        }
        Py_ssize_t until = lf >= 0 ? lf : scan;
        for (Py_ssize_t k = 0; k + 2 < until; k++) {
            if (s[k] == '\n' && s[k + 1] == '\r' && s[k + 2] == '\n') {
                crlf = k;
                break;
            }
        }
        Py_ssize_t stop = crlf >= 0 ? crlf : lf;
        end = stop >= 0 ? stop + 1 : scan;
    }
    return PyBytes_FromStringAndSize((const char *)s + start, end > start ? end - start : 0);
}

/* Whether one of the 8 bytes of w (each below 0x80) is c (the test is exact as a whole;
 * which byte it flags past the first is not). */
static inline int
has_byte8(uint64_t w, Py_UCS1 c)
{
    uint64_t x = w ^ (0x0101010101010101ULL * c);
    return ((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL) != 0;
}

/* Whether the line after the line break at p[k] starts with ':' or "From " (k < end). */
static inline int
odd_line_after(const Py_UCS1 *p, Py_ssize_t end, Py_ssize_t k)
{
    return k + 1 < end && (p[k + 1] == ':' || (end - k - 1 >= 5 && memcmp(p + k + 1, "From ", 5) == 0));
}

static PyObject *
plain_headers(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const Py_UCS1 *p;
    Py_ssize_t start, end;
    if (bytes_and_bounds(args, nargs, "plain_headers(buf, start, end): bytes and two ints", &p,
                         &start, &end) < 0) {
        return NULL;
    }
    /* None for a byte beyond ASCII or a line that is no field nor continuation
     * (mime._ODD_LINE), wherever they are; 8 bytes at a time, the line breaks looked at
     * one by one */
    int crlf = 0;
    Py_ssize_t k = start;
    for (; end - k >= 8; k += 8) {
        uint64_t w = load_le64(p + k);
        if (w & 0x8080808080808080ULL) {
            Py_RETURN_NONE;
        }
        crlf |= has_byte8(w, '\r');
        if (has_byte8(w, '\n')) {
            for (Py_ssize_t b = k; b < k + 8; b++) {
                if (p[b] == '\n' && odd_line_after(p, end, b)) {
                    Py_RETURN_NONE;
                }
            }
        }
    }
    for (; k < end; k++) {
        if (p[k] >= 128 || (p[k] == '\n' && odd_line_after(p, end, k))) {
            Py_RETURN_NONE;
        }
        crlf |= p[k] == '\r';
    }
    Py_ssize_t from = start;
    if (end - from >= 5 && memcmp(p + from, "From ", 5) == 0) {  /* an mbox From line */
        const Py_UCS1 *nl = memchr(p + from, '\n', (size_t)(end - from));
        from = nl == NULL ? end : nl - p + 1;
        crlf = 0;
        for (Py_ssize_t k = from; k < end; k++) {
            crlf |= p[k] == '\r';
        }
    }
    if (from < end && (p[from] == ' ' || p[from] == '\t' || p[from] == ':')) {
        Py_RETURN_NONE;
    }
    Py_ssize_t to = end;
    if (!crlf && to > from && p[to - 1] == '\n') {
        to--;
    }
    /* "\n" + the block: what the regex split reads */
    Py_UCS1 *text = PyMem_Malloc((size_t)(to - from) + 1);
    if (text == NULL) {
        return PyErr_NoMemory();
    }
    text[0] = '\n';
    memcpy(text + 1, p + from, (size_t)(to - from));
    PyObject *out = fields_of(text, to - from + 1, crlf);
    PyMem_Free(text);
    return out;
}

/* ------------------------------------------------------------------ header_index
 *
 * header_index(pairs) -> (names, index), or None: mime.Part.names() and
 * Part.header_index() of a list of (name, value) tuples in one pass: the names
 * lower-cased, in order (repeats kept), and a dict of lower-case name -> its values in
 * order (new lists). None when a name is not an ASCII str (the Python code decides). */
static PyObject *
ascii_lower(PyObject *s)
{
    const Py_UCS1 *p = PyUnicode_1BYTE_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), i = 0;
    while (i < n && !(p[i] >= 'A' && p[i] <= 'Z')) {
        i++;
    }
    if (i == n) {
        Py_INCREF(s);
        return s;
    }
    return ascii_lower_str(p, n);
}

static PyObject *
header_index(PyObject *self, PyObject *pairs)
{
    (void)self;
    if (!PyList_Check(pairs)) {
        PyErr_SetString(PyExc_TypeError, "header_index(pairs): pairs must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(pairs);
    PyObject *names = PyList_New(n), *index = PyDict_New();
    if (names == NULL || index == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "header_index: each pair must be a (name, value) tuple");
            goto fail;
        }
        PyObject *name = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        if (!PyUnicode_Check(name) || !PyUnicode_IS_ASCII(name)) {
            Py_DECREF(names);
            Py_DECREF(index);
            Py_RETURN_NONE;
        }
        PyObject *key = ascii_lower(name);
        if (key == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(names, i, key); /* (the list holds the reference) */
        PyObject *values = PyDict_GetItemWithError(index, key);
        if (values != NULL) {
            if (PyList_Append(values, value) < 0) {
                goto fail;
            }
            continue;
        }
        if (PyErr_Occurred()) {
            goto fail;
        }
        values = PyList_New(1);
        if (values == NULL) {
            goto fail;
        }
        Py_INCREF(value);
        PyList_SET_ITEM(values, 0, value);
        int rc = PyDict_SetItem(index, key, values);
        Py_DECREF(values);
        if (rc < 0) {
            goto fail;
        }
    }
    return Py_BuildValue("(NN)", names, index);
fail:
    Py_XDECREF(names);
    Py_XDECREF(index);
    return NULL;
}

/* ------------------------------------------------------------------ header_tokens
 *
 * header_tokens(names, index, spec, cache, analysis): HeaderTokenizer.add(names,
 * index.get, analysis) for an index of lists of values (mime.Part.header_index()): the
 * same tokens appended to analysis.tokens in the same order, the same recipients,
 * received and defects counts. spec is HeaderTokenizer.spec (headers, header_names,
 * max_header_chars, text_cap, cache_size, cached_chars, value_tokens, address_count,
 * decode_header, received_tokens, address_defect): what the loop calls back into Python
 * for (a value not yet in `cache`, encoded words, a Received value that is not Latin-1:
 * the others go to the C received_tokens) and its bounds. The Python method is the
 * reference (tests/streamnb/features/test_speedups.py). */
static PyObject *S_none_suffix, *S_header_prefix, *S_message_id_prefix, *S_no_domain,
    *S_comma_space, *S_encoded_word, *S_strip_chars, *S_strip, *S_defect_address,
    *S_tokens, *S_recipients, *S_received, *S_defects;

/* `cache[key] = value`, emptying the cache first when it holds `size` entries. */
static int
remember(PyObject *cache, PyObject *key, PyObject *value, Py_ssize_t size)
{
    if (PyDict_GET_SIZE(cache) >= size) {
        PyDict_Clear(cache);
    }
    return PyDict_SetItem(cache, key, value);
}

/* cache[key], or fn(arg1[, arg2]) remembered there under key when the value it is made
 * of is at most cached_chars long (a new reference; NULL with an exception set). */
static PyObject *
memo(PyObject *cache, PyObject *key, Py_ssize_t length, Py_ssize_t cached_chars, Py_ssize_t cache_size,
     PyObject *fn, PyObject *arg1, PyObject *arg2)
{
    PyObject *hit = PyDict_GetItemWithError(cache, key);
    if (hit != NULL) {
        Py_INCREF(hit);
        return hit;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    hit = arg2 == NULL ? PyObject_CallOneArg(fn, arg1) : PyObject_CallFunctionObjArgs(fn, arg1, arg2, NULL);
    if (hit != NULL && length <= cached_chars && remember(cache, key, hit, cache_size) < 0) {
        Py_CLEAR(hit);
    }
    return hit;
}

/* analysis.<name> = n, or += n with `add`; -1 with an exception set on error. */
static int
set_count(PyObject *a, PyObject *name, Py_ssize_t n, int add)
{
    PyObject *value = PyLong_FromSsize_t(n);
    if (value != NULL && add) {
        PyObject *before = PyObject_GetAttr(a, name);
        Py_SETREF(value, before == NULL ? NULL : PyNumber_Add(before, value));
        Py_XDECREF(before);
    }
    int rc = value == NULL ? -1 : PyObject_SetAttr(a, name, value);
    Py_XDECREF(value);
    return rc;
}

static int
name_is(PyObject *name, const char *s)
{
    return PyUnicode_CompareWithASCIIString(name, s) == 0;
}

/* value[:cap] for a str, str(value)[:cap] otherwise (new reference). */
static PyObject *
str_prefix(PyObject *value, Py_ssize_t cap)
{
    PyObject *s = PyUnicode_CheckExact(value) ? (Py_INCREF(value), value) : PyObject_Str(value);
    if (s == NULL) {
        return NULL;
    }
    PyObject *cut = PyUnicode_Substring(s, 0, cap);
    Py_DECREF(s);
    return cut;
}

/* The text of one header value, as _headers takes it (new reference). */
static PyObject *
value_text(PyObject *value, Py_ssize_t cap, Py_ssize_t text_cap, PyObject *decode_header)
{
    if (PyUnicode_CheckExact(value)) {
        Py_ssize_t at = PyUnicode_Find(value, S_encoded_word, 0, PY_SSIZE_T_MAX, 1);
        if (at == -2) {
            return NULL;
        }
        if (at == -1) {
            return PyUnicode_Substring(value, 0, text_cap);
        }
    }
    PyObject *capobj = PyLong_FromSsize_t(cap);
    if (capobj == NULL) {
        return NULL;
    }
    PyObject *decoded = PyObject_CallFunctionObjArgs(decode_header, value, capobj, NULL);
    Py_DECREF(capobj);
    if (decoded == NULL) {
        return NULL;
    }
    if (!PyUnicode_Check(decoded)) {
        Py_DECREF(decoded);
        PyErr_SetString(PyExc_TypeError, "header_tokens: decode_header must return a str");
        return NULL;
    }
    PyObject *cut = PyUnicode_Substring(decoded, 0, 2000);
    Py_DECREF(decoded);
    return cut;
}

/* The message-id: token of one value (new reference). */
static PyObject *
message_id_token(PyObject *text)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_ssize_t at = PyUnicode_FindChar(text, '@', 0, n, -1);
    if (at == -2) {
        return NULL;
    }
    PyObject *dom = NULL;
    if (at >= 0) {
        PyObject *tail = PyUnicode_Substring(text, at + 1, n);
        PyObject *stripped = tail == NULL ? NULL : PyObject_CallMethodOneArg(tail, S_strip, S_strip_chars);
        Py_XDECREF(tail);
        dom = stripped == NULL ? NULL : PyObject_CallMethodNoArgs(stripped, S_lower);
        Py_XDECREF(stripped);
        if (dom == NULL) {
            return NULL;
        }
    }
    PyObject *cut;
    if (dom == NULL || PyUnicode_GET_LENGTH(dom) == 0) {
        Py_INCREF(S_no_domain);
        cut = S_no_domain;
    }
    else {
        cut = PyUnicode_Substring(dom, 0, 60);
    }
    Py_XDECREF(dom);
    if (cut == NULL) {
        return NULL;
    }
    PyObject *token = PyUnicode_Concat(S_message_id_prefix, cut);
    Py_DECREF(cut);
    return token;
}

/* The header:<name> tokens: each name once, in order, cut to 40 characters when one is
 * longer (then each cut name once). */
static int
header_name_tokens(PyObject *names, PyObject *tokens)
{
    PyObject *keys = PyDict_New();
    if (keys == NULL) {
        return -1;
    }
    Py_ssize_t longest = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "header_tokens: names must be str");
            goto fail;
        }
        if (PyDict_SetDefault(keys, name, Py_None) == NULL) {
            goto fail;
        }
        if (PyUnicode_GET_LENGTH(name) > longest) {
            longest = PyUnicode_GET_LENGTH(name);
        }
    }
    if (longest > 40) {
        PyObject *cut_keys = PyDict_New();
        if (cut_keys == NULL) {
            goto fail;
        }
        Py_ssize_t pos = 0;
        PyObject *key, *ignored;
        while (PyDict_Next(keys, &pos, &key, &ignored)) {
            PyObject *cut = PyUnicode_Substring(key, 0, 40);
            if (cut == NULL || PyDict_SetDefault(cut_keys, cut, Py_None) == NULL) {
                Py_XDECREF(cut);
                Py_DECREF(cut_keys);
                goto fail;
            }
            Py_DECREF(cut);
        }
        Py_SETREF(keys, cut_keys);
    }
    Py_ssize_t pos = 0;
    PyObject *key, *ignored;
    while (PyDict_Next(keys, &pos, &key, &ignored)) {
        if (append_new(tokens, PyUnicode_Concat(S_header_prefix, key)) < 0) {
            goto fail;
        }
    }
    Py_DECREF(keys);
    return 0;
fail:
    Py_DECREF(keys);
    return -1;
}

/* The recipients of one To or Cc header (its values joined by ", "), from the cache or
 * address_count(joined); -2 with an exception set on error (-1: unreadable). */
static Py_ssize_t
recipient_count(PyObject *values, Py_ssize_t cap, PyObject *cache, Py_ssize_t cache_size,
                Py_ssize_t cached_chars, PyObject *address_count)
{
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *pieces = PyList_New(n);
    if (pieces == NULL) {
        return -2;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *piece = str_prefix(PyList_GET_ITEM(values, i), cap);
        if (piece == NULL) {
            Py_DECREF(pieces);
            return -2;
        }
        PyList_SET_ITEM(pieces, i, piece);
    }
    PyObject *joined = PyUnicode_Join(S_comma_space, pieces);
    Py_DECREF(pieces);
    if (joined == NULL) {
        return -2;
    }
    PyObject *count = memo(cache, joined, PyUnicode_GET_LENGTH(joined), cached_chars, cache_size,
                           address_count, joined, NULL);
    Py_DECREF(joined);
    if (count == NULL) {
        return -2;
    }
    Py_ssize_t c = PyLong_AsSsize_t(count);
    Py_DECREF(count);
    if (c == -1 && PyErr_Occurred()) {
        return -2;
    }
    return c < 0 ? -1 : c;
}

/* The tokens of one value of a header that is memoised: cache[(name, text)] or
 * value_tokens(name, text); 1 if they are address_defect, 0 if not, -1 on error. */
static int
memo_value_tokens(PyObject *name, PyObject *text, PyObject *cache, Py_ssize_t cache_size,
                  Py_ssize_t cached_chars, PyObject *value_tokens, PyObject *address_defect,
                  PyObject *tokens)
{
    PyObject *key = PyTuple_Pack(2, name, text);
    if (key == NULL) {
        return -1;
    }
    PyObject *hit = memo(cache, key, PyUnicode_GET_LENGTH(text), cached_chars, cache_size, value_tokens,
                         name, text);
    Py_DECREF(key);
    if (hit == NULL) {
        return -1;
    }
    PyObject *seq = PySequence_Fast(hit, "header_tokens: value_tokens must return a sequence");
    int rc = seq == NULL ? -1 : 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++) {
        rc = PyList_Append(tokens, PySequence_Fast_GET_ITEM(seq, i));
    }
    Py_XDECREF(seq);
    int is_defect = hit == address_defect;
    Py_DECREF(hit);
    return rc < 0 ? -1 : is_defect;
}

static PyObject *
header_tokens(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PyTuple_Check(args[2]) ||
        PyTuple_GET_SIZE(args[2]) != 11 || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "header_tokens(names, index, spec, cache, analysis): a list, a dict, "
                        "an 11-tuple, a dict and a MailAnalysis");
        return NULL;
    }
    PyObject *names = args[0], *index = args[1], *spec = args[2], *cache = args[3], *a = args[4];
    PyObject *headers = PyTuple_GET_ITEM(spec, 0);
    int header_names = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 1));
    Py_ssize_t cap = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 2));
    Py_ssize_t text_cap = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 3));
    Py_ssize_t cache_size = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 4));
    Py_ssize_t cached_chars = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 5));
    PyObject *value_tokens = PyTuple_GET_ITEM(spec, 6), *address_count = PyTuple_GET_ITEM(spec, 7),
             *decode_header = PyTuple_GET_ITEM(spec, 8), *received_callback = PyTuple_GET_ITEM(spec, 9),
             *address_defect = PyTuple_GET_ITEM(spec, 10);
    if (header_names < 0 || PyErr_Occurred()) {
        return NULL;
    }
    if (!PyTuple_Check(headers)) {
        PyErr_SetString(PyExc_TypeError, "header_tokens: spec[0] must be a tuple of header names");
        return NULL;
    }
    PyObject *tokens = PyObject_GetAttr(a, S_tokens);
    if (tokens == NULL) {
        return NULL;
    }
    if (!PyList_Check(tokens)) {
        Py_DECREF(tokens);
        PyErr_SetString(PyExc_TypeError, "header_tokens: analysis.tokens must be a list");
        return NULL;
    }
    Py_ssize_t recipients = 0, received = -1, defects = 0;
    PyObject *text = NULL;
    if (header_names && header_name_tokens(names, tokens) < 0) {
        goto fail;
    }
    for (Py_ssize_t h = 0; h < PyTuple_GET_SIZE(headers); h++) {
        PyObject *name = PyTuple_GET_ITEM(headers, h);
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "header_tokens: header names must be str");
            goto fail;
        }
        PyObject *values = PyDict_GetItemWithError(index, name);
        if (values == NULL && PyErr_Occurred()) {
            goto fail;
        }
        if (values != NULL && !PyList_Check(values)) {
            PyErr_SetString(PyExc_TypeError, "header_tokens: index values must be lists");
            goto fail;
        }
        if (values == NULL || PyList_GET_SIZE(values) == 0) {
            if (name_is(name, "subject") || name_is(name, "from") || name_is(name, "to") ||
                name_is(name, "message-id")) {
                if (append_new(tokens, PyUnicode_Concat(name, S_none_suffix)) < 0) {
                    goto fail;
                }
            }
            continue;
        }
        int is_received = name_is(name, "received"), is_message_id = name_is(name, "message-id");
        if (name_is(name, "to") || name_is(name, "cc")) {
            Py_ssize_t count = recipient_count(values, cap, cache, cache_size, cached_chars, address_count);
            if (count == -2) {
                goto fail;
            }
            if (count < 0) {
                defects++;
                if (PyList_Append(tokens, S_defect_address) < 0) {
                    goto fail;
                }
            }
            else {
                recipients += count;
            }
        }
        else if (is_received) {
            received = PyList_GET_SIZE(values);
        }
        Py_ssize_t n = PyList_GET_SIZE(values) < 32 ? PyList_GET_SIZE(values) : 32;
        for (Py_ssize_t v = 0; v < n; v++) {
            /* (the values are read one at a time: every text is made before any is used in
             * the Python code, but making one neither depends on nor changes the others) */
            text = value_text(PyList_GET_ITEM(values, v), cap, text_cap, decode_header);
            if (text == NULL) {
                goto fail;
            }
            if (is_received) {  /* the C rule, or for a value that is not Latin-1 the callback */
                PyObject *argv[2] = {text, tokens};
                PyObject *r = received_tokens(NULL, argv, 2);
                if (r == Py_False) {
                    Py_SETREF(r, PyObject_CallFunctionObjArgs(received_callback, text, tokens, NULL));
                }
                if (r == NULL) {
                    goto fail;
                }
                Py_DECREF(r);
            }
            else if (is_message_id) {
                if (append_new(tokens, message_id_token(text)) < 0) {
                    goto fail;
                }
            }
            else {
                int rc = memo_value_tokens(name, text, cache, cache_size, cached_chars, value_tokens,
                                           address_defect, tokens);
                if (rc < 0) {
                    goto fail;
                }
                defects += rc;
            }
            Py_CLEAR(text);
        }
    }
    Py_DECREF(tokens);
    tokens = NULL;
    /* the counts, as the Python code leaves them */
    if ((recipients && set_count(a, S_recipients, recipients, 1) < 0) ||
            (received >= 0 && set_count(a, S_received, received, 0) < 0) ||
            (defects && set_count(a, S_defects, defects, 1) < 0)) {
        return NULL;
    }
    Py_RETURN_NONE;
fail:
    Py_XDECREF(text);
    Py_XDECREF(tokens);
    return NULL;
}

/* ------------------------------------------------------------------ addresses
 *
 * addresses(field) -> list of (display name, address), False, or None: mail_headers._getaddresses'
 * loop of mail_headers._ADDRESS matches on a Latin-1 str (its reference), where
 *
 *   ATOM   [^()<>@,:;"\[\]\\ \t\r\n]+     QUOTED  "[^"\\\r]*"      WS  [ \t\r\n]
 *   WS* ( ((QUOTED|ATOM)(WS+ (QUOTED|ATOM))*) WS* )? < WS* (ATOM@ATOM) [ \t]* >
 *       | (ATOM@ATOM) ([ \t]* \( ([^()\\\r]*) \))?
 *   WS* (, | end)
 *
 * Every repetition there can only succeed at its longest (what may follow each one cannot
 * start it), so one forward scan decides each match. False where a match fails (the caller
 * asks email.utils.getaddresses), None for text beyond Latin-1 (the caller runs the regex). */
static unsigned char is_atom1[256];

static inline int
is_ws(Py_UCS1 c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* The end of the longest ATOM at p[i] (i if none). */
static inline Py_ssize_t
atom_end(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i)
{
    while (i < n && is_atom1[p[i]]) {
        i++;
    }
    return i;
}

/* The end of a phrase word (QUOTED or ATOM) at p[i], or -1. */
static Py_ssize_t
phrase_word_end(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i)
{
    if (i < n && p[i] == '"') {
        for (Py_ssize_t j = i + 1; j < n; j++) {
            if (p[j] == '"') {
                return j + 1;
            }
            if (p[j] == '\\' || p[j] == '\r') {
                return -1;
            }
        }
        return -1;
    }
    Py_ssize_t j = atom_end(p, n, i);
    return j > i ? j : -1;
}

/* The end of ATOM@ATOM at p[i], or -1. */
static Py_ssize_t
addr_spec_end(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i)
{
    Py_ssize_t j = atom_end(p, n, i);
    if (j == i || j >= n || p[j] != '@') {
        return -1;
    }
    Py_ssize_t k = atom_end(p, n, j + 1);
    return k > j + 1 ? k : -1;
}

/* After a match's address: WS* then ',' or the end; the position after it, or -1. */
static Py_ssize_t
list_sep_end(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i)
{
    while (i < n && is_ws(p[i])) {
        i++;
    }
    if (i == n) {
        return n;
    }
    return p[i] == ',' ? i + 1 : -1;
}

/* The display name of a phrase p[from:to] (its words, quotes taken off, joined by one
 * space), a new str. */
static PyObject *
phrase_name(const Py_UCS1 *p, Py_ssize_t from, Py_ssize_t to)
{
    Py_UCS1 *buf = PyMem_Malloc((size_t)(to - from) + 1);
    if (buf == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t used = 0, i = from, words = 0;
    while (i < to) {
        while (i < to && is_ws(p[i])) {
            i++;
        }
        if (i >= to) {
            break;
        }
        Py_ssize_t end = phrase_word_end(p, to, i);
        if (words++ > 0) {  /* (after an empty quoted word too: "" Bob is " Bob") */
            buf[used++] = ' ';
        }
        Py_ssize_t a = i, b = end;
        if (p[i] == '"') {
            a++, b--;
        }
        memcpy(buf + used, p + a, (size_t)(b - a));
        used += b - a;
        i = end;
    }
    PyObject *name = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, buf, used);
    PyMem_Free(buf);
    return name;
}

static PyObject *
addresses(PyObject *self, PyObject *field)
{
    (void)self;
    if (!PyUnicode_Check(field)) {
        PyErr_SetString(PyExc_TypeError, "addresses(field): field must be a str");
        return NULL;
    }
    if (PyUnicode_KIND(field) != PyUnicode_1BYTE_KIND) {
        Py_RETURN_NONE;
    }
    const Py_UCS1 *p = PyUnicode_1BYTE_DATA(field);
    Py_ssize_t n = PyUnicode_GET_LENGTH(field), pos = 0;
    PyObject *pairs = PyList_New(0);
    if (pairs == NULL) {
        return NULL;
    }
    while (pos < n) {
        Py_ssize_t i = pos;
        while (i < n && is_ws(p[i])) {
            i++;
        }
        PyObject *pair = NULL;
        Py_ssize_t next = -1;
        /* the first alternative: an optional phrase, then <ATOM@ATOM> */
        Py_ssize_t phrase_to = i, j = i, w = phrase_word_end(p, n, i);
        if (w > 0) {
            phrase_to = w;
            for (;;) {  /* (WS+ word)*, at its longest */
                Py_ssize_t k = phrase_to;
                while (k < n && is_ws(p[k])) {
                    k++;
                }
                Py_ssize_t e = k > phrase_to ? phrase_word_end(p, n, k) : -1;
                if (e < 0) {
                    break;
                }
                phrase_to = e;
            }
            j = phrase_to;
            while (j < n && is_ws(p[j])) {
                j++;
            }
        }
        if (j < n && p[j] == '<') {
            Py_ssize_t a = j + 1;
            while (a < n && is_ws(p[a])) {
                a++;
            }
            Py_ssize_t a_end = addr_spec_end(p, n, a), k = a_end;
            while (k >= 0 && k < n && (p[k] == ' ' || p[k] == '\t')) {
                k++;
            }
            if (a_end > 0 && k < n && p[k] == '>' && (next = list_sep_end(p, n, k + 1)) >= 0) {
                PyObject *name = phrase_to > i ? phrase_name(p, i, phrase_to) : PyUnicode_New(0, 127);
                PyObject *addr = name == NULL ? NULL : PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, p + a,
                                                                                   a_end - a);
                pair = addr == NULL ? NULL : PyTuple_Pack(2, name, addr);
                Py_XDECREF(name);
                Py_XDECREF(addr);
                if (pair == NULL) {
                    Py_DECREF(pairs);
                    return NULL;
                }
            }
        }
        if (pair == NULL) {  /* the second alternative: ATOM@ATOM, an optional (comment) */
            Py_ssize_t a_end = addr_spec_end(p, n, i);
            if (a_end < 0) {
                Py_DECREF(pairs);
                Py_RETURN_FALSE;
            }
            Py_ssize_t c = a_end, c_from = -1, c_to = -1;
            while (c < n && (p[c] == ' ' || p[c] == '\t')) {
                c++;
            }
            if (c < n && p[c] == '(') {
                Py_ssize_t d = c + 1;
                while (d < n && p[d] != '(' && p[d] != ')' && p[d] != '\\' && p[d] != '\r') {
                    d++;
                }
                if (d < n && p[d] == ')' && (next = list_sep_end(p, n, d + 1)) >= 0) {
                    c_from = c + 1, c_to = d;
                }
            }
            if (c_from < 0 && (next = list_sep_end(p, n, a_end)) < 0) {
                Py_DECREF(pairs);
                Py_RETURN_FALSE;
            }
            PyObject *name = c_from >= 0 ? PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, p + c_from, c_to - c_from)
                                         : PyUnicode_New(0, 127);
            PyObject *addr = name == NULL ? NULL : PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, p + i, a_end - i);
            pair = addr == NULL ? NULL : PyTuple_Pack(2, name, addr);
            Py_XDECREF(name);
            Py_XDECREF(addr);
            if (pair == NULL) {
                Py_DECREF(pairs);
                return NULL;
            }
        }
        if (append_new(pairs, pair) < 0) {
            Py_DECREF(pairs);
            return NULL;
        }
        pos = next;
    }
    return pairs;
}

/* ------------------------------------------------------------------ the passes of strip_html
 *
 * clean_passes: the first three passes of markup.strip_html on Latin-1 markup (for
 * html_strip, below; the regexes are the reference), the second and third in one walk
 * over the markup (drop_declarations_and_scripts):
 *
 *   _COMMENT      <!--.*?(?:-->|$)                               (DOTALL) -> ""
 *   _DECLARATION  <[!?][^<>]{0,2000}>                                     -> " "
 *   _DROP         <(script|style)\b[^<>]*>.*?(?:</\1\s*>|$)      (DOTALL, IGNORECASE)
 *                                                                          -> " <\1> "
 *
 * `$` (no MULTILINE) matches at the end and before a line break that ends the text; a
 * lazy `.*?` takes the first place where its alternative matches. On Latin-1 text
 * IGNORECASE folds only the ASCII letters. */

/* Where a lazy .*? ending in `$` stops when nothing before matches: before a final line
 * break, if there is one at or after `from`, else at the end. */
static Py_ssize_t
dollar_at(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t from)
{
    return (n > 0 && p[n - 1] == '\n' && n - 1 >= from) ? n - 1 : n;
}

/* The passes below read a Latin-1 text p (markup, or the stand-in of markup beyond
 * Latin-1: latin1_stand_in) and write out; with wp (the markup's own characters, one
 * Py_UCS4 each, where p is a stand-in) they copy the same characters from wp to wout.
 * What they write besides copies is ASCII, the same in both. */
#define PUT(c) do { Py_UCS1 c_ = (c); if (wout != NULL) { wout[used] = c_; } out[used++] = c_; } while (0)

/* Copy p[from:to] to out at *used (and wp's to wout). The passes below copy the text
 * between what they replace with it, once they replace something, and the rest at the end. */
static inline void
copy_run(const Py_UCS1 *p, Py_ssize_t from, Py_ssize_t to, Py_UCS1 *out, Py_ssize_t *used,
         const Py_UCS4 *wp, Py_UCS4 *wout)
{
    memcpy(out + *used, p + from, (size_t)(to - from));
    if (wp != NULL) {
        memcpy(wout + *used, wp + from, (size_t)(to - from) * sizeof(Py_UCS4));
    }
    *used += to - from;
}

/* The next '<' in p[i:n], or n. */
static inline Py_ssize_t
next_lt(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t i)
{
    const Py_UCS1 *lt = i < n ? memchr(p + i, '<', (size_t)(n - i)) : NULL;
    return lt == NULL ? n : lt - p;
}

/* Pass 1: comments removed. Writes to out (room for n), returns the new length. */
static Py_ssize_t
drop_comments(const Py_UCS1 *p, Py_ssize_t n, Py_UCS1 *out, const Py_UCS4 *wp, Py_UCS4 *wout)
{
    Py_ssize_t i = 0, used = 0, copied = 0, k;
    while ((k = next_lt(p, n, i)) < n) {
        if (k + 4 > n || memcmp(p + k, "<!--", 4) != 0) {
            i = k + 1;
            continue;
        }
        Py_ssize_t m = k + 4, end = -1;
        for (; m + 3 <= n; m++) {
            const Py_UCS1 *dash = memchr(p + m, '-', (size_t)(n - m));
            if (dash == NULL) {
                break;
            }
            m = dash - p;
            if (m + 3 <= n && p[m + 1] == '-' && p[m + 2] == '>') {
                end = m + 3;
                break;
            }
        }
        copy_run(p, copied, k, out, &used, wp, wout);
        copied = i = end >= 0 ? end : dollar_at(p, n, k + 4);
    }
    copy_run(p, copied, n, out, &used, wp, wout);
    return used;
}

/* Where the declaration or processing instruction of pass 2 that starts at the '<' at
 * p[k] ends (past its '>'), or -1 if none starts there. */
static inline Py_ssize_t
declaration_end(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t k)
{
    if (k + 1 >= n || (p[k + 1] != '!' && p[k + 1] != '?')) {
        return -1;
    }
    Py_ssize_t j = k + 2;
    while (j < n && j - (k + 2) < 2000 && p[j] != '<' && p[j] != '>') {
        j++;
    }
    return j < n && p[j] == '>' ? j + 1 : -1;
}

/* The first of p[j:n] past `skip` characters (is_space1 or none) and the declarations
 * among them: what pass 3 finds there in the output of pass 2, where each declaration is
 * a space. */
static inline Py_ssize_t
past_declarations(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t j, const unsigned char *skip)
{
    Py_ssize_t e;
    for (;;) {
        while (j < n && skip != NULL && skip[p[j]]) {
            j++;
        }
        if (j < n && p[j] == '<' && (e = declaration_end(p, n, j)) >= 0) {
            j = e;
            continue;
        }
        return j;
    }
}

/* Passes 2 and 3 in one: declarations and processing instructions become a space, and
 * script and style elements " <name> ", as pass 3 reads the output of pass 2 (a
 * declaration, which holds no '<', is one space there: where pass 3 reads a run of
 * [^<>] or of white space, it reads past one). out has room for n + 2. */
static Py_ssize_t
drop_declarations_and_scripts(const Py_UCS1 *p, Py_ssize_t n, Py_UCS1 *out, const Py_UCS4 *wp,
                              Py_UCS4 *wout)
{
    Py_ssize_t i = 0, used = 0, copied = 0, k, e;
    while ((k = next_lt(p, n, i)) < n) {
        i = k + 1;
        if ((e = declaration_end(p, n, k)) >= 0) {
            copy_run(p, copied, k, out, &used, wp, wout);
            PUT(' ');
            copied = i = e;
            continue;
        }
        const char *name = ci_at(p, n, k + 1, "script") ? "script" : ci_at(p, n, k + 1, "style") ? "style" : NULL;
        Py_ssize_t len = name == NULL ? 0 : (Py_ssize_t)strlen(name), j = k + 1 + len;
        if (name == NULL || (j < n && is_word1[p[j]])) { /* \b after the name */
            continue;
        }
        for (;;) { /* [^<>]* */
            while (j < n && p[j] != '<' && p[j] != '>') {
                j++;
            }
            Py_ssize_t past = past_declarations(p, n, j, NULL);
            if (past == j) {
                break;
            }
            j = past;
        }
        if (j >= n || p[j] != '>') {
            continue;
        }
        /* the body: up to the first closing tag of the same name, else to `$` */
        Py_ssize_t m = j + 1, end = -1;
        while (m < n) {
            const Py_UCS1 *close = memchr(p + m, '<', (size_t)(n - m));
            if (close == NULL) {
                break;
            }
            m = close - p;
            if (m + 1 < n && p[m + 1] == '/' && ci_at(p, n, m + 2, name)) {
                Py_ssize_t t = past_declarations(p, n, m + 2 + len, is_space1);
                if (t < n && p[t] == '>') {
                    end = t + 1;
                    break;
                }
            }
            m++;
        }
        if (end < 0) {
            end = dollar_at(p, n, j + 1);
        }
        copy_run(p, copied, k, out, &used, wp, wout);
        PUT(' ');
        PUT('<');
        for (Py_ssize_t t = 0; t < len; t++) { /* the name as written (ASCII) */
            PUT(p[k + 1 + t]);
        }
        PUT('>');
        PUT(' ');
        copied = i = end;
    }
    copy_run(p, copied, n, out, &used, wp, wout);
    return used;
}

/* The three passes on p[0:n], the result in *result: p, a or b (its length returned); a and b
 * have room for n + 3 characters; with wp, the same for the characters of wp, wa and wb
 * into *wresult. */
static Py_ssize_t
clean_passes(const Py_UCS1 *p, Py_ssize_t n, Py_UCS1 *a, Py_UCS1 *b, const Py_UCS1 **result,
             const Py_UCS4 *wp, Py_UCS4 *wa, Py_UCS4 *wb, const Py_UCS4 **wresult)
{
    /* What the passes act on, looked for first: a pass with nothing to act on leaves its
     * input as it is, and is skipped. Without a comment the input's declarations are
     * those pass 2 sees, and its scripts those pass 3 sees (pass 2 makes a declaration, which
     * holds no '<', a space: it neither makes nor takes a "<script" or "<style"). */
    int comment = 0, declaration = 0, script = 0;
    const Py_UCS1 *lt = p, *end = p + n;
    while (!comment && (lt = memchr(lt, '<', (size_t)(end - lt))) != NULL) {
        Py_ssize_t k = lt - p;
        Py_UCS1 c = k + 1 < n ? p[k + 1] : 0;
        if (c == '!' || c == '?') {
            declaration = 1;
            comment = c == '!' && k + 3 < n && p[k + 2] == '-' && p[k + 3] == '-';
        }
        else if (!script && (c | 0x20) == 's') {
            script = ci_at(p, n, k + 1, "script") || ci_at(p, n, k + 1, "style");
        }
        lt++;
    }
    if (comment) {
        Py_ssize_t m = drop_comments(p, n, a, wp, wa);
        *result = b, *wresult = wb; /* (wa and wb are NULL without wp) */
        return drop_declarations_and_scripts(a, m, b, wa, wb);
    }
    if (declaration || script) {
        *result = a, *wresult = wa;
        return drop_declarations_and_scripts(p, n, a, wp, wa);
    }
    *result = p, *wresult = wp;
    return n;
}

/* ------------------------------------------------------------------ html_strip
 *
 * html_strip(markup, max_tag_tokens[, hashes]) -> (text, tokens) or None: markup.strip_html
 * in one call, before html.unescape (which the caller applies to text):
 * the three passes (clean_passes), then the tags of the split (next_tag), the text between
 * them joined by one space (" ".join(pieces[::4])), and tag_tokens' tokens of the tags,
 * without a str per piece of the split. With the bytearray `hashes` (not None), the tokens'
 * stable hashes are appended to it instead (native uint64, as word_hashes appends them;
 * the token table must be made) and `tokens` is empty. Markup beyond Latin-1 is read
 * through its stand-in (latin1_stand_in); None for the markup that declines (the caller
 * runs the steps one by one). */
static PyObject *
html_strip(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 2 && nargs != 3) || !PyUnicode_Check(args[0]) || !PyLong_Check(args[1])
        || (nargs == 3 && args[2] != Py_None && !PyByteArray_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "html_strip(markup, max_tag_tokens[, hashes]): a str, an int "
                        "and a bytearray or None");
        return NULL;
    }
    PyObject *markup = args[0], *hashes = nargs == 3 && args[2] != Py_None ? args[2] : NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "html_strip: max_tag_tokens must be >= 0");
        return NULL;
    }
    if (hashes != NULL && slots == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "html_strip: call hash_cache_init first");
        return NULL;
    }
    /* markup beyond Latin-1: the passes and tags read its stand-in (latin1_stand_in: the
     * same decisions; the tokens are ASCII), the text is copied from its own characters */
    Py_UCS1 *stand_in = NULL;
    const Py_UCS1 *p = PyUnicode_1BYTE_DATA(markup);
    Py_ssize_t n = PyUnicode_GET_LENGTH(markup);
    if (PyUnicode_KIND(markup) != PyUnicode_1BYTE_KIND) {
        if ((stand_in = latin1_stand_in(markup)) == NULL) {
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        p = stand_in;
    }
    if (memchr(p, '<', (size_t)n) == NULL) { /* no markup: the text as it is, no tokens */
        PyMem_Free(stand_in);
        PyObject *tokens = PyList_New(0);
        return tokens == NULL ? NULL : Py_BuildValue("(ON)", markup, tokens);
    }
    PyObject *result = NULL, *tokens = PyList_New(0);
    sink_t sink = {hashes == NULL ? tokens : NULL, NULL, 0, 0};
    Py_UCS1 *a = PyMem_Malloc((size_t)n + 3), *b = PyMem_Malloc((size_t)n + 3);
    Py_UCS4 *wp = NULL, *wa = NULL, *wb = NULL; /* (markup beyond Latin-1) */
    if (stand_in != NULL) {
        wp = PyUnicode_AsUCS4Copy(markup);
        wa = PyMem_Malloc(((size_t)n + 3) * sizeof(Py_UCS4));
        wb = PyMem_Malloc(((size_t)n + 3) * sizeof(Py_UCS4));
        if (wp == NULL || wa == NULL || wb == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_NoMemory();
            }
            goto done;
        }
    }
    if (tokens == NULL || a == NULL || b == NULL) {
        if (tokens != NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    const Py_UCS1 *clean;
    const Py_UCS4 *wclean = NULL;
    Py_ssize_t m = clean_passes(p, n, a, b, &clean, wp, wa, wb, &wclean);
    /* the text into the other buffer (one space for each tag: never longer than the
     * markup), the tokens of each tag as it is found until no more can come */
    Py_UCS1 *text = clean == b ? a : b;
    Py_UCS4 *wtext = wclean == wb ? wa : wb;
    Py_ssize_t used = 0, text_from = 0, i, end, cut = limit;
    int more_tokens = 1;
    tag_t tag;
    while ((i = next_tag(clean, m, text_from, &tag, &end)) >= 0) {
        memcpy(text + used, clean + text_from, (size_t)(i - text_from));
        if (wp != NULL) {
            memcpy(wtext + used, wclean + text_from, (size_t)(i - text_from) * sizeof(Py_UCS4));
            wtext[used + i - text_from] = ' ';
        }
        used += i - text_from;
        text[used++] = ' ';
        if (more_tokens) {
            int rc = tag_tokens_of(&tag, limit, &sink, &cut);
            if (rc < 0) {
                goto done;
            }
            more_tokens = rc == 0;
        }
        text_from = end;
    }
    memcpy(text + used, clean + text_from, (size_t)(m - text_from));
    if (wp != NULL) {
        memcpy(wtext + used, wclean + text_from, (size_t)(m - text_from) * sizeof(Py_UCS4));
    }
    used += m - text_from;
    if (sink_len(&sink) > cut && sink_truncate(&sink, cut) < 0) {
        goto done;
    }
    if (hashes != NULL && sink.n > 0) {
        Py_ssize_t before = PyByteArray_GET_SIZE(hashes);
        if (PyByteArray_Resize(hashes, before + 8 * sink.n) < 0) {
            goto done;
        }
        memcpy(PyByteArray_AS_STRING(hashes) + before, sink.hashes, (size_t)sink.n * sizeof(uint64_t));
    }
    result = Py_BuildValue("(NN)", wp != NULL ? PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, wtext, used)
                                              : latin1_str(text, used), tokens);
    tokens = NULL; /* (stolen, or freed with the tuple on failure) */
done:
    Py_XDECREF(tokens);
    PyMem_Free(sink.hashes);
    PyMem_Free(stand_in);
    PyMem_Free(wp);
    PyMem_Free(wa);
    PyMem_Free(wb);
    PyMem_Free(a);
    PyMem_Free(b);
    return result;
}

/* ------------------------------------------------------------------ html_unescape
 *
 * html_unescape(text, html5, invalid_charrefs, invalid_codepoints, legacy_max) -> str:
 * html.unescape(text) of any str, the standard library's tables passed in (html.entities.
 * html5, html._invalid_charrefs, html._invalid_codepoints; legacy_max the longest name of
 * html5 without a ';'). The same matches as html._charref,
 *
 *   &(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)
 *
 * each replaced as html._replace_charref does: a numeric reference by its character (the
 * invalid ones as the tables say, surrogates and numbers past U+10FFFF as U+FFFD), a
 * name by html5[name], else by the longest prefix that is a name (only names without a
 * ';' can be one: up to legacy_max characters) and the rest, else left as it is. Tests
 * compare it with html.unescape, its reference. */

static inline int
is_hex_digit(Py_UCS4 c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static inline int
hex_value(Py_UCS4 c)
{
    return c <= '9' ? (int)(c - '0') : (int)((c | 0x20) - 'a' + 10);
}

static inline int
is_name_char(Py_UCS4 c)
{
    return c != '\t' && c != '\n' && c != '\f' && c != ' ' && c != '<' && c != '&' && c != '#' && c != ';';
}

/* The replacement of the numeric reference num (saturated past U+10FFFF) into w. */
static int
write_charref(_PyUnicodeWriter *w, long num, PyObject *invalid_charrefs, PyObject *invalid_codepoints)
{
    PyObject *key = PyLong_FromLong(num);
    if (key == NULL) {
        return -1;
    }
    PyObject *sub = PyDict_GetItemWithError(invalid_charrefs, key); /* borrowed */
    if (sub != NULL) {
        Py_DECREF(key);
        return PyUnicode_Check(sub) ? _PyUnicodeWriter_WriteStr(w, sub) : -1;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) {
        Py_DECREF(key);
        return _PyUnicodeWriter_WriteChar(w, 0xFFFD);
    }
    int invalid = PySet_Contains(invalid_codepoints, key);
    Py_DECREF(key);
    if (invalid < 0) {
        return -1;
    }
    return invalid ? 0 : _PyUnicodeWriter_WriteChar(w, (Py_UCS4)num);
}

/* The replacement of the named reference text[from:to] (to - from >= 1) into w. */
static int
write_named(_PyUnicodeWriter *w, PyObject *text, Py_ssize_t from, Py_ssize_t to, PyObject *html5,
            Py_ssize_t legacy_max)
{
    PyObject *name = PyUnicode_Substring(text, from, to);
    if (name == NULL) {
        return -1;
    }
    PyObject *sub = PyDict_GetItemWithError(html5, name); /* borrowed */
    Py_DECREF(name);
    if (sub != NULL) {
        return PyUnicode_Check(sub) ? _PyUnicodeWriter_WriteStr(w, sub) : -1;
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t x = to - from - 1;
    if (x > legacy_max) {
        x = legacy_max;
    }
    for (; x > 1; x--) {
        PyObject *prefix = PyUnicode_Substring(text, from, from + x);
        if (prefix == NULL) {
            return -1;
        }
        sub = PyDict_GetItemWithError(html5, prefix);
        Py_DECREF(prefix);
        if (sub != NULL) {
            if (!PyUnicode_Check(sub) || _PyUnicodeWriter_WriteStr(w, sub) < 0) {
                return -1;
            }
            return _PyUnicodeWriter_WriteSubstring(w, text, from + x, to);
        }
        if (PyErr_Occurred()) {
            return -1;
        }
    }
    return _PyUnicodeWriter_WriteSubstring(w, text, from - 1, to); /* '&' and the name */
}

static PyObject *
html_unescape(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyUnicode_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2])
        || !PyAnySet_Check(args[3]) || !PyLong_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "html_unescape(text, html5, invalid_charrefs, "
                        "invalid_codepoints, legacy_max): a str, two dicts, a set and an int");
        return NULL;
    }
    PyObject *text = args[0], *html5 = args[1], *charrefs = args[2], *codepoints = args[3];
    Py_ssize_t legacy_max = PyLong_AsSsize_t(args[4]);
    if (legacy_max == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_ssize_t amp = PyUnicode_FindChar(text, '&', 0, n, 1);
    if (amp == -2) {
        return NULL;
    }
    if (amp < 0) {
        return Py_NewRef(text);
    }
    _PyUnicodeWriter w;
    _PyUnicodeWriter_Init(&w);
    w.min_length = n;
    Py_ssize_t done = 0; /* text[:done] is written */
    while (amp >= 0) {
        Py_ssize_t i = amp + 1, end = -1;
        if (i < n && PyUnicode_READ(kind, data, i) == '#') {
            Py_UCS4 c = i + 1 < n ? PyUnicode_READ(kind, data, i + 1) : 0;
            int hex = (c == 'x' || c == 'X') && i + 2 < n && is_hex_digit(PyUnicode_READ(kind, data, i + 2));
            Py_ssize_t j = hex ? i + 2 : i + 1;
            long num = 0;
            while (j < n) {
                Py_UCS4 d = PyUnicode_READ(kind, data, j);
                if (hex ? !is_hex_digit(d) : !(d >= '0' && d <= '9')) {
                    break;
                }
                num = num * (hex ? 16 : 10) + (hex ? hex_value(d) : (int)(d - '0'));
                if (num > 0x110000) {
                    num = 0x110000; /* past U+10FFFF: U+FFFD whatever follows */
                }
                j++;
            }
            if (j > (hex ? i + 2 : i + 1)) { /* at least one digit */
                end = j < n && PyUnicode_READ(kind, data, j) == ';' ? j + 1 : j;
                if (_PyUnicodeWriter_WriteSubstring(&w, text, done, amp) < 0
                    || write_charref(&w, num, charrefs, codepoints) < 0) {
                    goto fail;
                }
            }
        }
        else {
            Py_ssize_t j = i;
            while (j < n && j - i < 32 && is_name_char(PyUnicode_READ(kind, data, j))) {
                j++;
            }
            if (j > i) {
                end = j < n && PyUnicode_READ(kind, data, j) == ';' ? j + 1 : j;
                if (_PyUnicodeWriter_WriteSubstring(&w, text, done, amp) < 0
                    || write_named(&w, text, i, end, html5, legacy_max) < 0) {
                    goto fail;
                }
            }
        }
        Py_ssize_t from = end >= 0 ? end : amp + 1;
        if (end >= 0) {
            done = end;
        }
        amp = from < n ? PyUnicode_FindChar(text, '&', from, n, 1) : -1;
        if (amp == -2) {
            goto fail;
        }
    }
    if (done == 0) {
        _PyUnicodeWriter_Dealloc(&w);
        return Py_NewRef(text);
    }
    if (_PyUnicodeWriter_WriteSubstring(&w, text, done, n) < 0) {
        goto fail;
    }
    return _PyUnicodeWriter_Finish(&w);
fail:
    _PyUnicodeWriter_Dealloc(&w);
    return NULL;
}

/* ------------------------------------------------------------------ wire_tokens
 *
 * The tokens payload of a stream entry (docs/protocol.md), hashed straight from its msgpack
 * bytes: no str is made per token. streamnb.features.wire_tokens holds the Python code
 * (its reference: msgpack.unpackb, then the token table) and tests compare both with
 * msgpack and hashlib.
 *
 * wire_tokens(data, max_tokens, max_str_len, max_map_len) -> (rest, hashes, start, end) or
 * None. `data` is one entry's msgpack map. When it is a well-formed map whose one "tokens"
 * key (a str) holds an array of at most max_tokens str items, each at most max_str_len
 * bytes of valid UTF-8, and the map has at most max_map_len pairs: `rest` is the map without
 * that pair (msgpack bytes, the other pairs as they were), `hashes` the tokens' stable
 * hashes (bytes of native uint64, from the token table: an ASCII token is looked up by the
 * table key of its bytes, which is its str's; a token beyond ASCII by the key of its
 * characters decoded from its UTF-8, and decoded into a str, as msgpack would, only on a
 * miss or where that decoding declines), and data[start:end] the array. Anything else, including
 * every malformed entry, is declined (None): msgpack then decodes the entry and the codec
 * gives its reason. */

#define WIRE_MAX_DEPTH 64

/* The n-byte big-endian unsigned integer at p. */
static inline uint64_t
be_uint(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* Past the msgpack item at p[*at:len] (and what it holds); 0 if it is malformed, cut short,
 * nested deeper than WIRE_MAX_DEPTH or an ext type (which the codec refuses anyway). */
static int
skip_item(const unsigned char *p, Py_ssize_t len, Py_ssize_t *at, int depth)
{
    if (*at >= len || depth > WIRE_MAX_DEPTH) {
        return 0;
    }
    unsigned char c = p[(*at)++];
    uint64_t n = 0, items = 0;
    Py_ssize_t left = len - *at;
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) {
        return 1;
    }
    if (c >= 0xa0 && c <= 0xbf) {
        n = c & 0x1f;
    }
    else if (c >= 0x80 && c <= 0x8f) {
        items = 2 * (uint64_t)(c & 0x0f);
    }
    else if (c >= 0x90 && c <= 0x9f) {
        items = c & 0x0f;
    }
    else {
        switch (c) {
        case 0xca: n = 4; break;
        case 0xcb: n = 8; break;
        case 0xcc: case 0xd0: n = 1; break;
        case 0xcd: case 0xd1: n = 2; break;
        case 0xce: case 0xd2: n = 4; break;
        case 0xcf: case 0xd3: n = 8; break;
        case 0xc4: case 0xd9:
        case 0xc5: case 0xda:
        case 0xc6: case 0xdb: {
            int w = (c == 0xc4 || c == 0xd9) ? 1 : (c == 0xc5 || c == 0xda) ? 2 : 4;
            if (left < w) {
                return 0;
            }
            n = be_uint(p + *at, w);
            *at += w;
            left -= w;
            break;
        }
        case 0xdc: case 0xdd: case 0xde: case 0xdf: {
            int w = (c == 0xdc || c == 0xde) ? 2 : 4;
            if (left < w) {
                return 0;
            }
            items = be_uint(p + *at, w) * (c >= 0xde ? 2 : 1);
            *at += w;
            break;
        }
        default:  /* 0xc1 (never used) and the ext types */
            return 0;
        }
    }
    if (n > (uint64_t)left) {
        return 0;
    }
    *at += (Py_ssize_t)n;
    for (uint64_t k = 0; k < items; k++) {  /* each item takes a byte at least: bounded by len */
        if (!skip_item(p, len, at, depth + 1)) {
            return 0;
        }
    }
    return 1;
}

/* The str item at p[*at:len]: its bytes' offset and length; 0 if it is not a str. */
static inline int
str_item(const unsigned char *p, Py_ssize_t len, Py_ssize_t *at, Py_ssize_t *start, Py_ssize_t *n)
{
    if (*at >= len) {
        return 0;
    }
    unsigned char c = p[*at];
    int w;
    uint64_t size;
    if (c >= 0xa0 && c <= 0xbf) {
        w = 0;
        size = c & 0x1f;
    }
    else if (c >= 0xd9 && c <= 0xdb) {
        w = c == 0xd9 ? 1 : c == 0xda ? 2 : 4;
        if (len - *at - 1 < w) {
            return 0;
        }
        size = be_uint(p + *at + 1, w);
    }
    else {
        return 0;
    }
    Py_ssize_t from = *at + 1 + w;
    if (size > (uint64_t)(len - from)) {
        return 0;
    }
    *start = from;
    *n = (Py_ssize_t)size;
    *at = from + (Py_ssize_t)size;
    return 1;
}

/* The array header at p[*at:len]: its number of items; 0 if it is not an array. */
static inline int
array_header(const unsigned char *p, Py_ssize_t len, Py_ssize_t *at, uint64_t *items)
{
    if (*at >= len) {
        return 0;
    }
    unsigned char c = p[*at];
    if (c >= 0x90 && c <= 0x9f) {
        *items = c & 0x0f;
        *at += 1;
        return 1;
    }
    if (c == 0xdc || c == 0xdd) {
        int w = c == 0xdc ? 2 : 4;
        if (len - *at - 1 < w) {
            return 0;
        }
        *items = be_uint(p + *at + 1, w);
        *at += 1 + w;
        return 1;
    }
    return 0;
}

/* The map header at p[0:len]: its number of pairs and where the first starts; 0 if not a map. */
static inline int
map_header(const unsigned char *p, Py_ssize_t len, uint64_t *pairs, Py_ssize_t *first)
{
    if (len < 1) {
        return 0;
    }
    unsigned char c = p[0];
    if (c >= 0x80 && c <= 0x8f) {
        *pairs = c & 0x0f;
        *first = 1;
        return 1;
    }
    if (c == 0xde || c == 0xdf) {
        int w = c == 0xde ? 2 : 4;
        if (len - 1 < w) {
            return 0;
        }
        *pairs = be_uint(p + 1, w);
        *first = 1 + w;
        return 1;
    }
    return 0;
}

/* The table key of a fixstr token of n <= 14 bytes at q[0:n] (a 1-byte-kind token's
 * characters), with *seen the bytes read ORed: what table_key gives, in its steps, for
 * these lengths (one load for n <= 7, two for 8-14; q[-1] and q[n:n+8] readable: the
 * loads read the header byte before it and bytes after it, which no result depends on).
 * tests/streamnb/features/test_wire_tokens.py checks that no token is entered twice in the
 * table, from the wire and as a str. */
static inline uint64_t
fixstr_key(const unsigned char *q, Py_ssize_t n, uint64_t *seen)
{
    uint64_t x;
    if (n <= 7) {
        uint64_t w = (load_le64(q - 1) >> 8) & ((((uint64_t)1) << (8 * n)) - 1);
        *seen = w;
        x = w | (uint64_t)n << 56;
    }
    else {
        uint64_t w0 = load_le64(q) & LOW56, w1 = load_le64(q + n - 8) >> (8 * (15 - n));
        uint64_t acc = mul_mod61(((uint64_t)n << 2) | 1, key_point) + w0;
        acc = mul_mod61(acc, key_point) + w1;
        *seen = w0 | w1;
        x = long_key(acc);
    }
    return mixed_key(x);
}

/* The characters of the well-formed UTF-8 s[0:n] (RFC 3629: what Python's strict decoder
 * takes), at most WIRE_WIDE_MAX of them, as a str of the narrowest kind holding them lays
 * them out in memory, into buf; *kind its width. 0 for anything else (not well-formed,
 * too long): the str path then decides. */
#define WIRE_WIDE_MAX 128
static int
utf8_as_str_data(const unsigned char *s, Py_ssize_t n, uint32_t *cp, unsigned char *buf,
                 Py_ssize_t *chars, int *kind)
{
    Py_ssize_t i = 0, m = 0;
    uint32_t top = 0;
    while (i < n) {
        unsigned char c = s[i];
        uint32_t v;
        int more;
        if (m >= WIRE_WIDE_MAX) {
            return 0;
        }
        if (c < 0x80) {
            v = c;
            more = 0;
        }
        else if (c >= 0xc2 && c <= 0xdf) {
            v = c & 0x1f;
            more = 1;
        }
        else if (c >= 0xe0 && c <= 0xef) {
            v = c & 0x0f;
            more = 2;
        }
        else if (c >= 0xf0 && c <= 0xf4) {
            v = c & 0x07;
            more = 3;
        }
        else {
            return 0;
        }
        if (n - i - 1 < more) {
            return 0;
        }
        for (int k = 1; k <= more; k++) {
            unsigned char d = s[i + k];
            if ((d & 0xc0) != 0x80) {
                return 0;
            }
            v = (v << 6) | (d & 0x3f);
        }
        /* overlong forms, surrogates, beyond U+10FFFF */
        if ((more == 2 && (v < 0x800 || (v >= 0xd800 && v <= 0xdfff))) ||
                (more == 3 && (v < 0x10000 || v > 0x10ffff))) {
            return 0;
        }
        cp[m++] = v;
        top |= v;
        i += 1 + more;
    }
    /* (top, the OR of the characters, is below 0x100 or 0x10000 exactly when each is) */
    int w = top < 0x100 ? 1 : top < 0x10000 ? 2 : 4;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (w == 1) {
            buf[j] = (unsigned char)cp[j];
        }
        else if (w == 2) {
            uint16_t u = (uint16_t)cp[j];
            memcpy(buf + 2 * j, &u, 2);
        }
        else {
            memcpy(buf + 4 * j, &cp[j], 4);
        }
    }
    *chars = m;
    *kind = w;
    return 1;
}

/* The key that stands for a token beyond ASCII in hash_wire_tokens: no slot holds it
 * (table_key never gives ~0, and 0 marks an empty slot). */
#define WIRE_NOT_ASCII (~(uint64_t)0)

/* The stable hashes of the `items` str items at p[*at:end] into out, *at moved past them;
 * 0 if one is not a str, too long or not UTF-8 (no exception set), -1 with an exception
 * set on an error of the miss function. An ASCII token is looked up by the table key of
 * its bytes (which are its str's characters), its ASCII check made on the bytes the key
 * reads; a token beyond ASCII is decoded (the UTF-8 check) and looked up as a str. The
 * keys of a block of tokens are made first, their slots fetched ahead, then looked up. */
static int
hash_wire_tokens(const unsigned char *p, Py_ssize_t end, Py_ssize_t *at, Py_ssize_t items,
                 Py_ssize_t max_str_len, uint64_t *out)
{
    Py_ssize_t t_head[HASH_BLOCK];  /* where each token's msgpack header is */
    uint64_t t_key[HASH_BLOCK];
    /* a fixstr of at most 14 bytes whose header starts 16 bytes or more before the end
     * (most tokens) is keyed from its bytes in place */
    Py_ssize_t pos = *at, fast_end = max_str_len >= 14 ? end - 16 : -1;
    for (Py_ssize_t b = 0; b < items; b += HASH_BLOCK) {
        Py_ssize_t m = items - b < HASH_BLOCK ? items - b : HASH_BLOCK;
        const slot_t *tab = slots;
        size_t mask = n_slots - 1;
        for (Py_ssize_t t = 0; t < m; t++) {
            uint64_t key, seen;
            unsigned int c;
            t_head[t] = pos;
            if (pos <= fast_end && (c = p[pos] - 0xa0u) <= 14) {  /* fixstr, 0-14 bytes */
                key = fixstr_key(p + pos + 1, (Py_ssize_t)c, &seen);
                pos += 1 + (Py_ssize_t)c;
            }
            else {
                Py_ssize_t s, n;
                if (!str_item(p, end, &pos, &s, &n) || n > max_str_len) {
                    return 0;
                }
                key = table_key(p + s, n, 1, &seen);
            }
            key = seen & HIGH_BITS7 ? WIRE_NOT_ASCII : key;
            PREFETCH(&tab[(size_t)key & mask]);
            t_key[t] = key;
        }
        for (Py_ssize_t t = 0; t < m; t++) {
            uint64_t key = t_key[t], there;
            size_t k = (size_t)key & mask;
            while ((there = tab[k].key) != key && there != 0) {
                k = (k + 1) & mask;
            }
            if (there == key) {
                out[b + t] = tab[k].value;
                continue;
            }
            Py_ssize_t h = t_head[t], s, n;
            (void)str_item(p, end, &h, &s, &n);  /* (read before: a str) */
            if (key == WIRE_NOT_ASCII) {  /* beyond ASCII: keyed as its str's characters */
                uint32_t cp[WIRE_WIDE_MAX];
                unsigned char buf[4 * WIRE_WIDE_MAX];
                Py_ssize_t chars;
                int kind;
                if (utf8_as_str_data(p + s, n, cp, buf, &chars, &kind)) {
                    uint64_t seen;
                    key = table_key(buf, chars * kind, kind, &seen);
                    k = (size_t)key & mask;
                    while ((there = tab[k].key) != key && there != 0) {
                        k = (k + 1) & mask;
                    }
                    if (there == key) {
                        out[b + t] = tab[k].value;
                        continue;
                    }
                    key = WIRE_NOT_ASCII;  /* (a miss: the str path below) */
                }
            }
            /* a miss, or a token beyond ASCII: the token as a str */
            PyObject *token = key != WIRE_NOT_ASCII ? ascii_str(p + s, n)
                                                    : PyUnicode_DecodeUTF8((const char *)p + s, n, "strict");
            if (token == NULL) {
                if (key == WIRE_NOT_ASCII && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    PyErr_Clear();
                    return 0;
                }
                return -1;
            }
            int rc = key != WIRE_NOT_ASCII ? cached_hash_of(token, key, &out[b + t])
                                           : cached_hash(token, &out[b + t]);
            Py_DECREF(token);
            if (rc < 0) {
                return -1;
            }
            /* (the miss function ran Python code, which may have made the table anew) */
            tab = slots;
            mask = n_slots - 1;
        }
    }
    *at = pos;
    return 1;
}

/* A msgpack map header of `pairs` pairs into q; its length. */
static Py_ssize_t
put_map_header(unsigned char *q, uint64_t pairs)
{
    if (pairs < 16) {
        q[0] = (unsigned char)(0x80 | pairs);
        return 1;
    }
    int w = pairs < 65536 ? 2 : 4;
    q[0] = w == 2 ? 0xde : 0xdf;
    for (int i = 0; i < w; i++) {
        q[1 + i] = (unsigned char)(pairs >> (8 * (w - 1 - i)));
    }
    return 1 + w;
}

static PyObject *
wire_tokens(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "wire_tokens(data, max_tokens, max_str_len, max_map_len): bytes and three ints");
        return NULL;
    }
    if (slots == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "wire_tokens: call hash_cache_init first");
        return NULL;
    }
    Py_ssize_t max_tokens = PyLong_AsSsize_t(args[1]), max_str_len = PyLong_AsSsize_t(args[2]);
    Py_ssize_t max_map_len = PyLong_AsSsize_t(args[3]);
    if ((max_tokens == -1 || max_str_len == -1 || max_map_len == -1) && PyErr_Occurred()) {
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]), at;
    uint64_t pairs;
    if (!map_header(p, len, &pairs, &at) || pairs > (uint64_t)max_map_len) {
        Py_RETURN_NONE;
    }
    Py_ssize_t first = at, key_at = -1, arr_at = -1, arr_end = -1;
    PyObject *hashes = NULL;
    for (uint64_t k = 0; k < pairs; k++) {
        Py_ssize_t here = at, s, n;
        uint64_t items;
        if (str_item(p, len, &at, &s, &n) && n == 6 && memcmp(p + s, "tokens", 6) == 0) {
            if (key_at >= 0) {
                goto decline;  /* a second "tokens": msgpack keeps the last */
            }
            key_at = here;
            arr_at = at;
            if (!array_header(p, len, &at, &items) || items > (uint64_t)max_tokens) {
                goto decline;
            }
            hashes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(8 * items));
            if (hashes == NULL) {
                return NULL;
            }
            int rc = hash_wire_tokens(p, len, &at, (Py_ssize_t)items, max_str_len,
                                      (uint64_t *)(void *)PyBytes_AS_STRING(hashes));
            if (rc < 0) {
                Py_DECREF(hashes);
                return NULL;
            }
            if (rc == 0) {
                goto decline;
            }
            arr_end = at;
            continue;
        }
        at = here;
        if (!skip_item(p, len, &at, 1) || !skip_item(p, len, &at, 1)) {
            goto decline;
        }
    }
    if (at != len || key_at < 0) {  /* bytes after the map (msgpack's ExtraData), or no tokens */
        goto decline;
    }
    /* the map without the tokens pair: a header for one pair less, the pairs before it, the
     * pairs after it */
    Py_ssize_t before = key_at - first, after = len - arr_end;
    PyObject *rest = PyBytes_FromStringAndSize(NULL, 5 + before + after);
    if (rest == NULL) {
        Py_DECREF(hashes);
        return NULL;
    }
    unsigned char *q = (unsigned char *)PyBytes_AS_STRING(rest);
    Py_ssize_t h = put_map_header(q, pairs - 1);
    memcpy(q + h, p + first, (size_t)before);
    memcpy(q + h + before, p + arr_end, (size_t)after);
    if (_PyBytes_Resize(&rest, h + before + after) < 0) {
        Py_DECREF(hashes);
        return NULL;
    }
    return Py_BuildValue("(NNnn)", rest, hashes, arr_at, arr_end);
decline:
    Py_XDECREF(hashes);
    Py_RETURN_NONE;
}

/* wire_tokens_joined(data, start, end) -> bytes: the UTF-8 bytes of the str items of the
 * msgpack array data[start:end] joined by NUL bytes: what "\0".join(tokens).encode()
 * gives for its tokens (learn_keys' canonical form of a tokens payload), without a str
 * per token. ValueError if data[start:end] is not one array of str. */
static PyObject *
wire_tokens_joined(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "wire_tokens_joined(data, start, end): bytes and two ints");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || end == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (start < 0 || end < start || end > PyBytes_GET_SIZE(args[0])) {
        PyErr_SetString(PyExc_ValueError, "wire_tokens_joined: start and end are not in data");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t at = start;
    uint64_t items;
    if (!array_header(p, end, &at, &items)) {
        PyErr_SetString(PyExc_ValueError, "wire_tokens_joined: not a msgpack array");
        return NULL;
    }
    /* each item's header takes a byte at least, which its NUL stands for: end - start bytes */
    PyObject *out = PyBytes_FromStringAndSize(NULL, end - start);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *q = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t w = 0;
    for (uint64_t t = 0; t < items; t++) {
        Py_ssize_t s, n;
        if (!str_item(p, end, &at, &s, &n)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_ValueError, "wire_tokens_joined: an item is not a str");
            return NULL;
        }
        if (t > 0) {
            q[w++] = 0;
        }
        memcpy(q + w, p + s, (size_t)n);
        w += n;
    }
    if (at != end) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, "wire_tokens_joined: bytes after the array");
        return NULL;
    }
    if (_PyBytes_Resize(&out, w) < 0) {
        return NULL;
    }
    return out;
}

/* wire_tokens_distinct(data, start, end, hashes) -> list of str: the distinct str items of
 * the msgpack array data[start:end], in the order of their first appearance, told apart by
 * their stable hashes `hashes` (a buffer of uint64, one an item, as wire_tokens gave them):
 * the first item of each hash is decoded as msgpack would (UTF-8), the others are skipped
 * without a str made. ValueError if data[start:end] is not one array of str of
 * len(hashes) items. */
static PyObject *
wire_tokens_distinct(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "wire_tokens_distinct(data, start, end, hashes): bytes, two "
                        "ints and a uint64 buffer");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || end == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (start < 0 || end < start || end > PyBytes_GET_SIZE(args[0])) {
        PyErr_SetString(PyExc_ValueError, "wire_tokens_distinct: start and end are not in data");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[3], &view, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    PyObject *out = NULL;
    uint64_t *seen = NULL;
    const uint64_t *hashes = (const uint64_t *)view.buf;
    Py_ssize_t n_hashes = view.len / 8;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t at = start;
    uint64_t items;
    if (view.len % 8 != 0 || !array_header(p, end, &at, &items) || items != (uint64_t)n_hashes) {
        PyErr_SetString(PyExc_ValueError, "wire_tokens_distinct: not a msgpack array of len(hashes) items");
        goto done;
    }
    size_t size = 16, mask;
    while (size < 2 * (size_t)n_hashes) {
        size <<= 1;
    }
    mask = size - 1;
    /* the hashes seen, open addressing (0 marks an empty slot: a hash of 0 is kept apart) */
    if ((seen = PyMem_Calloc(size, sizeof(uint64_t))) == NULL || (out = PyList_New(0)) == NULL) {
        if (seen == NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    int saw_zero = 0;
    for (Py_ssize_t t = 0; t < n_hashes; t++) {
        Py_ssize_t s, n;
        if (!str_item(p, end, &at, &s, &n)) {
            PyErr_SetString(PyExc_ValueError, "wire_tokens_distinct: an item is not a str");
            goto fail;
        }
        uint64_t h = hashes[t];
        if (h == 0) {
            if (saw_zero) {
                continue;
            }
            saw_zero = 1;
        }
        else {
            size_t i = (size_t)((h * 0x9E3779B97F4A7C15ULL) >> 32) & mask;
            while (seen[i] != 0 && seen[i] != h) {
                i = (i + 1) & mask;
            }
            if (seen[i] == h) {
                continue;
            }
            seen[i] = h;
        }
        PyObject *token = PyUnicode_DecodeUTF8((const char *)p + s, n, "strict");
        if (token == NULL || PyList_Append(out, token) < 0) {
            Py_XDECREF(token);
            goto fail;
        }
        Py_DECREF(token);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(seen);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"word_tokens", (PyCFunction)(void (*)(void))word_tokens, METH_FASTCALL,
     "word_tokens(text, min_len, max_len, out): append the word tokens of text to out "
     "(WordRules.words' rules, see streamnb.features.text)."},
    {"value_words", (PyCFunction)(void (*)(void))value_words, METH_FASTCALL,
     "value_words(text, prefix, min_len, max_len, lower, separators): the prefixed word tokens "
     "of a header value whose separators are made spaces (a tuple), or None beyond Latin-1."},
    {"hash_cache_init", (PyCFunction)(void (*)(void))hash_cache_init, METH_FASTCALL,
     "hash_cache_init(capacity, miss): an empty token hash cache of at most capacity tokens; "
     "miss(token) gives the hash of a token not in it."},
    {"hash_cache_clear", hash_cache_clear, METH_NOARGS, "Empty the token hash cache."},
    {"hash_cache_len", hash_cache_len, METH_NOARGS, "Tokens in the token hash cache."},
    {"hash_one", hash_one, METH_O, "hash_one(token): the cached stable hash of one str token."},
    {"hash_lists", (PyCFunction)(void (*)(void))hash_lists, METH_FASTCALL,
     "hash_lists(lists, out): the cached stable hashes of the tokens of every list, in order, "
     "into out (a writable buffer of as many uint64)."},
    {"word_hashes", (PyCFunction)(void (*)(void))word_hashes, METH_FASTCALL,
     "word_hashes(text, min_len, max_len, out[, lower]): the cached stable hashes of word_tokens' "
     "tokens of a Latin-1 text (lower-cased), appended to the bytearray out (uint64); how many, or None."},
    {"unique_buckets", (PyCFunction)(void (*)(void))unique_buckets, METH_FASTCALL,
     "unique_buckets(hashes, sizes, bits, out, counts): the sorted distinct buckets of each "
     "list of uint64 hashes, lists end to end, into out (int32); counts[i]: how many for list i."},
    {"text_counts", text_counts, METH_O,
     "text_counts(text): (upper-case, alphabetic, non-ASCII, '!' or '$') characters of text "
     "(MailAnalysis.add_text_stats' counts)."},
    {"url_scan", (PyCFunction)(void (*)(void))url_scan, METH_FASTCALL,
     "url_scan(text, out): WordRules.urls (the text with its URLs blanked, their tokens "
     "appended to out); None for text with a character beyond U+00FF that IGNORECASE folds "
     "onto an ASCII letter."},
    {"received_tokens", (PyCFunction)(void (*)(void))received_tokens, METH_FASTCALL,
     "received_tokens(text, out): append the tokens of one Latin-1 Received value to out "
     "(mail_headers._received_tokens); False, appending nothing, for other text."},
    {"tag_tokens", (PyCFunction)(void (*)(void))tag_tokens, METH_FASTCALL,
     "tag_tokens(slashes, names, attributes, max_tag_tokens): the html: and url: tokens of "
     "strip_html's tags; None when an attribute is not Latin-1."},
    {"header_fields", (PyCFunction)(void (*)(void))header_fields, METH_FASTCALL,
     "header_fields(text, strip_crlf): the (name, value) pairs of mime._FIELD_START.split(text) "
     "for ASCII text; None for other text."},
    {"addresses", addresses, METH_O,
     "addresses(field): mail_headers._getaddresses' (display name, address) pairs of a Latin-1 address "
     "list; False where its regex fails, None beyond Latin-1."},
    {"header_block_end", (PyCFunction)(void (*)(void))header_block_end, METH_FASTCALL,
     "header_block_end(buf, start, end): where the header block of the bytes buf[start:end] "
     "ends (mime._header_block_end)."},
    {"plain_headers", (PyCFunction)(void (*)(void))plain_headers, METH_FASTCALL,
     "plain_headers(buf, start, end): the (name, value) pairs of a plain header block "
     "buf[start:end] (mime._plain_headers), or None."},
    {"header_index", header_index, METH_O,
     "header_index(pairs): (lower-case names, dict of name -> values) of a list of (name, value) "
     "pairs with ASCII names (mime.Part.names and header_index); None otherwise."},
    {"header_tokens", (PyCFunction)(void (*)(void))header_tokens, METH_FASTCALL,
     "header_tokens(names, index, spec, cache, analysis): HeaderTokenizer.add over a dict "
     "index of header values (see streamnb.features.mail)."},
    {"html_strip", (PyCFunction)(void (*)(void))html_strip, METH_FASTCALL,
     "html_strip(markup, max_tag_tokens[, hashes]): markup.strip_html before "
     "html.unescape: (text, tokens), the tokens' stable hashes appended to the bytearray hashes "
     "instead if given; None for markup with a character beyond U+00FF that IGNORECASE folds "
     "onto an ASCII letter."},
    {"message_id_value", (PyCFunction)(void (*)(void))message_id_value, METH_FASTCALL,
     "message_id_value(raw, scan): the raw value of a mail's first Message-ID field in raw[:scan] "
     "(learn_keys._message_id), or None."},
    {"html_unescape", (PyCFunction)(void (*)(void))html_unescape, METH_FASTCALL,
     "html_unescape(text, html5, invalid_charrefs, invalid_codepoints, legacy_max): "
     "html.unescape(text), the standard library's tables passed in."},
    {"wire_tokens", (PyCFunction)(void (*)(void))wire_tokens, METH_FASTCALL,
     "wire_tokens(data, max_tokens, max_str_len, max_map_len): (the map without its tokens, "
     "their stable hashes as uint64 bytes, start, end of the array) of a msgpack map with a "
     "tokens array of str, or None."},
    {"wire_tokens_joined", (PyCFunction)(void (*)(void))wire_tokens_joined, METH_FASTCALL,
     "wire_tokens_joined(data, start, end): the UTF-8 bytes of the str items of the msgpack "
     "array data[start:end], joined by NUL bytes."},
    {"wire_tokens_distinct", (PyCFunction)(void (*)(void))wire_tokens_distinct, METH_FASTCALL,
     "wire_tokens_distinct(data, start, end, hashes): the distinct str items of the msgpack "
     "array data[start:end], first appearances first, told apart by their hashes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups",
    "The tokenizer's per-character steps and the token hash table of streamnb.features, in C (optional).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    for (int c = 0; c < 128; c++) {
        is_space[c] = (unsigned char)Py_UNICODE_ISSPACE((Py_UCS4)c);
    }
    for (Py_UCS4 c = 0; c < 256; c++) {
        /* a Latin-1 upper-case character is alphabetic too (2 counts as a letter) */
        latin1_class[c] = Py_UNICODE_ISUPPER(c) ? 2 : (Py_UNICODE_ISALPHA(c) ? 1 : 0);
    }
    for (Py_UCS4 c = 0; c < 256; c++) {
        is_word1[c] = Py_UNICODE_ISALNUM(c) || c == '_';
        is_space1[c] = Py_UNICODE_ISSPACE(c) != 0;
        url_stop[c] = is_space1[c] || (c != 0 && strchr("\"'<>()[]{}", (int)c) != NULL);
        url_user_stop[c] = is_space1[c] || (c != 0 && strchr("/?#@", (int)c) != NULL);
        link_user_stop[c] = url_user_stop[c] || (c != 0 && strchr("\"'>", (int)c) != NULL);
        url_first[c] = c != 0 && strchr("hfmwHFMW", (int)c) != NULL;
    }
    for (const char *p = PUNCT; *p; p++) {
        is_punct[(unsigned char)*p] = 1;
    }
    for (int c = 0; c < 256; c++) {  /* mail_headers._ATOM */
        is_atom1[c] = c >= 128 || strchr("()<>@,:;\"[]\\ \t\r\n", c) == NULL || c == 0;
    }
    for (Py_UCS4 c = 0; c < 256; c++) {  /* str.lower keeps a Latin-1 character Latin-1 */
        Py_UCS4 low = Py_UNICODE_TOLOWER(c);
        latin1_lower[c] = (unsigned char)(low < 256 ? low : c);
    }
    for (int c = 0; c < 256; c++) {
        word_class[c] = (unsigned char)((is_space1[c] ? WC_SPACE : 0) | (c == '@' ? WC_AT : 0) | (c >= 128 ? WC_HIGH : 0));
    }
    struct { PyObject **slot; const char *text; } strings[] = {
        {&S_none_suffix, ":none"}, {&S_header_prefix, "header:"},
        {&S_message_id_prefix, "message-id:"}, {&S_no_domain, "no-domain"},
        {&S_comma_space, ", "}, {&S_encoded_word, "=?"}, {&S_strip_chars, " <>"},
        {&S_strip, "strip"}, {&S_lower, "lower"}, {&S_defect_address, "defect:address"},
        {&S_tokens, "tokens"}, {&S_recipients, "recipients"}, {&S_received, "received"},
        {&S_defects, "defects"},
    };
    for (size_t k = 0; k < sizeof(strings) / sizeof(strings[0]); k++) {
        if ((*strings[k].slot = PyUnicode_InternFromString(strings[k].text)) == NULL) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "PUNCT", PUNCT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
