// ferry::printable: text from files (tensor names, shard names, JSON excerpts) made safe to show
// on a terminal or in a log. A pure function; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace ferry {

// `text` with control characters (C0, DEL, C1, so no terminal escape sequence survives) and bytes
// that are not UTF-8 written as \xNN; the rest is kept. Names read from files pass through it
// before any message shows them.
std::string printable(std::string_view text);

}  // namespace ferry
