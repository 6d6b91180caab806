// Token sampling (see sampler.h for the pipeline and the formulas).
#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "model/common.h"

namespace hy {

namespace {

float clean(float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; }

}  // namespace

int32_t argmax(std::span<const float> logits, int n_valid) {
    const size_t n = std::min(logits.size(), size_t(std::max(n_valid, 0)));
    int32_t best = 0;
    float best_v = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < n; i++) {
        const float v = logits[i];
        if (v > best_v) {  // false for NaN
            best_v = v;
            best = int32_t(i);
        }
    }
    return best;
}

double log_softmax_at(std::span<const float> logits, int n_valid, int32_t id) {
    const size_t n = std::min(logits.size(), size_t(std::max(n_valid, 0)));
    if (id < 0 || size_t(id) >= n) return -std::numeric_limits<double>::infinity();
    const float x = clean(logits[size_t(id)]);
    if (std::isinf(x) && x < 0) return -std::numeric_limits<double>::infinity();
    double mx = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < n; i++) mx = std::max(mx, double(clean(logits[i])));
    if (std::isinf(mx)) return mx > 0 ? (std::isinf(x) ? 0.0 : -std::numeric_limits<double>::infinity()) : mx;
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += std::exp(double(clean(logits[i])) - mx);
    return double(x) - mx - std::log(s);
}

Sampler::Sampler(const SamplerParams& p, int n_logits, int n_valid, int history_capacity) : params_(p) {
    if (n_logits <= 0) throw Error(Status::invalid_argument, "sampler: n_logits must be > 0");
    if (n_valid <= 0) throw Error(Status::invalid_argument, "sampler: n_valid must be > 0");
    if (!(p.top_p >= 0.0f)) throw Error(Status::invalid_argument, "sampler: top_p must be >= 0");
    if (std::isnan(p.min_p)) throw Error(Status::invalid_argument, "sampler: min_p is NaN");
    if (!(p.repeat_penalty > 0.0f)) throw Error(Status::invalid_argument, "sampler: repeat_penalty must be > 0");
    if (p.repeat_last_n < -1) throw Error(Status::invalid_argument, "sampler: repeat_last_n must be >= -1");
    if (std::isnan(p.temperature) || std::isnan(p.presence_penalty) || std::isnan(p.frequency_penalty))
        throw Error(Status::invalid_argument, "sampler: temperature and penalties must be numbers");
    n_logits_ = n_logits;
    n_valid_ = std::min(n_valid, n_logits);
    const int window = p.repeat_last_n < 0 ? std::max(history_capacity, 0) : p.repeat_last_n;
    ring_.assign(size_t(window), 0);
    counts_.assign(size_t(n_logits), 0);
    seen_.assign(size_t(n_logits), 0);
    work_.assign(size_t(n_logits), 0.0f);
    cand_.reserve(size_t(n_valid_));
    rng_.seed(p.seed);
}

void Sampler::set_seed(uint64_t seed) {
    params_.seed = seed;
    rng_.seed(seed);
}

void Sampler::reset(bool reseed) {
    ring_head_ = ring_count_ = 0;
    std::fill(counts_.begin(), counts_.end(), 0);
    if (reseed) rng_.seed(params_.seed);
}

int Sampler::window_size() const { return int(ring_count_); }

void Sampler::accept(int32_t id) {
    if (id < 0 || id >= n_logits_ || ring_.empty()) return;
    const size_t cap = ring_.size();
    if (ring_count_ == cap) {  // evict the oldest
        const size_t oldest = (ring_head_ + cap - ring_count_) % cap;
        counts_[size_t(ring_[oldest])]--;
        ring_count_--;
    }
    ring_[ring_head_] = id;
    ring_head_ = (ring_head_ + 1) % cap;
    ring_count_++;
    counts_[size_t(id)]++;
}

void Sampler::apply_penalties(std::span<float> logits) const {
    if (ring_count_ == 0) return;
    const float rp = params_.repeat_penalty, pp = params_.presence_penalty, fp = params_.frequency_penalty;
    if (rp == 1.0f && pp == 0.0f && fp == 0.0f) return;
    const size_t cap = ring_.size();
    const size_t start = (ring_head_ + cap - ring_count_) % cap;
    for (size_t k = 0; k < ring_count_; k++) {
        const int32_t id = ring_[(start + k) % cap];
        if (seen_[size_t(id)] || size_t(id) >= logits.size()) continue;
        seen_[size_t(id)] = 1;
        float& l = logits[size_t(id)];
        if (rp != 1.0f) l = l > 0.0f ? l / rp : l * rp;
        const int c = counts_[size_t(id)];
        l -= pp * (c > 0 ? 1.0f : 0.0f) + fp * float(c);
    }
    for (size_t k = 0; k < ring_count_; k++) seen_[size_t(ring_[(start + k) % cap])] = 0;
}

double Sampler::uniform01() {
    return double(rng_() >> 11) * (1.0 / 9007199254740992.0);  // 53 random bits in [0, 1)
}

int32_t Sampler::sample(std::span<const float> logits) {
    if (logits.size() != size_t(n_logits_))
        throw Error(Status::invalid_argument, "sampler: logits row has " + std::to_string(logits.size()) +
                                                  " values, expected " + std::to_string(n_logits_));
    const size_t nv = size_t(n_valid_);
    std::copy(logits.begin(), logits.begin() + std::ptrdiff_t(nv), work_.begin());
    for (size_t i = 0; i < nv; i++) work_[i] = clean(work_[i]);
    apply_penalties(std::span<float>(work_.data(), nv));

    const SamplerParams& p = params_;
    if (p.temperature <= 0.0f || p.top_k == 1) return argmax(std::span<const float>(work_.data(), nv), n_valid_);

    cand_.clear();
    for (size_t i = 0; i < nv; i++)
        if (!(std::isinf(work_[i]) && work_[i] < 0)) cand_.push_back({int32_t(i), work_[i], 0.0f});
    if (cand_.empty()) return argmax(std::span<const float>(work_.data(), nv), n_valid_);
    auto by_logit = [](const Candidate& a, const Candidate& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };

    // top-k, then the survivors sorted by logit (descending)
    size_t n = cand_.size();
    if (p.top_k > 0 && size_t(p.top_k) < n) {
        std::nth_element(cand_.begin(), cand_.begin() + p.top_k - 1, cand_.end(), by_logit);
        n = size_t(p.top_k);
    }
    std::sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(n), by_logit);

    // probabilities at temperature 1 (for top-p and min-p)
    const bool filter_p = p.top_p < 1.0f || p.min_p > 0.0f;
    if (filter_p) {
        const float mx = cand_[0].logit;
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) sum += std::exp(double(cand_[i].logit - mx));
        for (size_t i = 0; i < n; i++) cand_[i].p = float(std::exp(double(cand_[i].logit - mx)) / sum);
        if (p.top_p < 1.0f) {
            double cum = 0.0;
            size_t keep = n;
            for (size_t i = 0; i < n; i++) {
                cum += cand_[i].p;
                if (cum >= double(p.top_p)) {
                    keep = i + 1;
                    break;
                }
            }
            n = std::max<size_t>(keep, 1);
        }
        if (p.min_p > 0.0f) {
            const float thr = p.min_p * cand_[0].p;
            size_t keep = 1;
            while (keep < n && cand_[keep].p >= thr) keep++;
            n = keep;
        }
    }

    // temperature, then one draw
    const double inv_t = 1.0 / double(p.temperature);
    if (!std::isfinite(inv_t)) return cand_[0].id;
    const double mx = double(cand_[0].logit);
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double w = std::exp((double(cand_[i].logit) - mx) * inv_t);
        cand_[i].p = float(w);
        sum += double(cand_[i].p);
    }
    const double r = uniform01() * sum;
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += double(cand_[i].p);
        if (r < acc) return cand_[i].id;
    }
    return cand_[n - 1].id;
}

}  // namespace hy
