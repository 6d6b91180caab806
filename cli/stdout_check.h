// Whether what a program wrote to stdout arrived, and why not (hybrid's tools, hybrid-server, hybrid-server-bench).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

namespace hy::tools {

// The reason of the first lost write to stdout that stdout_ok() saw (an errno value; 0: not known).
inline int& stdout_errno() {
    static int e = 0;
    return e;
}

// False when something written to stdout (C stdio or std::cout) was lost (e.g. a full disk); the first time, its
// reason goes to stdout_errno(): the final flush's error, or else the errno an earlier failed write left when it is
// one a write gives (ENOSPC, EPIPE, EIO, EFBIG, EDQUOT, EBADF; other calls since may have changed it).
inline bool stdout_ok() {
    std::cout.flush();
    const int before = errno;
    errno = 0;
    const bool flushed = std::fflush(stdout) == 0;
    const bool ok = flushed && !std::ferror(stdout) && std::cout.good();
    if (!ok && stdout_errno() == 0) {
        const int e = !flushed && errno != 0 ? errno : before;
        stdout_errno() = e == ENOSPC || e == EPIPE || e == EIO || e == EFBIG || e == EDQUOT || e == EBADF ? e : 0;
    }
    return ok;
}

// "cannot write to stdout: <reason>" (or "... (an earlier write failed)" when the reason is not known).
inline std::string stdout_error() {
    return stdout_errno() != 0 ? std::string("cannot write to stdout: ") + std::strerror(stdout_errno())
                               : std::string("cannot write to stdout (an earlier write failed)");
}

}  // namespace hy::tools
