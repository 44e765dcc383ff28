// The "HOST:PORT" of the gateway's --listen, --metrics-listen and --http-listen flags, parsed
// once for all three servers (IPv6 hosts in brackets, "[::1]:9090").
#pragma once

#include <string>

namespace thermocline::gateway {

// HOST:PORT -> host (brackets removed) and port in [0, 65535]; false when it is not that.
bool ParseListenAddress(const std::string& addr, std::string* host, int* port);

}  // namespace thermocline::gateway
