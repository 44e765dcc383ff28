#include "gateway/listen_address.h"

#include <charconv>

namespace thermocline::gateway {

bool ParseListenAddress(const std::string& addr, std::string* host, int* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) return false;
  *host = addr.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  const char* b = addr.data() + colon + 1;
  const char* e = addr.data() + addr.size();
  auto [ptr, ec] = std::from_chars(b, e, *port);
  return ec == std::errc() && ptr == e && *port >= 0 && *port <= 65535;
}

}  // namespace thermocline::gateway
