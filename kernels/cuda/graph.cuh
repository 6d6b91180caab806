// Replaying a forward step as one CUDA graph. The backend records the ops of a small step (decode) instead of
// launching them, with a signature of every argument; at the end of the step it launches the graph captured for
// that signature, capturing one first on a miss. Everything that changes from one decode step to the next (token
// ids, positions, slots, rows to gather) reaches the kernels through device memory, filled by a memcpy node from
// the backend's pinned staging buffer, so the same graph serves every step of the same shape.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

namespace hy::cuda {

class GraphCache {
public:
    static constexpr int kMaxGraphs = 32;
    GraphCache() = default;
    ~GraphCache();
    GraphCache(const GraphCache&) = delete;
    GraphCache& operator=(const GraphCache&) = delete;

    // The graph stored under `sig`, or nullptr.
    cudaGraphExec_t find(const std::vector<uint64_t>& sig);
    // Captures what body() enqueues on `stream` into a graph, stores it under `sig` (replacing the least recently
    // used one when full) and returns it. If body throws, the capture is abandoned and the error rethrown.
    template <class Body>
    cudaGraphExec_t capture(const std::vector<uint64_t>& sig, cudaStream_t stream, Body&& body) {
        HY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
        try {
            body();
        } catch (...) {
            cudaGraph_t g = nullptr;
            cudaStreamEndCapture(stream, &g);
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
            throw;
        }
        cudaGraph_t g = nullptr;
        HY_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
        cudaGraphExec_t exec = nullptr;
        const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
        cudaGraphDestroy(g);
        check(e, "cudaGraphInstantiate");
        return store(sig, exec);
    }
    void clear();

private:
    cudaGraphExec_t store(const std::vector<uint64_t>& sig, cudaGraphExec_t exec);
    struct Entry {
        std::vector<uint64_t> sig;
        cudaGraphExec_t exec = nullptr;
        uint64_t used = 0;
    };
    Entry entries_[kMaxGraphs];
    uint64_t clock_ = 0;
};

}  // namespace hy::cuda
