// endpoint.h: ZeroMQ + CURVE endpoints that carry cleave messages.
//
// A ServerEndpoint binds (ROUTER, CURVE server, its own ZAP handler with an
// allow-list, ZMQ_MAXMSGSIZE, heartbeats) and serves many authenticated peers;
// every received message carries the sender's allow-list name (taken from the
// ZAP User-Id on the frame, never from anything the peer wrote). A
// ClientEndpoint dials one server (DEALER, CURVE client pinned to the server's
// public key) and reconnects on its own. Both:
//   - send(Message): header frame + payload frames; payloads with an owner are
//     handed to ZeroMQ without copying (ZeroMQ shares the owner until its I/O
//     thread is done; the bytes must stay unmodified until then), payloads
//     without an owner are copied;
//   - receive(timeout): a Message, FailureKind::kTimeout, or kRejected for
//     input that failed validation (logged, counted; the endpoint keeps serving);
//   - detect dead peers: ZMTP heartbeats close silent connections, a socket
//     monitor reports disconnects and refused handshakes (counted; logged
//     rate-limited, since a peer can cause them at will);
//   - cap what they receive (SocketTuning::limits): ZMQ_MAXMSGSIZE is set
//     from the caps before any connection exists, so libzmq drops a
//     connection announcing a bigger frame before buffering it.
// A ServerEndpoint may have its allow-list replaced while it serves (key
// revocation: replace_allow_list, or ServerOptions::allow_path watched on
// disk and re-read on request_allow_list_reload()): a revoked key's new
// handshakes are refused, its open connections are shut down, its queued
// messages are refused at receive, and it gets a PeerEvent::kRevoked.
// A ClientEndpoint whose handshake fails (its key refused, or a server
// without the secret of server_public_key) closes its socket and dials again
// after a back-off (1 s doubling to 30 s by default), logging once per step,
// instead of libzmq's retry every 100 ms.
// Endpoints are not thread-safe: use each from one thread at a time. Their
// background threads (ZAP, monitor) touch only their own sockets.
// `insecure = true` uses plain TCP (NULL mechanism) and logs a warning.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/keys.h"
#include "transport/message.h"
#include "transport/result.h"

namespace cleave::transport {

class Wakeup;

using Millis = std::chrono::milliseconds;

struct EndpointStats {
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;  // accepted (valid) messages
  uint64_t messages_rejected = 0;  // failed validation; never seen by the application
  uint64_t bytes_sent = 0;         // header + payload bytes before encryption
  uint64_t bytes_received = 0;
  uint64_t zap_admitted = 0;       // server: ZAP handshakes admitted
  uint64_t zap_denied = 0;         // server: ZAP refusals (unknown key, wrong mechanism)
  uint64_t handshakes_failed = 0;  // handshake failures seen by the monitor (junk, no CURVE, denied)
  uint64_t handshakes_succeeded = 0;  // client: connections made (the first and every reconnect)
  uint64_t disconnects = 0;        // connections closed (peer gone, heartbeat timeout, oversized frame)
  uint64_t revoked_connections = 0;  // server: connections closed because their key was revoked
  std::string last_rejection;      // message of the most recent rejection
};

// What one peer of a ServerEndpoint (an allow-list name) sent and was sent,
// counted as EndpointStats counts them, from its first message on.
struct PeerTraffic {
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;  // accepted (valid) messages
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;     // every authenticated frame, valid or not
};

// Transport settings shared by both ends.
struct SocketTuning {
  DecodeLimits limits;                         // application-level caps (clear error, counted)
  int heartbeat_interval_ms = 1000;            // ZMTP PING interval
  int heartbeat_timeout_ms = 3000;             // connection dropped after this much silence
  int handshake_timeout_ms = 5000;             // half-open / junk connections dropped after this
  int send_timeout_ms = 10000;                 // send() fails with kTimeout after this
  int linger_ms = 500;                         // how long close waits for unsent messages
  int high_water_mark = 1000;                  // messages queued per peer
  int reconnect_ms = 100;                      // a client dials again after this, doubling per failure
  int reconnect_max_ms = 2000;                 //   up to this (ZMQ_RECONNECT_IVL, _MAX)
};

// ZMQ_MAXMSGSIZE is set to twice the largest application limit: frames
// between the limit and the cap arrive and are rejected with a clear error;
// frames above the cap make libzmq drop the connection (counted as a disconnect)
// as soon as their size is read, without buffering them.
int64_t transport_frame_cap(const DecodeLimits& limits);

// Caps for an endpoint that receives tensors or weights of a known job (a
// coordinator, either end of a stage-to-stage link): the default header caps
// (control kinds 1 MiB, acks with reports 64 MiB) and payload frames of at most
// `largest_payload_bytes` plus room (1/16 and 64 KiB) for what a caller's
// estimate does not see. The frame cap (ZMQ_MAXMSGSIZE) follows from it.
DecodeLimits payload_limits(size_t largest_payload_bytes);

struct ServerOptions {
  std::string bind = "tcp://127.0.0.1:*";  // '*' port: ephemeral, see endpoint()
  KeyPair keys;                            // this server's key pair (CURVE)
  AllowList allow;                         // client keys admitted (must not be empty unless insecure)
  bool insecure = false;                   // plain TCP, NULL mechanism, warning logged
  std::string label = "server";            // prefix of log lines
  SocketTuning tuning;
  // Where `allow` came from (a directory of .pub files or a key file): when
  // set, the endpoint re-reads it when its entries change (polled every
  // allow_poll_ms) or a reload is requested (allow_watch.h), and revokes the
  // keys no longer on it. Empty: the list is fixed (replace_allow_list still works).
  std::string allow_path;
  int allow_poll_ms = 1000;
};

struct ClientOptions {
  std::string connect;             // "tcp://host:port"
  KeyPair keys;                    // this client's key pair (must be on the server's allow-list)
  std::string server_public_key;   // Z85; the connection fails unless the server holds its secret
  bool insecure = false;
  std::string label = "client";
  SocketTuning tuning;
  int auth_backoff_initial_ms = 1000;  // first wait after a failed handshake
  int auth_backoff_max_ms = 30000;     // the wait doubles up to this
};

// A message and who sent it (server side).
struct Received {
  std::string peer;  // allow-list name of the sender ("insecure-<id>" in --insecure mode)
  Message message;
};

struct PeerEvent {
  // kRevoked: the peer's key was taken off the allow-list (its connections are closed).
  enum class Kind { kConnected, kDisconnected, kRevoked };
  Kind kind;
  std::string peer;
};

class ServerEndpoint {
 public:
  // Binds and starts the ZAP handler and monitor. Throws std::invalid_argument
  // for bad options (empty allow-list in secure mode, malformed keys) and
  // zmq::error_t when binding fails.
  explicit ServerEndpoint(ServerOptions options);
  ~ServerEndpoint();
  ServerEndpoint(const ServerEndpoint&) = delete;
  ServerEndpoint& operator=(const ServerEndpoint&) = delete;

  // The resolved endpoint, e.g. "tcp://127.0.0.1:40123".
  const std::string& endpoint() const;
  const std::string& public_key() const;

  // Waits up to `timeout` for one message.
  Result<Received> receive(Millis timeout);
  // Sends to the most recent connection of `peer` (an allow-list name that has
  // sent at least one message). kUnreachable when unknown or gone.
  Status send(const std::string& peer, const Message& message);

  // Connect / disconnect events since the last call. A peer is "connected"
  // from its first valid message; "disconnected" when its connection closes.
  std::vector<PeerEvent> take_peer_events();
  // Peers whose connection is currently believed open.
  std::vector<std::string> connected_peers();
  // Time since the last valid message from `peer`, or nullopt if never heard.
  std::optional<Millis> since_last_seen(const std::string& peer) const;

  // Admits exactly the keys of `allow` from now on. A name whose key is gone
  // (or changed) is revoked: refused at its next handshake, its connections
  // that sent a message are shut down, its queued messages are refused, and a
  // peer that had connected gets a kRevoked event. Logged. Returns the revoked
  // names. Thread-safe (the allow_path watcher calls it from its thread).
  std::vector<std::string> replace_allow_list(AllowList allow);

  EndpointStats stats() const;
  // Each peer's traffic, by name (the coordinator's metrics per daemon).
  // Like receive and send: from the endpoint's own thread.
  std::map<std::string, PeerTraffic> peer_traffic() const;
  // ZeroMQ's ZMQ_FD of the socket: readable when a receive may find a
  // message (edge-triggered: receive with a zero timeout first, wait on it
  // only when that found nothing). From the endpoint's own thread.
  int poll_fd() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class ClientEndpoint {
 public:
  // Starts connecting (asynchronously; messages queue until connected).
  // Throws std::invalid_argument for malformed keys.
  explicit ClientEndpoint(ClientOptions options);
  ~ClientEndpoint();
  ClientEndpoint(const ClientEndpoint&) = delete;
  ClientEndpoint& operator=(const ClientEndpoint&) = delete;

  Status send(const Message& message);
  // Waits up to `timeout` for a message; with `woken`, a signal on it ends the
  // wait early (FailureKind::kTimeout, the Wakeup left signalled), and so does
  // the end of a handshake (a new connection, or a failed one that the next
  // call closes the socket for), so a caller can wait long and still be told
  // to stop, to look at its flags, or that it can now register. A negative
  // `timeout` has no limit; backing off, the wait then ends when the socket
  // reopens (kTimeout, so that the caller's next call can hear from it).
  Result<Message> receive(Millis timeout, const Wakeup* woken = nullptr);

  // True after a successful handshake, false after a disconnect.
  bool connected() const;
  // Waits until connected() or the timeout passes; returns connected().
  bool wait_connected(Millis timeout) const;
  // Handshakes that failed since the last successful one (0 while connected)
  // and why the last one failed ("" when none did).
  uint64_t failed_handshakes() const;
  std::string last_handshake_failure() const;
  // As ServerEndpoint::poll_fd; -1 while the socket is closed for a back-off
  // (the descriptor may change when it reopens: ask again before each wait).
  int poll_fd() const;

  EndpointStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave::transport
