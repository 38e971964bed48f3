/* streamnb._kernels: the count models' per-nonzero loop, in C (optional).
 *
 * It takes a CSR batch (indptr, indices, data: float64) with a class code per
 * row (codes: int64) and a weight per row (weights: float64), and puts the batch's
 * distinct columns in a hash table (column_slots): a slot per column, in order of first
 * appearance, no sort of the nonzeros.
 *
 * 1. multinomial_jll(indptr, indices, data, codes, weights, counts, k0, n_features,
 *                    totals, alpha, seen_mode, n_seen, m_fixed, out, unseen[, rank, cols])
 *
 *    writes into `out` (n x K float64, C order) the joint log-likelihoods without the
 *    class prior of the batch's n rows, row i scored by the model plus the labelled rows
 *    before i (test-then-train within the batch; streamnb.models.prequential), and into
 *    `unseen` (n int64) the number of row i's nonzeros in a column where the model has no
 *    count (the worker's out-of-vocabulary share):
 *
 *      out[i, k] = sum_j x_ij log(F_kj(i) + alpha) - (sum_j x_ij) log(T_k(i) + alpha m(i))
 *
 *    over the columns j that count at row i. F_kj(i) is the model's count `counts[k, j]`
 *    (0 for k >= k0 or j >= n_features) plus weights[r] x_rj of every earlier row r
 *    labelled k (codes[r] == k; -1: unlabelled); T_k(i) is totals[k] plus weights[r]
 *    times the row sum of those rows. With seen_mode, a column counts once the model has
 *    a nonzero count in it or an earlier row of the batch added to it (weights[r] x_rj >
 *    0), and m(i) is n_seen plus the columns new to the model first added before row i;
 *    otherwise every column counts and m(i) = m_fixed. log(T + alpha m) is taken as 0
 *    where T + alpha m <= 0 (no class weight yet). The rows are walked in order, one log
 *    per nonzero and class whose count changed since the column's last log. Reference:
 *    the numpy form in streamnb.models.prequential (sorted nonzeros, prefix sums). With
 *    rank and cols (column_ranks of the batch), its columns are those, not found again.
 *
 * 2. class_sums(indptr, indices, data, codes, weights, n_classes, cols, sums[, rank])
 *
 *    the batch's distinct columns, ascending, into `cols` (int64, nnz items or more) and
 *    into `sums` (float64, n_classes x nnz items or more, C order, its first n_classes x m
 *    used) the weighted sums sums[k, t] = sum of weights[r] x_rj over the nonzeros of
 *    column j = cols[t] in rows r of class k (codes[r] == k), added in row order from 0.0,
 *    as numpy's bincount adds them; returns m, the number of distinct columns. Reference:
 *    the numpy form in streamnb.stats.feature_counts (a sort of the nonzeros, a bincount).
 *    With rank (column_ranks of the batch), cols holds its m columns already.
 *
 * 3. column_ranks(indices, cols, rank)
 *
 *    a batch's distinct columns, ascending, into cols (int64, nnz items or more) and each
 *    nonzero's position among them into rank (int32, nnz items); returns m. A worker finds
 *    them once a batch for both the prediction and the class sums. Reference: np.unique
 *    with return_inverse (tests/streamnb/stats/test_class_sums.py).
 *
 * 4. gap_rows(indices, sizes, n_tokens)
 *
 *    the cache form of rows of sorted buckets (int32, end to end, sizes[i] of row i): a
 *    list, for each row, of the msgpack of [2, n_tokens[i], its first bucket, its gaps as
 *    2-byte little-endian ints], None where the row has no bucket or a gap is not in
 *    1..65535. Reference: streamnb.features.rows.rows_to_bytes without it.
 *
 * 5. pack_map(keys, values, required) and pack_array(values, prefix)
 *
 *    msgpack of a map of str keys[i] -> values[i] (every pair i < required, the others
 *    where values[i] is not None), and of prefix + an array of values: what
 *    msgpack.packb(..., use_bin_type=True) gives for that dict and list (None, bool, int,
 *    float, str, bytes, bytearray, memoryview, dict, list and tuple, nested; TypeError
 *    for any other type, ValueError past msgpack's 1,025 levels), without making the dict or list:
 *    a worker's outputs and cache entries. Reference: msgpack (workers/wire/outputs.py,
 *    workers/store/label_cache.py use it without this module).
 *
 * tests/streamnb/models/test_prequential.py, tests/streamnb/stats/test_class_sums.py,
 * tests/streamnb/features/test_gap_rows.py and tests/streamnb/test_pack.py compare them
 * with their references and with independent oracles. Building this module is optional.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_buffers.h"

#define MODEL_SEEN 1
#define ADDED 2

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif

/* A CSR batch with a class code and a weight per row. */
enum { INDPTR, INDICES, DATA, CODES, WEIGHTS, BATCH_ARGS };
typedef struct {
    Py_buffer views[BATCH_ARGS]; /* args[0..4] */
    int got;                     /* buffers held */
    Py_ssize_t n, nnz;
} batch_t;

/* Index arrays take 4- or 8-byte items: item i as int64. */
static inline int64_t
index_at(const Py_buffer *b, Py_ssize_t i)
{
    return b->itemsize == 4 ? ((const int32_t *)b->buf)[i] : ((const int64_t *)b->buf)[i];
}

static void
batch_release(batch_t *bt)
{
    release_buffers(bt->got, bt->views);
    bt->got = 0;
}

/* The first five arguments as a batch, checked: sizes, indptr from 0 to nnz and not
 * decreasing, codes in [min_code, n_classes). -1 with an exception set if not (the
 * buffers taken are released). */
static int
batch_get(PyObject *const *args, const char *fn, int64_t min_code, int64_t n_classes, batch_t *bt)
{
    static const int which[BATCH_ARGS] = {0, 1, 2, 3, 4}, writable[BATCH_ARGS] = {0};
    if (get_buffers(args, BATCH_ARGS, which, writable, bt->views) < 0) {
        return -1;
    }
    bt->got = BATCH_ARGS;
    if ((bt->views[INDPTR].itemsize != 4 && bt->views[INDPTR].itemsize != 8) ||
        (bt->views[INDICES].itemsize != 4 && bt->views[INDICES].itemsize != 8) ||
        bt->views[DATA].itemsize != 8 || bt->views[CODES].itemsize != 8 || bt->views[WEIGHTS].itemsize != 8) {
        PyErr_Format(PyExc_TypeError, "%s: indptr and indices take 4- or 8-byte items, the rest 8-byte ones", fn);
        goto bad;
    }
    bt->n = bt->views[INDPTR].len / bt->views[INDPTR].itemsize - 1;
    bt->nnz = bt->views[INDICES].len / bt->views[INDICES].itemsize;
    if (bt->n < 0 || bt->views[DATA].len / 8 != bt->nnz || bt->views[CODES].len / 8 != bt->n ||
        bt->views[WEIGHTS].len / 8 != bt->n) {
        PyErr_Format(PyExc_ValueError,
                     "%s: the arrays' sizes do not fit (indptr n + 1, indices and data nnz, codes and weights n)", fn);
        goto bad;
    }
    if (bt->nnz >= INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: too many nonzeros", fn);
        goto bad;
    }
    if (index_at(&bt->views[INDPTR], 0) != 0 || index_at(&bt->views[INDPTR], bt->n) != bt->nnz) {
        PyErr_Format(PyExc_ValueError, "%s: indptr must run from 0 to nnz", fn);
        goto bad;
    }
    for (Py_ssize_t i = 0; i < bt->n; i++) {
        int64_t code = ((const int64_t *)bt->views[CODES].buf)[i];
        if (index_at(&bt->views[INDPTR], i + 1) < index_at(&bt->views[INDPTR], i)) {
            PyErr_Format(PyExc_ValueError, "%s: indptr must not decrease", fn);
            goto bad;
        }
        if (code < min_code || code >= n_classes) {
            PyErr_Format(PyExc_ValueError, "%s: class code %lld is not in [%lld, %lld)", fn, (long long)code,
                         (long long)min_code, (long long)n_classes);
            goto bad;
        }
    }
    return 0;
bad:
    batch_release(bt);
    return -1;
}

/* A hash table entry: column + 1 (0: empty) and its slot, in one 8-byte load. */
typedef struct {
    uint32_t key;
    int32_t slot;
} entry_t;

/* The column table, kept from call to call (every caller holds the GIL throughout): zeroed
 * once when it grows, and each call clears the entries it took, so no call pays to zero a
 * table the size of its batch. A call that needs more than TABLE_KEPT entries uses a table
 * of its own. */
#define TABLE_KEPT ((size_t)1 << 20)
static entry_t *kept_table = NULL;
static size_t kept_cap = 0;

/* The distinct columns of the nnz indices iv: slot_of[p] (nnz items) the slot of nonzero p,
 * col_of[s] (nnz items) the column of slot s, slots numbered in order of first appearance. Returns
 * the number of slots, -1 with an exception set on a column out of range or no memory. */
static Py_ssize_t
column_slots(const Py_buffer *iv, Py_ssize_t nnz, const char *fn, int32_t *slot_of, uint32_t *col_of)
{
    size_t cap = 16;
    while (cap < (size_t)nnz + (size_t)nnz / 2) {
        cap <<= 1;
    }
    int bits = 0;
    while (((size_t)1 << bits) < cap) {
        bits++;
    }
    entry_t *table;
    if (cap > TABLE_KEPT) {
        table = PyMem_Calloc(cap, sizeof(entry_t));
    } else {
        if (kept_cap < cap) {
            PyMem_Free(kept_table);
            kept_cap = 0;
            kept_table = PyMem_Calloc(cap, sizeof(entry_t));
            if (kept_table != NULL) {
                kept_cap = cap;
            }
        }
        table = kept_table;  /* (its first cap entries: the rest stay empty) */
    }
    /* where each slot's entry is, to clear it */
    uint32_t *at = PyMem_Malloc(((size_t)nnz + 1) * sizeof(uint32_t));
    if (table == NULL || at == NULL) {
        if (cap > TABLE_KEPT) {
            PyMem_Free(table);
        }
        PyMem_Free(at);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n_slots = 0;
    for (Py_ssize_t p = 0; p < nnz; p++) {
        int64_t j = index_at(iv, p);
        if (j < 0 || j >= (int64_t)UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: column %lld is not in [0, 2**32 - 1)", fn, (long long)j);
            n_slots = -1 - n_slots;  /* (the slots taken, cleared below) */
            break;
        }
        uint32_t key = (uint32_t)j + 1;
        size_t h = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
        while (table[h].key != 0 && table[h].key != key) {
            h = (h + 1) & (cap - 1);
        }
        if (table[h].key == 0) {
            table[h].key = key;
            table[h].slot = (int32_t)n_slots;
            at[n_slots] = (uint32_t)h;
            col_of[n_slots++] = (uint32_t)j;
        }
        slot_of[p] = table[h].slot;
    }
    Py_ssize_t taken = n_slots < 0 ? -1 - n_slots : n_slots;
    if (cap > TABLE_KEPT) {
        PyMem_Free(table);
    } else {
        for (Py_ssize_t s = 0; s < taken; s++) {
            table[at[s]].key = 0;
        }
    }
    PyMem_Free(at);
    return n_slots < 0 ? -1 : n_slots;
}

/* A batch's columns made before (column_ranks): rank (int32, nnz items: the position of
 * nonzero p's column in cols) and cols (int64, m items: the distinct columns, ascending). */
typedef struct {
    Py_buffer views[2];
    int got;
} columns_t;

/* args[0..1] as the columns of a batch of nnz nonzeros, checked (rank in [0, m), cols in
 * [0, 2**32 - 1)); returns m, -1 with an exception set (the buffers taken are released). */
static Py_ssize_t
columns_get(PyObject *const *args, const char *fn, Py_ssize_t nnz, columns_t *c)
{
    static const int which[2] = {0, 1}, writable[2] = {0, 0};
    if (get_buffers(args, 2, which, writable, c->views) < 0) {
        return -1;
    }
    c->got = 2;
    Py_ssize_t m = c->views[1].len / 8;
    const int32_t *rank = c->views[0].buf;
    const int64_t *cols = c->views[1].buf;
    if (c->views[0].itemsize != 4 || c->views[1].itemsize != 8 || c->views[0].len / 4 != nnz || m > nnz) {
        PyErr_Format(PyExc_ValueError, "%s: rank takes nnz 4-byte items, cols at most nnz 8-byte ones", fn);
        goto bad;
    }
    for (Py_ssize_t p = 0; p < nnz; p++) {
        if (rank[p] < 0 || rank[p] >= m) {
            PyErr_Format(PyExc_ValueError, "%s: a rank is not in [0, %zd)", fn, m);
            goto bad;
        }
    }
    for (Py_ssize_t t = 0; t < m; t++) {
        if (cols[t] < 0 || cols[t] >= (int64_t)UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: column %lld is not in [0, 2**32 - 1)", fn, (long long)cols[t]);
            goto bad;
        }
    }
    return m;
bad:
    release_buffers(c->got, c->views);
    c->got = 0;
    return -1;
}

/* log(v + alpha) of a count v. Whole counts below LOG_KEPT (unit weights make them, and a
 * batch takes the logs of the same counts again and again) come from a table kept from
 * call to call, each entry with the alpha it was taken for: the log of the same double,
 * v + alpha, so the same bits. */
#define LOG_KEPT 8192
typedef struct {
    double alpha, value;
} kept_log_t;
static kept_log_t kept_logs[LOG_KEPT]; /* (alpha 0: not taken; alpha is > 0) */

#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* (inlined: it is called once per nonzero and class whose count changed) */
static ALWAYS_INLINE double
log_count(double v, double alpha)
{
    if (v >= 0.0 && v < (double)LOG_KEPT) {
        int i = (int)v;
        if ((double)i == v) {
            kept_log_t *e = &kept_logs[i];
            if (e->alpha != alpha) {
                e->value = log(v + alpha);
                e->alpha = alpha;
            }
            return e->value;
        }
    }
    return log(v + alpha);
}

static PyObject *
multinomial_jll(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char fn[] = "multinomial_jll";
    if (nargs != 15 && nargs != 17) {
        PyErr_SetString(PyExc_TypeError,
                        "multinomial_jll(indptr, indices, data, codes, weights, counts, k0, n_features, totals, "
                        "alpha, seen_mode, n_seen, m_fixed, out, unseen[, rank, cols]) takes 15 or 17 arguments");
        return NULL;
    }
    Py_ssize_t k0 = PyLong_AsSsize_t(args[6]);
    Py_ssize_t n_features = PyLong_AsSsize_t(args[7]);
    double alpha = PyFloat_AsDouble(args[9]);
    int seen_mode = PyObject_IsTrue(args[10]);
    Py_ssize_t n_seen = PyLong_AsSsize_t(args[11]);
    Py_ssize_t m_fixed = PyLong_AsSsize_t(args[12]);
    if (PyErr_Occurred() || seen_mode < 0) {
        return NULL;
    }
    if (k0 < 0 || n_features < 0 || n_seen < 0 || m_fixed < 0 || !(alpha > 0)) {
        PyErr_SetString(PyExc_ValueError,
                        "multinomial_jll: k0, n_features, n_seen and m_fixed must be >= 0, alpha > 0");
        return NULL;
    }
    /* counts, totals, out, unseen */
    static const int which[4] = {5, 8, 13, 14}, writable[4] = {0, 0, 1, 1};
    Py_buffer v[4];
    if (get_buffers(args, 4, which, writable, v) < 0) {
        return NULL;
    }
    Py_buffer cv = v[0], tv = v[1], ov = v[2], uv = v[3];
    PyObject *result = NULL;
    batch_t bt = {.got = 0};
    columns_t given = {.got = 0};
    int32_t *slot_of = NULL;
    uint32_t *col_of = NULL;
    double *per_slot = NULL, *T = NULL;
    unsigned char *flags = NULL;
    Py_ssize_t K = tv.itemsize == 8 ? tv.len / 8 : 0;
    if (cv.itemsize != 8 || tv.itemsize != 8 || ov.itemsize != 8 || uv.itemsize != 8) {
        PyErr_SetString(PyExc_TypeError, "multinomial_jll: counts, totals, out and unseen take 8-byte items");
        goto done;
    }
    if (batch_get(args, fn, -1, K, &bt) < 0) {
        goto done;
    }
    Py_ssize_t n = bt.n, nnz = bt.nnz;
    if (ov.len / 8 != n * K || K < k0 || cv.len / 8 != k0 * n_features || uv.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError,
                        "multinomial_jll: the arrays' sizes do not fit (totals K >= k0, counts k0 x n_features, "
                        "out n x K, unseen n)");
        goto done;
    }
    const double *data = bt.views[DATA].buf, *weights = bt.views[WEIGHTS].buf, *counts = cv.buf;
    const int64_t *codes = bt.views[CODES].buf;
    double *out = ov.buf;
    int64_t *unseen = uv.buf;
    slot_of = PyMem_Malloc(((size_t)nnz + 1) * sizeof(int32_t));
    col_of = PyMem_Malloc(((size_t)nnz + 1) * sizeof(uint32_t));
    /* per slot: K base counts, K added by the batch, K cached logs */
    per_slot = PyMem_Malloc(((size_t)nnz + 1) * 3 * (size_t)(K ? K : 1) * sizeof(double));
    flags = PyMem_Malloc((size_t)nnz + 1);
    T = PyMem_Malloc(2 * (size_t)(K ? K : 1) * sizeof(double));
    if (!slot_of || !col_of || !per_slot || !flags || !T) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n_slots;
    if (nargs == 17) { /* the batch's columns made before (column_ranks): slot = rank */
        n_slots = columns_get(args + 15, fn, nnz, &given);
        if (n_slots < 0) {
            goto done;
        }
        memcpy(slot_of, given.views[0].buf, (size_t)nnz * sizeof(int32_t));
        for (Py_ssize_t s = 0; s < n_slots; s++) {
            col_of[s] = (uint32_t)((const int64_t *)given.views[1].buf)[s];
        }
    } else {
        n_slots = column_slots(&bt.views[INDICES], nnz, fn, slot_of, col_of);
    }
    if (n_slots < 0) {
        goto done;
    }
    /* The model's counts, read once per slot (cold memory: fetched 8 slots ahead). */
    for (Py_ssize_t s = 0; s < n_slots; s++) {
        if (s + 8 < n_slots && col_of[s + 8] < (uint64_t)n_features) {
            for (Py_ssize_t k = 0; k < k0; k++) {
                PREFETCH(counts + k * n_features + col_of[s + 8]);
            }
        }
        int64_t j = col_of[s];
        double *base = per_slot + 3 * K * s, *added = base + K, *logs = added + K;
        unsigned char f = 0;
        for (Py_ssize_t k = 0; k < K; k++) {
            base[k] = (k < k0 && j < n_features) ? counts[k * n_features + j] : 0.0;
            if (base[k] != 0.0) {
                f = MODEL_SEEN;
            }
            added[k] = 0.0;
            logs[k] = NAN;
        }
        flags[s] = f;
    }

    /* The rows in order: score row i, then learn it if labelled. */
    double *S1 = T + K;
    memcpy(T, tv.buf, (size_t)K * sizeof(double));
    Py_ssize_t new_before = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t lo = (Py_ssize_t)index_at(&bt.views[INDPTR], i);
        Py_ssize_t hi = (Py_ssize_t)index_at(&bt.views[INDPTR], i + 1);
        double S0 = 0.0, row_sum = 0.0;
        int64_t new_to_model = 0;
        for (Py_ssize_t k = 0; k < K; k++) {
            S1[k] = 0.0;
        }
        if (K == 2) { /* (two classes, the common case: the same sums, in registers) */
            double s1_0 = 0.0, s1_1 = 0.0;
            for (Py_ssize_t p = lo; p < hi; p++) {
                Py_ssize_t s = slot_of[p];
                double x = data[p];
                unsigned char f = flags[s];
                row_sum += x;
                new_to_model += !(f & MODEL_SEEN);
                if (seen_mode && !f) {
                    continue;
                }
                S0 += x;
                double *e = per_slot + 6 * s; /* base 0, 1, added 0, 1, logs 0, 1 */
                if (isnan(e[4])) {
                    e[4] = log_count(e[0] + e[2], alpha);
                }
                if (isnan(e[5])) {
                    e[5] = log_count(e[1] + e[3], alpha);
                }
                s1_0 += x * e[4];
                s1_1 += x * e[5];
            }
            S1[0] = s1_0;
            S1[1] = s1_1;
        } else {
            for (Py_ssize_t p = lo; p < hi; p++) {
                Py_ssize_t s = slot_of[p];
                double x = data[p];
                row_sum += x;
                new_to_model += !(flags[s] & MODEL_SEEN);
                if (seen_mode && !flags[s]) {
                    continue; /* neither the model nor an earlier row has the column */
                }
                S0 += x;
                double *base = per_slot + 3 * K * s, *added = base + K, *logs = added + K;
                for (Py_ssize_t k = 0; k < K; k++) {
                    if (isnan(logs[k])) {
                        logs[k] = log_count(base[k] + added[k], alpha);
                    }
                    S1[k] += x * logs[k];
                }
            }
        }
        unseen[i] = new_to_model;
        double m = (double)(seen_mode ? n_seen + new_before : m_fixed);
        for (Py_ssize_t k = 0; k < K; k++) {
            double den = T[k] + alpha * m;
            out[i * K + k] = S1[k] - S0 * (den > 0 ? log(den) : 0.0);
        }
        int64_t c = codes[i];
        if (c < 0) {
            continue;
        }
        double w = weights[i];
        T[c] += row_sum * w;
        for (Py_ssize_t p = lo; p < hi; p++) {
            Py_ssize_t s = slot_of[p];
            double a = w * data[p];
            double *added = per_slot + 3 * K * s + K;
            added[c] += a;
            added[K + c] = NAN; /* its log is taken again when next needed */
            if (a > 0 && !(flags[s] & ADDED)) {
                if (seen_mode && !(flags[s] & MODEL_SEEN)) {
                    new_before++; /* counted by m(i) from the next row on */
                }
                flags[s] |= ADDED;
            }
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(slot_of);
    PyMem_Free(col_of);
    PyMem_Free(per_slot);
    PyMem_Free(flags);
    PyMem_Free(T);
    release_buffers(given.got, given.views);
    batch_release(&bt);
    release_buffers(4, v);
    return result;
}

/* The m distinct columns col_of[0..m) (slot order) ranked ascending: rank[s] is slot s's
 * position in sorted order, cols[rank[s]] = col_of[s]. An LSD radix sort of (column, slot)
 * pairs, a byte per pass, as many passes as the largest column has bytes. -1: no memory. */
static int
rank_columns(const uint32_t *col_of, Py_ssize_t m, int32_t *rank, int64_t *cols)
{
    uint64_t *a = PyMem_Malloc(((size_t)m + 1) * sizeof(uint64_t));
    uint64_t *b = PyMem_Malloc(((size_t)m + 1) * sizeof(uint64_t));
    if (a == NULL || b == NULL) {
        PyMem_Free(a);
        PyMem_Free(b);
        return -1;
    }
    uint32_t top = 0;
    for (Py_ssize_t s = 0; s < m; s++) {
        a[s] = ((uint64_t)col_of[s] << 32) | (uint32_t)s;
        top |= col_of[s];
    }
    for (int shift = 32; shift < 64 && (top >> (shift - 32)) != 0; shift += 8) {
        size_t count[257] = {0};
        for (Py_ssize_t s = 0; s < m; s++) {
            count[((a[s] >> shift) & 0xFF) + 1]++;
        }
        for (int d = 0; d < 256; d++) {
            count[d + 1] += count[d];
        }
        for (Py_ssize_t s = 0; s < m; s++) {
            b[count[(a[s] >> shift) & 0xFF]++] = a[s];
        }
        uint64_t *t = a;
        a = b;
        b = t;
    }
    for (Py_ssize_t t = 0; t < m; t++) {
        cols[t] = (int64_t)(a[t] >> 32);
        rank[(uint32_t)a[t]] = (int32_t)t;
    }
    PyMem_Free(a);
    PyMem_Free(b);
    return 0;
}

static PyObject *
class_sums(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char fn[] = "class_sums";
    if (nargs != 8 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "class_sums(indptr, indices, data, codes, weights, n_classes, cols, sums[, rank]) takes 8 or "
                        "9 arguments");
        return NULL;
    }
    Py_ssize_t K = PyLong_AsSsize_t(args[5]);
    if (K == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (K < 1) {
        PyErr_SetString(PyExc_ValueError, "class_sums: n_classes must be >= 1");
        return NULL;
    }
    PyObject *result = NULL;
    batch_t bt = {.got = 0};
    columns_t given = {.got = 0};
    Py_buffer sv = {.buf = NULL};
    int32_t *slot_of = NULL, *rank = NULL;
    uint32_t *col_of = NULL;
    if (batch_get(args, fn, 0, K, &bt) < 0) {
        return NULL;
    }
    Py_ssize_t n = bt.n, nnz = bt.nnz, m;
    if (nargs == 9) { /* the batch's columns made before (column_ranks), in cols */
        PyObject *const pair[2] = {args[8], args[6]};
        m = columns_get(pair, fn, nnz, &given);
        if (m < 0) {
            goto done;
        }
        rank = given.views[0].buf;
    } else {
        Py_buffer cv;
        if (PyObject_GetBuffer(args[6], &cv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            goto done;
        }
        int ok = cv.itemsize == 8 && cv.len / 8 >= nnz;
        slot_of = PyMem_Malloc(((size_t)nnz + 1) * sizeof(int32_t));
        col_of = PyMem_Malloc(((size_t)nnz + 1) * sizeof(uint32_t));
        rank = PyMem_Malloc(((size_t)nnz + 1) * sizeof(int32_t));
        m = -1;
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "class_sums: cols takes nnz 8-byte items");
        } else if (!slot_of || !col_of || !rank) {
            PyErr_NoMemory();
        } else {
            m = column_slots(&bt.views[INDICES], nnz, fn, slot_of, col_of);
            if (m >= 0 && rank_columns(col_of, m, rank, cv.buf) < 0) {
                PyErr_NoMemory();
                m = -1;
            }
            /* (rank[s] of slot s: nonzero p's rank is rank[slot_of[p]], made per nonzero below) */
            for (Py_ssize_t p = 0; m >= 0 && p < nnz; p++) {
                slot_of[p] = rank[slot_of[p]];
            }
        }
        PyBuffer_Release(&cv);
        if (m < 0) {
            goto done;
        }
        PyMem_Free(rank);
        rank = slot_of; /* (each nonzero's rank) */
        slot_of = NULL;
    }
    if (PyObject_GetBuffer(args[7], &sv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        sv.buf = NULL;
        goto done;
    }
    if (sv.itemsize != 8 || sv.len / 8 < K * (nargs == 9 ? m : nnz)) {
        PyErr_SetString(PyExc_ValueError, nargs == 9 ? "class_sums: sums takes n_classes x m 8-byte items"
                                                     : "class_sums: sums takes n_classes x nnz 8-byte items");
        goto done;
    }
    double *sums = sv.buf;
    memset(sums, 0, (size_t)(K * m) * sizeof(double));
    const double *data = bt.views[DATA].buf, *weights = bt.views[WEIGHTS].buf;
    const int64_t *codes = bt.views[CODES].buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t lo = (Py_ssize_t)index_at(&bt.views[INDPTR], i);
        Py_ssize_t hi = (Py_ssize_t)index_at(&bt.views[INDPTR], i + 1);
        double w = weights[i];
        double *row = sums + codes[i] * m;
        for (Py_ssize_t p = lo; p < hi; p++) {
            double a = w * data[p];
            row[rank[p]] += a;
        }
    }
    result = PyLong_FromSsize_t(m);
done:
    if (sv.buf != NULL) {
        PyBuffer_Release(&sv);
    }
    if (nargs != 9) {
        PyMem_Free(rank);
    }
    PyMem_Free(slot_of);
    PyMem_Free(col_of);
    release_buffers(given.got, given.views);
    batch_release(&bt);
    return result;
}

/* column_ranks(indices, cols, rank): the distinct columns, ascending, into cols (int64, nnz
 * items or more) and each nonzero's position among them into rank (int32, nnz items);
 * returns m, the number of distinct columns. */
static PyObject *
column_ranks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char fn[] = "column_ranks";
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "column_ranks(indices, cols, rank) takes 3 arguments");
        return NULL;
    }
    static const int which[3] = {0, 1, 2}, writable[3] = {0, 1, 1};
    Py_buffer v[3];
    if (get_buffers(args, 3, which, writable, v) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    int32_t *slot_rank = NULL;
    uint32_t *col_of = NULL;
    Py_ssize_t nnz = v[0].itemsize ? v[0].len / v[0].itemsize : 0;
    if ((v[0].itemsize != 4 && v[0].itemsize != 8) || v[1].itemsize != 8 || v[2].itemsize != 4 ||
            v[1].len / 8 < nnz || v[2].len / 4 != nnz) {
        PyErr_SetString(PyExc_ValueError,
                        "column_ranks: indices take 4- or 8-byte items, cols nnz 8-byte ones or more, rank nnz "
                        "4-byte ones");
        goto done;
    }
    if (nnz >= INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: too many nonzeros", fn);
        goto done;
    }
    int32_t *rank = v[2].buf;
    slot_rank = PyMem_Malloc(((size_t)nnz + 1) * sizeof(int32_t));
    col_of = PyMem_Malloc(((size_t)nnz + 1) * sizeof(uint32_t));
    if (!slot_rank || !col_of) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t m = column_slots(&v[0], nnz, fn, rank, col_of);
    if (m < 0) {
        goto done;
    }
    if (rank_columns(col_of, m, slot_rank, v[1].buf) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t p = 0; p < nnz; p++) {
        rank[p] = slot_rank[rank[p]];
    }
    result = PyLong_FromSsize_t(m);
done:
    PyMem_Free(slot_rank);
    PyMem_Free(col_of);
    release_buffers(3, v);
    return result;
}

/* msgpack of an unsigned int v at out (fixint, uint 8, 16, 32 or 64, big-endian, as
 * msgpack-python packs a Python int >= 0); returns the bytes written (out NULL: counts). */
static Py_ssize_t
pack_uint(unsigned char *out, uint64_t v)
{
    int n = v < 128 ? 0 : v < 256 ? 1 : v < 65536 ? 2 : v <= UINT32_MAX ? 4 : 8;
    if (out != NULL) {
        if (n == 0) {
            out[0] = (unsigned char)v;
        } else {
            out[0] = n == 1 ? 0xcc : n == 2 ? 0xcd : n == 4 ? 0xce : 0xcf;
            for (int b = 0; b < n; b++) {
                out[1 + b] = (unsigned char)(v >> (8 * (n - 1 - b)));
            }
        }
    }
    return 1 + n;
}

static PyObject *
gap_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "gap_rows(indices, sizes, n_tokens) takes 3 arguments");
        return NULL;
    }
    static const int which[3] = {0, 1, 2}, writable[3] = {0, 0, 0};
    Py_buffer v[3];
    if (get_buffers(args, 3, which, writable, v) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    if (v[0].itemsize != 4 || v[1].itemsize != 8 || v[2].itemsize != 8 || v[1].len != v[2].len) {
        PyErr_SetString(PyExc_TypeError,
                        "gap_rows: indices take 4-byte items, sizes and n_tokens 8-byte ones, one a row");
        goto done;
    }
    const int32_t *idx = v[0].buf;
    const int64_t *sizes = v[1].buf, *n_tokens = v[2].buf;
    Py_ssize_t n_rows = v[1].len / 8, total = v[0].len / 4, at = 0;
    for (Py_ssize_t r = 0; r < n_rows; r++) {
        if (sizes[r] < 0 || sizes[r] > total - at) {
            PyErr_SetString(PyExc_ValueError, "gap_rows: sizes do not add up to the indices");
            goto done;
        }
        at += sizes[r];
    }
    if (at != total) {
        PyErr_SetString(PyExc_ValueError, "gap_rows: sizes do not add up to the indices");
        goto done;
    }
    result = PyList_New(n_rows);
    if (result == NULL) {
        goto done;
    }
    at = 0;
    for (Py_ssize_t r = 0; r < n_rows; r++) {
        Py_ssize_t lo = at, hi = at + sizes[r];
        at = hi;
        PyObject *item = NULL;
        if (hi > lo && idx[lo] >= 0 && n_tokens[r] >= 0) {
            Py_ssize_t n_gaps = 2 * (hi - lo - 1);
            Py_ssize_t head = 2 + pack_uint(NULL, (uint64_t)n_tokens[r]) + pack_uint(NULL, (uint64_t)idx[lo]) +
                              (n_gaps < 256 ? 2 : n_gaps < 65536 ? 3 : 5);
            item = PyBytes_FromStringAndSize(NULL, head + n_gaps);
            if (item == NULL) {
                Py_CLEAR(result);
                goto done;
            }
            unsigned char *out = (unsigned char *)PyBytes_AS_STRING(item);
            *out++ = 0x94; /* [2, n_tokens, first, gaps] */
            *out++ = 0x02;
            out += pack_uint(out, (uint64_t)n_tokens[r]);
            out += pack_uint(out, (uint64_t)idx[lo]);
            if (n_gaps < 256) {
                *out++ = 0xc4;
                *out++ = (unsigned char)n_gaps;
            } else if (n_gaps < 65536) {
                *out++ = 0xc5;
                *out++ = (unsigned char)(n_gaps >> 8);
                *out++ = (unsigned char)n_gaps;
            } else {
                *out++ = 0xc6;
                for (int b = 3; b >= 0; b--) {
                    *out++ = (unsigned char)(n_gaps >> (8 * b));
                }
            }
            int bad = 0; /* (a gap out of 1..65535) */
            for (Py_ssize_t p = lo + 1; p < hi; p++) {
                int64_t gap = (int64_t)idx[p] - idx[p - 1];
                bad |= (gap <= 0) | (gap >= 65536);
                *out++ = (unsigned char)gap; /* little-endian 2 bytes */
                *out++ = (unsigned char)(gap >> 8);
            }
            if (bad) {
                Py_CLEAR(item);
            }
        }
        if (item == NULL) {
            item = Py_None;
            Py_INCREF(item);
        }
        PyList_SET_ITEM(result, r, item);
    }
done:
    release_buffers(3, v);
    return result;
}

/* ------------------------------------------------------------------ msgpack packing */

#define PACK_MAX_DEPTH 1024 /* (msgpack 1.x: 1,025 levels of lists) */

typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
    unsigned char small[512];
} packbuf_t;

static int
pack_reserve(packbuf_t *b, Py_ssize_t more)
{
    if (b->len + more <= b->cap) {
        return 0;
    }
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->len + more) {
        cap *= 2;
    }
    unsigned char *q;
    if (b->p == b->small) {
        q = PyMem_Malloc((size_t)cap);
        if (q != NULL) {
            memcpy(q, b->p, (size_t)b->len);
        }
    }
    else {
        q = PyMem_Realloc(b->p, (size_t)cap);
    }
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = q;
    b->cap = cap;
    return 0;
}

static void
pack_free(packbuf_t *b)
{
    if (b->p != b->small) {
        PyMem_Free(b->p);
    }
}

/* A type byte and its n-byte big-endian value. */
static inline int
pack_be(packbuf_t *b, unsigned char type, uint64_t v, int n)
{
    if (pack_reserve(b, 1 + n) < 0) {
        return -1;
    }
    unsigned char *q = b->p + b->len;
    q[0] = type;
    for (int i = 0; i < n; i++) {
        q[1 + i] = (unsigned char)(v >> (8 * (n - 1 - i)));
    }
    b->len += 1 + n;
    return 0;
}

/* A header of `n` items: `fix` | n below `fix_max`, else the 8/16/32-bit forms `t8`
 * (0: none), `t16`, `t32`. */
static inline int
pack_header(packbuf_t *b, Py_ssize_t n, unsigned char fix, Py_ssize_t fix_max, unsigned char t8,
            unsigned char t16, unsigned char t32)
{
    if (n < fix_max) {
        return pack_be(b, (unsigned char)(fix | n), 0, 0);
    }
    if (t8 && n < 256) {
        return pack_be(b, t8, (uint64_t)n, 1);
    }
    if (n < 65536) {
        return pack_be(b, t16, (uint64_t)n, 2);
    }
    if ((uint64_t)n <= 0xFFFFFFFFULL) {
        return pack_be(b, t32, (uint64_t)n, 4);
    }
    PyErr_SetString(PyExc_ValueError, "msgpack: too large an object");
    return -1;
}

static inline int
pack_raw(packbuf_t *b, const void *data, Py_ssize_t n)
{
    if (pack_reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->p + b->len, data, (size_t)n);
    b->len += n;
    return 0;
}

static int pack_obj(packbuf_t *b, PyObject *o, int depth);

static int
pack_str(packbuf_t *b, PyObject *o)
{
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s == NULL || pack_header(b, n, 0xa0, 32, 0xd9, 0xda, 0xdb) < 0) {
        return -1;
    }
    return pack_raw(b, s, n);
}

static int
pack_long(packbuf_t *b, PyObject *o)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            return -1;
        }
        return pack_be(b, 0xcf, u, 8);
    }
    if (overflow < 0) {
        PyErr_SetString(PyExc_OverflowError, "Python int too large to convert to C long");
        return -1;
    }
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v >= 0) {
        uint64_t u = (uint64_t)v;
        return u < 128 ? pack_be(b, (unsigned char)u, 0, 0)
             : u < 256 ? pack_be(b, 0xcc, u, 1)
             : u < 65536 ? pack_be(b, 0xcd, u, 2)
             : u <= 0xFFFFFFFFULL ? pack_be(b, 0xce, u, 4)
             : pack_be(b, 0xcf, u, 8);
    }
    return v >= -32 ? pack_be(b, (unsigned char)(v & 0xff), 0, 0)
         : v >= -128 ? pack_be(b, 0xd0, (uint64_t)v, 1)
         : v >= -32768 ? pack_be(b, 0xd1, (uint64_t)v, 2)
         : v >= -2147483648LL ? pack_be(b, 0xd2, (uint64_t)v, 4)
         : pack_be(b, 0xd3, (uint64_t)v, 8);
}

static int
pack_items(packbuf_t *b, PyObject *seq, int depth)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (pack_header(b, n, 0x90, 16, 0, 0xdc, 0xdd) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pack_obj(b, items[i], depth + 1) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A msgpack float 64 (0xcb, big-endian bits). */
static inline int
pack_double(packbuf_t *b, double d)
{
    union { double d; uint64_t u; } v;
    v.d = d;
    return pack_be(b, 0xcb, v.u, 8);
}

static int
pack_obj(packbuf_t *b, PyObject *o, int depth)
{
    if (depth > PACK_MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "recursion limit exceeded.");
        return -1;
    }
    /* the exact types first (no subtype check), then msgpack's order */
    if (PyUnicode_CheckExact(o)) {
        return pack_str(b, o);
    }
    if (PyFloat_CheckExact(o)) {
        return pack_double(b, PyFloat_AS_DOUBLE(o));
    }
    if (o == Py_None) {
        return pack_be(b, 0xc0, 0, 0);
    }
    if (o == Py_True || o == Py_False) {
        return pack_be(b, o == Py_True ? 0xc3 : 0xc2, 0, 0);
    }
    if (PyLong_Check(o)) {
        return pack_long(b, o);
    }
    if (PyFloat_Check(o)) {
        return pack_double(b, PyFloat_AS_DOUBLE(o));
    }
    if (PyBytes_Check(o) || PyByteArray_Check(o)) {
        Py_ssize_t n = PyBytes_Check(o) ? PyBytes_GET_SIZE(o) : PyByteArray_GET_SIZE(o);
        const char *s = PyBytes_Check(o) ? PyBytes_AS_STRING(o) : PyByteArray_AS_STRING(o);
        if (pack_header(b, n, 0, 0, 0xc4, 0xc5, 0xc6) < 0) {
            return -1;
        }
        return pack_raw(b, s, n);
    }
    if (PyUnicode_Check(o)) {
        return pack_str(b, o);
    }
    if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        if (pack_header(b, PyDict_GET_SIZE(o), 0x80, 16, 0, 0xde, 0xdf) < 0) {
            return -1;
        }
        while (PyDict_Next(o, &pos, &k, &v)) {
            if (pack_obj(b, k, depth + 1) < 0 || pack_obj(b, v, depth + 1) < 0) {
                return -1;
            }
        }
        return 0;
    }
    if (PyDict_Check(o)) {  /* a subclass: its items() */
        PyObject *items = PyMapping_Items(o);
        if (items == NULL) {
            return -1;
        }
        int rc = pack_header(b, PyList_GET_SIZE(items), 0x80, 16, 0, 0xde, 0xdf);
        for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(items); i++) {
            PyObject *kv = PyList_GET_ITEM(items, i);
            rc = pack_obj(b, PyTuple_GET_ITEM(kv, 0), depth + 1) < 0 ||
                 pack_obj(b, PyTuple_GET_ITEM(kv, 1), depth + 1) < 0 ? -1 : 0;
        }
        Py_DECREF(items);
        return rc;
    }
    if (PyList_Check(o) || PyTuple_Check(o)) {
        return pack_items(b, o, depth);
    }
    if (PyMemoryView_Check(o)) {
        Py_buffer view;
        if (PyObject_GetBuffer(o, &view, PyBUF_SIMPLE) < 0) {
            return -1;
        }
        int rc = pack_header(b, view.len, 0, 0, 0xc4, 0xc5, 0xc6) < 0 ? -1 : pack_raw(b, view.buf, view.len);
        PyBuffer_Release(&view);
        return rc;
    }
    PyErr_Format(PyExc_TypeError, "can not serialize '%.200s' object", Py_TYPE(o)->tp_name);
    return -1;
}

static PyObject *
pack_result(packbuf_t *b, int rc)
{
    PyObject *out = rc < 0 ? NULL : PyBytes_FromStringAndSize((const char *)b->p, b->len);
    pack_free(b);
    return out;
}

static void
pack_init(packbuf_t *b)
{
    b->p = b->small;
    b->len = 0;
    b->cap = (Py_ssize_t)sizeof(b->small);
}

static PyObject *
pack_map(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
            PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pack_map(keys, values, required): two tuples of one length and an int");
        return NULL;
    }
    Py_ssize_t required = PyLong_AsSsize_t(args[2]);
    if (required == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(keys), pairs = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        pairs += i < required || PyTuple_GET_ITEM(values, i) != Py_None;
    }
    packbuf_t b;
    pack_init(&b);
    int rc = pack_header(&b, pairs, 0x80, 16, 0, 0xde, 0xdf);
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i);
        if (i >= required && v == Py_None) {
            continue;
        }
        PyObject *k = PyTuple_GET_ITEM(keys, i);
        if (!PyUnicode_Check(k)) {
            PyErr_SetString(PyExc_TypeError, "pack_map: keys must be str");
            rc = -1;
            break;
        }
        rc = pack_str(&b, k) < 0 || pack_obj(&b, v, 1) < 0 ? -1 : 0;
    }
    return pack_result(&b, rc);
}

static PyObject *
pack_array(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !(PyTuple_Check(args[0]) || PyList_Check(args[0])) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pack_array(values, prefix): a tuple or list and bytes");
        return NULL;
    }
    packbuf_t b;
    pack_init(&b);
    int rc = pack_raw(&b, PyBytes_AS_STRING(args[1]), PyBytes_GET_SIZE(args[1]));
    if (rc == 0) {
        rc = pack_items(&b, args[0], 0);
    }
    return pack_result(&b, rc);
}

static PyMethodDef methods[] = {
    {"multinomial_jll", (PyCFunction)(void (*)(void))multinomial_jll, METH_FASTCALL,
     "multinomial_jll(indptr, indices, data, codes, weights, counts, k0, n_features, totals, alpha, "
     "seen_mode, n_seen, m_fixed, out, unseen): the prequential joint log-likelihoods of a CSR "
     "batch without the class prior into out, each row's nonzeros new to the model into unseen "
     "(see streamnb.models.prequential)."},
    {"class_sums", (PyCFunction)(void (*)(void))class_sums, METH_FASTCALL,
     "class_sums(indptr, indices, data, codes, weights, n_classes, cols, sums[, rank]): a CSR "
     "batch's distinct columns (ascending) into cols and the per-class weighted sums over them "
     "into sums (n_classes x m, C order); returns m. With rank (column_ranks), cols holds the m "
     "columns already (see streamnb.stats.feature_counts)."},
    {"column_ranks", (PyCFunction)(void (*)(void))column_ranks, METH_FASTCALL,
     "column_ranks(indices, cols, rank): the distinct columns (ascending) into cols and each "
     "nonzero's position among them into rank; returns m (see streamnb.stats.feature_counts)."},
    {"gap_rows", (PyCFunction)(void (*)(void))gap_rows, METH_FASTCALL,
     "gap_rows(indices, sizes, n_tokens): each row's msgpack [2, n_tokens, first bucket, gaps as "
     "2 bytes little-endian], None where it has no bucket or a gap is not in 1..65535 (see "
     "streamnb.features.rows)."},
    {"pack_map", (PyCFunction)(void (*)(void))pack_map, METH_FASTCALL,
     "pack_map(keys, values, required): msgpack.packb(use_bin_type=True) of the dict of keys[i] -> "
     "values[i] for every i < required and every later i whose value is not None."},
    {"pack_array", (PyCFunction)(void (*)(void))pack_array, METH_FASTCALL,
     "pack_array(values, prefix): prefix + msgpack.packb(use_bin_type=True) of list(values)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "The count models' loops over a batch's nonzeros (prequential scores, class sums), msgpack packing of outputs, and the drift detectors' per-value loops (ADWIN, Page-Hinkley), in C (optional).", -1,
    methods,
};

static int add_drift_functions(PyObject *m);

PyMODINIT_FUNC
PyInit__kernels(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && add_drift_functions(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* ---------------------------------------------------------------------------------------
 * The drift detectors' per-value loops (streamnb.drift): each does the float operations of
 * its Python reference in the same order, so states are the same bit for bit. Python's
 * ``a ** 2`` is libm's pow(|a|, 2.0) (CPython's float_pow): called through a volatile
 * exponent so that the compiler does not turn it into a product.
 * ------------------------------------------------------------------------------------- */

static volatile double drift_two = 2.0;

static double
drift_square(double a)
{
    if (a == 0.0) {
        return 0.0;
    }
    return pow(fabs(a), drift_two);
}

/* adwin_sums(xs, width, total, m2) -> (width, total, m2): ADWIN._insert's sums over xs. */
static PyObject *
adwin_sums(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "adwin_sums(xs: list, width, total, m2)");
        return NULL;
    }
    long long width = PyLong_AsLongLong(args[1]);
    double total = PyFloat_AsDouble(args[2]);
    double m2 = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *xs = args[0];
    Py_ssize_t n = PyList_GET_SIZE(xs);
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = PyFloat_AsDouble(PyList_GET_ITEM(xs, i));
        if (x == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        if (width) {
            m2 += (double)width * drift_square(x - total / (double)width) / (double)(width + 1);
        }
        width += 1;
        total += x;
    }
    return Py_BuildValue("(Ldd)", width, total, m2);
}

/* adwin_find_cut(rows, n, total, v, log_term, linear, min_window) -> bool: ADWIN._find_cut
 * over rows[level] = [[sum, m2], ...], the oldest (highest level) first. */
static PyObject *
adwin_find_cut(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "adwin_find_cut(rows: list, n, total, v, log_term, linear, min_window)");
        return NULL;
    }
    PyObject *rows = args[0];
    long long n = PyLong_AsLongLong(args[1]);
    double total = PyFloat_AsDouble(args[2]);
    double v = PyFloat_AsDouble(args[3]);
    double log_term = PyFloat_AsDouble(args[4]);
    double linear = PyFloat_AsDouble(args[5]);
    long long min_window = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    long long shift = min_window - 1, n0 = 0;
    double s0 = 0.0;
    for (Py_ssize_t level = PyList_GET_SIZE(rows) - 1; level >= 0; level--) {
        PyObject *row = PyList_GET_ITEM(rows, level);
        if (!PyList_Check(row)) {
            PyErr_SetString(PyExc_TypeError, "adwin_find_cut: a row is not a list");
            return NULL;
        }
        long long size = 1LL << level;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(row); j++) {
            PyObject *bucket = PyList_GET_ITEM(row, j);
            if (!PyList_Check(bucket) || PyList_GET_SIZE(bucket) < 1) {
                PyErr_SetString(PyExc_TypeError, "adwin_find_cut: a bucket is not [sum, m2]");
                return NULL;
            }
            double s = PyFloat_AsDouble(PyList_GET_ITEM(bucket, 0));
            if (s == -1.0 && PyErr_Occurred()) {
                return NULL;
            }
            n0 += size;
            s0 += s;
            long long n1 = n - n0;
            if (n1 < min_window) {
                Py_RETURN_FALSE;
            }
            if (n0 < min_window) {
                continue;
            }
            double m = 1.0 / (double)(n0 - shift) + 1.0 / (double)(n1 - shift);
            double diff = fabs(s0 / (double)n0 - (total - s0) / (double)n1);
            if (diff > linear * m && diff > sqrt(2.0 * m * v * log_term) + linear * m) {
                Py_RETURN_TRUE;
            }
        }
    }
    Py_RETURN_FALSE;
}

/* page_hinkley_run(xs, start, clip, alpha, delta, threshold, min_instances, watch_up,
 * watch_down, n, mean, up, up_min, down, down_max) -> (i, n, mean, up, up_min, down,
 * down_max, u, d): PageHinkley.update_many's loop from xs[start] up to the first value
 * whose statistic passes threshold (i its position, u and d its excursions), or to the end
 * (i = -1). clip None: no clipping. */
static PyObject *
page_hinkley_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 15 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "page_hinkley_run: 15 arguments, xs a list");
        return NULL;
    }
    PyObject *xs = args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    int clipped = args[2] != Py_None;
    double clip = clipped ? PyFloat_AsDouble(args[2]) : 0.0;
    double alpha = PyFloat_AsDouble(args[3]), delta = PyFloat_AsDouble(args[4]);
    double threshold = PyFloat_AsDouble(args[5]);
    long long min_instances = PyLong_AsLongLong(args[6]);
    int watch_up = PyObject_IsTrue(args[7]), watch_down = PyObject_IsTrue(args[8]);
    long long n = PyLong_AsLongLong(args[9]);
    double mean = PyFloat_AsDouble(args[10]), up = PyFloat_AsDouble(args[11]);
    double up_min = PyFloat_AsDouble(args[12]), down = PyFloat_AsDouble(args[13]);
    double down_max = PyFloat_AsDouble(args[14]);
    if (PyErr_Occurred() || watch_up < 0 || watch_down < 0) {
        return NULL;
    }
    double u = 0.0, d = 0.0;
    Py_ssize_t hit = -1;
    for (Py_ssize_t i = start < 0 ? 0 : start; i < PyList_GET_SIZE(xs); i++) {
        double x = PyFloat_AsDouble(PyList_GET_ITEM(xs, i));
        if (x == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        if (clipped && clip < x) {   /* min(x, clip) */
            x = clip;
        }
        n += 1;
        mean += (x - mean) / (double)n;
        double dev = x - mean;
        up = alpha * up + dev - delta;
        down = alpha * down + dev + delta;
        if (up < up_min) {
            up_min = up;
        }
        if (down > down_max) {
            down_max = down;
        }
        if (n < min_instances) {
            continue;
        }
        u = watch_up ? up - up_min : 0.0;
        d = watch_down ? down_max - down : 0.0;
        if ((d > u ? d : u) <= threshold) {
            continue;
        }
        hit = i;
        break;
    }
    return Py_BuildValue("(nLddddddd)", hit, n, mean, up, up_min, down, down_max, u, d);
}

/* A new bucket [s, v] (a new reference), or NULL. */
static PyObject *
adwin_bucket(double s, double v)
{
    PyObject *bucket = PyList_New(2);
    PyObject *a = PyFloat_FromDouble(s), *b = PyFloat_FromDouble(v);
    if (bucket == NULL || a == NULL || b == NULL) {
        Py_XDECREF(bucket);
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    PyList_SET_ITEM(bucket, 0, a);
    PyList_SET_ITEM(bucket, 1, b);
    return bucket;
}

/* Bucket item i (0: sum, 1: M2) of row[j], or -1 with an error set. */
static int
adwin_item(PyObject *row, Py_ssize_t j, int i, double *out)
{
    PyObject *bucket = PyList_GET_ITEM(row, j);
    if (!PyList_Check(bucket) || PyList_GET_SIZE(bucket) != 2) {
        PyErr_SetString(PyExc_TypeError, "ADWIN: a bucket is not [sum, m2]");
        return -1;
    }
    *out = PyFloat_AsDouble(PyList_GET_ITEM(bucket, i));
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* Append new to rows[level] (a new row at the end of rows if there is none); steals new. */
static int
adwin_extend_row(PyObject *rows, Py_ssize_t level, PyObject *new)
{
    int rc;
    if (level == PyList_GET_SIZE(rows)) {
        rc = PyList_Append(rows, new);
    } else {
        PyObject *row = PyList_GET_ITEM(rows, level);
        rc = PyList_SetSlice(row, PyList_GET_SIZE(row), PyList_GET_SIZE(row), new);
    }
    Py_DECREF(new);
    return rc;
}

/* ADWIN._merge_full_rows(level): over the rows there at its start, as range(level, len(rows)). */
static int
adwin_merge_rows(PyObject *rows, Py_ssize_t level, Py_ssize_t max_buckets)
{
    Py_ssize_t n_rows = PyList_GET_SIZE(rows);
    for (Py_ssize_t i = level; i < n_rows; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyList_Check(row)) {
            PyErr_SetString(PyExc_TypeError, "ADWIN: a row is not a list");
            return -1;
        }
        Py_ssize_t over = PyList_GET_SIZE(row) - max_buckets;
        if (over <= 0) {
            break;
        }
        Py_ssize_t taken = over + over % 2;
        long long size = 1LL << i;
        double sq = (double)(size * size), twice = (double)(2 * size), fsize = (double)size;
        PyObject *merged = PyList_New(taken / 2);
        if (merged == NULL) {
            return -1;
        }
        for (Py_ssize_t j = 0; j < taken; j += 2) {
            double s1, v1, s2, v2;
            if (adwin_item(row, j, 0, &s1) || adwin_item(row, j, 1, &v1) ||
                adwin_item(row, j + 1, 0, &s2) || adwin_item(row, j + 1, 1, &v2)) {
                Py_DECREF(merged);
                return -1;
            }
            double m2 = i == 0 ? drift_square(s1 - s2) / 2.0
                               : v1 + v2 + sq * drift_square(s1 / fsize - s2 / fsize) / twice;
            PyObject *bucket = adwin_bucket(s1 + s2, m2);
            if (bucket == NULL) {
                Py_DECREF(merged);
                return -1;
            }
            PyList_SET_ITEM(merged, j / 2, bucket);
        }
        if (PyList_SetSlice(row, 0, taken, NULL) < 0 || adwin_extend_row(rows, i + 1, merged) < 0) {
            return -1;
        }
    }
    return 0;
}

/* adwin_insert(rows, xs, max_buckets): ADWIN._insert_many(xs), the buckets of rows. */
static PyObject *
adwin_insert(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
        PyList_GET_SIZE(args[0]) < 1 || !PyList_Check(PyList_GET_ITEM(args[0], 0))) {
        PyErr_SetString(PyExc_TypeError, "adwin_insert(rows: list of lists, xs: list, max_buckets)");
        return NULL;
    }
    PyObject *rows = args[0], *xs = args[1], *row0 = PyList_GET_ITEM(rows, 0);
    Py_ssize_t max_buckets = PyLong_AsSsize_t(args[2]);
    if (max_buckets == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t held = PyList_GET_SIZE(row0), n = PyList_GET_SIZE(xs), total = held + n;
    Py_ssize_t k = total <= max_buckets ? 0 : 2 * ((total - max_buckets + 1) / 2);
    double *values = PyMem_Malloc(sizeof(double) * (size_t)(total ? total : 1));
    if (values == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t j = 0; j < held; j++) {
        if (adwin_item(row0, j, 0, &values[j])) {
            PyMem_Free(values);
            return NULL;
        }
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        values[held + j] = PyFloat_AsDouble(PyList_GET_ITEM(xs, j));
        if (values[held + j] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(values);
            return NULL;
        }
    }
    PyObject *merged = PyList_New(k / 2), *kept = PyList_New(total - (k > held ? k : held));
    int rc = merged == NULL || kept == NULL ? -1 : 0;
    for (Py_ssize_t j = 0; rc == 0 && j < k; j += 2) {
        double a = values[j], b = values[j + 1];
        PyObject *bucket = adwin_bucket(a + b, drift_square(a - b) / 2.0);
        if (bucket == NULL) {
            rc = -1;
        } else {
            PyList_SET_ITEM(merged, j / 2, bucket);
        }
    }
    Py_ssize_t from = k > held ? k : held;    /* row 0 keeps its buckets from k on */
    for (Py_ssize_t j = from; rc == 0 && j < total; j++) {
        PyObject *bucket = adwin_bucket(values[j], 0.0);
        if (bucket == NULL) {
            rc = -1;
        } else {
            PyList_SET_ITEM(kept, j - from, bucket);
        }
    }
    PyMem_Free(values);
    if (rc == 0) {
        rc = PyList_SetSlice(row0, 0, k < held ? k : held, NULL);
    }
    if (rc == 0) {
        rc = PyList_SetSlice(row0, PyList_GET_SIZE(row0), PyList_GET_SIZE(row0), kept);
    }
    Py_XDECREF(kept);
    if (rc == 0 && k) {
        rc = adwin_extend_row(rows, 1, merged);
        merged = NULL;
        if (rc == 0) {
            rc = adwin_merge_rows(rows, 1, max_buckets);
        }
    }
    Py_XDECREF(merged);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef drift_methods[] = {
    {"adwin_sums", (PyCFunction)(void (*)(void))adwin_sums, METH_FASTCALL,
     "adwin_sums(xs, width, total, m2) -> (width, total, m2): ADWIN's window sums after "
     "inserting each of xs (see streamnb.drift.adwin)."},
    {"adwin_find_cut", (PyCFunction)(void (*)(void))adwin_find_cut, METH_FASTCALL,
     "adwin_find_cut(rows, n, total, v, log_term, linear, min_window): whether some split of "
     "ADWIN's buckets has significantly different means (see streamnb.drift.adwin)."},
    {"adwin_insert", (PyCFunction)(void (*)(void))adwin_insert, METH_FASTCALL,
     "adwin_insert(rows, xs, max_buckets): ADWIN's buckets after inserting each of xs, merged "
     "(see streamnb.drift.adwin)."},
    {"page_hinkley_run", (PyCFunction)(void (*)(void))page_hinkley_run, METH_FASTCALL,
     "page_hinkley_run(xs, start, clip, alpha, delta, threshold, min_instances, watch_up, "
     "watch_down, n, mean, up, up_min, down, down_max) -> (i, n, mean, up, up_min, down, "
     "down_max, u, d): Page-Hinkley's updates up to the first alarm (see "
     "streamnb.drift.page_hinkley)."},
    {NULL, NULL, 0, NULL},
};

static int
add_drift_functions(PyObject *m)
{
    return PyModule_AddFunctions(m, drift_methods);
}
