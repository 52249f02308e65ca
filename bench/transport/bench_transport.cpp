// bench_transport: activation-sized messages (64 KiB .. 16 MiB of float32) on
// loopback, one sender thread and one receiver, in five configurations:
//   raw        ZeroMQ DEALER -> ROUTER, one frame, no security
//   raw+curve  the same with CURVE (the floor cleave's path is compared with)
//   cleave f32 / f16 / int8: ClientEndpoint -> ServerEndpoint with CURVE + ZAP,
//              FlatBuffers header + payload frame, validation, and decoding
//              back to float32 on the receiver (what a stage really needs).
// Throughput is float32 bytes delivered per second (MB/s = 1e6 B/s), median of
// --reps repetitions; "wire" is the payload bytes per message on the wire.
// Usage: bench_transport [--reps 3] [--total-mib 64] [--max-mib 16] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "bench/common/bench_args.h"
#include "core/io/json_file.h"
#include "transport/endpoint.h"
#include "transport/log.h"

using namespace cleave::transport;
using Clock = std::chrono::steady_clock;

namespace {

struct Keys {
  KeyPair server = generate_keypair();
  KeyPair client = generate_keypair();
};

using cleave::bench::median;

// Raw ZeroMQ: `count` single-frame messages of `bytes`; returns seconds.
double run_raw(size_t bytes, int count, const Keys* curve) {
  zmq::context_t ctx;
  zmq::socket_t server(ctx, zmq::socket_type::router), client(ctx, zmq::socket_type::dealer);
  for (auto* s : {&server, &client}) {
    s->set(zmq::sockopt::linger, 0);
    s->set(zmq::sockopt::sndhwm, 1000);
    s->set(zmq::sockopt::rcvhwm, 1000);
  }
  if (curve) {
    server.set(zmq::sockopt::curve_server, 1);
    server.set(zmq::sockopt::curve_secretkey, curve->server.secret_key);
    client.set(zmq::sockopt::curve_serverkey, curve->server.public_key);
    client.set(zmq::sockopt::curve_publickey, curve->client.public_key);
    client.set(zmq::sockopt::curve_secretkey, curve->client.secret_key);
  }
  server.bind("tcp://127.0.0.1:*");
  client.connect(server.get(zmq::sockopt::last_endpoint));
  std::vector<char> data(bytes, 1);
  // Warm-up: one round trip establishes the connection.
  client.send(zmq::buffer(data));
  std::vector<zmq::message_t> frames;
  (void)zmq::recv_multipart(server, std::back_inserter(frames));
  const auto start = Clock::now();
  std::thread sender([&] {
    for (int i = 0; i < count; ++i) client.send(zmq::buffer(data));
  });
  for (int i = 0; i < count; ++i) {
    frames.clear();
    (void)zmq::recv_multipart(server, std::back_inserter(frames));
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  sender.join();
  return s;
}

// cleave's tensor path; returns seconds and sets `wire` to payload bytes per message.
double run_cleave(size_t bytes, int count, Encoding encoding, const Keys& keys, size_t& wire) {
  ServerOptions so;
  so.keys = keys.server;
  so.allow.add("client", keys.client.public_key);
  so.label = "bench-server";
  ServerEndpoint server(so);
  ClientOptions co;
  co.connect = server.endpoint();
  co.keys = keys.client;
  co.server_public_key = keys.server.public_key;
  co.label = "bench-client";
  ClientEndpoint client(co);
  const size_t n = bytes / sizeof(float);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
  auto values = std::make_shared<const std::vector<float>>(std::move(v));
  TensorMsg header;
  header.kind = TensorKind::kActivation;
  header.shape = {static_cast<int64_t>(n / 256), 256};
  header.encoding = encoding;
  auto send_one = [&](int i) {
    TensorMsg h = header;
    h.micro_batch = i;
    Message m = make_tensor_message(h, values);  // f32: zero-copy; f16/int8: encode
    wire = m.payloads[0].size();
    if (!client.send(m)) std::fprintf(stderr, "send failed\n");
  };
  auto receive_one = [&] {
    auto r = server.receive(std::chrono::milliseconds(30000));
    if (!r) {
      std::fprintf(stderr, "receive failed: %s\n", r.failure().message.c_str());
      std::exit(1);
    }
    std::vector<float> out = tensor_values(r->message);  // decode to float32 (copy)
    if (out.size() != n) std::exit(1);
  };
  send_one(0);
  receive_one();
  const auto start = Clock::now();
  std::thread sender([&] {
    for (int i = 0; i < count; ++i) send_one(i + 1);
  });
  for (int i = 0; i < count; ++i) receive_one();
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  sender.join();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_transport: loopback throughput of raw ZeroMQ, CURVE and cleave's tensor path"};
  int reps = 3;
  int total_mib = 64;
  int max_mib = 16;
  std::string json_path;
  app.add_option("--reps", reps, "repetitions per cell (median reported)")->check(CLI::Range(1, 50));
  app.add_option("--total-mib", total_mib, "MiB sent per repetition")->check(CLI::Range(1, 4096));
  app.add_option("--max-mib", max_mib, "largest message size in MiB")->check(CLI::Range(1, 256));
  app.add_option("--json", json_path, "write results as JSON");
  CLI11_PARSE(app, argc, argv);
  set_log_level(LogLevel::kWarning);

  const Keys keys;
  const std::vector<std::string> configs = {"raw", "raw+curve", "cleave-f32", "cleave-f16", "cleave-int8"};
  nlohmann::json results = nlohmann::json::array();
  std::printf("%-9s %10s %10s %11s %11s %11s | %9s %9s %9s | %s\n", "size", "raw", "raw+curve",
              "cleave-f32", "cleave-f16", "cleave-int8", "wire-f32", "wire-f16", "wire-int8",
              "f32/curve");
  for (size_t bytes = 64 << 10; bytes <= (static_cast<size_t>(max_mib) << 20); bytes *= 4) {
    const int count = std::max(4, static_cast<int>((static_cast<size_t>(total_mib) << 20) / bytes));
    std::vector<double> mbps(configs.size());
    std::vector<size_t> wire(configs.size(), bytes);
    for (size_t c = 0; c < configs.size(); ++c) {
      std::vector<double> rates;
      for (int r = 0; r < reps; ++r) {
        double s;
        if (c == 0) s = run_raw(bytes, count, nullptr);
        else if (c == 1) s = run_raw(bytes, count, &keys);
        else s = run_cleave(bytes, count, static_cast<Encoding>(c - 2), keys, wire[c]);
        rates.push_back(static_cast<double>(bytes) * count / s / 1e6);
      }
      mbps[c] = median(rates);
      results.push_back({{"config", configs[c]}, {"message_bytes", bytes}, {"messages", count},
                         {"reps", reps}, {"mb_per_s_median", mbps[c]}, {"rates", rates},
                         {"wire_payload_bytes", wire[c]}});
    }
    char size[32];
    std::snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
    std::printf("%-9s %10.0f %10.0f %11.0f %11.0f %11.0f | %9zu %9zu %9zu | %.2f\n", size, mbps[0],
                mbps[1], mbps[2], mbps[3], mbps[4], wire[2], wire[3], wire[4], mbps[2] / mbps[1]);
    std::fflush(stdout);
  }
  std::printf("MB/s = 1e6 float32 bytes delivered per second (median of %d); wire = payload bytes/message\n", reps);
  if (!json_path.empty()) {
    try {
      cleave::write_json_file(json_path, {{"benchmark", "bench_transport"}, {"results", results}});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_transport: cannot write the results: %s\n", e.what());
      return 1;
    }
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
