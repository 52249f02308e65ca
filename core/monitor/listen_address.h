// listen_address.h: the ADDR of `--metrics-listen ADDR` — HOST:PORT, with an
// IPv6 host in brackets: 127.0.0.1:9464, 0.0.0.0:9464, [::1]:9464,
// localhost:0 (port 0: the system picks a free one).
#pragma once

#include <string>
#include <string_view>

namespace cleave::monitor {

struct ListenAddress {
  std::string host;  // without brackets: "127.0.0.1", "::1", "localhost"
  int port = 0;      // 0..65535
};

// Parses ADDR; throws std::invalid_argument("'TEXT' is not HOST:PORT (...)")
// for anything else: no port, a port outside 0..65535, an IPv6 address
// without brackets or not an address, a host name with characters no host
// name has. Whether the host resolves is found out when binding.
ListenAddress parse_listen_address(std::string_view text);

// "127.0.0.1:9464", "[::1]:9464".
std::string format_listen_address(const ListenAddress& address);

}  // namespace cleave::monitor
