// Whether what a program wrote to stdout arrived, and why not: one record for hybrid, its tools, hybrid-server and
// hybrid-server-bench. A lost write (a full disk, a closed pipe or descriptor) is kept, with its reason, until exit.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

namespace hy::tools {

// The record: lost once any write to stdout failed; err is the reason (an errno value; 0: not known).
struct StdoutRecord {
    bool lost = false;
    int err = 0;
};

inline StdoutRecord& stdout_record() {
    static StdoutRecord r;
    return r;
}

// The reason of the first lost write (an errno value; 0: none, or not known).
inline int stdout_errno() { return stdout_record().err; }

// True once a write to stdout was lost (as stdout_ok() or write_stdout() found); does not flush.
inline bool stdout_lost() { return stdout_record().lost; }

namespace detail {
// Records a lost write. e is the errno the failed call left: kept when it is one a write gives (ENOSPC, EPIPE, EIO,
// EFBIG, EDQUOT, EBADF); other values may come from unrelated calls since, and are not blamed.
inline void record_lost(int e) {
    StdoutRecord& r = stdout_record();
    if (r.lost) return;
    r.lost = true;
    r.err = e == ENOSPC || e == EPIPE || e == EIO || e == EFBIG || e == EDQUOT || e == EBADF ? e : 0;
}
}  // namespace detail

// Flushes std::cout and C stdio; false when this or any earlier write to stdout was lost (the first time, its reason
// goes to stdout_errno(): the flush's error, or else the errno an earlier failed write left).
inline bool stdout_ok() {
    std::cout.flush();
    const int before = errno;
    errno = 0;
    const bool flushed = std::fflush(stdout) == 0;
    const bool ok = flushed && !std::ferror(stdout) && std::cout.good();
    if (!ok) detail::record_lost(!flushed && errno != 0 ? errno : before);
    return ok && !stdout_lost();
}

// Writes n bytes of data to stdout and flushes; false when they (or an earlier write) were lost: the caller stops
// producing output, and the exit reports stdout_error().
inline bool write_stdout(const char* data, size_t n) {
    if (stdout_lost()) return false;
    errno = 0;
    if (n > 0 && std::fwrite(data, 1, n, stdout) != n) {
        detail::record_lost(errno);
        return false;
    }
    return stdout_ok();
}

// "cannot write to stdout: <reason>" (or "... (an earlier write failed)" when the reason is not known).
inline std::string stdout_error() {
    return stdout_errno() != 0 ? std::string("cannot write to stdout: ") + std::strerror(stdout_errno())
                               : std::string("cannot write to stdout (an earlier write failed)");
}

}  // namespace hy::tools
