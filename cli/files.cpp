// File helpers of the `hybrid` program: bounded reads of the input files (-f, --batch-file, /load) and the atomic
// write of /save (a uniquely named temporary file in the same folder, synced, then linked or renamed onto the
// target; a target that is not a regular file is never replaced).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "cli/cli.h"

namespace hy::cli {

const char* file_kind(unsigned mode) {
    const mode_t m = mode_t(mode);
    if (S_ISLNK(m)) return "a symbolic link";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

namespace {

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// Reads up to n bytes (fewer at end of file). Throws Failure(exit_io).
size_t read_some(int fd, char* dst, size_t n, const std::string& path) {
    size_t got = 0;
    while (got < n) {
        const ssize_t r = ::read(fd, dst + got, n - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            throw Failure(exit_io, path + ": read failed: " + std::strerror(errno));
        }
        if (r == 0) break;
        got += size_t(r);
    }
    return got;
}

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace

std::string read_input_file(const std::string& path, size_t cap) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) throw Failure(exit_io, path + ": cannot read: " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) throw Failure(exit_io, path + ": is a directory");
    if (S_ISREG(st.st_mode) && uint64_t(st.st_size) > cap) throw Failure(exit_io, path + ": larger than " + mib(cap));
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) throw Failure(exit_io, path + ": cannot read: " + std::strerror(errno));
    if (::fstat(f.fd, &st) == 0 && S_ISDIR(st.st_mode)) throw Failure(exit_io, path + ": is a directory");
    // a pipe, a terminal or a device (/dev/stdin): read up to cap + 1 bytes
    std::string out;
    size_t want = S_ISREG(st.st_mode) ? size_t(st.st_size) + 1 : size_t(1) << 16;
    for (;;) {
        want = std::min(want, cap + 1 - out.size());
        const size_t at = out.size();
        out.resize(at + want);
        const size_t got = read_some(f.fd, out.data() + at, want, path);
        out.resize(at + got);
        if (out.size() > cap) throw Failure(exit_io, path + ": larger than " + mib(cap));
        if (got < want) break;
        want = std::max<size_t>(want, 1 << 16);
    }
    return out;
}

std::string read_regular_file_head(const std::string& path, size_t n, uint64_t* size, int* fd_out) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) throw Failure(exit_io, path + ": cannot read: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        throw Failure(exit_io, path + ": is " + std::string(file_kind(st.st_mode)) + ", not a regular file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Failure(exit_io, path + ": cannot read: " + std::strerror(errno));
    Fd f;
    f.fd = fd;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw Failure(exit_io, path + ": not a regular file");
    std::string head(n, '\0');
    head.resize(read_some(fd, head.data(), n, path));
    *size = uint64_t(st.st_size);
    *fd_out = fd;
    f.fd = -1;  // the caller closes it
    return head;
}

std::string read_rest(int fd, size_t n, const std::string& path) {
    Fd f;
    f.fd = fd;
    std::string out(n, '\0');
    out.resize(read_some(fd, out.data(), n, path));
    return out;
}

void write_file_atomic(const std::string& path, const std::string& data, bool overwrite, const std::string& exists_msg) {
    struct stat st;
    auto refuse_kind = [&](mode_t m) {
        throw Failure(exit_io, path + ": is " + std::string(file_kind(m)) + ", not a regular file (not replaced)");
    };
    mode_t keep_mode = 0;  // an overwritten file keeps its permissions
    if (::lstat(path.c_str(), &st) == 0) {
        if (!S_ISREG(st.st_mode)) refuse_kind(st.st_mode);
        if (!overwrite) throw Failure(exit_io, path + ": " + exists_msg);
        keep_mode = st.st_mode & 07777;
    }
    std::string tmp;
    int fd = -1;
    static uint64_t counter = 0;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        const uint64_t r = (uint64_t(::getpid()) << 24) ^
                           uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                           (++counter * 0x9E3779B97F4A7C15ull);
        char suffix[16];
        std::snprintf(suffix, sizeof suffix, ".%06llx", (unsigned long long)((r ^ (r >> 24)) & 0xFFFFFFull));
        tmp = path + suffix;
        fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) throw Failure(exit_io, path + ": cannot write: " + std::strerror(errno));
    }
    if (fd < 0) throw Failure(exit_io, path + ": cannot create a temporary file next to it");
    auto fail = [&](const std::string& what, int e) {
        if (fd >= 0) ::close(fd);
        ::unlink(tmp.c_str());
        throw Failure(exit_io, path + ": " + what + ": " + std::strerror(e));
    };
    if (keep_mode != 0) ::fchmod(fd, keep_mode);  // best effort
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
        const ssize_t w = ::write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            fail("write failed", errno);
        }
        p += w;
        left -= size_t(w);
    }
    if (::fsync(fd) != 0 && errno != EINVAL) fail("write failed", errno);
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail("write failed", errno);
    if (!overwrite) {
        // link() fails with EEXIST if PATH appeared meanwhile: never replaced
        if (::link(tmp.c_str(), path.c_str()) == 0) {
            ::unlink(tmp.c_str());
        } else if (errno == EEXIST) {
            ::unlink(tmp.c_str());
            throw Failure(exit_io, path + ": " + exists_msg);
        } else if (errno == EPERM || errno == EOPNOTSUPP || errno == ENOSYS || errno == EMLINK) {
            if (::lstat(path.c_str(), &st) == 0) {  // no hard links on this filesystem
                ::unlink(tmp.c_str());
                throw Failure(exit_io, path + ": " + exists_msg);
            }
            if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename the temporary file", errno);
        } else {
            fail("cannot write", errno);
        }
    } else {
        if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
            ::unlink(tmp.c_str());
            refuse_kind(st.st_mode);
        }
        if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename the temporary file", errno);
    }
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

}  // namespace hy::cli
