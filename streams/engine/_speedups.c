/* Stable JSON and its sha256 digest in C: the hot path of streams.engine.hashing.
 *
 *   stable_json(value)   -> bytes | None
 *   stable_digest(value) -> str | None    (64 lower-case hex digits)
 *   outcome_digest(value) -> str | None   (stable_digest, declining any value
 *                                          with an untrusted-content marker,
 *                                          whose ids Python makes stable first)
 *
 * The pure-Python functions in streams/engine/stablejson.py remain the
 * definition. These answer only where they are sure to give the same bytes,
 * and return None for everything else, which then takes the Python path:
 * integers of 2**53 and beyond (JavaScript would round them), Python floats
 * (payloads carry floats as msgspec.Raw in JavaScript spelling), object keys
 * at or above U+E000 (UTF-16 and code-point order can differ there), strings
 * that are not valid UTF-8 (lone surrogates), nesting deeper than MAX_DEPTH,
 * and any type other than the ones a JSON decoder produces.
 *
 * Without this module (no C compiler where loopwarden was installed) the
 * engine runs on the Python path alone and gives the same verdicts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <string.h>

#ifdef LW_OPENSSL
#include <openssl/evp.h>
#endif

#define MAX_DEPTH 512
#define MAX_SAFE_INTEGER 9007199254740991LL /* 2**53 - 1 */
#define SMALL_ITEMS 16

enum { DONE = 0, FALLBACK = 1, FAILED = -1 }; /* FAILED: a Python error is set */

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
    char small[4096];
} Buffer;

static PyTypeObject *raw_type; /* msgspec.Raw */
#ifdef LW_OPENSSL
static EVP_MD_CTX *sha_ctx; /* reused: calls are serialised by the GIL */
static EVP_MD *sha256_md;   /* fetched once: an implicit fetch per digest costs more than the hashing */
#else
static PyObject *sha256_new; /* hashlib.sha256 */
#endif

static void buffer_init(Buffer *b) {
    b->data = b->small;
    b->len = 0;
    b->cap = sizeof(b->small);
}

static void buffer_free(Buffer *b) {
    if (b->data != b->small) PyMem_Free(b->data);
}

static int buffer_reserve(Buffer *b, Py_ssize_t extra) {
    if (extra <= b->cap - b->len) return DONE;
    if (extra > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return FAILED;
    }
    Py_ssize_t cap = b->cap;
    while (cap - b->len < extra) cap *= 2;
    char *data;
    if (b->data == b->small) {
        data = PyMem_Malloc(cap);
        if (data != NULL) memcpy(data, b->small, b->len);
    } else {
        data = PyMem_Realloc(b->data, cap);
    }
    if (data == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    b->data = data;
    b->cap = cap;
    return DONE;
}

static int buffer_put(Buffer *b, const char *text, Py_ssize_t n) {
    if (buffer_reserve(b, n) != DONE) return FAILED;
    memcpy(b->data + b->len, text, n);
    b->len += n;
    return DONE;
}

static const char HEX[] = "0123456789abcdef";

/* Escape an ASCII character as JSON.stringify does (which is also what msgspec
 * does): the short escapes, \u00XX for the other control characters. */
static inline unsigned char *put_ascii(unsigned char *out, unsigned char c) {
    *out++ = '\\';
    switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        default:
            *out++ = 'u';
            *out++ = '0';
            *out++ = '0';
            *out++ = HEX[c >> 4];
            *out++ = HEX[c & 0xF];
    }
    return out;
}

/* Bytes that JSON needs escaped: the control characters, '"' and '\\'. */
static unsigned char needs_escape[128];

/* How many bytes at the start of `text` need no escape in a JSON string (the
 * first that does is a control character, '"' or '\\'); 16 at a time. */
static Py_ssize_t plain_prefix(const unsigned char *text, Py_ssize_t n) {
    Py_ssize_t i = 0;
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1F);
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(text + i));
        __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                    _mm_cmpeq_epi8(_mm_min_epu8(v, control), v)); /* v <= 0x1F */
        int mask = _mm_movemask_epi8(stop);
        if (mask != 0) return i + __builtin_ctz(mask);
    }
#endif
    while (i < n && (text[i] >= 0x80 || !needs_escape[text[i]])) i++;
    return i;
}

/* A quoted string from UTF-8 bytes: non-ASCII bytes are copied as they are. */
static int put_utf8_string(Buffer *b, const char *text, Py_ssize_t n) {
    if (buffer_reserve(b, 6 * n + 2) != DONE) return FAILED;
    const unsigned char *in = (const unsigned char *)text;
    unsigned char *out = (unsigned char *)b->data + b->len;
    *out++ = '"';
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t plain = plain_prefix(in + i, n - i);
        memcpy(out, in + i, plain);
        out += plain;
        i += plain;
        if (i < n) out = put_ascii(out, in[i++]);
    }
    *out++ = '"';
    b->len = (char *)out - b->data;
    return DONE;
}

static const char *utf8_of(PyObject *text, Py_ssize_t *n) {
    const char *data = PyUnicode_AsUTF8AndSize(text, n);
    if (data == NULL && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) PyErr_Clear();
    return data;
}

/* UTF-8 of code points of one width (Py_UCS1, Py_UCS2 or Py_UCS4), escaped;
 * NULL for a lone surrogate, which has no UTF-8. */
#define UTF8_WRITER(NAME, CHAR)                                                 \
    static unsigned char *NAME(unsigned char *out, const CHAR *text, Py_ssize_t n) { \
        for (Py_ssize_t i = 0; i < n; i++) {                                    \
            Py_UCS4 c = text[i];                                                \
            if (c < 0x80) {                                                     \
                if (needs_escape[c]) out = put_ascii(out, (unsigned char)c);    \
                else *out++ = (unsigned char)c;                                 \
            } else if (c < 0x800) {                                             \
                *out++ = (unsigned char)(0xC0 | (c >> 6));                      \
                *out++ = (unsigned char)(0x80 | (c & 0x3F));                    \
            } else if (c < 0x10000) {                                           \
                if (c >= 0xD800 && c <= 0xDFFF) return NULL;                    \
                *out++ = (unsigned char)(0xE0 | (c >> 12));                     \
                *out++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));             \
                *out++ = (unsigned char)(0x80 | (c & 0x3F));                    \
            } else {                                                            \
                *out++ = (unsigned char)(0xF0 | (c >> 18));                     \
                *out++ = (unsigned char)(0x80 | ((c >> 12) & 0x3F));            \
                *out++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));             \
                *out++ = (unsigned char)(0x80 | (c & 0x3F));                    \
            }                                                                   \
        }                                                                       \
        return out;                                                             \
    }

UTF8_WRITER(utf8_from_ucs1, Py_UCS1)
UTF8_WRITER(utf8_from_ucs2, Py_UCS2)
UTF8_WRITER(utf8_from_ucs4, Py_UCS4)

/* A str value, written as UTF-8 straight from its code points: no UTF-8 copy
 * of the string is made or cached (most payload text is not ASCII). */
static int put_string(Buffer *b, PyObject *text) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (PyUnicode_IS_ASCII(text)) return put_utf8_string(b, (const char *)PyUnicode_1BYTE_DATA(text), n);
    if (buffer_reserve(b, 6 * n + 2) != DONE) return FAILED;
    unsigned char *out = (unsigned char *)b->data + b->len;
    *out++ = '"';
    switch (PyUnicode_KIND(text)) {
        case PyUnicode_1BYTE_KIND: out = utf8_from_ucs1(out, PyUnicode_1BYTE_DATA(text), n); break;
        case PyUnicode_2BYTE_KIND: out = utf8_from_ucs2(out, PyUnicode_2BYTE_DATA(text), n); break;
        default: out = utf8_from_ucs4(out, PyUnicode_4BYTE_DATA(text), n);
    }
    if (out == NULL) return FALLBACK;
    *out++ = '"';
    b->len = (char *)out - b->data;
    return DONE;
}

typedef struct {
    const char *key;
    Py_ssize_t key_len;
    PyObject *value;
} Item;

/* Code-point order, which is the order of the UTF-8 bytes. */
static int item_cmp(const void *a, const void *b) {
    const Item *x = a, *y = b;
    Py_ssize_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    if (c != 0) return c;
    return (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

static int put_value(Buffer *b, PyObject *value, int depth);

static int put_dict(Buffer *b, PyObject *dict, int depth) {
    Py_ssize_t n = PyDict_GET_SIZE(dict);
    if (n == 0) return buffer_put(b, "{}", 2);
    Item small[SMALL_ITEMS];
    Item *items = small;
    if (n > SMALL_ITEMS) {
        items = PyMem_Malloc(n * sizeof(Item));
        if (items == NULL) {
            PyErr_NoMemory();
            return FAILED;
        }
    }
    int status = DONE;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *item;
    while (PyDict_Next(dict, &pos, &key, &item)) {
        if (!PyUnicode_CheckExact(key)) {
            status = FALLBACK;
            goto done;
        }
        const char *text = utf8_of(key, &items[i].key_len);
        if (text == NULL) {
            status = PyErr_Occurred() ? FAILED : FALLBACK;
            goto done;
        }
        for (Py_ssize_t j = 0; j < items[i].key_len; j++) {
            if ((unsigned char)text[j] >= 0xEE) { /* a code point at or above U+E000 */
                status = FALLBACK;
                goto done;
            }
        }
        items[i].key = text;
        items[i].value = item;
        i++;
    }
    if (n > SMALL_ITEMS) {
        qsort(items, n, sizeof(Item), item_cmp);
    } else {
        for (Py_ssize_t j = 1; j < n; j++) { /* insertion sort: payload objects have few keys */
            Item next = items[j];
            Py_ssize_t k = j;
            for (; k > 0 && item_cmp(&items[k - 1], &next) > 0; k--) items[k] = items[k - 1];
            items[k] = next;
        }
    }
    if (buffer_put(b, "{", 1) != DONE) {
        status = FAILED;
        goto done;
    }
    for (i = 0; i < n; i++) {
        if (i > 0 && buffer_put(b, ",", 1) != DONE) {
            status = FAILED;
            goto done;
        }
        if (put_utf8_string(b, items[i].key, items[i].key_len) != DONE || buffer_put(b, ":", 1) != DONE) {
            status = FAILED;
            goto done;
        }
        status = put_value(b, items[i].value, depth + 1);
        if (status != DONE) goto done;
    }
    status = buffer_put(b, "}", 1);
done:
    if (items != small) PyMem_Free(items);
    return status;
}

static int put_sequence(Buffer *b, PyObject *seq, int depth) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (buffer_put(b, "[", 1) != DONE) return FAILED;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && buffer_put(b, ",", 1) != DONE) return FAILED;
        int status = put_value(b, items[i], depth + 1);
        if (status != DONE) return status;
    }
    return buffer_put(b, "]", 1);
}

static int put_value(Buffer *b, PyObject *value, int depth) {
    if (depth > MAX_DEPTH) return FALLBACK;
    if (value == Py_None) return buffer_put(b, "null", 4);
    if (value == Py_True) return buffer_put(b, "true", 4);
    if (value == Py_False) return buffer_put(b, "false", 5);
    PyTypeObject *type = Py_TYPE(value);
    if (type == &PyUnicode_Type) return put_string(b, value);
    if (type == &PyDict_Type) return put_dict(b, value, depth);
    if (type == &PyList_Type || type == &PyTuple_Type) return put_sequence(b, value, depth);
    if (type == &PyLong_Type) {
        int overflow;
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (number == -1 && PyErr_Occurred()) return FAILED;
        if (overflow || number > MAX_SAFE_INTEGER || number < -MAX_SAFE_INTEGER) return FALLBACK;
        char digits[24];
        int n = snprintf(digits, sizeof(digits), "%lld", number);
        return buffer_put(b, digits, n);
    }
    if (type == raw_type) {
        Py_buffer view;
        if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) != 0) return FAILED;
        int status = buffer_put(b, view.buf, view.len);
        PyBuffer_Release(&view);
        return status;
    }
    return FALLBACK;
}

/* DONE with the bytes in `b`, FALLBACK, or FAILED. */
static int encode(Buffer *b, PyObject *value) {
    buffer_init(b);
    int status = put_value(b, value, 0);
    if (status != DONE) buffer_free(b);
    return status;
}

/* `finish(bytes)` of value's stable JSON, None where the Python path must answer, or NULL on error.
   `finish` owns the buffer: it frees it. */
static PyObject *answer(PyObject *value, PyObject *(*finish)(Buffer *)) {
    Buffer b;
    int status = encode(&b, value);
    if (status == FAILED) return NULL;
    if (status == FALLBACK) Py_RETURN_NONE;
    return finish(&b);
}

static PyObject *as_bytes(Buffer *b) {
    PyObject *out = PyBytes_FromStringAndSize(b->data, b->len);
    buffer_free(b);
    return out;
}

static PyObject *stable_json(PyObject *module, PyObject *value) {
    (void)module;
    return answer(value, as_bytes);
}

#ifdef LW_OPENSSL
static PyObject *hex_of(const unsigned char *md, Py_ssize_t n) {
    PyObject *out = PyUnicode_New(2 * n, 127);
    if (out == NULL) return NULL;
    Py_UCS1 *text = PyUnicode_1BYTE_DATA(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        text[2 * i] = HEX[md[i] >> 4];
        text[2 * i + 1] = HEX[md[i] & 0xF];
    }
    return out;
}
#endif

static PyObject *as_digest(Buffer *b) {
#ifdef LW_OPENSSL
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    int ok = EVP_DigestInit_ex(sha_ctx, sha256_md, NULL) && EVP_DigestUpdate(sha_ctx, b->data, b->len) &&
             EVP_DigestFinal_ex(sha_ctx, md, &md_len);
    buffer_free(b);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL sha256 failed");
        return NULL;
    }
    return hex_of(md, md_len);
#else
    PyObject *data = as_bytes(b);
    if (data == NULL) return NULL;
    PyObject *hash = PyObject_CallOneArg(sha256_new, data);
    Py_DECREF(data);
    if (hash == NULL) return NULL;
    PyObject *out = PyObject_CallMethod(hash, "hexdigest", NULL);
    Py_DECREF(hash);
    return out;
#endif
}

static PyObject *stable_digest(PyObject *module, PyObject *value) {
    (void)module;
    return answer(value, as_digest);
}

/* Every wrap of external content starts with this; JSON never escapes its
 * characters, so it shows in the stable JSON exactly where a string holds it. */
static const char MARKER[] = "<<<EXTERNAL_UNTRUSTED_CONTENT";

static PyObject *outcome_digest(PyObject *module, PyObject *value) {
    (void)module;
    Buffer b;
    int status = encode(&b, value);
    if (status == FAILED) return NULL;
    if (status == DONE && memmem(b.data, b.len, MARKER, sizeof(MARKER) - 1) != NULL) {
        buffer_free(&b);
        status = FALLBACK;
    }
    if (status == FALLBACK) Py_RETURN_NONE;
    return as_digest(&b);
}

static PyMethodDef methods[] = {
    {"stable_json", stable_json, METH_O, "Stable JSON bytes of a decoded payload, or None for the exact Python path."},
    {"stable_digest", stable_digest, METH_O, "sha256 hex digest of stable_json(value), or None for the exact Python path."},
    {"outcome_digest", outcome_digest, METH_O,
     "stable_digest(value), or None when the value holds an untrusted-content marker (or for the exact Python path)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "streams.engine._speedups",
    .m_doc = "Stable JSON and its digests in C (see _speedups.c).",
    .m_size = -1,
    .m_methods = methods,
};

static PyObject *attribute_of(const char *module_name, const char *name) {
    PyObject *module = PyImport_ImportModule(module_name);
    if (module == NULL) return NULL;
    PyObject *found = PyObject_GetAttrString(module, name);
    Py_DECREF(module);
    return found;
}

PyMODINIT_FUNC PyInit__speedups(void) {
    PyObject *raw = attribute_of("msgspec", "Raw");
    if (raw == NULL) return NULL;
    if (!PyType_Check(raw)) {
        Py_DECREF(raw);
        PyErr_SetString(PyExc_ImportError, "msgspec.Raw is not a type");
        return NULL;
    }
    raw_type = (PyTypeObject *)raw; /* kept for the life of the process */
    for (int c = 0; c < 0x20; c++) needs_escape[c] = 1;
    needs_escape['"'] = needs_escape['\\'] = 1;
#ifdef LW_OPENSSL
    sha_ctx = EVP_MD_CTX_new();
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (sha_ctx == NULL || sha256_md == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA256");
        return NULL;
    }
#else
    sha256_new = attribute_of("hashlib", "sha256");
    if (sha256_new == NULL) return NULL;
#endif
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
#ifdef LW_OPENSSL
    if (PyModule_AddStringConstant(module, "sha256", "openssl") != 0) {
#else
    if (PyModule_AddStringConstant(module, "sha256", "hashlib") != 0) {
#endif
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
