// File helpers of the `hybrid` program: bounded reads of the input files (-f, --batch-file, /load) and the atomic
// write of /save (the library's hy::write_file_atomic: a uniquely named temporary file in the same folder, synced,
// then linked or renamed onto the target; a target that is not a regular file is never replaced).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cli/cli.h"
#include "model/common.h"
#include "model/file_io.h"

namespace hy::cli {

namespace {

std::string too_large(const std::string& path, size_t cap) {
    return "cannot read '" + path + "': larger than " + std::to_string(cap >> 20) + " MiB, the most this reader takes";
}

// Reads up to n bytes (fewer at end of file). Throws Failure(exit_io).
size_t read_some(int fd, char* dst, size_t n, const std::string& path) {
    size_t got = 0;
    while (got < n) {
        const ssize_t r = ::read(fd, dst + got, n - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            throw Failure(exit_io, "cannot read '" + path + "': " + std::strerror(errno));
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

std::string read_input_file(const std::string& path_in, size_t cap) {
    const std::string path = path_in == "-" ? "/dev/stdin" : path_in;  // "-": standard input, as most tools take it
    // (a closed standard input holds /dev/null now: said as the tools say it, not read as an empty text)
    if ((path_in == "-" || path_in == "/dev/stdin") && g_stdin_closed)
        throw Failure(exit_io, "cannot read '" + path_in + "': standard input is closed");
    struct stat st;
    // (the wording of the library's and the tools' readers: "cannot open 'X': ...", "cannot read 'X': ...")
    if (::stat(path.c_str(), &st) != 0) throw Failure(exit_io, "cannot open '" + path + "': " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) throw Failure(exit_io, "cannot read '" + path + "': a directory");
    if (S_ISREG(st.st_mode) && uint64_t(st.st_size) > cap) throw Failure(exit_io, too_large(path, cap));
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) throw Failure(exit_io, "cannot open '" + path + "': " + std::strerror(errno));
    if (::fstat(f.fd, &st) == 0 && S_ISDIR(st.st_mode))
        throw Failure(exit_io, "cannot read '" + path + "': a directory");
    // a pipe, a terminal or a device (/dev/stdin): read up to cap + 1 bytes
    std::string out;
    size_t want = S_ISREG(st.st_mode) ? size_t(st.st_size) + 1 : size_t(1) << 16;
    for (;;) {
        want = std::min(want, cap + 1 - out.size());
        const size_t at = out.size();
        out.resize(at + want);
        const size_t got = read_some(f.fd, out.data() + at, want, path);
        out.resize(at + got);
        if (out.size() > cap) throw Failure(exit_io, too_large(path, cap));
        if (got < want) break;
        want = std::max<size_t>(want, 1 << 16);
    }
    return out;
}

std::string read_regular_file_head(const std::string& path, size_t n, uint64_t* size, int* fd_out) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) throw Failure(exit_io, "cannot open '" + path + "': " + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        throw Failure(exit_io, "cannot read '" + path + "': " + std::string(hy::file_kind(st.st_mode)) +
                                   ", expected a regular file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Failure(exit_io, "cannot open '" + path + "': " + std::strerror(errno));
    Fd f;
    f.fd = fd;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        throw Failure(exit_io, "cannot read '" + path + "': expected a regular file");
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

void write_file_atomic(const std::string& path, const std::string& data, bool overwrite,
                       const std::string& exists_msg) {
    struct stat st;
    if (!overwrite && ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
        throw Failure(exit_io, path + ": " + exists_msg);  // the REPL's own wording (the write checks again)
    try {
        hy::write_file_atomic(path, data.data(), data.size(), overwrite);
    } catch (const hy::Error& e) {
        throw Failure(exit_io, e.what());
    }
}

}  // namespace hy::cli
