// Reading one line of input with a bound on its length (the REPL's stdin): std::getline alone would grow its
// string without end on an input with no newline (stdin from /dev/zero).
#pragma once

#include <cstddef>
#include <istream>
#include <string>

namespace hy::cli {

enum class LineRead { line, end, too_long };

// Reads the next line of `in` into `line`, without its '\n' (the last line may lack one). Returns line; end at the
// end of the input or on a read error, with nothing read (the stream's state tells which); too_long once more than
// `cap` bytes of the line were read (the rest of the line is left unread).
inline LineRead getline_bounded(std::istream& in, std::string& line, size_t cap) {
    line.clear();
    char buf[1 << 16];
    for (;;) {
        in.getline(buf, sizeof buf);
        const size_t n = size_t(in.gcount());
        const bool whole = !in.fail();  // up to and with the '\n', or up to the end of the input
        const bool full = !whole && !in.eof() && !in.bad() && n == sizeof buf - 1;  // the line goes on
        if (!whole && !full) return line.empty() || in.bad() ? LineRead::end : LineRead::line;
        line.append(buf, whole && !in.eof() ? n - 1 : n);
        if (line.size() > cap) return LineRead::too_long;
        if (whole) return LineRead::line;
        in.clear();
    }
}

}  // namespace hy::cli
