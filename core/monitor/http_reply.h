// http_reply.h: what the metrics endpoint answers to one HTTP/1.x request —
// the part of http_server.h that needs no socket.
//
//   GET or HEAD /metrics (any query)   200, text/plain; version=0.0.4
//   another path                       404
//   another method                     405 (Allow: GET, HEAD)
//   not a request line                 400
//   a request head over the size cap  431 (http_server.h decides when)
//   render() throws                    500 (the message stays out of the reply)
// Every reply closes the connection (Connection: close) and has a
// Content-Length.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace cleave::monitor {

inline constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

// Where the request head (request line and headers) ends in `buffered`: the
// offset after the blank line ("\r\n\r\n", or "\n\n" from a sloppy client),
// or 0 while it is incomplete.
size_t request_head_end(std::string_view buffered);

// The whole reply (status line, headers, body) to `head`.
std::string http_reply(std::string_view head, const std::function<std::string()>& render);

// A reply with `status` (e.g. "431 Request Header Fields Too Large") and a one-line plain-text body.
std::string http_status_reply(const std::string& status, const std::string& body);

}  // namespace cleave::monitor
