// StoredState and StateStore: host memory for kept sequence states, in blocks of one page-locked allocation.
#include "model/state_store.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "base/common.h"

namespace hy {

struct StoredState::Pool {
    std::shared_ptr<void> memory;
    size_t block = 0;
    uint32_t n_blocks = 0;
    std::mutex m;
    std::vector<uint32_t> free;  // block indices; taken from the back
};

StoredState::StoredState(size_t bytes) : size_(bytes), footprint_(bytes) {
    own_.reset(new (std::nothrow) uint8_t[std::max<size_t>(bytes, 1)]);
    if (!own_)
        throw Error(Status::out_of_memory, "cannot allocate " + std::to_string(bytes >> 20) + " MiB for a state");
    if (bytes > 0) ranges_.push_back({own_.get(), bytes});
}

StoredState::~StoredState() {
    if (!pool_) return;
    std::lock_guard<std::mutex> lk(pool_->m);
    pool_->free.insert(pool_->free.end(), blocks_.begin(), blocks_.end());
}

std::vector<uint8_t> StoredState::to_vector() const {
    std::vector<uint8_t> out;
    out.reserve(size_);
    for (const std::span<uint8_t>& r : ranges_) out.insert(out.end(), r.begin(), r.end());
    return out;
}

StateStore::StateStore(Backend& backend, size_t bytes, size_t block_bytes)
    : pool_(std::make_shared<StoredState::Pool>()) {
    constexpr size_t kPage = 4096;
    if (block_bytes == 0) block_bytes = std::clamp(bytes / 1024, size_t(64) << 10, size_t(1) << 20);
    block_bytes = (block_bytes + kPage - 1) / kPage * kPage;
    const size_t n = std::clamp(bytes / block_bytes, size_t(1), size_t(UINT32_MAX));
    pool_->block = block_bytes;
    pool_->n_blocks = uint32_t(n);
    pool_->memory = backend.alloc_host(n * block_bytes);
    pool_->free.resize(n);
    for (size_t i = 0; i < n; i++) pool_->free[i] = uint32_t(n - 1 - i);  // block 0 first
}

StateStore::~StateStore() = default;

std::shared_ptr<StoredState> StateStore::allocate(size_t bytes) {
    if (bytes == 0) throw Error(Status::invalid_argument, "StateStore::allocate: a state of 0 bytes");
    const size_t need = (bytes + pool_->block - 1) / pool_->block;
    std::vector<uint32_t> taken;
    {
        std::lock_guard<std::mutex> lk(pool_->m);
        if (pool_->free.size() < need) return nullptr;
        taken.assign(pool_->free.end() - std::ptrdiff_t(need), pool_->free.end());
        pool_->free.resize(pool_->free.size() - need);
    }
    std::sort(taken.begin(), taken.end());  // ascending: neighbours merge into longer ranges
    std::shared_ptr<StoredState> st(new StoredState());
    st->pool_ = pool_;
    st->blocks_ = std::move(taken);
    st->size_ = bytes;
    st->footprint_ = need * pool_->block;
    uint8_t* const base = static_cast<uint8_t*>(pool_->memory.get());
    size_t left = bytes;
    for (uint32_t b : st->blocks_) {
        const size_t n = std::min(left, pool_->block);
        uint8_t* const p = base + size_t(b) * pool_->block;
        // consecutive blocks make one range (fewer, longer copies)
        if (!st->ranges_.empty() && st->ranges_.back().data() + st->ranges_.back().size() == p)
            st->ranges_.back() = {st->ranges_.back().data(), st->ranges_.back().size() + n};
        else
            st->ranges_.push_back({p, n});
        left -= n;
    }
    return st;
}

bool StateStore::fits(size_t bytes) const { return bytes <= capacity(); }
size_t StateStore::capacity() const { return size_t(pool_->n_blocks) * pool_->block; }
size_t StateStore::block_bytes() const { return pool_->block; }
size_t StateStore::used() const {
    std::lock_guard<std::mutex> lk(pool_->m);
    return (size_t(pool_->n_blocks) - pool_->free.size()) * pool_->block;
}

}  // namespace hy
