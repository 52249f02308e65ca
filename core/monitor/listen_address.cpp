// listen_address.cpp: see listen_address.h.
#include "core/monitor/listen_address.h"

#include <arpa/inet.h>

#include <stdexcept>

namespace cleave::monitor {
namespace {

[[noreturn]] void refuse(std::string_view text, const std::string& why) {
  throw std::invalid_argument("'" + std::string(text) + "' is not HOST:PORT (" + why +
                              "; e.g. 127.0.0.1:9464, 0.0.0.0:9464, [::1]:9464; port 0 picks a free one)");
}

bool host_name(std::string_view h) {
  if (h.empty() || h.size() > 253 || h.front() == '-' || h.front() == '.') return false;
  for (char c : h)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.'))
      return false;
  return true;
}

}  // namespace

ListenAddress parse_listen_address(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) refuse(text, "no port");
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos)
    refuse(text, "the port must be a number from 0 to 65535");
  ListenAddress a;
  a.port = std::stoi(std::string(port));
  if (a.port > 65535) refuse(text, "the port must be a number from 0 to 65535");
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') refuse(text, "an IPv6 address goes in brackets: [::1]:PORT");
    a.host = std::string(host.substr(1, host.size() - 2));
    in6_addr v6{};
    if (inet_pton(AF_INET6, a.host.c_str(), &v6) != 1) refuse(text, "'" + a.host + "' is not an IPv6 address");
    return a;
  }
  if (host.find(':') != std::string_view::npos) refuse(text, "an IPv6 address goes in brackets: [::1]:PORT");
  if (!host_name(host)) refuse(text, host.empty() ? "no host: give 127.0.0.1 or 0.0.0.0" : "a bad host name");
  a.host = std::string(host);
  return a;
}

std::string format_listen_address(const ListenAddress& address) {
  const bool v6 = address.host.find(':') != std::string::npos;
  return (v6 ? "[" + address.host + "]" : address.host) + ":" + std::to_string(address.port);
}

}  // namespace cleave::monitor
