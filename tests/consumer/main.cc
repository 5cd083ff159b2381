// Reads a file into host memory through the installed ferry and prints the route verdict.
#include <ferry/ferry.h>

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
    std::printf("read %zu bytes: %s\n", n, file.last_route().verdict().c_str());
    return n == buffer.size() ? 0 : 1;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
