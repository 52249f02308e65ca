// message.h: cleave's protocol messages as C++ values, and their wire form.
//
// A `Message` is a body (one of the kinds below) plus raw payload frames.
// On the wire it is a multipart ZeroMQ message: frame 0 is a FlatBuffers
// `cleave.wire.Envelope` (transport/schema/cleave.fbs), frames 1.. are the
// payloads. Tensor / weights / probe bytes live only in payload frames, and a
// payload that the sender already holds in host memory is never copied: a
// `Payload` may borrow memory kept alive by a shared_ptr owner (see below).
//
// `decode_message` is the single entry point for untrusted bytes: FlatBuffers
// Verifier first, then semantic checks (version, kind, frame count, ids >= 0,
// rank and dims sane, element count without overflow, shape x element size ==
// payload bytes, strings and keys well-formed). It never throws on bad input
// and never reads payload memory as floats in place (payloads are unaligned).
// See docs/protocol.md for who sends each message and when.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "transport/codec.h"
#include "transport/result.h"

namespace cleave::transport {

// Bumped whenever the meaning of the wire format changes; receivers reject others.
inline constexpr uint16_t kProtocolVersion = 3;
// Largest tensor rank accepted on the wire.
inline constexpr size_t kMaxRank = 8;
inline constexpr size_t kMaxSecAggClients = 255;  // Shamir over GF(2^8): x in [1, 255]
inline constexpr size_t kMaxSecAggField = 64u << 10;  // bytes in one SecAggItem field

// ---------------------------------------------------------------------------
// Payload frames.

// Bytes of one payload frame. Either owned (a vector held by `owner`) or
// borrowed: `data` points into memory that `owner` keeps alive. Sending a
// Payload shares `owner` with ZeroMQ until the I/O thread is done with the
// bytes, so the sender may drop its Message right after send() returns. A
// Payload with data but no owner (`borrow_unowned`) is copied at send time.
class Payload {
 public:
  Payload() = default;
  // Takes ownership of `bytes`.
  static Payload own(std::vector<std::byte> bytes);
  // Copies `bytes`.
  static Payload copy_of(std::span<const std::byte> bytes);
  // Borrows [data, data + size) kept alive by `owner` (zero-copy on send).
  static Payload borrow(const void* data, size_t size, std::shared_ptr<const void> owner);
  // Borrows memory with no owner: valid only while the caller keeps it alive;
  // send() copies such payloads (it cannot know when the caller frees them).
  static Payload borrow_unowned(const void* data, size_t size);
  // Borrows a float vector held by a shared_ptr (zero-copy f32 tensors).
  static Payload of_floats(std::shared_ptr<const std::vector<float>> values);

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
};

// ---------------------------------------------------------------------------
// Bodies (mirror the tables of cleave.fbs; see docs/protocol.md).

enum class TensorKind : uint8_t { kActivation = 0, kGradient = 1, kInput = 2, kLabels = 3 };
enum class ErrorCode : int32_t {
  kUnknown = 0, kBadMessage = 1, kUnsupportedVersion = 2, kUnexpectedKind = 3,
  kNotAssigned = 4, kShapeMismatch = 5, kInternal = 6, kTimeout = 7, kRefused = 8,
};

const char* tensor_kind_name(TensorKind kind);

struct PeerInfo {
  std::string endpoint;    // "tcp://host:port"; empty: no such neighbour
  std::string public_key;  // Z85 (40 chars); empty only in --insecure runs
  std::string name;        // allow-list name, for logs
  bool operator==(const PeerInfo&) const = default;
};

struct RegisterMsg {  // daemon -> coordinator (0 payload frames)
  std::string device_name;
  std::vector<std::string> backends;
  uint64_t memory_total = 0;  // bytes
  uint64_t memory_free = 0;   // bytes
  double compute_gflops = 0;
  std::string peer_endpoint;
  std::string public_key;
  std::string software_version;
  std::string details_json;
  bool operator==(const RegisterMsg&) const = default;
};

// An optimizer as it travels (core/optim's OptimizerConfig, field for field;
// the runtime converts and validates it).
struct OptimizerSpec {
  std::string kind = "adam";
  float lr = 1e-3f, momentum = 0, dampening = 0, weight_decay = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  bool nesterov = false;
  std::string schedule = "constant";
  int64_t step_size = 1000;
  float gamma = 0.1f;
  int64_t warmup_steps = 0, total_steps = 0;
  float min_lr = 0;
  bool operator==(const OptimizerSpec&) const = default;
};

// Job kinds an assignment carries.
struct PipelineJob {
  uint8_t schedule = 0;  // the pipeline's schedule kind: 0 gpipe, 1 1f1b, 2 zb1 (core/pipeline/schedule.h)
  int32_t microbatches = 1;
  uint64_t seed = 1;
  int64_t batch = 64;
  uint64_t job_id = 0;      // the coordinator's run (random per run)
  uint32_t plan_epoch = 0;  // its plan: 0, then +1 at every re-plan after a lost device
  bool recompute = false;   // the stage recomputes its activations in backward (--recompute)
  bool operator==(const PipelineJob&) const = default;
};
struct FedJob {
  int64_t batch = 64;
  uint64_t seed = 1;
  std::string strategy;  // for logs
  bool operator==(const FedJob&) const = default;
};
enum class SplitRole : uint8_t { kServer = 0, kClient = 1 };
struct SplitJob {
  SplitRole role = SplitRole::kServer;
  bool labels_on_client = false;
  uint64_t seed = 1;
  int64_t batch = 64;
  int64_t eval_batch = 256;
  int32_t epochs = 1;
  std::vector<PeerInfo> clients;  // server: who dials in
  int32_t client_index = 0;       // client
  int64_t limit_test = -1;        // client: -1 = all test samples
  int32_t cut_back = -1;          // client, U-shaped: first tail layer; -1 = no tail
  float activation_noise = 0;     // client: local DP noise multiplier on the cut layer (0: off)
  float activation_clip = 0;      // client: per-sample L2 clip of the cut-layer activation (> 0 with noise)
  bool operator==(const SplitJob&) const = default;
};
using JobSpec = std::variant<PipelineJob, FedJob, SplitJob>;
// "pipeline", "federated", "split"
const char* job_kind_name(const JobSpec& job);

struct AssignMsg {  // coordinator -> daemon (0 payload frames)
  int32_t stage = 0;
  int32_t num_stages = 1;
  int32_t layer_begin = 0;  // [layer_begin, layer_end)
  int32_t layer_end = 0;
  std::string model_spec_json;  // the model file (docs/models.md)
  OptimizerSpec optimizer;
  JobSpec job;
  std::optional<PeerInfo> prev;
  std::optional<PeerInfo> next;
  Encoding link_encoding = Encoding::kF32;
  bool operator==(const AssignMsg&) const = default;
};

// Header of a tensor message; payload frame 0 holds numel(shape) elements in
// `encoding`. (Use TensorMessage in link.h for the float-level view.)
struct TensorMsg {  // (1 payload frame)
  TensorKind kind = TensorKind::kActivation;
  int64_t step = 0;
  int32_t micro_batch = 0;
  std::vector<int64_t> shape;
  Encoding encoding = Encoding::kF32;
  float scale = 0.0f;  // int8 only
  bool operator==(const TensorMsg&) const = default;
};

struct WeightsMsg {  // (1 payload frame: num_elements float32)
  int32_t stage = 0;
  int64_t round = 0;
  int64_t sample_count = 0;
  int64_t num_elements = 0;
  bool operator==(const WeightsMsg&) const = default;
};

struct HeartbeatMsg {  // either direction (0 payload frames)
  uint64_t sequence = 0;
  int64_t sent_unix_ms = 0;
  bool operator==(const HeartbeatMsg&) const = default;
};

// Job commands (coordinator -> daemon, 0 payload frames): docs/protocol.md.
struct ProfileCmd {  // per-layer timings of a model, before any assignment
  std::string model_spec_json;
  int64_t samples = 16;
  std::optional<OptimizerSpec> optimizer;  // also time the optimizer update
  bool split_backward = false;             // time each backward as B then W (zb1)
  int32_t in_flight = 1;                   // micro-batches kept for backward at once (gpipe: M), 1..1024
  bool operator==(const ProfileCmd&) const = default;
};
struct ProbeServeCmd {  // serve link probes to `peer`
  std::string peer, peer_key;
  bool operator==(const ProbeServeCmd&) const = default;
};
struct ProbePeerCmd {  // measure the link to `peer` at `endpoint`
  std::string peer, peer_key, endpoint;
  bool operator==(const ProbePeerCmd&) const = default;
};
struct ProbeStopCmd {
  std::string peer;
  bool operator==(const ProbeStopCmd&) const = default;
};
struct ConnectCmd {  // dial the next stage, accept the previous one
  std::string next_endpoint;
  bool operator==(const ConnectCmd&) const = default;
};
struct StepCmd {  // run the schedule for one batch
  int64_t step = 0;
  int64_t batch = 1;
  uint32_t deadline_ms = 0;  // the longest any one wait of the step may take (0: no deadline)
  uint32_t plan_epoch = 0;   // the plan it belongs to (PipelineJob::plan_epoch): another plan's is refused
  bool operator==(const StepCmd&) const = default;
};
struct FinishCmd {  // end the job
  bool operator==(const FinishCmd&) const = default;
};
struct ShutdownCmd {  // exit the daemon
  bool operator==(const ShutdownCmd&) const = default;
};
enum class StateKind : uint8_t { kParams = 0, kParamsAndOptimizer = 1 };
struct CheckpointCmd {  // send the job's state back as weights messages
  StateKind what = StateKind::kParams;
  bool operator==(const CheckpointCmd&) const = default;
};
// Secure aggregation's settings for one round (issue 18, docs/privacy.md):
// sent with the round's FedRound command to every sampled client.
struct SecAggSetup {
  int32_t threshold = 0;         // t: shares that reconstruct a secret (2 <= t <= clients)
  std::vector<PeerInfo> clients; // the round's clients in roster order (index = position + 1): name, static CURVE key
  float range = 0;               // each coordinate of an update is clamped to [-range, range] (> 0)
  int32_t frac_bits = 0;         // fixed point: round(value x 2^frac_bits) in the ring Z/2^64 (1..40)
  float clip = 0;                // > 0: the client first clips its update's L2 norm to this
  float noise_stddev = 0;        // > 0: the client adds N(0, noise_stddev^2) per coordinate (its share of the DP noise)
  bool weight_by_samples = true; // true: the client masks sample_count x update (FedAvg); false: weight 1 (DP)
  bool operator==(const SecAggSetup&) const = default;
};
struct FedRoundCmd {  // train locally from the global weights that came just before
  int64_t round = 0;
  int32_t local_epochs = 1;
  int64_t batch = 64;
  float mu = 0;  // FedProx
  std::optional<SecAggSetup> secagg;  // set: answer with the secure-aggregation phases, not `weights`
  bool operator==(const FedRoundCmd&) const = default;
};
// kDrop, kRejoin (coordinator -> server): `order` lists client indices to stop
// serving in the running phase, or to give a fresh link (docs/split.md).
enum class SplitPhase : uint8_t { kTrain = 0, kEval = 1, kAverage = 2, kDrop = 3, kRejoin = 4 };
struct SplitRoundCmd {  // one split-learning epoch phase; the server serves clients in `order`
  SplitPhase phase = SplitPhase::kTrain;
  int64_t round = 0;
  std::vector<int32_t> order;
  bool operator==(const SplitRoundCmd&) const = default;
};
using Command = std::variant<ProfileCmd, ProbeServeCmd, ProbePeerCmd, ProbeStopCmd, ConnectCmd, StepCmd,
                             FinishCmd, ShutdownCmd, CheckpointCmd, FedRoundCmd, SplitRoundCmd>;
// "profile", "probe_serve", "probe_peer", "probe_stop", "connect", "step", "finish",
// "shutdown", "checkpoint", "fed_round", "split_round"
const char* command_name(const Command& command);
// "split_round", "split_eval", "split_weights" (the names their acks carry)
const char* split_phase_name(SplitPhase phase);

struct CommandMsg {
  Command command;
  bool operator==(const CommandMsg&) const = default;
};

struct AckMsg {  // (0 payload frames)
  uint64_t request_id = 0;
  std::string detail;
  bool operator==(const AckMsg&) const = default;
};

struct ErrorMsg {  // (0 payload frames)
  ErrorCode code = ErrorCode::kUnknown;
  std::string message;
  uint64_t request_id = 0;
  bool operator==(const ErrorMsg&) const = default;
};

struct MetricsMsg {  // stage -> coordinator (0 payload frames)
  int32_t stage = 0;
  int64_t step = 0;
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t sample_count = 0;
  double step_ms = 0;       // pipeline: the stage's time for the step
  double train_ms = 0;      // federated: local training time
  int64_t local_steps = 0;  // federated: optimizer steps this round
  SplitPhase phase = SplitPhase::kTrain;  // split: the phase these counts are of
  int64_t round = 0;        // split: its round
  uint64_t job_id = 0;      // pipeline: the job and plan of the step (PipelineJob); metrics of
  uint32_t plan_epoch = 0;  //   another job or plan are stale: refused and counted
  bool operator==(const MetricsMsg&) const = default;
};

struct ProbeMsg {  // either direction (1 payload frame of payload_bytes)
  uint64_t sequence = 0;
  uint64_t payload_bytes = 0;
  bool echo = false;
  bool operator==(const ProbeMsg&) const = default;
};

// Secure aggregation (issue 18; the protocol is in docs/privacy.md). One
// message kind for its seven phases; what `items` hold depends on the phase
// (index: a client's 1-based position in the round's roster, its Shamir x):
//   kKeys     client -> coordinator: one item {index = own, a = cipher public
//             key (32 bytes), b = mask public key (32), mac = one 32-byte MAC
//             per roster member, in roster order (zeros in its own slot)}.
//   kRoster   coordinator -> client: one item per client that sent keys
//             {index, a, b, mac = the 32-byte MAC that client made for the receiver}.
//   kShares   client -> coordinator: one item per other client in the roster
//             {index = recipient, a = sealed box holding both of the sender's shares for it}.
//   kDelivery coordinator -> client: one item per sender {index = sender, a = its sealed box}.
//   kMasked   client -> coordinator: no items; sample_count; 1 payload frame of
//             num_elements uint64 (little-endian), the masked fixed-point update.
//   kUnmask   coordinator -> client: survivors (masked input arrived) and dropped
//             (shared keys, no masked input).
//   kReveal   client -> coordinator: one item per client in survivors or dropped
//             {index = the secret's owner, a = the share's bytes, b = {0}: its
//             self-mask seed, {1}: its mask secret key}.
enum class SecAggPhase : uint8_t { kKeys = 0, kRoster = 1, kShares = 2, kDelivery = 3, kMasked = 4, kUnmask = 5, kReveal = 6 };
const char* secagg_phase_name(SecAggPhase phase);  // "keys", "roster", ...
struct SecAggItem {
  int32_t index = 0;
  std::vector<uint8_t> a, b, mac;
  bool operator==(const SecAggItem&) const = default;
};
struct SecAggMsg {  // (kMasked: 1 payload frame; every other phase 0)
  int64_t round = 0;
  SecAggPhase phase = SecAggPhase::kKeys;
  std::vector<SecAggItem> items;
  std::vector<int32_t> survivors, dropped;
  int64_t sample_count = 0;  // kMasked: samples behind the update
  int64_t num_elements = 0;  // kMasked: uint64 values in the payload frame
  bool operator==(const SecAggMsg&) const = default;
};

using Body = std::variant<RegisterMsg, AssignMsg, TensorMsg, WeightsMsg, HeartbeatMsg, CommandMsg,
                          AckMsg, ErrorMsg, MetricsMsg, ProbeMsg, SecAggMsg>;

// "register", "assign", "tensor", ...
const char* body_kind_name(const Body& body);

struct Message {
  uint64_t request_id = 0;  // sender-chosen; echoed by Ack / Error
  Body body;
  std::vector<Payload> payloads;
};

// A message with `body` and no payload frames.
Message message_of(Body body, uint64_t request_id = 0);
// A message whose body is `command`.
Message command_message(Command command, uint64_t request_id = 0);

// Number of payload frames the kind of `body` carries on the wire.
size_t expected_payload_frames(const Body& body);

// ---------------------------------------------------------------------------
// Wire form.

// Limits applied by decode_message (sizes in bytes).
// Sizes are capped by kind: only the kinds that carry a model file (assign, and
// the profile command among the job commands) or a report (ack: a finished
// stage's trace) may have a header frame up to `max_header_bytes`; the header
// of every other kind (register, heartbeat, error, metrics, the other
// commands and the headers of tensor / weights / probe messages) is a control
// message of at most `max_control_bytes`. Payload frames are
// capped by `max_payload_bytes`, which an application sets from the largest
// tensor its job expects (endpoint.h: the same cap becomes ZMQ_MAXMSGSIZE).
struct DecodeLimits {
  size_t max_header_bytes = 64u << 20;    // model specs travel in assign
  size_t max_control_bytes = 1u << 20;    // header of every kind that carries no model spec
  size_t max_payload_bytes = 1u << 30;    // per payload frame
  size_t max_string_bytes = 64u << 20;    // any one string field
};

// Whether the header of `body` may be as large as max_header_bytes (assign and
// the profile command carry a model file, an ack a report); all others are
// control messages.
bool header_may_be_large(const Body& body);

// Serializes the body into a FlatBuffers header frame. Throws
// std::invalid_argument when the message is not valid (the same semantic rules
// decode_message enforces, including payload sizes), so a sender learns about
// its own bug instead of the receiver.
std::vector<std::byte> encode_header(const Message& message);

// Parses and validates untrusted frames: `header` then the payload frames.
// The returned Message shares the given Payloads (and so their owners): pass
// payloads whose owners keep the received frames alive.
// Returns FailureKind::kRejected with a message naming what is wrong.
Result<Message> decode_message(std::span<const std::byte> header,
                               std::span<const Payload> payloads,
                               const DecodeLimits& limits = {});

// Checks the semantic rules on an already-built message (used by both sides).
// Returns an empty string when valid, else what is wrong.
std::string validate_message(const Message& message, const DecodeLimits& limits = {});

// ---------------------------------------------------------------------------
// Float-level helpers.

// Builds a tensor message from float values: kF32 borrows `values` (zero-copy,
// `values` kept alive by the message), kF16/kInt8 encode into an owned payload.
Message make_tensor_message(TensorMsg header, std::shared_ptr<const std::vector<float>> values);
// As above over memory kept alive by `owner` (e.g. a device buffer on the host);
// `count` must equal numel(header.shape).
Message make_tensor_message(TensorMsg header, const float* values, size_t count,
                            std::shared_ptr<const void> owner);
// Decodes the payload of a validated tensor message into float32 (copies; safe
// for unaligned frames). Throws std::invalid_argument if `message` is not a tensor.
std::vector<float> tensor_values(const Message& message);
// Weights message over float memory kept alive by `owner` (zero-copy).
Message make_weights_message(WeightsMsg header, const float* values, size_t count,
                             std::shared_ptr<const void> owner);
// Copies the weights payload into float32.
std::vector<float> weights_values(const Message& message);
// A kMasked secure-aggregation message owning `values` (its payload frame).
Message make_secagg_masked_message(int64_t round, int64_t sample_count, std::vector<uint64_t> values);
// Copies a validated kMasked message's payload into uint64 (safe for unaligned frames).
std::vector<uint64_t> secagg_masked_values(const Message& message);
// Probe with `bytes` of deterministic filler payload.
Message make_probe_message(uint64_t sequence, uint64_t bytes, bool echo);

// The protocol version an envelope says it speaks, read without trusting the
// rest of it; nullopt when `header` is not a cleave envelope at all.
std::optional<uint16_t> envelope_version(std::span<const std::byte> header);
// An error envelope that a peer speaking `version` can read (Error keeps its
// table and its place in the union in every version): how a peer of another
// version is told why it is refused.
std::vector<std::byte> encode_version_error(uint16_t version, const std::string& text);

// Is `text` a syntactically valid 40-character Z85 public key?
bool is_z85_key(std::string_view text);

}  // namespace cleave::transport
