#include "model/snapshot.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>

#include "model/file_io.h"
#include "model/fnv.h"

namespace fs = std::filesystem;

namespace hy {

namespace {

constexpr char kMagic[8] = {'H', 'Y', 'C', 'T', 'X', '0', '1', '\0'};

// Adds the size of `path` and up to 64 KiB at its start, middle and end to the hash (missing files add nothing).
void hash_file_samples(Fnv1a& f, const fs::path& path) {
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

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n);
}

template <class T>
void put(std::vector<uint8_t>& out, const T& v) {
    put_bytes(out, &v, sizeof(T));
}

struct Reader {
    const uint8_t* p;
    size_t n, pos = 0;
    template <class T>
    T get() {
        if (pos > n || n - pos < sizeof(T)) throw Error(Status::format, "snapshot is truncated");  // (pos may jump)
        T v;
        std::memcpy(&v, p + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }
};

// Walks the layout of a snapshot of n bytes (after check_snapshot_header) without using its contents: a file cut
// short is "truncated or damaged" (not only "damaged" by the checksum, which it would also fail); one with bytes
// after the layout is refused too.
void check_snapshot_layout(const uint8_t* data, size_t n) {
    Reader r{data, n};
    r.pos = 12;
    const uint32_t flags = r.get<uint32_t>();
    r.pos = 24;
    const uint64_t n_hist = r.get<uint32_t>();
    r.get<uint32_t>();  // n_pending
    // (a length field changed by damage reads the same as a cut: the message names both)
    auto skip = [&](uint64_t bytes) {
        if (bytes > n - r.pos)
            throw Error(Status::format, "snapshot is truncated or damaged (its layout runs past the snapshot's " +
                                            std::to_string(n) + " bytes)");
        r.pos += size_t(bytes);
    };
    skip(4 * n_hist);
    if (flags & 1u) skip(4 * uint64_t(r.get<uint32_t>()));
    skip(r.get<uint64_t>());
    skip(8);  // the checksum
    if (r.pos != n) throw Error(Status::format, "snapshot: state block size does not match the file size");
}

}  // namespace

uint64_t fingerprint_folder(const std::string& dir) {
    Fnv1a f;
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

uint64_t snapshot_checksum(const uint8_t* p, size_t n) {
    Fnv1a f;
    f.add_words(p, n);
    return f.h;
}

std::vector<uint8_t> serialize_snapshot(const Sequence& seq, uint64_t fingerprint) {
    std::vector<uint8_t> state = seq.model->save_state(seq.slot);
    std::vector<uint8_t> out;
    out.reserve(64 + seq.history.size() * 4 + seq.logits.size() * 4 + state.size());
    put_bytes(out, kMagic, 8);
    put(out, kSnapshotVersion);
    put(out, uint32_t(seq.has_logits ? 1 : 0));
    put(out, fingerprint);
    put(out, uint32_t(seq.history.size()));
    put(out, uint32_t(seq.n_pending));
    put_bytes(out, seq.history.data(), seq.history.size() * 4);
    if (seq.has_logits) {
        put(out, uint32_t(seq.logits.size()));
        put_bytes(out, seq.logits.data(), seq.logits.size() * 4);
    }
    put(out, uint64_t(state.size()));
    put_bytes(out, state.data(), state.size());
    put(out, snapshot_checksum(out.data(), out.size()));
    return out;
}

void check_snapshot_header(const uint8_t* data, size_t n) {
    Reader r{data, n};
    // a file cut inside the magic (its bytes are the magic's first n) is truncated, not another kind of file
    if (n == 0) throw Error(Status::format, "snapshot is truncated (0 bytes)");
    if (n < 8 && std::memcmp(data, kMagic, n) == 0) throw Error(Status::format, "snapshot is truncated");
    if (n < 8 || std::memcmp(data, kMagic, 8) != 0) {
        // a file of another known kind is named by its own magic when that is printable text
        const bool text = n >= 8 && std::all_of(data, data + 8, [](uint8_t b) { return b >= 0x20 && b < 0x7f; });
        throw Error(Status::format, text ? "not a hybrid snapshot (bad magic \"" +
                                               std::string(reinterpret_cast<const char*>(data), 8) + "\")"
                                         : std::string("not a hybrid snapshot (bad magic)"));
    }
    r.pos = 8;
    const uint32_t version = r.get<uint32_t>();
    // a version no build wrote or is likely to (a changed byte: the checksum is not checked before the version,
    // whose layout may differ) is damage, not "a newer build"
    if (version == 0 || version > kSnapshotVersion + 16)
        throw Error(Status::format, "snapshot is damaged (its version field reads " + std::to_string(version) +
                                        "; this build reads version " + std::to_string(kSnapshotVersion) + ")");
    if (version != kSnapshotVersion)
        throw Error(Status::format,
                    "snapshot version " + std::to_string(version) + ", this build reads version " +
                        std::to_string(kSnapshotVersion) +
                        (version < kSnapshotVersion ? " (older snapshots carry another model fingerprint: prefill the "
                                                      "sequence again and save a new one)"
                                                    : " (saved by a newer build)"));
}

void check_snapshot_fingerprint(uint64_t fingerprint, const uint8_t* data, size_t n) {
    Reader r{data, n};
    r.pos = 16;
    const uint64_t fp = r.get<uint64_t>();
    if (fp != fingerprint) {
        char msg[256];
        std::snprintf(msg, sizeof msg,
                      "snapshot was saved from another model, or with other weight quantization (--quant) "
                      "(fingerprint %016llx, this model %016llx)",
                      (unsigned long long)fp, (unsigned long long)fingerprint);
        throw Error(Status::model_mismatch, msg);
    }
}

void deserialize_snapshot(Sequence& seq, uint64_t fingerprint, const uint8_t* data, size_t n) {
    check_snapshot_header(data, n);
    check_snapshot_layout(data, n);
    {  // the checksum trailer: a damaged snapshot is refused before anything is read from it
        uint64_t stored = 0;
        std::memcpy(&stored, data + n - 8, 8);
        n -= 8;
        if (snapshot_checksum(data, n) != stored)
            throw Error(Status::format, "snapshot is damaged (its checksum does not match its contents)");
    }
    check_snapshot_fingerprint(fingerprint, data, n);  // (after the checksum: a damaged fingerprint is damage)
    Model& model = *seq.model;
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
        if (id < 0 || id >= seq.n_logits) throw Error(Status::format, "snapshot: token id out of range");
    }
    if (int64_t(n_hist) - int64_t(n_pending) > model.n_ctx())
        throw Error(Status::context_full, "snapshot holds " + std::to_string(n_hist) +
                                              " tokens; the context length is " + std::to_string(model.n_ctx()));
    const bool has_logits = flags & 1u;
    if (has_logits) {
        const uint32_t nl = r.get<uint32_t>();
        if (nl != uint32_t(seq.n_logits)) throw Error(Status::model_mismatch, "snapshot logits row has another size");
        if (uint64_t(nl) * 4 > n - r.pos) throw Error(Status::format, "snapshot is truncated");
        std::memcpy(seq.logits.data(), data + r.pos, size_t(nl) * 4);
        r.pos += size_t(nl) * 4;
    }
    const uint64_t n_state = r.get<uint64_t>();
    if (n_state != n - r.pos) throw Error(Status::format, "snapshot: state block size does not match the file size");
    model.load_state(seq.slot, std::span<const uint8_t>(data + r.pos, size_t(n_state)));
    if (model.seq_len(seq.slot) != int(n_hist - n_pending))
        throw Error(Status::format, "snapshot: history length does not match the state");
    seq.history = std::move(hist);
    seq.n_pending = int(n_pending);
    seq.has_logits = has_logits;
}

size_t max_snapshot_bytes(const Sequence& seq) {
    const Model& model = *seq.model;
    return 32 + 4 * (size_t(model.n_ctx()) + 1) + 4 + 4 * size_t(seq.n_logits) + 8 + 8 +
           model.state_bytes() / size_t(std::max(model.n_slots(), 1)) + 4096;
}

std::vector<uint8_t> read_snapshot_file(const Sequence& seq, uint64_t fingerprint, const std::string& path) {
    return read_file_checked(path, 32, [&](std::span<const uint8_t> head, uint64_t size) {
        check_snapshot_header(head.data(), head.size());
        const size_t cap = max_snapshot_bytes(seq);
        if (size > cap) {
            // (too big for this model: most likely another model's, or this model's saved with a longer context)
            check_snapshot_fingerprint(fingerprint, head.data(), head.size());
            uint32_t n_hist = 0, n_pending = 0;  // (the header's fields at 24 and 28)
            std::memcpy(&n_hist, head.data() + 24, 4);
            std::memcpy(&n_pending, head.data() + 28, 4);
            if (n_pending <= n_hist && int64_t(n_hist) - int64_t(n_pending) > seq.model->n_ctx())
                throw Error(Status::context_full, "snapshot holds " + std::to_string(n_hist) +
                                                      " tokens; the context length is " +
                                                      std::to_string(seq.model->n_ctx()));
            throw Error(Status::format, "snapshot file has " + std::to_string(size) +
                                            " bytes, more than any snapshot of this model (at most " +
                                            std::to_string(cap) + ")");
        }
    });
}

}  // namespace hy
