// message.cpp: FlatBuffers <-> C++ message conversion and the validation rules.
#include "transport/message.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "transport/command_codec.h"
#include "transport/schema/cleave_generated.h"

namespace cleave::transport {
namespace fb = ::cleave::wire;

// ---------------------------------------------------------------------------
// Payload

Payload Payload::own(std::vector<std::byte> bytes) {
  auto holder = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  Payload p;
  p.data_ = holder->data();
  p.size_ = holder->size();
  p.owner_ = std::move(holder);
  return p;
}

Payload Payload::copy_of(std::span<const std::byte> bytes) {
  return own(std::vector<std::byte>(bytes.begin(), bytes.end()));
}

Payload Payload::borrow(const void* data, size_t size, std::shared_ptr<const void> owner) {
  if (size && !data) throw std::invalid_argument("Payload::borrow: null data with nonzero size");
  if (!owner) throw std::invalid_argument("Payload::borrow: owner must not be null (use borrow_unowned)");
  Payload p;
  p.data_ = static_cast<const std::byte*>(data);
  p.size_ = size;
  p.owner_ = std::move(owner);
  return p;
}

Payload Payload::borrow_unowned(const void* data, size_t size) {
  if (size && !data) throw std::invalid_argument("Payload::borrow_unowned: null data with nonzero size");
  Payload p;
  p.data_ = static_cast<const std::byte*>(data);
  p.size_ = size;
  return p;
}

Payload Payload::of_floats(std::shared_ptr<const std::vector<float>> values) {
  if (!values) throw std::invalid_argument("Payload::of_floats: null vector");
  const void* data = values->data();
  const size_t size = values->size() * sizeof(float);
  return borrow(data, size, std::move(values));
}

// ---------------------------------------------------------------------------
// Names

const char* tensor_kind_name(TensorKind kind) {
  switch (kind) {
    case TensorKind::kActivation: return "activation";
    case TensorKind::kGradient: return "gradient";
    case TensorKind::kInput: return "input";
    case TensorKind::kLabels: return "labels";
  }
  return "?";
}

const char* body_kind_name(const Body& body) {
  static const char* const kNames[] = {"register", "assign",  "tensor", "weights", "heartbeat",
                                        "command",  "ack",     "error",  "metrics", "probe",
                                        "secagg"};
  static_assert(std::variant_size_v<Body> == 11);
  return kNames[body.index()];
}

size_t expected_payload_frames(const Body& body) {
  if (std::holds_alternative<TensorMsg>(body) || std::holds_alternative<WeightsMsg>(body) ||
      std::holds_alternative<ProbeMsg>(body))
    return 1;
  if (const auto* s = std::get_if<SecAggMsg>(&body); s && s->phase == SecAggPhase::kMasked) return 1;
  return 0;
}

const char* secagg_phase_name(SecAggPhase phase) {
  static const char* const kNames[] = {"keys", "roster", "shares", "delivery", "masked", "unmask", "reveal"};
  const auto i = static_cast<size_t>(phase);
  return i < std::size(kNames) ? kNames[i] : "?";
}

bool is_z85_key(std::string_view text) {
  static constexpr std::string_view kAlphabet =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (text.size() != 40) return false;
  for (char c : text)
    if (kAlphabet.find(c) == std::string_view::npos) return false;
  return true;
}

// ---------------------------------------------------------------------------
// Validation

namespace {

using detail::check_key;
using detail::check_string;

std::string check_peer(const char* field, const std::optional<PeerInfo>& peer,
                       const DecodeLimits& limits) {
  if (!peer) return {};
  std::string e = check_key((std::string(field) + ".public_key").c_str(), peer->public_key);
  if (e.empty()) e = check_string("peer endpoint", peer->endpoint, limits);
  if (e.empty()) e = check_string("peer name", peer->name, limits);
  return e;
}

bool valid_encoding(Encoding e) {
  return e == Encoding::kF32 || e == Encoding::kF16 || e == Encoding::kInt8;
}

// Element count of `shape`, or an error string; caps at `max_elements`.
std::string shape_elements(const std::vector<int64_t>& shape, uint64_t max_elements,
                           uint64_t& out) {
  if (shape.size() > kMaxRank)
    return "tensor rank " + std::to_string(shape.size()) + " exceeds " + std::to_string(kMaxRank);
  uint64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) return "tensor dim " + std::to_string(i) + " is negative (" +
                             std::to_string(shape[i]) + ")";
    const uint64_t d = static_cast<uint64_t>(shape[i]);
    if (d != 0 && n > max_elements / d)
      return "tensor shape has more elements than the payload limit allows (dim " +
             std::to_string(i) + " = " + std::to_string(shape[i]) + ")";
    n *= d;
  }
  out = n;
  return {};
}

struct Validator {
  const Message& m;
  const DecodeLimits& limits;

  std::string payload_size(size_t expected) const {
    const size_t got = m.payloads[0].size();
    if (got != expected)
      return "payload frame is " + std::to_string(got) + " bytes but the header implies " +
             std::to_string(expected);
    return {};
  }

  std::string operator()(const RegisterMsg& r) const {
    if (r.device_name.empty()) return "register: empty device_name";
    for (const auto* s : {&r.device_name, &r.peer_endpoint, &r.software_version, &r.details_json})
      if (auto e = check_string("register string", *s, limits); !e.empty()) return e;
    if (r.backends.size() > 64) return "register: more than 64 backends";
    for (const auto& b : r.backends)
      if (auto e = check_string("register backend", b, limits); !e.empty()) return e;
    if (r.memory_free > r.memory_total) return "register: memory_free exceeds memory_total";
    if (!std::isfinite(r.compute_gflops) || r.compute_gflops < 0)
      return "register: compute_gflops must be finite and >= 0";
    return check_key("register.public_key", r.public_key);
  }
  std::string operator()(const AssignMsg& a) const {
    if (a.num_stages < 1) return "assign: num_stages must be >= 1";
    if (a.stage < 0 || a.stage >= a.num_stages)
      return "assign: stage " + std::to_string(a.stage) + " outside [0, " +
             std::to_string(a.num_stages) + ")";
    if (a.layer_begin < 0 || a.layer_end < a.layer_begin)
      return "assign: invalid layer range [" + std::to_string(a.layer_begin) + ", " +
             std::to_string(a.layer_end) + ")";
    if (auto e = check_string("assign.model_spec_json", a.model_spec_json, limits); !e.empty()) return e;
    if (auto e = detail::validate_assign_job(a, limits); !e.empty()) return e;
    if (!valid_encoding(a.link_encoding)) return "assign: unknown link encoding";
    if (auto e = check_peer("assign.prev", a.prev, limits); !e.empty()) return e;
    return check_peer("assign.next", a.next, limits);
  }
  std::string operator()(const TensorMsg& t) const {
    if (static_cast<uint8_t>(t.kind) > 3) return "tensor: unknown tensor kind";
    if (t.step < 0) return "tensor: negative step " + std::to_string(t.step);
    if (t.micro_batch < 0) return "tensor: negative micro_batch " + std::to_string(t.micro_batch);
    if (!valid_encoding(t.encoding)) return "tensor: unknown encoding";
    if (t.encoding == Encoding::kInt8 && (!std::isfinite(t.scale) || t.scale < 0))
      return "tensor: int8 scale must be finite and >= 0";
    const size_t es = encoded_element_size(t.encoding);
    uint64_t n = 0;
    if (auto e = shape_elements(t.shape, limits.max_payload_bytes / es, n); !e.empty())
      return "tensor: " + e;
    if (auto e = payload_size(static_cast<size_t>(n) * es); !e.empty())
      return "tensor: " + e;
    return {};
  }
  std::string operator()(const WeightsMsg& w) const {
    if (w.stage < 0) return "weights: negative stage";
    if (w.round < 0) return "weights: negative round";
    if (w.sample_count < 0) return "weights: negative sample_count";
    if (w.num_elements < 0) return "weights: negative num_elements";
    if (static_cast<uint64_t>(w.num_elements) > limits.max_payload_bytes / sizeof(float))
      return "weights: num_elements exceeds the payload limit";
    if (auto e = payload_size(static_cast<size_t>(w.num_elements) * sizeof(float)); !e.empty())
      return "weights: " + e;
    return {};
  }
  std::string operator()(const HeartbeatMsg&) const { return {}; }
  std::string operator()(const CommandMsg& c) const { return detail::validate_command(c, limits); }
  std::string operator()(const AckMsg& a) const { return check_string("ack.detail", a.detail, limits); }
  std::string operator()(const ErrorMsg& e) const {
    return check_string("error.message", e.message, limits);
  }
  std::string operator()(const MetricsMsg& mm) const {
    if (mm.stage < 0) return "metrics: negative stage";
    if (mm.step < 0) return "metrics: negative step";
    if (mm.correct < 0 || mm.sample_count < 0) return "metrics: negative counts";
    if (mm.correct > mm.sample_count) return "metrics: correct exceeds sample_count";
    if (static_cast<uint8_t>(mm.phase) > 2) return "metrics: unknown phase";
    if (mm.round < 0 || mm.local_steps < 0) return "metrics: negative round or local_steps";
    return {};
  }
  std::string operator()(const ProbeMsg& p) const {
    if (p.payload_bytes > limits.max_payload_bytes) return "probe: payload_bytes exceeds the limit";
    if (auto e = payload_size(static_cast<size_t>(p.payload_bytes)); !e.empty())
      return "probe: " + e;
    return {};
  }
  std::string operator()(const SecAggMsg& s) const {
    if (static_cast<uint8_t>(s.phase) > 6) return "secagg: unknown phase";
    if (s.round < 0) return "secagg: negative round";
    if (s.items.size() > kMaxSecAggClients || s.survivors.size() > kMaxSecAggClients ||
        s.dropped.size() > kMaxSecAggClients)
      return "secagg: more than " + std::to_string(kMaxSecAggClients) + " clients";
    for (const auto& it : s.items) {
      if (it.index < 1 || it.index > static_cast<int32_t>(kMaxSecAggClients))
        return "secagg: client index " + std::to_string(it.index) + " outside [1, " +
               std::to_string(kMaxSecAggClients) + "]";
      if (it.a.size() > kMaxSecAggField || it.b.size() > kMaxSecAggField || it.mac.size() > kMaxSecAggField)
        return "secagg: an item field exceeds " + std::to_string(kMaxSecAggField) + " bytes";
    }
    for (const auto* v : {&s.survivors, &s.dropped})
      for (int32_t i : *v)
        if (i < 1 || i > static_cast<int32_t>(kMaxSecAggClients)) return "secagg: client index out of range";
    if (s.sample_count < 0 || s.num_elements < 0) return "secagg: negative sample_count or num_elements";
    if (s.phase != SecAggPhase::kMasked) return {};
    if (static_cast<uint64_t>(s.num_elements) > limits.max_payload_bytes / sizeof(uint64_t))
      return "secagg: num_elements exceeds the payload limit";
    if (auto e = payload_size(static_cast<size_t>(s.num_elements) * sizeof(uint64_t)); !e.empty())
      return "secagg: " + e;
    return {};
  }
};

}  // namespace

bool header_may_be_large(const Body& body) {
  if (std::holds_alternative<AssignMsg>(body) || std::holds_alternative<AckMsg>(body)) return true;
  const auto* c = std::get_if<CommandMsg>(&body);
  return c && std::holds_alternative<ProfileCmd>(c->command);
}

std::string validate_message(const Message& message, const DecodeLimits& limits) {
  const size_t want = expected_payload_frames(message.body);
  if (message.payloads.size() != want)
    return std::string(body_kind_name(message.body)) + " carries " + std::to_string(want) +
           " payload frame(s) but " + std::to_string(message.payloads.size()) + " arrived";
  for (const auto& p : message.payloads)
    if (p.size() > limits.max_payload_bytes)
      return "payload frame of " + std::to_string(p.size()) + " bytes exceeds the limit " +
             std::to_string(limits.max_payload_bytes);
  return std::visit(Validator{message, limits}, message.body);
}

// ---------------------------------------------------------------------------
// Encoding (C++ -> FlatBuffers)

namespace {

using Builder = flatbuffers::FlatBufferBuilder;

flatbuffers::Offset<fb::Peer> build_peer(Builder& b, const std::optional<PeerInfo>& p) {
  if (!p) return 0;
  return fb::CreatePeerDirect(b, p->endpoint.c_str(), p->public_key.c_str(), p->name.c_str());
}

struct BodyBuilder {
  Builder& b;
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const RegisterMsg& r) const {
    std::vector<flatbuffers::Offset<flatbuffers::String>> backends;
    for (const auto& s : r.backends) backends.push_back(b.CreateString(s));
    auto off = fb::CreateRegisterDirect(b, r.device_name.c_str(), &backends, r.memory_total,
                                        r.memory_free, r.compute_gflops, r.peer_endpoint.c_str(),
                                        r.public_key.c_str(), r.software_version.c_str(),
                                        r.details_json.c_str());
    return {fb::Body::Register, off.Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const AssignMsg& a) const {
    auto prev = build_peer(b, a.prev);
    auto next = build_peer(b, a.next);
    auto optimizer = detail::build_optimizer(b, a.optimizer);
    auto [job_type, job] = detail::build_job(b, a.job);
    auto off = fb::CreateAssignDirect(b, a.stage, a.num_stages, a.layer_begin, a.layer_end,
                                      a.model_spec_json.c_str(), optimizer, job_type, job, prev, next,
                                      static_cast<fb::Encoding>(a.link_encoding));
    return {fb::Body::Assign, off.Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const TensorMsg& t) const {
    auto off = fb::CreateTensorDirect(b, static_cast<fb::TensorKind>(t.kind), t.step, t.micro_batch,
                                      &t.shape, fb::DType::Float32,
                                      static_cast<fb::Encoding>(t.encoding), t.scale);
    return {fb::Body::Tensor, off.Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const WeightsMsg& w) const {
    auto off = fb::CreateWeights(b, w.stage, w.round, w.sample_count, w.num_elements);
    return {fb::Body::Weights, off.Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const HeartbeatMsg& h) const {
    return {fb::Body::Heartbeat, fb::CreateHeartbeat(b, h.sequence, h.sent_unix_ms).Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const CommandMsg& c) const {
    return {fb::Body::Command, detail::build_command(b, c).Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const AckMsg& a) const {
    return {fb::Body::Ack, fb::CreateAckDirect(b, a.request_id, a.detail.c_str()).Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const ErrorMsg& e) const {
    auto off = fb::CreateErrorDirect(b, static_cast<fb::ErrorCode>(e.code), e.message.c_str(),
                                     e.request_id);
    return {fb::Body::Error, off.Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const MetricsMsg& m) const {
    auto off = fb::CreateMetrics(b, m.stage, m.step, m.loss_sum, m.correct, m.sample_count, m.step_ms,
                                 m.train_ms, m.local_steps, static_cast<fb::SplitPhase>(m.phase), m.round, m.job_id,
                                 m.plan_epoch);
    return {fb::Body::Metrics, off.Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const ProbeMsg& p) const {
    return {fb::Body::Probe, fb::CreateProbe(b, p.sequence, p.payload_bytes, p.echo).Union()};
  }
  std::pair<fb::Body, flatbuffers::Offset<void>> operator()(const SecAggMsg& s) const {
    std::vector<flatbuffers::Offset<fb::SecAggItem>> items;
    for (const auto& it : s.items)
      items.push_back(fb::CreateSecAggItemDirect(b, it.index, &it.a, &it.b, &it.mac));
    auto off = fb::CreateSecAggDirect(b, s.round, static_cast<fb::SecAggPhase>(s.phase), &items, &s.survivors,
                                      &s.dropped, s.sample_count, s.num_elements);
    return {fb::Body::SecAgg, off.Union()};
  }
};

}  // namespace

std::vector<std::byte> encode_header(const Message& message) {
  DecodeLimits unlimited;
  unlimited.max_header_bytes = std::numeric_limits<size_t>::max();
  unlimited.max_payload_bytes = std::numeric_limits<size_t>::max() / 8;
  unlimited.max_string_bytes = std::numeric_limits<size_t>::max();
  if (auto e = validate_message(message, unlimited); !e.empty())
    throw std::invalid_argument("encode_header: invalid " + std::string(body_kind_name(message.body)) +
                                " message: " + e);
  Builder b(256);
  auto [type, body] = std::visit(BodyBuilder{b}, message.body);
  auto env = fb::CreateEnvelope(b, kProtocolVersion, message.request_id, type, body);
  fb::FinishEnvelopeBuffer(b, env);
  const auto* p = reinterpret_cast<const std::byte*>(b.GetBufferPointer());
  return std::vector<std::byte>(p, p + b.GetSize());
}

// ---------------------------------------------------------------------------
// Decoding (untrusted FlatBuffers -> C++)

namespace {

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

std::optional<PeerInfo> peer(const fb::Peer* p) {
  if (!p) return std::nullopt;
  return PeerInfo{str(p->endpoint()), str(p->public_key()), str(p->name())};
}

Result<Message> reject(std::string why) {
  return Failure{FailureKind::kRejected, std::move(why), {}};
}

std::vector<uint8_t> ubytes(const flatbuffers::Vector<uint8_t>* v) {
  std::vector<uint8_t> out;
  if (v) out.assign(v->begin(), v->end());
  return out;
}

std::vector<int32_t> int_list(const flatbuffers::Vector<int32_t>* v) {
  std::vector<int32_t> out;
  if (v) out.assign(v->begin(), v->end());
  return out;
}

std::string read_secagg(const fb::SecAgg& in, Body& out) {
  const auto phase = static_cast<uint8_t>(in.phase());
  if (phase > 6) return "secagg: unknown phase " + std::to_string(phase);
  SecAggMsg s;
  s.round = in.round();
  s.phase = static_cast<SecAggPhase>(phase);
  if (in.items()) {
    if (in.items()->size() > kMaxSecAggClients) return "secagg: more than " + std::to_string(kMaxSecAggClients) + " items";
    for (const auto* it : *in.items())
      s.items.push_back({it->index(), ubytes(it->a()), ubytes(it->b()), ubytes(it->mac())});
  }
  s.survivors = int_list(in.survivors());
  s.dropped = int_list(in.dropped());
  s.sample_count = in.sample_count();
  s.num_elements = in.num_elements();
  out = std::move(s);
  return {};
}

// Converts a verified envelope; returns an error string for unknown enum values.
std::string convert(const fb::Envelope& env, Body& out) {
  // The Verifier accepts a union type without a value (null tables are legal).
  if (env.body_type() != fb::Body::NONE && env.body() == nullptr)
    return "message kind " + std::to_string(static_cast<int>(env.body_type())) + " without a body";
  switch (env.body_type()) {
    case fb::Body::Register: {
      const auto* r = env.body_as_Register();
      RegisterMsg m;
      m.device_name = str(r->device_name());
      if (r->backends())
        for (const auto* s : *r->backends()) m.backends.push_back(str(s));
      m.memory_total = r->memory_total();
      m.memory_free = r->memory_free();
      m.compute_gflops = r->compute_gflops();
      m.peer_endpoint = str(r->peer_endpoint());
      m.public_key = str(r->public_key());
      m.software_version = str(r->software_version());
      m.details_json = str(r->details_json());
      out = std::move(m);
      return {};
    }
    case fb::Body::Assign: {
      const auto* a = env.body_as_Assign();
      AssignMsg m;
      m.stage = a->stage();
      m.num_stages = a->num_stages();
      m.layer_begin = a->layer_begin();
      m.layer_end = a->layer_end();
      m.model_spec_json = str(a->model_spec_json());
      if (auto e = detail::read_optimizer(a->optimizer(), m.optimizer); !e.empty()) return e;
      if (auto e = detail::read_job(*a, m.job); !e.empty()) return e;
      m.prev = peer(a->prev());
      m.next = peer(a->next());
      const auto enc = static_cast<uint8_t>(a->link_encoding());
      if (enc > 2) return "assign: unknown link encoding " + std::to_string(enc);
      m.link_encoding = static_cast<Encoding>(enc);
      out = std::move(m);
      return {};
    }
    case fb::Body::Tensor: {
      const auto* t = env.body_as_Tensor();
      TensorMsg m;
      const auto kind = static_cast<uint8_t>(t->kind());
      if (kind > 3) return "tensor: unknown tensor kind " + std::to_string(static_cast<int8_t>(kind));
      m.kind = static_cast<TensorKind>(kind);
      m.step = t->step();
      m.micro_batch = t->micro_batch();
      if (t->shape()) {
        if (t->shape()->size() > kMaxRank)
          return "tensor rank " + std::to_string(t->shape()->size()) + " exceeds " +
                 std::to_string(kMaxRank);
        // The Verifier only checks 4-byte alignment of vectors, so int64
        // elements may be misaligned in a hostile buffer: copy bytewise.
        const auto* raw = reinterpret_cast<const uint8_t*>(t->shape()->Data());
        m.shape.resize(t->shape()->size());
        if (!m.shape.empty()) std::memcpy(m.shape.data(), raw, m.shape.size() * sizeof(int64_t));
      }
      if (t->dtype() != fb::DType::Float32)
        return "tensor: unsupported dtype " + std::to_string(static_cast<int>(t->dtype()));
      const auto enc = static_cast<uint8_t>(t->encoding());
      if (enc > 2) return "tensor: unknown encoding " + std::to_string(static_cast<int8_t>(enc));
      m.encoding = static_cast<Encoding>(enc);
      m.scale = t->scale();
      out = std::move(m);
      return {};
    }
    case fb::Body::Weights: {
      const auto* w = env.body_as_Weights();
      out = WeightsMsg{w->stage(), w->round(), w->sample_count(), w->num_elements()};
      return {};
    }
    case fb::Body::Heartbeat: {
      const auto* h = env.body_as_Heartbeat();
      out = HeartbeatMsg{h->sequence(), h->sent_unix_ms()};
      return {};
    }
    case fb::Body::Command: {
      CommandMsg c;
      if (auto e = detail::read_command(*env.body_as_Command(), c); !e.empty()) return e;
      out = std::move(c);
      return {};
    }
    case fb::Body::Ack: {
      const auto* a = env.body_as_Ack();
      out = AckMsg{a->request_id(), str(a->detail())};
      return {};
    }
    case fb::Body::Error: {
      const auto* e = env.body_as_Error();
      const auto code = static_cast<int32_t>(e->code());
      // Unknown error codes from newer peers are mapped to kUnknown, not rejected.
      const ErrorCode c = (code >= 0 && code <= 8) ? static_cast<ErrorCode>(code) : ErrorCode::kUnknown;
      out = ErrorMsg{c, str(e->message()), e->request_id()};
      return {};
    }
    case fb::Body::Metrics: {
      const auto* m = env.body_as_Metrics();
      const auto phase = static_cast<uint8_t>(m->phase());
      if (phase > 2) return "metrics: unknown phase " + std::to_string(phase);
      out = MetricsMsg{m->stage(),   m->step(),     m->loss_sum(),    m->correct(),
                       m->sample_count(), m->step_ms(), m->train_ms(), m->local_steps(),
                       static_cast<SplitPhase>(phase), m->round(), m->job_id(), m->plan_epoch()};
      return {};
    }
    case fb::Body::Probe: {
      const auto* p = env.body_as_Probe();
      out = ProbeMsg{p->sequence(), p->payload_bytes(), p->echo()};
      return {};
    }
    case fb::Body::SecAgg: return read_secagg(*env.body_as_SecAgg(), out);
    case fb::Body::NONE:
      return "message has no body";
  }
  return "unknown message kind " + std::to_string(static_cast<int>(env.body_type()));
}

}  // namespace

Result<Message> decode_message(std::span<const std::byte> header, std::span<const Payload> payloads,
                               const DecodeLimits& limits) {
  if (header.size() > limits.max_header_bytes)
    return reject("header frame of " + std::to_string(header.size()) + " bytes exceeds the limit " +
                  std::to_string(limits.max_header_bytes));
  if (header.size() < 8) return reject("header frame of " + std::to_string(header.size()) +
                                       " bytes is too short for a FlatBuffer");
  // ZeroMQ frames are not aligned; FlatBuffers reads scalars in place, so verify
  // and read an aligned copy (the header is small; payloads are never copied here).
  std::vector<uint64_t> aligned((header.size() + 7) / 8);
  std::memcpy(aligned.data(), header.data(), header.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(aligned.data());
  if (!fb::EnvelopeBufferHasIdentifier(bytes))
    return reject("header frame is not a cleave envelope (file identifier mismatch)");
  flatbuffers::Verifier verifier(bytes, header.size(), /*max_depth=*/16, /*max_tables=*/4096);
  if (!fb::VerifyEnvelopeBuffer(verifier))
    return reject("header frame failed FlatBuffers verification (truncated or corrupt)");
  const fb::Envelope* env = fb::GetEnvelope(bytes);
  if (env->version() != kProtocolVersion)
    return reject("unsupported protocol version " + std::to_string(env->version()) +
                  " (this build speaks " + std::to_string(kProtocolVersion) + ")");
  Message message;
  message.request_id = env->request_id();
  if (auto e = convert(*env, message.body); !e.empty()) return reject(e);
  if (!header_may_be_large(message.body) && header.size() > limits.max_control_bytes)
    return reject(std::string(body_kind_name(message.body)) + ": header frame of " + std::to_string(header.size()) +
                  " bytes exceeds the limit of " + std::to_string(limits.max_control_bytes) +
                  " bytes for control messages (only assign, profile and ack may be larger)");
  message.payloads.assign(payloads.begin(), payloads.end());
  if (auto e = validate_message(message, limits); !e.empty()) return reject(e);
  return message;
}

std::optional<uint16_t> envelope_version(std::span<const std::byte> header) {
  if (header.size() < 8 || header.size() > (64u << 20)) return std::nullopt;
  std::vector<uint64_t> aligned((header.size() + 7) / 8);
  std::memcpy(aligned.data(), header.data(), header.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(aligned.data());
  if (!fb::EnvelopeBufferHasIdentifier(bytes)) return std::nullopt;
  // Only the envelope's own table is read: its version field is the same in
  // every version, whatever the body is.
  flatbuffers::Verifier verifier(bytes, header.size(), /*max_depth=*/2, /*max_tables=*/4);
  const auto root = flatbuffers::ReadScalar<flatbuffers::uoffset_t>(bytes);
  if (root > header.size() - 4) return std::nullopt;
  const auto* env = reinterpret_cast<const flatbuffers::Table*>(bytes + root);
  if (!env->VerifyTableStart(verifier) || !env->VerifyField<uint16_t>(verifier, fb::Envelope::VT_VERSION, 2))
    return std::nullopt;
  return env->GetField<uint16_t>(fb::Envelope::VT_VERSION, 0);
}

std::vector<std::byte> encode_version_error(uint16_t version, const std::string& text) {
  Builder b(256);
  auto error = fb::CreateErrorDirect(b, fb::ErrorCode::UnsupportedVersion, text.c_str(), 0);
  auto env = fb::CreateEnvelope(b, version, 0, fb::Body::Error, error.Union());
  fb::FinishEnvelopeBuffer(b, env);
  const auto* p = reinterpret_cast<const std::byte*>(b.GetBufferPointer());
  return std::vector<std::byte>(p, p + b.GetSize());
}

// ---------------------------------------------------------------------------
// Float helpers

namespace {

uint64_t checked_numel(const std::vector<int64_t>& shape) {
  uint64_t n = 0;
  if (auto e = shape_elements(shape, std::numeric_limits<uint64_t>::max() / 8, n); !e.empty())
    throw std::invalid_argument(e);
  return n;
}

}  // namespace

Message make_tensor_message(TensorMsg header, const float* values, size_t count,
                            std::shared_ptr<const void> owner) {
  if (checked_numel(header.shape) != count)
    throw std::invalid_argument("make_tensor_message: " + std::to_string(count) +
                                " values for a shape of " +
                                std::to_string(checked_numel(header.shape)) + " elements");
  Message m;
  if (header.encoding == Encoding::kF32) {
    header.scale = 0.0f;
    m.payloads.push_back(owner ? Payload::borrow(values, count * sizeof(float), std::move(owner))
                               : Payload::borrow_unowned(values, count * sizeof(float)));
  } else {
    EncodedPayload enc = encode_payload(std::span<const float>(values, count), header.encoding);
    header.scale = enc.scale;
    m.payloads.push_back(Payload::own(std::move(enc.bytes)));
  }
  m.body = std::move(header);
  return m;
}

Message make_tensor_message(TensorMsg header, std::shared_ptr<const std::vector<float>> values) {
  if (!values) throw std::invalid_argument("make_tensor_message: null values");
  const float* data = values->data();
  const size_t count = values->size();
  return make_tensor_message(std::move(header), data, count, std::move(values));
}

std::vector<float> tensor_values(const Message& message) {
  const auto* t = std::get_if<TensorMsg>(&message.body);
  if (!t) throw std::invalid_argument(std::string("tensor_values: message is ") +
                                      body_kind_name(message.body) + ", not tensor");
  if (message.payloads.size() != 1)
    throw std::invalid_argument("tensor_values: tensor message without exactly one payload frame");
  return decode_payload(message.payloads[0].bytes(), t->encoding, t->scale);
}

Message make_weights_message(WeightsMsg header, const float* values, size_t count,
                             std::shared_ptr<const void> owner) {
  header.num_elements = static_cast<int64_t>(count);
  Message m;
  m.body = header;
  m.payloads.push_back(owner ? Payload::borrow(values, count * sizeof(float), std::move(owner))
                             : Payload::borrow_unowned(values, count * sizeof(float)));
  return m;
}

std::vector<float> weights_values(const Message& message) {
  if (!std::holds_alternative<WeightsMsg>(message.body) || message.payloads.size() != 1)
    throw std::invalid_argument("weights_values: not a weights message with one payload frame");
  return decode_payload(message.payloads[0].bytes(), Encoding::kF32, 0.0f);
}

Message make_secagg_masked_message(int64_t round, int64_t sample_count, std::vector<uint64_t> values) {
  SecAggMsg s;
  s.round = round;
  s.phase = SecAggPhase::kMasked;
  s.sample_count = sample_count;
  s.num_elements = static_cast<int64_t>(values.size());
  std::vector<std::byte> bytes(values.size() * sizeof(uint64_t));
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t k = 0; k < 8; ++k) bytes[i * 8 + k] = static_cast<std::byte>((values[i] >> (8 * k)) & 0xff);
  Message m;
  m.body = std::move(s);
  m.payloads.push_back(Payload::own(std::move(bytes)));
  return m;
}

std::vector<uint64_t> secagg_masked_values(const Message& message) {
  const auto* s = std::get_if<SecAggMsg>(&message.body);
  if (!s || s->phase != SecAggPhase::kMasked || message.payloads.size() != 1 ||
      message.payloads[0].size() != static_cast<size_t>(s->num_elements) * sizeof(uint64_t))
    throw std::invalid_argument("secagg_masked_values: not a masked secure-aggregation message of its stated size");
  const auto bytes = message.payloads[0].bytes();
  std::vector<uint64_t> out(static_cast<size_t>(s->num_elements));
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t v = 0;
    for (size_t k = 0; k < 8; ++k) v |= static_cast<uint64_t>(std::to_integer<uint8_t>(bytes[i * 8 + k])) << (8 * k);
    out[i] = v;
  }
  return out;
}

Message make_probe_message(uint64_t sequence, uint64_t bytes, bool echo) {
  std::vector<std::byte> filler(static_cast<size_t>(bytes));
  for (size_t i = 0; i < filler.size(); ++i) filler[i] = static_cast<std::byte>((i * 131 + sequence) & 0xff);
  Message m;
  m.body = ProbeMsg{sequence, bytes, echo};
  m.payloads.push_back(Payload::own(std::move(filler)));
  return m;
}

}  // namespace cleave::transport
