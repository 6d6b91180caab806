// A small fork-join thread pool for the CPU backend: one per backend (no process-global state); the calling
// thread takes part.
//
// A task is cut into chunks that threads claim one at a time from an atomic counter, so a thread that the OS has
// preempted holds up only the chunk it is running, never the whole step: on a machine with fewer free cores
// than threads the others simply take its share (with OpenMP's static schedule and spinning barriers a busy
// 2-core machine ran the decode loop 50x slower). Which thread runs a chunk never changes a result: every output
// element is computed by one chunk in a fixed order; per-thread scratch is indexed by the running thread.
//
// Waiting threads spin briefly, then yield, then sleep on an atomic (C++20 wait/notify).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace hy::cpu {

class ThreadPool {
public:
    // n_threads <= 0: one per core available to this process. Throws hy::Error (backend) when the OS refuses to
    // start the threads (a process limit), after stopping those it started.
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(begin, end, thread) for contiguous chunks covering [0, n) exactly once each, where thread in
    // [0, size()) names the calling thread (for per-thread scratch), and returns when all are done. Chunks hold
    // at least `grain` items (the caller runs everything itself when n < 2 * grain). Not reentrant.
    template <class F>
    void parallel_for(int64_t n, int64_t grain, F&& fn) {
        if (n <= 0) return;
        grain = std::max<int64_t>(grain, 1);
        const int64_t chunks = std::min<int64_t>(n / grain, int64_t(kChunksPerThread) * n_threads_);
        if (n_threads_ <= 1 || chunks <= 1) {
            fn(int64_t(0), n, 0);
            return;
        }
        run(n, chunks, &fn, [](void* f, int64_t b, int64_t e, int t) { (*static_cast<F*>(f))(b, e, t); });
    }

    static int default_threads();

private:
    static constexpr int kChunksPerThread = 8;
    using Thunk = void (*)(void*, int64_t, int64_t, int);
    void run(int64_t n, int64_t chunks, void* fn, Thunk thunk);
    void work(int thread);
    void worker(int thread);
    void stop_workers();

    int n_threads_;
    std::vector<std::thread> workers_;
    // The current task; written before its generation is published in claim_.
    void* fn_ = nullptr;
    Thunk thunk_ = nullptr;
    int64_t n_ = 0, chunks_ = 0;
    uint32_t generation_ = 0;  // the caller's count of tasks
    // generation (24 bits) << 40 | chunk count (20 bits) << 20 | next chunk to claim (20 bits): a claim is one
    // compare-exchange, and it can only succeed while its task still has unclaimed chunks.
    std::atomic<uint64_t> claim_{0};
    std::atomic<int64_t> done_{0};   // chunks finished in the current task
    std::atomic<uint32_t> wake_{0};  // bumped per task; idle workers sleep on it
    std::atomic<bool> stop_{false};
};

}  // namespace hy::cpu
