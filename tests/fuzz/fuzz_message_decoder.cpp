// fuzz_message_decoder.cpp: libFuzzer target for decode_message, the only
// code that reads untrusted bytes. Anything accepted must also decode its
// payload to floats, re-encode, and decode again to the same message.
#include <cstdint>
#include <cstdlib>
#include <variant>

#include "tests/fuzz/fuzz_input.h"
#include "transport/message.h"

using namespace cleave::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Frames frames = fuzz::split_input(data, size);
  DecodeLimits limits;
  limits.max_header_bytes = 1 << 16;
  limits.max_payload_bytes = 1 << 20;
  limits.max_string_bytes = 1 << 16;
  auto decoded = decode_message(frames.header, frames.payloads, limits);
  if (!decoded) {
    if (decoded.failure().message.empty()) std::abort();  // every rejection must say why
    return 0;
  }
  const Message& m = decoded.value();
  if (std::holds_alternative<TensorMsg>(m.body)) {
    std::vector<float> values = tensor_values(m);
    (void)values;
  } else if (std::holds_alternative<WeightsMsg>(m.body)) {
    (void)weights_values(m);
  }
  // Accepted messages re-encode (encode_header validates) and round-trip.
  const std::vector<std::byte> header = encode_header(m);
  auto again = decode_message(header, m.payloads, limits);
  if (!again || again->body.index() != m.body.index() || again->request_id != m.request_id)
    std::abort();
  return 0;
}
