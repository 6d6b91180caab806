// FNV-1a, 64 bit: the library's one non-cryptographic hash (the model fingerprint, the snapshot checksum, the
// checksum of hybrid -i's conversation headers). Standard parameters: offset basis 0xcbf29ce484222325, prime
// 0x100000001b3 (fnv1a("") == 0xcbf29ce484222325, fnv1a("a") == 0xaf63dc4c8601ec8c).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace hy {

struct Fnv1a {
    static constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ull;
    static constexpr uint64_t kPrime = 0x100000001b3ull;
    uint64_t h = kOffsetBasis;

    // Standard FNV-1a over n bytes.
    void add(const void* p, size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * kPrime;
    }
    // The 8 bytes of v in memory order (little-endian on the supported hosts).
    void add_u64(uint64_t v) { add(&v, sizeof v); }
    // The same step over 8-byte words (native order) and then the tail bytes: one multiply per 8 bytes, for large
    // blocks (snapshots of hundreds of MB). Not byte-wise FNV-1a: it gives other values than add() for n >= 8.
    void add_words(const void* p, size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t w;
            std::memcpy(&w, b + i, 8);
            h = (h ^ w) * kPrime;
        }
        add(b + i, n - i);
    }
};

// FNV-1a (64 bit) of the bytes of s.
inline uint64_t fnv1a(std::string_view s) {
    Fnv1a f;
    f.add(s.data(), s.size());
    return f.h;
}

}  // namespace hy
