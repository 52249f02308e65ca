// zap.cpp: ZAP request loop (RFC 27: version, request id, domain, address,
// identity, mechanism, credentials... -> version, request id, status code,
// status text, user id, metadata).
#include "transport/zap.h"

#include <vector>

#include <zmq_addon.hpp>

#include "transport/log.h"

namespace cleave::transport {

ZapHandler::ZapHandler(zmq::context_t& context, AllowList allow, bool allow_null, std::string label)
    : socket_(context, zmq::socket_type::rep),
      allow_(std::move(allow)),
      allow_null_(allow_null),
      label_(std::move(label)) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { run(); });
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  socket_.close();
}

void ZapHandler::run() {
  while (!stop_.load()) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(socket_, std::back_inserter(req), zmq::recv_flags::dontwait)) continue;
      std::string request_id = req.size() > 1 ? req[1].to_string() : std::string();
      std::string status = "400", text = "denied", user_id;
      std::string address = req.size() > 3 ? req[3].to_string() : std::string("?");
      if (req.size() < 6 || req[0].to_string_view() != "1.0") {
        status = "500";
        text = "malformed ZAP request";
        log(LogLevel::kError, label_ + ": malformed ZAP request from libzmq");
      } else {
        const std::string mechanism = req[5].to_string();
        if (mechanism == "CURVE" && req.size() >= 7 && req[6].size() == 32) {
          char z85[41] = {};
          zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
          if (auto name = allow_.name_of(z85)) {
            status = "200";
            text = "OK";
            user_id = *name;
          } else {
            text = "public key not on the allow-list";
            log(LogLevel::kWarning, label_ + ": refused CURVE client from " + address +
                                        ": public key " + z85 + " is not on the allow-list");
          }
        } else if (mechanism == "NULL" && allow_null_) {
          status = "200";
          text = "OK";
          user_id = "";
        } else {
          text = "mechanism " + mechanism + " not allowed";
          log(LogLevel::kWarning, label_ + ": refused " + mechanism + " client from " + address +
                                      " (only CURVE with an allow-listed key is admitted)");
        }
      }
      if (status == "200") ++admitted_;
      else ++denied_;
      std::vector<zmq::const_buffer> reply = {zmq::buffer(std::string_view("1.0")),
                                              zmq::buffer(request_id), zmq::buffer(status),
                                              zmq::buffer(text), zmq::buffer(user_id),
                                              zmq::const_buffer()};
      zmq::send_multipart(socket_, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      log(LogLevel::kError, label_ + ": ZAP handler error: " + e.what());
    }
  }
}

}  // namespace cleave::transport
