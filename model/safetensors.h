// safetensors.h: a single-header reader for the safetensors checkpoint format, stb style.
//
//   #define HYST_IMPLEMENTATION   in exactly one .cpp before including this header.
//
// Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, then N bytes of JSON
//   { "<tensor name>": {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
//     "__metadata__": {"key": "value", ...} }
// then the data area; offsets are relative to the start of the data area.
//
// Everything is validated: the header length lies within the file and below HYST_MAX_HEADER_BYTES, the JSON is
// well formed, each dtype is known, shape product x dtype size == end - begin, every range lies inside the data
// area, no two ranges overlap, and the last range ends the file (no bytes after it). Files are mapped read-only
// (mmap).
//
// Design: public names carry the prefix hyst_; capacities are fixed (HYST_MAX_TENSORS tensors per file, names of
// at most HYST_MAX_NAME-1 bytes, HYST_MAX_DIMS dims); the reader allocates nothing (the caller owns hyst_file,
// which is large: allocate it on the heap); functions return an int status (HYST_OK == 0) and fill
// file->error with a one-line reason. hyst_parse_header() works on memory and is the fuzz entry point.
#ifndef HYST_SAFETENSORS_H
#define HYST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifndef HYST_MAX_TENSORS
#define HYST_MAX_TENSORS 8192
#endif
#ifndef HYST_MAX_NAME
#define HYST_MAX_NAME 256
#endif
#define HYST_MAX_DIMS 8
#define HYST_MAX_HEADER_BYTES (100u * 1000u * 1000u)

enum {
    HYST_OK = 0,
    HYST_ERR_IO = 1,        // open/stat/mmap failed
    HYST_ERR_FORMAT = 2,    // malformed header or inconsistent tensor entry
    HYST_ERR_DTYPE = 3,     // a dtype this reader does not support
    HYST_ERR_CAPACITY = 4,  // more tensors / longer names / more dims than the fixed capacities
};

// Element types: F32, F16, BF16, the 8-bit floats of FP8 checkpoints (F8_E4M3 = torch.float8_e4m3fn,
// F8_E5M2 = torch.float8_e5m2), and the integers of compressed-tensors int4 checkpoints (I32: the packed codes
// "<name>.weight_packed"; I64: "<name>.weight_shape"). Any other dtype string is refused with HYST_ERR_DTYPE.
typedef enum {
    HYST_F32 = 0,
    HYST_F16 = 1,
    HYST_BF16 = 2,
    HYST_F8_E4M3 = 3,
    HYST_F8_E5M2 = 4,
    HYST_I32 = 5,
    HYST_I64 = 6,
    HYST_UNKNOWN = 255,
} hyst_dtype;

typedef struct {
    char name[HYST_MAX_NAME];
    hyst_dtype dtype;
    int n_dims;
    int64_t shape[HYST_MAX_DIMS];
    uint64_t begin, end;  // byte range relative to the data area
    const void* data;     // points into the mapping (NULL for hyst_parse_header without data)
} hyst_tensor;

typedef struct {
    int n_tensors;
    hyst_tensor tensors[HYST_MAX_TENSORS];
    uint64_t header_bytes;  // N
    uint64_t data_bytes;    // size of the data area
    void* map;              // mmap base (NULL when not mapped)
    uint64_t map_bytes;
    char error[512];
    const hyst_tensor* order[HYST_MAX_TENSORS];  // scratch for the overlap check
} hyst_file;

#ifdef __cplusplus
extern "C" {
#endif

// Maps `path` and parses its header. On failure returns a HYST_ERR_* code, file->error names the file and the
// problem, and nothing stays mapped.
int hyst_open(hyst_file* file, const char* path);
// Unmaps. Safe to call on a zeroed or already-closed file.
void hyst_close(hyst_file* file);
// Parses a whole in-memory file image (8-byte length + header + data). `bytes` must stay valid while the tensors
// are used. This is the fuzz entry point.
int hyst_parse(hyst_file* file, const void* bytes, uint64_t n_bytes);
// Finds a tensor by exact name; NULL if absent.
const hyst_tensor* hyst_find(const hyst_file* file, const char* name);
// Bytes per element of a dtype (0 for HYST_UNKNOWN).
size_t hyst_dtype_size(hyst_dtype t);
const char* hyst_dtype_name(hyst_dtype t);

#ifdef __cplusplus
}
#endif
#endif  // HYST_SAFETENSORS_H

#ifdef HYST_IMPLEMENTATION
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int hyst__fail(hyst_file* f, int code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->error, sizeof f->error, fmt, ap);
    va_end(ap);
    return code;
}

size_t hyst_dtype_size(hyst_dtype t) {
    switch (t) {
        case HYST_F32: return 4;
        case HYST_F16: return 2;
        case HYST_BF16: return 2;
        case HYST_F8_E4M3: return 1;
        case HYST_F8_E5M2: return 1;
        case HYST_I32: return 4;
        case HYST_I64: return 8;
        default: return 0;
    }
}

const char* hyst_dtype_name(hyst_dtype t) {
    switch (t) {
        case HYST_F32: return "F32";
        case HYST_F16: return "F16";
        case HYST_BF16: return "BF16";
        case HYST_F8_E4M3: return "F8_E4M3";
        case HYST_F8_E5M2: return "F8_E5M2";
        case HYST_I32: return "I32";
        case HYST_I64: return "I64";
        default: return "unknown";
    }
}

// ---- a minimal JSON reader, enough for the safetensors header ----
typedef struct {
    const char* p;
    const char* end;
    hyst_file* f;
} hyst__json;

static void hyst__ws(hyst__json* j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

// Names the JSON value at j->p for an error's "found ...": "the end of the header", "a string", "an object", "an
// array", the token itself (a number, true, false, null; at most 24 bytes, then "..."), else the character.
static const char* hyst__found(hyst__json* j, char* buf, size_t cap) {
    hyst__ws(j);
    if (j->p >= j->end) return "the end of the header";
    const char c = *j->p;
    if (c == '"') return "a string";
    if (c == '{') return "an object";
    if (c == '[') return "an array";
    size_t n = 0;
    while (j->p + n < j->end && n < 24 &&
           (j->p[n] == '+' || j->p[n] == '-' || j->p[n] == '.' || (j->p[n] >= '0' && j->p[n] <= '9') ||
            (j->p[n] >= 'a' && j->p[n] <= 'z') || (j->p[n] >= 'A' && j->p[n] <= 'Z')))
        n++;
    if (n == 0) {
        if (c > 0x20 && c < 0x7f)
            snprintf(buf, cap, "'%c'", c);
        else
            snprintf(buf, cap, "byte 0x%02x", (unsigned)(unsigned char)c);
    } else {
        snprintf(buf, cap, "%.*s%s", (int)n, j->p, j->p + n < j->end && n == 24 ? "..." : "");
    }
    return buf;
}

static int hyst__expect(hyst__json* j, char c) {
    hyst__ws(j);
    if (j->p >= j->end || *j->p != c) {
        char found[32];
        return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: expected '%c', found %s", c,
                          hyst__found(j, found, sizeof found));
    }
    j->p++;
    return HYST_OK;
}

static int hyst__hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Reads a JSON string into out (capacity cap, NUL-terminated). Decodes escapes, \uXXXX to UTF-8 (surrogate pairs
// included).
static int hyst__string(hyst__json* j, char* out, size_t cap) {
    hyst__ws(j);
    if (j->p >= j->end || *j->p != '"') {
        char found[32];
        return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: expected a string, found %s",
                          hyst__found(j, found, sizeof found));
    }
    j->p++;
    size_t n = 0;
    while (1) {
        if (j->p >= j->end) return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: unterminated string");
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"') break;
        if (c < 0x20) return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: control character in a string");
        uint32_t cp = c;
        int raw = 1;
        if (c == '\\') {
            if (j->p >= j->end) return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: unterminated escape");
            char e = *j->p++;
            raw = 0;
            switch (e) {
                case '"': cp = '"'; break;
                case '\\': cp = '\\'; break;
                case '/': cp = '/'; break;
                case 'b': cp = '\b'; break;
                case 'f': cp = '\f'; break;
                case 'n': cp = '\n'; break;
                case 'r': cp = '\r'; break;
                case 't': cp = '\t'; break;
                case 'u': {
                    uint32_t v = 0;
                    for (int k = 0; k < 4; k++) {
                        int h = j->p < j->end ? hyst__hex(*j->p) : -1;
                        if (h < 0) return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: bad \\u escape");
                        v = v * 16 + (uint32_t)h;
                        j->p++;
                    }
                    if (v >= 0xD800 && v < 0xDC00 && j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') {
                        uint32_t lo = 0;
                        int ok = 1;
                        for (int k = 0; k < 4; k++) {
                            int h = hyst__hex(j->p[2 + k]);
                            if (h < 0) ok = 0;
                            lo = lo * 16 + (uint32_t)(h < 0 ? 0 : h);
                        }
                        if (ok && lo >= 0xDC00 && lo < 0xE000) {
                            v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                            j->p += 6;
                        }
                    }
                    cp = v;
                    break;
                }
                default: return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: bad escape '\\%c'", e);
            }
        }
        unsigned char buf[4];
        size_t len;
        if (raw || cp < 0x80) {
            buf[0] = (unsigned char)cp;
            len = 1;
        } else if (cp < 0x800) {
            buf[0] = (unsigned char)(0xC0 | (cp >> 6));
            buf[1] = (unsigned char)(0x80 | (cp & 0x3F));
            len = 2;
        } else if (cp < 0x10000) {
            buf[0] = (unsigned char)(0xE0 | (cp >> 12));
            buf[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            buf[2] = (unsigned char)(0x80 | (cp & 0x3F));
            len = 3;
        } else {
            buf[0] = (unsigned char)(0xF0 | (cp >> 18));
            buf[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
            buf[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            buf[3] = (unsigned char)(0x80 | (cp & 0x3F));
            len = 4;
        }
        if (out) {
            if (n + len >= cap)
                return hyst__fail(j->f, HYST_ERR_CAPACITY, "header: a name is longer than %d bytes", (int)cap - 1);
            memcpy(out + n, buf, len);
        }
        n += len;
    }
    if (out) out[n] = 0;
    return HYST_OK;
}

// Reads a non-negative integer (no sign, no fraction, no exponent) that fits in 63 bits.
static int hyst__uint(hyst__json* j, uint64_t* out) {
    char found[32];
    hyst__ws(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9')
        return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: expected a non-negative integer, found %s",
                          hyst__found(j, found, sizeof found));
    const char* start = j->p;
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (v > (UINT64_C(1) << 62) / 10) return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: integer too large");
        v = v * 10 + (uint64_t)(*j->p - '0');
        j->p++;
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')) {
        j->p = start;
        return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: expected an integer, found %s",
                          hyst__found(j, found, sizeof found));
    }
    *out = v;
    return HYST_OK;
}

// Skips any JSON value (used for __metadata__ and unknown fields), with a depth bound.
static int hyst__skip(hyst__json* j, int depth) {
    if (depth > 64) return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: nested too deeply");
    hyst__ws(j);
    if (j->p >= j->end) return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: unexpected end");
    char c = *j->p;
    if (c == '"') return hyst__string(j, NULL, 0);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        hyst__ws(j);
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return HYST_OK;
        }
        while (1) {
            int rc;
            if (c == '{') {
                if ((rc = hyst__string(j, NULL, 0))) return rc;
                if ((rc = hyst__expect(j, ':'))) return rc;
            }
            if ((rc = hyst__skip(j, depth + 1))) return rc;
            hyst__ws(j);
            if (j->p < j->end && *j->p == ',') {
                j->p++;
                continue;
            }
            return hyst__expect(j, close);
        }
    }
    // number, true, false, null
    const char* start = j->p;
    while (j->p < j->end && (strchr("+-.eE0123456789", *j->p) || (*j->p >= 'a' && *j->p <= 'z'))) j->p++;
    if (j->p == start) return hyst__fail(j->f, HYST_ERR_FORMAT, "header JSON: unexpected character '%c'", c);
    return HYST_OK;
}

static hyst_dtype hyst__dtype(const char* s) {
    if (!strcmp(s, "F32")) return HYST_F32;
    if (!strcmp(s, "F16")) return HYST_F16;
    if (!strcmp(s, "BF16")) return HYST_BF16;
    if (!strcmp(s, "F8_E4M3")) return HYST_F8_E4M3;
    if (!strcmp(s, "F8_E5M2")) return HYST_F8_E5M2;
    if (!strcmp(s, "I32")) return HYST_I32;
    if (!strcmp(s, "I64")) return HYST_I64;
    return HYST_UNKNOWN;
}

// Reads one tensor entry; `field` (32 bytes) holds the key whose value is being read ("" between values), for
// hyst__tensor's error.
static int hyst__tensor_entry(hyst__json* j, hyst_tensor* t, char* field) {
    int rc, have_dtype = 0, have_shape = 0, have_offsets = 0;
    char key[32], dtype[32];
    hyst__ws(j);
    if (j->p >= j->end || *j->p != '{') {
        char found[32];
        return hyst__fail(j->f, HYST_ERR_FORMAT,
                          "tensor '%s': expected an object (dtype, shape, data_offsets), found %s", t->name,
                          hyst__found(j, found, sizeof found));
    }
    j->p++;
    hyst__ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return hyst__fail(j->f, HYST_ERR_FORMAT, "tensor '%s': empty entry", t->name);
    }
    while (1) {
        rc = hyst__string(j, key, sizeof key);
        if (rc == HYST_ERR_CAPACITY) {
            key[0] = 0;  // an unknown long key: skip its value below
        } else if (rc) {
            return rc;
        }
        if ((rc = hyst__expect(j, ':'))) return rc;
        memcpy(field, key, sizeof key);
        if (!strcmp(key, "dtype")) {
            if ((rc = hyst__string(j, dtype, sizeof dtype))) return rc;
            t->dtype = hyst__dtype(dtype);
            if (t->dtype == HYST_UNKNOWN)
                return hyst__fail(
                    j->f, HYST_ERR_DTYPE,
                    "tensor '%s': unsupported dtype %s (supported: F32, F16, BF16, F8_E4M3, F8_E5M2, I32, I64)",
                    t->name, dtype);
            have_dtype = 1;
        } else if (!strcmp(key, "shape")) {
            if ((rc = hyst__expect(j, '['))) return rc;
            t->n_dims = 0;
            hyst__ws(j);
            if (j->p < j->end && *j->p == ']') {
                j->p++;
            } else {
                while (1) {
                    uint64_t d;
                    if ((rc = hyst__uint(j, &d))) return rc;
                    if (t->n_dims == HYST_MAX_DIMS)
                        return hyst__fail(j->f, HYST_ERR_CAPACITY, "tensor '%s': more than %d dims", t->name,
                                          HYST_MAX_DIMS);
                    t->shape[t->n_dims++] = (int64_t)d;
                    hyst__ws(j);
                    if (j->p < j->end && *j->p == ',') {
                        j->p++;
                        continue;
                    }
                    if ((rc = hyst__expect(j, ']'))) return rc;
                    break;
                }
            }
            have_shape = 1;
        } else if (!strcmp(key, "data_offsets")) {
            if ((rc = hyst__expect(j, '['))) return rc;
            if ((rc = hyst__uint(j, &t->begin))) return rc;
            if ((rc = hyst__expect(j, ','))) return rc;
            if ((rc = hyst__uint(j, &t->end))) return rc;
            if ((rc = hyst__expect(j, ']'))) return rc;
            have_offsets = 1;
        } else {
            if ((rc = hyst__skip(j, 1))) return rc;
        }
        field[0] = 0;
        hyst__ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if ((rc = hyst__expect(j, '}'))) return rc;
        break;
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return hyst__fail(j->f, HYST_ERR_FORMAT, "tensor '%s': entry lacks %s", t->name,
                          !have_dtype   ? "dtype"
                          : !have_shape ? "shape"
                                        : "data_offsets");
    return HYST_OK;
}

// hyst__tensor_entry, its JSON errors ("header JSON: expected ...") told as "tensor 'NAME': FIELD: expected ..."
// (FIELD: the key whose value was being read; none between values).
static int hyst__tensor(hyst__json* j, hyst_tensor* t) {
    char field[32] = "";
    const int rc = hyst__tensor_entry(j, t, field);
    static const char tag[] = "header JSON: ";
    if (rc && !strncmp(j->f->error, tag, sizeof tag - 1)) {
        char reason[sizeof j->f->error];
        strcpy(reason, j->f->error + sizeof tag - 1);
        hyst__fail(j->f, rc, "tensor '%s': %s%s%s", t->name, field, field[0] ? ": " : "", reason);
    }
    return rc;
}

static int hyst__cmp_begin(const void* a, const void* b) {
    const hyst_tensor* x = *(const hyst_tensor* const*)a;
    const hyst_tensor* y = *(const hyst_tensor* const*)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

int hyst_parse(hyst_file* f, const void* bytes, uint64_t n_bytes) {
    f->n_tensors = 0;
    f->error[0] = 0;
    const unsigned char* b = (const unsigned char*)bytes;
    if (n_bytes < 8)
        return hyst__fail(f, HYST_ERR_FORMAT, "file of %llu bytes is too short for a safetensors header",
                          (unsigned long long)n_bytes);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    if (n > n_bytes - 8)
        return hyst__fail(f, HYST_ERR_FORMAT, "header length %llu runs past the end of the file (%llu bytes)",
                          (unsigned long long)n, (unsigned long long)n_bytes);
    if (n > HYST_MAX_HEADER_BYTES)
        return hyst__fail(f, HYST_ERR_FORMAT, "header length %llu exceeds the %u-byte limit", (unsigned long long)n,
                          HYST_MAX_HEADER_BYTES);
    if (n < 2) return hyst__fail(f, HYST_ERR_FORMAT, "header length %llu is too small", (unsigned long long)n);
    f->header_bytes = n;
    f->data_bytes = n_bytes - 8 - n;
    const unsigned char* data = b + 8 + n;

    hyst__json j = {(const char*)b + 8, (const char*)b + 8 + n, f};
    int rc;
    if ((rc = hyst__expect(&j, '{'))) return rc;
    hyst__ws(&j);
    if (j.p < j.end && *j.p == '}') {
        j.p++;
    } else {
        while (1) {
            char name[HYST_MAX_NAME];
            if ((rc = hyst__string(&j, name, sizeof name))) return rc;
            if ((rc = hyst__expect(&j, ':'))) return rc;
            if (!strcmp(name, "__metadata__")) {
                if ((rc = hyst__skip(&j, 1))) return rc;
            } else {
                if (f->n_tensors == HYST_MAX_TENSORS)
                    return hyst__fail(f, HYST_ERR_CAPACITY, "more than %d tensors in one file", HYST_MAX_TENSORS);
                hyst_tensor* t = &f->tensors[f->n_tensors];
                memset(t, 0, sizeof *t);
                memcpy(t->name, name, sizeof name);
                if ((rc = hyst__tensor(&j, t))) return rc;
                f->n_tensors++;
            }
            hyst__ws(&j);
            if (j.p < j.end && *j.p == ',') {
                j.p++;
                continue;
            }
            if ((rc = hyst__expect(&j, '}'))) return rc;
            break;
        }
    }
    hyst__ws(&j);
    if (j.p != j.end) return hyst__fail(f, HYST_ERR_FORMAT, "header JSON: trailing bytes after the object");

    // Per-tensor consistency.
    for (int i = 0; i < f->n_tensors; i++) {
        hyst_tensor* t = &f->tensors[i];
        if (t->end < t->begin)
            return hyst__fail(f, HYST_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] are reversed", t->name,
                              (unsigned long long)t->begin, (unsigned long long)t->end);
        if (t->end > f->data_bytes)
            return hyst__fail(f, HYST_ERR_FORMAT,
                              "tensor '%s': data_offsets end %llu lies past the data area (%llu bytes)", t->name,
                              (unsigned long long)t->end, (unsigned long long)f->data_bytes);
        uint64_t count = 1;
        for (int d = 0; d < t->n_dims; d++) {
            uint64_t s = (uint64_t)t->shape[d];
            if (s != 0 && count > (UINT64_C(1) << 62) / s)
                return hyst__fail(f, HYST_ERR_FORMAT, "tensor '%s': shape product overflows", t->name);
            count *= s;
        }
        uint64_t want = count * hyst_dtype_size(t->dtype);
        if (want != t->end - t->begin)
            return hyst__fail(
                f, HYST_ERR_FORMAT, "tensor '%s': shape needs %llu bytes of %s but data_offsets span %llu", t->name,
                (unsigned long long)want, hyst_dtype_name(t->dtype), (unsigned long long)(t->end - t->begin));
        t->data = data + t->begin;
        for (int k = 0; k < i; k++)
            if (!strcmp(f->tensors[k].name, t->name))
                return hyst__fail(f, HYST_ERR_FORMAT, "tensor '%s' appears twice in the header", t->name);
    }
    // No two non-empty ranges overlap: sort pointers by begin and compare neighbours.
    if (f->n_tensors > 1) {
        const hyst_tensor** order = f->order;
        int m = 0;
        for (int i = 0; i < f->n_tensors; i++)
            if (f->tensors[i].end > f->tensors[i].begin) order[m++] = &f->tensors[i];
        qsort(order, (size_t)m, sizeof(const hyst_tensor*), hyst__cmp_begin);
        for (int i = 1; i < m; i++)
            if (order[i]->begin < order[i - 1]->end)
                return hyst__fail(f, HYST_ERR_FORMAT, "tensors '%s' and '%s' have overlapping data ranges",
                                  order[i - 1]->name, order[i]->name);
    }
    // The data area ends with the last tensor's data, as Hugging Face's reader requires ("file not fully covered"):
    // bytes past it are a damaged file or two files joined.
    uint64_t last_end = 0;
    for (int i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].end > last_end) last_end = f->tensors[i].end;
    if (last_end != f->data_bytes)
        return hyst__fail(f, HYST_ERR_FORMAT,
                          "%llu byte%s follow%s the last tensor's data (the data area holds %llu, the tensors end at "
                          "%llu): a damaged file, or two joined",
                          (unsigned long long)(f->data_bytes - last_end), f->data_bytes - last_end == 1 ? "" : "s",
                          f->data_bytes - last_end == 1 ? "s" : "", (unsigned long long)f->data_bytes,
                          (unsigned long long)last_end);
    return HYST_OK;
}

int hyst_open(hyst_file* f, const char* path) {
    f->map = NULL;
    f->map_bytes = 0;
    f->n_tensors = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // (a FIFO would block the open until a writer came)
    if (fd < 0) return hyst__fail(f, HYST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return hyst__fail(f, HYST_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return hyst__fail(f, HYST_ERR_IO, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    void* map = NULL;
    if (size > 0) {
        map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return hyst__fail(f, HYST_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
    }
    close(fd);
    static const char empty[1] = {0};
    int rc = hyst_parse(f, map ? map : empty, size);
    if (rc != HYST_OK) {
        char reason[sizeof f->error - 64];
        memcpy(reason, f->error, sizeof reason);
        reason[sizeof reason - 1] = 0;
        snprintf(f->error, sizeof f->error, "%.60s: %s", path, reason);
        if (map) munmap(map, (size_t)size);
        f->n_tensors = 0;
        return rc;
    }
    f->map = map;
    f->map_bytes = size;
    return HYST_OK;
}

void hyst_close(hyst_file* f) {
    if (f->map) munmap(f->map, (size_t)f->map_bytes);
    f->map = NULL;
    f->map_bytes = 0;
    f->n_tensors = 0;
}

const hyst_tensor* hyst_find(const hyst_file* f, const char* name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}
#endif  // HYST_IMPLEMENTATION
