// Noticing that an HTTP client went away while its request runs. The HTTP library gives
// a handler the connection's addresses but not its socket, so the socket is found by
// its address pair among the process's descriptors (once per request), and then polled:
// a peer that closed or reset the connection shows as hang-up without any byte being
// written. (A client that shuts down only its sending side counts as gone.)
#pragma once

#include <string>

namespace kivi::server {

// The connected TCP socket whose local port is local_port and whose peer is
// (remote_addr, remote_port), or -1.
int find_connection_socket(int local_port, const std::string& remote_addr, int remote_port);

// Whether the peer of `fd` has closed or reset the connection (false for fd < 0).
bool peer_closed(int fd);

}  // namespace kivi::server
