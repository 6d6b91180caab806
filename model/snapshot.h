// The snapshot format of a sequence (hy_state_save / hy_state_load) and the model fingerprint it carries.
//
//   char magic[8] "HYCTX01\0"; u32 version (3); u32 flags (bit 0: logits present); u64 fingerprint;
//   u32 n_history; u32 n_pending; i32 history[n_history]; [u32 n_logits; f32 logits[n_logits]];
//   u64 n_state; u8 state[n_state] (Model::save_state of the slot); u64 checksum (snapshot_checksum of all the
//   bytes before it). Numbers are little-endian (the host's order).
//
// Version 3 is version 2's layout; only the fingerprint changed: it used an FNV-1a whose offset basis was wrong (a
// digit short), and is now the standard FNV-1a (model/fnv.h). A snapshot of an older version would be refused as
// another model's, so versions 1 (no checksum) and 2 are refused by their version, with a message that says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/sequence.h"

namespace hy {

constexpr uint32_t kSnapshotVersion = 3;

// A 64-bit fingerprint of a model folder: FNV-1a over the names of config.json, tokenizer.json and the
// model*.safetensors files (sorted), each followed by its size and up to 64 KiB at its start, middle and end
// (a missing file adds only its name). Cheap for checkpoints of many GB; a change of any JSON byte or of most
// weight bytes changes it.
uint64_t fingerprint_folder(const std::string& dir);

// The snapshot's checksum: Fnv1a::add_words over n bytes.
uint64_t snapshot_checksum(const uint8_t* p, size_t n);

// The snapshot of seq (its model's state of seq.slot included), carrying `fingerprint`.
std::vector<uint8_t> serialize_snapshot(const Sequence& seq, uint64_t fingerprint);

// Restores a snapshot of n bytes into seq. Throws Error: format (not a snapshot, another version, truncated, bytes
// after its end, damaged: the checksum does not match, ids out of range), model_mismatch (the fingerprint is not
// `fingerprint`, another logits row length, state shapes), context_full (more ids than n_ctx). The checks that need
// no model state come first; after a throw seq may hold part of the snapshot (callers clear it).
void deserialize_snapshot(Sequence& seq, uint64_t fingerprint, const uint8_t* data, size_t n);

// Checks magic and version (the first 12 bytes); throws Error(format): "not a hybrid snapshot (bad magic ...)",
// "snapshot version 2, this build reads version 3 (...)", "snapshot is truncated".
void check_snapshot_header(const uint8_t* data, size_t n);
// Checks the model fingerprint (bytes 16-23) against `fingerprint`; throws Error(model_mismatch) "snapshot was saved
// from another model (fingerprint X, this model Y)". A damaged file fails this too, so callers check the checksum
// first where they have the whole file.
void check_snapshot_fingerprint(uint64_t fingerprint, const uint8_t* data, size_t n);

// The largest snapshot serialize_snapshot() can make for a sequence of this model: the fixed header, n_ctx + 1
// history ids (the sequence plus one pending id), a logits row and the slot's state block (Model::save_state: a
// small header plus at most the slot's share of the state arena). In bytes.
size_t max_snapshot_bytes(const Sequence& seq);

// Reads a snapshot file: a regular file whose fixed header is checked before the rest is read, and whose size is
// at most max_snapshot_bytes(seq) (a larger one with another fingerprint is model_mismatch). Throws Error (io,
// format, model_mismatch) naming the path; the bytes are not checked further (deserialize_snapshot does).
std::vector<uint8_t> read_snapshot_file(const Sequence& seq, uint64_t fingerprint, const std::string& path);

}  // namespace hy
