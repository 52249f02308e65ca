// split_job.h: the two daemon-side roles of split learning (`cleave split`).
//
// A split-learning job runs inside cleaved on the connection the daemon
// already has to the coordinator (JobChannel). The coordinator assigns one
// daemon without data the server role and every daemon with data
// (`--dataset ... --shard i/N`) the client role; the assignment carries a
// SplitJob (role server or client, batch sizes, the clients' keys). The server binds one
// peer endpoint per client (each admitting only that client's key); each
// client dials its endpoint, so cut-layer tensors go straight between client
// and server and never through the coordinator.
//
// Per training batch of client c (vanilla, labels on the server):
//   client: x -> front -> Activation(seq) and Labels(seq) to the server
//   server: middle/rest -> loss -> Gradient(seq) back; optimizer step; Metrics to the coordinator
//   client: front backward, optimizer step
// U-shaped (labels on the client):
//   client: x -> front -> Activation(seq)
//   server: middle -> Activation(seq) back
//   client: tail -> loss -> Gradient(seq) of the server's output; tail step; Metrics to the coordinator
//   server: middle backward -> Gradient(seq) back; optimizer step
//   client: front backward, optimizer step
// Evaluation (both modes): the client sends Activation(seq) of its test
// batch, the server answers with its output, the client finishes (tail,
// loss, accuracy) and reports one Metrics message: test labels never leave it.
//
// `seq` numbers the tensors on one client's link (training and evaluation
// batches alike); both sides count it, so a lost or reordered tensor is an
// error naming the client instead of a silent mismatch. The server serves
// clients in the order the coordinator lists for each round, so runs are
// reproducible for a seed; see docs/split.md and docs/protocol.md.
#pragma once

#include <atomic>
#include <string>

#include "core/data/dataset.h"
#include "core/runtime/daemon/job_context.h"
#include "device/device.h"
#include "transport/keys.h"
#include "transport/message.h"

namespace cleave {

// True when an assignment starts a split-learning job (it carries a SplitJob).
bool is_split_assign(const transport::AssignMsg& assign);

// A split job runs where every job does (job_context.h).
using SplitJobContext = JobContext;

// The server role: hosts the layers after the cut (vanilla) or between the
// cuts (U-shaped) for every client of the run. Acknowledges the assignment
// with {"op": "split_setup", "endpoints": {client: endpoint}}.
JobEnd run_split_server(const SplitJobContext& ctx, const transport::AssignMsg& assign, uint64_t request_id);

// The client role: hosts the front (and, U-shaped, the tail) and trains on
// `train`, the daemon's shard; evaluates on the same shard of the test split
// (`data` says how to find and cut it). Acknowledges with
// {"op": "split_setup", "samples", "test_samples", "batches_per_epoch"}.
JobEnd run_split_client(const SplitJobContext& ctx, const Dataset& train, const FedClientOptions& data,
                             const transport::AssignMsg& assign, uint64_t request_id);

}  // namespace cleave
