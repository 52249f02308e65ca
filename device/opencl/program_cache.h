// program_cache.h: an on-disk cache of compiled OpenCL program binaries.
//
// A program binary is only valid for the exact source, device, driver and build
// options it was compiled with, so the cache key hashes all four. Files are
// written atomically (temporary file + rename) and carry a length and checksum,
// so a torn or corrupted file reads as a miss, never as a bad program. Every
// failure (unwritable directory, full disk) degrades to "not cached".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cleave {

// 64-bit FNV-1a of the given parts, each followed by a 0 byte, as 16 hex digits.
std::string program_cache_key(const std::vector<std::string>& parts);

// Reads `dir`/`key`.bin; nullopt when absent, unreadable or failing its checksum.
std::optional<std::vector<unsigned char>> read_cached_program(const std::string& dir, const std::string& key);

// Writes `dir`/`key`.bin atomically, creating `dir` if needed. Returns false
// (and leaves no partial file) when anything fails.
bool write_cached_program(const std::string& dir, const std::string& key, const std::vector<unsigned char>& binary);

// The path read_cached_program / write_cached_program use.
std::string cached_program_path(const std::string& dir, const std::string& key);

}  // namespace cleave
