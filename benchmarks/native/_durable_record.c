/* A native record path for a sync step: an experiment, not part of the package.
 *
 * encode(value, limit)        the JSON durable's JSONSerializer writes for `value`, when
 *                             `value` reads back exactly (only dict with str keys not
 *                             starting with "__durable__", list, str, int, finite float,
 *                             bool, None: exactly those types, no subclass); else None,
 *                             and the caller takes durable's own path. None too past
 *                             `limit` bytes or 500 levels deep (durable's path then says
 *                             what is wrong).
 * bind(path)                  resolve libpq's functions in the library at `path`: the one
 *                             psycopg loaded, whose PGconn the calls below are handed.
 * prepare(conn, name, sql, n) PQsendPrepare on psycopg's connection (conn.pgconn.pgconn_ptr).
 * execute(conn, name, params) PQsendQueryPrepared of text parameters (str, int, None, or an
 *                             object with isoformat()), waits, returns the row count.
 * record(conn, name, params, slot, value, limit)
 *                             encode + the exactness walk + execute in one call, the
 *                             encoded value in params[slot]: (row count, text), or None
 *                             (nothing sent) when encode gives None.
 *
 * Runs no Python code of the value's own: the walk accepts exact built-in types only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include <libpq-fe.h>

/* -- libpq, resolved in psycopg's own copy of it -------------------------------------- */

#define PQ_FUNCS(X)                                                                       \
    X(PQsendPrepare) X(PQsendQueryPrepared) X(PQflush) X(PQsocket) X(PQconsumeInput)      \
    X(PQisBusy) X(PQgetResult) X(PQresultStatus) X(PQcmdTuples) X(PQclear)                \
    X(PQresultErrorMessage) X(PQerrorMessage) X(PQtransactionStatus) X(PQisnonblocking)

#define DECLARE(f) static __typeof__(f) *p_##f = NULL;
PQ_FUNCS(DECLARE)
#undef DECLARE

static int bound = 0;

static PyObject *bind(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) lib = dlopen(path, RTLD_NOW);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "cannot load %s: %s", path, dlerror());
        return NULL;
    }
#define RESOLVE(f)                                                                        \
    p_##f = (__typeof__(f) *)dlsym(lib, #f);                                               \
    if (p_##f == NULL) {                                                                  \
        PyErr_Format(PyExc_OSError, "%s has no %s", path, #f);                            \
        return NULL;                                                                      \
    }
    PQ_FUNCS(RESOLVE)
#undef RESOLVE
    bound = 1;
    Py_RETURN_NONE;
}

/* -- the JSON encoder and the exactness walk ----------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t len, cap, limit;
    char inline_[512];
} Buf;

static void buf_init(Buf *b, Py_ssize_t limit) {
    b->data = b->inline_;
    b->len = 0;
    b->cap = sizeof b->inline_;
    b->limit = limit;
}

static void buf_free(Buf *b) {
    if (b->data != b->inline_) PyMem_Free(b->data);
}

/* 0 ok, 1 over the limit, -1 no memory (exception set) */
static int buf_reserve(Buf *b, Py_ssize_t more) {
    Py_ssize_t need = b->len + more;
    if (need <= b->cap) return 0;
    if (b->limit >= 0 && need > b->limit + 16) return 1; /* past the limit: give up early */
    Py_ssize_t cap = b->cap * 2;
    while (cap < need) cap *= 2;
    char *data;
    if (b->data == b->inline_) {
        data = PyMem_Malloc(cap);
        if (data != NULL) memcpy(data, b->data, b->len);
    } else {
        data = PyMem_Realloc(b->data, cap);
    }
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

#define RESERVE(b, n)                                                                     \
    do {                                                                                  \
        int r_ = buf_reserve((b), (n));                                                   \
        if (r_ != 0) return r_;                                                           \
    } while (0)

static int put(Buf *b, const char *s, Py_ssize_t n) {
    RESERVE(b, n);
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

static const char HEX[] = "0123456789abcdef";

static inline Py_ssize_t escape_unit(char *out, Py_UCS4 c) {
    /* json.dumps(ensure_ascii=True): printable ASCII as is, the short escapes, else \uXXXX */
    switch (c) {
    case '"': out[0] = '\\'; out[1] = '"'; return 2;
    case '\\': out[0] = '\\'; out[1] = '\\'; return 2;
    case '\n': out[0] = '\\'; out[1] = 'n'; return 2;
    case '\r': out[0] = '\\'; out[1] = 'r'; return 2;
    case '\t': out[0] = '\\'; out[1] = 't'; return 2;
    case '\b': out[0] = '\\'; out[1] = 'b'; return 2;
    case '\f': out[0] = '\\'; out[1] = 'f'; return 2;
    }
    if (c >= ' ' && c < 0x7f) {
        out[0] = (char)c;
        return 1;
    }
    if (c >= 0x10000) {
        Py_UCS4 v = c - 0x10000;
        Py_UCS4 hi = 0xd800 | ((v >> 10) & 0x3ff), lo = 0xdc00 | (v & 0x3ff);
        Py_ssize_t n = escape_unit(out, hi);
        return n + escape_unit(out + n, lo);
    }
    out[0] = '\\'; out[1] = 'u';
    out[2] = HEX[(c >> 12) & 0xf]; out[3] = HEX[(c >> 8) & 0xf];
    out[4] = HEX[(c >> 4) & 0xf]; out[5] = HEX[c & 0xf];
    return 6;
}

static int put_str(Buf *b, PyObject *s) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0) return -1; /* a legacy string made by the old API */
#endif
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (PyUnicode_IS_ASCII(s)) {
        const unsigned char *p = PyUnicode_1BYTE_DATA(s);
        RESERVE(b, n + 2);
        char *out = b->data + b->len;
        *out++ = '"';
        Py_ssize_t i = 0;
        for (; i < n; i++) { /* the common case: nothing to escape */
            unsigned char c = p[i];
            if (c < ' ' || c == '"' || c == '\\' || c == 0x7f) break;
            *out++ = (char)c;
        }
        b->len = out - b->data;
        if (i == n) {
            b->data[b->len++] = '"';
            return 0;
        }
        for (; i < n; i++) {
            RESERVE(b, 6 + 1);
            b->len += escape_unit(b->data + b->len, p[i]);
        }
        b->data[b->len++] = '"';
        return 0;
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    RESERVE(b, 1);
    b->data[b->len++] = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        RESERVE(b, 12 + 1);
        b->len += escape_unit(b->data + b->len, PyUnicode_READ(kind, data, i));
    }
    b->data[b->len++] = '"';
    return 0;
}

static const char TAG[] = "__durable__";
#define TAG_LEN ((Py_ssize_t)(sizeof TAG - 1))

static int starts_with_tag(PyObject *s) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0) return -1;
#endif
    if (PyUnicode_GET_LENGTH(s) < TAG_LEN) return 0;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < TAG_LEN; i++)
        if (PyUnicode_READ(kind, data, i) != (Py_UCS4)TAG[i]) return 0;
    return 1;
}

#define MAX_DEPTH 500

/* 0 written, 1 not exact (or too large, too deep, an int too long): the caller's own
 * path decides; -1 an error (exception set) */
static int enc(Buf *b, PyObject *o, int depth) {
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyUnicode_Type) return put_str(b, o);
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (!overflow) {
            char tmp[32];
            int n = snprintf(tmp, sizeof tmp, "%lld", v);
            return put(b, tmp, n);
        }
        PyObject *text = PyLong_Type.tp_repr(o);
        if (text == NULL) { /* past the digit limit: durable's path explains */
            PyErr_Clear();
            return 1;
        }
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(text, &n);
        int r = s == NULL ? -1 : put(b, s, n);
        Py_DECREF(text);
        return r;
    }
    if (o == Py_None) return put(b, "null", 4);
    if (o == Py_True) return put(b, "true", 4);
    if (o == Py_False) return put(b, "false", 5);
    if (t == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(o);
        if (!isfinite(d)) return 1;
        char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (s == NULL) return -1;
        int r = put(b, s, (Py_ssize_t)strlen(s));
        PyMem_Free(s);
        return r;
    }
    if (depth >= MAX_DEPTH) return 1;
    if (t == &PyDict_Type) {
        RESERVE(b, 1);
        b->data[b->len++] = '{';
        Py_ssize_t pos = 0, i = 0;
        PyObject *key, *value;
        while (PyDict_Next(o, &pos, &key, &value)) {
            if (Py_TYPE(key) != &PyUnicode_Type) return 1;
            int tag = starts_with_tag(key);
            if (tag != 0) return tag < 0 ? -1 : 1;
            if (i++ > 0) {
                RESERVE(b, 1);
                b->data[b->len++] = ',';
            }
            int r = put_str(b, key);
            if (r != 0) return r;
            RESERVE(b, 1);
            b->data[b->len++] = ':';
            r = enc(b, value, depth + 1);
            if (r != 0) return r;
        }
        RESERVE(b, 1);
        b->data[b->len++] = '}';
        return 0;
    }
    if (t == &PyList_Type) {
        RESERVE(b, 1);
        b->data[b->len++] = '[';
        Py_ssize_t n = PyList_GET_SIZE(o);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i > 0) {
                RESERVE(b, 1);
                b->data[b->len++] = ',';
            }
            int r = enc(b, PyList_GET_ITEM(o, i), depth + 1);
            if (r != 0) return r;
        }
        RESERVE(b, 1);
        b->data[b->len++] = ']';
        return 0;
    }
    return 1;
}

/* 0 encoded into b, 1 not exact (or over the limit), -1 error */
static int encode_into(Buf *b, PyObject *value, Py_ssize_t limit) {
    buf_init(b, limit);
    int r = enc(b, value, 0);
    if (r == 0 && limit >= 0 && b->len > limit) r = 1;
    return r;
}

static PyObject *encode(PyObject *self, PyObject *args) {
    PyObject *value;
    Py_ssize_t limit = -1;
    if (!PyArg_ParseTuple(args, "O|n", &value, &limit)) return NULL;
    Buf b;
    int r = encode_into(&b, value, limit);
    PyObject *out = NULL;
    if (r == 0) {
        out = PyUnicode_New(b.len, 127);
        if (out != NULL) memcpy(PyUnicode_1BYTE_DATA(out), b.data, b.len);
    } else if (r == 1) {
        out = Py_NewRef(Py_None);
    }
    buf_free(&b);
    return out;
}

/* -- sending on psycopg's connection --------------------------------------------------- */

static PGconn *conn_of(PyObject *address) {
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "call bind(path of libpq) first");
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a null PGconn");
        return NULL;
    }
    PGconn *conn = (PGconn *)p;
    if (p_PQtransactionStatus(conn) != PQTRANS_IDLE) {
        PyErr_SetString(PyExc_RuntimeError, "the connection is not idle");
        return NULL;
    }
    return conn;
}

static int wait_socket(PGconn *conn, short events) {
    struct pollfd fd = {.fd = p_PQsocket(conn), .events = events, .revents = 0};
    int r;
    Py_BEGIN_ALLOW_THREADS
    do {
        r = poll(&fd, 1, -1);
    } while (r < 0 && errno == EINTR);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return fd.revents;
}

static PyObject *conn_error(PGconn *conn) {
    PyErr_Format(PyExc_RuntimeError, "libpq: %s", p_PQerrorMessage(conn));
    return NULL;
}

/* After a send: flush, then read every result; the row count of a command's result. */
static PyObject *finish(PGconn *conn) {
    for (;;) {
        int r = p_PQflush(conn);
        if (r == 0) break;
        if (r < 0) return conn_error(conn);
        int ev = wait_socket(conn, POLLIN | POLLOUT);
        if (ev < 0) return NULL;
        if ((ev & POLLIN) && !p_PQconsumeInput(conn)) return conn_error(conn);
    }
    PGresult *first = NULL;
    for (;;) {
        while (p_PQisBusy(conn)) {
            if (wait_socket(conn, POLLIN) < 0) goto fail;
            if (!p_PQconsumeInput(conn)) {
                conn_error(conn);
                goto fail;
            }
        }
        PGresult *res = p_PQgetResult(conn);
        if (res == NULL) break;
        if (first == NULL) first = res;
        else p_PQclear(res);
    }
    if (first == NULL) return conn_error(conn);
    ExecStatusType status = p_PQresultStatus(first);
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
        PyErr_Format(PyExc_RuntimeError, "libpq: %s", p_PQresultErrorMessage(first));
        p_PQclear(first);
        return NULL;
    }
    const char *count = p_PQcmdTuples(first);
    long rows = *count ? strtol(count, NULL, 10) : -1;
    p_PQclear(first);
    return PyLong_FromLong(rows);
fail:
    if (first != NULL) p_PQclear(first);
    return NULL;
}

static PyObject *prepare(PyObject *self, PyObject *args) {
    PyObject *address;
    const char *name, *query;
    int n;
    if (!PyArg_ParseTuple(args, "Ossi", &address, &name, &query, &n)) return NULL;
    PGconn *conn = conn_of(address);
    if (conn == NULL) return NULL;
    if (!p_PQsendPrepare(conn, name, query, n, NULL)) return conn_error(conn);
    PyObject *done = finish(conn);
    if (done == NULL) return NULL;
    Py_DECREF(done);
    Py_RETURN_NONE;
}

#define MAX_PARAMS 32

/* Text parameters of `params` (slot: the one taken by `text`, or -1). Keeps what it made in
 * `keep` (to release after the send). 0 ok, -1 error. */
static int text_params(PyObject *params, Py_ssize_t slot, const char *text, const char **values,
                       char ints[][24], PyObject **keep, Py_ssize_t *kept) {
    Py_ssize_t n = PyTuple_GET_SIZE(params);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyTuple_GET_ITEM(params, i);
        if (i == slot) {
            values[i] = text;
        } else if (o == Py_None) {
            values[i] = NULL;
        } else if (Py_TYPE(o) == &PyUnicode_Type) {
            values[i] = PyUnicode_AsUTF8(o);
            if (values[i] == NULL) return -1;
        } else if (Py_TYPE(o) == &PyLong_Type) {
            long long v = PyLong_AsLongLong(o);
            if (v == -1 && PyErr_Occurred()) return -1;
            snprintf(ints[i], sizeof ints[i], "%lld", v);
            values[i] = ints[i];
        } else {
            PyObject *iso = PyObject_CallMethod(o, "isoformat", NULL);
            if (iso == NULL) return -1;
            keep[(*kept)++] = iso;
            values[i] = PyUnicode_AsUTF8(iso);
            if (values[i] == NULL) return -1;
        }
    }
    return 0;
}

static PyObject *send_prepared(PGconn *conn, const char *name, PyObject *params,
                               Py_ssize_t slot, const char *text) {
    Py_ssize_t n = PyTuple_GET_SIZE(params);
    if (n > MAX_PARAMS) {
        PyErr_SetString(PyExc_ValueError, "too many parameters");
        return NULL;
    }
    const char *values[MAX_PARAMS];
    char ints[MAX_PARAMS][24];
    PyObject *keep[MAX_PARAMS];
    Py_ssize_t kept = 0;
    PyObject *out = NULL;
    if (text_params(params, slot, text, values, ints, keep, &kept) == 0) {
        if (!p_PQsendQueryPrepared(conn, name, (int)n, values, NULL, NULL, 0))
            conn_error(conn);
        else
            out = finish(conn);
    }
    for (Py_ssize_t i = 0; i < kept; i++) Py_DECREF(keep[i]);
    return out;
}

static PyObject *execute(PyObject *self, PyObject *args) {
    PyObject *address, *params;
    const char *name;
    if (!PyArg_ParseTuple(args, "OsO!", &address, &name, &PyTuple_Type, &params)) return NULL;
    PGconn *conn = conn_of(address);
    if (conn == NULL) return NULL;
    return send_prepared(conn, name, params, -1, NULL);
}

static PyObject *record(PyObject *self, PyObject *args) {
    PyObject *address, *params, *value;
    const char *name;
    Py_ssize_t slot, limit;
    if (!PyArg_ParseTuple(args, "OsO!nOn", &address, &name, &PyTuple_Type, &params, &slot,
                          &value, &limit))
        return NULL;
    if (slot < 0 || slot >= PyTuple_GET_SIZE(params)) {
        PyErr_SetString(PyExc_IndexError, "slot out of range");
        return NULL;
    }
    PGconn *conn = conn_of(address);
    if (conn == NULL) return NULL;
    Buf b;
    int r = encode_into(&b, value, limit);
    PyObject *out = NULL;
    if (r == 1) {
        out = Py_NewRef(Py_None);
    } else if (r == 0 && put(&b, "", 1) == 0) { /* NUL-terminated for libpq */
        PyObject *count = send_prepared(conn, name, params, slot, b.data);
        if (count != NULL) {
            PyObject *text = PyUnicode_New(b.len - 1, 127);
            if (text != NULL) {
                memcpy(PyUnicode_1BYTE_DATA(text), b.data, b.len - 1);
                out = PyTuple_Pack(2, count, text);
                Py_DECREF(text);
            }
            Py_DECREF(count);
        }
    }
    buf_free(&b);
    return out;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(path): resolve libpq's functions in that library"},
    {"encode", encode, METH_VARARGS, "encode(value, limit=-1): JSON text, or None"},
    {"prepare", prepare, METH_VARARGS, "prepare(pgconn_ptr, name, sql, nparams)"},
    {"execute", execute, METH_VARARGS, "execute(pgconn_ptr, name, params): row count"},
    {"record", record, METH_VARARGS,
     "record(pgconn_ptr, name, params, slot, value, limit): (row count, text), or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_durable_record", "A native record path (an experiment).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__durable_record(void) { return PyModule_Create(&module); }
