#include "model/common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <nlohmann/json.hpp>

namespace hy {

nlohmann::json parse_json(const std::string& text, const std::string& source) {
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw Error(Status::format, source + ": invalid JSON: " + json_error_text(e.what()));
    }
}

std::string folder_path(const std::string& dir) {
    const size_t end = dir.find_last_not_of('/');
    if (end == std::string::npos) return dir.empty() ? dir : std::string("/");
    return dir.substr(0, end + 1);
}

bool path_present(const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) return true;
    const int e = errno;
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
        char target[4096];
        const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
        const std::string to = n > 0 ? std::string(target, size_t(n)) : std::string("?");
        if (e == ELOOP) throw Error(Status::io, path + ": symbolic link loop (it points to '" + to + "')");
        throw Error(Status::io, path + ": broken symbolic link (its target '" + to + "': " + std::strerror(e) + ")");
    }
    return e != ENOENT && e != ENOTDIR;
}

std::string read_regular_file(const std::string& path, size_t max_bytes) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
        const int e = errno;
        path_present(path);  // (a broken link or a loop: named with its target)
        throw Error(Status::io, "cannot open '" + path + "': " + std::strerror(e));
    }
    auto refuse_kind = [&](mode_t m) {
        if (S_ISREG(m)) return;
        const char* kind = S_ISDIR(m)                 ? "a directory"
                           : S_ISFIFO(m)              ? "a FIFO"
                           : S_ISCHR(m) || S_ISBLK(m) ? "a device"
                           : S_ISSOCK(m)              ? "a socket"
                                                      : "not a regular file";
        throw Error(Status::io, "cannot read '" + path + "': " + kind + ", expected a regular file");
    };
    refuse_kind(st.st_mode);
    auto too_large = [&] {
        return Error(Status::io, "cannot read '" + path + "': larger than " + std::to_string(max_bytes >> 20) +
                                     " MiB, the most this reader takes");
    };
    if (uint64_t(st.st_size) > max_bytes) throw too_large();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // (no wait if it became a FIFO)
    if (fd < 0) throw Error(Status::io, "cannot open '" + path + "': " + std::strerror(errno));
    std::string out;
    try {
        if (::fstat(fd, &st) != 0) throw Error(Status::io, "cannot read '" + path + "': " + std::strerror(errno));
        refuse_kind(st.st_mode);
        out.resize(std::min(size_t(st.st_size), max_bytes) + 1);
        size_t got = 0;
        for (;;) {
            if (got == out.size()) {
                if (out.size() > max_bytes) throw too_large();  // it grew while being read
                out.resize(std::min(2 * out.size(), max_bytes + 1));
            }
            const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
            if (r < 0) {
                if (errno == EINTR) continue;
                throw Error(Status::io, "cannot read '" + path + "': " + std::strerror(errno));
            }
            if (r == 0) break;
            got += size_t(r);
        }
        out.resize(got);
    } catch (...) {
        ::close(fd);
        throw;
    }
    ::close(fd);
    return out;
}

}  // namespace hy
