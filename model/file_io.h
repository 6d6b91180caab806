// File I/O of the library's own files (snapshots) and of the hybrid program's saves: the atomic write and a
// bounded read of a regular file whose head is checked before the rest is read. Errors are hy::Error(Status::io)
// naming the path and the reason (strerror's words).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace hy {

// strerror(e) as a string.
std::string errno_text(int e);

// What a file that is not a regular one is, for messages ("a symbolic link", "a directory", "a device", "a FIFO",
// "a socket"; "not a regular file" for anything else). mode: st_mode of stat/lstat.
const char* file_kind(unsigned mode);

// Writes n bytes at data to `path` atomically: a new file PATH.XXXXXX (created with O_EXCL, so no other file is
// touched) in the same folder, fsync, then a link (overwrite false: fails if PATH exists, even one that appears
// meanwhile) or a rename onto PATH; an overwritten file keeps its permissions. An existing PATH that is not a
// regular file (symbolic link, device, directory, FIFO) is never replaced. Throws Error(io): "PATH: exists (not
// overwritten)", "PATH: is a directory, not a regular file (not replaced)", "PATH: write failed: ...", ...
void write_file_atomic(const std::string& path, const void* data, size_t n, bool overwrite);

using HeadCheck = std::function<void(std::span<const uint8_t> head, uint64_t size)>;

// Reads a regular file (a FIFO, device, socket or directory is refused before it is opened for reading, so
// nothing blocks or reads forever). First up to head_bytes bytes are read and passed to check_head(head, size)
// with the file's size in bytes; it may throw to refuse the file before the rest is read (its hy::Error is
// rethrown with "PATH: " before the message). Returns the whole file (at most size bytes: a file that grows while
// it is read is cut at its size when opened, plus one byte, so a caller can see that it grew). Throws Error(io)
// "PATH: cannot open: ...", "PATH: is a directory, not a regular file", "PATH: read failed: ...".
std::vector<uint8_t> read_file_checked(const std::string& path, size_t head_bytes, const HeadCheck& check_head);

}  // namespace hy
