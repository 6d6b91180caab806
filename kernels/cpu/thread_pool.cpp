#include "kernels/cpu/thread_pool.h"

#include <sched.h>

#include <string>
#include <system_error>

#include "base/common.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HY_PAUSE() _mm_pause()
#else
#define HY_PAUSE() ((void)0)
#endif

namespace hy::cpu {

namespace {
constexpr int kSpins = 2000;  // busy polls before yielding (a few microseconds)
constexpr int kYields = 200;  // yields before an idle worker sleeps on the atomic
}  // namespace

int ThreadPool::default_threads() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_threads()) {
    try {
        for (int i = 1; i < n_threads_; i++) workers_.emplace_back([this, i] { worker(i); });
    } catch (const std::system_error& e) {  // (the OS refused a thread: stop those started, then report)
        const size_t started = workers_.size();
        stop_workers();
        throw Error(Status::backend, "cannot start " + std::to_string(n_threads_) + " CPU threads (" +
                                         std::to_string(started + 1) + " started: " + e.what() +
                                         "); ask for fewer threads");
    }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
    stop_.store(true, std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_acq_rel);
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
}

// Claims and runs chunks of the current task until none is left.
void ThreadPool::work(int thread) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    for (;;) {
        const int64_t next = int64_t(c & 0xfffffu), chunks = int64_t((c >> 20) & 0xfffffu);
        if (next >= chunks) return;
        if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
        // The claim succeeded while the task had unclaimed chunks, so the task fields are this task's and stay so
        // until its last chunk (this one included) is done.
        thunk_(fn_, n_ * next / chunks, n_ * (next + 1) / chunks, thread);
        done_.fetch_add(1, std::memory_order_acq_rel);
        c = claim_.load(std::memory_order_acquire);
    }
}

void ThreadPool::run(int64_t n, int64_t chunks, void* fn, Thunk thunk) {
    chunks = std::min<int64_t>(chunks, 0xfffff);
    fn_ = fn;
    thunk_ = thunk;
    n_ = n;
    chunks_ = chunks;
    done_.store(0, std::memory_order_relaxed);
    generation_ = (generation_ + 1) & 0xffffffu;
    claim_.store(uint64_t(generation_) << 40 | uint64_t(chunks) << 20, std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_release);
    wake_.notify_all();
    work(0);
    for (int i = 0; done_.load(std::memory_order_acquire) != chunks; i++) {
        if (i < kSpins)
            HY_PAUSE();
        else
            std::this_thread::yield();
    }
}

void ThreadPool::worker(int thread) {
    uint32_t seen = wake_.load(std::memory_order_acquire);
    for (;;) {
        uint32_t w;
        for (int i = 0;; i++) {
            w = wake_.load(std::memory_order_acquire);
            if (w != seen || stop_.load(std::memory_order_acquire)) break;
            if (i < kSpins)
                HY_PAUSE();
            else if (i < kSpins + kYields)
                std::this_thread::yield();
            else
                wake_.wait(seen, std::memory_order_acquire);
        }
        seen = w;
        if (stop_.load(std::memory_order_acquire)) return;
        work(thread);
    }
}

}  // namespace hy::cpu
