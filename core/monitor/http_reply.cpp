// http_reply.cpp: see http_reply.h.
#include "core/monitor/http_reply.h"

#include <exception>

namespace cleave::monitor {
namespace {

std::string reply(const std::string& status, const std::string& content_type, const std::string& body,
                  bool with_body, const std::string& extra_headers = "") {
  std::string out = "HTTP/1.1 " + status + "\r\nContent-Type: " + content_type +
                    "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra_headers +
                    "Connection: close\r\n\r\n";
  if (with_body) out += body;
  return out;
}

}  // namespace

size_t request_head_end(std::string_view buffered) {
  const size_t crlf = buffered.find("\r\n\r\n");
  const size_t lf = buffered.find("\n\n");
  const size_t a = crlf == std::string_view::npos ? std::string_view::npos : crlf + 4;
  const size_t b = lf == std::string_view::npos ? std::string_view::npos : lf + 2;
  const size_t end = a < b ? a : b;
  return end == std::string_view::npos ? 0 : end;
}

std::string http_status_reply(const std::string& status, const std::string& body) {
  return reply(status, "text/plain; charset=utf-8", body + "\n", true);
}

std::string http_reply(std::string_view head, const std::function<std::string()>& render) {
  std::string_view line = head.substr(0, head.find('\n'));
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == 0 || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos ||
      line.substr(sp2 + 1).substr(0, 7) != "HTTP/1.")
    return http_status_reply("400 Bad Request", "not an HTTP/1.x request line");
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (method != "GET" && method != "HEAD")
    return reply("405 Method Not Allowed", "text/plain; charset=utf-8", "only GET and HEAD are served\n", true,
                 "Allow: GET, HEAD\r\n");
  if (target.substr(0, target.find('?')) != "/metrics")
    return http_status_reply("404 Not Found", "the metrics are at /metrics");
  std::string body;
  try {
    body = render();
  } catch (const std::exception&) {
    return http_status_reply("500 Internal Server Error", "the metrics could not be collected");
  }
  return reply("200 OK", kMetricsContentType, body, method == "GET");
}

}  // namespace cleave::monitor
