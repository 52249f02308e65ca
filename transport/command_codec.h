// command_codec.h (internal to transport): the typed job commands and job
// specs <-> FlatBuffers, and their validation rules. message.cpp calls these
// for the Command and Assign bodies; nothing outside transport includes it.
#pragma once

#include <string>

#include "transport/message.h"
#include "transport/schema/cleave_generated.h"

namespace cleave::transport::detail {

using Builder = flatbuffers::FlatBufferBuilder;

// Semantic checks; "" when valid, else what is wrong.
std::string validate_command(const CommandMsg& command, const DecodeLimits& limits);
std::string validate_assign_job(const AssignMsg& assign, const DecodeLimits& limits);

flatbuffers::Offset<wire::Command> build_command(Builder& b, const CommandMsg& command);
flatbuffers::Offset<wire::OptimizerSpec> build_optimizer(Builder& b, const OptimizerSpec& o);
// The JobSpec union member of `job` (type and offset).
std::pair<wire::JobSpec, flatbuffers::Offset<void>> build_job(Builder& b, const JobSpec& job);

// Read a verified table; "" on success, else what is wrong (unknown enum values,
// a missing required table).
std::string read_command(const wire::Command& in, CommandMsg& out);
std::string read_optimizer(const wire::OptimizerSpec* in, OptimizerSpec& out);
std::string read_job(const wire::Assign& in, JobSpec& out);

// Shared field checks (message.cpp uses them too).
std::string check_string(const char* field, const std::string& s, const DecodeLimits& limits);
std::string check_key(const char* field, const std::string& key);

}  // namespace cleave::transport::detail
