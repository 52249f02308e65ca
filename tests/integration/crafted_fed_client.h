// crafted_fed_client.h: a hostile federated client for tests, built from the
// project's own transport code. It holds an allow-listed key of a
// DaemonCluster and speaks the federated protocol exactly as
// core/runtime/daemon/fed_client.cpp does (register, ack the FedJob, answer
// each FedRound with weights + metrics, echo heartbeats, ack Finish), but
// writes what a stolen phone would: any registration details, any sample
// count, and `scale` times the global weights as its update.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "integration/daemon_cluster.h"
#include "transport/endpoint.h"
#include "transport/keys.h"
#include "transport/message.h"

namespace cleave::testing {

struct CraftedBehaviour {
  std::string details_json;   // what it registers with
  int64_t claimed_samples = 1;  // the sample_count of every update and its metrics
  float scale = 1.f;            // its update: scale x the round's global weights
};

class CraftedFedClient {
 public:
  // Dials `endpoint` as device `device` of `cluster` and serves until the job ends or the destructor.
  CraftedFedClient(const DaemonCluster& cluster, int device, std::string endpoint, CraftedBehaviour behaviour)
      : behaviour_(std::move(behaviour)) {
    transport::ClientOptions co;
    co.connect = std::move(endpoint);
    co.keys = transport::load_secret_key(cluster.dir() + "/" + DaemonCluster::name(device) + ".key");
    co.server_public_key = transport::load_public_key(cluster.dir() + "/coordinator.pub");
    co.label = "crafted " + DaemonCluster::name(device);
    name_ = DaemonCluster::name(device);
    endpoint_ = std::make_unique<transport::ClientEndpoint>(co);
    public_key_ = co.keys.public_key;
    thread_ = std::thread([this] { serve(); });
  }
  ~CraftedFedClient() {
    stop_ = true;
    thread_.join();
  }
  // True once a registration went out over an established connection.
  bool registered() const { return registered_; }
  int updates_sent() const { return updates_sent_; }

 private:
  void serve() {
    using namespace transport;
    auto last_register = std::chrono::steady_clock::now() - std::chrono::seconds(10);
    bool assigned = false;
    std::vector<float> global;
    while (!stop_) {
      if (!assigned && std::chrono::steady_clock::now() - last_register > std::chrono::seconds(1) &&
          endpoint_->connected()) {
        RegisterMsg reg{name_, {"cpu"}, uint64_t{1} << 30, uint64_t{1} << 30, 1.0, "", public_key_, "crafted",
                        behaviour_.details_json};
        if (endpoint_->send(message_of(reg))) registered_ = true;
        last_register = std::chrono::steady_clock::now();
      }
      auto got = endpoint_->receive(Millis(50));
      if (!got) continue;
      const Message& m = got.value();
      if (std::holds_alternative<AssignMsg>(m.body)) {
        assigned = true;
        (void)endpoint_->send(message_of(AckMsg{m.request_id, R"({"op": "fed_setup"})"}, m.request_id));
      } else if (std::holds_alternative<HeartbeatMsg>(m.body)) {
        (void)endpoint_->send(m);
      } else if (std::holds_alternative<WeightsMsg>(m.body)) {
        global = weights_values(m);
      } else if (const auto* c = std::get_if<CommandMsg>(&m.body)) {
        if (const auto* fr = std::get_if<FedRoundCmd>(&c->command)) {
          answer_round(*fr, m.request_id, global);
        } else if (std::holds_alternative<FinishCmd>(c->command) || std::holds_alternative<ShutdownCmd>(c->command)) {
          (void)endpoint_->send(message_of(AckMsg{m.request_id, R"({"op": "finish"})"}, m.request_id));
          return;
        }
      }
    }
  }

  void answer_round(const transport::FedRoundCmd& cmd, uint64_t rid, const std::vector<float>& global) {
    using namespace transport;
    auto values = std::make_shared<std::vector<float>>(global);
    for (float& v : *values) v *= behaviour_.scale;
    WeightsMsg w;
    w.stage = 0;
    w.round = cmd.round;
    w.sample_count = behaviour_.claimed_samples;
    w.num_elements = static_cast<int64_t>(values->size());
    Message wm = make_weights_message(w, values->data(), values->size(), values);
    wm.request_id = rid;
    (void)endpoint_->send(wm);
    MetricsMsg mm;
    mm.step = cmd.round;
    mm.loss_sum = 0.01 * static_cast<double>(behaviour_.claimed_samples);
    mm.sample_count = behaviour_.claimed_samples;
    mm.local_steps = 1;
    (void)endpoint_->send(message_of(mm, rid));
    ++updates_sent_;
  }

  CraftedBehaviour behaviour_;
  std::string name_, public_key_;
  std::unique_ptr<transport::ClientEndpoint> endpoint_;
  std::atomic<bool> stop_{false}, registered_{false};
  std::atomic<int> updates_sent_{0};
  std::thread thread_;
};

}  // namespace cleave::testing
