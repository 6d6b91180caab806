// engine.cpp: engine.h (the C API) over model/ (Model, Tokenizer, Sampler). Every entry point catches hy::Error
// and std::exception and turns them into an hy_status plus the thread-local hy_last_error() message.
#include "engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/chat.h"
#include "model/common.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

namespace fs = std::filesystem;
using hy::Error;
using hy::Status;

struct hy_model {
    std::unique_ptr<hy::Model> model;
    std::unique_ptr<hy::Tokenizer> tok;
    std::vector<int32_t> eos;        // the end-of-sequence set, sorted, unique
    std::vector<int32_t> holes;      // ids in [0, n_vocab) the tokenizer does not assign (never sampled)
    std::vector<uint8_t> slot_used;  // [n_slots]
    int n_vocab = 0;                 // sampleable ids
    int n_logits = 0;                // logits row length
    uint64_t fingerprint = 0;
    hy::GenerationDefaults generation;  // generation_config.json's sampling fields
    std::unique_ptr<hy::ChatTemplate> chat;  // made on first use (throws unsupported without ChatML tokens)
    const hy::ChatTemplate& chat_template() {
        if (!chat) chat = std::make_unique<hy::ChatTemplate>(hy::ChatTemplate::for_tokenizer(*tok));
        return *chat;
    }
};

struct hy_context {
    hy_model* m = nullptr;
    int slot = 0;
    std::vector<int32_t> history;  // every id of the sequence; the last n_pending are not yet fed
    int n_pending = 0;
    std::vector<float> logits;     // [n_logits] the last fed token's row
    bool has_logits = false;
    std::vector<int32_t> feed;     // scratch for pending + new ids
};

struct hy_sampler {
    const hy_model* m = nullptr;
    std::unique_ptr<hy::Sampler> s;
};

namespace {

thread_local std::string g_last_error;

int fail(Status s, const std::string& msg) {
    g_last_error = msg;
    return int(s);
}

// Runs f() and converts exceptions to status codes.
template <class F>
int guard(F&& f) {
    try {
        return f();
    } catch (const Error& e) {
        return fail(e.status(), e.what());
    } catch (const std::bad_alloc&) {
        return fail(Status::out_of_memory, "out of host memory");
    } catch (const std::exception& e) {
        return fail(Status::internal, std::string("internal error: ") + e.what());
    } catch (...) {
        return fail(Status::internal, "internal error: unknown exception");
    }
}

#define HY_CHECK_ARG(cond, msg) \
    do {                        \
        if (!(cond)) return fail(Status::invalid_argument, msg); \
    } while (0)

// FNV-1a, 64 bit.
struct Fnv {
    uint64_t h = 1469598103934665603ull;
    void add(const void* p, size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        for (size_t i = 0; i < n; i++) {
            h ^= b[i];
            h *= 1099511628211ull;
        }
    }
    void add_u64(uint64_t v) { add(&v, sizeof v); }
};

// Adds the size of `path` and up to 64 KiB at its start, middle and end to the hash (missing files add nothing).
void hash_file_samples(Fnv& f, const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) return;
    f.add_u64(size);
    const uint64_t chunk = 64 * 1024;
    std::vector<char> buf(chunk);
    for (uint64_t at : {uint64_t(0), size / 2, size > chunk ? size - chunk : 0}) {
        in.clear();
        in.seekg(std::streamoff(at));
        in.read(buf.data(), std::streamsize(std::min(chunk, size - std::min(at, size))));
        f.add(buf.data(), size_t(in.gcount()));
    }
}

uint64_t fingerprint_folder(const std::string& dir) {
    Fnv f;
    std::vector<fs::path> files = {fs::path(dir) / "config.json", fs::path(dir) / "tokenizer.json"};
    std::vector<fs::path> shards;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".safetensors" && e.path().filename().string().rfind("model", 0) == 0)
            shards.push_back(e.path());
    std::sort(shards.begin(), shards.end());
    files.insert(files.end(), shards.begin(), shards.end());
    for (const auto& p : files) {
        const std::string name = p.filename().string();
        f.add(name.data(), name.size());
        hash_file_samples(f, p);
    }
    return f.h;
}

hy::SamplerParams to_core(const hy_sampler_params& p) {
    hy::SamplerParams s;
    s.temperature = p.temperature;
    s.top_k = p.top_k;
    s.top_p = p.top_p;
    s.min_p = p.min_p;
    s.repeat_penalty = p.repeat_penalty;
    s.repeat_last_n = p.repeat_last_n;
    s.presence_penalty = p.presence_penalty;
    s.frequency_penalty = p.frequency_penalty;
    s.seed = p.seed;
    return s;
}

// Feeds the pending ids plus `ids` to the model; on success the context has logits. Throws hy::Error.
void feed(hy_context* c, const int32_t* ids, int n) {
    hy::Model& model = *c->m->model;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->m->n_logits)
            throw Error(Status::invalid_argument, "token id " + std::to_string(ids[i]) + " is outside [0, " +
                                                      std::to_string(c->m->n_logits) + ")");
    const int len = model.seq_len(c->slot);
    const int total = c->n_pending + n;
    if (total == 0) return;
    if (int64_t(len) + total > model.n_ctx())
        throw Error(Status::context_full, "the sequence would hold " + std::to_string(int64_t(len) + total) +
                                              " tokens; the context length is " + std::to_string(model.n_ctx()));
    std::span<const int32_t> run;
    if (c->n_pending == 0) {
        run = std::span<const int32_t>(ids, size_t(n));
    } else {
        c->feed.assign(c->history.end() - c->n_pending, c->history.end());
        c->feed.insert(c->feed.end(), ids, ids + n);
        run = c->feed;
    }
    c->has_logits = false;
    std::span<const float> row;
    try {
        row = model.prefill(c->slot, run, false);
    } catch (...) {
        // the slot may hold part of the run: drop the whole sequence so history and state agree
        model.reset(c->slot);
        c->history.clear();
        c->n_pending = 0;
        throw;
    }
    c->history.insert(c->history.end(), ids, ids + n);
    c->n_pending = 0;
    std::copy(row.end() - c->m->n_logits, row.end(), c->logits.begin());
    c->has_logits = true;
}

// Feeds the one pending id and returns the backend's greedy pick of the next id over the tokenizer's ids
// (Model::step_greedy): the logits stay on the backend (Model::last_logits() fetches them). Throws hy::Error.
hy::TokenPick feed_pick(hy_context* c) {
    hy::Model& model = *c->m->model;
    if (c->n_pending != 1) throw Error(Status::internal, "feed_pick: expected one pending id");
    int32_t id = c->history.back();
    hy::SeqRun run{c->slot, model.seq_len(c->slot), 0, 1};
    const hy::BatchDesc b{1, &id, &run, 1};
    const int32_t row = 0;
    c->has_logits = false;
    hy::TokenPick pick;
    try {
        pick = model.step_greedy(b, std::span<const int32_t>(&row, 1), c->m->n_vocab)[0];
    } catch (...) {
        model.reset(c->slot);
        c->history.clear();
        c->n_pending = 0;
        throw;
    }
    c->n_pending = 0;
    return pick;
}

// Copies the last step's logits row from the backend into the context.
void fetch_logits(hy_context* c) {
    auto l = c->m->model->last_logits();
    std::copy(l.end() - c->m->n_logits, l.end(), c->logits.begin());
    c->has_logits = true;
}

// ---- snapshot container ----
//   char magic[8] "HYCTX01\0"; u32 version (2); u32 flags (bit 0: logits present); u64 fingerprint;
//   u32 n_history; u32 n_pending; i32 history[n_history]; [u32 n_logits; f32 logits[n_logits]];
//   u64 n_state; u8 state[n_state] (Model::save_state of the slot); u64 checksum (snapshot_checksum of all the
//   bytes before it). Version 1 is the same without the checksum, and is still read.
constexpr char kMagic[8] = {'H', 'Y', 'C', 'T', 'X', '0', '1', '\0'};
constexpr uint32_t kVersion = 2;

// FNV-1a over 8-byte little-endian words (then the tail bytes): catches a changed byte anywhere, at memory speed.
uint64_t snapshot_checksum(const uint8_t* p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n);
}

template <class T>
void put(std::vector<uint8_t>& out, const T& v) {
    put_bytes(out, &v, sizeof(T));
}

std::vector<uint8_t> serialize(const hy_context* c) {
    std::vector<uint8_t> state = c->m->model->save_state(c->slot);
    std::vector<uint8_t> out;
    out.reserve(64 + c->history.size() * 4 + c->logits.size() * 4 + state.size());
    put_bytes(out, kMagic, 8);
    put(out, kVersion);
    put(out, uint32_t(c->has_logits ? 1 : 0));
    put(out, c->m->fingerprint);
    put(out, uint32_t(c->history.size()));
    put(out, uint32_t(c->n_pending));
    put_bytes(out, c->history.data(), c->history.size() * 4);
    if (c->has_logits) {
        put(out, uint32_t(c->logits.size()));
        put_bytes(out, c->logits.data(), c->logits.size() * 4);
    }
    put(out, uint64_t(state.size()));
    put_bytes(out, state.data(), state.size());
    put(out, snapshot_checksum(out.data(), out.size()));
    return out;
}

struct Reader {
    const uint8_t* p;
    size_t n, pos = 0;
    template <class T>
    T get() {
        if (n - pos < sizeof(T)) throw Error(Status::format, "snapshot is truncated");
        T v;
        std::memcpy(&v, p + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }
};

// Checks magic and version (the first 12 bytes); throws hy::Error.
void check_snapshot_header(const uint8_t* data, size_t n) {
    Reader r{data, n};
    if (n >= 8 && std::memcmp(data, "HYCHAT01", 8) == 0)  // (hybrid -i's /save: a chat file around a snapshot)
        throw Error(Status::format, "a conversation file of hybrid -i (/save), not a context snapshot: /load it there");
    if (n < 8 || std::memcmp(data, kMagic, 8) != 0) throw Error(Status::format, "not a hybrid snapshot (bad magic)");
    r.pos = 8;
    const uint32_t version = r.get<uint32_t>();
    if (version != kVersion && version != 1)
        throw Error(Status::format, "snapshot version " + std::to_string(version) + " is not supported (1 or " +
                                        std::to_string(kVersion) + ")");
}

// Checks the model fingerprint (bytes 16-23) against this model's; throws hy::Error. A damaged file would fail
// this too, so callers check the checksum first where the file has one.
void check_snapshot_fingerprint(const hy_context* c, const uint8_t* data, size_t n) {
    Reader r{data, n};
    r.pos = 16;
    const uint64_t fp = r.get<uint64_t>();
    if (fp != c->m->fingerprint) {
        char msg[160];
        std::snprintf(msg, sizeof msg, "snapshot was saved from another model (fingerprint %016llx, this model %016llx)",
                      (unsigned long long)fp, (unsigned long long)c->m->fingerprint);
        throw Error(Status::model_mismatch, msg);
    }
}

// Walks the layout of a snapshot of n bytes (after check_snapshot_header) without using its contents: a file cut
// short is "truncated" (and not "damaged" by the checksum, which it would also fail); one with bytes after the
// layout is refused too.
void check_snapshot_layout(const uint8_t* data, size_t n, uint32_t version) {
    Reader r{data, n};
    r.pos = 12;
    const uint32_t flags = r.get<uint32_t>();
    r.pos = 24;
    const uint64_t n_hist = r.get<uint32_t>();
    r.get<uint32_t>();  // n_pending
    auto skip = [&](uint64_t bytes) {
        if (bytes > n - r.pos) throw Error(Status::format, "snapshot is truncated");
        r.pos += size_t(bytes);
    };
    skip(4 * n_hist);
    if (flags & 1u) skip(4 * uint64_t(r.get<uint32_t>()));
    skip(r.get<uint64_t>());
    if (version >= 2) skip(8);  // the checksum
    if (r.pos != n) throw Error(Status::format, "snapshot: state block size does not match the file size");
}

void deserialize(hy_context* c, const uint8_t* data, size_t n) {
    check_snapshot_header(data, n);
    uint32_t version = 0;
    std::memcpy(&version, data + 8, 4);
    check_snapshot_layout(data, n, version);
    if (version >= 2) {  // the checksum trailer: a damaged snapshot is refused before anything is read from it
        uint64_t stored = 0;
        std::memcpy(&stored, data + n - 8, 8);
        n -= 8;
        if (snapshot_checksum(data, n) != stored)
            throw Error(Status::format, "snapshot is damaged (its checksum does not match its contents)");
    }
    check_snapshot_fingerprint(c, data, n);  // (after the checksum: a damaged fingerprint is damage, not a model)
    Reader r{data, n};
    r.pos = 12;
    const uint32_t flags = r.get<uint32_t>();
    r.get<uint64_t>();  // fingerprint
    const uint32_t n_hist = r.get<uint32_t>();
    const uint32_t n_pending = r.get<uint32_t>();
    if (n_pending > n_hist) throw Error(Status::format, "snapshot: pending ids exceed the history");
    if (uint64_t(n_hist) * 4 > n - r.pos) throw Error(Status::format, "snapshot is truncated");
    std::vector<int32_t> hist(n_hist);
    for (auto& id : hist) {
        id = r.get<int32_t>();
        if (id < 0 || id >= c->m->n_logits) throw Error(Status::format, "snapshot: token id out of range");
    }
    if (int64_t(n_hist) - int64_t(n_pending) > c->m->model->n_ctx())
        throw Error(Status::context_full, "snapshot holds " + std::to_string(n_hist) + " tokens; the context length is " +
                                              std::to_string(c->m->model->n_ctx()));
    const bool has_logits = flags & 1u;
    if (has_logits) {
        const uint32_t nl = r.get<uint32_t>();
        if (nl != uint32_t(c->m->n_logits)) throw Error(Status::model_mismatch, "snapshot logits row has another size");
        if (uint64_t(nl) * 4 > n - r.pos) throw Error(Status::format, "snapshot is truncated");
        std::memcpy(c->logits.data(), data + r.pos, size_t(nl) * 4);
        r.pos += size_t(nl) * 4;
    }
    const uint64_t n_state = r.get<uint64_t>();
    if (n_state != n - r.pos) throw Error(Status::format, "snapshot: state block size does not match the file size");
    c->m->model->load_state(c->slot, std::span<const uint8_t>(data + r.pos, size_t(n_state)));
    if (c->m->model->seq_len(c->slot) != int(n_hist - n_pending))
        throw Error(Status::format, "snapshot: history length does not match the state");
    c->history = std::move(hist);
    c->n_pending = int(n_pending);
    c->has_logits = has_logits;
}

// The largest snapshot serialize() can make for a context of this model: the fixed header, n_ctx + 1 history ids
// (the sequence plus one pending id), a logits row and the slot's state block (Model::save_state: a small header
// plus at most the slot's share of the state arena).
size_t max_snapshot_bytes(const hy_context* c) {
    const hy::Model& model = *c->m->model;
    return 32 + 4 * (size_t(model.n_ctx()) + 1) + 4 + 4 * size_t(c->m->n_logits) + 8 + 8 +
           model.state_bytes() / size_t(std::max(model.n_slots(), 1)) + 4096;
}

// Checks the fixed header of a snapshot: magic and version; the model fingerprint; throws hy::Error.
void check_snapshot_header(const uint8_t* data, size_t n);
void check_snapshot_fingerprint(const hy_context* c, const uint8_t* data, size_t n);

std::string errno_text(int e) { return std::strerror(e); }

// What a non-regular file is, for messages.
const char* file_kind(mode_t m) {
    if (S_ISLNK(m)) return "a symbolic link";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

// Writes `data` to `path` atomically: a new file PATH.XXXXXX (created with O_EXCL, so no other file is touched)
// in the same folder, fsync, then a link (overwrite == 0: fails if PATH exists, without a race) or a rename onto
// PATH. An existing PATH that is not a regular file (symbolic link, device, directory, FIFO) is never replaced.
// Throws hy::Error(io).
void write_file_atomic(const std::string& path, const void* data, size_t n, bool overwrite) {
    struct stat st;
    mode_t keep_mode = 0;  // an overwritten file keeps its permissions
    if (lstat(path.c_str(), &st) == 0) {
        if (!S_ISREG(st.st_mode))
            throw Error(Status::io, path + ": is " + std::string(file_kind(st.st_mode)) + ", not a regular file (not replaced)");
        if (!overwrite) throw Error(Status::io, path + ": exists (not overwritten)");
        keep_mode = st.st_mode & 07777;
    }
    std::string tmp;
    int fd = -1;
    static thread_local uint64_t counter = 0;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        const uint64_t r = (uint64_t(::getpid()) << 32) ^ uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                           (++counter * 0x9E3779B97F4A7C15ull);
        char suffix[16];
        std::snprintf(suffix, sizeof suffix, ".%06llx", (unsigned long long)(r & 0xFFFFFFull));
        tmp = path + suffix;
        fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) throw Error(Status::io, path + ": cannot write: " + errno_text(errno));
    }
    if (fd < 0) throw Error(Status::io, path + ": cannot create a temporary file");
    auto fail_io = [&](const std::string& what, int e) {
        if (fd >= 0) ::close(fd);
        ::unlink(tmp.c_str());
        throw Error(Status::io, path + ": " + what + ": " + errno_text(e));
    };
    if (keep_mode != 0) ::fchmod(fd, keep_mode);  // best effort
    const char* p = static_cast<const char*>(data);
    size_t left = n;
    while (left > 0) {
        const ssize_t w = ::write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            fail_io("write failed", errno);
        }
        p += w;
        left -= size_t(w);
    }
    if (::fsync(fd) != 0 && errno != EINVAL) fail_io("write failed", errno);
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail_io("write failed", errno);
    if (!overwrite) {
        if (::link(tmp.c_str(), path.c_str()) == 0) {
            ::unlink(tmp.c_str());
        } else if (errno == EEXIST) {
            ::unlink(tmp.c_str());
            throw Error(Status::io, path + ": exists (not overwritten)");
        } else if (errno == EPERM || errno == EOPNOTSUPP || errno == ENOSYS || errno == EMLINK) {
            // no hard links on this filesystem: check again, then rename
            if (lstat(path.c_str(), &st) == 0) {
                ::unlink(tmp.c_str());
                throw Error(Status::io, path + ": exists (not overwritten)");
            }
            if (::rename(tmp.c_str(), path.c_str()) != 0) fail_io("cannot rename the temporary file", errno);
        } else {
            fail_io("cannot create", errno);
        }
    } else {
        if (lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
            ::unlink(tmp.c_str());
            throw Error(Status::io, path + ": is " + std::string(file_kind(st.st_mode)) + ", not a regular file (not replaced)");
        }
        if (::rename(tmp.c_str(), path.c_str()) != 0) fail_io("cannot rename the temporary file", errno);
    }
    // make the new name durable too (best effort)
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

// Reads a snapshot file: a regular file whose fixed header is checked before the rest is read, and whose size is
// at most max_snapshot_bytes(c). Throws hy::Error (io, format, model_mismatch) naming the path.
std::vector<uint8_t> read_snapshot_file(const hy_context* c, const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) throw Error(Status::io, path + ": cannot open: " + errno_text(errno));
    if (!S_ISREG(st.st_mode))
        throw Error(Status::io, path + ": is " + std::string(file_kind(st.st_mode)) + ", not a regular file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Error(Status::io, path + ": cannot open: " + errno_text(errno));
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw Error(Status::io, path + ": not a regular file");
    const uint64_t size = uint64_t(st.st_size);
    auto read_at_most = [&](uint8_t* dst, size_t n) {
        size_t got = 0;
        while (got < n) {
            const ssize_t r = ::read(fd, dst + got, n - got);
            if (r < 0) {
                if (errno == EINTR) continue;
                throw Error(Status::io, path + ": read failed: " + errno_text(errno));
            }
            if (r == 0) break;
            got += size_t(r);
        }
        return got;
    };
    uint8_t head[32];
    const size_t nh = read_at_most(head, sizeof head);
    try {
        check_snapshot_header(head, nh);
        const size_t cap = max_snapshot_bytes(c);
        if (size > cap) {
            check_snapshot_fingerprint(c, head, nh);  // (too big for this model: most likely another model's)
            throw Error(Status::format, "snapshot file has " + std::to_string(size) +
                                            " bytes, more than any snapshot of this model (at most " +
                                            std::to_string(cap) + ")");
        }
    } catch (const Error& e) {
        throw Error(e.status(), path + ": " + e.what());
    }
    std::vector<uint8_t> data(size_t(size) + 1);
    std::memcpy(data.data(), head, nh);
    const size_t got = nh + read_at_most(data.data() + nh, data.size() - nh);
    data.resize(got);
    return data;
}

void context_clear(hy_context* c) {
    c->m->model->reset(c->slot);
    c->history.clear();
    c->n_pending = 0;
    c->has_logits = false;
}

}  // namespace

extern "C" {

const char* hy_last_error(void) { return g_last_error.c_str(); }

const char* hy_status_name(int status) {
    if (status < 0 || status > int(Status::internal)) return "unknown";
    return hy::status_name(Status(status));
}

const char* hy_version(void) {
#ifdef HY_VERSION
    return HY_VERSION;
#else
    return "0.0.0";
#endif
}

// ---- model ----
hy_model_params hy_model_default_params(void) {
    hy_model_params p;
    p.device = HY_DEVICE_AUTO;
    p.n_threads = 0;
    p.n_ctx = 4096;
    p.n_slots = 1;
    p.max_batch_tokens = 512;
    p.cuda_graphs = 1;
    return p;
}

int hy_model_load(const char* dir, const hy_model_params* params, hy_model** out) {
    return guard([&] {
        HY_CHECK_ARG(dir && out, "hy_model_load: dir and out must not be NULL");
        const hy_model_params p = params ? *params : hy_model_default_params();
        HY_CHECK_ARG(p.n_ctx > 0, "n_ctx must be > 0, got " + std::to_string(p.n_ctx));
        HY_CHECK_ARG(p.n_slots > 0, "n_slots must be > 0, got " + std::to_string(p.n_slots));
        HY_CHECK_ARG(p.max_batch_tokens > 0, "max_batch_tokens must be > 0, got " + std::to_string(p.max_batch_tokens));
        HY_CHECK_ARG(p.device == HY_DEVICE_AUTO || p.device == HY_DEVICE_CPU || p.device == HY_DEVICE_CUDA,
                     "unknown device " + std::to_string(int(p.device)));
        std::error_code ec;
        if (!*dir) return fail(Status::io, "the model folder path is empty");
        // (before the tokenizer is read; Model::load words the same checks for its other callers)
        if (!fs::exists(dir, ec)) return fail(Status::io, std::string(dir) + ": no such model folder");
        if (!fs::is_directory(dir, ec)) return fail(Status::io, std::string(dir) + ": not a folder");
        hy::ModelParams mp;
        mp.device = p.device == HY_DEVICE_CPU    ? hy::Device::cpu
                    : p.device == HY_DEVICE_CUDA ? hy::Device::cuda
                                                 : hy::Device::auto_select;
        mp.n_threads = p.n_threads;
        mp.n_ctx = p.n_ctx;
        mp.n_slots = p.n_slots;
        mp.max_batch_tokens = p.max_batch_tokens;
        mp.cuda.graphs = p.cuda_graphs != 0;
        auto m = std::make_unique<hy_model>();
        m->tok = std::make_unique<hy::Tokenizer>(hy::Tokenizer::from_folder(dir));
        m->generation = hy::load_generation_defaults(dir);
        m->model = hy::Model::load(dir, mp);
        m->n_logits = m->model->config().vocab_size;
        // A token the model cannot embed would fail only when a prompt or an answer uses it: refuse the pair now.
        const std::string vocab_range = "outside the model's vocabulary [0, " + std::to_string(m->n_logits) +
                                        ") (config.json vocab_size)";
        for (int32_t id = m->n_logits; id < m->tok->n_vocab(); id++)
            if (m->tok->is_valid(id))
                return fail(Status::format, std::string(dir) + "/tokenizer.json: token '" +
                                                std::string(m->tok->token_string(id)) + "' has id " + std::to_string(id) +
                                                ", " + vocab_range);
        for (int32_t id : m->tok->eos_ids())
            if (id >= m->n_logits)
                return fail(Status::format, std::string(dir) + ": end-of-sequence id " + std::to_string(id) +
                                                " (tokenizer_config.json / generation_config.json) is " + vocab_range);
        m->n_vocab = std::min(m->tok->n_vocab(), m->n_logits);
        for (int32_t id = 0; id < m->n_vocab; id++)
            if (!m->tok->is_valid(id)) m->holes.push_back(id);
        for (int id : m->model->config().eos_token_ids) m->eos.push_back(id);
        for (int32_t id : m->tok->eos_ids()) m->eos.push_back(id);
        std::sort(m->eos.begin(), m->eos.end());
        m->eos.erase(std::unique(m->eos.begin(), m->eos.end()), m->eos.end());
        m->slot_used.assign(size_t(p.n_slots), 0);
        m->fingerprint = fingerprint_folder(dir);
        *out = m.release();
        return int(Status::ok);
    });
}

void hy_model_free(hy_model* model) { delete model; }

int hy_model_n_vocab(const hy_model* m) { return m ? m->n_vocab : 0; }
int hy_model_n_logits(const hy_model* m) { return m ? m->n_logits : 0; }
int hy_model_n_ctx(const hy_model* m) { return m ? m->model->n_ctx() : 0; }
int hy_model_n_ctx_train(const hy_model* m) { return m ? m->model->config().max_position_embeddings : 0; }
const char* hy_model_backend(const hy_model* m) { return m ? m->model->backend().name() : ""; }
size_t hy_model_arena_bytes(const hy_model* m) { return m ? m->model->arena_bytes() : 0; }
uint64_t hy_model_fingerprint(const hy_model* m) { return m ? m->fingerprint : 0; }

int hy_model_eos_ids(const hy_model* m, int32_t* out, int cap) {
    if (!m) return 0;
    for (int i = 0; i < cap && i < int(m->eos.size()) && out; i++) out[i] = m->eos[size_t(i)];
    return int(m->eos.size());
}

int hy_model_is_eos(const hy_model* m, int32_t id) {
    return m && std::binary_search(m->eos.begin(), m->eos.end(), id) ? 1 : 0;
}

// ---- tokenizer ----
int hy_tokenize(const hy_model* m, const char* text, ptrdiff_t len, int parse_special, int32_t* out, int cap,
                int* n_out) {
    return guard([&] {
        HY_CHECK_ARG(m && n_out && (text || len == 0), "hy_tokenize: model, text and n_out must not be NULL");
        const size_t n = len < 0 ? std::strlen(text) : size_t(len);
        std::vector<int32_t> ids = m->tok->encode(std::string_view(text ? text : "", n), parse_special != 0);
        *n_out = int(ids.size());
        if (int(ids.size()) > cap || (!out && !ids.empty()))
            return fail(Status::invalid_argument, "hy_tokenize: the text has " + std::to_string(ids.size()) + " tokens, " +
                                                      (out ? "the buffer holds " + std::to_string(std::max(cap, 0))
                                                           : std::string("out is NULL")));
        std::copy(ids.begin(), ids.end(), out);
        return int(Status::ok);
    });
}

int hy_detokenize(const hy_model* m, const int32_t* ids, int n_ids, int skip_special, char* buf, size_t cap,
                  size_t* n_out) {
    return guard([&] {
        HY_CHECK_ARG(m && n_out, "hy_detokenize: the model and n_out must not be NULL");
        HY_CHECK_ARG(n_ids >= 0 && (ids || n_ids == 0),
                     "hy_detokenize: ids is NULL or n_ids negative (n_ids = " + std::to_string(n_ids) + ")");
        const std::string s = m->tok->decode(std::span<const int32_t>(ids, size_t(n_ids)), skip_special != 0);
        *n_out = s.size();
        if (!buf || cap <= s.size())
            return fail(Status::invalid_argument, "hy_detokenize: the text needs " + std::to_string(s.size() + 1) +
                                                      " bytes, " +
                                                      (buf ? "the buffer holds " + std::to_string(cap) : "buf is NULL"));
        std::memcpy(buf, s.data(), s.size());
        buf[s.size()] = '\0';
        return int(Status::ok);
    });
}

// ---- chat ----
namespace {

int chat_text(const hy_model* cm, const hy_chat_message* msgs, int n, int add_gen, int thinking, bool continuation,
              char* buf, size_t cap, size_t* n_out) {
    return guard([&] {
        const std::string fn = continuation ? "hy_chat_continue" : "hy_chat_render";
        HY_CHECK_ARG(cm && n_out, fn + ": the model and n_out must not be NULL");
        HY_CHECK_ARG(n >= 0 && (msgs || n == 0), fn + ": msgs is NULL or n negative (n = " + std::to_string(n) + ")");
        HY_CHECK_ARG(thinking >= HY_THINK_DISABLED && thinking <= HY_THINK_MODEL_DECIDES,
                     "unknown thinking mode " + std::to_string(thinking));
        hy_model* m = const_cast<hy_model*>(cm);  // the template is built lazily
        std::vector<hy::ChatMessage> v(static_cast<size_t>(n));
        for (int i = 0; i < n; i++) {
            HY_CHECK_ARG(msgs[i].role && msgs[i].content, "chat message " + std::to_string(i) + ": NULL role or content");
            v[size_t(i)].role = msgs[i].role;
            v[size_t(i)].content = msgs[i].content;
        }
        hy::ChatOptions o;
        o.add_generation_prompt = add_gen != 0;
        o.thinking = thinking == HY_THINK_ENABLED    ? hy::Thinking::enabled
                     : thinking == HY_THINK_DISABLED ? hy::Thinking::disabled
                                                     : hy::Thinking::model_decides;
        const hy::ChatTemplate& t = m->chat_template();
        const std::string s = continuation ? t.render_continuation(v, false, o) : t.render(v, o);
        *n_out = s.size();
        if (!buf || cap <= s.size())
            return fail(Status::invalid_argument, fn + ": the text needs " + std::to_string(s.size() + 1) + " bytes, " +
                                                      (buf ? "the buffer holds " + std::to_string(cap) : "buf is NULL"));
        std::memcpy(buf, s.data(), s.size() + 1);
        return int(Status::ok);
    });
}

}  // namespace

int hy_chat_render(const hy_model* m, const hy_chat_message* msgs, int n, int add_generation_prompt, int thinking,
                   char* buf, size_t cap, size_t* n_out) {
    return chat_text(m, msgs, n, add_generation_prompt, thinking, false, buf, cap, n_out);
}

int hy_chat_continue(const hy_model* m, const hy_chat_message* msgs, int n, int thinking, char* buf, size_t cap,
                     size_t* n_out) {
    return chat_text(m, msgs, n, 1, thinking, true, buf, cap, n_out);
}

int32_t hy_chat_end_of_turn_id(const hy_model* cm) {
    if (!cm) return -1;
    try {
        return const_cast<hy_model*>(cm)->chat_template().end_of_turn_id();
    } catch (...) {
        return -1;
    }
}

// ---- contexts ----
hy_context_params hy_context_default_params(void) {
    hy_context_params p;
    p.slot = -1;
    return p;
}

int hy_context_new(hy_model* m, const hy_context_params* params, hy_context** out) {
    return guard([&] {
        HY_CHECK_ARG(m && out, "hy_context_new: model and out must not be NULL");
        const hy_context_params p = params ? *params : hy_context_default_params();
        const int n_slots = int(m->slot_used.size());
        HY_CHECK_ARG(p.slot >= -1, "hy_context_new: slot " + std::to_string(p.slot) + " (-1: the first free one)");
        int slot = -1;
        if (p.slot >= 0) {
            HY_CHECK_ARG(p.slot < n_slots, "hy_context_new: slot " + std::to_string(p.slot) + " is outside [0, " +
                                               std::to_string(n_slots) + ")");
            if (m->slot_used[size_t(p.slot)])
                return fail(Status::context_full, "sequence slot " + std::to_string(p.slot) + " is in use");
            slot = p.slot;
        } else {
            for (int i = 0; i < n_slots && slot < 0; i++)
                if (!m->slot_used[size_t(i)]) slot = i;
            if (slot < 0)
                return fail(Status::context_full, "all " + std::to_string(n_slots) +
                                                      " sequence slots are in use (load the model with more n_slots)");
        }
        auto c = std::make_unique<hy_context>();
        c->m = m;
        c->slot = slot;
        c->logits.assign(size_t(m->n_logits), 0.0f);
        c->history.reserve(size_t(m->model->n_ctx()) + 1);
        m->model->reset(slot);
        m->slot_used[size_t(slot)] = 1;
        *out = c.release();
        return int(Status::ok);
    });
}

void hy_context_free(hy_context* c) {
    if (!c) return;
    c->m->slot_used[size_t(c->slot)] = 0;
    delete c;
}

int hy_context_reset(hy_context* c) {
    return guard([&] {
        HY_CHECK_ARG(c, "hy_context_reset: ctx is NULL");
        context_clear(c);
        return int(Status::ok);
    });
}

int hy_context_n_tokens(const hy_context* c) { return c ? int(c->history.size()) : 0; }

int hy_context_tokens(const hy_context* c, int32_t* out, int cap) {
    if (!c) return 0;
    for (int i = 0; i < cap && i < int(c->history.size()) && out; i++) out[i] = c->history[size_t(i)];
    return int(c->history.size());
}

int hy_prefill(hy_context* c, const int32_t* ids, int n) {
    return guard([&] {
        HY_CHECK_ARG(c && (ids || n == 0) && n >= 0, "hy_prefill: bad arguments");
        feed(c, ids, n);
        return int(Status::ok);
    });
}

int hy_decode(hy_context* c, int32_t id) { return hy_prefill(c, &id, 1); }

int hy_decode_batch(hy_context* const* ctxs, const int32_t* ids, int n) {
    return guard([&] {
        HY_CHECK_ARG(ctxs && ids && n > 0, "hy_decode_batch: bad arguments");
        hy_model* m = ctxs[0] ? ctxs[0]->m : nullptr;
        HY_CHECK_ARG(m, "hy_decode_batch: NULL context");
        hy::Model& model = *m->model;
        HY_CHECK_ARG(n <= model.n_slots() && n <= std::max(model.max_logits(), 1),
                     "hy_decode_batch: " + std::to_string(n) + " contexts, at most " +
                         std::to_string(model.n_slots()) + " per step");
        std::vector<hy::SeqRun> runs(static_cast<size_t>(n));
        std::vector<int32_t> rows(static_cast<size_t>(n));
        for (int i = 0; i < n; i++) {
            hy_context* c = ctxs[i];
            HY_CHECK_ARG(c && c->m == m, "hy_decode_batch: contexts must be non-NULL and of one model");
            HY_CHECK_ARG(c->n_pending == 0, "hy_decode_batch: a context has a pending id (use hy_decode)");
            HY_CHECK_ARG(ids[i] >= 0 && ids[i] < m->n_logits, "token id " + std::to_string(ids[i]) + " is out of range");
            for (int j = 0; j < i; j++)
                HY_CHECK_ARG(ctxs[j] != c, "hy_decode_batch: a context appears twice");
            const int len = model.seq_len(c->slot);
            if (len + 1 > model.n_ctx())
                return fail(Status::context_full, "a sequence is full (" + std::to_string(len) + " tokens)");
            runs[size_t(i)] = hy::SeqRun{int32_t(c->slot), int32_t(len), int32_t(i), 1};
            rows[size_t(i)] = i;
        }
        hy::BatchDesc b;
        b.n_tokens = n;
        b.token_ids = ids;
        b.runs = runs.data();
        b.n_runs = n;
        std::span<const float> out = model.step(b, rows);
        for (int i = 0; i < n; i++) {
            hy_context* c = ctxs[i];
            c->history.push_back(ids[i]);
            std::copy(out.begin() + ptrdiff_t(i) * m->n_logits, out.begin() + ptrdiff_t(i + 1) * m->n_logits,
                      c->logits.begin());
            c->has_logits = true;
        }
        return int(Status::ok);
    });
}

const float* hy_context_logits(const hy_context* c, int* n_logits) {
    if (n_logits) *n_logits = c ? c->m->n_logits : 0;
    return c && c->has_logits ? c->logits.data() : nullptr;
}

// ---- snapshots ----
int hy_state_save(const hy_context* c, void* buf, size_t cap, size_t* n_out) {
    return guard([&] {
        HY_CHECK_ARG(c && n_out, "hy_state_save: ctx and n_out must not be NULL");
        const std::vector<uint8_t> s = serialize(c);
        *n_out = s.size();
        if (!buf) return int(Status::ok);
        if (cap < s.size())
            return fail(Status::invalid_argument, "hy_state_save: the snapshot needs " + std::to_string(s.size()) +
                                                      " bytes, the buffer holds " + std::to_string(cap));
        std::memcpy(buf, s.data(), s.size());
        return int(Status::ok);
    });
}

int hy_state_load(hy_context* c, const void* buf, size_t n) {
    return guard([&] {
        HY_CHECK_ARG(c && buf, "hy_state_load: ctx and buf must not be NULL");
        try {
            deserialize(c, static_cast<const uint8_t*>(buf), n);
        } catch (...) {
            context_clear(c);
            throw;
        }
        return int(Status::ok);
    });
}

int hy_file_write(const char* path, const void* data, size_t n, int overwrite) {
    return guard([&] {
        HY_CHECK_ARG(path && (data || n == 0), "hy_file_write: path and data must not be NULL");
        HY_CHECK_ARG(*path, "hy_file_write: the path is empty");
        write_file_atomic(path, data, n, overwrite != 0);
        return int(Status::ok);
    });
}

int hy_state_save_file(const hy_context* c, const char* path, int overwrite) {
    return guard([&] {
        HY_CHECK_ARG(c && path && *path, "hy_state_save_file: ctx and path must be given");
        const std::vector<uint8_t> s = serialize(c);
        write_file_atomic(path, s.data(), s.size(), overwrite != 0);
        return int(Status::ok);
    });
}

int hy_state_load_file(hy_context* c, const char* path) {
    return guard([&] {
        HY_CHECK_ARG(c && path, "hy_state_load_file: ctx and path must not be NULL");
        HY_CHECK_ARG(*path, "hy_state_load_file: the path is empty");
        std::vector<uint8_t> data;
        bool restoring = false;
        try {
            data = read_snapshot_file(c, path);
            restoring = true;
            deserialize(c, data.data(), data.size());
        } catch (const Error& e) {
            // a file refused before it is read whole (unreadable, its fixed header or its size): the context is left
            // as it was; after that, as hy_state_load
            if (restoring) context_clear(c);
            const std::string msg = e.what();
            throw Error(e.status(), msg.rfind(std::string(path) + ": ", 0) == 0 ? msg : std::string(path) + ": " + msg);
        }
        return int(Status::ok);
    });
}

size_t hy_state_size_max(const hy_context* c) { return c ? max_snapshot_bytes(c) : 0; }

// ---- sampling ----
hy_sampler_params hy_sampler_default_params(void) {
    hy_sampler_params p;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = 0xC0FFEE;
    return p;
}

int hy_model_sampler_defaults(const hy_model* m, hy_sampler_params* out) {
    if (!m || !out) return -1;
    *out = hy_sampler_default_params();
    const hy::GenerationDefaults& g = m->generation;
    int took = 0;
    if (g.do_sample == false) {
        out->temperature = 0.0f;
        took |= HY_SAMPLER_TEMPERATURE;
    } else if (g.temperature) {
        out->temperature = *g.temperature;
        took |= HY_SAMPLER_TEMPERATURE;
    }
    auto take = [&](const auto& value, auto& field, int bit) {
        if (!value) return;
        field = *value;
        took |= bit;
    };
    take(g.top_k, out->top_k, HY_SAMPLER_TOP_K);
    take(g.top_p, out->top_p, HY_SAMPLER_TOP_P);
    take(g.min_p, out->min_p, HY_SAMPLER_MIN_P);
    if (g.repetition_penalty) {
        out->repeat_penalty = *g.repetition_penalty;
        out->repeat_last_n = -1;
        took |= HY_SAMPLER_REPEAT_PENALTY | HY_SAMPLER_REPEAT_LAST_N;
    }
    return took;
}

int hy_sampler_new(const hy_model* m, const hy_sampler_params* params, hy_sampler** out) {
    return guard([&] {
        HY_CHECK_ARG(m && out, "hy_sampler_new: model and out must not be NULL");
        const hy_sampler_params p = params ? *params : hy_sampler_default_params();
        auto s = std::make_unique<hy_sampler>();
        s->m = m;
        s->s = std::make_unique<hy::Sampler>(to_core(p), m->n_logits, m->n_vocab, m->model->n_ctx());
        s->s->set_banned(m->holes);
        *out = s.release();
        return int(Status::ok);
    });
}

void hy_sampler_free(hy_sampler* s) { delete s; }

int hy_sampler_sample(hy_sampler* s, const hy_context* c, int32_t* id, float* logprob) {
    return guard([&] {
        HY_CHECK_ARG(s && c && id, "hy_sampler_sample: sampler, ctx and id must not be NULL");
        HY_CHECK_ARG(c->m == s->m, "hy_sampler_sample: the sampler belongs to another model");
        HY_CHECK_ARG(c->has_logits, "hy_sampler_sample: the context has no logits (prefill first)");
        const int32_t t = s->s->sample(c->logits);
        if (logprob) *logprob = float(hy::log_softmax_at(c->logits, s->m->n_vocab, t));
        *id = t;
        return int(Status::ok);
    });
}

void hy_sampler_accept(hy_sampler* s, int32_t id) {
    if (s) s->s->accept(id);
}

void hy_sampler_reset(hy_sampler* s) {
    if (s) s->s->reset(true);
}

void hy_sampler_clear_history(hy_sampler* s) {
    if (s) s->s->reset(false);
}

void hy_sampler_set_seed(hy_sampler* s, uint64_t seed) {
    if (s) s->s->set_seed(seed);
}

// ---- generation ----
const char* hy_stop_reason_name(int r) {
    switch (r) {
        case HY_STOP_EOS: return "eos";
        case HY_STOP_CANCELLED: return "cancelled";
        case HY_STOP_STRING: return "stop string";
        case HY_STOP_MAX_TOKENS: return "max tokens";
        case HY_STOP_CONTEXT_FULL: return "context full";
        case HY_STOP_CALLBACK: return "callback";
        default: return "none";
    }
}

hy_generate_params hy_generate_default_params(void) {
    hy_generate_params p;
    p.max_tokens = -1;
    p.stop = nullptr;
    p.n_stop = 0;
    p.skip_special = 1;
    p.ignore_eos = 0;
    p.stop_ids = nullptr;
    p.n_stop_ids = 0;
    p.on_token = nullptr;
    p.user_data = nullptr;
    p.should_abort = nullptr;
    return p;
}

int hy_generate(hy_context* c, hy_sampler* s, const int32_t* prompt, int n_prompt, const hy_generate_params* params,
                hy_generate_result* result) {
    using clock = std::chrono::steady_clock;
    hy_generate_result res{};
    if (result) *result = res;
    const int rc = guard([&] {
        HY_CHECK_ARG(c && s && (prompt || n_prompt == 0) && n_prompt >= 0, "hy_generate: bad arguments");
        HY_CHECK_ARG(c->m == s->m, "hy_generate: the sampler belongs to another model");
        const hy_generate_params gp = params ? *params : hy_generate_default_params();
        HY_CHECK_ARG(gp.n_stop >= 0 && (gp.n_stop == 0 || gp.stop), "hy_generate: stop is NULL or n_stop negative");
        HY_CHECK_ARG(gp.n_stop_ids >= 0 && (gp.n_stop_ids == 0 || gp.stop_ids),
                     "hy_generate: stop_ids is NULL or n_stop_ids negative");
        std::vector<std::string> stops;
        for (int i = 0; i < gp.n_stop; i++) {
            HY_CHECK_ARG(gp.stop && gp.stop[i] && gp.stop[i][0], "hy_generate: stop strings must be non-empty");
            stops.emplace_back(gp.stop[i]);
        }
        HY_CHECK_ARG(n_prompt > 0 || c->n_pending > 0 || c->has_logits,
                     "hy_generate: nothing to generate from (empty prompt and no logits)");
        hy::Model& model = *c->m->model;
        const hy::Tokenizer& tok = *c->m->tok;

        // prefill
        const auto t0 = clock::now();
        res.n_prompt = n_prompt + c->n_pending;
        struct AbortHook {  // set for this prefill only
            hy::Model& m;
            ~AbortHook() { m.set_prefill_abort(nullptr, nullptr); }
        };
        try {
            const AbortHook hook{model};
            model.set_prefill_abort(gp.should_abort, gp.user_data);
            feed(c, prompt, n_prompt);  // (resets the sequence when it throws)
        } catch (const hy::Model::Aborted&) {
            res.n_prompt = 0;  // (the sequence was reset: none of it was kept)
            res.prompt_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
            res.stop_reason = HY_STOP_CALLBACK;
            return int(Status::ok);
        }
        const auto t1 = clock::now();
        res.prompt_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();

        hy::StreamDecoder dec(tok, gp.skip_special != 0);
        std::string held;  // decoded text not yet given to the callback
        held.reserve(256);
        hy_token_info info{};
        auto emit = [&](int32_t id, float lp, const std::string& text) -> int {
            info.id = id;
            info.logprob = lp;
            info.text = text.c_str();
            info.text_len = text.size();
            info.index = res.n_generated;
            return gp.on_token ? gp.on_token(&info, gp.user_data) : 0;
        };
        std::string out_text;
        out_text.reserve(256);
        int reason = HY_STOP_NONE;
        // Greedy without penalties: after the prompt, each step's arg max (and its log-probability) is picked on
        // the backend, and only a pick of a banned id (or a failure to pick) brings the logits row to the host.
        const bool pick_on_backend = s->s->plain_greedy();
        hy::TokenPick pick;
        bool have_pick = false, logits_on_backend = false;
        for (;;) {
            if (gp.max_tokens >= 0 && res.n_generated >= gp.max_tokens) {
                reason = HY_STOP_MAX_TOKENS;
                break;
            }
            int32_t id;
            float lp;
            if (have_pick) {
                id = pick.id;
                lp = pick.logprob;
                have_pick = false;
            } else {
                id = s->s->sample(c->logits);
                lp = float(hy::log_softmax_at(c->logits, c->m->n_vocab, id));
            }
            if ((!gp.ignore_eos && std::binary_search(c->m->eos.begin(), c->m->eos.end(), id)) ||
                (gp.stop_ids && std::find(gp.stop_ids, gp.stop_ids + std::max(gp.n_stop_ids, 0), id) !=
                                    gp.stop_ids + std::max(gp.n_stop_ids, 0))) {
                reason = HY_STOP_EOS;
                break;
            }
            held += dec.push(id);
            // stop strings: find the earliest match in the held text
            size_t cut = std::string::npos;
            for (const auto& st : stops) {
                const size_t at = held.find(st);
                if (at != std::string::npos) cut = std::min(cut, at);
            }
            if (cut != std::string::npos) {
                held.resize(cut);
                dec.reset();
                reason = HY_STOP_STRING;
                break;
            }
            // hold back the longest suffix that is a prefix of a stop string
            size_t keep = 0;
            for (const auto& st : stops)
                for (size_t k = std::min(st.size() - 1, held.size()); k > keep; k--)
                    if (held.compare(held.size() - k, k, st, 0, k) == 0) {
                        keep = k;
                        break;
                    }
            out_text.assign(held, 0, held.size() - keep);
            held.erase(0, held.size() - keep);
            s->s->accept(id);  // (kept ids only: the penalty history stays the sequence's, as /load rebuilds it)
            c->history.push_back(id);
            c->n_pending = 1;
            c->has_logits = false;
            const int stop = emit(id, lp, out_text);
            res.n_generated++;
            if (stop) {
                reason = HY_STOP_CALLBACK;
                break;
            }
            if (gp.max_tokens >= 0 && res.n_generated >= gp.max_tokens) {
                reason = HY_STOP_MAX_TOKENS;
                break;
            }
            if (model.seq_len(c->slot) + 1 > model.n_ctx()) {
                reason = HY_STOP_CONTEXT_FULL;
                break;
            }
            res.n_decoded++;
            if (pick_on_backend) {  // runs the pending id
                pick = feed_pick(c);
                logits_on_backend = true;
                have_pick = s->s->pick_stands(pick.id);
                if (!have_pick) {
                    fetch_logits(c);
                    logits_on_backend = false;
                }
            } else {
                feed(c, nullptr, 0);
            }
        }
        // the context keeps the logits of its last fed token, as after feed()
        if (logits_on_backend) fetch_logits(c);
        if (reason != HY_STOP_STRING) held += dec.flush();
        if (!held.empty()) {
            out_text = held;
            emit(-1, 0.0f, out_text);
        }
        res.stop_reason = reason;
        res.generate_ms = std::chrono::duration<double, std::milli>(clock::now() - t1).count();
        return int(Status::ok);
    });
    if (result) *result = res;
    return rc;
}

}  // extern "C"

// ---- batched generation ----
struct hy_batch {
    hy_model* m = nullptr;
    std::vector<int> slots;
    std::unique_ptr<hy::BatchGenerator> gen;
    std::vector<uint8_t> accept_prompt;  // per request
};

hy_request_params hy_request_default_params(void) {
    hy_request_params p;
    p.max_tokens = 128;
    p.sampling = hy_sampler_default_params();
    p.ignore_eos = 0;
    p.accept_prompt = 1;
    p.stop_ids = nullptr;
    p.n_stop_ids = 0;
    return p;
}

int hy_batch_new(hy_model* m, int n_slots, hy_batch** out) {
    return guard([&] {
        HY_CHECK_ARG(m && out, "hy_batch_new: model and out must not be NULL");
        std::vector<int> free_slots;
        for (int i = 0; i < int(m->slot_used.size()); i++)
            if (!m->slot_used[size_t(i)]) free_slots.push_back(i);
        if (n_slots > 0 && int(free_slots.size()) < n_slots)
            return fail(Status::context_full, "hy_batch_new: asked for " + std::to_string(n_slots) + " sequence slots, " +
                                                  std::to_string(free_slots.size()) + " are free (load the model with more n_slots)");
        if (free_slots.empty()) return fail(Status::context_full, "hy_batch_new: every sequence slot is in use");
        if (n_slots > 0) free_slots.resize(size_t(n_slots));
        auto b = std::make_unique<hy_batch>();
        b->m = m;
        b->slots = free_slots;
        b->gen = std::make_unique<hy::BatchGenerator>(*m->model, m->n_vocab, free_slots, m->holes);
        for (int s : free_slots) m->slot_used[size_t(s)] = 1;
        *out = b.release();
        return int(Status::ok);
    });
}

void hy_batch_free(hy_batch* b) {
    if (!b) return;
    for (int s : b->slots) {
        b->m->slot_used[size_t(s)] = 0;
        b->m->model->reset(s);
    }
    delete b;
}

int hy_batch_submit(hy_batch* b, const int32_t* prompt, int n_prompt, const hy_request_params* params, int* id) {
    return guard([&] {
        HY_CHECK_ARG(b && id, "hy_batch_submit: batch and id must not be NULL");
        HY_CHECK_ARG(prompt && n_prompt > 0, "hy_batch_submit: the prompt is empty");
        const hy_request_params p = params ? *params : hy_request_default_params();
        hy::GenerationRequest r;
        r.prompt.assign(prompt, prompt + n_prompt);
        r.max_new_tokens = p.max_tokens;
        r.sampling = to_core(p.sampling);
        r.accept_prompt = p.accept_prompt != 0;
        HY_CHECK_ARG(p.n_stop_ids >= 0 && (p.n_stop_ids == 0 || p.stop_ids),
                     "hy_batch_submit: stop_ids is NULL or n_stop_ids negative");
        if (!p.ignore_eos) r.stop_ids = b->m->eos;
        r.stop_ids.insert(r.stop_ids.end(), p.stop_ids, p.stop_ids + p.n_stop_ids);
        *id = b->gen->submit(std::move(r));
        return int(Status::ok);
    });
}

int hy_batch_step(hy_batch* b, int* n_running) {
    return guard([&] {
        HY_CHECK_ARG(b, "hy_batch_step: batch must not be NULL");
        b->gen->step();
        if (n_running) *n_running = b->gen->n_active() + b->gen->n_queued();
        return int(Status::ok);
    });
}

int hy_batch_cancel(hy_batch* b, int id) {
    return guard([&] {
        HY_CHECK_ARG(b, "hy_batch_cancel: batch must not be NULL");
        b->gen->cancel(id);
        return int(Status::ok);
    });
}

int hy_batch_result(const hy_batch* b, int id, const int32_t** tokens, const float** logprobs, int* n,
                    int* stop_reason, int* done) {
    return guard([&] {
        HY_CHECK_ARG(b, "hy_batch_result: batch must not be NULL");
        const hy::GenerationResult& r = b->gen->result(id);
        if (tokens) *tokens = r.tokens.data();
        if (logprobs) *logprobs = r.logprobs.data();
        if (n) *n = int(r.tokens.size());
        if (done) *done = r.done ? 1 : 0;
        if (stop_reason) {
            switch (r.reason) {
                case hy::FinishReason::none: *stop_reason = HY_STOP_NONE; break;
                case hy::FinishReason::eos: *stop_reason = HY_STOP_EOS; break;
                case hy::FinishReason::max_tokens: *stop_reason = HY_STOP_MAX_TOKENS; break;
                case hy::FinishReason::context_full: *stop_reason = HY_STOP_CONTEXT_FULL; break;
                case hy::FinishReason::cancelled: *stop_reason = HY_STOP_CANCELLED; break;
            }
        }
        return int(Status::ok);
    });
}
