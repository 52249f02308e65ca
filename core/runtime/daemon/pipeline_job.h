// pipeline_job.h: a daemon's pipeline stage (`cleave train` across daemons).
//
// The assignment carries a PipelineJob (schedule, micro-batches, seed, batch,
// whether the stage recomputes its activations in backward).
// The daemon checks the stage fits (the memory model the planner places stages
// with), builds it, binds the peer endpoint its previous stage dials, and
// acknowledges with {"peer_endpoint"}. Then, in the one job loop (serve_job):
// Connect dials the next stage and accepts the previous one; Step runs the
// schedule for one batch and reports Metrics; Checkpoint sends the stage's
// state; a weights message for its stage is a state to start from (--load,
// --init); Finish answers with the stage's trace. See docs/protocol.md.
#pragma once

#include <cstdint>

#include "core/runtime/daemon/job_context.h"
#include "transport/message.h"

namespace cleave {

// Runs one pipeline stage job until it ends; JobEnd::refused when the stage
// could not be built (the coordinator was told why, no job ran).
JobEnd run_pipeline_stage(const JobContext& ctx, const transport::AssignMsg& assign, uint64_t request_id);

}  // namespace cleave
