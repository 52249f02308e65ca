// simulate.h: how long a pipeline's batch takes, and how much of it each stage
// idles, when its stages take given times per micro-batch: make_schedule's
// action lists run as the executor runs them (stage.h), batch after batch.
//
// bubble_fraction (schedule.h) is the theory for equal stages. Real cuts are
// not equal (a GPT's last stage carries the head and the loss), and how much an
// uneven cut costs depends on the schedule: under ZB-H1 the lighter first stage
// waits for the heavier last one, and the last one waits at every batch's start
// for the first stage's B, W, optimizer step and first forward. This runs the
// lists with the stages' own times, so that it is the bubble the schedule
// allows for that cut with free (or given) links: what bench_pipeline reports
// as a run's `split` bubble and its ideal rate.
#pragma once

#include <vector>

#include "core/pipeline/schedule.h"

namespace cleave {

// One stage's times, in seconds: per micro-batch for the passes, per batch for
// the optimizer step. Under gpipe and 1f1b a backward takes
// backward_input + backward_weight (they run as one action).
struct StageTimes {
  double forward = 0;
  double backward_input = 0;   // B: the input gradient (and, fused, all of gpipe's and 1f1b's backward)
  double backward_weight = 0;  // W: the weight gradient
  double optimizer = 0;
};

// The link of one cut, between stage s and s + 1, in seconds per message. Each
// direction carries one message at a time, in the order they are sent (a
// message waits for the one before it): it holds the wire for `activation`
// (s -> s + 1) or `gradient` (s + 1 -> s) seconds and arrives `latency` after
// it leaves the wire. The two directions do not wait for each other.
//
// `cpu_before` and `cpu_after` are the parts of a message's wire time that
// the stage before the cut (s) and the one after it (s + 1) pay out of their
// own compute, per message they send or receive over it: where a machine's
// cores are all taken by the stages computing on it, the link threads that
// encrypt a message on the way out and decrypt it on the way in take their
// core from a stage. A send costs the sender its part before the message goes
// on the wire, which it then holds for the rest (activation or gradient less
// both parts); a receive costs the receiver its part after the message
// arrives (when it arrived while the stage computed, the decryption took the
// stage's core then). A message the receiver waits for still arrives
// activation (or gradient) plus latency after its send.
struct LinkTimes {
  double activation = 0;
  double gradient = 0;
  double latency = 0;
  double cpu_before = 0;
  double cpu_after = 0;
};

struct SimulatedPipeline {
  double batch_seconds = 0;           // steady state: the time between consecutive batches' ends
  std::vector<double> busy_seconds;   // per stage, per batch: its passes and optimizer step
  double bubble = 0;                  // 1 - sum(busy) / (p * batch_seconds)
};

// Runs make_schedule(kind, s, p, microbatches) for every stage s of `stages`
// (p = stages.size() >= 1) for several batches back to back: a stage starts a
// batch's actions once it has run its own optimizer step of the one before
// (the first stage's inputs and the last stage's labels are always there); a
// receive waits until the tensor has crossed its cut's link, `links[s]`
// between stage s and s + 1 (a send itself costs the stage nothing: links run
// on their own threads). Throws std::invalid_argument for no stages,
// microbatches < 1, a negative time or links.size() != p - 1,
// std::logic_error if the lists deadlock (a schedule bug).
SimulatedPipeline simulate_pipeline(ScheduleKind kind, int microbatches, const std::vector<StageTimes>& stages,
                                    const std::vector<LinkTimes>& links);
// The same with every link free but for `message_seconds` of latency.
SimulatedPipeline simulate_pipeline(ScheduleKind kind, int microbatches, const std::vector<StageTimes>& stages,
                                    double message_seconds = 0);

}  // namespace cleave
