// ferry-http-serve: serves a folder over HTTP on 127.0.0.1 for benchmarks of remote sources,
// until SIGTERM or SIGINT. Prints the base URL on stdout; --port-file FILE also writes the port
// (complete once the file exists: it is renamed into place); --port N binds a fixed port.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include "http_server.h"

namespace {

int usage() {
  std::cerr << "usage: ferry-http-serve ROOT [--port-file FILE] [--port N]\n";
  return 2;
}

void write_port_file(const std::filesystem::path& file, std::uint16_t port) {
  std::filesystem::path partial = file;
  partial += ".partial";
  {
    std::ofstream out(partial);
    out << port << "\n";
    if (!out.flush()) throw std::runtime_error("write " + partial.string());
  }
  std::filesystem::rename(partial, file);
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::filesystem::path> root, port_file;
  unsigned long port = 0;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--port-file" && i + 1 < argc) {
      port_file = argv[++i];
    } else if (arg == "--port" && i + 1 < argc) {
      char* end = nullptr;
      port = std::strtoul(argv[++i], &end, 10);
      if (*end != '\0' || port > 65535) return usage();
    } else if (!arg.starts_with("-") && !root) {
      root = arg;
    } else {
      return usage();
    }
  }
  if (!root) return usage();

  // Blocked before the server's threads start, so that they inherit the mask and only sigwait
  // below takes these signals.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  try {
    ferry::test::HttpServer server(*root, static_cast<std::uint16_t>(port));
    if (port_file) write_port_file(*port_file, server.port());
    std::cout << server.url("") << std::endl;
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    std::cerr << "ferry-http-serve: " << server.requests() << " requests on "
              << server.connections() << " connections\n";
  } catch (const std::exception& e) {
    std::cerr << "ferry-http-serve: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
