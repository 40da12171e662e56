// `trl serve`'s HTTP side (docs/SERVE.md): the OpenAI endpoints over a ContinuousBatcher, on cpp-httplib.
// The server listens before the model is loaded (GET /health answers 503 until ready()), answers each request from
// a thread of its pool while the batcher's thread generates, and on stop(drain) refuses new requests, lets the
// running ones finish, then closes.
#pragma once

#include <memory>
#include <string>

#include "serve/openai.h"
#include "trl/generation/continuous.h"

namespace trl::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                       // 0: any free port (port() says which)
  std::string api_key;                   // when set: "Authorization: Bearer KEY" on every endpoint but /health
  int64_t max_request_bytes = 8 << 20;   // larger bodies: 413
  int threads = 0;                       // HTTP threads; 0: max_batch + max_queue + 8
  bool verbose = false;                  // a line per request on stderr
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  // Binds the address (an Error that names it when it is taken) and starts answering: 503 until ready().
  void start();
  int port() const;
  // The model is loaded: requests go to `batcher` (which must outlive the server or stop()).
  void ready(ContinuousBatcher& batcher, ServedModels served);
  // Refuses new requests (503); with drain, the running ones finish first. Returns when the server has closed.
  void stop(bool drain);
  // Blocks until stop() has closed the server.
  void wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trl::serve
