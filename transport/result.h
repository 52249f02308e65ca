// result.h: expected-like return values for the transport.
//
// Network failures are values, not exceptions: a receive that times out, a peer
// that sent garbage, a peer that is not connected. `Result<T>` holds either a
// T or a `Failure` (kind + human-readable message naming what was wrong).
// Programming errors (bad arguments, misuse) still throw.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace cleave::transport {

enum class FailureKind {
  kTimeout,      // nothing arrived within the timeout
  kRejected,     // input arrived but failed validation (logged and counted)
  kUnreachable,  // the named peer is not connected / the message could not be routed
  kClosed,       // the link or endpoint is closed
};

const char* failure_kind_name(FailureKind kind);

struct Failure {
  FailureKind kind = FailureKind::kTimeout;
  std::string message;
  std::string peer;  // allow-list name of the sender when known (server side)
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Failure failure) : v_(std::move(failure)) {}  // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  // The value; throws std::bad_variant_access when this holds a failure.
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  // The failure; throws std::bad_variant_access when this holds a value.
  const Failure& failure() const { return std::get<1>(v_); }
  bool is(FailureKind kind) const { return !ok() && failure().kind == kind; }

 private:
  std::variant<T, Failure> v_;
};

// Result of an operation that returns nothing on success.
struct Done {};
using Status = Result<Done>;

}  // namespace cleave::transport
