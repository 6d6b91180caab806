#include <cstring>

#include "kernels/cuda/graph.cuh"

namespace hy::cuda {

GraphCache::~GraphCache() { clear(); }

void GraphCache::clear() {
    for (Entry& e : entries_) {
        if (e.exec) cudaGraphExecDestroy(e.exec);
        e.exec = nullptr;
        e.sig.clear();
    }
}

cudaGraphExec_t GraphCache::find(const std::vector<uint64_t>& sig) {
    for (Entry& e : entries_) {
        if (e.exec && e.sig.size() == sig.size() && std::memcmp(e.sig.data(), sig.data(), sig.size() * 8) == 0) {
            e.used = ++clock_;
            return e.exec;
        }
    }
    return nullptr;
}

cudaGraphExec_t GraphCache::store(const std::vector<uint64_t>& sig, cudaGraphExec_t exec) {
    Entry* victim = &entries_[0];
    for (Entry& e : entries_) {
        if (!e.exec) {
            victim = &e;
            break;
        }
        if (e.used < victim->used) victim = &e;
    }
    if (victim->exec) cudaGraphExecDestroy(victim->exec);
    victim->sig = sig;
    victim->exec = exec;
    victim->used = ++clock_;
    return exec;
}

}  // namespace hy::cuda
