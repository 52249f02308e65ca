// zap.cpp: ZAP request loop (RFC 27: version, request id, domain, address,
// identity, mechanism, credentials... -> version, request id, status code,
// status text, user id, metadata).
#include "transport/zap.h"

#include "transport/endpoint_detail.h"

#include <vector>

#include <zmq_addon.hpp>

namespace cleave::transport {
namespace {

// ZMTP metadata (RFC 23): name length (1 byte), name, value length (4 bytes,
// network order), value.
std::string metadata(const std::string& name, const std::string& value) {
  std::string out;
  out += static_cast<char>(name.size());
  out += name;
  const uint32_t n = static_cast<uint32_t>(value.size());
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((n >> shift) & 0xff);
  out += value;
  return out;
}

}  // namespace

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
  stop_.signal();
  if (thread_.joinable()) thread_.join();
  socket_.close();
}

AllowList ZapHandler::set_allow_list(AllowList allow) {
  std::lock_guard lock(allow_mutex_);
  std::swap(allow_, allow);
  return allow;
}

AllowList ZapHandler::allow_list() const {
  std::lock_guard lock(allow_mutex_);
  return allow_;
}

std::optional<std::string> ZapHandler::name_of(const std::string& public_key_z85) const {
  std::lock_guard lock(allow_mutex_);
  return allow_.name_of(public_key_z85);
}

void ZapHandler::decide(const std::string& mechanism, const zmq::message_t* credentials, const std::string& address,
                        std::string& status, std::string& text, std::string& user_id, std::string& key) {
  if (mechanism == "CURVE" && credentials && credentials->size() == 32) {
    char z85[41] = {};
    zmq_z85_encode(z85, static_cast<const uint8_t*>(credentials->data()), 32);
    if (auto name = name_of(z85)) {
      status = "200";
      text = "OK";
      user_id = *name;
      key = z85;
    } else {
      text = "public key not on the allow-list";
      refusals_.log(LogLevel::kWarning, label_ + ": refused CURVE client from " + address + ": public key " + z85 +
                                            " is not on the allow-list");
    }
  } else if (mechanism == "NULL" && allow_null_) {
    status = "200";
    text = "OK";
  } else {
    text = "mechanism " + mechanism + " not allowed";
    refusals_.log(LogLevel::kWarning, label_ + ": refused " + mechanism + " client from " + address +
                                          " (only CURVE with an allow-listed key is admitted)");
  }
}

void ZapHandler::run() {
  for (;;) {
    try {
      if (!detail::wait_in(socket_, stop_)) return;  // the destructor's
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(socket_, std::back_inserter(req), zmq::recv_flags::dontwait)) continue;
      std::string request_id = req.size() > 1 ? req[1].to_string() : std::string();
      std::string status = "400", text = "denied", user_id, key;
      std::string address = req.size() > 3 ? req[3].to_string() : std::string("?");
      if (req.size() < 6 || req[0].to_string_view() != "1.0") {
        status = "500";
        text = "malformed ZAP request";
        log(LogLevel::kError, label_ + ": malformed ZAP request from libzmq");
      } else {
        decide(req[5].to_string(), req.size() >= 7 ? &req[6] : nullptr, address, status, text, user_id, key);
      }
      if (status == "200") ++admitted_;
      else ++denied_;
      const std::string properties = key.empty() ? std::string() : metadata(kKeyProperty, key);
      std::vector<zmq::const_buffer> reply = {zmq::buffer(std::string_view("1.0")),
                                              zmq::buffer(request_id), zmq::buffer(status),
                                              zmq::buffer(text), zmq::buffer(user_id),
                                              zmq::buffer(properties)};
      zmq::send_multipart(socket_, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      log(LogLevel::kError, label_ + ": ZAP handler error: " + e.what());
    }
  }
}

}  // namespace cleave::transport
