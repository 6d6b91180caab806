// hybrid-server's HTTP connections: cpp-httplib's Server (its parsing, routing and responses) with hybrid's own
// connection handling, so that slow or idle clients cannot hold the server:
//   - a thread per connection, up to a bound (ConnectionLimits::max_connections; more connections wait to be
//     served), instead of the library's fixed pool in which every kept-alive or slow connection holds a worker;
//   - a connection that sends nothing for idle_timeout (before its first request, or between kept-alive requests)
//     is closed;
//   - a request must arrive within request_timeout of its first byte, plus 1 s per body_bytes_per_second bytes of
//     body (Content-Length, or what a chunked body has sent so far): past it the request is answered 408;
//   - the listen backlog is SOMAXCONN (the library listens with 5: a burst of connects was dropped);
//   - a connection closed with a request body left unread is shut down for writing and drained for a moment
//     before it is closed, so that the client reads the answer instead of a reset.
// Handlers run on their connection's thread: request_timed_out() and close_after_response() speak of that
// connection.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace hy::server {

struct ConnectionLimits {
    int max_connections = 512;                         // served at once, a thread each
    std::chrono::milliseconds idle_timeout{5000};      // no request for this long: the connection is closed
    std::chrono::milliseconds request_timeout{10000};  // from a request's first byte to its last: 408 past it
    size_t body_bytes_per_second = size_t(64) << 10;   // ... plus 1 s per this many bytes of body
    size_t max_body_bytes = size_t(64) << 20;          // (the body allowance counts this many bytes at most)
    std::chrono::milliseconds write_timeout{5000};     // one write of a response that the client does not read
    size_t max_requests_per_connection = 1000;         // kept-alive requests on one connection
};

class HttpServer : public httplib::Server {
public:
    explicit HttpServer(const ConnectionLimits& limits);

    // After bind_to_port / bind_to_any_port: the listening socket's backlog raised to SOMAXCONN.
    void raise_backlog();
    // Connections accepted and not yet closed (served or waiting for a thread).
    int open_connections() const { return n_open_.load(); }

    // A request whose line and headers did not arrive in time gets no response from the library: it is answered
    // here, status 408, with error_body(408, message) as its application/json body and these headers.
    std::function<std::string(int status, const std::string& message)> error_body;
    httplib::Headers error_headers;

    // Whether the request being read on this thread's connection passed its deadline (a failed read of it, in a
    // handler or the error handler, is then a 408).
    static bool request_timed_out();
    // The message of a 408.
    std::string timeout_message() const;
    // The connection of this thread's request is closed after its response (a "Connection: close" header is
    // added unless the library adds one): for answers given without reading the request's body.
    static void close_after_response(const httplib::Request& req, httplib::Response& res);
    // The socket of this thread's connection (-1 outside a connection's thread).
    static int current_socket();

private:
    bool process_and_close_socket(socket_t sock) override;

    ConnectionLimits limits_;
    std::atomic<int> n_open_{0};
};

}  // namespace hy::server
