// hybrid-server: an OpenAI-compatible HTTP server over the engine (cpp-httplib).
//
//   POST /v1/chat/completions   chat (the model folder's chat template), tools, reasoning, streaming (SSE)
//   POST /v1/completions        plain text or token-id prompts, streaming (SSE)
//   GET  /v1/models             the one model (GET /v1/models/{id}: it alone, 404 model_not_found for another id)
//   GET  /health                {"status": "ok"}
//   GET  /metrics               Prometheus text: requests, tokens in/out, queue depth, slot use, state cache
//
// Requests share the model through continuous batching (model/batch.h): one engine thread steps a BatchGenerator
// over the -np sequence slots; each HTTP connection's thread (server/http.h: a thread per connection, deadlines on
// idle connections and on reading requests) submits its request and waits for its tokens. A client that
// disconnects (its socket is closed) cancels its request at the next step. Bad requests get OpenAI's error JSON
// ({"error": {"message", "type", "param", "code"}}) with a 4xx status, the HTTP layer's own errors too (400, 408,
// 413, 414: the connection is then closed); 404 for an unknown path, 405 (with Allow) for a method a path does not
// take, 411 for a POST without a length. A POST body is JSON whatever its Content-Type says (up to 64 MiB: 413 past
// it). CORS as llama-server: Access-Control-Allow-Origin: * on every answer, OPTIONS preflights answered.
// Server::stop() ends the streams in flight with finish_reason "length" and data: [DONE], the other requests in
// flight with a 503 (their threads are woken at once; the engine cancels them at its next step).
//
// Conversation-state cache (--cache-mb): after a request, the sequence state (KV cache, conv and recurrent state) is
// kept, keyed by its token ids, at two points: after the prompt's messages (before the generation prompt) and after
// the generated answer. A later request whose prompt extends a cached sequence starts from it and prefills only the
// new ids (usage.prompt_tokens_details.cached_tokens). Host memory (a StateStore: allocated at the start,
// page-locked with CUDA), least recently used first out.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "model/model.h"

namespace hy::server {

struct ServerParams {
    std::string model_dir;
    std::string host = "127.0.0.1";
    int port = 8080;                 // 0: any free port (the one taken is printed and returned by bind())
    std::string alias;               // model id in the API (default: the folder's name)
    std::string api_key;             // non-empty: /v1/* need "Authorization: Bearer KEY"
    std::string chat_template_file;  // overrides the folder's template
    int n_slots = 4;
    int n_ctx = 4096;  // positions per slot; 0: the model's trained context (config.json max_position_embeddings)
    int n_threads = 0;
    int max_batch_tokens = 512;
    Device device = Device::auto_select;
    bool cuda_graphs = true;
    size_t cache_mb = 1024;  // the conversation-state cache's host memory; 0: off
    int http_threads = 0;    // connections served at once, a thread each; 0: 4 per slot + 8, at least 512
    // A connection that sends no request for idle_timeout is closed; a request must arrive within request_timeout
    // of its first byte, plus 1 s per 64 KiB of body (408 past it). See server/http.h.
    std::chrono::milliseconds idle_timeout{5000};
    std::chrono::milliseconds request_timeout{10000};
    bool verbose = false;        // log each request on stderr
    bool dummy_weights = false;  // random weights from config.json's shapes (load benchmarks without a checkpoint)
    WeightQuant quant = WeightQuant::none;  // --quant: quantize 16-bit weights at load (ModelParams::quant)
    int quant_group = 0;                    // --quant int8:G / int4:G (ModelParams::quant_group; 0: the default)
    bool quant_lm_head = false;             // --quant-lm-head (ModelParams::quant_lm_head)
};

class Server {
public:
    // Loads the tokenizer, the chat template (a chat_template_file must render a one-message conversation) and the
    // model; throws hy::Error.
    explicit Server(const ServerParams& params);
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    // Binds the listening socket (SO_REUSEADDR, not SO_REUSEPORT: a port another server listens on is refused);
    // returns the port (throws Error(io) when it cannot bind).
    int bind();
    // Serves until stop(); returns false when listening failed.
    bool serve();
    // Stops serving (thread-safe, callable from a signal-watching thread).
    void stop();
    // After stop(): waits until no request is generating and every event stream has ended (those cut by stop() end
    // within a step), at most `limit`; false when some were still open. Connections that are idle or still
    // sending a request are not waited for (destroying the Server waits for them).
    bool drain(std::chrono::milliseconds limit);

    // One line on the loaded model: backend, slots, context, chat template.
    std::string summary() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace hy::server
