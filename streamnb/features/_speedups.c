/* streamnb.features._speedups: the word rules of streamnb.features.text, in C.
 *
 * One function, word_tokens(text, min_len, max_len, out), which appends to the list `out`
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
 * The Python code stays the reference (and the path for bigrams and the token limit); tests compare both on generated text and on the whole corpus. Building
 * this module is optional: without a C compiler the package installs and runs the same
 * rules in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
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

static PyObject *
prefixed(const char *prefix, Py_ssize_t np, const Py_UCS1 *data, Py_ssize_t n)
{
    PyObject *s = PyUnicode_New(np + n, 127);
    if (s != NULL) {
        Py_UCS1 *dst = PyUnicode_1BYTE_DATA(s);
        memcpy(dst, prefix, (size_t)np);
        if (n > 0) {
            memcpy(dst + np, data, (size_t)n);
        }
    }
    return s;
}

/* The token of one stripped ASCII word of n >= min_len characters (a new reference). */
static PyObject *
ascii_word_token(const Py_UCS1 *w, Py_ssize_t n, Py_ssize_t max_len)
{
    const Py_UCS1 *at = NULL;
    Py_ssize_t ats = 0;
    int dot = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (w[i] == '@') {
            if (ats++ == 0) {
                at = w + i;
            }
        }
        else if (w[i] == '.') {
            dot = 1;
        }
    }
    if (ats == 1 && (n <= max_len || (dot && n < 60))) {
        return prefixed("email:", 6, at + 1, n - (at + 1 - w));
    }
    if (n > max_len) {
        char buf[64];
        int k = snprintf(buf, sizeof buf, "skip:%c %zd", (char)w[0], n / 10 * 10);
        return ascii_str((const Py_UCS1 *)buf, k);
    }
    return ascii_str(w, n);
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
    if (PyUnicode_IS_ASCII(text)) {  /* the common case: bytes, no 8bit% tokens */
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
            PyObject *token;
            if (n <= max_len && memchr(s + start, '@', (size_t)n) == NULL) {
                token = ascii_str(s + start, n);
            }
            else {
                token = ascii_word_token(s + start, n, max_len);
            }
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

static PyMethodDef methods[] = {
    {"word_tokens", (PyCFunction)(void (*)(void))word_tokens, METH_FASTCALL,
     "word_tokens(text, min_len, max_len, out): append the word tokens of text to out "
     "(WordRules.words' rules, see streamnb.features.text)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups",
    "The word rules of streamnb.features.text, in C (optional).", -1, methods,
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
