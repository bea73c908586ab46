#include "server/connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace kivi::server {

namespace {

// The port and textual address of a socket address.
bool describe(const sockaddr_storage& a, std::string& addr, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    if (!inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof(buf))) return false;
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (!inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof(buf))) return false;
    port = ntohs(v6->sin6_port);
  } else {
    return false;
  }
  addr = buf;
  return true;
}

}  // namespace

int find_connection_socket(int local_port, const std::string& remote_addr, int remote_port) {
  rlimit lim{};
  int max_fd = 1024;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    max_fd = static_cast<int>(std::min<rlim_t>(lim.rlim_cur, 1 << 20));
  }
  for (int fd = 3; fd < max_fd; ++fd) {
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof(peer), ll = sizeof(local);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    std::string pa, la;
    int pp = 0, lp = 0;
    if (!describe(peer, pa, pp) || !describe(local, la, lp)) continue;
    if (pp == remote_port && lp == local_port && pa == remote_addr) return fd;
  }
  return -1;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{};
  p.fd = fd;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace kivi::server
