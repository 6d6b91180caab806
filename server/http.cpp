// hybrid-server's HTTP connections (see http.h): a thread per connection, deadlines on reading requests, the
// listen backlog.
#include "server/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

namespace hy::server {

namespace {

using Clock = std::chrono::steady_clock;

// Waits until `fd` has one of `events` (or a hang-up or error), at most until `until`; false on a timeout.
bool wait_fd(int fd, short events, Clock::time_point until) {
    while (true) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
        if (left <= 0) return false;
        pollfd p{fd, events, 0};
        const int r = poll(&p, 1, int(std::min<long long>(left, 1000000)));
        if (r > 0) return true;
        if (r < 0 && errno != EINTR) return true;  // (the read or write that follows reports the error)
    }
}

std::pair<std::string, int> address_of(const sockaddr_storage& a) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (a.ss_family == AF_INET) {
        const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
        inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
        return {buf, ntohs(v4->sin_port)};
    }
    if (a.ss_family == AF_INET6) {
        const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
        inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
        return {buf, ntohs(v6->sin6_port)};
    }
    return {"", -1};
}

std::string seconds_text(std::chrono::milliseconds ms) {
    char buf[32];
    if (ms.count() % 1000 == 0)
        std::snprintf(buf, sizeof buf, "%lld s", static_cast<long long>(ms.count() / 1000));
    else
        std::snprintf(buf, sizeof buf, "%.3g s", double(ms.count()) / 1000);
    return buf;
}

// One connection's socket as the library's Stream, with a deadline on reading each request.
class ConnStream final : public httplib::Stream {
public:
    ConnStream(int fd, const ConnectionLimits& limits) : fd_(fd), limits_(limits) {}

    bool is_readable() const override { return pos_ < len_ || wait_fd(fd_, POLLIN, deadline()); }
    bool is_writable() const override { return wait_fd(fd_, POLLOUT, Clock::now() + limits_.write_timeout); }

    ssize_t read(char* ptr, size_t size) override {
        if (pos_ == len_) {
            if (!wait_fd(fd_, POLLIN, deadline())) {
                timed_out_ = true;
                return -1;
            }
            ssize_t n;
            do {
                n = recv(fd_, buf_, sizeof buf_, 0);
            } while (n < 0 && errno == EINTR);
            if (n <= 0) return n;
            pos_ = 0;
            len_ = size_t(n);
            request_bytes_ += size_t(n);
        }
        const size_t n = std::min(size, len_ - pos_);
        std::memcpy(ptr, buf_ + pos_, n);
        pos_ += n;
        return ssize_t(n);
    }

    ssize_t write(const char* ptr, size_t size) override {
        if (!is_writable()) return -1;
        ssize_t n;
        do {
            n = send(fd_, ptr, size, MSG_NOSIGNAL);
        } while (n < 0 && errno == EINTR);
        if (n > 0) written_ += size_t(n);
        return n;
    }

    void get_remote_ip_and_port(std::string& ip, int& port) const override {
        sockaddr_storage a{};
        socklen_t n = sizeof a;
        if (getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &n) == 0) std::tie(ip, port) = address_of(a);
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
        sockaddr_storage a{};
        socklen_t n = sizeof a;
        if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &n) == 0) std::tie(ip, port) = address_of(a);
    }
    socket_t socket() const override { return fd_; }

    // Waits for the first byte of the next request (or the peer's close), at most idle_timeout; gives up early
    // when `running` turns false.
    bool wait_for_request(const std::function<bool()>& running) const {
        if (pos_ < len_) return true;
        const auto until = Clock::now() + limits_.idle_timeout;
        while (running()) {
            const auto slice = std::min(until, Clock::now() + std::chrono::milliseconds(200));
            if (wait_fd(fd_, POLLIN, slice)) return true;
            if (Clock::now() >= until) return false;
        }
        return false;
    }
    // A request starts: its deadline runs from now.
    void start_request() {
        start_ = Clock::now();
        request_bytes_ = len_ - pos_;
        body_length_ = 0;
        timed_out_ = false;
        written_ = 0;
    }
    void set_body_length(uint64_t n) { body_length_ = n; }
    bool timed_out() const { return timed_out_; }
    size_t written() const { return written_; }

    bool close_after = false;  // close the connection after this response
    bool last = false;         // the library closes it after this response (and says so)

private:
    Clock::time_point deadline() const {
        const uint64_t body = std::max<uint64_t>(body_length_, request_bytes_);
        const auto allowance =
            std::chrono::milliseconds(body / std::max<size_t>(1, limits_.body_bytes_per_second / 1000));
        return start_ + limits_.request_timeout + allowance;
    }

    int fd_;
    const ConnectionLimits& limits_;
    char buf_[16384];
    size_t pos_ = 0, len_ = 0;
    Clock::time_point start_ = Clock::now();
    uint64_t request_bytes_ = 0, body_length_ = 0;
    bool timed_out_ = false;
    size_t written_ = 0;
};

thread_local ConnStream* t_conn = nullptr;

// The library's task queue: a thread for each connection, at most `max` at once (the connections past it wait for
// one to end). A thread takes the next waiting connection when its own ends, and ends when none waits.
class ConnectionThreads final : public httplib::TaskQueue {
public:
    explicit ConnectionThreads(size_t max) : max_(std::max<size_t>(1, max)) {}
    ~ConnectionThreads() override { shutdown(); }

    void enqueue(std::function<void()> fn) override {
        std::vector<std::thread> ended;
        std::function<void()> inline_task;
        {
            std::lock_guard<std::mutex> lk(m_);
            ended.swap(ended_);
            tasks_.push_back(std::move(fn));
            if (running_ < max_) {
                try {
                    std::thread t([this] { work(); });
                    const std::thread::id id = t.get_id();
                    threads_.emplace(id, std::move(t));
                    running_++;
                } catch (const std::system_error&) {  // (no thread now: a running one takes it when it ends)
                    if (running_ == 0) {
                        inline_task = std::move(tasks_.back());
                        tasks_.pop_back();
                    }
                }
            }
        }
        for (std::thread& t : ended) t.join();
        if (inline_task) inline_task();  // (the last resort, on the accepting thread)
    }

    // Waits for every connection to end (the library's listen loop has stopped accepting).
    void shutdown() override {
        std::vector<std::thread> ended;
        {
            std::unique_lock<std::mutex> lk(m_);
            cv_.wait(lk, [&] { return running_ == 0; });
            ended.swap(ended_);
        }
        for (std::thread& t : ended) t.join();
    }

private:
    void work() {
        while (true) {
            std::function<void()> fn;
            {
                std::lock_guard<std::mutex> lk(m_);
                if (tasks_.empty()) {
                    auto it = threads_.find(std::this_thread::get_id());
                    ended_.push_back(std::move(it->second));
                    threads_.erase(it);
                    running_--;
                    cv_.notify_all();
                    return;
                }
                fn = std::move(tasks_.front());
                tasks_.pop_front();
            }
            fn();
        }
    }

    const size_t max_;
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> tasks_;
    std::map<std::thread::id, std::thread> threads_;
    std::vector<std::thread> ended_;  // threads that returned, to join
    size_t running_ = 0;
};

// Shuts the writing side and reads what the peer still sends (an unread body), briefly, so that closing does not
// reset the connection before the peer has read the answer.
void drain_and_close(int fd) {
    shutdown(fd, SHUT_WR);
    const auto until = Clock::now() + std::chrono::seconds(2);
    size_t drained = 0;
    char buf[16384];
    while (drained < (size_t(128) << 20) && wait_fd(fd, POLLIN, until)) {
        const ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0 && !(n < 0 && errno == EINTR)) break;
        if (n > 0) drained += size_t(n);
    }
    close(fd);
}

}  // namespace

HttpServer::HttpServer(const ConnectionLimits& limits) : limits_(limits) {
    const size_t max = size_t(std::max(1, limits.max_connections));
    new_task_queue = [max] { return new ConnectionThreads(max); };
    set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(limits.write_timeout));
}

void HttpServer::raise_backlog() {
    const socket_t fd = svr_sock_;
    if (fd != INVALID_SOCKET) ::listen(fd, SOMAXCONN);  // (on a listening socket: only the backlog changes)
}

bool HttpServer::request_timed_out() { return t_conn && t_conn->timed_out(); }

int HttpServer::current_socket() { return t_conn ? t_conn->socket() : -1; }

std::string HttpServer::timeout_message() const {
    return "the request did not arrive in time (" + seconds_text(limits_.request_timeout) +
           " from its first byte, plus 1 s per " + std::to_string(limits_.body_bytes_per_second >> 10) +
           " KiB of body)";
}

void HttpServer::close_after_response(const httplib::Request& req, httplib::Response& res) {
    const bool library_says_it = t_conn && t_conn->last;
    // (once: a chunked request is marked at its headers and again when its body fails to read)
    // As if the client had asked to close: the library then writes "Connection: close" itself, without the
    // Keep-Alive header it adds to a connection it keeps (a response header alone would go out beside that one).
    if (!library_says_it && req.get_header_value("Connection") != "close" && !res.has_header("Connection")) {
        httplib::Headers& h = const_cast<httplib::Request&>(req).headers;  // (the request the library handed us)
        h.erase("Connection");
        h.emplace("Connection", "close");
    }
    if (t_conn) t_conn->close_after = true;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
    n_open_++;
    ConnStream strm(sock, limits_);
    t_conn = &strm;
    bool ret = false, drain = false;
    const auto running = [this] { return svr_sock_ != INVALID_SOCKET; };
    for (size_t n = 0; n < limits_.max_requests_per_connection && running(); n++) {
        if (!strm.wait_for_request(running)) break;
        strm.start_request();
        strm.last = n + 1 == limits_.max_requests_per_connection;
        bool closed = false;
        ret = process_request(strm, strm.last, closed, [this, &strm](httplib::Request& req) {
            strm.set_body_length(
                std::min<uint64_t>(req.get_header_value<uint64_t>("Content-Length"), limits_.max_body_bytes));
        });
        if (strm.timed_out()) {
            if (strm.written() == 0) {  // (the request line did not come: the library answered nothing)
                const std::string body = error_body ? error_body(408, timeout_message()) : std::string();
                std::string head = "HTTP/1.1 408 Request Timeout\r\n";
                for (const auto& [k, v] : error_headers) head += k + ": " + v + "\r\n";
                head += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\nConnection: close\r\n\r\n";
                const std::string all = head + body;
                for (size_t off = 0; off < all.size();) {
                    const ssize_t w = strm.write(all.data() + off, all.size() - off);
                    if (w <= 0) break;
                    off += size_t(w);
                }
            }
            drain = true;
            break;
        }
        if (strm.close_after) drain = true;
        if (!ret || closed || strm.close_after) break;
    }
    t_conn = nullptr;
    if (drain) {
        drain_and_close(sock);
    } else {
        shutdown(sock, SHUT_RDWR);
        close(sock);
    }
    n_open_--;
    return ret;
}

}  // namespace hy::server
