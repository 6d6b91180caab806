#include "model/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "model/common.h"

namespace hy {

std::string errno_text(int e) { return std::strerror(e); }

const char* file_kind(unsigned mode) {
    const mode_t m = mode_t(mode);
    if (S_ISLNK(m)) return "a symbolic link";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

void write_file_atomic(const std::string& path, const void* data, size_t n, bool overwrite) {
    struct stat st;
    mode_t keep_mode = 0;  // an overwritten file keeps its permissions
    if (lstat(path.c_str(), &st) == 0) {
        if (!S_ISREG(st.st_mode))
            throw Error(Status::io,
                        path + ": is " + std::string(file_kind(st.st_mode)) + ", not a regular file (not replaced)");
        if (!overwrite) throw Error(Status::io, path + ": exists (not overwritten)");
        keep_mode = st.st_mode & 07777;
    }
    // The temporary file: PATH + ".xxxxxx" in the same folder, its name cut so that it fits the folder's longest
    // file name (a 250-byte PATH failed with "File name too long").
    const size_t slash_at = path.find_last_of('/');
    const size_t base_at = slash_at == std::string::npos ? 0 : slash_at + 1;
    const std::string folder = base_at == 0 ? "." : path.substr(0, base_at);
    const long name_max_l = ::pathconf(folder.c_str(), _PC_NAME_MAX);
    const size_t name_max = name_max_l > 16 ? size_t(name_max_l) : 255;
    const std::string tmp_stem = path.substr(0, base_at + std::min(path.size() - base_at, name_max - 7));
    std::string tmp;
    int fd = -1;
    static thread_local uint64_t counter = 0;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        const uint64_t r = (uint64_t(::getpid()) << 32) ^
                           uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                           (++counter * 0x9E3779B97F4A7C15ull);
        char suffix[16];
        std::snprintf(suffix, sizeof suffix, ".%06llx", (unsigned long long)(r & 0xFFFFFFull));
        tmp = tmp_stem + suffix;
        fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) throw Error(Status::io, path + ": cannot write: " + errno_text(errno));
    }
    if (fd < 0) throw Error(Status::io, path + ": cannot create a temporary file");
    auto fail_io = [&](const std::string& what, int e) {
        if (fd >= 0) ::close(fd);
        ::unlink(tmp.c_str());
        throw Error(Status::io, path + ": " + what + ": " + errno_text(e));
    };
    if (keep_mode != 0) ::fchmod(fd, keep_mode);  // best effort
    const char* p = static_cast<const char*>(data);
    size_t left = n;
    while (left > 0) {
        const ssize_t w = ::write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            fail_io("write failed", errno);
        }
        p += w;
        left -= size_t(w);
    }
    if (::fsync(fd) != 0 && errno != EINVAL) fail_io("write failed", errno);
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail_io("write failed", errno);
    if (!overwrite) {
        if (::link(tmp.c_str(), path.c_str()) == 0) {
            ::unlink(tmp.c_str());
        } else if (errno == EEXIST) {
            ::unlink(tmp.c_str());
            throw Error(Status::io, path + ": exists (not overwritten)");
        } else if (errno == EPERM || errno == EOPNOTSUPP || errno == ENOSYS || errno == EMLINK) {
            // no hard links on this filesystem: check again, then rename
            if (lstat(path.c_str(), &st) == 0) {
                ::unlink(tmp.c_str());
                throw Error(Status::io, path + ": exists (not overwritten)");
            }
            if (::rename(tmp.c_str(), path.c_str()) != 0) fail_io("cannot rename the temporary file", errno);
        } else {
            fail_io("cannot create", errno);
        }
    } else {
        if (lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
            ::unlink(tmp.c_str());
            throw Error(Status::io,
                        path + ": is " + std::string(file_kind(st.st_mode)) + ", not a regular file (not replaced)");
        }
        if (::rename(tmp.c_str(), path.c_str()) != 0) fail_io("cannot rename the temporary file", errno);
    }
    // make the new name durable too (best effort)
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

std::vector<uint8_t> read_file_checked(const std::string& path, size_t head_bytes, const HeadCheck& check_head) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) throw Error(Status::io, path + ": cannot open: " + errno_text(errno));
    if (!S_ISREG(st.st_mode))
        throw Error(Status::io, path + ": is " + std::string(file_kind(st.st_mode)) + ", not a regular file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Error(Status::io, path + ": cannot open: " + errno_text(errno));
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw Error(Status::io, path + ": not a regular file");
    const uint64_t size = uint64_t(st.st_size);
    auto read_at_most = [&](uint8_t* dst, size_t n) {
        size_t got = 0;
        while (got < n) {
            const ssize_t r = ::read(fd, dst + got, n - got);
            if (r < 0) {
                if (errno == EINTR) continue;
                throw Error(Status::io, path + ": read failed: " + errno_text(errno));
            }
            if (r == 0) break;
            got += size_t(r);
        }
        return got;
    };
    std::vector<uint8_t> head(head_bytes);
    const size_t nh = read_at_most(head.data(), head.size());
    try {
        check_head(std::span<const uint8_t>(head.data(), nh), size);
    } catch (const Error& e) {
        throw Error(e.status(), path + ": " + e.what());
    }
    std::vector<uint8_t> data(std::max(size_t(size) + 1, nh));  // (a file that grew since fstat: nh > size)
    std::memcpy(data.data(), head.data(), nh);
    const size_t got = nh + read_at_most(data.data() + nh, data.size() - nh);
    data.resize(got);
    return data;
}

}  // namespace hy
