// Host memory for sequence states that are kept to be loaded again (the server's conversation-state cache).
//
// A StoredState holds one Model::save_state snapshot as a list of byte ranges. A StateStore makes them from one
// Backend::alloc_host allocation cut into equal blocks (page-locked on CUDA): saving and loading a state are then
// asynchronous copies at the bus's full speed into memory that is already resident, with no allocation, page fault
// or driver staging per state. A state made without a store owns one plain allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.h"

namespace hy {

class StoredState {
public:
    // A state of `bytes` bytes in one plain allocation of its own. Throws out_of_memory.
    explicit StoredState(size_t bytes);
    ~StoredState();
    StoredState(const StoredState&) = delete;
    StoredState& operator=(const StoredState&) = delete;

    size_t size() const { return size_; }
    // The host memory it takes (whole blocks when it comes from a store).
    size_t footprint() const { return footprint_; }
    // Its bytes in order: the ranges' sizes sum to size().
    std::span<const std::span<uint8_t>> ranges() const { return ranges_; }
    // A copy in one vector (tests, files).
    std::vector<uint8_t> to_vector() const;

private:
    friend class StateStore;
    struct Pool;
    StoredState() = default;
    size_t size_ = 0, footprint_ = 0;
    std::vector<std::span<uint8_t>> ranges_;
    std::unique_ptr<uint8_t[]> own_;  // a state made without a store
    std::shared_ptr<Pool> pool_;      // else its store's memory
    std::vector<uint32_t> blocks_;    // and the blocks it holds there
};

class StateStore {
public:
    // `bytes` of host memory from backend.alloc_host(), allocated now, in blocks of block_bytes (0: bytes / 1024,
    // clamped to [64 KiB, 1 MiB]: a state loses at most one block to its last block's unused tail, which matters
    // for the small states of small models; rounded up to 4 KiB). The store's capacity is bytes rounded down to whole
    // blocks (at least one). Throws out_of_memory.
    StateStore(Backend& backend, size_t bytes, size_t block_bytes = 0);
    ~StateStore();
    StateStore(const StateStore&) = delete;
    StateStore& operator=(const StateStore&) = delete;

    // A state of `bytes` bytes (> 0) in free blocks, or null when fewer are free. Its blocks return to the store
    // when the state is destroyed (which may be after the store). Thread-safe.
    std::shared_ptr<StoredState> allocate(size_t bytes);
    // Whether a state of `bytes` bytes fits the store at all (when every block is free).
    bool fits(size_t bytes) const;
    size_t capacity() const;     // bytes
    size_t block_bytes() const;  // bytes
    size_t used() const;         // bytes in blocks held by states

private:
    std::shared_ptr<StoredState::Pool> pool_;
};

}  // namespace hy
