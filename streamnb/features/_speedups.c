/* streamnb.features._speedups: two per-token steps of streamnb.features, in C.
 *
 * 1. The word rules of streamnb.features.text (below), and
 * 2. the token hash cache of streamnb.features.hashing (further down).
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
 * The module's PUNCT must equal text._PUNCT (text.py uses this module only when it does).
 * The Python code stays the reference (and the path for bigrams and the token limit);
 * tests/test_speedups.py compares both on generated text and on the whole corpus, and the
 * hash table with the dict cache. Building this module is optional: without a C compiler
 * the package installs and runs the same code in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

/* str.split()'s white space among the ASCII characters (Py_UNICODE_ISSPACE). */
static unsigned char is_space[128];
/* text._PUNCT: stripped from both ends of a word. */
static const char PUNCT[] = "\"'.,;:!?()[]{}<>*`~|^_=+-/\\#&";
static unsigned char is_punct[128];

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
        while (i < len) {
            while (i < len && is_space[s[i]]) {
                i++;
            }
            Py_ssize_t start = i;
            while (i < len && !is_space[s[i]]) {
                i++;
            }
            Py_ssize_t end = i;
            while (start < end && is_punct[s[start]]) {
                start++;
            }
            while (end > start && is_punct[s[end - 1]]) {
                end--;
            }
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
#define SPACE(c) ((c) < 128 ? is_space[(c)] : Py_UNICODE_ISSPACE(c))
#define PUNCT_AT(j) (PyUnicode_READ(kind, data, (j)) < 128 && is_punct[PyUnicode_READ(kind, data, (j))])
    while (i < len) {
        while (i < len && SPACE(PyUnicode_READ(kind, data, i))) {
            i++;
        }
        Py_ssize_t start = i;
        while (i < len && !SPACE(PyUnicode_READ(kind, data, i))) {
            i++;
        }
        Py_ssize_t end = i;
        while (start < end && PUNCT_AT(start)) {
            start++;
        }
        while (end > start && PUNCT_AT(end - 1)) {
            end--;
        }
        if (end == start || end - start < min_len) {
            continue;
        }
        if (append_word_tokens(text, kind, data, start, end, max_len, out) < 0) {
            return NULL;
        }
    }
#undef SPACE
#undef PUNCT_AT
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ token hash cache
 *
 * token -> its 64-bit stable hash (keyed BLAKE2b, computed by a Python function on a
 * miss), for streamnb.features.hashing. The Python cache is a dict: a lookup of a token
 * that arrives as a fresh str object reads the dict's index, its entry, the stored key
 * (to compare the text) and the stored int, four places in memory, and numpy then
 * converts the int. Here a slot holds the token's str hash (SipHash, cached in the str
 * object), its length and the stable hash side by side: one place in memory, and the
 * result goes straight into a uint64 array. Two tokens are taken for the same one only
 * if their 64-bit str hashes and their lengths are equal (about 2**-64 per pair: far
 * below the 2**-bits of two tokens sharing a bucket, which feature hashing accepts).
 * Bounded like the Python cache: emptied when it holds `capacity` tokens.
 */
typedef struct {
    Py_hash_t hash;
    Py_ssize_t len_plus_1; /* 0: empty slot */
    uint64_t value;
} slot_t;

static slot_t *slots = NULL;
static size_t n_slots = 0, n_used = 0, capacity = 0;
static PyObject *miss_fn = NULL;

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
    while (want < 2 * (size_t)cap) {
        want <<= 1; /* a power of two, at most half full */
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

/* The stable hash of one str token into *value; -1 with an exception set on error. */
static int
cached_hash(PyObject *token, uint64_t *value)
{
    if (!PyUnicode_Check(token)) {
        PyErr_Format(PyExc_TypeError, "tokens must be str, got %.100s", Py_TYPE(token)->tp_name);
        return -1;
    }
    Py_hash_t h = PyObject_Hash(token);
    if (h == -1) {
        return -1;
    }
    Py_ssize_t len_plus_1 = PyUnicode_GET_LENGTH(token) + 1;
    size_t mask = n_slots - 1, i = (size_t)h & mask;
    while (slots[i].len_plus_1 != 0) {
        if (slots[i].hash == h && slots[i].len_plus_1 == len_plus_1) {
            *value = slots[i].value;
            return 0;
        }
        i = (i + 1) & mask;
    }
    PyObject *r = PyObject_CallOneArg(miss_fn, token);
    if (r == NULL) {
        return -1;
    }
    uint64_t v = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (v == (uint64_t)-1 && PyErr_Occurred()) {
        return -1;
    }
    /* The miss function ran Python code (another thread may have used the table, or a
     * test re-made it): find the slot again. */
    if (n_used >= capacity) { /* full: start again (hot tokens come back) */
        memset(slots, 0, n_slots * sizeof(slot_t));
        n_used = 0;
    }
    mask = n_slots - 1;
    i = (size_t)h & mask;
    while (slots[i].len_plus_1 != 0) {
        if (slots[i].hash == h && slots[i].len_plus_1 == len_plus_1) {
            *value = v;
            return 0;
        }
        i = (i + 1) & mask;
    }
    slots[i].hash = h;
    slots[i].len_plus_1 = len_plus_1;
    slots[i].value = v;
    n_used++;
    *value = v;
    return 0;
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
        for (Py_ssize_t t = 0; t < n; t++) {
            if (cached_hash(items[t], &out[k++]) < 0) {
                Py_DECREF(tokens);
                goto fail;
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

static PyMethodDef methods[] = {
    {"word_tokens", (PyCFunction)(void (*)(void))word_tokens, METH_FASTCALL,
     "word_tokens(text, min_len, max_len, out): append the word tokens of text to out "
     "(WordRules.words' rules, see streamnb.features.text)."},
    {"hash_cache_init", (PyCFunction)(void (*)(void))hash_cache_init, METH_FASTCALL,
     "hash_cache_init(capacity, miss): an empty token hash cache of at most capacity tokens; "
     "miss(token) gives the hash of a token not in it."},
    {"hash_cache_clear", hash_cache_clear, METH_NOARGS, "Empty the token hash cache."},
    {"hash_cache_len", hash_cache_len, METH_NOARGS, "Tokens in the token hash cache."},
    {"hash_one", hash_one, METH_O, "hash_one(token): the cached stable hash of one str token."},
    {"hash_lists", (PyCFunction)(void (*)(void))hash_lists, METH_FASTCALL,
     "hash_lists(lists, out): the cached stable hashes of the tokens of every list, in order, "
     "into out (a writable buffer of as many uint64)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups",
    "The word rules and the token hash cache of streamnb.features, in C (optional).", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    for (int c = 0; c < 128; c++) {
        is_space[c] = (unsigned char)Py_UNICODE_ISSPACE((Py_UCS4)c);
    }
    for (const char *p = PUNCT; *p; p++) {
        is_punct[(unsigned char)*p] = 1;
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "PUNCT", PUNCT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
