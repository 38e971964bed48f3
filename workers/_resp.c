/* workers._resp: one Redis command packed in the Redis protocol (RESP), in C (optional).
 *
 * pack_command(args) -> bytes: "*<n>\r\n" then "$<len>\r\n<bytes>\r\n" per argument, as
 * redis-py and hiredis pack a command. An argument is bytes (or another buffer), str
 * (UTF-8) or int (decimal); anything else raises TypeError. (Unlike redis-py, a first
 * argument with spaces, such as "CONFIG GET", is not split into words.) The commit of a batch is one
 * EVALSHA of about a thousand arguments (workers/commit.lua): hiredis' pack_command takes
 * a few hundred ns an argument there, and redis-py adds a pass over them in Python; here the
 * size is counted first (a str's UTF-8 is the one it caches, an int's digits go on the
 * stack) and the bytes are copied once into one buffer. Without this
 * module, workers/commit.py packs the command with redis-py (the reference;
 * tests/test_commit.py compares both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *data;
    Py_ssize_t len;
    char digits[24]; /* an int that fits in a long long, in decimal */
} piece_t;

/* Where the bytes of one argument are: in the object itself (bytes, the UTF-8 of a str),
 * in piece->digits (an int), or in a new bytes object stored in *owned (a big int,
 * another buffer). -1 with an exception set on error. */
static int
argument_piece(PyObject *arg, piece_t *piece, PyObject **owned)
{
    if (PyBytes_Check(arg)) {
        piece->data = PyBytes_AS_STRING(arg);
        piece->len = PyBytes_GET_SIZE(arg);
        return 0;
    }
    if (PyUnicode_Check(arg)) {
        piece->data = PyUnicode_AsUTF8AndSize(arg, &piece->len);
        return piece->data == NULL ? -1 : 0;
    }
    if (PyLong_Check(arg) && !PyBool_Check(arg)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(arg, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (!overflow) {
            piece->len = snprintf(piece->digits, sizeof(piece->digits), "%lld", v);
            piece->data = piece->digits;
            return 0;
        }
        PyObject *text = PyObject_Str(arg);
        if (text == NULL) {
            return -1;
        }
        *owned = PyUnicode_AsASCIIString(text);
        Py_DECREF(text);
    }
    else if (PyObject_CheckBuffer(arg)) {
        *owned = PyBytes_FromObject(arg);
    }
    else {
        PyErr_Format(PyExc_TypeError,
                     "pack_command: an argument must be bytes, str or int, got %.100s",
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    if (*owned == NULL) {
        return -1;
    }
    piece->data = PyBytes_AS_STRING(*owned);
    piece->len = PyBytes_GET_SIZE(*owned);
    return 0;
}

/* Write "<c><n>\r\n" at p; return the end. */
static char *
put_header(char *p, char c, Py_ssize_t n)
{
    char digits[24];
    int d = 0;
    do {
        digits[d++] = (char)('0' + n % 10);
        n /= 10;
    } while (n > 0);
    *p++ = c;
    while (d > 0) {
        *p++ = digits[--d];
    }
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static Py_ssize_t
header_len(Py_ssize_t n)
{
    Py_ssize_t d = 1;
    while (n >= 10) {
        n /= 10;
        d++;
    }
    return 1 + d + 2;
}

static PyObject *
pack_command(PyObject *module, PyObject *args_obj)
{
    PyObject *seq = PySequence_Fast(args_obj, "pack_command: args must be a list or a tuple");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *result = NULL;
    piece_t *pieces = PyMem_Malloc(((size_t)n + 1) * sizeof(piece_t));
    PyObject **owned = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    if (pieces == NULL || owned == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = header_len(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (argument_piece(items[i], &pieces[i], &owned[i]) < 0) {
            goto done;
        }
        total += header_len(pieces[i].len) + pieces[i].len + 2;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        goto done;
    }
    char *p = put_header(PyBytes_AS_STRING(result), '*', n);
    for (Py_ssize_t i = 0; i < n; i++) {
        p = put_header(p, '$', pieces[i].len);
        memcpy(p, pieces[i].data, (size_t)pieces[i].len);
        p += pieces[i].len;
        *p++ = '\r';
        *p++ = '\n';
    }
done:
    if (owned != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_XDECREF(owned[i]);
        }
    }
    PyMem_Free(owned);
    PyMem_Free(pieces);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"pack_command", pack_command, METH_O,
     "pack_command(args): the command (a list or tuple of bytes, str or int) in the Redis "
     "protocol, as bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_resp", "One Redis command packed in the Redis protocol, in C (optional).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__resp(void)
{
    return PyModule_Create(&module);
}
