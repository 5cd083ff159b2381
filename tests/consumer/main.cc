// Reads a file into host memory through ferry and prints ferry's version and the route verdict.
#include <ferry/ferry.h>
#include <ferry/version.h>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer FILE\n");
    return 2;
  }
  try {
    ferry::File file(argv[1]);
    std::vector<char> buffer(file.size());
    std::size_t n = file.read(buffer.data(), buffer.size(), 0);
    std::printf("ferry %s: read %zu bytes: %s\n", ferry::kVersion, n,
                file.last_route().verdict().c_str());
    return n == buffer.size() ? 0 : 1;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
